//! One command in flight on one node: a [`NodeCall`], whatever carries it. A round starts
//! one per node and polls them together; each owns what it needs, so it can outlive its
//! round (a straggler landing in the background).
//!
//! ```text
//! NodeCall::start:  our connection ready ----> Sent (its reply to come) --follow-up--> Running
//!                   anything else -----------> Running (connect, redis-rs, a landing first)
//! ```
//!
//! The hot path (`Sent`) allocates nothing: the command is written at once, or handed to
//! the connection's task, and the call waits for its reply; a release there is merged
//! with the other releases of the connection's next write (see the `wire` module). A
//! reply that asks for a follow-up (a script the node no longer has, or the holder's TTL
//! of a taken key) turns the call into `Running`. On redis-rs's connections, releases to
//! a node that come while one is on its way queue for its next batch (see the `batch`
//! module, which keeps the queue and the turn; the task that sends a batch is here).
//! Releases our connection broke before writing are sent again by the `resend` module.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("job:1").await?; // one NodeCall per node, polled by one round
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use futures_util::future::BoxFuture;
use redis::Value;

use super::batch::{self, Queued, Release};
use super::wire::{self, Writes};
use super::{Conn, Link, Node, Quarantine};
use crate::error::NodeError;
use crate::landing::{Landing, LandingState};
use crate::quorum::later;
use crate::scripts::{self, Call};

/// How a round sends its command to a node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sending<'a> {
    /// Acquire and extend: a quarantined node fails at once (releases go to it too).
    pub(crate) quarantine: Quarantine,
    /// How many nodes the round sends to: to one, the caller writes the command itself on
    /// an idle connection (no task hop); to several, their connections' tasks write it
    /// side by side.
    pub(crate) nodes: usize,
    /// When the round stops waiting: a release on a redis-rs connection holds its node's
    /// turn at most that long.
    pub(crate) deadline: Instant,
    /// When the round sends: one clock read for the calls that go at once (a quarantine
    /// looked up a moment early ends that much later; see also `renewals`).
    pub(crate) now: Instant,
    /// The call first waits for the node's call in this earlier round to land (a release
    /// after a late `SET`).
    pub(crate) after: Option<&'a Landing>,
    /// Marked once the call's command is on its node's connection (the landing of this
    /// round's stragglers).
    pub(crate) marks: Option<&'a Arc<LandingState>>,
}

/// How a node sends one call (what [`Sending`] says, for one node).
#[derive(Debug, Clone, Copy)]
pub(super) struct How {
    quarantine: Quarantine,
    /// Who writes the command on an idle connection of ours.
    writes: Writes,
    deadline: Instant,
}

impl How {
    /// A release sent by the task that runs it (a batch's lone release, one sent again),
    /// until `deadline`: it goes to a quarantined node too, and that task writes it on an
    /// idle connection itself.
    pub(super) fn release_by_task(deadline: Instant) -> Self {
        Self {
            quarantine: Quarantine::Ignored,
            writes: Writes::Caller,
            deadline,
        }
    }
}

impl Sending<'_> {
    fn how(&self) -> How {
        How {
            quarantine: self.quarantine,
            writes: if self.nodes == 1 {
                Writes::Caller
            } else {
                Writes::Task
            },
            deadline: self.deadline,
        }
    }
}

/// One command in flight on one node, from [`NodeCall::start`] to its answer.
pub(crate) struct NodeCall {
    node: Arc<Node>,
    call: Arc<Call>,
    flight: Flight,
}

/// Where a call is.
enum Flight {
    /// On our own connection of `generation`: its reply is to come.
    Sent {
        generation: u64,
        wire: wire::Wire,
        reply: wire::Reply,
    },
    /// Anything else: waiting for a connection, an earlier call's landing or a batch of
    /// releases, a redis-rs connection, or a follow-up command (rare, so boxed).
    Running(BoxFuture<'static, Result<Value, NodeError>>),
}

impl NodeCall {
    /// Starts `call` on `node`: at once when the node's own connection is ready (and, when
    /// acquiring, the node is not quarantined), otherwise as a future of its own. It has
    /// no time limit of its own: its round bounds every call with one deadline, and tells
    /// the node of a call it gave up on ([`Node::timed_out`]).
    pub(crate) fn start(node: &Arc<Node>, call: &Arc<Call>, sending: &Sending<'_>) -> Self {
        let i = node.index;
        let waits = sending.after.filter(|after| !after.has_landed(i));
        let how = sending.how();
        if waits.is_none()
            && let Some(flight) = node.start_now(call, how, sending.now)
        {
            if let (Flight::Sent { .. }, Some(marks)) = (&flight, sending.marks) {
                marks.sent(i);
            }
            return Self::new(node, call, flight);
        }
        let (task_node, task_call) = (Arc::clone(node), Arc::clone(call));
        let (after, marks) = (waits.cloned(), sending.marks.cloned());
        let running = Box::pin(async move {
            if let Some(after) = after {
                after.wait(i, how.deadline).await;
            }
            let on_sent = || {
                if let Some(marks) = &marks {
                    marks.sent(i);
                }
            };
            task_node.run(&task_call, how, on_sent).await
        });
        Self::new(node, call, Flight::Running(running))
    }

    fn new(node: &Arc<Node>, call: &Arc<Call>, flight: Flight) -> Self {
        Self {
            node: Arc::clone(node),
            call: Arc::clone(call),
            flight,
        }
    }

    /// The node's position in its client's list.
    pub(crate) fn index(&self) -> usize {
        self.node.index
    }

    /// The node.
    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Whether the call still has steps of its own to take when polled (waiting for a
    /// connection or an earlier call's landing, a follow-up command, a redis-rs
    /// connection; a release may hold its node's release turn meanwhile). A call on our
    /// own connection whose reply is to come has none: the connection's task does the rest.
    pub(crate) fn takes_steps(&self) -> bool {
        matches!(self.flight, Flight::Running(_))
    }

    /// When the answer came in from the node, for a call on our own connection whose
    /// answer is in (`None` otherwise: the answer counts as of when it is taken).
    pub(crate) fn arrived(&self) -> Option<std::time::Instant> {
        match &self.flight {
            Flight::Sent { reply, .. } => reply.arrived(),
            Flight::Running(_) => None,
        }
    }
}

impl Future for NodeCall {
    type Output = Result<Value, NodeError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.flight {
            Flight::Sent {
                generation,
                wire,
                reply,
            } => {
                let first = ready!(Pin::new(reply).poll(cx));
                if !this.call.needs_more(&first) {
                    let answer = this.call.settled(first);
                    return Poll::Ready(this.node.answered(*generation, answer));
                }
                let (node, generation) = (Arc::clone(&this.node), *generation);
                let (call, mut conn) = (Arc::clone(&this.call), Conn::Own(wire.clone()));
                this.flight = Flight::Running(Box::pin(async move {
                    let answer = call.finish(first, &mut conn).await;
                    node.answered(generation, answer)
                }));
                Pin::new(this).poll(cx)
            }
            Flight::Running(running) => running.as_mut().poll(cx),
        }
    }
}

impl Node {
    /// `call` started without waiting, if the node's own connection is ready (and, when
    /// acquiring, the node is not quarantined at `now`): the command is then on the
    /// connection. `None` otherwise: [`run`](Self::run) it.
    fn start_now(self: &Arc<Self>, call: &Arc<Call>, sending: How, now: Instant) -> Option<Flight> {
        let (wire, generation) = {
            let mut st = self.state();
            let wire = match &st.slot {
                Link::Ready(Conn::Own(wire)) => wire.clone(),
                _ => return None,
            };
            if sending.quarantine == Quarantine::Applies
                && self.quarantine_left(&mut st, now).is_some()
            {
                return None;
            }
            (wire, st.generation)
        };
        Some(self.send_on(&wire, generation, call, sending.writes, now))
    }

    /// Runs `call`, waiting for the connection first if need be. When the quarantine applies, a
    /// quarantined node fails at once. A release on a redis-rs connection sent while
    /// another is on its way to this node goes out with the next batch. `on_sent` runs
    /// once the command is on our own connection to the node, where any later command
    /// goes after it (it never runs on redis-rs's connections).
    async fn run(
        self: &Arc<Self>,
        call: &Arc<Call>,
        sending: How,
        on_sent: impl FnOnce(),
    ) -> Result<Value, NodeError> {
        let connected = self.connection(sending.quarantine).await?;
        let batched = call.is_release() && self.batches_releases();
        let turn = match &connected.0 {
            Conn::Own(_) => None,
            _ if batched => match self.release_turn(call, sending.deadline) {
                Ok(turn) => turn,
                Err(waiting) => return waiting.await,
            },
            _ => None,
        };
        self.call_on(connected, call, sending, turn, on_sent).await
    }

    /// Where a release on a redis-rs connection goes at this node: `Ok` to send it now,
    /// holding the node's turn (or, with `None`, alone); `Err` with its answer to come once
    /// it is queued for the next batch (starting the task that sends batches when it is
    /// the first to wait).
    fn release_turn(
        self: &Arc<Self>,
        call: &Arc<Call>,
        deadline: Instant,
    ) -> Result<Option<batch::Turn>, batch::Waiting> {
        match self.releases.take_turn_or_queue(call, deadline) {
            Release::Turn(turn) => Ok(Some(turn)),
            Release::Alone => Ok(None),
            Release::Queued {
                waiting,
                start_sender,
            } => {
                if start_sender {
                    self.send_batches();
                }
                Err(waiting)
            }
        }
    }

    /// Sends `call` on our own connection `wire` (of `generation`); a release merged with
    /// the others of the connection's next write. A fenced acquisition leaves its renewal
    /// out where this connection renewed the set recently, as of `now` (see `renewals`).
    fn send_on(
        &self,
        wire: &wire::Wire,
        generation: u64,
        call: &Arc<Call>,
        writes: Writes,
        now: Instant,
    ) -> Flight {
        let reply = match call.renews() {
            _ if call.is_release() => wire.release(call, writes),
            Some(set) if !self.renewals.due_at(set, generation, now) => {
                let (packed, commands) = call.without_renewal();
                wire.request_all(packed, commands, writes, call.key())
            }
            renews => {
                let reply = wire.request_all(call.packed(), call.commands(), writes, call.key());
                if let Some(set) = renews {
                    // Marked once it is on the connection: a request that leaves the
                    // renewal out for this mark goes after it there.
                    self.renewals.renewed_at(set, generation, now);
                }
                reply
            }
        };
        Flight::Sent {
            generation,
            reply,
            wire: wire.clone(),
        }
    }

    /// Runs `call` at once on the node's current connection, waiting for one if need be,
    /// with no release turn (a batch's lone release, a release sent again).
    pub(super) async fn call_now(
        self: &Arc<Self>,
        call: &Arc<Call>,
        sending: How,
    ) -> Result<Value, NodeError> {
        let connected = self.connection(sending.quarantine).await?;
        self.call_on(connected, call, sending, None, || {}).await
    }

    /// Runs `call` on `conn` (of `generation`); `turn` if it is a release holding the
    /// node's turn on a redis-rs connection; `on_sent` as for [`run`](Self::run).
    async fn call_on(
        self: &Arc<Self>,
        (mut conn, generation): (Conn, u64),
        call: &Arc<Call>,
        sending: How,
        turn: Option<batch::Turn>,
        on_sent: impl FnOnce(),
    ) -> Result<Value, NodeError> {
        if let Conn::Own(wire) = &conn {
            // The hot path: the command encoded once for the round.
            let flight = self.send_on(wire, generation, call, sending.writes, crate::clock::now());
            on_sent();
            return NodeCall::new(self, call, flight).await;
        }
        #[cfg(feature = "cluster")]
        if let (Conn::Cluster(shards), Some(cluster)) = (&mut conn, self.cluster())
            && sending.quarantine == Quarantine::Applies
            && self.settings.quarantine
        {
            // Every acquisition on a cluster says where it ran (see the `cluster` module).
            let answer = Box::pin(self.acquire_on_cluster(cluster, call, shards)).await;
            return self
                .answered(generation, answer)
                .and_then(|checked| checked);
        }
        let answer = match call.renews() {
            // On a cluster, the shard behind the connection may change unseen: every
            // fenced request renews there.
            Some(set) if !self.is_cluster() => {
                let renew = self.renewals.due(set, generation);
                let answer = Box::pin(call.run_renewing(&mut conn, renew)).await;
                if renew && call.renewal_ran(&answer) {
                    // redis-rs's connection orders the requests it is handed, not the
                    // ones still being handed: the mark waits for the answer.
                    self.renewals.renewed(set, generation);
                }
                answer
            }
            _ => Box::pin(call.run(&mut conn)).await,
        };
        drop(turn);
        self.answered(generation, answer)
    }

    /// Starts the task that sends this node's queued releases: it waits until the turn is
    /// over (or its holder's deadline passed), then sends batches until the queue is
    /// empty, holding the node meanwhile (releases that come while it sends queue behind
    /// it). Called within a runtime (see [`Release::Queued`]).
    fn send_batches(self: &Arc<Self>) {
        let node = Arc::clone(self);
        tokio::spawn(async move {
            let sender = batch::Sender::new(&node.releases);
            node.releases.wait_turn().await;
            while let Some(queued) = node.releases.next_batch() {
                node.send_batch(queued).await;
            }
            sender.finished();
        });
    }

    /// Sends `queued` (one script call for all; a lone release as itself) and hands each
    /// release its answer. The call waits for the server until the last caller's
    /// deadline, and at least the connect timeout: a release must reach the node even
    /// when its caller stopped waiting (during a reconnect, say). A batch that still fails
    /// is logged, with how many keys stay until their TTL.
    async fn send_batch(self: &Arc<Self>, queued: Vec<Queued>) {
        let Some(deadline) = queued.iter().map(|q| q.deadline).max() else {
            return;
        };
        let limit = deadline.max(later(crate::clock::now(), self.connect_timeout()));
        let limit = tokio::time::Instant::from_std(limit);
        let answers = match queued.as_slice() {
            [lone] => tokio::time::timeout_at(limit, self.send_lone(lone)).await,
            many => tokio::time::timeout_at(limit, self.send_many(many)).await,
        };
        match answers.unwrap_or(Err(NodeError::Timeout)) {
            Ok(answers) => {
                for (q, answer) in queued.into_iter().zip(answers) {
                    q.answer(answer);
                }
            }
            Err(error) => {
                tracing::warn!(
                    node = %self.label(),
                    releases = queued.len(),
                    %error,
                    "redlock releases could not be sent to a node: their keys stay until their TTL"
                );
                for q in queued {
                    q.answer(Err(error.clone()));
                }
            }
        }
    }

    /// A batch of one: the release as itself. Its node's answer for the key (an error
    /// among them) goes to its caller; a timeout or a broken connection counts as not
    /// sent, as for a batch.
    async fn send_lone(
        self: &Arc<Self>,
        lone: &Queued,
    ) -> Result<Vec<Result<Value, NodeError>>, NodeError> {
        let sending = How::release_by_task(lone.deadline);
        match self.call_now(&lone.call, sending).await {
            Err(error) if error == NodeError::Timeout || error.breaks_connection() => Err(error),
            answer => Ok(vec![answer]),
        }
    }

    /// A batch of several: one script call for all.
    async fn send_many(
        self: &Arc<Self>,
        many: &[Queued],
    ) -> Result<Vec<Result<Value, NodeError>>, NodeError> {
        let calls: Vec<&Call> = many.iter().map(|q| &*q.call).collect();
        let (mut conn, generation) = self.connection(Quarantine::Ignored).await?;
        let answers = scripts::release_many(&calls, &mut conn).await;
        let answers = self.answered(generation, answers)?;
        Ok(answers
            .into_iter()
            .map(|a| a.map_err(NodeError::from))
            .collect())
    }
}
