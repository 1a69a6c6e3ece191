//! Held locks, lock names and lock values.
//!
//! A lock name is any non-empty byte string. Its Redis key is `{prefix}{name}`; a name
//! longer than [`MAX_NAME_LEN`] bytes is replaced by `#sha256:` and the hex SHA-256 of the
//! name, so untrusted input (a header, a path segment) cannot make huge keys.
//!
//! Each acquisition gets a fresh value: the client's id (16 hex digits, random per
//! [`Redlock`](crate::Redlock), so that a client waiting for a name can tell its own locks
//! from other clients') and [`VALUE_LEN`] bytes from the operating system's CSPRNG, all
//! hex-encoded. Only the holder knows it, so only the holder can extend or release the
//! lock; a downstream store can also use it for compare-and-set.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?;
//! assert_eq!(lock.name(), b"invoice:42");
//! assert_eq!(lock.value().len(), 16 + 2 * tower_redlock::defaults::VALUE_LEN);
//! println!("valid for another {:?}", lock.remaining());
//! redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::defaults::{MAX_NAME_LEN, VALUE_LEN};
use crate::error::LockError;
use crate::landing::Landing;
use crate::quorum::NodeMask;

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_into(out: &mut Vec<u8>, bytes: &[u8]) {
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 0x0f)]);
    }
}

/// The Redis keys of one lock name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    /// `{prefix}{{name}}`: the name (or its hash) is the key's hash tag.
    pub(crate) lock: Vec<u8>,
    /// `{prefix}#fence{{name}}`: the fencing counter, in the lock key's hash slot.
    pub(crate) counter: Vec<u8>,
}

/// The Redis keys for `name` under `prefix`; an error for an empty name.
///
/// The name goes between braces, so it is the hash tag of both the lock key and the
/// counter key: in a Redis Cluster they share a slot, whatever the name holds. A name
/// longer than [`MAX_NAME_LEN`] bytes, or starting with `}` (which would make the tag
/// empty), is replaced by `#sha256:` and its hex SHA-256.
pub(crate) fn keys_for(prefix: &[u8], name: &[u8]) -> Result<Keys, LockError> {
    if name.is_empty() {
        return Err(LockError::InvalidName {
            reason: "the name is empty",
        });
    }
    let hashed = || {
        let mut out = Vec::with_capacity(8 + 64);
        out.extend_from_slice(b"#sha256:");
        hex_into(&mut out, &Sha256::digest(name));
        out
    };
    let part = if name.len() <= MAX_NAME_LEN && !name.starts_with(b"}") {
        name.to_vec()
    } else {
        hashed()
    };
    let tagged = |infix: &[u8]| {
        let mut key = Vec::with_capacity(prefix.len() + infix.len() + part.len() + 2);
        key.extend_from_slice(prefix);
        key.extend_from_slice(infix);
        key.push(b'{');
        key.extend_from_slice(&part);
        key.push(b'}');
        key
    };
    Ok(Keys {
        lock: tagged(b""),
        counter: tagged(b"#fence"),
    })
}

/// Whether lock and counter keys under `prefix` share their hash tag: the prefix has no
/// `{`, or its first `{` is closed by a `}` within the prefix with something between.
pub(crate) fn prefix_keeps_tags(prefix: &[u8]) -> bool {
    match prefix.iter().position(|b| *b == b'{') {
        None => true,
        Some(open) => prefix
            .get(open + 1..)
            .and_then(|rest| rest.iter().position(|b| *b == b'}'))
            .is_some_and(|len| len > 0),
    }
}

/// A fresh lock value: the client's `id` (16 hex digits), then [`VALUE_LEN`] bytes from the
/// OS CSPRNG, hex-encoded.
pub(crate) fn new_value(id: &[u8; CLIENT_ID_LEN]) -> Result<String, LockError> {
    let mut raw = [0u8; VALUE_LEN];
    getrandom::fill(&mut raw).map_err(|e| LockError::Entropy(e.to_string()))?;
    let mut out = Vec::with_capacity(CLIENT_ID_LEN + 2 * VALUE_LEN);
    out.extend_from_slice(id);
    hex_into(&mut out, &raw);
    // Hex digits are ASCII, so this cannot fail; map rather than unwrap all the same.
    String::from_utf8(out).map_err(|e| LockError::Entropy(e.to_string()))
}

/// The length of a client's id at the start of its lock values (hex digits).
pub(crate) const CLIENT_ID_LEN: usize = 16;

/// A resource's name and its Redis keys.
#[derive(Debug)]
pub(crate) struct Resource {
    pub(crate) name: Box<[u8]>,
    /// The lock key.
    pub(crate) key: Box<[u8]>,
    /// The fencing counter's key.
    pub(crate) counter_key: Box<[u8]>,
}

/// A lock this client holds (or held): returned by [`Redlock::lock`](crate::Redlock::lock)
/// and [`Redlock::try_lock`](crate::Redlock::try_lock).
///
/// It is a plain handle: dropping it does not release the lock, which then expires at the
/// end of its TTL. Release it with [`Redlock::unlock`](crate::Redlock::unlock). Cloning is
/// cheap. `Debug` output never shows the value.
#[derive(Clone)]
pub struct Lock {
    pub(crate) resource: Arc<Resource>,
    pub(crate) value: Arc<str>,
    pub(crate) started: Instant,
    /// When the acquisition started (`started` moves with each extension).
    pub(crate) acquired_at: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) ttl: Duration,
    pub(crate) attempts: u32,
    pub(crate) fence: Option<u64>,
    /// Nodes that held another client's value when this lock was acquired: our value never
    /// reached them, so releasing skips them.
    pub(crate) foreign: NodeMask,
    /// The acquisition's calls still landing on the nodes that had not answered when the
    /// quorum was reached: a release waits for them.
    pub(crate) landing: Option<Landing>,
}

impl Lock {
    /// The fencing number of this acquisition, if fencing is on (see [`crate::fencing`]):
    /// strictly greater than that of every acquisition of the same name that completed
    /// before this one started. Send it with every write to a store that keeps the highest
    /// number it has seen and refuses lower ones.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// The lock name, as given.
    pub fn name(&self) -> &[u8] {
        &self.resource.name
    }

    /// The Redis key (prefix and name, or prefix and hash for long names).
    pub fn key(&self) -> &[u8] {
        &self.resource.key
    }

    /// The unique value stored under the key: [`VALUE_LEN`] random bytes, hex-encoded.
    /// Use it for compare-and-set on a downstream store; keep it out of logs.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// When the lock stops being valid (on this process's monotonic clock). Past this
    /// instant another client may hold it.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// The validity left, zero once [`valid_until`](Self::valid_until) has passed.
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Whether the validity deadline is still ahead.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }

    /// When the attempt (or the extension) that set the current validity started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The TTL set on the nodes by the last acquire or extend.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How many attempts the acquisition took (1 if the first one succeeded).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &String::from_utf8_lossy(&self.resource.name))
            .field("value", &"<redacted>")
            .field("remaining", &self.remaining())
            .field("fencing_token", &self.fence)
            .field("ttl", &self.ttl)
            .field("attempts", &self.attempts)
            .finish()
    }
}

/// What a holder learns about its lock: handed out by [`LockGuard::token`](crate::LockGuard::token)
/// and, behind [`RedlockLayer`](crate::RedlockLayer), found in the request
/// extensions: `Extension<LockToken>` (or plain `LockToken` with the `axum` feature) in
/// axum, `request.lock_token()` in tonic ([`LockTokenExt`](crate::layer)), and
/// `request.extensions().get::<LockToken>()` in hyper.
///
/// Cheap to clone; every clone sees the same state. Use [`value`](Self::value) for
/// compare-and-set on a downstream store (`write if current_lock == value`), check
/// [`is_held`](Self::is_held) right before committing a write, and `select!` on
/// [`lost`](Self::lost) to stop work when the lock is lost. `Debug` output never shows the
/// value.
#[derive(Clone)]
pub struct LockToken {
    shared: Arc<Shared>,
}

impl LockToken {
    pub(crate) fn from_shared(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The lock name.
    pub fn name(&self) -> &[u8] {
        self.shared.lock.name()
    }

    /// The lock's unique value: [`VALUE_LEN`] random bytes, hex-encoded.
    pub fn value(&self) -> &str {
        self.shared.lock.value()
    }

    /// The fencing number, if fencing is on: it strictly increases with each new holder of
    /// the name (see [`crate::fencing`]) and stays the same across extensions. Pass it with
    /// every write to the store the lock protects, which refuses numbers lower than the
    /// highest it has seen.
    pub fn fencing_token(&self) -> Option<u64> {
        self.shared.lock.fencing_token()
    }

    /// When the lock stops being valid (on this process's monotonic clock); moves with
    /// each extension.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// The validity left, zero once the deadline has passed.
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Whether the validity deadline is still ahead.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until()
    }

    /// Whether the lock is still held: not lost, and the validity deadline is ahead (it
    /// turns false at the deadline even if no extension could run).
    pub fn is_held(&self) -> bool {
        self.shared.is_held()
    }

    /// Resolves when the lock is lost (or released), with the reason.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason()
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockToken")
            .field("name", &String::from_utf8_lossy(self.name()))
            .field("value", &"<redacted>")
            .field("fencing_token", &self.fencing_token())
            .field("remaining", &self.remaining())
            .field("lost", &self.lost_reason())
            .finish()
    }
}

/// Why a guarded lock was lost.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LostReason {
    /// An extension failed for good: the lock is no longer ours on a quorum, no quorum
    /// answered before the validity ran out, or the quorum came too late.
    ExtendFailed(LockError),
    /// The maximum hold time was reached; the lock was released.
    MaxHoldReached,
    /// The maximum number of extensions was made; the lock was released at the end of the
    /// last extension's validity.
    MaxExtensionsReached,
    /// The guard was released or dropped while a token was still in use.
    Released,
    /// The background task that extends guarded locks stopped (its tokio runtime shut
    /// down, or it panicked): the lock runs out at the end of its validity.
    KeepAliveStopped,
}

impl LostReason {
    /// The `reason` label of `redlock_lost_total`; `None` for a release (not a loss).
    fn metric_label(&self) -> Option<&'static str> {
        match self {
            Self::ExtendFailed(_) => Some("extend_failed"),
            Self::MaxHoldReached => Some("max_hold"),
            Self::MaxExtensionsReached => Some("max_extensions"),
            Self::KeepAliveStopped => Some("keep_alive_stopped"),
            Self::Released => None,
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ExtendFailed(e) => write!(f, "extending the lock failed: {e}"),
            Self::MaxHoldReached => f.write_str("the maximum hold time was reached"),
            Self::MaxExtensionsReached => {
                f.write_str("the maximum number of extensions was reached")
            }
            Self::Released => f.write_str("the lock was released"),
            Self::KeepAliveStopped => f.write_str(
                "the task that extends the lock stopped (its runtime shut down, or it panicked)",
            ),
        }
    }
}

/// The state every token of one acquisition shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) lock: Lock,
    valid_until: Mutex<Instant>,
    lost: watch::Sender<Option<LostReason>>,
}

impl Shared {
    pub(crate) fn new(lock: Lock) -> Arc<Self> {
        let valid_until = Mutex::new(lock.valid_until());
        Arc::new(Self {
            lock,
            valid_until,
            lost: watch::channel(None).0,
        })
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_valid_until(&self, t: Instant) {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = t;
    }

    /// Marks the lock lost (the first reason wins).
    /// Records why the lock was lost (the first reason wins); whether this was the first.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        let label = reason.metric_label();
        self.lost.send_if_modified(|cur| {
            if cur.is_some() {
                return false;
            }
            // Counted before the holders are told, so that whoever sees the loss sees it
            // counted too.
            if let Some(label) = label {
                crate::metrics::lost(label);
            }
            *cur = Some(reason);
            true
        })
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.lost.borrow().clone()
    }

    pub(crate) fn is_held(&self) -> bool {
        self.lost.borrow().is_none() && Instant::now() < self.valid_until()
    }

    pub(crate) async fn lost(&self) -> LostReason {
        let mut rx = self.lost.subscribe();
        loop {
            if let Some(reason) = rx.borrow_and_update().clone() {
                return reason;
            }
            if rx.changed().await.is_err() {
                // Unreachable while `self` holds the sender; treat as released.
                return LostReason::Released;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn lock_key(prefix: &[u8], name: &[u8]) -> Vec<u8> {
        keys_for(prefix, name).map(|k| k.lock).unwrap_or_default()
    }

    /// The hash tag of a key, as Redis Cluster computes it (the whole key without one).
    fn hash_tag(key: &[u8]) -> &[u8] {
        if let Some(open) = key.iter().position(|b| *b == b'{')
            && let Some(len) = key[open + 1..].iter().position(|b| *b == b'}')
            && len > 0
        {
            return &key[open + 1..open + 1 + len];
        }
        key
    }

    #[test]
    fn short_names_are_the_hash_tag_of_both_keys() {
        let keys = keys_for(b"p:", b"abc").ok();
        assert_eq!(
            keys.as_ref().map(|k| k.lock.as_slice()),
            Some(&b"p:{abc}"[..])
        );
        assert_eq!(keys.map(|k| k.counter), Some(b"p:#fence{abc}".to_vec()));
        let exact = vec![b'x'; MAX_NAME_LEN];
        assert_eq!(lock_key(b"", &exact).len(), MAX_NAME_LEN + 2);
    }

    #[test]
    fn lock_and_counter_keys_share_a_slot_whatever_the_name_or_prefix() {
        for prefix in [&b"redlock:"[..], b"{app}:", b"a}b:", b""] {
            assert!(prefix_keeps_tags(prefix));
            for name in [&b"order:42"[..], b"a}b", b"}x", b"{y}", b"{}", b"x{"] {
                let Ok(k) = keys_for(prefix, name) else {
                    panic!("{name:?} is a valid name")
                };
                assert_eq!(
                    hash_tag(&k.lock),
                    hash_tag(&k.counter),
                    "{prefix:?} {name:?}"
                );
                assert_ne!(k.lock, k.counter);
            }
        }
        assert!(!prefix_keeps_tags(b"a{b:"));
        assert!(!prefix_keeps_tags(b"a{}b:"));
    }

    #[test]
    fn long_names_are_hashed_to_a_fixed_size() {
        let a = lock_key(b"p:", &vec![b'a'; MAX_NAME_LEN + 1]);
        let b = lock_key(b"p:", &vec![b'a'; 1_000_000]);
        let c = lock_key(b"p:", &vec![b'b'; 1_000_000]);
        assert_eq!(a.len(), 2 + 2 + 8 + 64);
        assert_eq!(b.len(), a.len());
        assert!(b.starts_with(b"p:{#sha256:"));
        assert_ne!(a, b);
        assert_ne!(b, c);
    }

    #[test]
    fn empty_names_are_rejected() {
        assert!(matches!(
            keys_for(b"p:", b""),
            Err(LockError::InvalidName { .. })
        ));
    }

    #[test]
    fn values_are_the_client_id_and_hex_of_20_random_bytes_and_unique() {
        let mut seen = HashSet::new();
        for _ in 0..100_000 {
            let v = new_value(b"0123456789abcdef").unwrap_or_default();
            assert_eq!(v.len(), CLIENT_ID_LEN + 2 * VALUE_LEN);
            assert!(v.starts_with("0123456789abcdef"));
            assert!(v.bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(seen.insert(v));
        }
    }
}
