//! Releases to one node that go out together. A release sent to an idle node goes out at
//! once, alone. While it is on its way, the releases sent after it wait; as soon as it is
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
//! The turn: the release on its way holds the node's turn until its answer arrives (our
//! own connection hands the turn on as it reads the answer, whether or not the caller
//! still polls), and at the latest until its caller's deadline. So a caller that stops
//! polling its release without dropping it delays the releases behind it by one deadline
//! at most. At most [`MAX_QUEUED`] releases wait per node; past that, a release goes
//! out alone at once.
//! Batching is off for a cluster node, where the keys of one script call must share a
//! hash slot.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
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

use super::wire::Writes;
use super::{Node, Sending};
use crate::error::NodeError;
use crate::quorum::later;
use crate::scripts::{self, Call};

/// The most releases in one script call.
const MAX_BATCH: usize = 256;

/// The most releases queued for one node: past that, a release goes out alone at once
/// (never lost, never an unbounded queue).
const MAX_QUEUED: usize = 16 * MAX_BATCH;

/// A node's releases that wait for the one on its way.
#[derive(Default)]
pub(super) struct Releases {
    state: Mutex<State>,
    /// Wakes the task that sends the queue: the turn was handed on.
    handed_on: Notify,
}

#[derive(Default)]
struct State {
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

impl State {
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
struct Queued {
    call: Arc<Call>,
    /// When its caller stops waiting: a batch waits for its server until the last one.
    deadline: Instant,
    answer: oneshot::Sender<Result<Value, NodeError>>,
}

/// How a release to a node starts ([`Node::take_turn_or_queue`]).
pub(crate) enum Release {
    /// It takes the node's turn: send it now, alone.
    Turn(Turn),
    /// It waits for the next batch.
    Queued(Waiting),
    /// The queue is full (or no task can send it): send it now, alone, without the turn.
    Alone,
}

impl Releases {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every change keeps the state consistent, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to [`MAX_BATCH`] queued releases, the oldest first.
    fn take(st: &mut State) -> Vec<Queued> {
        if st.queue.len() <= MAX_BATCH {
            std::mem::take(&mut st.queue)
        } else {
            st.queue.drain(..MAX_BATCH).collect()
        }
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
pub(crate) struct Waiting(oneshot::Receiver<Result<Value, NodeError>>);

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

/// The node's turn, held by the release on its way to it. It is over when dropped: by the
/// connection as the answer arrives (our own connection), or with the call (redis-rs's
/// connections), and at the latest at the release's deadline.
pub(crate) struct Turn {
    node: Arc<Node>,
    id: u64,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.node.releases.hand_on(self.id);
    }
}

impl Node {
    /// Sends the release `call`: at once if no release is on its way to this node,
    /// otherwise with the next batch.
    pub(super) async fn release(
        self: &Arc<Self>,
        call: &Arc<Call>,
        sending: Sending,
    ) -> Result<Value, NodeError> {
        match self.take_turn_or_queue(call, sending.deadline) {
            Release::Turn(turn) => self.call_now(call, sending, Some(turn), || {}).await,
            Release::Alone => self.call_now(call, sending, None, || {}).await,
            Release::Queued(waiting) => waiting.await,
        }
    }

    /// The node's turn for the release `call` (until `deadline`) if no release is on its
    /// way to it; otherwise `call` is queued for the next batch, which a task sends once the
    /// turn is over (or its holder's deadline passed).
    pub(super) fn take_turn_or_queue(
        self: &Arc<Self>,
        call: &Arc<Call>,
        deadline: Instant,
    ) -> Release {
        let mut st = self.releases.state();
        if !st.sending && !st.turn_taken(Instant::now()) {
            let id = st.next_turn;
            st.next_turn = st.next_turn.wrapping_add(1);
            st.turn = Some(Holder {
                id,
                until: deadline,
            });
            return Release::Turn(Turn {
                node: Arc::clone(self),
                id,
            });
        }
        if st.queue.len() >= MAX_QUEUED {
            return Release::Alone;
        }
        if !st.sending {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return Release::Alone;
            };
            st.sending = true;
            let node = Arc::clone(self);
            runtime.spawn(async move {
                // Dropped before it ends (the runtime shut down), the task gives up the queue.
                let mut abandoned = Abandoned(Some(Arc::clone(&node)));
                node.send_queue().await;
                abandoned.0 = None;
            });
        }
        let (answer, answered) = oneshot::channel();
        st.queue.push(Queued {
            call: Arc::clone(call),
            deadline,
            answer,
        });
        Release::Queued(Waiting(answered))
    }

    /// The task that sends a node's queued releases: waits until the turn is over (or
    /// its holder's deadline passed), then sends batches until the queue is empty. It holds
    /// the node meanwhile: releases that come while it sends queue behind it.
    async fn send_queue(self: &Arc<Self>) {
        loop {
            let until = {
                let mut st = self.releases.state();
                if !st.turn_taken(Instant::now()) {
                    break;
                }
                st.turn.as_ref().map(|h| h.until)
            };
            let Some(until) = until else { break };
            let until = tokio::time::Instant::from_std(until);
            tokio::select! {
                () = self.releases.handed_on.notified() => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
        loop {
            let batch = {
                let mut st = self.releases.state();
                if st.queue.is_empty() {
                    st.sending = false;
                    return;
                }
                Releases::take(&mut st)
            };
            self.send_batch(batch).await;
        }
    }

    /// Sends `batch` (one script call for all; a lone release as itself) and hands each
    /// release its answer. The call waits for the server until the last caller's deadline,
    /// and at least the connect timeout: a release must reach the node even when its
    /// caller stopped waiting (during a reconnect, say). A batch that still fails is
    /// logged, with how many keys stay until their TTL.
    async fn send_batch(self: &Arc<Self>, batch: Vec<Queued>) {
        let Some(deadline) = batch.iter().map(|q| q.deadline).max() else {
            return;
        };
        let limit = deadline.max(later(Instant::now(), self.connect_timeout()));
        let limit = tokio::time::Instant::from_std(limit);
        let answers = if let [lone] = batch.as_slice() {
            // This task is the caller: it writes on an idle connection itself.
            let sending = Sending {
                acquiring: false,
                writes: Writes::Caller,
                deadline: lone.deadline,
            };
            let answer = self.call_now(&lone.call, sending, None, || {});
            match tokio::time::timeout_at(limit, answer)
                .await
                .unwrap_or(Err(NodeError::Timeout))
            {
                // Not sent, or no answer: as for a batch.
                Err(error) if error == NodeError::Timeout || error.breaks_connection() => {
                    Err(error)
                }
                // The node's answer for that key, an error among them (it was sent).
                answer => Ok(vec![answer]),
            }
        } else {
            let calls: Vec<&Call> = batch.iter().map(|q| &*q.call).collect();
            tokio::time::timeout_at(limit, async {
                let (mut conn, generation) = self.connection(false).await?;
                let answers = scripts::release_many(&calls, &mut conn).await;
                self.answered(generation, answers)
            })
            .await
            .unwrap_or(Err(NodeError::Timeout))
            .map(|answers| {
                answers
                    .into_iter()
                    .map(|a| a.map_err(NodeError::from))
                    .collect()
            })
        };
        match answers {
            Ok(answers) => {
                for (q, answer) in batch.into_iter().zip(answers) {
                    let _ = q.answer.send(answer);
                }
            }
            Err(error) => {
                tracing::warn!(
                    node = %self.label(),
                    releases = batch.len(),
                    %error,
                    "redlock releases could not be sent to a node: their keys stay until their TTL"
                );
                for q in batch {
                    let _ = q.answer.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Gives up the node's queue if the task sending it is dropped before it ends.
struct Abandoned(Option<Arc<Node>>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        if let Some(node) = self.0.take() {
            node.releases.abandon();
        }
    }
}
