//! One invocation sent to every node at once: the early decision and the per-node failures.
//!
//! A round sends the same script call to the nodes it is given, all at once, each call
//! bounded by the round's deadline, and counts the answers as they come. It stops as soon
//! as the outcome is certain (a quorum granted, or too many refused or failed), except that
//! a failure is awaited further while it is undecided whether it is "busy" or "short of
//! nodes", so the error can say which. Calls still in flight when the round stops are
//! dropped; the multiplexer discards their late replies.
//!
//! ```text
//! 5 nodes, quorum 3:   node 2 ok, node 4 ok, node 1 ok  ->  Reached (nodes 3 and 5 not awaited)
//!                      node 2 busy, node 4 timeout, node 1 busy  ->  Impossible
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::Value;

use crate::error::{Failure, NodeError, NodeFailure};
use crate::node::Node;
use crate::quorum::{Decision, NodeMask, Outcome, Tally};
use crate::scripts::Request;

/// What a round of node calls came to.
#[derive(Debug)]
pub(crate) struct Round {
    pub(crate) tally: Tally,
    /// The nodes that failed (and were awaited), with their causes.
    pub(crate) failures: Vec<NodeFailure>,
}

impl Round {
    /// Whether a quorum granted.
    pub(crate) fn reached(&self) -> bool {
        self.tally.decision() == Decision::Reached
    }

    /// The failure of a round that did not reach its quorum because nodes failed.
    pub(crate) fn no_quorum(self) -> Failure {
        Failure::NoQuorum {
            needed: self.tally.quorum(),
            reached: self.tally.successes(),
            held_elsewhere: self.tally.held_elsewhere(),
            failures: self.failures,
        }
    }
}

/// Sends `request` to the nodes whose index `to` accepts, all at once; the answers arrive as
/// they come, with the node's index. With `acquiring` (acquire, fence, extend), quarantined
/// nodes fail at once; releases go to them too.
fn send<'a>(
    nodes: &'a [Arc<Node>],
    request: &'a Request<'a>,
    cmd: &'a redis::Cmd,
    deadline: Instant,
    to: impl Fn(usize) -> bool,
    acquiring: bool,
) -> FuturesUnordered<impl Future<Output = (usize, &'a Arc<Node>, Result<Value, NodeError>)> + 'a> {
    nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| to(*i))
        .map(move |(i, node)| async move {
            (i, node, node.call(request, cmd, deadline, acquiring).await)
        })
        .collect()
}

/// A round of `request` (an acquire, fence or extend) on the nodes whose index `to` accepts
/// (the others count as failed), until the outcome is certain. `on_reply` turns each
/// node's answer into its outcome, or into the error listed for that node.
pub(crate) async fn decide<F>(
    nodes: &[Arc<Node>],
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
    nodes: &[Arc<Node>],
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
    };
    for _ in (0..nodes.len()).filter(|i| !to(*i)) {
        round.tally.record_outcome(Outcome::Failed);
    }
    let cmd = request.cmd();
    let mut calls = send(nodes, request, &cmd, deadline, to, true);
    while round.tally.decision() == Decision::Pending || round.tally.busy_undecided() || wait_all()
    {
        let Some((i, node, reply)) = calls.next().await else {
            break;
        };
        let outcome = on_reply(i, reply).unwrap_or_else(|error| {
            round.failures.push(NodeFailure::new(node.label(), error));
            Outcome::Failed
        });
        round.tally.record_outcome(outcome);
    }
    round
}

/// `request` (a release) on every node not in `skip`, quarantined ones included, awaiting
/// every answer (each bounded by `deadline`); `on_reply` takes each answer. Returns the
/// nodes that failed.
pub(crate) async fn everywhere<F>(
    nodes: &[Arc<Node>],
    request: &Request<'_>,
    deadline: Instant,
    skip: NodeMask,
    mut on_reply: F,
) -> Vec<NodeFailure>
where
    F: FnMut(Value) -> Result<(), NodeError>,
{
    let cmd = request.cmd();
    let mut calls = send(nodes, request, &cmd, deadline, |i| !skip.contains(i), false);
    let mut failures = Vec::new();
    while let Some((_, node, reply)) = calls.next().await {
        if let Err(error) = reply.and_then(&mut on_reply) {
            failures.push(NodeFailure::new(node.label(), error));
        }
    }
    failures
}
