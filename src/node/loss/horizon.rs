//! The horizon: how long a node that lost keys stays out of acquisitions, the same for
//! every client of the nodes. It is the longest TTL any client uses, kept on every node
//! (`<prefix>#horizon`, only ever raised) so that a node's own loss cannot erase it: a
//! client reads it from every node it talks to and takes the largest.
//!
//! ```text
//! client A (TTL 60 s) ──raise 60 s──> every node        client B (TTL 10 s) reads 60 s back
//! node 3 restarts empty -> B keeps node 3 out for 60 s from the loss, as A does
//! ```
//!
//! A client raises the horizon on each node at every connect and every check, and before
//! its first lock with a TTL longer than it announced, on a quorum
//! ([`Horizon::uses`]). A loss only counts as over once the horizon was read from a quorum
//! of nodes after it ([`Horizon::read_by_quorum_since`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! // A longer TTL than the client's is announced to the nodes before its first lock.
//! let lock = redlock.try_lock_with_ttl("report", Duration::from_secs(120)).await?;
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A client's view of the horizon (see the module docs).
#[derive(Debug)]
pub(crate) struct Horizon {
    /// Whether losses are judged at all (the restart quarantine is on): otherwise no TTL
    /// needs announcing.
    enabled: bool,
    /// The longest TTL this client uses, in ms.
    own_ms: AtomicU64,
    /// The longest TTL this client announced to a quorum, in ms.
    announced_ms: AtomicU64,
    /// The longest horizon a node reported, in ms.
    heard_ms: AtomicU64,
    /// When each node's horizon was last read.
    reads: Mutex<Vec<Option<Instant>>>,
    quorum: usize,
}

impl Horizon {
    /// The horizon of a client of `nodes` nodes whose TTL is `ttl`, judging losses if
    /// `enabled`. Its TTL counts as announced: every connect raises it on its node, and
    /// no node takes part in a lock before its connect.
    pub(crate) fn new(nodes: usize, ttl: Duration, enabled: bool) -> Self {
        let ms = millis(ttl);
        Self {
            enabled,
            own_ms: AtomicU64::new(ms),
            announced_ms: AtomicU64::new(ms),
            heard_ms: AtomicU64::new(0),
            reads: Mutex::new(vec![None; nodes]),
            quorum: crate::quorum::quorum(nodes),
        }
    }

    /// How long a loss keeps a node out: the longest of this client's TTLs and of the
    /// horizons the nodes reported.
    pub(crate) fn length(&self) -> Duration {
        let own = self.own_ms.load(Ordering::Relaxed);
        Duration::from_millis(own.max(self.heard_ms.load(Ordering::Relaxed)))
    }

    /// The longest TTL this client uses, in ms (what it raises the nodes' horizons to).
    pub(crate) fn own_ms(&self) -> u64 {
        self.own_ms.load(Ordering::Relaxed)
    }

    /// The client uses `ttl`: whether it must be announced to a quorum before its first
    /// lock (longer than any it announced, with losses judged).
    pub(crate) fn uses(&self, ttl: Duration) -> bool {
        let ms = millis(ttl);
        self.own_ms.fetch_max(ms, Ordering::Relaxed);
        self.enabled && ms > self.announced_ms.load(Ordering::Relaxed)
    }

    /// A quorum of nodes took `ttl` into their horizons.
    pub(crate) fn announced(&self, ttl: Duration) {
        self.announced_ms.fetch_max(millis(ttl), Ordering::Relaxed);
    }

    /// Node `node` reported a horizon of `ms` at `at`.
    pub(crate) fn heard(&self, node: usize, ms: u64, at: Instant) {
        self.heard_ms.fetch_max(ms, Ordering::Relaxed);
        let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(read) = reads.get_mut(node) {
            *read = Some(read.map_or(at, |r| r.max(at)));
        }
    }

    /// Whether a quorum of nodes reported their horizon at or after `at` (`None`: before
    /// this client's clock can say, so any read counts).
    pub(crate) fn read_by_quorum_since(&self, at: Option<Instant>) -> bool {
        let reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        let after = |r: &Instant| at.is_none_or(|at| *r >= at);
        reads.iter().flatten().filter(|r| after(r)).count() >= self.quorum
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_length_is_the_longest_ttl_anyone_uses() {
        let h = Horizon::new(3, S(10), true);
        assert_eq!(h.length(), S(10));
        let now = Instant::now();
        h.heard(1, 60_000, now);
        assert_eq!(h.length(), S(60), "another client's, read from a node");
        h.heard(2, 5_000, now);
        assert_eq!(h.length(), S(60), "never shortened");
        assert!(h.uses(S(30)), "longer than this client announced");
        assert_eq!(h.length(), S(60));
    }

    #[test]
    fn a_longer_ttl_is_announced_once() {
        let h = Horizon::new(3, S(10), true);
        assert!(!h.uses(S(10)));
        assert!(!h.uses(S(5)));
        assert!(h.uses(S(20)));
        assert_eq!(h.own_ms(), 20_000);
        assert!(h.uses(S(20)), "until a quorum took it");
        h.announced(S(20));
        assert!(!h.uses(S(20)));
        assert!(!h.uses(S(15)));
        let off = Horizon::new(3, S(10), false);
        assert!(
            !off.uses(S(20)),
            "nothing to announce with the quarantine off"
        );
        assert_eq!(off.own_ms(), 20_000);
    }

    #[test]
    fn a_quorum_of_reads_after_a_moment_confirms_it() {
        let h = Horizon::new(3, S(10), true);
        let t0 = Instant::now();
        let t1 = t0 + S(1);
        h.heard(0, 1, t0);
        h.heard(1, 1, t1);
        assert!(h.read_by_quorum_since(Some(t0)));
        assert!(!h.read_by_quorum_since(Some(t1)));
        assert!(h.read_by_quorum_since(None));
        h.heard(2, 1, t1);
        assert!(h.read_by_quorum_since(Some(t1)));
        h.heard(0, 1, t0);
        assert!(
            h.read_by_quorum_since(Some(t1)),
            "an older read never replaces a newer one"
        );
        h.heard(9, 1, t1); // no such node: ignored
        assert!(!Horizon::new(1, S(1), true).read_by_quorum_since(None));
    }
}
