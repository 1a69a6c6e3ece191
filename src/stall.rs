//! A response body's stall watch: whether the server still takes the frames of a body that
//! holds its lock. A client that stops reading mid-body fills its socket, the server stops
//! polling the body, and the lock would be extended for as long as the kernel keeps the
//! connection. The body says when it handed out a frame and when it waits for its own
//! source; the keep-alive driver, at each extension due, releases a lock whose body was
//! not polled for its stall timeout ([`LostReason::BodyStalled`](crate::LostReason::BodyStalled)),
//! and the body fails when it is polled again.
//!
//! ```text
//! handler runs            unarmed          (never a stall: the handler has the lock)
//! body handed to server   idle since now
//! frame handed out        idle since now   (the server comes back for the next)
//! body waits on its source  waiting        (never a stall: the server waits for us)
//! idle > timeout at an extension due  ->  stalled: released, the body fails
//! ```
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::layer::Header;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! // A client that stops reading holds a key for 10 s at most, then its lock is released.
//! let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
//!     .release_on_body_end()
//!     .stall_timeout(Some(Duration::from_secs(10)));
//! # let _ = layer; Ok(()) }
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Not watched (the handler still runs), or the body waits on its own source.
const NOT_IDLE: u64 = u64::MAX;

/// When the server last took a frame of a lock-holding body, for its stall timeout.
#[derive(Debug)]
pub(crate) struct StallWatch {
    /// The stall timeout (`None`: never stalls).
    after: Option<Duration>,
    /// What `idle_since` counts from.
    origin: Instant,
    /// Since when (ms after `origin`) the body waits for the server to poll it, or
    /// [`NOT_IDLE`].
    idle_since: AtomicU64,
    /// The driver found the body stalled and released its lock.
    fired: AtomicBool,
}

impl StallWatch {
    /// A watch with stall timeout `after`, not armed.
    pub(crate) fn new(after: Option<Duration>) -> Self {
        Self {
            after,
            origin: crate::clock::now(),
            idle_since: AtomicU64::new(NOT_IDLE),
            fired: AtomicBool::new(false),
        }
    }

    /// The body was handed a frame's worth of attention: it gave the server a frame (or
    /// was handed to the server), and waits for the next poll from `now`.
    pub(crate) fn idle_from(&self, now: Instant) {
        if self.after.is_some() {
            let ms = now.saturating_duration_since(self.origin).as_millis();
            let ms = u64::try_from(ms).unwrap_or(NOT_IDLE - 1).min(NOT_IDLE - 1);
            self.idle_since.store(ms, Ordering::Relaxed);
        }
    }

    /// The body waits on its own source: the server is not the one stalling.
    pub(crate) fn busy(&self) {
        if self.after.is_some() {
            self.idle_since.store(NOT_IDLE, Ordering::Relaxed);
        }
    }

    /// Whether, at `now`, the body has waited for the server for its stall timeout.
    pub(crate) fn stalled(&self, now: Instant) -> bool {
        let Some(after) = self.after else {
            return false;
        };
        let since = self.idle_since.load(Ordering::Relaxed);
        if since == NOT_IDLE {
            return false;
        }
        let idle_at = self
            .origin
            .checked_add(Duration::from_millis(since))
            .unwrap_or(self.origin);
        now.saturating_duration_since(idle_at) >= after
    }

    /// Whether the body stalled at `now`; if so, it is marked so for good (its lock is
    /// being released: the body fails when polled again).
    pub(crate) fn fire_if_stalled(&self, now: Instant) -> bool {
        let stalled = self.stalled(now);
        if stalled {
            self.fired.store(true, Ordering::Release);
        }
        stalled
    }

    /// Whether the body stalled and its lock was released for it.
    pub(crate) fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// The stall timeout, if any.
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_body_the_server_left_idle_past_the_timeout_stalls() {
        let watch = StallWatch::new(Some(Duration::from_secs(5)));
        let t0 = watch.origin;
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(!watch.stalled(at(60)), "unarmed: the handler runs");
        watch.idle_from(at(1));
        assert!(!watch.stalled(at(5)));
        assert!(watch.stalled(at(6)), "idle for 5 s");
        watch.busy();
        assert!(!watch.stalled(at(60)), "waiting on its own source");
        watch.idle_from(at(60));
        assert!(!watch.stalled(at(64)));
        assert!(watch.stalled(at(65)));
        assert!(!watch.stalled(t0), "a clock read before the idle start");
        assert!(!watch.fired());
        assert!(!watch.fire_if_stalled(at(64)));
        assert!(!watch.fired());
        assert!(watch.fire_if_stalled(at(65)));
        assert!(watch.fired());
    }

    #[test]
    fn without_a_timeout_nothing_stalls() {
        let watch = StallWatch::new(None);
        watch.idle_from(watch.origin);
        assert!(!watch.stalled(watch.origin + Duration::from_secs(1 << 40)));
        assert_eq!(watch.timeout(), None);
    }
}
