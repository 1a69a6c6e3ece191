//! One invocation sent to every node at once: the early decision and the per-node failures.
//!
//! A round sends the same script call to the nodes it is given, all at once, each call
//! bounded by the round's deadline, and counts the answers as they come. It stops as soon
//! as the outcome is certain (a quorum granted, or too many refused or failed), except that
//! a failure is awaited further while it is undecided whether it is "busy" or "short of
//! nodes", so the error can say which. Calls still in flight when the round stops are
//! left to land in the background ([`Stragglers`]), or dropped: their connection then
//! discards their late replies.
//!
//! ```text
//! 5 nodes, quorum 3:   node 2 ok, node 4 ok, node 1 ok  ->  Reached (nodes 3 and 5 not awaited)
//!                      node 2 busy, node 4 timeout, node 1 busy  ->  Impossible
//! ```

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::task::{Context, Poll, Wake, Waker, ready};
use std::time::Instant;

use futures_util::future::BoxFuture;
use futures_util::task::AtomicWaker;
use futures_util::{Stream, StreamExt};
use redis::Value;

use crate::error::{LockError, NodeError, NodeFailure};
use crate::landing::{Landing, LandingState};
use crate::node::{Answer, Node, Sending, Start, Started, Waiting, Writes};
use crate::quorum::{Decision, NodeMask, Outcome, Tally};
use crate::scripts::{Call, Request};

/// What a round of node calls came to.
#[derive(Debug)]
pub(crate) struct Round {
    pub(crate) tally: Tally,
    /// The nodes that failed (and were awaited), with their causes.
    pub(crate) failures: Vec<NodeFailure>,
    /// The calls still in flight when the outcome was certain.
    pub(crate) stragglers: Option<Stragglers>,
}

impl Round {
    /// Whether a quorum granted.
    pub(crate) fn reached(&self) -> bool {
        self.tally.decision() == Decision::Reached
    }

    /// The failure of a round that did not reach its quorum because nodes failed.
    pub(crate) fn no_quorum(self) -> LockError {
        LockError::NoQuorum {
            needed: self.tally.quorum(),
            reached: self.tally.successes(),
            held_elsewhere: self.tally.held_elsewhere(),
            failures: self.failures,
            attempts: 1,
        }
    }
}

/// A round's calls still in flight when its outcome was certain (each bounded by the
/// round's deadline). Dropping them abandons them: a call not yet written to its
/// connection is then never sent.
pub(crate) struct Stragglers {
    /// Drives the calls, marking each node done in `state` as its call ends.
    drain: BoxFuture<'static, ()>,
    state: Arc<LandingState>,
}

impl std::fmt::Debug for Stragglers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stragglers")
            .field("nodes", &self.state.pending().len())
            .finish()
    }
}

impl Stragglers {
    /// The calls in `calls`, to the nodes in `pending` of `nodes`, bounded by `deadline`
    /// (one timer for all of them); `state` already knows the calls whose command is on
    /// its node's connection.
    fn new(
        mut calls: Calls,
        nodes: &Arc<[Arc<Node>]>,
        pending: NodeMask,
        state: Arc<LandingState>,
        deadline: Instant,
    ) -> Self {
        state.keep_only(pending);
        let marks = Arc::clone(&state);
        let nodes = Arc::clone(nodes);
        // Each answer may let a release waiting for its node's landing go.
        calls.wake_after(1);
        let drain = Box::pin(async move {
            // The nodes whose call has not answered (landed or not: a call on the node's
            // own connection lands when sent, and may still get no answer in time).
            let mut out = pending;
            let timer = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
            tokio::pin!(timer);
            loop {
                tokio::select! {
                    biased;
                    call = calls.next() => match call {
                        Some((i, _)) => {
                            out.remove(i);
                            marks.done(i);
                        }
                        None => break,
                    },
                    () = &mut timer => {
                        for i in (0..nodes.len()).filter(|i| out.contains(*i)) {
                            nodes[i].timed_out(calls.sent_at);
                        }
                        break;
                    }
                }
            }
            marks.done_all();
        });
        Self { drain, state }
    }

    /// Lets the calls finish in the background, so what the round wrote lands on every
    /// node that answers in time. The [`Landing`] tells when each node's call is done.
    pub(crate) fn land(self) -> Landing {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.drain);
            }
            Err(_) => self.state.done_all(),
        }
        Landing::of(self.state)
    }
}

/// How a round sends its command.
struct Plan<'a> {
    /// Acquire, fence and extend: quarantined nodes fail at once; releases go to them too.
    acquiring: bool,
    /// The round's deadline, for all its calls.
    deadline: Instant,
    /// A node's call first waits for that node's call in this earlier round to land.
    after: Option<&'a Landing>,
    /// Where to mark each node whose call is on its connection (for this round's landing).
    landing: Option<&'a Arc<LandingState>>,
}

/// Sends `request` to the nodes whose index `to` accepts, all at once, as `plan` says; the
/// answers arrive as they come, with the node's index. The calls have no time limit of
/// their own: the caller bounds them all by the plan's deadline with one timer. They own
/// what they need, so they can outlive the round.
fn send(
    nodes: &[Arc<Node>],
    request: &Request<'_>,
    to: impl Fn(usize) -> bool,
    plan: Plan<'_>,
) -> Calls {
    let Plan {
        acquiring,
        deadline,
        after,
        landing,
    } = plan;
    // To one node, the caller writes the command itself on an idle connection; to several,
    // their connections' tasks write it side by side.
    let writes = if (0..nodes.len()).filter(|i| to(*i)).count() == 1 {
        Writes::Caller
    } else {
        Writes::Task
    };
    let sending = Sending {
        acquiring,
        writes,
        deadline,
    };
    let call = Arc::new(request.call());
    let after = after.filter(|l| !l.is_done());
    let mut pending = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate().filter(|(i, _)| to(*i)) {
        let waits = after.is_some_and(|after| !after.has_landed(i));
        // The hot path: sent now on the node's ready connection (or queued for its batch).
        let start = if waits {
            None
        } else {
            node.start(&call, sending)
        };
        match start {
            Some(Start::Sent(started)) => {
                if let Some(landing) = landing {
                    landing.sent(i);
                }
                pending.push((i, Pending::Started(started)));
                continue;
            }
            Some(Start::Queued(waiting)) => {
                pending.push((i, Pending::Queued(waiting)));
                continue;
            }
            None => {}
        }
        let (node, call) = (Arc::clone(node), Arc::clone(&call));
        let after = after.filter(|_| waits).cloned();
        let landing = landing.cloned();
        let running = Box::pin(async move {
            if let Some(after) = after {
                after.wait(i, deadline).await;
            }
            let on_sent = || {
                if let Some(landing) = &landing {
                    landing.sent(i);
                }
            };
            node.call(&call, sending, on_sent).await
        });
        pending.push((i, Pending::Running(running)));
    }
    let gate = (pending.len() > 1).then(|| {
        let gate = Arc::new(Gate::default());
        let waker = Waker::from(Arc::clone(&gate));
        (gate, waker)
    });
    Calls {
        call,
        pending,
        gate,
        wake_after: 1,
        sent_at: Instant::now(),
    }
}

/// A round's calls to its nodes, each answering once, in the order they come. There are
/// at most a handful, so each wake-up polls every call still out: no allocation per call
/// on the hot path.
pub(crate) struct Calls {
    /// The call every node got.
    call: Arc<Call>,
    /// When the calls were sent: a timeout counts against a node's connection only if
    /// the call went out after that connection was made.
    sent_at: Instant,
    /// The calls still out, with their node's index.
    pending: Vec<(usize, Pending)>,
    /// With several calls: the waker they are polled with, which wakes the task that
    /// polls them only once `wake_after` of them have news.
    gate: Option<(Arc<Gate>, Waker)>,
    /// How many calls must have news before the polling task is woken (see `Gate`).
    wake_after: usize,
}

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

/// One node's call.
enum Pending {
    /// Sent at once on the node's own connection (the hot path).
    Started(Started),
    /// A release queued for its node's next batch.
    Queued(Waiting),
    /// Anything else: waiting for a connection, an earlier call's landing or a batch of
    /// releases, a redis-rs connection, or a follow-up command.
    Running(BoxFuture<'static, Result<Value, NodeError>>),
}

impl Calls {
    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Wakes the polling task only once `n` calls have news (at least 1): fewer answers
    /// cannot change what it decides.
    fn wake_after(&mut self, n: usize) {
        self.wake_after = n.max(1);
    }
}

impl Stream for Calls {
    type Item = (usize, Result<Value, NodeError>);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.pending.is_empty() {
            return Poll::Ready(None);
        }
        match &this.gate {
            Some((gate, waker)) => {
                // Count from here, before looking at any call: news that comes while they
                // are polled is either seen now or counted.
                let after = isize::try_from(this.wake_after).unwrap_or(isize::MAX);
                gate.left.store(after, Ordering::Release);
                gate.task.register(cx.waker());
                let mut gated = Context::from_waker(waker);
                poll_pending(&mut this.pending, &this.call, cx, Some(&mut gated))
            }
            None => poll_pending(&mut this.pending, &this.call, cx, None),
        }
        .map(Some)
    }
}

/// Polls every call in `pending` until one has its answer: takes it out and returns it.
/// A call polled with `gated` wakes the task through the gate; one that may hold its
/// node's release turn until it is polled (a release not on our own connection, whose
/// reader hands the turn on by itself) is polled with `cx`, so that its answer hands the
/// turn on at once (the releases queued behind it may be what other rounds wait for).
fn poll_pending(
    pending: &mut Vec<(usize, Pending)>,
    call: &Arc<Call>,
    cx: &mut Context<'_>,
    mut gated: Option<&mut Context<'_>>,
) -> Poll<(usize, Result<Value, NodeError>)> {
    let mut k = 0;
    while let Some((_, entry)) = pending.get_mut(k) {
        let answer = match gated.as_deref_mut() {
            Some(gated) if !entry.holds_turn(call) => entry.poll(call, gated),
            _ => entry.poll(call, cx),
        };
        if let Poll::Ready(answer) = answer {
            let (i, _) = pending.swap_remove(k);
            return Poll::Ready((i, answer));
        }
        k += 1;
    }
    Poll::Pending
}

impl Pending {
    /// Whether the call may hold its node's release turn until it is polled: a release
    /// still running (waiting for a connection, or on a redis-rs connection). A started
    /// call's turn is handed on by its connection as the answer is read.
    fn holds_turn(&self, call: &Call) -> bool {
        matches!(self, Self::Running(_)) && call.is_release()
    }

    fn poll(&mut self, call: &Arc<Call>, cx: &mut Context<'_>) -> Poll<Result<Value, NodeError>> {
        match self {
            Self::Started(started) => match ready!(started.poll_answer(call, cx)) {
                Answer::Done(answer) => Poll::Ready(answer),
                Answer::More(more) => {
                    // Polled again at once, as the follow-up it now is.
                    *self = Self::Running(more);
                    self.poll(call, cx)
                }
            },
            Self::Queued(waiting) => Pin::new(waiting).poll(cx),
            Self::Running(running) => running.as_mut().poll(cx),
        }
    }
}

/// A round of `request` (an acquire, fence or extend) on the nodes whose index `to` accepts
/// (the others count as failed), until the outcome is certain. `on_reply` turns each
/// node's answer into its outcome, or into the error listed for that node.
pub(crate) async fn decide<F>(
    nodes: &Arc<[Arc<Node>]>,
    request: &Request<'_>,
    deadline: Instant,
    to: impl Fn(usize) -> bool,
    on_reply: F,
) -> Round
where
    F: FnMut(usize, Result<Value, NodeError>) -> Result<Outcome, NodeError>,
{
    decide_or_wait(nodes, request, deadline, to, on_reply, || false).await
}

/// Like [`decide`], but awaits every answer once `wait_all` says so (for a round whose
/// outcome needs to know every node, such as one that found a completion record).
pub(crate) async fn decide_or_wait<F>(
    nodes: &Arc<[Arc<Node>]>,
    request: &Request<'_>,
    deadline: Instant,
    to: impl Fn(usize) -> bool,
    mut on_reply: F,
    wait_all: impl Fn() -> bool,
) -> Round
where
    F: FnMut(usize, Result<Value, NodeError>) -> Result<Outcome, NodeError>,
{
    let mut round = Round {
        tally: Tally::new(nodes.len()),
        failures: Vec::new(),
        stragglers: None,
    };
    for _ in (0..nodes.len()).filter(|i| !to(*i)) {
        round.tally.record_outcome(Outcome::Failed);
    }
    let mut sent = NodeMask::matching(nodes.len(), &to);
    // Node `i`'s answer: its outcome, or its failure.
    let mut record = |round: &mut Round, i: usize, reply| {
        let outcome = on_reply(i, reply).unwrap_or_else(|error| {
            round
                .failures
                .push(NodeFailure::new(nodes[i].label(), error));
            Outcome::Failed
        });
        round.tally.record_outcome(outcome);
    };
    // Which calls have put their command on their connection, for the stragglers' landing.
    let landing = LandingState::new(sent);
    let plan = Plan {
        acquiring: true,
        deadline,
        after: None,
        landing: Some(&landing),
    };
    let mut calls = send(nodes, request, to, plan);
    let timer = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
    tokio::pin!(timer);
    while round.tally.decision() == Decision::Pending || round.tally.busy_undecided() || wait_all()
    {
        calls.wake_after(round.tally.outcomes_to_decide());
        let (i, reply) = tokio::select! {
            biased;
            answer = calls.next() => match answer {
                Some(answer) => answer,
                None => break,
            },
            () = &mut timer => {
                // Every call still out failed: it got no answer in time.
                for i in (0..nodes.len()).filter(|i| sent.contains(*i)) {
                    nodes[i].timed_out(calls.sent_at);
                    record(&mut round, i, Err(NodeError::Timeout));
                }
                return round;
            }
        };
        sent.remove(i);
        record(&mut round, i, reply);
    }
    // The calls that answered by now (their replies often come in the same read) need no
    // task to see them land.
    std::future::poll_fn(|cx| {
        while let Poll::Ready(Some((i, _))) = calls.poll_next_unpin(cx) {
            sent.remove(i);
        }
        Poll::Ready(())
    })
    .await;
    if !calls.is_empty() {
        round.stragglers = Some(Stragglers::new(calls, nodes, sent, landing, deadline));
    }
    round
}

/// `request` (a release) on every node not in `skip`, quarantined ones included, awaiting
/// every answer (each bounded by `deadline`); `on_reply` takes each answer with its node's
/// index. On a node where
/// the acquisition's call is still `landing`, the request waits for it. `on_sent` runs
/// once every call has been polled, so each has handed its command to its node's
/// connection unless it waits (for a connection, or for `landing`): a command this client
/// sends to a node afterwards runs after it there. Returns the nodes that failed.
pub(crate) async fn everywhere<F>(
    nodes: &[Arc<Node>],
    request: &Request<'_>,
    deadline: Instant,
    skip: NodeMask,
    landing: Option<&Landing>,
    mut on_reply: F,
    on_sent: impl FnOnce(),
) -> Vec<NodeFailure>
where
    F: FnMut(usize, Value) -> Result<(), NodeError>,
{
    let plan = Plan {
        acquiring: false,
        deadline,
        after: landing,
        landing: None,
    };
    let mut calls = send(nodes, request, |i| !skip.contains(i), plan);
    let mut failures = Vec::new();
    // The nodes whose answer is still out.
    let mut out = NodeMask::matching(nodes.len(), |i| !skip.contains(i));
    let mut take = |i: usize, reply: Result<Value, NodeError>| {
        if let Err(error) = reply.and_then(|reply| on_reply(i, reply)) {
            failures.push(NodeFailure::new(nodes[i].label(), error));
        }
    };
    // Poll until every call has been polled once: `Calls` polls every call still out
    // before it reports pending (the hot-path calls were sent by `send` already).
    std::future::poll_fn(|cx| {
        while let Poll::Ready(Some((i, reply))) = calls.poll_next_unpin(cx) {
            out.remove(i);
            take(i, reply);
        }
        Poll::Ready(())
    })
    .await;
    on_sent();
    let timer = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
    tokio::pin!(timer);
    loop {
        // Every answer is needed: look again once all are in (or at the deadline).
        calls.wake_after(out.len());
        tokio::select! {
            biased;
            answer = calls.next() => match answer {
                Some((i, reply)) => {
                    out.remove(i);
                    take(i, reply);
                }
                None => break,
            },
            () = &mut timer => {
                // Every call still out failed: it got no answer in time.
                for i in (0..nodes.len()).filter(|i| out.contains(*i)) {
                    nodes[i].timed_out(calls.sent_at);
                    take(i, Err(NodeError::Timeout));
                }
                break;
            }
        }
    }
    failures
}
