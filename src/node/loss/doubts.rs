//! What a replay acquisition doubts of each node: a completion record lives for the replay
//! retention (hours, days), far longer than any lock, so a node whose data began within
//! the retention (its ledger's `since`) may have lost a record, and its "no record" then
//! vouches for nothing next to a node that answers with one.
//!
//! ```text
//! node's since later than the oldest node's by over 2 s   -> doubted
//!   (or a node not judged yet: it may be the oldest)
//!   another node answered with the name's record           -> vouches only once the retention
//!                                                             has passed since its since
//!   no node did                                            -> vouches
//! anything else (nodes of one age; itself not judged)      -> vouches
//! ```
//!
//! The rule reads only what the nodes keep (their ledgers), so every app instance gives a
//! key the same answer. A node that lost a record while every node that held it lost it
//! too cannot be told from one that never had it: a documented limit that persistence
//! closes (`docs/reliability.md`, "Replay across restarts").
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::LockError;
//!
//! // What a replay acquisition (the layer's, with `replay` on) that no quorum of nodes
//! // can vouch for advises: when enough of them will.
//! fn advice(error: &LockError) -> Option<Duration> {
//!     match error {
//!         LockError::Unverifiable { retry_after, .. } => *retry_after,
//!         _ => None,
//!     }
//! }
//! # let _ = advice;
//! ```

use std::time::{Duration, Instant};

/// How much later than the oldest node's a node's data may begin and still count as the
/// same age: ledgers of one deployment are made within moments of each other, and a
/// judgement's moment is only known to within a round trip.
pub(crate) const PEER_SLACK: Duration = Duration::from_secs(2);

/// Since when a node's data is whole, as a replay acquisition sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whole {
    /// Not judged (the quarantine off, or not connected yet).
    Unknown,
    /// Since before this client's clock can say.
    Always,
    /// Since then.
    Since(Instant),
}

/// What a replay acquisition doubts of each node of its client, judged once per attempt.
#[derive(Debug)]
pub(crate) struct Doubts {
    each: Vec<Whole>,
    /// When the oldest node's data began (`None`: before the client's clock can say).
    oldest: Option<Instant>,
}

impl Doubts {
    /// The doubts about nodes whose data is whole as `each` says. A node not judged yet
    /// (a client that just started) may be the oldest of all: until it is, every node
    /// judged is doubted, so the round hears it before it decides.
    pub(crate) fn judge(each: Vec<Whole>) -> Self {
        let oldest = if each.contains(&Whole::Always) || each.contains(&Whole::Unknown) {
            None
        } else {
            each.iter()
                .filter_map(|w| match w {
                    Whole::Since(at) => Some(*at),
                    _ => None,
                })
                .min()
        };
        Self { each, oldest }
    }

    /// Whether node `i`'s data began later than the oldest node's (by more than
    /// [`PEER_SLACK`]): its grant may hide a record it lost (a replay round hears every
    /// node, and another's record is what makes the doubt count).
    pub(crate) fn doubted(&self, i: usize) -> bool {
        let Some(Whole::Since(since)) = self.each.get(i) else {
            return false;
        };
        self.oldest
            .is_none_or(|oldest| *since > crate::quorum::later(oldest, PEER_SLACK))
    }

    /// How long until node `i` vouches that a name without a record on it has none
    /// written within `retention` (zero: it does now), given whether another node
    /// answered with the name's record (`evidence`).
    pub(crate) fn vouches_in(
        &self,
        i: usize,
        retention: Duration,
        evidence: bool,
        now: Instant,
    ) -> Duration {
        match self.each.get(i) {
            Some(Whole::Since(since)) if evidence && self.doubted(i) => {
                crate::quorum::later(*since, retention).saturating_duration_since(now)
            }
            _ => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;
    const DAY: Duration = Duration::from_secs(86_400);

    /// An instant far enough from the clock's origin that the ages below fit.
    fn now() -> Instant {
        Instant::now() + 10 * DAY
    }

    /// Two of three nodes younger than the third (restarted empty): doubted, and they
    /// vouch unless the third answers with a record.
    #[test]
    fn a_node_younger_than_its_peers_is_doubted_only_on_evidence() {
        let now = now();
        let (old, young) = (Whole::Since(now - S(3600)), Whole::Since(now - S(100)));
        let doubts = Doubts::judge(vec![old, young, young]);
        assert!(!doubts.doubted(0) && doubts.doubted(1) && doubts.doubted(2));
        assert_eq!(doubts.vouches_in(1, DAY, false, now), S(0));
        assert_eq!(doubts.vouches_in(1, DAY, true, now), DAY - S(100));
        assert_eq!(doubts.vouches_in(1, S(100), true, now), S(0));
        assert_eq!(doubts.vouches_in(0, DAY, true, now), S(0));
    }

    #[test]
    fn nodes_of_one_age_are_not_doubted() {
        let now = now();
        let peers = [now - S(3600), now - S(3598), now - S(3599)].map(Whole::Since);
        let doubts = Doubts::judge(peers.to_vec());
        assert!((0..3).all(|i| !doubts.doubted(i)));
        assert_eq!(doubts.vouches_in(1, DAY, true, now), S(0));
        // Alone, a node has no peer to be younger than.
        let alone = Doubts::judge(vec![Whole::Since(now - S(5))]);
        assert_eq!(alone.vouches_in(0, DAY, true, now), S(0));
    }

    #[test]
    fn older_than_the_clock_is_the_oldest_and_unknown_is_never_doubted() {
        let now = now();
        let doubts = Doubts::judge(vec![
            Whole::Always,
            Whole::Since(now - S(3600)),
            Whole::Unknown,
        ]);
        assert!(!doubts.doubted(0) && doubts.doubted(1) && !doubts.doubted(2));
        assert_eq!(doubts.vouches_in(2, DAY, true, now), S(0));
        assert_eq!(doubts.vouches_in(9, DAY, true, now), S(0), "no such node");
    }

    /// A client that just started has judged some nodes only: a node not judged yet may
    /// be the oldest, holding a record the younger ones lost, so they are doubted until
    /// it answers (then judged, it decides as ever). Nodes none of which is judged (the
    /// quarantine off) are doubted by no one.
    #[test]
    fn a_node_not_judged_yet_may_be_the_oldest() {
        let now = now();
        let young = Whole::Since(now - S(10));
        let doubts = Doubts::judge(vec![Whole::Unknown, young, young]);
        assert!(!doubts.doubted(0) && doubts.doubted(1) && doubts.doubted(2));
        assert_eq!(
            doubts.vouches_in(1, DAY, false, now),
            S(0),
            "no record: vouches"
        );
        assert_eq!(doubts.vouches_in(1, DAY, true, now), DAY - S(10));
        let off = Doubts::judge(vec![Whole::Unknown; 3]);
        assert!((0..3).all(|i| !off.doubted(i)));
    }
}
