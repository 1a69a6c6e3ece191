//! The Lua scripts that run on every node, how they are invoked, and the parsing of their
//! replies.
//!
//! Each script is loaded with `SCRIPT LOAD` when a node connects and then run with
//! `EVALSHA`, so an operation is one round trip. If a node answers `NOSCRIPT` (its script
//! cache was flushed), the call falls back to `EVAL`, which also caches the script again.
//!
//! ```text
//! EVALSHA <sha of RELEASE> 1 redlock:invoice:42 <value> <client id>  ->  1 (deleted) or 0
//! ```

use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

use crate::error::NodeError;

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

/// The busy path of an unfenced acquisition, which is a plain `SET key value NX PX ttl`:
/// when that finds the key taken, this asks for the holder's remaining TTL (a hint for when
/// to retry) and whether the holder is this client. `KEYS[1]` = lock key, `ARGV[1]` = our
/// value. Returns `{0, pttl, ours}`: the PTTL in ms (-1 without expiry, -2 if the key is gone
/// by now), and 1 when the value there starts with the client id ours starts with. The `GET` fails with `WRONGTYPE` on a key of another type, which
/// surfaces as a clear per-node error, as with the fenced script.
const HOLDER_TTL: &str = r#"
local held = redis.call('GET', KEYS[1])
local ours = held and string.sub(held, 1, 16) == string.sub(ARGV[1], 1, 16) and 1 or 0
return {0, redis.call('PTTL', KEYS[1]), ours}
"#;

/// The start of every acquire script: when the key exists, answer `{2, record}` for a
/// completion record ([`RECORD_MARKER`]) and `{0, pttl, ours}` for another holder (`ours`:
/// 1 when its value starts with the client id of ours, `ARGV[1]`).
macro_rules! held_or_record {
    () => {
        r#"
local held = redis.call('GET', KEYS[1])
if held then
  if string.sub(held, 1, 8) == '#record\n' then
    return {2, held}
  end
  local ours = string.sub(held, 1, 16) == string.sub(ARGV[1], 1, 16) and 1 or 0
  return {0, redis.call('PTTL', KEYS[1]), ours}
end
"#
    };
}

/// Phase 1 of a fenced acquisition. `KEYS[1]` = lock key, `KEYS[2]` = the name's counter
/// key, `ARGV[1]` = value, `ARGV[2]` = TTL in ms.
///
/// `SET NX PX` as a script (`{0, pttl}` when the key exists, `{2, record}` when it holds a
/// completion record, see [`ACQUIRE_OR_REPLAY`]), and on success also returns
/// the node's counter for the name (`""` if it has none) and the server's clock (`TIME`:
/// seconds, microseconds): `{1, counter, seconds, microseconds}`. The client seeds a missing or lost counter from the clock; all arithmetic happens in
/// the client, on 64-bit integers (Lua numbers are doubles). The counter is read before
/// the `SET`, so a wrong-type counter key fails the call before it writes anything.
const ACQUIRE_FENCED: &str = concat!(
    held_or_record!(),
    r#"
local counter = redis.call('GET', KEYS[2]) or ''
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local t = redis.call('TIME')
return {1, counter, t[1], t[2]}
"#
);

/// Phase 2 of a fenced acquisition. `KEYS[1]` = lock key, `KEYS[2]` = the name's counter
/// key, `ARGV[1]` = value, `ARGV[2]` = the fencing number (decimal, no leading zeros),
/// `ARGV[3]` = the retention in ms.
///
/// Only while the lock key still holds our value: raises the counter to the fencing number
/// (`counter = max(counter, token)`), gives it the retention as its TTL, and returns 1;
/// otherwise returns 0 and changes nothing. Numbers are compared as decimal strings (length
/// first, then digit by digit), so any 64-bit value compares exactly.
const FENCE: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local cur = redis.call('GET', KEYS[2])
local new = ARGV[2]
local raise = not cur or #cur < #new
if cur and #cur == #new then
  for i = 1, #new do
    local a, b = string.byte(cur, i), string.byte(new, i)
    if a ~= b then
      raise = a < b
      break
    end
  end
end
if raise then
  redis.call('SET', KEYS[2], new, 'PX', ARGV[3])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
"#;

/// The marker that starts every completion record stored under a lock key (lock values
/// are hex, so they never start with it).
pub(crate) const RECORD_MARKER: &[u8] = b"#record\n";

/// An unfenced acquisition that also finds completion records (the layer's replay).
/// `KEYS[1]` = lock key, `ARGV[1]` = value, `ARGV[2]` = TTL in ms.
///
/// Returns `{1}` when the lock was set, `{2, record}` when the key holds a completion
/// record, and `{0, pttl}` when another client holds the lock: the record comes back in
/// the acquire round trip, so a replay costs nothing extra.
const ACQUIRE_OR_REPLAY: &str = concat!(
    held_or_record!(),
    r#"
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1}
"#
);

/// Compare-and-set of a completion record: replaces our lock value with the record
/// (`ARGV[2]`) for the retention (`ARGV[3]` ms), and tells the waiters. `KEYS[1]` = lock
/// key, `ARGV[1]` = value. Returns 1, or 0 when the key no longer holds our value, or the
/// server's error when the record was stored but the `PUBLISH` was refused (see
/// [`RELEASE`]).
const COMPLETE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  local told = redis.pcall('PUBLISH', KEYS[1], '')
  if type(told) == 'table' and told.err then return told.err end
  return 1
end
return 0
"#;

/// Compare-and-delete: deletes the key only if it holds our value, and then tells the
/// waiters on the key's channel (the channel is named like the key), with the releasing
/// client's id (`ARGV[2]`) as the message. Returns 1 or 0. The message is published after
/// the delete, in the same script, so it can never arrive while the key is still there.
///
/// The message is only a hint: a user without permission for the channel (an ACL without
/// `+publish` or `&prefix*`) still releases. The `PUBLISH` is then refused, and the script
/// returns the server's error message (a string) instead of 1: the key was deleted.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local told = redis.pcall('PUBLISH', KEYS[1], ARGV[2])
  if type(told) == 'table' and told.err then return told.err end
  return 1
end
return 0
"#;

/// [`RELEASE`] for many locks of one client at once (a node's releases that queued while
/// another was on its way): `KEYS[i]` = lock key, `ARGV[i]` = its value, the last `ARGV` =
/// the releasing client's id. Returns one answer per key: 1, 0 or a refused `PUBLISH`'s
/// message as [`RELEASE`], or, for a key that is not a string, `{error message}`
/// (`WRONGTYPE`), which fails that key alone (a bare error inside the reply would fail the
/// whole call). A refused `PUBLISH` never stops the keys after it.
/// It runs the same commands as [`RELEASE`], so the ACL rule of the README covers it.
const RELEASE_MANY: &str = r#"
local id = ARGV[#ARGV]
local out = {}
for i = 1, #KEYS do
  local held = redis.pcall('GET', KEYS[i])
  if type(held) == 'table' and held.err then
    out[i] = {held.err}
  elseif held == ARGV[i] then
    redis.call('DEL', KEYS[i])
    local told = redis.pcall('PUBLISH', KEYS[i], id)
    if type(told) == 'table' and told.err then
      out[i] = told.err
    else
      out[i] = 1
    end
  else
    out[i] = 0
  end
end
return out
"#;

/// Compare-and-pexpire: resets the TTL only if the key holds our value. Returns 1 or 0.
const EXTEND: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Inspection of a name, never reading out the value. `KEYS[1]` = lock key, `KEYS[2]` =
/// the name's fencing counter. Returns `{kind, pttl, counter}`: kind 0 (no key), 1 (a
/// lock) or 2 (a completion record); the key's PTTL; the counter (`""` if none).
const INSPECT: &str = r#"
local v = redis.call('GET', KEYS[1])
local kind = 0
if v then
  kind = 1
  if string.sub(v, 1, 8) == '#record\n' then
    kind = 2
  end
end
return {kind, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or ''}
"#;

pub(crate) static HOLDER_TTL_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(HOLDER_TTL));
pub(crate) static ACQUIRE_OR_REPLAY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_OR_REPLAY));
pub(crate) static COMPLETE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(COMPLETE));
pub(crate) static ACQUIRE_FENCED_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_FENCED));
pub(crate) static FENCE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(FENCE));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
pub(crate) static RELEASE_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(RELEASE_MANY));
pub(crate) static EXTEND_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND));
pub(crate) static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT));

/// Every script, for `SCRIPT LOAD` on connect.
pub(crate) fn all() -> [&'static Script; 9] {
    [
        &HOLDER_TTL_SCRIPT,
        &ACQUIRE_OR_REPLAY_SCRIPT,
        &COMPLETE_SCRIPT,
        &ACQUIRE_FENCED_SCRIPT,
        &FENCE_SCRIPT,
        &RELEASE_SCRIPT,
        &RELEASE_MANY_SCRIPT,
        &EXTEND_SCRIPT,
        &INSPECT_SCRIPT,
    ]
}

/// What one node holds for a name ([`INSPECT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Inspected {
    /// A lock or a record is stored under the key.
    pub(crate) held: bool,
    /// It is a completion record.
    pub(crate) record: bool,
    /// The key's remaining TTL, if it has one.
    pub(crate) pttl: Option<Duration>,
    /// The node's fencing counter for the name.
    pub(crate) counter: Option<u64>,
}

/// Parses the reply to [`INSPECT`].
pub(crate) fn parse_inspect(v: Value) -> Result<Inspected, NodeError> {
    let bad = || NodeError::Protocol("unexpected reply to the inspect script".into());
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let [Value::Int(kind), Value::Int(pttl), counter] = items.as_slice() else {
        return Err(bad());
    };
    let counter = match counter {
        Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
        _ => None,
    };
    Ok(Inspected {
        held: *kind != 0,
        record: *kind == 2,
        pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
        counter,
    })
}

/// One argument of a script call.
#[derive(Clone, Copy)]
pub(crate) enum Arg<'a> {
    Bytes(&'a [u8]),
    Int(u64),
}

/// One script call: the script, its keys and its arguments.
pub(crate) struct Invocation<'a> {
    pub(crate) script: &'static Script,
    pub(crate) keys: &'a [&'a [u8]],
    pub(crate) args: &'a [Arg<'a>],
}

/// What a round sends to every node.
pub(crate) enum Request<'a> {
    /// A script call.
    Script(Invocation<'a>),
    /// An unfenced acquisition: `SET key value NX PX ttl`, then, only where the key is
    /// taken, [`HOLDER_TTL`].
    SetNx {
        key: &'a [u8],
        value: &'a [u8],
        ttl_ms: u64,
    },
}

impl Request<'_> {
    /// The call sent to every node of a round: built once per round and shared by every
    /// node's call, owned so that calls still in flight can finish after the round.
    pub(crate) fn call(&self) -> Call {
        match self {
            Self::Script(inv) => Call::new(
                inv.packed(),
                Some(inv.script),
                std::ptr::eq(inv.script, &*RELEASE_SCRIPT),
            ),
            Self::SetNx { key, value, ttl_ms } => {
                let mut cmd = Packer::new(6, key.len() + value.len());
                cmd.bytes(b"SET")
                    .bytes(key)
                    .bytes(value)
                    .bytes(b"NX")
                    .bytes(b"PX")
                    .int(*ttl_ms);
                Call::new(cmd.done(), None, false)
            }
        }
    }
}

/// One round's command, owned: a script's `EVALSHA` (with the script, for the `EVAL`
/// fallback) or `SET key value NX PX ttl`.
pub(crate) struct Call {
    /// The command as RESP, encoded once per round for the nodes' own connections.
    packed: Vec<u8>,
    /// The same as a redis-rs command, built when first needed (redis-rs's connections and
    /// the rare follow-ups).
    cmd: OnceLock<Cmd>,
    /// The script behind `EVALSHA`; `None` for `SET NX PX`.
    script: Option<&'static Script>,
    /// Whether it is a [`RELEASE`], which a node may send together with others
    /// ([`release_many`]).
    release: bool,
    /// Whether the round sends it to one node only (see [`Call::alone`]).
    alone: bool,
}

impl Call {
    fn new(packed: Vec<u8>, script: Option<&'static Script>, release: bool) -> Self {
        Self {
            packed,
            cmd: OnceLock::new(),
            script,
            release,
            alone: false,
        }
    }

    /// The command for redis-rs.
    fn cmd(&self) -> &Cmd {
        self.cmd.get_or_init(|| {
            let mut cmd = Cmd::new();
            for arg in args_of(&self.packed) {
                cmd.arg(arg);
            }
            cmd
        })
    }

    /// Marks the call as sent to one node only.
    pub(crate) fn sent_alone(mut self, alone: bool) -> Self {
        self.alone = alone;
        self
    }

    /// Whether the round sends it to one node only: the caller may then write it to the
    /// connection itself. To several nodes, each connection's task writes it, so that the
    /// writes run side by side instead of one after another on the caller's thread (which
    /// would also delay what the caller does next, such as waking a waiter).
    pub(crate) fn alone(&self) -> bool {
        self.alone
    }

    /// Whether this is a [`RELEASE`], which can go out in one [`release_many`] with others.
    pub(crate) fn is_release(&self) -> bool {
        self.release
    }

    /// The argument at `i` of the command (`SET key value NX PX ttl`: the key is at 1, the
    /// value at 2; `EVALSHA sha numkeys key...`: the first key is at 3).
    fn arg(&self, i: usize) -> &[u8] {
        args_of(&self.packed).nth(i).unwrap_or_default()
    }

    /// The command as RESP, encoded once per round for the nodes' own connections.
    pub(crate) fn packed(&self) -> &[u8] {
        &self.packed
    }

    /// Runs the call on one connection. A script the node no longer has (`NOSCRIPT`) is
    /// sent again with `EVAL`; a `SET NX PX` that finds the key taken asks for the
    /// holder's TTL ([`HOLDER_TTL`]).
    pub(crate) async fn run<C: ConnectionLike>(&self, conn: &mut C) -> redis::RedisResult<Value> {
        let first = self.cmd().query_async::<Value>(conn).await;
        self.finish(first, conn).await
    }

    /// Whether the node's answer `first` needs [`finish`](Self::finish): a script the
    /// node does not have, or a `SET NX PX` that found the key taken.
    pub(crate) fn needs_more(&self, first: &redis::RedisResult<Value>) -> bool {
        match (self.script, first) {
            (Some(_), Err(e)) => no_script(e),
            (None, Ok(Value::Nil)) => true,
            _ => false,
        }
    }

    /// The rest of the call once the node answered its command with `first`: the `EVAL`
    /// fallback of a script, or the holder's TTL for a `SET NX PX` that found the key
    /// taken; otherwise `first` itself.
    pub(crate) async fn finish<C: ConnectionLike>(
        &self,
        first: redis::RedisResult<Value>,
        conn: &mut C,
    ) -> redis::RedisResult<Value> {
        if !self.needs_more(&first) {
            return first;
        }
        match self.script {
            Some(script) => eval_instead(self.cmd(), script, conn).await,
            None => {
                // `SET key value NX PX ttl`: the key is at 1, the value at 2.
                let holder = Invocation {
                    script: &HOLDER_TTL_SCRIPT,
                    keys: &[self.arg(1)],
                    args: &[Arg::Bytes(self.arg(2))],
                };
                run_script(&holder.cmd(), &HOLDER_TTL_SCRIPT, conn).await
            }
        }
    }
}

/// Runs the [`RELEASE`]s `calls` (all of one client) as one [`RELEASE_MANY`] on `conn`:
/// one answer per call, in order, each as the call alone would have had it.
pub(crate) async fn release_many<C: ConnectionLike>(
    calls: &[impl std::ops::Deref<Target = Call>],
    conn: &mut C,
) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
    // Each call's key, value and client id, read in one pass over its command.
    let releases: Vec<[&[u8]; 3]> = calls
        .iter()
        .map(|call| {
            let mut args = args_of(&call.packed).skip(3);
            [(); 3].map(|()| args.next().unwrap_or_default())
        })
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

/// One key's answer in a [`RELEASE_MANY`] reply: `{message}` is the error the key's
/// `GET` raised, as the server would have sent it for that key alone.
fn key_answer(answer: Value) -> redis::RedisResult<Value> {
    match answer {
        Value::Array(message) => match message.as_slice() {
            [Value::BulkString(text)] => {
                let mut error = Vec::with_capacity(text.len() + 3);
                error.push(b'-');
                error.extend(text.iter().filter(|&&b| b != b'\r' && b != b'\n'));
                error.extend_from_slice(b"\r\n");
                redis::parse_redis_value(&error)?.extract_error()
            }
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected error in the reply to the batched release script",
            ))),
        },
        other => Ok(other),
    }
}

/// Runs `by_sha` (the `EVALSHA` of `script`), falling back to `EVAL` with the same keys
/// and arguments when the node answers `NOSCRIPT`.
async fn run_script<C: ConnectionLike>(
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
fn no_script(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// `by_sha` (the `EVALSHA` of `script`) sent again as `EVAL`, with the same keys and
/// arguments; this also caches the script on the node again.
async fn eval_instead<C: ConnectionLike>(
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

impl Invocation<'_> {
    /// The command's arguments: `EVALSHA sha numkeys keys... args...` (a node that lost
    /// the script gets them again as `EVAL`, see `eval_instead`).
    fn words(&self) -> impl Iterator<Item = Arg<'_>> {
        let keys = u64::try_from(self.keys.len()).unwrap_or(u64::MAX);
        let sha = self.script.sha.as_bytes();
        [Arg::Bytes(b"EVALSHA"), Arg::Bytes(sha), Arg::Int(keys)]
            .into_iter()
            .chain(self.keys.iter().map(|key| Arg::Bytes(key)))
            .chain(self.args.iter().copied())
    }

    /// The command as RESP: [`cmd`](Self::cmd) packed, without building it first.
    fn packed(&self) -> Vec<u8> {
        let size = self
            .words()
            .map(|word| match word {
                Arg::Bytes(b) => b.len(),
                Arg::Int(_) => 20,
            })
            .sum();
        let mut cmd = Packer::new(3 + self.keys.len() + self.args.len(), size);
        for word in self.words() {
            match word {
                Arg::Bytes(b) => cmd.bytes(b),
                Arg::Int(n) => cmd.int(n),
            };
        }
        cmd.done()
    }

    /// The command: `EVALSHA sha numkeys keys... args...`.
    pub(crate) fn cmd(&self) -> Cmd {
        let mut cmd = Cmd::new();
        for word in self.words() {
            match word {
                Arg::Bytes(b) => cmd.arg(b),
                Arg::Int(n) => cmd.arg(n),
            };
        }
        cmd
    }
}

/// What a node answered to an acquisition: `SET NX PX` (then [`HOLDER_TTL`]) or
/// [`ACQUIRE_FENCED`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The key was set. With fencing: the node's counter for the name (`None` if it has
    /// none) and its clock in microseconds; without, neither.
    Won { fence: Option<FenceRead> },
    /// Another value is stored under the key; `pttl` is its remaining TTL, if it has one;
    /// `ours` when the value is one of this client's (starts with its id).
    HeldElsewhere { pttl: Option<Duration>, ours: bool },
    /// The key holds a completion record (the name's work is done): the record.
    Record(Vec<u8>),
}

/// What phase 1 of fencing read on a node that granted the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FenceRead {
    /// The node's counter for the name, if it has one.
    pub(crate) counter: Option<u64>,
    /// The node's clock (`TIME`) in microseconds.
    pub(crate) clock_us: u64,
}

/// Parses the reply to an acquisition: `OK` (set) or the holder's PTTL from [`HOLDER_TTL`]
/// for `SET NX PX`, an array for [`ACQUIRE_FENCED`].
pub(crate) fn parse_acquire(v: Value) -> Result<AcquireReply, NodeError> {
    let bad = |what: &dyn std::fmt::Debug| {
        NodeError::Protocol(format!("unexpected reply to the acquire command: {what:?}").into())
    };
    let items = match v {
        Value::Okay => return Ok(AcquireReply::Won { fence: None }),
        Value::Array(items) => items,
        other => return Err(bad(&other)),
    };
    match items.as_slice() {
        [Value::Int(1), counter, secs, micros] => {
            let counter = match counter {
                Value::BulkString(b) if b.is_empty() => None,
                other => Some(decimal(other).ok_or_else(|| bad(&items))?),
            };
            let clock_us = decimal(secs)
                .zip(decimal(micros))
                .and_then(|(s, us)| s.checked_mul(1_000_000)?.checked_add(us))
                .ok_or_else(|| bad(&items))?;
            Ok(AcquireReply::Won {
                fence: Some(FenceRead { counter, clock_us }),
            })
        }
        [Value::Int(0), Value::Int(pttl), Value::Int(ours)] => Ok(AcquireReply::HeldElsewhere {
            pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
            ours: *ours == 1,
        }),
        [Value::Int(1)] => Ok(AcquireReply::Won { fence: None }),
        [Value::Int(2), Value::BulkString(record)] if record.starts_with(RECORD_MARKER) => {
            Ok(AcquireReply::Record(record.clone()))
        }
        _ => Err(bad(&items)),
    }
}

/// Parses the reply to a compare-and-set script ([`FENCE`], [`EXTEND`]): whether the key
/// still held our value.
pub(crate) fn parse_flag(v: Value) -> Result<bool, NodeError> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected_flag(&other)),
    }
}

/// What a [`RELEASE`] (or [`COMPLETE`]) did on one node.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Deleted {
    /// The key no longer held our value: nothing was done.
    NotHeld,
    /// Done, and the waiters were told.
    Told,
    /// Done, but the node refused the `PUBLISH` that tells the waiters: its message.
    Untold(String),
}

/// Parses the reply to [`RELEASE`] or [`COMPLETE`].
pub(crate) fn parse_deleted(v: Value) -> Result<Deleted, NodeError> {
    match v {
        Value::Int(1) => Ok(Deleted::Told),
        Value::Int(0) => Ok(Deleted::NotHeld),
        Value::BulkString(message) => Ok(Deleted::Untold(
            String::from_utf8_lossy(&message).into_owned(),
        )),
        other => Err(unexpected_flag(&other)),
    }
}

fn unexpected_flag(other: &Value) -> NodeError {
    NodeError::Protocol(format!("unexpected reply to a compare-and-set script: {other:?}").into())
}

/// A non-negative decimal integer sent as a bulk string (or an integer).
fn decimal(v: &Value) -> Option<u64> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// Writes a command as RESP, an array of bulk strings, straight into one buffer: what
/// `redis::Cmd::get_packed_command` gives, without building a `Cmd` first.
struct Packer(Vec<u8>);

impl Packer {
    /// A command of `count` arguments whose own bytes come to about `size`.
    fn new(count: usize, size: usize) -> Self {
        let mut buf = Vec::with_capacity(
            size.saturating_add(count.saturating_mul(16))
                .saturating_add(16),
        );
        buf.push(b'*');
        buf.extend_from_slice(digits(count as u64, &mut [0; 20]));
        buf.extend_from_slice(b"\r\n");
        Self(buf)
    }

    fn bytes(&mut self, arg: &[u8]) -> &mut Self {
        self.0.push(b'$');
        self.0
            .extend_from_slice(digits(arg.len() as u64, &mut [0; 20]));
        self.0.extend_from_slice(b"\r\n");
        self.0.extend_from_slice(arg);
        self.0.extend_from_slice(b"\r\n");
        self
    }

    fn int(&mut self, n: u64) -> &mut Self {
        self.bytes(digits(n, &mut [0; 20]))
    }

    fn done(self) -> Vec<u8> {
        self.0
    }
}

/// `n` in decimal digits, written to the end of `buf`.
fn digits(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// The arguments of a command `Packer` wrote (an array of bulk strings), in order.
fn args_of(packed: &[u8]) -> impl Iterator<Item = &[u8]> {
    // After the array's header line come the bulk strings: `$len\r\n` bytes `\r\n`.
    let header = packed
        .iter()
        .position(|&b| b == b'\n')
        .map_or(packed.len(), |at| at + 1);
    let mut rest = &packed[header..];
    std::iter::from_fn(move || {
        let line = rest.strip_prefix(b"$")?;
        let end = line.iter().position(|&b| b == b'\r')?;
        let len = line[..end].iter().try_fold(0usize, |n, &d| {
            let digit = d.checked_sub(b'0').filter(|d| *d <= 9)?;
            n.checked_mul(10)?.checked_add(usize::from(digit))
        })?;
        let start = end.checked_add(2)?;
        let stop = start.checked_add(len)?;
        let arg = line.get(start..stop)?;
        rest = line.get(stop.checked_add(2)?..)?;
        Some(arg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_packed_as_redis_rs_packs_them_and_read_back() {
        let odd: &[u8] = b"a\r\n$3\r\n*\x00\xff";
        for (key, value, ttl_ms) in [
            (&b"redlock:{k}"[..], &b"v"[..], 10_000),
            (odd, &b""[..], u64::MAX),
            (&b""[..], odd, 0),
        ] {
            let call = Request::SetNx { key, value, ttl_ms }.call();
            let mut cmd = redis::cmd("SET");
            cmd.arg(key).arg(value).arg("NX").arg("PX").arg(ttl_ms);
            assert_eq!(call.packed(), cmd.get_packed_command());
            assert_eq!(call.cmd().get_packed_command(), cmd.get_packed_command());
            assert_eq!(
                (call.arg(1), call.arg(2), call.arg(6)),
                (key, value, &b""[..])
            );
        }
        let keys: [&[u8]; 2] = [b"redlock:{k}", odd];
        let args = [
            Arg::Bytes(odd),
            Arg::Int(0),
            Arg::Int(u64::MAX),
            Arg::Bytes(b""),
        ];
        for (keys, args) in [
            (&keys[..], &args[..]),
            (&keys[..1], &args[..0]),
            (&[][..], &args[..]),
        ] {
            let inv = Invocation {
                script: &RELEASE_SCRIPT,
                keys,
                args,
            };
            let call = Request::Script(Invocation { ..inv }).call();
            let mut by_hand = redis::cmd("EVALSHA");
            by_hand.arg(RELEASE_SCRIPT.sha.as_str()).arg(keys.len());
            for key in keys {
                by_hand.arg(*key);
            }
            for arg in args {
                match arg {
                    Arg::Bytes(b) => by_hand.arg(*b),
                    Arg::Int(n) => by_hand.arg(*n),
                };
            }
            let expected = by_hand.get_packed_command();
            assert_eq!(Invocation { ..inv }.cmd().get_packed_command(), expected);
            assert_eq!(call.packed(), expected);
            assert_eq!(call.cmd().get_packed_command(), expected);
            let read: Vec<&[u8]> = args_of(call.packed()).collect();
            assert_eq!(read.len(), 3 + keys.len() + args.len());
            assert_eq!(read[0], b"EVALSHA");
            assert_eq!(&read[3..3 + keys.len()], keys);
        }
        assert_eq!(args_of(b"").count(), 0);
        assert_eq!(
            args_of(b"*2\r\n$5\r\nab").count(),
            0,
            "a cut bulk string is not read"
        );
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn parses_acquire_replies() {
        assert_eq!(
            parse_acquire(Value::Okay).ok(),
            Some(AcquireReply::Won { fence: None })
        );
        let busy =
            |pttl, ours| Value::Array(vec![Value::Int(0), Value::Int(pttl), Value::Int(ours)]);
        assert_eq!(
            parse_acquire(busy(250, 0)).ok(),
            Some(AcquireReply::HeldElsewhere {
                pttl: Some(Duration::from_millis(250)),
                ours: false,
            })
        );
        assert_eq!(
            parse_acquire(busy(-2, 1)).ok(),
            Some(AcquireReply::HeldElsewhere {
                pttl: None,
                ours: true,
            })
        );
        assert!(matches!(
            parse_acquire(Value::Int(250)),
            Err(NodeError::Protocol(_))
        ));
        assert!(matches!(
            parse_acquire(Value::Nil),
            Err(NodeError::Protocol(_))
        ));
        let fenced = Value::Array(vec![Value::Int(1), bulk("17"), bulk("2"), bulk("5")]);
        assert_eq!(
            parse_acquire(fenced).ok(),
            Some(AcquireReply::Won {
                fence: Some(FenceRead {
                    counter: Some(17),
                    clock_us: 2_000_005
                })
            })
        );
        let fresh = Value::Array(vec![Value::Int(1), bulk(""), bulk("2"), bulk("5")]);
        assert!(matches!(
            parse_acquire(fresh),
            Ok(AcquireReply::Won {
                fence: Some(FenceRead { counter: None, .. })
            })
        ));
        let garbage = Value::Array(vec![Value::Int(1), bulk("-3"), bulk("2"), bulk("5")]);
        assert!(matches!(
            parse_acquire(garbage),
            Err(NodeError::Protocol(_))
        ));
        assert!(matches!(
            parse_flag(Value::Okay),
            Err(NodeError::Protocol(_))
        ));
    }
}
