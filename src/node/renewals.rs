//! When a fenced acquisition renews the expiry of its set of fencing counters on a node:
//! decided for each node as the request goes onto that node's connection, so that a
//! counter written there always finds its set's expiry at least a retention away
//! (`docs/fencing.md`, "Where the counters live").
//!
//! A renewal (`PEXPIRE counters 1.5 × retention`) rides on a fenced request when the
//! connection it goes on has not carried one for that set yet (a new connection may reach
//! a server that restarted, failed over, or lost what the last connection carried), or
//! when the last one it carried is a quarter retention old. Commands on one connection run
//! in the order they were sent, so a `ZADD` that goes without a renewal runs after one
//! that went on the same connection at most a quarter retention earlier: the set's expiry
//! is then at least a retention and a quarter away, whatever happened to other
//! connections.
//!
//! ```text
//! connection 7, set 0:  renewal at 0 s  -> ZADD, ZADD ... (until 0.25 x retention) -> renewal ...
//! connection 8 (a reconnect): its first fenced request renews, whatever the time
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! // The schedule is internal; the retention sets its pace (a quarter of it between renewals).
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"])
//!     .fencing_retention(Duration::from_secs(3600))
//!     .build()?;
//! let lock = redlock.lock("order:42").await?; // its node's first fenced request: renews
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The expiry a renewal gives a set of counters, in ms: a retention and a half, so that a
/// counter written up to a quarter retention after a renewal on the same connection still
/// has more than a retention to live.
pub(crate) fn set_expiry_ms(retention: Duration) -> u64 {
    let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
    retention_ms.saturating_add(retention_ms / 2)
}

/// The longest a connection goes between two renewals of a set: a quarter retention.
pub(crate) fn renewal_interval(retention: Duration) -> Duration {
    retention / 4
}

/// One node's renewals of its sets of counters: per set, the connection that carried the
/// last one and when.
#[derive(Debug)]
pub(crate) struct Renewals {
    /// When the marks' seconds count from.
    started: Instant,
    /// Whole seconds between two renewals on one connection; 0: with every request.
    every: u32,
    /// Per set: the connection's generation (high 32 bits, plus one: 0 is "never") and
    /// the second since `started` (low 32 bits) of the last renewal put on it.
    marks: Box<[AtomicU64]>,
}

impl Renewals {
    /// The renewals of a node with `sets` sets of counters, each renewed at least every
    /// `every` on a connection.
    pub(crate) fn new(sets: usize, every: Duration) -> Self {
        Self {
            started: crate::clock::now(),
            every: u32::try_from(every.as_secs()).unwrap_or(u32::MAX),
            marks: (0..sets).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The whole seconds from `started` to `now`.
    fn second(&self, now: Instant) -> u32 {
        u32::try_from(now.saturating_duration_since(self.started).as_secs()).unwrap_or(u32::MAX)
    }

    /// Whether a fenced request in set `set` that goes on the connection of `generation`
    /// now must renew the set. A set the node does not have renews (it cannot hurt).
    pub(crate) fn due(&self, set: u16, generation: u64) -> bool {
        self.due_at(set, generation, crate::clock::now())
    }

    /// [`due`](Self::due) as of `now` (a round's one clock read for all its calls: a
    /// moment early, which can only put a renewal off by that moment).
    pub(crate) fn due_at(&self, set: u16, generation: u64, now: Instant) -> bool {
        self.marks.get(usize::from(set)).is_none_or(|mark| {
            due_after(
                mark.load(Ordering::Acquire),
                generation,
                self.second(now),
                self.every,
            )
        })
    }

    /// A renewal of set `set` was put on the connection of `generation` (it runs before
    /// any later command on that connection).
    pub(crate) fn renewed(&self, set: u16, generation: u64) {
        self.renewed_at(set, generation, crate::clock::now());
    }

    /// [`renewed`](Self::renewed) as of `now` (marked a moment early: the next renewal
    /// comes that much sooner).
    pub(crate) fn renewed_at(&self, set: u16, generation: u64, now: Instant) {
        if let Some(mark) = self.marks.get(usize::from(set)) {
            mark.store(mark_of(generation, self.second(now)), Ordering::Release);
        }
    }
}

/// Whether a fenced request on the connection of `generation`, at second `now`, must renew
/// a set whose last renewal left `mark` (0: never), with `every` seconds at most between
/// two renewals on one connection (0: with every request): when the set was never
/// renewed, last renewed on another connection, or `every` ago. (The fencing model runs
/// this same rule.)
pub(crate) fn due_after(mark: u64, generation: u64, now: u32, every: u32) -> bool {
    let (on, at) = (mark >> 32, mark & u64::from(u32::MAX));
    every == 0
        || on != connection(generation)
        || u64::from(now) >= at.saturating_add(u64::from(every))
}

/// The mark a renewal put on the connection of `generation` at second `now` leaves.
pub(crate) fn mark_of(generation: u64, now: u32) -> u64 {
    (connection(generation) << 32) | u64::from(now)
}

/// A connection's generation as kept in a mark: in `1..=2^32 - 1` (0 is "never";
/// generations wrap there, which only makes a renewal come early).
fn connection(generation: u64) -> u64 {
    generation % u64::from(u32::MAX) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUARTER_DAY: Duration = Duration::from_secs(21_600);

    #[test]
    fn the_first_fenced_request_of_each_connection_renews() {
        let r = Renewals::new(3, QUARTER_DAY);
        assert!(r.due(0, 1), "never renewed");
        r.renewed(0, 1);
        assert!(!r.due(0, 1), "renewed on this connection a moment ago");
        assert!(
            r.due(0, 2),
            "a new connection: the server may have lost the set"
        );
        assert!(r.due(1, 1), "another set");
        r.renewed(0, 2);
        assert!(
            r.due(0, 1) && !r.due(0, 2),
            "the mark follows the latest connection"
        );
        assert!(r.due(3, 2), "no such set: renew anyway");
        r.renewed(3, 2); // ignored
    }

    #[test]
    fn a_connection_renews_again_after_its_interval() {
        let mut r = Renewals::new(1, Duration::from_secs(5));
        r.renewed(0, 7);
        assert!(!r.due(0, 7));
        // As if 5 s had passed since the renewal.
        r.started -= Duration::from_secs(5);
        assert!(r.due(0, 7));
        let every = Renewals::new(1, Duration::from_millis(999));
        every.renewed(0, 7);
        assert!(
            every.due(0, 7),
            "under a second between renewals: with every request"
        );
    }

    #[test]
    fn a_renewal_outlives_its_interval_by_more_than_a_retention() {
        let day = Duration::from_secs(86_400);
        assert_eq!(set_expiry_ms(day), 129_600_000);
        assert_eq!(renewal_interval(day), QUARTER_DAY);
        assert!(
            Duration::from_millis(set_expiry_ms(day)) - renewal_interval(day) > day,
            "a retention and a quarter"
        );
        assert_eq!(set_expiry_ms(Duration::MAX), u64::MAX);
    }

    #[test]
    fn no_generation_reads_as_never_renewed() {
        for generation in [0, 1, u64::from(u32::MAX) - 1, u64::from(u32::MAX), u64::MAX] {
            let r = Renewals::new(1, QUARTER_DAY);
            assert!(r.due(0, generation), "never renewed: {generation}");
            r.renewed(0, generation);
            assert!(!r.due(0, generation), "renewed: {generation}");
        }
    }
}
