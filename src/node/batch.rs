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
//! release must reach the node. Each answer is the one the release alone would have had.
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
use tokio::sync::oneshot;

use super::Node;
use crate::error::NodeError;
use crate::scripts::{self, Call};

/// How many releases (alone or batches) may be on their way to a node at once; the
/// others queue for the next batch.
const MAX_IN_FLIGHT: usize = 1;

/// The most releases in one script call.
const MAX_BATCH: usize = 256;

/// A node's releases that wait for the one on its way.
#[derive(Default)]
pub(super) struct Releases(Mutex<State>);

#[derive(Default)]
struct State {
    /// Releases (alone or batches) on their way to the node.
    in_flight: usize,
    /// The releases that wait for it, in the order they came.
    queue: Vec<Queued>,
}

/// A release waiting to go out, with where its answer goes.
struct Queued {
    call: Arc<Call>,
    /// When its caller stops waiting: a batch waits for its server until the last one.
    deadline: Instant,
    answer: oneshot::Sender<Result<Value, NodeError>>,
}

impl Releases {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every change keeps the state consistent, so a poisoned lock is still usable.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to [`MAX_BATCH`] queued releases, the oldest first.
    fn take(st: &mut State) -> Vec<Queued> {
        if st.queue.len() <= MAX_BATCH {
            std::mem::take(&mut st.queue)
        } else {
            st.queue.drain(..MAX_BATCH).collect()
        }
    }

    /// Marks the node idle and gives up the queued releases (their callers get an error):
    /// what is left when no task can send them (the runtime is shutting down).
    fn abandon(&self) {
        let dropped = {
            let mut st = self.state();
            st.in_flight = 0;
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

/// The node's turn, held by the release on its way to it: dropped (answered or given
/// up), it hands the node on to the releases that queued meanwhile.
pub(crate) struct Turn(Arc<Node>);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.release_done();
    }
}

impl Node {
    /// Sends the release `call`: at once if no release is on its way to this node,
    /// otherwise with the next batch.
    pub(super) async fn release(
        self: &Arc<Self>,
        call: &Arc<Call>,
        deadline: Instant,
    ) -> Result<Value, NodeError> {
        match self.take_turn_or_queue(call, deadline) {
            Ok(_turn) => self.call_now(call, false, || {}).await,
            Err(waiting) => waiting.await,
        }
    }

    /// The node's turn for the release `call` if no release is on its way to it; otherwise
    /// `call` is queued for the next batch (which goes out within `deadline`'s reach).
    pub(super) fn take_turn_or_queue(
        self: &Arc<Self>,
        call: &Arc<Call>,
        deadline: Instant,
    ) -> Result<Turn, Waiting> {
        let mut st = self.releases.state();
        if st.in_flight >= MAX_IN_FLIGHT {
            let (answer, answered) = oneshot::channel();
            st.queue.push(Queued {
                call: Arc::clone(call),
                deadline,
                answer,
            });
            Err(Waiting(answered))
        } else {
            st.in_flight += 1;
            Ok(Turn(Arc::clone(self)))
        }
    }

    /// The release on its way is answered (or abandoned): sends what queued meanwhile from
    /// a task of its own, or marks the node idle.
    fn release_done(self: &Arc<Self>) {
        let batch = {
            let mut st = self.releases.state();
            if st.queue.is_empty() {
                st.in_flight = st.in_flight.saturating_sub(1);
                return;
            }
            Releases::take(&mut st)
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop(batch);
            self.releases.abandon();
            return;
        };
        let node = Arc::clone(self);
        // Dropped before it ends (the runtime shut down), the task leaves the node idle.
        let abandoned = Abandoned(Some(Arc::clone(self)));
        runtime.spawn(async move {
            let mut abandoned = abandoned;
            let mut batch = batch;
            loop {
                node.send_batch(batch).await;
                let mut st = node.releases.state();
                if st.queue.is_empty() {
                    st.in_flight = st.in_flight.saturating_sub(1);
                    abandoned.0 = None;
                    return;
                }
                batch = Releases::take(&mut st);
            }
        });
    }

    /// Sends `batch` (one script call for all; a lone release as itself) and hands each
    /// release its answer. The call waits for the server until the last caller's deadline.
    async fn send_batch(self: &Arc<Self>, batch: Vec<Queued>) {
        let Some(deadline) = batch.iter().map(|q| q.deadline).max() else {
            return;
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        if let [lone] = batch.as_slice() {
            let answer = tokio::time::timeout_at(deadline, self.call_now(&lone.call, false, || {}))
                .await
                .unwrap_or(Err(NodeError::Timeout));
            if let Some(q) = batch.into_iter().next() {
                let _ = q.answer.send(answer);
            }
            return;
        }
        let calls: Vec<&Call> = batch.iter().map(|q| &*q.call).collect();
        let answers = tokio::time::timeout_at(deadline, async {
            let (mut conn, generation) = self.connection(false).await?;
            let answers = scripts::release_many(&calls, &mut conn).await;
            self.answered(generation, answers)
        })
        .await
        .unwrap_or(Err(NodeError::Timeout));
        drop(calls);
        match answers {
            Ok(answers) => {
                for (q, answer) in batch.into_iter().zip(answers) {
                    let _ = q.answer.send(answer.map_err(NodeError::from));
                }
            }
            Err(error) => {
                for q in batch {
                    let _ = q.answer.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Leaves the node idle (giving up the queue) if the task sending batches is dropped
/// before it ends.
struct Abandoned(Option<Arc<Node>>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        if let Some(node) = self.0.take() {
            node.releases.abandon();
        }
    }
}
