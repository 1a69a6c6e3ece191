#![doc = include_str!("../docs/fencing.md")]

use std::sync::Arc;
use std::time::Instant;

use crate::error::{LockError, NodeError};
use crate::node::Node;
use crate::quorum::{NodeMask, Outcome};
use crate::round::{Plan, Purpose, Round};
use crate::scripts::{Arg, FENCE_SCRIPT, FenceRead, Invocation, Request, parse_flag};
use crate::votes::Votes;

/// What phase 1 learned across the nodes of one attempt: the highest counter among the
/// nodes that granted, and the nodes that did not (phase 2 skips them: the lock is not
/// ours there).
#[derive(Debug, Default)]
pub(crate) struct PhaseOne {
    highest: u64,
    pub(crate) refused: NodeMask,
}

impl PhaseOne {
    /// Takes a granting node's read: its counter, seeded from its clock when the counter
    /// is missing or behind the clock (a lost counter; see the module docs).
    pub(crate) fn granted(&mut self, read: FenceRead) -> Result<(), NodeError> {
        let seeded = read.counter.unwrap_or(0).max(read.clock_us);
        if seeded == u64::MAX {
            return Err(NodeError::Protocol(
                "the fencing counter is at its maximum and cannot grow".into(),
            ));
        }
        self.highest = self.highest.max(seeded);
        Ok(())
    }

    /// The fencing number of this acquisition: one above every counter read.
    pub(crate) fn token(&self) -> u64 {
        // `granted` keeps `highest` below u64::MAX.
        self.highest.saturating_add(1)
    }
}

/// What phase 2 writes: the fencing number, under the name's counter key, on the nodes
/// where the lock key still holds the acquisition's value.
pub(crate) struct PhaseTwo<'a> {
    /// The lock key and the counter key.
    pub(crate) keys: [&'a [u8]; 2],
    /// The acquisition's value.
    pub(crate) value: &'a [u8],
    pub(crate) token: u64,
    /// How long the counter is kept, in ms.
    pub(crate) retention_ms: u64,
}

/// Phase 2: raises the name's counter to the token on every node that may hold the lock
/// (not those `phase_one` saw refuse), by `deadline`. The round, once a quorum recorded
/// the number (the calls still out may land); otherwise why the number could not be
/// recorded.
pub(crate) async fn phase_two(
    nodes: &[Arc<Node>],
    write: &PhaseTwo<'_>,
    phase_one: &PhaseOne,
    deadline: Instant,
) -> Result<Round, LockError> {
    let args = [
        Arg::Bytes(write.value),
        Arg::Int(write.token),
        Arg::Int(write.retention_ms),
    ];
    let request = Request::Script(Invocation {
        script: &FENCE_SCRIPT,
        keys: &write.keys,
        args: &args,
    });
    let skip = phase_one.refused;
    let plan = Plan {
        skip,
        deadline,
        purpose: Purpose::Decide,
    };
    let mut round = Round::send(nodes, &request, plan);
    let mut votes = Votes::new(nodes.len());
    for _ in (0..nodes.len()).filter(|i| skip.contains(*i)) {
        // The lock is not ours there.
        votes.skipped();
    }
    while votes.undecided() {
        round.wake_after(votes.to_decide());
        let Some((i, reply)) = round.next().await else {
            break;
        };
        let outcome = reply
            .and_then(parse_flag)
            .and_then(|recorded| match recorded {
                true => Ok(Outcome::Granted),
                false => Err(NodeError::LockLost),
            });
        votes.count(nodes[i].label(), outcome);
    }
    if votes.reached() {
        Ok(round)
    } else {
        Err(votes.no_quorum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_above_every_counter_and_clock() {
        let mut p = PhaseOne::default();
        let read = |counter, clock_us| FenceRead { counter, clock_us };
        assert!(p.granted(read(Some(10), 5)).is_ok());
        assert!(p.granted(read(None, 7)).is_ok());
        assert_eq!(p.token(), 11);
        assert!(p.granted(read(Some(3), 40)).is_ok());
        assert_eq!(p.token(), 41);
        assert!(p.granted(read(Some(u64::MAX), 0)).is_err());
        assert_eq!(p.token(), 41);
    }
}
