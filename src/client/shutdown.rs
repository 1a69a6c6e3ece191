//! Shutting a client down: [`Redlock::shutdown`] stops new acquisitions and waits, within
//! a bound, for every release still on its way (the background releases of dropped
//! guards, layer responses and abandoned attempts, and `unlock` calls still running), so
//! that a process that exits right after its last `unlock()` leaves no key locked until its
//! TTL.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::{LockError, Redlock};
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let guard = redlock.acquire("job:nightly").await?;
//! drop(guard); // released in the background
//! let report = redlock.shutdown().await; // ... and that release is done
//! assert_eq!(report.unfinished(), 0);
//! assert!(matches!(redlock.try_lock("job:nightly").await, Err(LockError::Closed)));
//! # Ok(()) }
//! ```

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Redlock;
use super::lifecycle::Shutdown;
use crate::quorum::later;

impl Redlock {
    /// Shuts the client down, for every clone: acquisitions and extensions from now on
    /// fail with [`LockError::Closed`](crate::LockError::Closed) (releases still go out: a lock taken before can
    /// still be unlocked, and a dropped guard still releases), and the call waits for every
    /// release still running, queued for a node or in flight, to get its nodes' answers.
    ///
    /// Each release is bounded by its own deadline (the per-node timeout, or the connect
    /// timeout for one that waits for a reconnect), so the wait is too: it ends once none
    /// is left, and in any case after twice the longer of the per-node and connect
    /// timeouts; [`Shutdown::unfinished`] says how many were still running then. Calling
    /// it again waits again. Without it, dropping the last clone still lets the releases
    /// on their way finish as long as the tokio runtime runs, but a process that exits at
    /// once may cut them short.
    pub async fn shutdown(&self) -> Shutdown {
        let lifecycle = &self.inner.lifecycle;
        lifecycle.closed.store(true, Ordering::Release);
        let bound = self
            .inner
            .node_timeout
            .max(
                self.inner
                    .nodes
                    .first()
                    .map_or(Duration::ZERO, |n| n.connect_timeout()),
            )
            .saturating_mul(2);
        let deadline = tokio::time::Instant::from_std(later(Instant::now(), bound));
        loop {
            let idle = lifecycle.releases.idle.notified();
            let running = lifecycle.releases.running.load(Ordering::Acquire);
            if running == 0 {
                return Shutdown { unfinished: 0 };
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                let unfinished = lifecycle.releases.running.load(Ordering::Acquire);
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
