//! What a node's handshake asks in one round trip (`INFO server`, `INFO replication`,
//! `INFO memory`, `INFO persistence`, `SCRIPT LOAD` of every script, and with the restart
//! quarantine the node's ledger and horizon) and how its `INFO` answers read: a field,
//! and whether the server may evict lock keys.
//!
//! ```text
//! INFO server | INFO replication | INFO memory | INFO persistence | SCRIPT LOAD x N
//!   | GET <prefix>#ledger | EVAL raise <prefix>#horizon <ttl>          (one pipeline)
//! maxmemory_policy:volatile-lru + maxmemory:100mb  ->  evicts: refused as a lock node
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Each node's first connect runs the handshake; an evicting server is refused.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! println!("{:?}", redlock.health().await);
//! # Ok(()) }
//! ```

use redis::{RedisResult, Value};

use super::judging::LedgerRead;
use super::loss::LedgerKeys;
use crate::error::NodeError;
use crate::scripts;

/// The commands of a handshake, in one pipeline: `INFO server` and `INFO replication`
/// feed the restart quarantine (a second opinion beside the ledger: see the `loss`
/// module), the role check, the same-server check and the node's clock estimate
/// (`server_time_usec`; see `node::clocks::NodeClocks`); a user that may not run them can
/// still lock with the quarantine off. `INFO memory` tells the eviction policy (see
/// [`evicting_policy`]); a server that refuses it is simply not checked. `INFO
/// persistence` tells whether a restart keeps the server's writes. Then `SCRIPT LOAD` of
/// every script, and with `ledger` (the quarantine on: its keys and the client's longest
/// TTL) the ledger's read and the horizon's raise, last ([`LEDGER_AT`] from the end).
pub(super) fn handshake_pipe(ledger: Option<(&LedgerKeys, u64)>) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors().cmd("INFO").arg("server");
    pipe.cmd("INFO").arg("replication");
    pipe.cmd("INFO").arg("memory");
    pipe.cmd("INFO").arg("persistence");
    for s in scripts::all() {
        pipe.cmd("SCRIPT").arg("LOAD").arg(s.code);
    }
    if let Some((keys, ttl_ms)) = ledger {
        keys.read_into(&mut pipe, ttl_ms);
    }
    pipe
}

/// How many commands from the end of a pipeline the ledger's read starts (its `GET`, then
/// the horizon's raise).
const LEDGER_AT: usize = 2;

/// The replies to a [`handshake_pipe`], each where it belongs.
pub(super) struct Replies {
    /// `INFO server` (refused, with an ACL without `+info`).
    pub(super) server: RedisResult<String>,
    /// `INFO replication` and `INFO persistence` (empty if refused).
    pub(super) replication: String,
    pub(super) persistence: String,
    /// `INFO memory`, if the server answered it.
    pub(super) memory: Option<String>,
    /// The ledger's read, if the pipeline had one.
    pub(super) ledger: Option<Result<LedgerRead, NodeError>>,
}

impl Replies {
    /// Splits `replies` (with the ledger's read at the end if `ledger`): a failed `SCRIPT
    /// LOAD` fails the handshake.
    pub(super) fn split(mut replies: Vec<RedisResult<Value>>, ledger: bool) -> RedisResult<Self> {
        let ledger = ledger.then(|| {
            let mut tail = replies.split_off(replies.len().saturating_sub(LEDGER_AT));
            let raise = tail.pop();
            LedgerRead::parse(tail.pop(), raise)
        });
        let mut replies = replies.into_iter();
        let server = replies.next().unwrap_or(Ok(Value::Nil));
        let text = |v: Option<RedisResult<Value>>| {
            v.and_then(Result::ok)
                .and_then(|v| redis::from_redis_value::<String>(v).ok())
        };
        let (replication, memory, persistence) = (
            text(replies.next()),
            text(replies.next()),
            text(replies.next()),
        );
        if let Some(failed) = replies.find_map(Result::err) {
            return Err(failed); // a script could not be loaded
        }
        Ok(Self {
            server: server.and_then(|v| Ok(redis::from_redis_value::<String>(v)?)),
            replication: replication.unwrap_or_default(),
            persistence: persistence.unwrap_or_default(),
            memory,
            ledger,
        })
    }
}

/// The value of `field` in an `INFO` reply.
pub(super) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim_end().strip_prefix(field)?.strip_prefix(':'))
}

/// The eviction policy of a server whose `INFO memory` is `memory`, if it may evict keys:
/// a `maxmemory-policy` other than `noeviction` with a memory limit (`maxmemory` not 0;
/// a reply without one counts as a limit). Lock keys and fencing counters must stay until
/// they expire: an evicted lock key lets a second client take a lock that is still held;
/// an evicted counter leaves the next fencing number to a client's clock alone, which
/// may be behind the lost one. The `volatile-*` policies evict keys with a TTL, which is
/// every key of ours. Without a limit (`maxmemory 0`, the default) nothing is evicted.
pub(crate) fn evicting_policy(memory: &str) -> Option<&str> {
    let policy = info_field(memory, "maxmemory_policy").filter(|p| *p != "noeviction")?;
    let unlimited = info_field(memory, "maxmemory").is_some_and(|m| m == "0");
    (!unlimited).then_some(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_policy_that_evicts_under_a_memory_limit_evicts() {
        let memory = |max: &str, policy: &str| {
            format!(
                "# Memory\r\nused_memory:1000\r\nmaxmemory:{max}\r\nmaxmemory_human:x\r\n\
                 maxmemory_policy:{policy}\r\n"
            )
        };
        assert_eq!(
            evicting_policy(&memory("104857600", "volatile-lru")),
            Some("volatile-lru")
        );
        assert_eq!(
            evicting_policy(&memory("1", "allkeys-lfu")),
            Some("allkeys-lfu")
        );
        assert_eq!(evicting_policy(&memory("104857600", "noeviction")), None);
        assert_eq!(evicting_policy(&memory("0", "volatile-lru")), None);
        assert_eq!(
            evicting_policy("maxmemory_policy:volatile-ttl\r\n"),
            Some("volatile-ttl"),
            "no maxmemory line: counts as a limit"
        );
        assert_eq!(evicting_policy("maxmemory:100\r\n"), None, "no policy");
        assert_eq!(evicting_policy(""), None);
    }
}
