//! Releases to one node that go out together, on redis-rs's connections (TLS, Unix
//! sockets, RESP3; our own connection merges the releases of each write itself, see
//! `wire::merged`). A release sent to an idle node goes out at once, alone. While it is on its way, the releases sent after it wait; as soon as it is
//! answered, they go out as one [`RELEASE_MANY`](crate::scripts) script call, and so on.
//! Under load a node then runs one script per batch instead of one per lock (a script
//! call costs the server several times what the `GET`, `DEL` and `PUBLISH` inside it
//! cost), while a lone release is as fast as before.
//!
//! ```text
//! release A  (node idle)         EVALSHA RELEASE A -------------> answered
//! release B, C, D (A on its way)   queued                          EVALSHA RELEASE_MANY B C D --> answers
//! ```
//!
//! Every queued release is sent even if its caller stopped waiting (its round ended): a
//! release must reach the node, so a batch waits for its node at least the connect
//! timeout (a batch that still fails is logged). Each answer is the one the release alone
//! would have had.
//!
//! The turn: the release on its way holds the node's turn until its call ends, and at the
//! latest until its caller's deadline. So a caller that stops
//! polling its release without dropping it delays the releases behind it by one deadline
//! at most. At most [`MAX_QUEUED`] releases wait per node; past that, a release goes
//! out alone at once.
//! Batching is off for a cluster node, where the keys of one script call must share a
//! hash slot.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // RESP3: redis-rs's connection, whose releases queue behind the one on its way.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379/?protocol=resp3"]).build()?;
//! let (a, b) = (redlock.lock("a").await?, redlock.lock("b").await?);
//! // Released together: `b`'s delete may go out in one batch with others queued behind `a`'s.
//! let (ra, rb) = tokio::join!(redlock.unlock(&a), redlock.unlock(&b));
//! assert_eq!((ra.released(), rb.released()), (1, 1));
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use redis::Value;
use tokio::sync::{Notify, oneshot};

use super::running::{self, Running};
use crate::error::NodeError;
use crate::scripts::Call;

/// The most releases in one script call.
const MAX_BATCH: usize = 256;

/// The most releases queued for one node: past that, a release goes out alone at once
/// (never lost, never an unbounded queue).
const MAX_QUEUED: usize = 16 * MAX_BATCH;

/// A node's releases that wait for the one on its way, and its turn.
#[derive(Default)]
pub(super) struct Releases {
    state: Mutex<ReleaseQueue>,
    /// Wakes the task that sends the queue: the turn was handed on.
    handed_on: Notify,
    /// The client's running releases: a queued one counts there until it is answered,
    /// also once its caller stopped waiting (`shutdown` waits for it).
    running: Arc<running::Releases>,
}

#[derive(Default)]
struct ReleaseQueue {
    /// The release that holds the node's turn (sent alone, its answer still to come).
    turn: Option<Holder>,
    /// The number of the next turn.
    next_turn: u64,
    /// A task sends the queue: it waits for the turn, then holds the node while it sends.
    sending: bool,
    /// The releases that wait, in the order they came.
    queue: Vec<Queued>,
}

/// Which release holds the node's turn, and until when it may keep it: its caller's
/// deadline. Past that, the releases behind it go on without it (a caller that stopped
/// polling its release does not stall the node's other releases).
struct Holder {
    id: u64,
    until: Instant,
}

impl ReleaseQueue {
    /// Whether the turn is held by a release that is still within its deadline.
    fn turn_taken(&mut self, now: Instant) -> bool {
        if self.turn.as_ref().is_some_and(|h| now >= h.until) {
            tracing::debug!(
                "redlock release kept its node's turn past its deadline: the releases behind it go on"
            );
            self.turn = None;
        }
        self.turn.is_some()
    }
}

/// A release waiting to go out, with where its answer goes.
pub(super) struct Queued {
    pub(super) call: Arc<Call>,
    /// When its caller stops waiting: a batch waits for its server until the last one.
    pub(super) deadline: Instant,
    answer: oneshot::Sender<Result<Value, NodeError>>,
    /// Counted as running until answered (or dropped).
    _running: Running,
}

impl Queued {
    /// Hands the release its answer (its caller may have stopped waiting).
    pub(super) fn answer(self, answer: Result<Value, NodeError>) {
        let _ = self.answer.send(answer);
    }
}

/// How a release to a node starts ([`Releases::take_turn_or_queue`]).
pub(super) enum Release {
    /// It takes the node's turn: send it now, alone.
    Turn(Turn),
    /// It waits for the next batch; with `start_sender`, the caller starts the task that
    /// sends the queue ([`Releases::wait_turn`], then [`Releases::next_batch`]).
    Queued {
        waiting: Waiting,
        start_sender: bool,
    },
    /// The queue is full (or no task can send it): send it now, alone, without the turn.
    Alone,
}

impl Releases {
    /// A node's queue, its releases counted in the client's `running`.
    pub(super) fn counting_in(running: Arc<running::Releases>) -> Self {
        Self {
            running,
            ..Self::default()
        }
    }

    fn state(&self) -> MutexGuard<'_, ReleaseQueue> {
        // Every change keeps the state consistent, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The node's turn for the release `call` (until `deadline`) if no release is on its
    /// way to it; otherwise `call` is queued for the next batch, which a task sends once
    /// the turn is over (or its holder's deadline passed).
    pub(super) fn take_turn_or_queue(
        self: &Arc<Self>,
        call: &Arc<Call>,
        deadline: Instant,
    ) -> Release {
        let mut st = self.state();
        if !st.sending && !st.turn_taken(crate::clock::now()) {
            let id = st.next_turn;
            st.next_turn = st.next_turn.wrapping_add(1);
            st.turn = Some(Holder {
                id,
                until: deadline,
            });
            return Release::Turn(Turn {
                releases: Arc::clone(self),
                id,
            });
        }
        if st.queue.len() >= MAX_QUEUED {
            return Release::Alone;
        }
        let start_sender = !st.sending;
        if start_sender {
            if tokio::runtime::Handle::try_current().is_err() {
                return Release::Alone;
            }
            st.sending = true;
        }
        let (answer, answered) = oneshot::channel();
        st.queue.push(Queued {
            call: Arc::clone(call),
            deadline,
            answer,
            _running: self.running.start(),
        });
        Release::Queued {
            waiting: Waiting(answered),
            start_sender,
        }
    }

    /// Waits until the turn is over (or its holder's deadline passed): the queue may go.
    pub(super) async fn wait_turn(&self) {
        loop {
            let until = {
                let mut st = self.state();
                if !st.turn_taken(crate::clock::now()) {
                    return;
                }
                st.turn.as_ref().map(|h| h.until)
            };
            let Some(until) = until else { return };
            let until = tokio::time::Instant::from_std(until);
            tokio::select! {
                () = self.handed_on.notified() => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// The next batch to send: up to [`MAX_BATCH`] queued releases, the oldest first;
    /// `None` once the queue is empty (the sending task is then over).
    pub(super) fn next_batch(&self) -> Option<Vec<Queued>> {
        let mut st = self.state();
        if st.queue.is_empty() {
            st.sending = false;
            return None;
        }
        Some(if st.queue.len() <= MAX_BATCH {
            std::mem::take(&mut st.queue)
        } else {
            st.queue.drain(..MAX_BATCH).collect()
        })
    }

    /// Turn `id` is over (its answer came, or it was given up): the queue may go.
    fn hand_on(&self, id: u64) {
        {
            let mut st = self.state();
            if st.turn.as_ref().is_none_or(|h| h.id != id) {
                return; // Already taken from it at its deadline.
            }
            st.turn = None;
            if !st.sending {
                return;
            }
        }
        self.handed_on.notify_one();
    }

    /// Gives up the queued releases (their callers get an error) when the task sending
    /// them is gone (its runtime is shutting down).
    fn abandon(&self) {
        let dropped = {
            let mut st = self.state();
            st.sending = false;
            std::mem::take(&mut st.queue)
        };
        drop(dropped);
    }
}

/// A release queued for its node's next batch: its answer, once the batch is answered.
pub(super) struct Waiting(oneshot::Receiver<Result<Value, NodeError>>);

impl Future for Waiting {
    type Output = Result<Value, NodeError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|answer| {
            answer.unwrap_or_else(|_| {
                Err(NodeError::Connection(
                    "the release waited for a batch that was dropped (its tokio runtime shut down?)"
                        .into(),
                ))
            })
        })
    }
}

/// The node's turn, held by the release on its way to it. It is over when dropped, with
/// the call, and at the latest at the release's deadline.
pub(super) struct Turn {
    releases: Arc<Releases>,
    id: u64,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.releases.hand_on(self.id);
    }
}

/// Held by the task that sends a node's queue: gives the queue up if the task is dropped
/// before it ends (its runtime shut down), so no release waits for it forever.
pub(super) struct Sender(Option<Arc<Releases>>);

impl Sender {
    pub(super) fn new(releases: &Arc<Releases>) -> Self {
        Self(Some(Arc::clone(releases)))
    }

    /// The task ended: the queue was sent.
    pub(super) fn finished(mut self) {
        self.0 = None;
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if let Some(releases) = self.0.take() {
            releases.abandon();
        }
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
