//! Quorum and validity arithmetic of the Redlock algorithm, free of I/O.
//!
//! With `N` nodes a lock needs `N/2 + 1` of them ([`quorum`]). An attempt that started at
//! `start` and reached its quorum after `elapsed` holds the lock for
//! `ttl - elapsed - drift` ([`validity`]), where `drift = ttl * drift_factor + 2 ms`
//! ([`drift`]) allows for clock rate differences between the nodes.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use tower_redlock::quorum::{drift, quorum, validity};
//!
//! assert_eq!(quorum(5), 3);
//! let ttl = Duration::from_secs(10);
//! let d = drift(ttl, 0.01); // 100 ms + 2 ms
//! assert_eq!(d, Duration::from_millis(102));
//! assert_eq!(validity(ttl, Duration::from_millis(8), d), Some(Duration::from_millis(9_890)));
//! assert_eq!(validity(ttl, Duration::from_secs(10), d), None); // nothing left
//! ```

use std::time::{Duration, Instant};

/// The fixed part of the drift allowance, for the granularity of Redis expiries.
pub const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// How many of `nodes` nodes must agree: a strict majority, `nodes / 2 + 1`.
pub fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The drift allowance for a TTL: `ttl * drift_factor + 2 ms`.
pub fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor) + DRIFT_FLOOR
}

/// What is left of `ttl` after `elapsed` and `drift`, or `None` if nothing positive is left.
pub fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift)
        .filter(|v| !v.is_zero())
}

/// A set of node indices, one bit per node. Nodes beyond the 64th are never in it, so a
/// mask used to skip nodes only ever makes a round ask a node more, never less.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NodeMask(u64);

impl NodeMask {
    /// The nodes among the first `n` that `f` accepts.
    pub(crate) fn matching(n: usize, f: impl Fn(usize) -> bool) -> Self {
        let mut mask = Self::default();
        for i in (0..n).filter(|i| f(*i)) {
            mask.insert(i);
        }
        mask
    }

    pub(crate) fn insert(&mut self, i: usize) {
        self.0 |= u32::try_from(i)
            .ok()
            .and_then(|i| 1u64.checked_shl(i))
            .unwrap_or(0);
    }

    pub(crate) fn remove(&mut self, i: usize) {
        self.0 &= !u32::try_from(i)
            .ok()
            .and_then(|i| 1u64.checked_shl(i))
            .unwrap_or(0);
    }

    /// The nodes in both sets.
    pub(crate) fn intersection(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }

    /// How many nodes are in the set.
    pub(crate) fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub(crate) fn contains(self, i: usize) -> bool {
        u32::try_from(i)
            .ok()
            .and_then(|i| self.0.checked_shr(i))
            .is_some_and(|m| m & 1 == 1)
    }
}

/// `t + d`, or the latest representable instant near it when that overflows.
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).unwrap_or_else(|| {
        // About 30 years ahead: later than any lock or deadline this crate deals in.
        t.checked_add(Duration::from_secs(1 << 30)).unwrap_or(t)
    })
}

/// What a [`Tally`] knows so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// More answers are needed.
    Pending,
    /// The quorum is reached: no need to wait for the other nodes.
    Reached,
    /// So many nodes failed that the quorum can no longer be reached.
    Impossible,
}

/// One node's answer within an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The node granted (or extended) the lock.
    Granted,
    /// The node answered that another client holds the lock.
    HeldElsewhere,
    /// The node failed (timeout, connection, error) or refused for another reason.
    Failed,
}

/// Counts per-node outcomes of one operation and decides as early as the outcome is
/// certain: with 5 nodes, 3 grants decide at once, without waiting for the other two.
#[derive(Debug, Clone)]
pub(crate) struct Tally {
    nodes: usize,
    quorum: usize,
    ok: usize,
    held: usize,
    failed: usize,
}

impl Tally {
    /// A tally for `nodes` nodes.
    pub(crate) fn new(nodes: usize) -> Self {
        Self {
            nodes,
            quorum: quorum(nodes),
            ok: 0,
            held: 0,
            failed: 0,
        }
    }

    /// Records one node's success or failure and says whether the result is now certain.
    #[cfg(test)]
    fn record(&mut self, success: bool) -> Decision {
        self.record_outcome(if success {
            Outcome::Granted
        } else {
            Outcome::Failed
        })
    }

    /// Records one node's outcome and says whether the result is now certain.
    pub(crate) fn record_outcome(&mut self, outcome: Outcome) -> Decision {
        match outcome {
            Outcome::Granted => self.ok += 1,
            Outcome::HeldElsewhere => self.held += 1,
            Outcome::Failed => self.failed += 1,
        }
        self.decision()
    }

    /// The decision given what has been recorded so far.
    pub(crate) fn decision(&self) -> Decision {
        if self.ok >= self.quorum {
            Decision::Reached
        } else if self.held + self.failed > self.nodes - self.quorum {
            Decision::Impossible
        } else {
            Decision::Pending
        }
    }

    /// The fewest further outcomes that could change a pending decision (with 5 nodes and
    /// none in yet: 3, for 3 grants or 3 refusals); 1 once the decision is made. A round
    /// need not look at its calls again before that many have answered.
    pub(crate) fn outcomes_to_decide(&self) -> usize {
        if self.decision() != Decision::Pending {
            return 1;
        }
        let to_reach = self.quorum.saturating_sub(self.ok);
        let to_fail = (self.nodes + 1)
            .saturating_sub(self.quorum)
            .saturating_sub(self.held + self.failed);
        to_reach.min(to_fail).max(1)
    }

    /// Whether a failed operation is known to be busy (a quorum of nodes answered and
    /// some said another client holds the lock) rather than short of nodes.
    pub(crate) fn is_busy(&self) -> bool {
        self.held > 0 && self.answered() >= self.quorum
    }

    /// Whether the answers still pending could change a failure from "no quorum" into
    /// "busy": some node said the lock is held elsewhere, but too few nodes answered yet.
    pub(crate) fn busy_undecided(&self) -> bool {
        let pending = self.nodes - self.ok - self.held - self.failed;
        self.held > 0 && self.answered() < self.quorum && self.answered() + pending >= self.quorum
    }

    /// Nodes that answered (granted or held elsewhere).
    pub(crate) fn answered(&self) -> usize {
        self.ok + self.held
    }

    /// Successes recorded so far.
    pub(crate) fn successes(&self) -> usize {
        self.ok
    }

    /// Nodes that said another client holds the lock.
    pub(crate) fn held_elsewhere(&self) -> usize {
        self.held
    }

    /// How many nodes this tally counts.
    pub(crate) fn nodes(&self) -> usize {
        self.nodes
    }

    /// The quorum this tally needs.
    pub(crate) fn quorum(&self) -> usize {
        self.quorum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_looks_again_only_when_the_decision_can_change() {
        let fresh = |n| Tally::new(n).outcomes_to_decide();
        assert_eq!([1, 2, 3, 4, 5, 7].map(fresh), [1, 1, 2, 2, 3, 4]);
        let mut t = Tally::new(5);
        t.record_outcome(Outcome::Granted);
        t.record_outcome(Outcome::Granted);
        assert_eq!(
            t.outcomes_to_decide(),
            1,
            "one more grant reaches the quorum"
        );
        let mut t = Tally::new(5);
        t.record_outcome(Outcome::Granted);
        t.record_outcome(Outcome::HeldElsewhere);
        assert_eq!(t.outcomes_to_decide(), 2, "two grants or two refusals");
        t.record_outcome(Outcome::Failed);
        t.record_outcome(Outcome::Failed);
        assert_eq!(t.decision(), Decision::Impossible);
        assert_eq!(t.outcomes_to_decide(), 1, "decided: every answer counts");
    }

    #[test]
    fn the_mask_holds_the_first_64_nodes() {
        let mut m = NodeMask::default();
        m.insert(0);
        m.insert(63);
        m.insert(64);
        assert!(m.contains(0) && m.contains(63));
        assert!(!m.contains(1) && !m.contains(64) && !m.contains(usize::MAX));
        assert_eq!(m.len(), 2);
        let both = m.intersection(NodeMask::matching(64, |i| i >= 1));
        assert!(both.contains(63) && !both.contains(0));
        assert_eq!(both.len(), 1);
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        for n in 1..=9usize {
            let q = quorum(n);
            assert!(2 * q > n, "n={n}");
            assert!(2 * (q - 1) <= n, "n={n}");
        }
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(5), 3);
    }

    /// Every order of outcomes on simulated nodes: the tally decides exactly when the
    /// outcome is certain, never earlier and never later.
    #[test]
    fn tally_decides_exactly_when_certain() {
        for n in [1usize, 3, 5, 7] {
            for mask in 0u32..(1 << n) {
                let outcomes: Vec<bool> = (0..n).map(|i| mask & (1 << i) != 0).collect();
                let total_ok = outcomes.iter().filter(|o| **o).count();
                let mut t = Tally::new(n);
                let mut decided_at = None;
                for (i, o) in outcomes.iter().enumerate() {
                    let d = t.record(*o);
                    if d != Decision::Pending {
                        decided_at = Some((i, d));
                        break;
                    }
                }
                let (at, d) = decided_at.expect("all answers in: a decision is due");
                let expected = if total_ok >= quorum(n) {
                    Decision::Reached
                } else {
                    Decision::Impossible
                };
                assert_eq!(d, expected, "n={n} mask={mask:b}");
                // Not decidable one answer earlier: some completion of the rest flips it.
                let seen = &outcomes[..at];
                let ok = seen.iter().filter(|o| **o).count();
                let rest = n - seen.len();
                let could_reach = ok + rest >= quorum(n);
                let could_fail = ok < quorum(n);
                assert!(
                    could_reach && could_fail,
                    "decided late: n={n} mask={mask:b}"
                );
            }
        }
    }

    #[test]
    fn busy_needs_a_quorum_of_answers() {
        // 5 nodes, 2 down, 3 say "held elsewhere": busy, not short of nodes.
        let mut t = Tally::new(5);
        t.record_outcome(Outcome::Failed);
        t.record_outcome(Outcome::Failed);
        assert_eq!(
            t.record_outcome(Outcome::HeldElsewhere),
            Decision::Impossible
        );
        assert!(t.busy_undecided(), "two more answers could make it busy");
        t.record_outcome(Outcome::HeldElsewhere);
        assert!(t.busy_undecided());
        t.record_outcome(Outcome::HeldElsewhere);
        assert!(!t.busy_undecided());
        assert!(t.is_busy());
        // 3 nodes, 2 down, 1 says "held elsewhere": short of nodes.
        let mut t = Tally::new(3);
        t.record_outcome(Outcome::HeldElsewhere);
        t.record_outcome(Outcome::Failed);
        t.record_outcome(Outcome::Failed);
        assert!(!t.busy_undecided());
        assert!(!t.is_busy());
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        let ttl = Duration::from_millis(1000);
        let d = drift(ttl, 0.01);
        assert_eq!(d, Duration::from_millis(12));
        assert_eq!(
            validity(ttl, Duration::from_millis(100), d),
            Some(Duration::from_millis(888))
        );
        assert_eq!(validity(ttl, Duration::from_millis(988), d), None);
        assert_eq!(validity(ttl, Duration::from_millis(2000), d), None);
        assert_eq!(drift(ttl, 0.0), DRIFT_FLOOR);
    }
}
