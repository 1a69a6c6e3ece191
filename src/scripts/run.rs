//! Running a script over a redis-rs connection: `EVALSHA`, and `EVAL` with the same keys
//! and arguments when the node answers `NOSCRIPT` (its script cache was flushed).
//!
//! ```text
//! EVALSHA sha 1 key value  --NOSCRIPT-->  EVAL "<code>" 1 key value  (cached again)
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // After SCRIPT FLUSH on a node, the next release there runs the script by EVAL.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?;
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

use super::lua::Script;

/// Runs `by_sha` (the `EVALSHA` of `script`), falling back to `EVAL` with the same keys
/// and arguments when the node answers `NOSCRIPT`.
pub(super) async fn run_script<C: ConnectionLike>(
    by_sha: &Cmd,
    script: &Script,
    conn: &mut C,
) -> redis::RedisResult<Value> {
    match by_sha.query_async::<Value>(conn).await {
        Err(e) if no_script(&e) => eval_instead(by_sha, script, conn).await,
        other => other,
    }
}

/// Whether the node no longer has the script (its cache was flushed): `NOSCRIPT`.
pub(super) fn no_script(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// `by_sha` (the `EVALSHA` of `script`) sent again as `EVAL`, with the same keys and
/// arguments; this also caches the script on the node again.
pub(super) async fn eval_instead<C: ConnectionLike>(
    by_sha: &Cmd,
    script: &Script,
    conn: &mut C,
) -> redis::RedisResult<Value> {
    // The keys and arguments are those after `EVALSHA sha`.
    let mut eval = redis::cmd("EVAL");
    eval.arg(script.code);
    for arg in by_sha.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    eval.query_async::<Value>(conn).await
}
