#![doc = include_str!("../docs/fencing.md")]

use std::sync::Arc;
use std::time::Instant;

use crate::error::NodeError;
use crate::fanout::{self, Round};
use crate::node::Node;
use crate::quorum::{NodeMask, Outcome};
use crate::scripts::{Arg, FENCE_SCRIPT, FenceRead, Invocation, Request, parse_flag};

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

/// Phase 2: raises the name's counter to `token` on every node that may hold the lock,
/// only where the lock key still holds `value`, and keeps the counter for `retention_ms`.
/// `keys` are the lock key and the counter key.
pub(crate) async fn phase_two(
    nodes: &Arc<[Arc<Node>]>,
    keys: &[&[u8]; 2],
    value: &[u8],
    token: u64,
    retention_ms: u64,
    deadline: Instant,
    refused: NodeMask,
) -> Round {
    let args = [Arg::Bytes(value), Arg::Int(token), Arg::Int(retention_ms)];
    let request = Request::Script(Invocation {
        script: &FENCE_SCRIPT,
        keys,
        args: &args,
    });
    fanout::decide(
        nodes,
        &request,
        deadline,
        |i| !refused.contains(i),
        |_, reply| match parse_flag(reply?)? {
            true => Ok(Outcome::Granted),
            false => Err(NodeError::LockLost),
        },
    )
    .await
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
