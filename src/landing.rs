//! Landing: when the calls a round left in flight (its stragglers) have reached their
//! nodes. A release to a node waits for that node's call, so that it cannot overtake a
//! late `SET` of the same lock. A call has *landed* once its command is on its node's own
//! connection (a later command there goes after it), or else once it is done (answered,
//! failed or timed out).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?; // its SETs to slow nodes land meanwhile
//! let _ = redlock.unlock(&lock).await; // each node's delete goes after that node's SET
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::Notify;

use crate::quorum::NodeMask;

/// Tells when a round's stragglers have landed, node by node: a release to a node
/// waits for that node's call, so that it cannot overtake a late `SET` of the same lock.
/// A call has landed once its command is on its node's own connection (a later command
/// there goes after it), or else once it is done.
#[derive(Debug, Clone)]
pub(crate) struct Landing(Arc<LandingState>);

#[derive(Debug)]
pub(crate) struct LandingState {
    /// The nodes whose call has not landed yet.
    pending: Mutex<NodeMask>,
    changed: Notify,
    /// How many releases wait on it: a call that lands wakes nobody when none does (the
    /// usual case), which spares every node call a `notify_waiters`.
    waiting: AtomicUsize,
}

impl LandingState {
    pub(crate) fn new(pending: NodeMask) -> Arc<Self> {
        Arc::new(Self {
            pending: Mutex::new(pending),
            changed: Notify::new(),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Forgets every node not in `mask` (their calls are over).
    pub(crate) fn keep_only(&self, mask: NodeMask) {
        let mut pending = self.pending();
        *pending = pending.intersection(mask);
    }

    /// Node `i`'s command is on its connection: it has landed as far as later commands
    /// there are concerned.
    pub(crate) fn sent(&self, i: usize) {
        let mut pending = self.pending();
        if pending.contains(i) {
            pending.remove(i);
            drop(pending);
            self.wake_waiters();
        }
    }

    pub(crate) fn pending(&self) -> std::sync::MutexGuard<'_, NodeMask> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn done(&self, i: usize) {
        self.pending().remove(i);
        self.wake_waiters();
    }

    pub(crate) fn done_all(&self) {
        *self.pending() = NodeMask::default();
        self.wake_waiters();
    }

    /// Wakes the releases that wait, if any. A waiter counts itself before it looks at
    /// `pending` (under its lock), so one that saw a node pending before a change is
    /// counted by the time the change is made and this runs.
    fn wake_waiters(&self) {
        if self.waiting.load(Ordering::SeqCst) != 0 {
            self.changed.notify_waiters();
        }
    }
}

impl Landing {
    /// The landing that `state` tracks.
    pub(crate) fn of(state: Arc<LandingState>) -> Self {
        Self(state)
    }

    /// Waits until node `i`'s call is done, or until `deadline`.
    pub(crate) async fn wait(&self, i: usize, deadline: Instant) {
        let deadline = tokio::time::Instant::from_std(deadline);
        self.0.waiting.fetch_add(1, Ordering::SeqCst);
        let _counted = Counted(&self.0.waiting);
        loop {
            let changed = self.0.changed.notified();
            if !self.0.pending().contains(i) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return;
            }
        }
    }

    /// Whether node `i`'s call has landed.
    pub(crate) fn has_landed(&self, i: usize) -> bool {
        !self.0.pending().contains(i)
    }

    /// Whether every call has landed.
    pub(crate) fn is_done(&self) -> bool {
        self.0.pending().len() == 0
    }
}

/// Uncounts a waiter of a [`Landing`] when it stops waiting.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
