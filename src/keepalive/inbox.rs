//! The keep-alive driver's inbox: guards hand their locks in and take them back without
//! waking the driver task, unless a lock handed in is due before the driver would wake on
//! its own. A lock taken back before the driver ever saw it costs the driver nothing.
//!
//! ```text
//! guard taken  -> inbox.start(lock)   (wakes the driver only if the lock is due earlier)
//! guard gone   -> inbox.stop(id)      (never wakes it; a lock it never saw is just dropped)
//! driver       -> inbox.take()        (everything since, when it wakes for its own reasons)
//! ```
//!
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::token::{LostReason, Shared};

/// How a [`LockGuard`](crate::LockGuard) keeps its lock alive; set on the builder
/// ([`extend_fraction`](crate::RedlockBuilder::extend_fraction),
/// [`max_hold`](crate::RedlockBuilder::max_hold),
/// [`max_extensions`](crate::RedlockBuilder::max_extensions)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeepAlive {
    pub(crate) fraction: f64,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) max_extensions: Option<u32>,
}

/// A client's guards: the inbox of its keep-alive driver while one runs, and the ids of
/// its guarded locks. Dropped with the client, it tells the driver, which then ends once
/// its last locks are done.
#[derive(Debug, Default)]
pub(crate) struct Guards {
    driver: Mutex<Option<Arc<Inbox>>>,
    next_id: AtomicU64,
}

impl Guards {
    /// The driver's inbox, while one runs.
    pub(crate) fn driver(&self) -> MutexGuard<'_, Option<Arc<Inbox>>> {
        self.driver.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A fresh id for a guarded lock.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for Guards {
    fn drop(&mut self) {
        let driver = self
            .driver
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(inbox) = driver.take() {
            inbox.client_gone();
        }
    }
}

/// A lock handed to the driver.
pub(crate) struct Start {
    pub(crate) id: u64,
    pub(crate) shared: Arc<Shared>,
    pub(crate) policy: KeepAlive,
    /// The span of the code that took the guard: its extensions run in it.
    pub(crate) span: tracing::Span,
    /// When the driver must first act on it.
    pub(crate) due: Instant,
}

/// What the driver finds in its inbox when it looks.
pub(crate) struct Taken {
    /// Locks handed in since.
    pub(crate) starts: Vec<Start>,
    /// Locks it had taken that were taken back since.
    pub(crate) stops: Vec<u64>,
    /// Whether the client is gone (no more locks will come).
    pub(crate) client_gone: bool,
}

#[derive(Default)]
struct InboxState {
    /// Handed in, not yet taken by the driver.
    starts: HashMap<u64, Start>,
    /// The earliest due time in `starts`.
    earliest: Option<Instant>,
    /// Taken back after the driver took them.
    stops: Vec<u64>,
    /// The driver is gone: nothing more is read.
    closed: bool,
    client_gone: bool,
    /// Whether the driver waits (or is about to), and until when on its own (`None`: until
    /// it is told).
    waiting: bool,
    wakes_at: Option<Instant>,
}

/// The inbox of one driver, shared by the client's guards.
#[derive(Default)]
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    wake: Notify,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state();
        f.debug_struct("Inbox")
            .field("pending", &st.starts.len())
            .field("closed", &st.closed)
            .finish_non_exhaustive()
    }
}

impl Inbox {
    fn state(&self) -> MutexGuard<'_, InboxState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands a lock in; gives it back when the driver is gone.
    pub(crate) fn start(&self, start: Start) -> Result<(), Start> {
        let mut st = self.state();
        if st.closed {
            return Err(start);
        }
        let wake = st.waiting && st.wakes_at.is_none_or(|at| start.due < at);
        if wake {
            st.waiting = false;
        }
        st.earliest = Some(st.earliest.map_or(start.due, |e| e.min(start.due)));
        st.starts.insert(start.id, start);
        drop(st);
        if wake {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Takes lock `id` back (its guard is releasing it).
    pub(crate) fn stop(&self, id: u64) {
        let mut st = self.state();
        if st.starts.remove(&id).is_none() && !st.closed {
            st.stops.push(id);
        }
    }

    /// The client is gone: its driver ends once its locks are done.
    pub(crate) fn client_gone(&self) {
        self.state().client_gone = true;
        self.wake.notify_one();
    }

    /// The driver takes what came in since it last looked.
    pub(crate) fn take(&self) -> Taken {
        let mut st = self.state();
        st.waiting = false;
        st.earliest = None;
        Taken {
            starts: st.starts.drain().map(|(_, s)| s).collect(),
            stops: std::mem::take(&mut st.stops),
            client_gone: st.client_gone,
        }
    }

    /// The driver is about to wait until `wakes_at` (`None`: until told). False when a
    /// lock due before then came in meanwhile: it must take it first.
    pub(crate) fn wait_until(&self, wakes_at: Option<Instant>) -> bool {
        let mut st = self.state();
        if st
            .earliest
            .is_some_and(|e| wakes_at.is_none_or(|at| e < at))
        {
            return false;
        }
        st.waiting = true;
        st.wakes_at = wakes_at;
        true
    }

    /// Waits until told to look (a lock due sooner came in, or the client is gone).
    pub(crate) async fn told(&self) {
        self.wake.notified().await;
    }

    /// The driver is gone: the locks still in the inbox will not be kept alive, and are
    /// marked lost; later ones go to a new driver.
    pub(crate) fn close(&self) {
        let starts: Vec<Start> = {
            let mut st = self.state();
            st.closed = true;
            st.stops.clear();
            st.starts.drain().map(|(_, s)| s).collect()
        };
        for start in starts {
            start.shared.mark_lost(LostReason::KeepAliveStopped);
        }
    }
}
