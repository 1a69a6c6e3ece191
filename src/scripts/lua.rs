//! The Lua sources that run on the nodes, with their SHA-1s (computed once): loaded with
//! `SCRIPT LOAD` on every connect, then run by `EVALSHA`.
//!
//! ```text
//! RELEASE: if GET key == value then DEL key; PUBLISH key client-id; return 1 end; return 0
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // The scripts are internal; every operation runs one of them.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?; // SET NX PX (+ ZADD GT CH when fenced)
//! let _ = redlock.unlock(&lock).await; // RELEASE, or RELEASE_MANY with others
//! # Ok(()) }
//! ```

use std::sync::LazyLock;

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
/// by now), and 1 when the value there starts with the client id ours starts with, or when
/// the key is gone by now (released between the `SET` and this: no other client's). The
/// `GET` fails with `WRONGTYPE` on a key of another type, which surfaces as a clear
/// per-node error.
pub(super) const HOLDER_TTL: &str = r#"
local held = redis.call('GET', KEYS[1])
local ours = (not held or string.sub(held, 1, 16) == string.sub(ARGV[1], 1, 16)) and 1 or 0
return {0, redis.call('PTTL', KEYS[1]), ours}
"#;

/// The busy path of a fenced acquisition ([`Request::FencedSetNx`](super::Request)),
/// whose `SET NX PX` found the key taken, and of a replay's on a Redis Cluster node (which
/// sends the `SET` without its reads): `{2, record}` for a completion record
/// ([`RECORD_MARKER`]), `{0, pttl, ours}` for another holder (`ours`: 1 when its value
/// starts with the client id of ours), `{0, -2, 1}` when the key is gone by now (released
/// between the `SET` and this: no other client's). `KEYS[1]` = lock key, `ARGV[1]` = our
/// value. A replay's own reads (`GET`, `PTTL`) answer the same (`Call::settled`).
pub(super) const HELD_OR_RECORD: &str = r#"
local held = redis.call('GET', KEYS[1])
if held then
  if string.sub(held, 1, 8) == '#record\n' then
    return {2, held}
  end
  local ours = string.sub(held, 1, 16) == string.sub(ARGV[1], 1, 16) and 1 or 0
  return {0, redis.call('PTTL', KEYS[1]), ours}
end
return {0, -2, 1}
"#;

/// Phase 2 of a fenced acquisition (when a quorum did not accept the proposal).
/// `KEYS[1]` = lock key, `KEYS[2]` = the sorted set of the slot's counters, `ARGV[1]` =
/// value, `ARGV[2]` = the fencing number (decimal), `ARGV[3]` = the set's expiry in ms (a
/// retention and a half, as its renewals in phase 1 give it: never less, so that it still
/// covers every counter in it), `ARGV[4]` = the name's member in the set (whose score is
/// its counter).
///
/// Only while the lock key still holds our value: raises the counter to the fencing number
/// (`ZADD GT`: `counter = max(counter, token)`), renews the set's expiry, and returns 1;
/// otherwise returns 0 and changes nothing. A counter *pinned* at 2^53 or above (the
/// largest whole number a score holds exactly; only a hand-written counter or an unbounded
/// client puts it there) is reset to the number instead: the one write that lowers a
/// counter, a deliberate loss of it (see `docs/fencing.md`), so that the slot does not stay
/// pinned.
pub(super) const FENCE: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local counter = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[4]) or '0')
if counter == nil or counter >= 9007199254740992 then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[4])
else
  redis.call('ZADD', KEYS[2], 'GT', ARGV[2], ARGV[4])
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"#;

/// The marker that starts every completion record stored under a lock key (lock values
/// are hex, so they never start with it).
pub(crate) const RECORD_MARKER: &[u8] = b"#record\n";

/// Compare-and-set of a completion record: replaces our lock value with the record
/// (`ARGV[2]`) for the retention (`ARGV[3]` ms), and tells the waiters where some may be,
/// as [`RELEASE`] does. `KEYS[1]` = lock key, `KEYS[2]` = the node's waiting key,
/// `ARGV[1]` = value. Returns 1, or 0 when the key no longer holds our value, or the
/// server's error when the record was stored but the `PUBLISH` was refused (see
/// [`RELEASE`]).
pub(super) const COMPLETE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if KEYS[2] and redis.call('PTTL', KEYS[2]) == -2 then
    return 1
  end
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
/// Only where some client may be waiting: `KEYS[2]`, the node's waiting key, is there
/// (a waiter of another client sets it, [`MARK_WAITING`], once it listens); without
/// `KEYS[2]` the release always tells. A `PUBLISH` from a script costs the node about as
/// much as the rest of the release, and almost no release has anybody waiting.
///
/// The message is only a hint: a user without permission for the channel (an ACL without
/// `+publish` or `&prefix*`) still releases. The `PUBLISH` is then refused, and the script
/// returns the server's error message (a string) instead of 1: the key was deleted.
pub(super) const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if KEYS[2] and redis.call('PTTL', KEYS[2]) == -2 then
    return 1
  end
  local told = redis.pcall('PUBLISH', KEYS[1], ARGV[2])
  if type(told) == 'table' and told.err then return told.err end
  return 1
end
return 0
"#;

/// The mark of a waiter of another client's lock, set once it listens for the release and
/// before it tries again ([`RELEASE`] tells only while it is there): `KEYS[1]` = the
/// node's waiting key, `ARGV[1]` = how long the waiter may wait, in ms. Sets the key for
/// that long, unless it is there for longer already (another waiter's mark): a mark is
/// never shortened. Returns 1.
pub(super) const MARK_WAITING: &str = r#"
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
end
return 1
"#;

/// [`RELEASE`] for many locks of one client at once (a node's releases that queued while
/// another was on its way): `KEYS[i]` = lock key, `ARGV[i]` = its value, the last `ARGV` =
/// the releasing client's id, and after the lock keys, the node's waiting key (all the
/// releases' own, when they share it: one check for the batch). Returns one answer per
/// key: 1, 0 or a refused `PUBLISH`'s message as [`RELEASE`], or, for a key that is not a
/// string, `{error message}`
/// (`WRONGTYPE`), which fails that key alone (a bare error inside the reply would fail the
/// whole call). A refused `PUBLISH` never stops the keys after it.
///
/// One `MGET` reads every key and one `DEL` deletes the keys that hold their values, then
/// each deleted key's channel is told, as [`RELEASE`] tells it after its delete: a
/// `redis.call` costs the node far more than the work of the command inside it, so two
/// calls for the batch instead of two per key are what make a batch cheaper than its
/// releases sent one by one. `MGET` answers nil for a key that is not a string: only such
/// a key (or one that is gone) is read again with `GET`, for its error; so is every key
/// when `MGET` is refused (an ACL written before it was needed), which costs the node the
/// per-key reads of before but releases all the same. The keys are distinct (a node's
/// connection never merges two releases of one key). It runs [`RELEASE`]'s commands and
/// `MGET`, which the ACL rule of the README names.
pub(super) const RELEASE_MANY: &str = r#"
local n = #ARGV - 1
local id = ARGV[n + 1]
local held = redis.pcall('MGET', unpack(KEYS, 1, n))
if held.err then
  held = {}
end
local out, gone = {}, {}
for i = 1, n do
  local value = held[i]
  if not value then
    value = redis.pcall('GET', KEYS[i])
  end
  if type(value) == 'table' and value.err then
    out[i] = {value.err}
  elseif value == ARGV[i] then
    out[i] = 1
    gone[#gone + 1] = KEYS[i]
  else
    out[i] = 0
  end
end
if #gone > 0 then
  redis.call('DEL', unpack(gone))
  if not KEYS[n + 1] or redis.call('PTTL', KEYS[n + 1]) ~= -2 then
    for i = 1, n do
      if out[i] == 1 then
        local told = redis.pcall('PUBLISH', KEYS[i], id)
        if type(told) == 'table' and told.err then
          out[i] = told.err
        end
      end
    end
  end
end
return out
"#;

/// Compare-and-pexpire: resets the TTL only if the key holds our value. Returns 1 or 0.
pub(super) const EXTEND: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Inspection of a name, never reading out the value. `KEYS[1]` = lock key, `KEYS[2]` =
/// the sorted set of the slot's fencing counters, `ARGV[1]` = the name's member in it
/// (whose score is its counter). Returns `{kind, pttl, counter}`: kind 0 (no key), 1 (a
/// lock) or 2 (a completion record); the key's PTTL; the counter, as the node formats a
/// sorted set's score (`""` if none). Fencing also reads the counters with it, when a
/// quorum did not accept a proposal.
pub(super) const INSPECT: &str = r#"
local v = redis.call('GET', KEYS[1])
local kind = 0
if v then
  kind = 1
  if string.sub(v, 1, 8) == '#record\n' then
    kind = 2
  end
end
return {kind, redis.call('PTTL', KEYS[1]), redis.call('ZSCORE', KEYS[2], ARGV[1]) or ''}
"#;

/// A fenced acquisition's counter on a Redis Cluster node, after its `SET` (one keyed
/// command a request: see `Call::for_cluster`): the replies of `ZADD KEYS[1] GT CH
/// ARGV[1] ARGV[2]` and `PEXPIRE KEYS[1] ARGV[3]`, as one array. Not loaded at connects:
/// sent by `EVAL`.
pub(crate) const RAISE_COUNTER: &str = r#"
local raised = redis.call('ZADD', KEYS[1], 'GT', 'CH', ARGV[1], ARGV[2])
return {raised, redis.call('PEXPIRE', KEYS[1], ARGV[3])}
"#;

pub(crate) static HOLDER_TTL_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(HOLDER_TTL));
pub(crate) static COMPLETE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(COMPLETE));
pub(crate) static HELD_OR_RECORD_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(HELD_OR_RECORD));
pub(crate) static FENCE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(FENCE));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
pub(crate) static MARK_WAITING_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(MARK_WAITING));
pub(crate) static RELEASE_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(RELEASE_MANY));
pub(crate) static EXTEND_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND));
pub(crate) static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT));

/// Every script, for `SCRIPT LOAD` on connect.
pub(crate) fn all() -> [&'static Script; 9] {
    [
        &HOLDER_TTL_SCRIPT,
        &COMPLETE_SCRIPT,
        &HELD_OR_RECORD_SCRIPT,
        &FENCE_SCRIPT,
        &RELEASE_SCRIPT,
        &RELEASE_MANY_SCRIPT,
        &MARK_WAITING_SCRIPT,
        &EXTEND_SCRIPT,
        &INSPECT_SCRIPT,
    ]
}
