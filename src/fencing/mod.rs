#![doc = include_str!("../../docs/fencing.md")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::node::clocks::NodeClocks;

/// A node's answer to a proposal, as phase 1's `ZADD GT CH` decides it: the proposal `p`
/// is accepted only where the name's counter (missing counts as 0) is strictly below it.
/// (The node compares scores; this is the same rule on integers, for the model check.)
#[cfg(test)]
pub(crate) fn accepts(counter: u64, proposal: u64) -> bool {
    counter < proposal
}

/// A client's fencing: where its proposals come from ([`Clock`]), and the expiry, in ms,
/// that a renewal gives a set of counters (a retention and a half; the nodes decide when
/// to send one: see `node::renewals`).
#[derive(Debug)]
pub(crate) struct Fencing {
    clock: Clock,
    counters_expiry_ms: u64,
}

impl Fencing {
    /// The fencing of a client with `clock`, whose counter sets get `counters_expiry_ms`.
    pub(crate) fn new(clock: Clock, counters_expiry_ms: u64) -> Self {
        Self {
            clock,
            counters_expiry_ms,
        }
    }

    /// Where proposals come from.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The expiry a renewal gives a set of counters, in ms.
    pub(crate) fn counters_expiry_ms(&self) -> u64 {
        self.counters_expiry_ms
    }
}

/// The proposals of one client: a hybrid logical clock. A proposal is the wall clock in
/// microseconds, but never below one above the highest number this client has seen (its
/// own numbers and proposals, and the counters it read): a client whose clock is behind
/// the others' numbers catches up after one acquisition that needed phase 2, and two
/// acquisitions of one client never propose the same number (not even within one
/// microsecond, which would cost the second phase 2 where the first raised a counter).
/// Nor above the nodes' clocks plus a bound ([`NodeClocks`]): a client whose clock is
/// far ahead proposes the cap instead, and says so once.
#[derive(Debug)]
pub(crate) struct Clock {
    highest: AtomicU64,
    /// What this client knows of the nodes' clocks: the cap on proposals.
    nodes: Arc<NodeClocks>,
    /// The wall clock was found beyond the cap (warned once).
    warned: AtomicBool,
    /// An acquisition waited for the nodes' first estimates (see [`waited`](Self::waited)).
    waited: AtomicBool,
    /// In the simulation: how far this client's wall clock is from the simulation's, in µs.
    #[cfg(test)]
    skew_us: i64,
}

impl Clock {
    /// The clock of a client whose nodes' clocks are estimated in `nodes`.
    pub(crate) fn new(nodes: Arc<NodeClocks>) -> Self {
        Self {
            highest: AtomicU64::new(0),
            nodes,
            warned: AtomicBool::new(false),
            waited: AtomicBool::new(false),
            #[cfg(test)]
            skew_us: 0,
        }
    }

    /// The same clock, `skew_us` off the wall clock (a simulated client's clock).
    #[cfg(test)]
    pub(crate) fn skewed(self, skew_us: i64) -> Self {
        Self { skew_us, ..self }
    }

    /// This client's wall clock, in µs since the Unix epoch.
    fn wall_us(&self) -> u64 {
        #[cfg(test)]
        let skew = self.skew_us;
        #[cfg(not(test))]
        let skew = 0;
        crate::clock::wall_us().saturating_add_signed(skew)
    }

    /// Whether an acquisition already waited for the nodes' first clock estimates: the
    /// wait is made once per client, whatever it gave.
    pub(crate) fn waited(&self) -> bool {
        self.waited.load(Ordering::Relaxed)
    }

    /// An acquisition waited for the nodes' first clock estimates.
    pub(crate) fn waited_once(&self) {
        self.waited.store(true, Ordering::Relaxed);
    }

    /// The next proposal, from the system clock, capped by the nodes' clocks.
    pub(crate) fn propose(&self) -> u64 {
        let wall_us = self.wall_us();
        let cap = self.nodes.cap(crate::clock::now());
        if let Some(ahead) = beyond_cap(wall_us, cap) {
            self.ahead_of_nodes(ahead);
        }
        let mut seen = self.highest.load(Ordering::Relaxed);
        loop {
            let next = capped_proposal(wall_us, seen, cap);
            match self.highest.compare_exchange_weak(
                seen,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(now) => seen = now,
            }
        }
    }

    /// This client saw the number `n` (its own, or a node's counter).
    pub(crate) fn saw(&self, n: u64) {
        self.highest.fetch_max(n, Ordering::Relaxed);
    }

    /// Whether a quorum of nodes gave an estimate of their clocks (the proposals are
    /// capped).
    pub(crate) fn bounded(&self) -> bool {
        self.nodes.cap(crate::clock::now()).is_some()
    }

    /// The wall clock is `ahead_us` beyond the cap: warns, the first time.
    fn ahead_of_nodes(&self, ahead_us: u64) {
        if !first_time(&self.warned) {
            return;
        }
        let bound = Duration::from_micros(self.nodes.bound_us());
        let ahead = Duration::from_micros(ahead_us).saturating_add(bound);
        tracing::warn!(
            ahead_of_nodes = ?ahead,
            bound = ?bound,
            "redlock client's wall clock is ahead of the nodes' clocks by more than the fencing \
             clock bound: its fencing proposals are capped at the nodes' clock plus the bound \
             (so they cannot drag the counters forward); fix this host's clock (NTP)"
        );
    }
}

/// Whether this is the first time `flag` is raised (a warning said once): a load, and a
/// swap only while it is down.
pub(crate) fn first_time(flag: &AtomicBool) -> bool {
    !flag.load(Ordering::Relaxed) && !flag.swap(true, Ordering::Relaxed)
}

/// The proposal at wall-clock time `wall_us` for a client that has seen numbers up to
/// `highest`.
pub(crate) fn proposal(wall_us: u64, highest: u64) -> u64 {
    wall_us.max(highest.saturating_add(1))
}

/// The proposal at wall-clock time `wall_us` for a client that has seen numbers up to
/// `highest`, with `cap` the nodes' clock plus the bound (`None`: no estimate yet): the
/// wall clock, but never above the cap, and never below one above `highest`.
pub(crate) fn capped_proposal(wall_us: u64, highest: u64, cap: Option<u64>) -> u64 {
    proposal(cap.map_or(wall_us, |cap| wall_us.min(cap)), highest)
}

/// How far the wall clock `wall_us` is beyond `cap`, in µs, if it is.
pub(crate) fn beyond_cap(wall_us: u64, cap: Option<u64>) -> Option<u64> {
    cap.and_then(|cap| wall_us.checked_sub(cap))
        .filter(|ahead| *ahead > 0)
}

mod phase;

pub(crate) use phase::{CounterAt, Number, PhaseOne, PhaseTwo, count, phase_two, read_counters};
#[doc(hidden)]
pub use phase::{counter_of, rounds};

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests {
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::node::clocks::micros;

    #[test]
    fn proposals_never_exceed_the_cap_nor_fall_below_what_was_seen() {
        // No estimate: the wall clock, as before.
        assert_eq!(capped_proposal(1_000, 0, None), 1_000);
        assert_eq!(capped_proposal(1_000, 5_000, None), 5_001);
        // A wall clock within the cap is the proposal.
        assert_eq!(capped_proposal(1_000, 0, Some(1_000)), 1_000);
        assert_eq!(capped_proposal(999, 0, Some(1_000)), 999);
        // Beyond it, the cap is, unless the client saw higher numbers.
        assert_eq!(capped_proposal(1_001, 0, Some(1_000)), 1_000);
        assert_eq!(capped_proposal(u64::MAX, 10, Some(1_000)), 1_000);
        assert_eq!(capped_proposal(5_000, 2_000, Some(1_000)), 2_001);
        assert_eq!(capped_proposal(5_000, u64::MAX, Some(1_000)), u64::MAX);
        assert_eq!(beyond_cap(1_000, None), None);
        assert_eq!(beyond_cap(1_000, Some(1_000)), None);
        assert_eq!(beyond_cap(999, Some(1_000)), None);
        assert_eq!(beyond_cap(1_001, Some(1_000)), Some(1));
        assert_eq!(beyond_cap(u64::MAX, Some(0)), Some(u64::MAX));
    }

    #[test]
    fn a_clock_ahead_of_the_cap_proposes_the_cap_and_warns_once() {
        let nodes = Arc::new(NodeClocks::new(1, Duration::ZERO));
        // The node's clock is an hour behind this host's.
        let wall = micros(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
        );
        nodes.record(0, wall - 3_600_000_000, Instant::now());
        let clock = Clock::new(Arc::clone(&nodes));
        assert!(clock.bounded());
        let p = clock.propose();
        let cap = nodes.cap(Instant::now()).unwrap_or(0);
        assert!(p <= cap && p + 60_000_000 > cap, "{p} is the cap {cap}");
        assert!(clock.warned.load(Ordering::Relaxed));
        // The decision: once.
        let flag = AtomicBool::new(false);
        assert!(first_time(&flag));
        assert!(!first_time(&flag));
        assert!(!first_time(&flag));
    }

    #[test]
    fn proposals_follow_the_clock_and_never_fall_below_what_was_seen() {
        assert_eq!(proposal(1_000, 0), 1_000);
        assert_eq!(proposal(1_000, 5_000), 5_001);
        assert_eq!(proposal(0, u64::MAX), u64::MAX);
        let clock = Clock::new(Arc::new(NodeClocks::new(1, Duration::from_secs(1))));
        assert!(!clock.bounded());
        let first = clock.propose();
        clock.saw(first.saturating_add(1_000_000_000));
        assert!(clock.propose() > first.saturating_add(1_000_000_000));
        // Within one microsecond too, every proposal is new.
        let many: Vec<u64> = (0..1_000).map(|_| clock.propose()).collect();
        assert!(many.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_node_accepts_only_a_proposal_above_its_counter() {
        assert!(accepts(0, 1));
        assert!(accepts(99, 100));
        assert!(!accepts(100, 100));
        assert!(!accepts(101, 100));
    }
}
