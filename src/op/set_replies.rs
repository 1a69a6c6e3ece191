//! What the `SET NX PX` replies of one acquire attempt said, node by node: who holds the
//! key elsewhere (and for how long), the completion records found, and what phase 1 of
//! fencing learned.
//!
//! ```text
//! OK / [OK, ZADD]            -> granted (phase 1 takes the ZADD's answer; doubted when the
//!                               node may have lost writes, for a replay acquisition)
//! nil + PTTL, another value  -> held elsewhere (foreign; retry after the longest PTTL)
//! "#record..."               -> a completion record (foreign: no release there)
//! ```

use std::time::Duration;

use redis::Value;

use crate::error::NodeError;
use crate::fencing::PhaseOne;
use crate::node::Doubts;
use crate::quorum::{NodeMask, Outcome};
use crate::scripts::{AcquireReply, parse_acquire};

/// What the `SET NX PX` replies of one attempt said, node by node.
pub(super) struct SetReplies {
    /// The nodes that answered that another client holds the key.
    pub(super) foreign: NodeMask,
    /// The nodes that granted the lock.
    pub(super) granted: NodeMask,
    /// What a replay acquisition doubts of each node (`None`: a lock-only acquisition).
    pub(super) doubts: Option<Doubts>,
    /// Whether a node that granted is doubted: the round then hears every node, since
    /// another's record for the name is what makes the doubt count.
    pub(super) doubted: bool,
    /// The completion records found, one per node that answered with one.
    pub(super) records: Vec<Vec<u8>>,
    /// The longest remaining TTL of another holder's keys.
    pub(super) retry_after: Option<Duration>,
    /// Whether some node holds the key with another client's value (not this client's).
    pub(super) held_by_others: bool,
    pub(super) fencing: PhaseOne,
}

impl SetReplies {
    /// No reply yet, to an attempt that proposes `proposal` as its fencing number, with
    /// `doubts` for a replay acquisition.
    pub(super) fn new(proposal: u64, doubts: Option<Doubts>) -> Self {
        Self {
            foreign: NodeMask::default(),
            granted: NodeMask::default(),
            doubts,
            doubted: false,
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
        let outcome = self.fencing.take(i, parsed.as_ref().ok());
        match parsed? {
            AcquireReply::Won { .. } => {
                self.granted.insert(i);
                self.doubted |= self.doubts.as_ref().is_some_and(|d| d.doubted(i));
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
