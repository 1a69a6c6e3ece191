//! When a client keeps its slots' counter sets in shape: renews a set's expiry, and trims
//! the counters in it that were not raised within the retention. Both are extra commands
//! of a fenced acquisition in the slot, sent by each client at most once per period and
//! slot rather than with every acquisition (each command costs the node about as much as
//! the `SET` itself).
//!
//! ```text
//! first acquisition in a slot       -> PEXPIRE counters 1.5 x retention
//! again within a quarter retention  -> nothing more than the ZADD
//! once per half retention and slot  -> PEXPIRE, and ZREMRANGEBYSCORE counters -inf (p - retention
//! after a node (re)joined           -> every slot renews at its next acquisition
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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::name::SLOTS;
use crate::scripts::Renewal;

/// A client's schedule of renewals and trims, per slot.
///
/// A set's expiry is a retention and a half ([`expiry_ms`]), renewed by each client at most
/// once per quarter retention per slot: so the set outlives every counter written in it
/// by a retention, even when one renewal did not reach a node (the one before it still
/// covers a quarter retention more). A client renews each slot on its first acquisition
/// there, and again after any of its nodes (re)connected or came out of quarantine (the
/// renewals it missed meanwhile never reached it): a node that restarted may have lost
/// the set, which the next `ZADD` creates without an expiry. Trims come once per half
/// retention per slot, the first at a random moment (so that clients that live shorter
/// than that trim their share), and always together with a renewal.
#[derive(Debug)]
pub(crate) struct Upkeep {
    /// When the schedules' seconds count from.
    started: Instant,
    renewals: Schedule,
    trims: Schedule,
    /// The sets' expiry, in ms.
    expiry_ms: u64,
    /// The retention in microseconds, the unit of the numbers.
    retention_us: u64,
    /// How many times one of the client's nodes joined acquisitions again (shared with
    /// them): connected, or came out of quarantine.
    rejoins: Arc<AtomicU64>,
    /// The rejoins that the renewals last started over for.
    renewed_for: AtomicU64,
}

impl Upkeep {
    /// The schedule of a client whose counters are kept `retention`, whose nodes count
    /// their rejoins in `rejoins`.
    pub(crate) fn new(retention: Duration, rejoins: Arc<AtomicU64>) -> Self {
        Self {
            started: Instant::now(),
            renewals: Schedule::new(retention / 4, First::Now),
            trims: Schedule::new(retention / 2, First::Random),
            expiry_ms: expiry_ms(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX)),
            retention_us: u64::try_from(retention.as_micros()).unwrap_or(u64::MAX),
            renewed_for: AtomicU64::new(rejoins.load(Ordering::Relaxed)),
            rejoins,
        }
    }

    /// The upkeep an acquisition in `slot` proposing `proposal` does now besides its
    /// `ZADD`: `None` when this client renewed the set recently enough; otherwise the
    /// set's expiry, and, when a trim is due, the counters to remove: those below the
    /// proposal minus the retention (numbers are microseconds of some client's clock).
    pub(crate) fn renewal(&self, slot: u16, proposal: u64) -> Option<Renewal> {
        let rejoins = self.rejoins.load(Ordering::Relaxed);
        if self.renewed_for.load(Ordering::Relaxed) != rejoins {
            // Every slot again, then these rejoins are taken care of.
            self.renewals.start_over();
            self.renewed_for.fetch_max(rejoins, Ordering::Relaxed);
        }
        // One clock read for both schedules.
        let now = u32::try_from(self.started.elapsed().as_secs()).unwrap_or(u32::MAX);
        let trim = self.trims.due(slot, now);
        let renew = self.renewals.due(slot, now);
        (renew || trim).then(|| Renewal {
            expire_ms: self.expiry_ms,
            trim_below: trim.then(|| proposal.saturating_sub(self.retention_us)),
        })
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

/// When the first time of a slot is due.
#[derive(Debug, Clone, Copy)]
enum First {
    /// At the first acquisition in the slot.
    Now,
    /// At a random second within the first period.
    Random,
}

/// When this client does one chore next in each slot.
#[derive(Debug)]
struct Schedule {
    /// Whole seconds between two of the chore in a slot; 0: at every acquisition.
    every: u32,
    /// Per slot: the second since [`Upkeep::started`] from which the chore is due again.
    next: Box<[AtomicU32]>,
}

impl Schedule {
    fn new(every: Duration, first: First) -> Self {
        let every = u32::try_from(every.as_secs()).unwrap_or(u32::MAX);
        let mut random = Random::seeded();
        let next = (0..SLOTS)
            .map(|_| match first {
                First::Now => AtomicU32::new(0),
                First::Random => AtomicU32::new(random.below(every)),
            })
            .collect();
        Self { every, next }
    }

    /// Whether the chore is due in `slot` at second `now`; when so, the next one is a
    /// period later.
    fn due(&self, slot: u16, now: u32) -> bool {
        let Some(cell) = self.next.get(usize::from(slot)) else {
            return false;
        };
        if self.every == 0 {
            return true;
        }
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

    /// Makes the chore due at once in every slot.
    fn start_over(&self) {
        for cell in &self.next {
            cell.store(0, Ordering::Relaxed);
        }
    }
}

/// xorshift64: uniform enough to spread first trims over time.
struct Random(u64);

impl Random {
    fn seeded() -> Self {
        let mut seed = [0u8; 8];
        if getrandom::fill(&mut seed).is_err() {
            // Spread over time all the same (the OS has no entropy to give).
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            seed = u64::try_from(now.as_nanos() % u128::from(u64::MAX))
                .unwrap_or(1)
                .to_le_bytes();
        }
        Self(u64::from_le_bytes(seed) | 1)
    }

    /// A number below `n` (0 when `n` is 0).
    fn below(&mut self, n: u32) -> u32 {
        if n == 0 {
            return 0;
        }
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        u32::try_from(self.0 % u64::from(n)).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn slots() -> impl Iterator<Item = u16> {
        (0..SLOTS).filter_map(|s| u16::try_from(s).ok())
    }

    /// A proposal one day and one microsecond into the clock.
    const P: u64 = 86_400_000_001;

    fn due(upkeep: &Upkeep, slot: u16) -> Option<Renewal> {
        upkeep.renewal(slot, P)
    }

    fn trims(renewal: &Option<Renewal>) -> bool {
        renewal.is_some_and(|r| r.trim_below.is_some())
    }

    #[test]
    fn each_slot_is_renewed_at_its_first_acquisition_then_once_per_quarter_retention() {
        let upkeep = Upkeep::new(DAY, Arc::default());
        // Every slot renews at once; about one in 43,200 also trims in its first second.
        let first: Vec<_> = slots().map(|s| due(&upkeep, s)).collect();
        assert!(
            first
                .iter()
                .all(|r| r.is_some_and(|r| r.expire_ms == 129_600_000))
        );
        let trimmed = first.iter().filter(|r| trims(r)).count();
        assert!(trimmed < 20, "{trimmed} slots trimmed at once");
        // A trim removes the counters below the proposal minus the retention.
        assert!(
            first
                .iter()
                .flatten()
                .all(|r| r.trim_below.is_none_or(|b| b == 1))
        );
        // Then not again within the quarter retention (a trim may still come).
        let again = slots().filter_map(|s| due(&upkeep, s)).count();
        assert!(again < 20, "{again} slots renewed twice");
        assert!(due(&upkeep, u16::MAX).is_none(), "no such slot");
    }

    #[test]
    fn a_node_that_rejoins_makes_every_slot_renew_again() {
        let rejoins = Arc::new(AtomicU64::new(3));
        let upkeep = Upkeep::new(DAY, Arc::clone(&rejoins));
        assert!(slots().all(|s| due(&upkeep, s).is_some()));
        let again = due(&upkeep, 7);
        assert!(again.is_none() || trims(&again));
        rejoins.fetch_add(1, Ordering::Relaxed);
        assert!(slots().all(|s| due(&upkeep, s).is_some()));
        let again = due(&upkeep, 7);
        assert!(again.is_none() || trims(&again));
    }

    #[test]
    fn a_retention_under_four_seconds_renews_at_every_acquisition() {
        let upkeep = Upkeep::new(Duration::from_millis(3_999), Arc::default());
        for _ in 0..3 {
            assert!(slots().all(|s| due(&upkeep, s).is_some()));
        }
        // Under two seconds, every acquisition trims too.
        let short = Upkeep::new(Duration::from_millis(1_999), Arc::default());
        assert!(slots().all(|s| trims(&due(&short, s))));
    }

    #[test]
    fn the_expiry_is_a_retention_and_a_half() {
        assert_eq!(expiry_ms(86_400_000), 129_600_000);
        assert_eq!(expiry_ms(u64::MAX), u64::MAX);
    }
}
