//! A round: one command sent to the chosen nodes at once, their answers yielded as they
//! come, every call bounded by the round's one deadline. The operations own the rest:
//! acquire, fencing phase 2, extend, release and inspect each loop over [`Round::next`]
//! and decide in plain code when they have heard enough.
//!
//! ```text
//! let mut round = Round::send(nodes, &request, plan);    5 nodes, quorum 3
//! while undecided { round.next().await }                 node 2 ok, node 4 ok, node 1 ok -> decided
//! round.land().await                                     nodes 3 and 5 land in the background
//! ```
//!
//! At the deadline, every call still out is given up: the node is told
//! ([`Node::timed_out`]) and the call comes out of `next` as a [`NodeError::Timeout`].
//! A decided round's calls still out (its stragglers) either land in the background
//! ([`Round::land`], which tells when each has reached its node: see `crate::landing`),
//! or are dropped with the round: their connection then discards their late replies, and
//! a command not yet written is never sent.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("job:1").await?; // one round of SETs (two with fencing)
//! let _ = redlock.unlock(&lock).await; // one round of deletes
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use futures_util::task::AtomicWaker;
use redis::Value;

use crate::error::NodeError;
use crate::landing::{Landing, LandingState};
use crate::node::{Node, NodeCall, Quarantine, Sending, Whole};
use crate::quorum::NodeMask;
use crate::scripts::Request;

#[cfg(test)]
#[path = "round_tests.rs"]
mod tests;

/// Which nodes a round asks, until when, and what kind of round it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan<'a> {
    /// The nodes not to send to (every other node is asked).
    pub(crate) skip: NodeMask,
    /// When every call still out is given up.
    pub(crate) deadline: Instant,
    pub(crate) purpose: Purpose<'a>,
}

/// What a round is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Purpose<'a> {
    /// Acquire, fence or extend: decided at a quorum. Quarantined nodes fail at once, and
    /// the calls still out when the round is decided may [`land`](Round::land).
    Decide,
    /// Release, complete or inspect: every answer is awaited, quarantined nodes are asked
    /// too, and a node's call first waits for that node's call in the round `after` to
    /// land (so a delete cannot overtake a late `SET`).
    Everywhere { after: Option<&'a Landing> },
}

/// A call a round polls: a [`NodeCall`] (or, in tests, a fake one).
pub(crate) trait InFlight: Future<Output = Result<Value, NodeError>> + Unpin + Send {
    /// The node's position in the client's list.
    fn index(&self) -> usize;
    /// Whether the call takes steps of its own when polled (see
    /// [`NodeCall::takes_steps`]): it is polled with the round's own context, not the gate,
    /// since a wake-up between its steps is no answer and must not wait for other calls'.
    fn takes_steps(&self) -> bool;
    /// The call, sent at `sent_at`, got no answer before the round's deadline.
    fn timed_out(&self, sent_at: Instant);
    /// When its answer came in, if the call knows (once it is ready): the round counts an
    /// answer that came after its deadline as a timeout, however soon it is taken.
    fn arrived(&self) -> Option<Instant> {
        None
    }
}

impl InFlight for NodeCall {
    fn index(&self) -> usize {
        NodeCall::index(self)
    }

    fn takes_steps(&self) -> bool {
        NodeCall::takes_steps(self)
    }

    fn timed_out(&self, sent_at: Instant) {
        self.node().timed_out(sent_at);
    }

    fn arrived(&self) -> Option<Instant> {
        NodeCall::arrived(self)
    }
}

/// The nodes an operation sends its rounds to: the client's list of [`Node`]s, or, in the
/// operations' unit tests, fake nodes whose calls the test answers. Generic, so the real
/// path is the plain slice's code (no boxing, no dynamic call per round).
pub(crate) trait Nodes: Send + Sync {
    /// A call in flight on one of these nodes.
    type Call: InFlight + 'static;

    /// How many nodes there are.
    fn count(&self) -> usize;

    /// Node `i`'s label (`host:port`), for failures.
    fn label(&self, i: usize) -> &str;

    /// Sends `request` to the nodes of `plan` at once: the round of their calls.
    fn send(&self, request: &Request<'_>, plan: Plan<'_>) -> Round<Self::Call>;

    /// Node `i` did what was asked but refused the `PUBLISH` that tells the waiters
    /// (`message`): see [`Node::notifications_refused`].
    fn notifications_refused(&self, i: usize, message: &str);

    /// Since when node `i`'s data is whole, as its ledger says (see [`Whole`]): nodes that
    /// cannot tell are [`Whole::Unknown`].
    fn whole(&self, i: usize) -> Whole {
        let _ = i;
        Whole::Unknown
    }

    /// Waits for the connects under way, one node at a time as they settle, until `enough`
    /// says so or every connect is over.
    fn settle(&self, enough: impl Fn() -> bool + Send) -> impl Future<Output = ()> + Send;

    /// Raises every node's horizon to `ttl_ms` by `deadline` (see `node::loss::horizon`):
    /// each node's outcome, in order. Fake nodes take it at once.
    fn announce(
        &self,
        ttl_ms: u64,
        deadline: Instant,
    ) -> impl Future<Output = Vec<Result<(), NodeError>>> + Send {
        let _ = (ttl_ms, deadline);
        let took = (0..self.count()).map(|_| Ok(())).collect();
        std::future::ready(took)
    }
}

impl Nodes for [Arc<Node>] {
    type Call = NodeCall;

    fn count(&self) -> usize {
        self.len()
    }

    fn label(&self, i: usize) -> &str {
        self.get(i).map_or("?", |node| node.label())
    }

    fn send(&self, request: &Request<'_>, plan: Plan<'_>) -> Round {
        Round::send(self, request, plan)
    }

    fn notifications_refused(&self, i: usize, message: &str) {
        if let Some(node) = self.get(i) {
            node.notifications_refused(message);
        }
    }

    fn whole(&self, i: usize) -> Whole {
        self.get(i).map_or(Whole::Unknown, |node| node.whole())
    }

    async fn settle(&self, enough: impl Fn() -> bool + Send) {
        let mut settling: FuturesUnordered<_> = self.iter().map(|node| node.settle()).collect();
        while settling.next().await.is_some() {
            if enough() {
                return;
            }
        }
    }

    async fn announce(&self, ttl_ms: u64, deadline: Instant) -> Vec<Result<(), NodeError>> {
        let deadline = tokio::time::Instant::from_std(deadline);
        let each = self.iter().map(|node| async move {
            tokio::time::timeout_at(deadline, node.announce(ttl_ms))
                .await
                .unwrap_or(Err(NodeError::Timeout))
        });
        futures_util::future::join_all(each).await
    }
}

/// One command on several nodes, answered node by node (see the module docs).
pub(crate) struct Round<C = NodeCall> {
    /// The calls still out. There are at most a handful, so each wake-up polls every one:
    /// no allocation per call on the hot path.
    calls: Vec<C>,
    /// The nodes whose call was given up at the deadline, still to come out of `next`
    /// (the lowest index last).
    expired: Vec<usize>,
    deadline: Instant,
    /// When the calls were sent: a timeout counts against a node's connection only if
    /// the call went out after that connection was made.
    sent_at: Instant,
    /// With several calls: the waker they are polled with, which wakes the task that
    /// polls them only once `wake_after` of them have news.
    gate: Option<(Arc<Gate>, Waker)>,
    wake_after: usize,
    /// A deciding round's landing: which calls have put their command on their node's
    /// connection.
    landing: Option<Arc<LandingState>>,
}

impl Round {
    /// Sends `request` to the nodes of `plan`, all at once. To one node, the caller
    /// writes the command itself on an idle connection; to several, their connections'
    /// tasks write it side by side.
    pub(crate) fn send(nodes: &[Arc<Node>], request: &Request<'_>, plan: Plan<'_>) -> Self {
        let Plan {
            skip,
            deadline,
            purpose,
        } = plan;
        let (quarantine, after) = match purpose {
            Purpose::Decide => (Quarantine::Applies, None),
            Purpose::Everywhere { after } => (Quarantine::Ignored, after),
        };
        // A deciding round's stragglers land in the background.
        let landing = (quarantine == Quarantine::Applies)
            .then(|| LandingState::new(NodeMask::matching(nodes.len(), |i| !skip.contains(i))));
        let now = crate::clock::now();
        let sending = Sending {
            quarantine,
            nodes: nodes.len().saturating_sub(skip.len()),
            deadline,
            now,
            after: after.filter(|after| !after.is_done()),
            marks: landing.as_ref(),
        };
        let call = Arc::new(request.call());
        let calls = nodes
            .iter()
            .filter(|node| !skip.contains(node.index()))
            .map(|node| NodeCall::start(node, &call, &sending))
            .collect();
        Self::of(calls, deadline, landing, now)
    }
}

impl<C: InFlight + 'static> Round<C> {
    /// The round of `calls`, sent at `sent_at` and given up at `deadline`; `landing`
    /// tracks their landing.
    pub(crate) fn of(
        calls: Vec<C>,
        deadline: Instant,
        landing: Option<Arc<LandingState>>,
        sent_at: Instant,
    ) -> Self {
        let gate = (calls.len() > 1).then(|| {
            let gate = Arc::new(Gate::default());
            let waker = Waker::from(Arc::clone(&gate));
            (gate, waker)
        });
        Self {
            calls,
            expired: Vec::new(),
            deadline,
            sent_at,
            gate,
            wake_after: 1,
            landing,
        }
    }

    /// The next answer, with its node's index, as answers come: a call given up at the
    /// deadline answers [`NodeError::Timeout`]. `None` once every call has answered.
    pub(crate) async fn next(&mut self) -> Option<(usize, Result<Value, NodeError>)> {
        if let Some(i) = self.expired.pop() {
            return Some((i, Err(NodeError::Timeout)));
        }
        if self.calls.is_empty() {
            return None;
        }
        let deadline = tokio::time::Instant::from_std(self.deadline);
        let answer = std::future::poll_fn(|cx| self.poll_calls(cx));
        if let Ok(answer) = tokio::time::timeout_at(deadline, answer).await {
            return Some(self.as_of_deadline(answer));
        }
        // Every call still out failed: it got no answer in time.
        let mut calls = std::mem::take(&mut self.calls);
        calls.sort_by_key(|call| std::cmp::Reverse(call.index()));
        for call in calls {
            call.timed_out(self.sent_at);
            self.expired.push(call.index());
        }
        self.expired.pop().map(|i| (i, Err(NodeError::Timeout)))
    }

    /// The answers already in, without waiting: polls every call still out once (so each
    /// has handed its command to its node's connection, unless it waits for a connection
    /// or a landing), and yields an answer if one is ready.
    pub(crate) async fn ready(&mut self) -> Option<(usize, Result<Value, NodeError>)> {
        if let Some(i) = self.expired.pop() {
            return Some((i, Err(NodeError::Timeout)));
        }
        std::future::poll_fn(|cx| match self.poll_calls(cx) {
            Poll::Ready(answer) => Poll::Ready(Some(self.as_of_deadline(answer))),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }

    /// An answer as the round counts it: one that came in after the deadline (its call
    /// stamps when it came, see [`InFlight::arrived`]) is a timeout, however soon the task
    /// takes it: a grant after the node timeout never counts. So is a connection that
    /// broke once the deadline had passed (closed after other calls' timeouts, say). An
    /// answer whose call cannot tell when it came counts as it is when taken, also just
    /// after the deadline: the gate wakes the task once enough calls have news, so an
    /// answer taken late may have come in time.
    fn as_of_deadline(
        &self,
        (i, answer, arrived): (usize, Result<Value, NodeError>, Option<Instant>),
    ) -> (usize, Result<Value, NodeError>) {
        match answer {
            _ if arrived.is_some_and(|at| at > self.deadline) => (i, Err(NodeError::Timeout)),
            Err(e) if e.breaks_connection() && crate::clock::now() >= self.deadline => {
                (i, Err(NodeError::Timeout))
            }
            answer => (i, answer),
        }
    }

    /// Wakes the polling task only once `n` calls have news (at least 1): fewer answers
    /// cannot change what the operation decides.
    pub(crate) fn wake_after(&mut self, n: usize) {
        self.wake_after = n.max(1);
    }

    /// How many calls are still out.
    pub(crate) fn out(&self) -> usize {
        self.calls.len() + self.expired.len()
    }

    /// Lets the calls still out finish in the background, so what the round wrote lands
    /// on every node that answers in time; the [`Landing`] tells when each node's call is
    /// done. `None` when no call is still out (or the round does not track landings).
    pub(crate) async fn land(mut self) -> Option<Landing> {
        // The calls that answered by now (their replies often come in the same read) need
        // no task to see them land.
        while self.ready().await.is_some() {}
        let landing = self.landing.take()?;
        if self.calls.is_empty() {
            return None;
        }
        let mut out = NodeMask::default();
        for call in &self.calls {
            out.insert(call.index());
        }
        landing.keep_only(out);
        let marks = Arc::clone(&landing);
        // Each answer may let a release waiting for its node's landing go.
        self.wake_after(1);
        let drain = async move {
            while let Some((i, _)) = self.next().await {
                marks.done(i);
            }
            marks.done_all();
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(drain)),
            Err(_) => landing.done_all(),
        }
        Some(Landing::of(landing))
    }

    /// Polls every call until one has its answer: takes it out and returns it. Calls whose
    /// answer is all that is to come are polled with the gate's waker; a call that takes
    /// steps of its own is polled with `cx`: each of its steps goes on at once (a
    /// follow-up command is sent as soon as the first reply is in, not when other calls
    /// have news: with a silent node in a replay round, that would be at the deadline, and
    /// a record on the node that needed the follow-up unheard), and a release's answer
    /// hands its node's turn on at once (the releases queued behind it may be what other
    /// rounds wait for).
    fn poll_calls(&mut self, cx: &mut Context<'_>) -> Poll<Answer> {
        let mut gated = self.gate.as_ref().map(|(gate, waker)| {
            // Count from here, before looking at any call: news that comes while they are
            // polled is either seen now or counted.
            let after = isize::try_from(self.wake_after).unwrap_or(isize::MAX);
            gate.left.store(after, Ordering::Release);
            gate.task.register(cx.waker());
            Context::from_waker(waker)
        });
        let mut k = 0;
        while let Some(call) = self.calls.get_mut(k) {
            let answer = match gated.as_mut() {
                Some(gated) if !call.takes_steps() => std::pin::Pin::new(&mut *call).poll(gated),
                _ => std::pin::Pin::new(&mut *call).poll(cx),
            };
            if let Poll::Ready(answer) = answer {
                let call = self.calls.swap_remove(k);
                return Poll::Ready((call.index(), answer, call.arrived()));
            }
            k += 1;
        }
        Poll::Pending
    }
}

/// A call's answer as polled: its node, the answer, and when it came in (if the call
/// knows).
type Answer = (usize, Result<Value, NodeError>, Option<Instant>);

/// Counts the wake-ups of a round's calls and passes one on to the round's task once
/// enough have come: with 5 nodes, an acquisition's task wakes when 3 nodes answered,
/// not at each answer. A call that wakes without an answer (say, once connected) counts
/// too, which only wakes the task early.
#[derive(Default)]
struct Gate {
    /// Wake-ups still to come before the task is woken (at or below 1: at the next).
    left: AtomicIsize,
    task: AtomicWaker,
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.left.fetch_sub(1, Ordering::AcqRel) <= 1 {
            self.task.wake();
        }
    }
}
