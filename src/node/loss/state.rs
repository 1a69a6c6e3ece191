//! What this client knows of one node's losses: the node's ledger as last read, turned
//! into this client's clock, and the quarantine that follows from it and the horizon.
//!
//! The moment comes from the node (its ledger's `since`, on its own clock, measured
//! against the node's clock in the same reply), and the length from the horizon, so
//! every client ends a quarantine at the same moment, within a round trip.
//!
//! ```text
//! ledger since = node now - 4 s, horizon 10 s   ->  quarantined for 6 s more
//! ledger since = node now - 1 h, horizon 10 s   ->  in service (once the horizon was read
//!                                                   from a quorum after this client met it)
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::NodeStatus;
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! if let NodeStatus::Quarantined { remaining, reason } = redlock.health().await.nodes()[0].status() {
//!     println!("back in {remaining:?}: {reason}");
//! }
//! # Ok(()) }
//! ```

use std::time::{Duration, Instant};

use super::horizon::Horizon;
use super::ledger::{Ledger, Why};
use crate::defaults::MAX_TTL;
use crate::error::QuarantineReason;

/// How long a node whose loss is over by the horizon this client knows waits for that
/// horizon to be read from a quorum (reported as its remaining quarantine).
const CONFIRMING: Duration = Duration::from_millis(100);

/// A node's ledger as this client last read it.
#[derive(Debug, Clone)]
struct Judged {
    epoch: String,
    since_ms: u64,
    why: Why,
    /// How long before `read_at` the node may last have lost keys (on its clock).
    age: Duration,
    read_at: Instant,
}

/// What this client knows of one node's losses (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct NodeLoss {
    judged: Option<Judged>,
}

/// News from a ledger read: what changed for this client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum News {
    /// Nothing this client did not know.
    None,
    /// A loss this client did not know of (a new `since`, or a new dataset): why.
    Loss(Why),
}

impl NodeLoss {
    /// Takes `ledger`, read at `read_at` when the node's clock said `now_ms`.
    pub(crate) fn read(&mut self, ledger: &Ledger, now_ms: u64, read_at: Instant) -> News {
        let age = Duration::from_millis(now_ms.saturating_sub(ledger.since_ms));
        // A `since` ahead of the node's clock (its clock stepped back): the loss is as new
        // as can be, and lasts a whole horizon from now.
        let same = self
            .judged
            .as_ref()
            .is_some_and(|j| j.epoch == ledger.epoch && j.since_ms == ledger.since_ms);
        self.judged = Some(Judged {
            epoch: ledger.epoch.clone(),
            since_ms: ledger.since_ms,
            why: ledger.why,
            age,
            read_at,
        });
        if same {
            News::None
        } else {
            News::Loss(ledger.why)
        }
    }

    /// How much longer the node stays out of acquisitions from `now`, and why, given the
    /// `horizon`: until the horizon has passed since its last loss, and, for a loss less
    /// than the longest TTL allowed ago, until the horizon was read from a quorum after
    /// the loss (so that it counts every TTL announced before).
    pub(crate) fn quarantine(
        &self,
        now: Instant,
        horizon: &Horizon,
    ) -> Option<(Duration, QuarantineReason)> {
        let j = self.judged.as_ref()?;
        let elapsed = j
            .age
            .saturating_add(now.saturating_duration_since(j.read_at));
        let left = horizon.length().saturating_sub(elapsed);
        if !left.is_zero() {
            return Some((left, j.why.reason()));
        }
        let since = j.read_at.checked_sub(j.age);
        let settled = elapsed >= MAX_TTL || horizon.read_by_quorum_since(since);
        (!settled).then_some((CONFIRMING, j.why.reason()))
    }

    /// Since when the node's data is whole, as a replay acquisition sees it.
    pub(crate) fn whole(&self) -> super::Whole {
        match self.since() {
            None => super::Whole::Unknown,
            Some(None) => super::Whole::Always,
            Some(Some(at)) => super::Whole::Since(at),
        }
    }

    /// Since when the node's data is whole, on this client's clock: `None` if not judged
    /// yet, `Some(None)` if before this client's clock can say.
    pub(crate) fn since(&self) -> Option<Option<Instant>> {
        self.judged.as_ref().map(|j| j.read_at.checked_sub(j.age))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;
    const NOW: u64 = 1_800_000_000_000;

    fn ledger(epoch: &str, since_ms: u64, why: Why) -> Ledger {
        Ledger {
            epoch: epoch.into(),
            since_ms,
            why,
            run_id: "a".into(),
            replid: "r".into(),
        }
    }

    /// A horizon of `ttl` over one node, read at `at`.
    fn horizon(ttl: Duration, at: Instant) -> Horizon {
        let h = Horizon::new(1, ttl, true);
        h.heard(0, 0, at);
        h
    }

    #[test]
    fn a_loss_lasts_the_horizon_from_the_nodes_moment() {
        let t0 = Instant::now();
        let mut loss = NodeLoss::default();
        assert_eq!(loss.quarantine(t0, &horizon(S(10), t0)), None, "never read");
        let news = loss.read(&ledger("e", NOW - 4_000, Why::Empty), NOW, t0);
        assert_eq!(news, News::Loss(Why::Empty));
        let h = horizon(S(10), t0);
        assert_eq!(
            loss.quarantine(t0, &h),
            Some((S(6), QuarantineReason::Empty))
        );
        assert_eq!(
            loss.quarantine(t0 + S(5), &h),
            Some((S(1), QuarantineReason::Empty))
        );
        assert_eq!(loss.quarantine(t0 + S(6), &h), None);
        // Another client's TTL, read from another node: longer.
        h.heard(0, 60_000, t0);
        assert_eq!(
            loss.quarantine(t0 + S(6), &h),
            Some((S(50), QuarantineReason::Empty))
        );
        assert_eq!(loss.since(), Some(t0.checked_sub(S(4))));
    }

    #[test]
    fn the_same_ledger_again_is_no_news() {
        let t0 = Instant::now();
        let mut loss = NodeLoss::default();
        let l = ledger("e", NOW, Why::Restarted);
        assert_eq!(loss.read(&l, NOW, t0), News::Loss(Why::Restarted));
        assert_eq!(loss.read(&l, NOW + 1_000, t0 + S(1)), News::None);
        let later = ledger("e", NOW + 5_000, Why::Promoted);
        assert_eq!(
            loss.read(&later, NOW + 5_000, t0 + S(5)),
            News::Loss(Why::Promoted)
        );
        let replaced = ledger("f", NOW + 5_000, Why::Empty);
        assert_eq!(
            loss.read(&replaced, NOW + 6_000, t0 + S(6)),
            News::Loss(Why::Empty),
            "a new dataset, even at the same moment"
        );
    }

    #[test]
    fn a_loss_is_over_once_a_quorum_of_horizons_was_read_after_it() {
        let t0 = Instant::now() + S(7_200);
        let h = Horizon::new(3, S(10), true);
        let mut loss = NodeLoss::default();
        loss.read(&ledger("e", NOW - 3_600_000, Why::Empty), NOW, t0);
        assert_eq!(
            loss.quarantine(t0, &h),
            Some((CONFIRMING, QuarantineReason::Empty)),
            "an hour ago, but a longer horizon may be unread yet"
        );
        h.heard(0, 10_000, t0 - S(3_601));
        h.heard(1, 10_000, t0);
        assert_eq!(
            loss.quarantine(t0, &h),
            Some((CONFIRMING, QuarantineReason::Empty)),
            "one read before the loss does not count"
        );
        h.heard(2, 10_000, t0 - S(3_599));
        assert_eq!(loss.quarantine(t0, &h), None, "two reads after it do");
        // A loss older than the longest TTL allowed needs no horizon at all.
        let mut ancient = NodeLoss::default();
        let day = u64::try_from(MAX_TTL.as_millis()).expect("fits");
        ancient.read(&ledger("e", NOW - day, Why::Empty), NOW, t0);
        assert_eq!(ancient.quarantine(t0, &Horizon::new(3, S(10), true)), None);
    }

    #[test]
    fn a_since_ahead_of_the_nodes_clock_counts_from_now() {
        let t0 = Instant::now();
        let mut loss = NodeLoss::default();
        loss.read(&ledger("e", NOW + 60_000, Why::Restarted), NOW, t0);
        assert_eq!(
            loss.quarantine(t0, &horizon(S(10), t0)),
            Some((S(10), QuarantineReason::Restarted))
        );
    }
}
