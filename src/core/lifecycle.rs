//! A client's lifecycle: whether it still takes locks ([`LockError::Closed`] once it was
//! shut down), and the releases it still runs, which `Redlock::shutdown` waits for.
//!
//! ```
//! use tower_redlock::Shutdown;
//!
//! fn report(done: Shutdown) {
//!     if done.unfinished() > 0 {
//!         eprintln!("{} releases cut short: their keys expire at their TTL", done.unfinished());
//!     }
//! }
//! # let _ = report;
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::LockError;
use crate::node::running::{Releases, Running};
use crate::quorum::later;

/// Whether a client still takes locks, and the releases it still runs.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    closed: AtomicBool,
    releases: Arc<Releases>,
}

impl Lifecycle {
    /// Open, counting its running releases in `releases` (shared with the nodes: the
    /// releases they still send on their own count there too).
    pub(crate) fn new(releases: Arc<Releases>) -> Self {
        Self {
            closed: AtomicBool::new(false),
            releases,
        }
    }

    /// `Err(LockError::Closed)` once the client was shut down.
    pub(crate) fn check_open(&self) -> Result<(), LockError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(LockError::Closed);
        }
        Ok(())
    }

    /// Counts a release as running until the returned value is dropped (it can move into
    /// the task that runs the release: counted from before the task starts).
    pub(crate) fn release_running(&self) -> Running {
        self.releases.start()
    }

    /// Closes the client (acquisitions and extensions fail with `Closed` from now on) and
    /// waits, for at most `bound`, until no release runs any more: what it found then.
    pub(crate) async fn shutdown(&self, bound: Duration) -> Shutdown {
        self.closed.store(true, Ordering::Release);
        let deadline = tokio::time::Instant::from_std(later(crate::clock::now(), bound));
        loop {
            let idle = self.releases.idle();
            let running = self.releases.count();
            if running == 0 {
                return Shutdown { unfinished: 0 };
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                let unfinished = self.releases.count();
                if unfinished > 0 {
                    tracing::warn!(
                        unfinished,
                        "redlock shutdown: releases still running when it stopped waiting; their keys expire at their TTL"
                    );
                }
                return Shutdown { unfinished };
            }
        }
    }
}

/// What [`Redlock::shutdown`](crate::Redlock::shutdown) found: how many releases had not finished when it stopped
/// waiting (their keys expire at the end of their TTL).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_redlock::{LockError, Redlock};
///
/// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
/// let guard = redlock.acquire("job:nightly").await?;
/// drop(guard); // released in the background
/// let report = redlock.shutdown().await; // ... and that release is done
/// assert_eq!(report.unfinished(), 0);
/// assert!(matches!(redlock.try_lock("job:nightly").await, Err(LockError::Closed)));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "the report says how many releases were still running when the shutdown stopped waiting: read `unfinished()`"]
pub struct Shutdown {
    unfinished: usize,
}

impl Shutdown {
    /// How many releases were still running when the shutdown stopped waiting: zero when
    /// every release reached its nodes (or failed there for good). A release counts once
    /// while its call runs, and once more for each node where it waits in a queue for a
    /// batch or to be sent again on a new connection (these go on after their caller
    /// stopped waiting), so the count can exceed the number of locks.
    pub fn unfinished(&self) -> usize {
        self.unfinished
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closes_and_counts_running_releases() {
        let lifecycle = Lifecycle::default();
        assert_eq!(lifecycle.check_open(), Ok(()));
        let a = lifecycle.release_running();
        let b = lifecycle.release_running();
        assert_eq!(lifecycle.releases.count(), 2);
        let idle = lifecycle.releases.idle();
        drop(a);
        drop(b);
        tokio::time::timeout(Duration::from_secs(1), idle)
            .await
            .expect("woken when the last release finished");
        lifecycle.closed.store(true, Ordering::Release);
        assert_eq!(lifecycle.check_open(), Err(LockError::Closed));
    }
}
