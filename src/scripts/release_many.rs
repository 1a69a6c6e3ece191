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
use super::pack;
use super::reply::key_answer;
use super::run::run_script;

/// Runs the [`RELEASE`](super::lua::RELEASE)s `calls` (all of one client) as one [`RELEASE_MANY`](super::lua::RELEASE_MANY) on `conn`:
/// one answer per call, in order, each as the call alone would have had it.
pub(crate) async fn release_many<C: ConnectionLike>(
    calls: &[impl std::ops::Deref<Target = Call>],
    conn: &mut C,
) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(RELEASE_MANY_SCRIPT.sha.as_str()).arg(calls.len());
    for_each_word(calls, |word| {
        cmd.arg(word);
    });
    let reply = run_script(&cmd, &RELEASE_MANY_SCRIPT, conn).await?;
    answers(reply, calls.len())
}

/// The `EVALSHA` of [`RELEASE_MANY`](super::lua::RELEASE_MANY) for the releases `calls`
/// (all of one client), packed as RESP at the end of `out`: what [`release_many`] sends,
/// for our own connection, which merges the releases it has to write into one call.
pub(crate) fn pack_into(calls: &[impl std::ops::Deref<Target = Call>], out: &mut Vec<u8>) {
    pack::array_header(out, 3 + 2 * calls.len() + 1);
    pack::bulk(out, b"EVALSHA");
    pack::bulk(out, RELEASE_MANY_SCRIPT.sha.as_bytes());
    pack::bulk(out, pack::digits(calls.len() as u64, &mut [0; 20]));
    for_each_word(calls, |word| {
        pack::bulk(out, word);
    });
}

/// The keys, then the values, then the client id of `calls`: the words of a
/// [`RELEASE_MANY`](super::lua::RELEASE_MANY) after its key count. A call that is not a
/// release has none: it gets the answer of an empty key, 0.
fn for_each_word(calls: &[impl std::ops::Deref<Target = Call>], mut word: impl FnMut(&[u8])) {
    for call in calls {
        word(call.release().unwrap_or_default()[0]);
    }
    for call in calls {
        word(call.release().unwrap_or_default()[1]);
    }
    let id = calls
        .first()
        .and_then(|call| call.release())
        .map_or(&[][..], |[_, _, id]| id);
    word(id);
}

/// The answers of `n` releases sent as one [`RELEASE_MANY`](super::lua::RELEASE_MANY),
/// from its `reply`: each as the release alone would have had it.
pub(crate) fn answers(
    reply: Value,
    n: usize,
) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
    match reply {
        Value::Array(answers) if answers.len() == n => {
            Ok(answers.into_iter().map(key_answer).collect())
        }
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to the batched release script",
            format!("{other:?}"),
        ))),
    }
}
