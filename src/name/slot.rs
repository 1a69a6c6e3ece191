//! Redis Cluster hash slots, and the short tag that puts a key in a given slot: a name's
//! fencing counter is its lock key's slot's, the slot's member in a sorted set; with a
//! Redis Cluster node that set is one per slot, under a key that the tag puts in that
//! same slot (so a cluster keeps lock and counter on one shard, and one script reaches
//! both).
//!
//! ```text
//! slot(b"redlock:{order:42}")   = CRC16 of "order:42" mod 16384
//! tag(slot)                     = the smallest decimal number whose own slot it is
//! counter key                   = "redlock:#fencing" (a cluster: "redlock:#fencing{" tag "}")
//! member                        = the slot, in decimal digits
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Slots are internal; a fenced lock's counter is its lock key's slot's.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("order:42").await?;
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::sync::LazyLock;

/// How many hash slots a Redis Cluster has.
pub(crate) const SLOTS: usize = 16384;

/// The hash tag of a key, as Redis Cluster takes it: what is between its first `{` and
/// the first `}` after it, if that is not empty; otherwise the whole key.
pub(crate) fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|b| *b == b'{')
        && let Some(rest) = key.get(open + 1..)
        && let Some(len) = rest.iter().position(|b| *b == b'}')
        && len > 0
    {
        return &rest[..len];
    }
    key
}

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag, modulo [`SLOTS`].
pub(crate) fn slot(key: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in hash_tag(key) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc % SLOTS as u16
}

/// For each slot, the smallest number whose decimal digits hash to it (computed once:
/// about 160,000 CRCs).
static TAGS: LazyLock<Vec<u32>> = LazyLock::new(|| {
    let mut tags = vec![u32::MAX; SLOTS];
    let mut left = SLOTS;
    let mut n: u32 = 0;
    while left > 0 && n < u32::MAX {
        let s = usize::from(slot(n.to_string().as_bytes()));
        if tags[s] == u32::MAX {
            tags[s] = n;
            left -= 1;
        }
        n += 1;
    }
    tags
});

/// The tag that puts a key in slot `slot` (as `{tag}`): decimal digits.
pub(crate) fn tag(slot: u16) -> Vec<u8> {
    let n = TAGS.get(usize::from(slot)).copied().unwrap_or(0);
    n.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_of_redis_cluster() {
        // What `CLUSTER KEYSLOT` answers on a Redis 7.0 node.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"abc"), 7638);
        assert_eq!(slot(b"redlock:{abc}"), 7638);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        for s in 0..SLOTS as u16 {
            assert_eq!(slot(&tag(s)), s, "slot {s}");
        }
    }
}
