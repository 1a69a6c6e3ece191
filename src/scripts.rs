//! The Lua scripts that run on every node, and how they are invoked.
//!
//! Each script is loaded with `SCRIPT LOAD` when a node connects and then run with
//! `EVALSHA`, so an operation is one round trip. If a node answers `NOSCRIPT` (its script
//! cache was flushed), the call falls back to `EVAL`, which also caches the script again.

use std::sync::LazyLock;

use redis::Cmd;

/// A Lua script with its SHA-1, computed once.
pub(crate) struct Script {
    pub(crate) code: &'static str,
    pub(crate) sha: String,
}

impl Script {
    fn new(code: &'static str) -> Self {
        Self {
            code,
            sha: redis::Script::new(code).get_hash().to_owned(),
        }
    }
}

/// `KEYS[1]` = lock key, `ARGV[1]` = value, `ARGV[2]` = TTL in ms.
///
/// Returns `{1}` when the lock was set, `{0, pttl}` when the key exists (pttl is the
/// holder's remaining TTL in ms, -1 if it has none). `GET` fails with `WRONGTYPE` on a key of
/// another type, which surfaces as a clear per-node error. The `GET`/`SET PX` pair is
/// atomic in the script and so equals `SET NX PX`.
const ACQUIRE: &str = r#"
if redis.call('GET', KEYS[1]) then
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1}
"#;

/// Compare-and-delete: deletes the key only if it holds our value. Returns 1 or 0.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Compare-and-pexpire: resets the TTL only if the key holds our value. Returns 1 or 0.
const EXTEND: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

pub(crate) static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
pub(crate) static EXTEND_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND));

/// Every script, for `SCRIPT LOAD` on connect.
pub(crate) fn all() -> [&'static Script; 3] {
    [&ACQUIRE_SCRIPT, &RELEASE_SCRIPT, &EXTEND_SCRIPT]
}

/// One script call: the script, its key and its arguments.
pub(crate) struct Invocation<'a> {
    pub(crate) script: &'static Script,
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
    pub(crate) ttl_ms: Option<u64>,
}

impl Invocation<'_> {
    /// The command: `EVALSHA sha 1 key value [ttl]`, or `EVAL code ...` when `by_sha` is false.
    pub(crate) fn cmd(&self, by_sha: bool) -> Cmd {
        let mut cmd = if by_sha {
            let mut c = redis::cmd("EVALSHA");
            c.arg(self.script.sha.as_str());
            c
        } else {
            let mut c = redis::cmd("EVAL");
            c.arg(self.script.code);
            c
        };
        cmd.arg(1).arg(self.key).arg(self.value);
        if let Some(ttl) = self.ttl_ms {
            cmd.arg(ttl);
        }
        cmd
    }
}
