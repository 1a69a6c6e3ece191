//! The batched release: the [`RELEASE`](super::lua::RELEASE)s queued for one node sent as
//! one [`RELEASE_MANY`](super::lua::RELEASE_MANY) script call, each answered as it would
//! have been alone.
//!
//! ```text
//! [RELEASE k1 v1, RELEASE k2 v2, RELEASE k3 v3]  ->  EVALSHA <many> 3 k1 k2 k3 v1 v2 v3 id
//!                                                ->  [1, 0, 1]
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Releases to one node that queue behind another go out as one batch.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let (a, b) = (redlock.lock("a").await?, redlock.lock("b").await?);
//! let _ = tokio::join!(redlock.unlock(&a), redlock.unlock(&b));
//! # Ok(()) }
//! ```

use redis::Value;
use redis::aio::ConnectionLike;

use super::command::Call;
use super::lua::RELEASE_MANY_SCRIPT;
use super::reply::key_answer;
use super::run::run_script;

/// Runs the [`RELEASE`](super::lua::RELEASE)s `calls` (all of one client) as one [`RELEASE_MANY`](super::lua::RELEASE_MANY) on `conn`:
/// one answer per call, in order, each as the call alone would have had it.
pub(crate) async fn release_many<C: ConnectionLike>(
    calls: &[impl std::ops::Deref<Target = Call>],
    conn: &mut C,
) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
    // Each call's key, value and client id (a call that is not a release has none: it
    // gets the answer of an empty key, 0).
    let releases: Vec<[&[u8]; 3]> = calls
        .iter()
        .map(|call| call.release().unwrap_or_default())
        .collect();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(RELEASE_MANY_SCRIPT.sha.as_str()).arg(calls.len());
    for [key, _, _] in &releases {
        cmd.arg(*key);
    }
    for [_, value, _] in &releases {
        cmd.arg(*value);
    }
    cmd.arg(releases.first().map_or(&[][..], |[_, _, id]| id));
    let reply = run_script(&cmd, &RELEASE_MANY_SCRIPT, conn).await?;
    match reply {
        Value::Array(answers) if answers.len() == calls.len() => {
            Ok(answers.into_iter().map(key_answer).collect())
        }
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to the batched release script",
            format!("{other:?}"),
        ))),
    }
}
