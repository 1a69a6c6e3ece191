//! What the `SET NX PX` replies of one acquire attempt said, node by node: who holds the
//! key elsewhere (and for how long), the completion records found, and what phase 1 of
//! fencing learned; the round's answers taken until the outcome is certain, and the record
//! a quorum agrees on.
//!
//! ```text
//! OK / [OK, ZADD]            -> granted (phase 1 takes the ZADD's answer; doubted when the
//!                               node may have lost writes, for a replay acquisition)
//! nil + PTTL, another value  -> held elsewhere (foreign; retry after the longest PTTL)
//! "#record..."               -> a completion record (foreign: no release there)
//! refused: quarantined       -> kept out (a replay acquisition may read its record)
//! ```

use std::future::Future;
use std::time::Duration;

use redis::Value;

use crate::error::NodeError;
use crate::fencing::PhaseOne;
use crate::quorum::{NodeMask, Outcome};
use crate::round::{Nodes, Round};
use crate::scripts::{AcquireReply, parse_acquire};
use crate::votes::Votes;

/// What the `SET NX PX` replies of one attempt said, node by node.
pub(super) struct SetReplies {
    /// The nodes that answered that another client holds the key.
    pub(super) foreign: NodeMask,
    /// The nodes that granted the lock.
    pub(super) granted: NodeMask,
    /// The nodes the restart quarantine kept out (refused at once: never asked).
    pub(super) kept_out: NodeMask,
    /// A replay acquisition: a record on any node is the key's answer, so every answer
    /// by the deadline counts.
    pub(super) replay: bool,
    /// The completion records found, one per node that answered with one.
    pub(super) records: Vec<Vec<u8>>,
    /// The longest remaining TTL of another holder's keys.
    pub(super) retry_after: Option<Duration>,
    /// Whether some node holds the key with another client's value (not this client's).
    pub(super) held_by_others: bool,
    pub(super) fencing: PhaseOne,
}

impl SetReplies {
    /// No reply yet, to an attempt that proposes `proposal` as its fencing number
    /// (`replay`: a replay acquisition's).
    pub(super) fn new(proposal: u64, replay: bool) -> Self {
        Self {
            foreign: NodeMask::default(),
            granted: NodeMask::default(),
            kept_out: NodeMask::default(),
            replay,
            records: Vec::new(),
            retry_after: None,
            held_by_others: false,
            fencing: PhaseOne::new(proposal),
        }
    }

    /// Takes node `i`'s reply: what it means for the quorum, or why the node failed.
    pub(super) fn take(
        &mut self,
        i: usize,
        reply: Result<Value, NodeError>,
    ) -> Result<Outcome, NodeError> {
        let parsed = reply.and_then(parse_acquire);
        if let Err(NodeError::Quarantined { .. }) = &parsed {
            self.kept_out.insert(i);
        }
        let outcome = self.fencing.take(i, parsed.as_ref().ok());
        match parsed? {
            AcquireReply::Won { .. } => {
                self.granted.insert(i);
            }
            AcquireReply::HeldElsewhere { pttl, ours } => {
                self.retry_after = self.retry_after.max(pttl);
                self.held_by_others |= !ours;
                self.foreign.insert(i);
            }
            AcquireReply::Record(r) => {
                self.records.push(r);
                self.foreign.insert(i);
            }
        }
        Ok(outcome)
    }
}

/// Takes the answers of a `SET NX PX` round until the outcome is certain; for a replay
/// acquisition, every answer by the round's deadline, since a record on any node is the
/// key's answer (restored onto the nodes that granted), and a doubted node counts only
/// next to the others' records (the nodes that answered with a record need no release
/// afterwards).
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments and their moved copies side by side"
)]
pub(super) fn count_set_round<N: Nodes + ?Sized>(
    nodes: &N,
    mut round: Round<N::Call>,
    mut replies: SetReplies,
) -> impl Future<Output = (Round<N::Call>, Votes, SetReplies)> {
    // Not an `async fn`: one would keep the round and the replies twice, as its arguments
    // and as the locals they are moved into (300 bytes more in every acquisition's future).
    async move {
        let mut votes = Votes::new(nodes.count());
        let replay = replies.replay;
        while replay || votes.undecided() {
            round.wake_after(if replay {
                round.out()
            } else {
                votes.to_decide()
            });
            let Some((i, reply)) = round.next().await else {
                break;
            };
            let outcome = replies.take(i, reply);
            votes.count(nodes.label(i), outcome);
        }
        if !votes.reached() && votes.quarantined() {
            // A quarantined node refuses at once: count the refusals already in, so that the
            // error names every quarantined node, not only those that decided the round.
            while let Some((i, reply)) = round.ready().await {
                let outcome = replies.take(i, reply);
                votes.count(nodes.label(i), outcome);
            }
        }
        (round, votes, replies)
    }
}

/// The record that at least `quorum` of `records` (one per node) are, byte for byte: the
/// one to replay (taken out of `records`). Records on fewer nodes are replayed only once
/// restored onto a quorum ([`only_record`]); records that differ (two runs that each
/// recorded on a minority, such as a handler that outlived its lock next to the next
/// holder's) never are: those nodes count as held by another client.
pub(super) fn agreed_record(records: &mut Vec<Vec<u8>>, quorum: usize) -> Option<Vec<u8>> {
    let at = records
        .iter()
        .position(|r| records.iter().filter(|other| *other == r).count() >= quorum)?;
    Some(records.swap_remove(at))
}

/// The one record all of `records` are, byte for byte, if there is at least one and they
/// do not differ.
pub(super) fn only_record(records: &[Vec<u8>]) -> Option<Vec<u8>> {
    let first = records.first()?;
    records.iter().all(|r| r == first).then(|| first.clone())
}
