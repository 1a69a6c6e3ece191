//! The crate's clocks, read in one place: the monotonic clock of every deadline, validity
//! and quarantine (tokio's, so that a runtime with paused time, such as the crate's
//! simulation, moves every clock of the crate at once), and the wall clock of fencing
//! proposals and ledgers.
//!
//! ```
//! // Outside a runtime with paused time these are the system's clocks: a lock's validity
//! // is measured on the monotonic one.
//! let start = std::time::Instant::now();
//! assert!(start.elapsed() < std::time::Duration::from_secs(3600));
//! ```

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Now, on the monotonic clock (tokio's: the system's, unless the runtime paused time).
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// How long ago `earlier` was (zero if it is later than now).
pub(crate) fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}

/// Now, on the wall clock, in µs since the Unix epoch (0 before it).
pub(crate) fn wall_us() -> u64 {
    u64::try_from(wall().as_micros()).unwrap_or(u64::MAX)
}

/// Now, on the wall clock, in ms since the Unix epoch (0 before it).
pub(crate) fn wall_ms() -> u64 {
    u64::try_from(wall().as_millis()).unwrap_or(u64::MAX)
}

/// The wall clock since the Unix epoch: the system's, or in a simulation the one it set
/// on this thread ([`sim::set_wall`]).
fn wall() -> Duration {
    #[cfg(test)]
    if let Some(simulated) = sim::wall() {
        return simulated;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// A simulation's wall clock: an origin on this thread, moved by the monotonic clock.
#[cfg(test)]
pub(crate) mod sim {
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    thread_local! {
        static ORIGIN: Cell<Option<(Instant, Duration)>> = const { Cell::new(None) };
    }

    /// From now on, on this thread, the wall clock reads `since_epoch` now and moves with
    /// the monotonic clock (`None`: the system's again).
    pub(crate) fn set_wall(since_epoch: Option<Duration>) {
        ORIGIN.with(|o| o.set(since_epoch.map(|d| (super::now(), d))));
    }

    /// The simulated wall clock, when set.
    pub(super) fn wall() -> Option<Duration> {
        let (at, origin) = ORIGIN.with(Cell::get)?;
        Some(origin.saturating_add(super::since(at)))
    }
}
