//! What a connection's callers and its task share: the transport's writing side
//! ([`Writer`]), the state under one lock (the requests not yet written, where each reply
//! still to come goes, the releases being merged), and breaking the connection: every
//! request still out fails with why, and the merged releases not written yet go where
//! the node said (see `merged`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?; // the SET waits in this state for its reply
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use redis::RedisError;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

use super::merged::{Keys, Merged, Unsent};
use super::slot::Slot;

/// The writing side of a connection's transport, written without waiting: by the task,
/// and by a caller that finds the connection idle. A TCP socket's writing half in use;
/// an in-memory pipe in the tests.
pub(crate) trait Writer: Send + Sync + 'static {
    /// Writes what the transport takes now (`WouldBlock` when it takes nothing).
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize>;
    /// Ready once the transport may take more bytes.
    fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

impl Writer for OwnedWriteHalf {
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        OwnedWriteHalf::try_write(self, bytes)
    }

    fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let stream: &TcpStream = self.as_ref();
        stream.poll_write_ready(cx)
    }
}

/// What the callers and the connection's task share.
pub(super) struct WireShared {
    /// The transport's writing side: the task writes, and so does a caller that finds the
    /// connection idle (under the state lock, with nothing left unwritten).
    pub(super) writing: Box<dyn Writer>,
    /// The rest, under one lock.
    pub(super) state: Mutex<WireState>,
    /// Wakes the task: there is something to write, or it should stop.
    pub(super) wake: Notify,
}

/// The connection's state, under [`WireShared`]'s lock.
#[derive(Default)]
pub(super) struct WireState {
    /// Requests not yet handed to the task for writing.
    pub(super) out: Vec<u8>,
    /// Where each reply still to come goes, in order (a request of n commands has n).
    pub(super) waiting: VecDeque<Waiter>,
    /// The releases that join one call at this place in `out`, and the keys of the
    /// requests sent after it (see `merged`).
    pub(super) merging: Option<(usize, Arc<Merged>, Keys)>,
    /// Earlier such calls that are full, with their places in `out`, in order.
    pub(super) merged: Vec<(usize, Arc<Merged>)>,
    /// The task was woken to write `out` and has not taken it yet.
    pub(super) write_asked: bool,
    /// How many requests `out` holds (each release of a merged call counted).
    pub(super) queued: usize,
    /// The task holds bytes it took from `out` and has not fully written.
    pub(super) task_writing: bool,
    /// Why the connection can no longer be used.
    pub(super) broken: Option<Broken>,
    /// Where the releases not written yet go when it breaks (see
    /// [`Wire::on_unsent`](super::Wire::on_unsent)).
    pub(super) on_unsent: Option<OnUnsent>,
    /// Every handle is gone.
    pub(super) closed: bool,
}

impl WireState {
    /// Closes the call that releases join now, if any: later ones start another.
    pub(super) fn close_merging(&mut self) {
        if let Some((at, merged, _)) = self.merging.take() {
            self.merged.push((at, merged));
        }
    }
}

/// Takes the releases a connection had not written when it broke.
pub(super) type OnUnsent = Box<dyn FnOnce(Vec<Unsent>) + Send>;

/// Where a reply goes.
pub(super) enum Waiter {
    /// To the slot of its request.
    Reply(Arc<Slot>),
    /// To the releases of a merged call.
    Merged(Arc<Merged>),
}

/// Why a connection broke, kept to fail later requests with.
#[derive(Clone)]
pub(super) enum Broken {
    Io(io::ErrorKind, String),
    Protocol(String),
}

impl Broken {
    /// The error a request fails with.
    pub(super) fn error(&self) -> RedisError {
        match self {
            Self::Io(kind, message) => RedisError::from(io::Error::new(*kind, message.clone())),
            Self::Protocol(message) => RedisError::from((
                redis::ErrorKind::Parse,
                "the server's reply is not RESP2",
                message.clone(),
            )),
        }
    }

    /// Why, after the I/O error `e`.
    pub(super) fn io(e: &io::Error) -> Self {
        Self::Io(e.kind(), e.to_string())
    }
}

impl WireShared {
    /// The state, locked.
    pub(super) fn state(&self) -> MutexGuard<'_, WireState> {
        // Every change leaves the state consistent, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the connection broken and fails every request still out, except merged
    /// releases not written yet: they go where
    /// [`Wire::on_unsent`](super::Wire::on_unsent) said (or fail too).
    pub(super) fn break_with(&self, why: Broken) {
        let (waiting, on_unsent) = {
            let mut st = self.state();
            if st.broken.is_none() {
                st.broken = Some(why.clone());
            }
            st.out = Vec::new();
            st.merging = None;
            st.merged = Vec::new();
            (std::mem::take(&mut st.waiting), st.on_unsent.take())
        };
        let mut unsent = Vec::new();
        let mut last: Option<Arc<Slot>> = None;
        for waiter in waiting {
            match waiter {
                // The slots of one request are next to each other: fail each once.
                Waiter::Reply(slot) if last.as_ref().is_some_and(|l| Arc::ptr_eq(l, &slot)) => {}
                Waiter::Reply(slot) => {
                    slot.fail(why.error());
                    last = Some(slot);
                }
                Waiter::Merged(merged) => merged.fail(&why.error(), &mut unsent),
            }
        }
        match on_unsent {
            _ if unsent.is_empty() => {}
            Some(on_unsent) => on_unsent(unsent),
            None => {
                for release in unsent {
                    release.answer(Err(why.error()));
                }
            }
        }
    }
}
