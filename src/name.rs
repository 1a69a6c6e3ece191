//! Lock names, their Redis keys, and lock values.
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
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use sha2::{Digest, Sha256};

use crate::defaults::{MAX_NAME_LEN, VALUE_LEN};
use crate::error::LockError;

pub(crate) mod slot;

pub(crate) use slot::SLOTS;

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_into(out: &mut Vec<u8>, bytes: &[u8]) {
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 0x0f)]);
    }
}

/// Where a client's fencing counters live on a node: one counter per hash slot, shared
/// by the names of the slot (a name's counter is its slot's), as the score of the slot's
/// member in a sorted set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CounterSets {
    /// One sorted set per node, `{prefix}#fencing`, with a member per slot: one key
    /// whatever the names, so the node's keyspace stays as small as without fencing.
    One,
    /// A sorted set per slot, `{prefix}#fencing{{tag}}`, in that slot, with its one member:
    /// for a Redis Cluster, where a script's keys must share a slot and the phase-2 script
    /// takes the lock key and the counter's set together.
    PerSlot,
}

impl CounterSets {
    /// How many sets a node holds at most (per key prefix).
    pub(crate) fn count(self) -> usize {
        match self {
            Self::One => 1,
            Self::PerSlot => SLOTS,
        }
    }
}

/// The Redis keys of one lock name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    /// `{prefix}{{name}}`: the name (or its hash) is the key's hash tag.
    pub(crate) lock: Vec<u8>,
    /// The lock key's hash slot.
    pub(crate) slot: u16,
    /// The sorted set that holds the name's fencing counter ([`CounterSets`]).
    pub(crate) counter: Vec<u8>,
    /// Which of the client's counter sets that is: 0 with [`CounterSets::One`], the slot
    /// with [`CounterSets::PerSlot`] (the index of its renewal schedule).
    pub(crate) set: u16,
    /// The name's member in that set, whose score is its counter: the name's hash slot
    /// (its lock key's without the prefix) in decimal digits, so the names of a slot share
    /// a counter.
    pub(crate) member: Vec<u8>,
    /// The key that says another client's task waits for a lock on the node (see
    /// `crate::waiters`): `{prefix}#waiting`. None with a set per slot (a Redis Cluster),
    /// where a release takes its lock key alone (a script of two keys meets `TRYAGAIN` in
    /// a slot being resharded) and always tells the waiters.
    pub(crate) waiting: Option<Vec<u8>>,
}

/// The Redis keys for `name` under `prefix`, with its counter in `sets`; an error for an
/// empty name.
///
/// The name goes between braces, so it is the hash tag of the lock key. With a set per
/// slot, the counter key's tag puts it in the lock key's slot: in a Redis Cluster they
/// share a shard, whatever the name holds. A name longer than [`MAX_NAME_LEN`] bytes, or
/// starting with `}` (which would make the tag empty), is replaced by `#sha256:` and its
/// hex SHA-256.
///
/// A counter per slot rather than per name keeps the counters' memory bounded (at most
/// [`SLOTS`] per node and prefix, whatever the names), and two names that share a counter
/// only get higher numbers: the shared counter is above every number of each.
pub(crate) fn keys_for(prefix: &[u8], name: &[u8], sets: CounterSets) -> Result<Keys, LockError> {
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
    let tagged = |infix: &[u8], tag: &[u8]| tagged_key(prefix, infix, tag);
    let lock = tagged(b"", &part);
    let slot = slot::slot(&lock);
    let (counter, waiting, set) = match sets {
        CounterSets::One => (
            [prefix, b"#fencing"].concat(),
            Some([prefix, b"#waiting"].concat()),
            0,
        ),
        // With a prefix that has a tag of its own, that tag decides both keys' slot.
        CounterSets::PerSlot => (tagged(b"#fencing", &slot::tag(slot)), None, slot),
    };
    // The name's own slot: the lock key's, unless the prefix's tag decides that one (then
    // every name would share one counter).
    let own = if prefix.contains(&b'{') {
        slot::slot(&tagged_name(&part))
    } else {
        slot
    };
    Ok(Keys {
        lock,
        slot,
        counter,
        set,
        member: own.to_string().into_bytes(),
        waiting,
    })
}

/// `{prefix}{infix}{{tag}}`: a key whose hash slot is `tag`'s (unless the prefix has a tag
/// of its own).
pub(crate) fn tagged_key(prefix: &[u8], infix: &[u8], tag: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + infix.len() + tag.len() + 2);
    key.extend_from_slice(prefix);
    key.extend_from_slice(infix);
    key.push(b'{');
    key.extend_from_slice(tag);
    key.push(b'}');
    key
}

/// `{part}`: the lock key of `part` without a prefix.
fn tagged_name(part: &[u8]) -> Vec<u8> {
    [&b"{"[..], part, b"}"].concat()
}

/// Whether lock and counter keys under `prefix` share their slot: the prefix has no `{`
/// (each key's own tag decides, and the counter key's is chosen for the lock key's slot),
/// or its first `{` is closed by a `}` within the prefix with something between (the
/// prefix's tag decides both).
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
    /// The key of the sorted set that holds the fencing counter.
    pub(crate) counter_key: Box<[u8]>,
    /// The name's member in that set: its counter is the member's score.
    pub(crate) counter_member: Box<[u8]>,
    /// Which of the client's counter sets holds it ([`Keys::set`]).
    pub(crate) counter_set: u16,
    /// The key that says another client waits for a lock on the node ([`Keys::waiting`]).
    pub(crate) waiting_key: Option<Box<[u8]>>,
}

impl Resource {
    /// The resource `name`, at its `keys`.
    pub(crate) fn new(name: &[u8], keys: Keys) -> Self {
        Self {
            name: name.into(),
            key: keys.lock.into(),
            counter_key: keys.counter.into(),
            counter_member: keys.member.into(),
            counter_set: keys.set,
            waiting_key: keys.waiting.map(Into::into),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn lock_key(prefix: &[u8], name: &[u8]) -> Vec<u8> {
        keys_for(prefix, name, CounterSets::One)
            .map(|k| k.lock)
            .unwrap_or_default()
    }

    #[test]
    fn short_names_are_the_hash_tag_of_the_lock_key() {
        let keys = keys_for(b"p:", b"abc", CounterSets::One).ok();
        assert_eq!(
            keys.as_ref().map(|k| k.lock.as_slice()),
            Some(&b"p:{abc}"[..])
        );
        assert_eq!(keys.as_ref().map(|k| k.slot), Some(7638));
        // One set per node; the member is the slot.
        assert_eq!(
            keys.as_ref().map(|k| k.counter.as_slice()),
            Some(&b"p:#fencing"[..])
        );
        assert_eq!(keys.as_ref().map(|k| k.set), Some(0));
        assert_eq!(
            keys.as_ref().and_then(|k| k.waiting.as_deref()),
            Some(&b"p:#waiting"[..])
        );
        assert_eq!(keys.map(|k| k.member).unwrap_or_default(), b"7638");
        // A set per slot: "abc" is in slot 7638, as is "8586", the smallest number there.
        let keys = keys_for(b"p:", b"abc", CounterSets::PerSlot).ok();
        assert_eq!(
            keys.as_ref().map(|k| k.counter.as_slice()),
            Some(&b"p:#fencing{8586}"[..])
        );
        assert_eq!(keys.as_ref().map(|k| k.set), Some(7638));
        // No waiting key: a cluster's release takes one key.
        assert_eq!(keys.as_ref().map(|k| k.waiting.is_none()), Some(true));
        assert_eq!(keys.map(|k| k.member).unwrap_or_default(), b"7638");
        let exact = vec![b'x'; MAX_NAME_LEN];
        assert_eq!(lock_key(b"", &exact).len(), MAX_NAME_LEN + 2);
    }

    #[test]
    fn a_prefix_with_a_tag_of_its_own_still_spreads_the_names_over_the_slots() {
        // `{app}` puts every lock key in one slot; the counters stay one per name's slot.
        for sets in [CounterSets::One, CounterSets::PerSlot] {
            let keys = |name: &[u8]| keys_for(b"{app}:", name, sets).ok();
            let (a, b) = (keys(b"abc"), keys(b"order:42"));
            assert_eq!(a.as_ref().map(|k| k.slot), b.as_ref().map(|k| k.slot));
            assert_eq!(a.map(|k| k.member).unwrap_or_default(), b"7638");
            assert_ne!(b.map(|k| k.member).unwrap_or_default(), b"7638");
        }
    }

    #[test]
    fn a_name_shares_its_counter_with_the_names_of_its_slot_only() {
        let keys = |name: &[u8]| keys_for(b"redlock:", name, CounterSets::One).ok();
        let (a, b) = (keys(b"{user1000}.following"), keys(b"{user1000}.followers"));
        assert_eq!(a.as_ref().map(|k| &k.member), b.as_ref().map(|k| &k.member));
        let c = keys(b"order:42");
        assert_ne!(a.as_ref().map(|k| &k.member), c.as_ref().map(|k| &k.member));
        // Every member is the decimal slot: at most SLOTS of them per set.
        for i in 0..10_000 {
            let k = keys(format!("order:{i}").as_bytes());
            let member = k.as_ref().map(|k| k.member.clone()).unwrap_or_default();
            assert_eq!(
                k.map(|k| k.slot.to_string().into_bytes()),
                Some(member.clone())
            );
            assert!(member.len() <= 5);
        }
    }

    #[test]
    fn lock_and_counter_keys_share_a_slot_whatever_the_name_or_prefix() {
        for prefix in [&b"redlock:"[..], b"{app}:", b"a}b:", b""] {
            assert!(prefix_keeps_tags(prefix));
            for name in [&b"order:42"[..], b"a}b", b"}x", b"{y}", b"{}", b"x{"] {
                let Ok(k) = keys_for(prefix, name, CounterSets::PerSlot) else {
                    panic!("{name:?} is a valid name")
                };
                assert_eq!(slot::slot(&k.lock), k.slot, "{prefix:?} {name:?}");
                assert_eq!(slot::slot(&k.counter), k.slot, "{prefix:?} {name:?}");
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
            keys_for(b"p:", b"", CounterSets::One),
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
