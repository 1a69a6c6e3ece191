//! The releases a client runs now, which `Redlock::shutdown` waits for: counted by the
//! operations (a release in an `unlock` call or in the background), and by a node for each
//! release it still sends after its caller stopped waiting (one queued for the next batch,
//! one sent again on a new connection), until that release is answered.
//!
//! ```text
//! let running = releases.start();   // counted from now, also before its task runs
//! ... the release gets its answers ...
//! drop(running);                     // the last one wakes the shutdown
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// How many releases a client runs now, shared by its core and its nodes.
#[derive(Debug, Default)]
pub(crate) struct Releases {
    running: AtomicUsize,
    /// Woken when the last running release finishes.
    idle: Notify,
}

impl Releases {
    /// Counts a release as running until the returned value is dropped (it can move into
    /// the task that runs the release: counted from before the task starts).
    pub(crate) fn start(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::AcqRel);
        Running(Arc::clone(self))
    }

    /// How many run now.
    pub(crate) fn count(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Resolves once the last running release finishes after this call (check
    /// [`count`](Self::count) after creating it, so that no finish is missed).
    pub(crate) fn idle(&self) -> tokio::sync::futures::Notified<'_> {
        self.idle.notified()
    }
}

/// A release counted as running ([`Releases::start`]).
#[derive(Debug)]
pub(crate) struct Running(Arc<Releases>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
