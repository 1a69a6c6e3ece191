//! When a client renews the expiry of its sets of fencing counters: an extra command of a
//! fenced acquisition, sent by each client at most once per quarter retention and set
//! rather than with every acquisition (it costs the node about as much as the `SET`).
//!
//! ```text
//! first acquisition in a set        -> PEXPIRE counters 1.5 x retention
//! again within a quarter retention  -> nothing more than the ZADD
//! after a node (re)joined           -> every set renews at its next acquisition
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! // The upkeep is internal; the retention sets its pace (a quarter of it between renewals).
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"])
//!     .fencing_retention(Duration::from_secs(3600))
//!     .build()?;
//! let lock = redlock.lock("order:42").await?;
//! redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::scripts::Renewal;

/// A client's schedule of renewals, per set of counters (one, or one per slot in a
/// Redis Cluster: [`CounterSets`](crate::name::CounterSets)).
///
/// A set's expiry is a retention and a half ([`expiry_ms`]), renewed by each client at most
/// once per quarter retention per set: so the set outlives every counter written in it by
/// a retention, even when one renewal did not reach a node (the one before it still
/// covers a quarter retention more). A client renews each set on its first acquisition
/// there, and again after any of its nodes (re)connected or came out of quarantine (the
/// renewals it missed meanwhile never reached it): a node that restarted may have lost
/// the set, which the next `ZADD` creates without an expiry.
#[derive(Debug)]
pub(crate) struct Upkeep {
    /// When the schedule's seconds count from.
    started: Instant,
    /// Whole seconds between two renewals of a set; 0: at every acquisition.
    every: u32,
    /// Per set: the second since `started` from which its renewal is due again.
    next: Box<[AtomicU32]>,
    /// The sets' expiry, in ms.
    expiry_ms: u64,
    /// How many times one of the client's nodes joined acquisitions again (shared with
    /// them): connected, or came out of quarantine.
    rejoins: Arc<AtomicU64>,
    /// The rejoins that the renewals last started over for.
    renewed_for: AtomicU64,
}

impl Upkeep {
    /// The schedule of a client with `sets` sets of counters kept `retention`, whose nodes
    /// count their rejoins in `rejoins`.
    pub(crate) fn new(retention: Duration, sets: usize, rejoins: Arc<AtomicU64>) -> Self {
        Self {
            started: Instant::now(),
            every: u32::try_from((retention / 4).as_secs()).unwrap_or(u32::MAX),
            next: (0..sets).map(|_| AtomicU32::new(0)).collect(),
            expiry_ms: expiry_ms(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX)),
            renewed_for: AtomicU64::new(rejoins.load(Ordering::Relaxed)),
            rejoins,
        }
    }

    /// The renewal an acquisition with its counter in set `set` sends now besides its
    /// `ZADD`: `None` when this client renewed the set recently enough.
    pub(crate) fn renewal(&self, set: u16) -> Option<Renewal> {
        let rejoins = self.rejoins.load(Ordering::Relaxed);
        if self.renewed_for.load(Ordering::Relaxed) != rejoins {
            // Every set again, then these rejoins are taken care of.
            for cell in &self.next {
                cell.store(0, Ordering::Relaxed);
            }
            self.renewed_for.fetch_max(rejoins, Ordering::Relaxed);
        }
        self.due(set).then_some(Renewal {
            expire_ms: self.expiry_ms,
        })
    }

    /// Whether the renewal of `set` is due now; when so, the next one is a quarter
    /// retention later.
    fn due(&self, set: u16) -> bool {
        let Some(cell) = self.next.get(usize::from(set)) else {
            return false;
        };
        if self.every == 0 {
            return true;
        }
        let now = u32::try_from(self.started.elapsed().as_secs()).unwrap_or(u32::MAX);
        let next = cell.load(Ordering::Relaxed);
        now >= next
            && cell
                .compare_exchange(
                    next,
                    now.saturating_add(self.every),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// The sets' expiry in ms (a retention and a half), which phase 2 renews too.
    pub(crate) fn expiry_ms(&self) -> u64 {
        self.expiry_ms
    }
}

/// The set's expiry in ms for a retention of `retention_ms`.
fn expiry_ms(retention_ms: u64) -> u64 {
    retention_ms.saturating_add(retention_ms / 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::SLOTS;

    const DAY: Duration = Duration::from_secs(86_400);

    fn sets() -> impl Iterator<Item = u16> {
        (0..SLOTS).filter_map(|s| u16::try_from(s).ok())
    }

    #[test]
    fn each_set_is_renewed_at_its_first_acquisition_then_once_per_quarter_retention() {
        let upkeep = Upkeep::new(DAY, SLOTS, Arc::default());
        assert!(sets().all(|s| {
            upkeep
                .renewal(s)
                .is_some_and(|r| r.expire_ms == 129_600_000)
        }));
        // Then not again within the quarter retention.
        assert_eq!(sets().filter_map(|s| upkeep.renewal(s)).count(), 0);
        assert!(upkeep.renewal(u16::MAX).is_none(), "no such set");
        // One set per node: only set 0 exists.
        let one = Upkeep::new(DAY, 1, Arc::default());
        assert!(one.renewal(0).is_some());
        assert!(one.renewal(0).is_none());
        assert!(one.renewal(1).is_none(), "no such set");
    }

    #[test]
    fn a_node_that_rejoins_makes_every_set_renew_again() {
        let rejoins = Arc::new(AtomicU64::new(3));
        let upkeep = Upkeep::new(DAY, SLOTS, Arc::clone(&rejoins));
        assert!(sets().all(|s| upkeep.renewal(s).is_some()));
        assert!(upkeep.renewal(7).is_none());
        rejoins.fetch_add(1, Ordering::Relaxed);
        assert!(sets().all(|s| upkeep.renewal(s).is_some()));
        assert!(upkeep.renewal(7).is_none());
    }

    #[test]
    fn a_retention_under_four_seconds_renews_at_every_acquisition() {
        let upkeep = Upkeep::new(Duration::from_millis(3_999), 1, Arc::default());
        for _ in 0..3 {
            assert!(upkeep.renewal(0).is_some());
        }
    }

    #[test]
    fn the_expiry_is_a_retention_and_a_half() {
        assert_eq!(expiry_ms(86_400_000), 129_600_000);
        assert_eq!(expiry_ms(u64::MAX), u64::MAX);
    }
}
