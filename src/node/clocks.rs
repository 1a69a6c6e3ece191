//! What one client knows of its nodes' clocks (`INFO server`'s `server_time_usec`, read
//! at each handshake), and the cap on fencing proposals that follows: the clock a quorum
//! of the nodes is at or above, plus a bound (see `crate::fencing` and
//! `docs/fencing.md`). In the node room, since the handshake records it; the fencing
//! clock reads it.
//!
//! ```text
//! handshake of node i: INFO server -> server_time_usec at t -> estimate as of base
//! cap(now) = (quorum-th highest estimate + bound) + (now - base)
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! // A client whose proposals stay within 1 s of its nodes' clocks (the default).
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"])
//!     .fencing_clock_bound(Duration::from_secs(1))
//!     .build()?;
//! # let _ = redlock; Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What one client knows of its nodes' clocks: for each node, the node's clock (`INFO
/// server`'s `server_time_usec`) as of this client's monotonic `base`, estimated at the
/// node's last handshake (the middle of the request); and the cap on proposals that
/// follows, kept as of `base` too, so that a proposal reads it with one atomic load and
/// one monotonic clock read. Anchored on the monotonic clock, the estimates follow real
/// time whatever this host's wall clock does after the handshake (a step forward is
/// caught too).
#[derive(Debug)]
pub(crate) struct NodeClocks {
    base: Instant,
    /// Per node: its clock in µs at `base` (0: no estimate).
    at_base: Box<[AtomicU64]>,
    quorum: usize,
    bound_us: u64,
    /// The cap at `base` (0: fewer than a quorum of estimates).
    cap_at_base: AtomicU64,
    /// Serializes the recomputations of the cap (handshakes only).
    recompute: Mutex<()>,
}

impl NodeClocks {
    /// No estimate yet, for `nodes` nodes, with proposals at most `bound` above the
    /// clock a quorum of them is at or above.
    pub(crate) fn new(nodes: usize, bound: Duration) -> Self {
        Self {
            base: crate::clock::now(),
            at_base: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            quorum: crate::quorum::quorum(nodes),
            bound_us: micros(bound),
            cap_at_base: AtomicU64::new(0),
            recompute: Mutex::new(()),
        }
    }

    /// The node's clock as of `base`, for a node whose clock read `node_us` at `at`.
    pub(crate) fn estimate(&self, node_us: u64, at: Instant) -> u64 {
        node_us
            .saturating_sub(micros(at.saturating_duration_since(self.base)))
            .max(1)
    }

    /// Node `node`'s clock read `node_us` at `at` (on this client's monotonic clock).
    pub(crate) fn record(&self, node: usize, node_us: u64, at: Instant) {
        self.set(node, self.estimate(node_us, at));
    }

    /// Node `node`'s clock is `estimate` as of `base` (see [`estimate`](Self::estimate)).
    pub(crate) fn set(&self, node: usize, estimate: u64) {
        let _one = self
            .recompute
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = self.at_base.get(node) {
            slot.store(estimate, Ordering::Relaxed);
        }
        let mut known: Vec<u64> = self
            .at_base
            .iter()
            .map(|e| e.load(Ordering::Relaxed))
            .filter(|e| *e != 0)
            .collect();
        let cap = quorum_clock(&mut known, self.quorum)
            .map_or(0, |clock| clock.saturating_add(self.bound_us).max(1));
        self.cap_at_base.store(cap, Ordering::Relaxed);
    }

    /// How far above the clock a quorum of nodes is at a proposal may go, in µs.
    pub(crate) fn bound_us(&self) -> u64 {
        self.bound_us
    }

    /// The cap on proposals at `now`, once a quorum of nodes gave an estimate.
    pub(crate) fn cap(&self, now: Instant) -> Option<u64> {
        let at_base = self.cap_at_base.load(Ordering::Relaxed);
        (at_base != 0)
            .then(|| at_base.saturating_add(micros(now.saturating_duration_since(self.base))))
    }
}

/// The clock that `quorum` of the nodes' `known` clock estimates are at or above (the
/// `quorum`-th highest), if at least `quorum` are known: a minority of nodes whose clocks
/// are far ahead cannot raise it.
pub(crate) fn quorum_clock(known: &mut [u64], quorum: usize) -> Option<u64> {
    let at = known.len().checked_sub(quorum.max(1))?;
    known.sort_unstable();
    known.get(at).copied()
}

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_the_clock_a_quorum_of_nodes_is_at_or_above() {
        assert_eq!(quorum_clock(&mut [], 1), None);
        assert_eq!(quorum_clock(&mut [7], 1), Some(7));
        assert_eq!(quorum_clock(&mut [7], 2), None);
        assert_eq!(quorum_clock(&mut [30, 10, 20], 2), Some(20));
        assert_eq!(quorum_clock(&mut [30, 10], 2), Some(10));
        assert_eq!(quorum_clock(&mut [u64::MAX, 10, 20], 2), Some(20));
        assert_eq!(quorum_clock(&mut [50, 40, 10, 30, 20], 3), Some(30));
        assert_eq!(quorum_clock(&mut [50, 40, 10, 30], 3), Some(30));
        assert_eq!(quorum_clock(&mut [50, 40, 10], 3), Some(10));
        assert_eq!(quorum_clock(&mut [5, 6], 0), Some(6));
    }

    #[test]
    fn node_clocks_give_a_cap_once_a_quorum_answered() {
        let clocks = NodeClocks::new(3, Duration::from_millis(1));
        let base = clocks.base;
        assert_eq!(clocks.cap(base), None);
        // Node 0's clock read 10 s at 2 s after base: 8 s at base.
        let at = base + Duration::from_secs(2);
        clocks.record(0, 10_000_000, at);
        assert_eq!(clocks.cap(at), None, "one of three is no quorum");
        clocks.record(2, 100_000_000, at);
        // The lower of the two: 8 s at base, plus the bound, plus the time since base.
        assert_eq!(clocks.cap(base), Some(8_001_000));
        assert_eq!(clocks.cap(at), Some(10_001_000));
        clocks.record(1, 9_000_000, base);
        assert_eq!(clocks.cap(base), Some(9_001_000));
        // A node estimated again replaces its estimate.
        clocks.record(2, 1_000_000, base);
        assert_eq!(clocks.cap(base), Some(8_001_000));
        // Out of range: ignored.
        clocks.set(7, 1);
        assert_eq!(clocks.cap(base), Some(8_001_000));
        // Saturating: a clock read before base, a bound of Duration::MAX.
        assert_eq!(clocks.estimate(0, at), 1);
        let unbounded = NodeClocks::new(1, Duration::MAX);
        unbounded.record(0, 5, unbounded.base);
        assert_eq!(unbounded.cap(unbounded.base), Some(u64::MAX));
    }
}
