//! Fencing's phases on one attempt (see `docs/fencing.md`): what phase 1 learned across
//! the nodes (grants, acceptances of the proposal, the nodes to skip), the counters read
//! when too few accepted, the number the attempt takes, and phase 2, which raises the
//! counters on a quorum when phase 1 did not.
//!
//! ```text
//! phase 1 (with the SET): ZADD GT CH proposal -> accepted on a quorum? -> the number
//!                                             \-> no: read the counters -> phase 2: FENCE max+1
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redis::Value;

use crate::error::{LockError, NodeError};
use crate::name::Resource;
use crate::quorum::{NodeMask, Outcome};
use crate::round::{Nodes, Plan, Purpose, Round};
use crate::scripts::{
    AcquireReply, Arg, FENCE_SCRIPT, FenceRead, INSPECT_SCRIPT, Invocation, MAX_NUMBER, Request,
    parse_flag, parse_inspect,
};
use crate::votes::Votes;

/// What phase 1 learned across the nodes of one attempt: the nodes that granted and how
/// many of them accepted the proposal, the nodes that answered otherwise (phase 2 skips
/// them: the lock is not ours there), and, once read (when too few accepted), the highest
/// counter.
#[derive(Debug)]
pub(crate) struct PhaseOne {
    proposal: u64,
    accepted: usize,
    /// The nodes whose grant was counted: the counters are read there.
    granted: NodeMask,
    /// The highest counter read after phase 1 (see [`read_counters`]), but those pinned.
    highest: Option<u64>,
    /// A counter read was pinned at [`MAX_NUMBER`]: phase 2 resets it.
    pinned: bool,
    /// The nodes that did not grant: phase 2 skips them.
    pub(crate) refused: NodeMask,
}

/// The fencing number of an acquisition that got its quorum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Number {
    /// A quorum accepted the proposal: it is the number, recorded already.
    Accepted(u64),
    /// Too few accepted: the number is one above every counter read, and phase 2 must
    /// record it on a quorum.
    Raise(u64),
}

impl PhaseOne {
    /// Phase 1 of an attempt that proposes `proposal`.
    pub(crate) fn new(proposal: u64) -> Self {
        Self {
            proposal,
            accepted: 0,
            granted: NodeMask::default(),
            highest: None,
            pinned: false,
            refused: NodeMask::default(),
        }
    }

    /// Takes the answer of node `i`, which granted, to the proposal.
    fn granted(&mut self, i: usize, read: FenceRead) {
        self.granted.insert(i);
        if read == FenceRead::Accepted {
            self.accepted += 1;
        }
    }

    /// Takes node `i`'s answer to phase 1 (`None`: it failed): what it counts for the
    /// quorum. A node that did not grant is left out of phase 2 (the lock is not ours
    /// there); a grant's `ZADD` answer counts towards the proposal's acceptances.
    pub(crate) fn take(&mut self, i: usize, reply: Option<&AcquireReply>) -> Outcome {
        let outcome = match reply {
            Some(AcquireReply::Won { fence }) => {
                if let Some(read) = fence {
                    self.granted(i, *read);
                }
                return Outcome::Granted;
            }
            Some(AcquireReply::HeldElsewhere { .. } | AcquireReply::Record(_)) => {
                Outcome::HeldElsewhere
            }
            None => Outcome::Failed,
        };
        self.refused.insert(i);
        outcome
    }

    /// Whether `quorum` granting nodes accepted the proposal: the number is then the
    /// proposal, and nothing needs to be read.
    pub(crate) fn accepted_by(&self, quorum: usize) -> bool {
        self.accepted >= quorum
    }

    /// Whether the counters must be read before the number is known: unless `quorum`
    /// granting nodes accepted the proposal.
    pub(crate) fn needs_read(&self, quorum: usize) -> bool {
        !self.accepted_by(quorum)
    }

    /// Takes a counter read after phase 1 on a node that granted (`None`: it has none).
    /// A counter at [`MAX_NUMBER`] (or above) is *pinned*: no number above it can be
    /// recorded, so it does not count towards the number, and phase 2's script resets it
    /// to the number (the only write that lowers a counter; see `docs/fencing.md`, "A
    /// counter pinned at the maximum"). Never fails: the `Result` is the model check's
    /// seam for a read that does.
    pub(crate) fn read(&mut self, counter: Option<u64>) -> Result<(), NodeError> {
        match counter {
            Some(c) if c >= MAX_NUMBER => self.pinned = true,
            _ => self.highest = self.highest.max(counter),
        }
        Ok(())
    }

    /// Whether a counter read was pinned at the maximum (phase 2 resets it).
    pub(crate) fn pinned(&self) -> bool {
        self.pinned
    }

    /// The highest counter read, if any.
    pub(crate) fn highest(&self) -> Option<u64> {
        self.highest
    }

    /// The number, once `quorum` nodes granted: the proposal when at least `quorum` of
    /// them accepted it, otherwise (after [`read_counters`]) one above every counter read
    /// and above the proposal.
    pub(crate) fn number(&self, quorum: usize) -> Number {
        if self.accepted_by(quorum) {
            Number::Accepted(self.proposal)
        } else {
            // `read` keeps every counter that counts below MAX_NUMBER.
            Number::Raise(
                self.highest
                    .unwrap_or(0)
                    .max(self.proposal)
                    .saturating_add(1),
            )
        }
    }
}

/// Where a name's counter is: its lock key and the key of the sorted set that holds the counter
/// (`keys`), and its member in that set, whose score is the counter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CounterAt<'a> {
    /// The lock key, then the key of the set of counters.
    pub(crate) keys: [&'a [u8]; 2],
    /// The name's member in the set.
    pub(crate) member: &'a [u8],
}

impl<'a> CounterAt<'a> {
    /// Where `resource`'s counter is.
    pub(crate) fn of(resource: &'a Resource) -> Self {
        Self {
            keys: [&resource.key, &resource.counter_key],
            member: &resource.counter_member,
        }
    }

    /// The [`INSPECT`](crate::scripts) of the name: its key's state and its counter.
    pub(crate) fn inspect<'b>(&'b self, args: &'b [Arg<'b>; 1]) -> Request<'b> {
        Request::Script(Invocation {
            script: &INSPECT_SCRIPT,
            keys: &self.keys,
            args,
        })
    }
}

/// When too few nodes accepted the proposal: reads the name's counter (`at`) on the nodes
/// whose grant phase 1 counted, by `deadline`, into `phase_one`, until a quorum answered;
/// otherwise why too few did. Each read runs after the node set this attempt's key (it
/// answered that it did), which is all the proof needs of it.
pub(crate) async fn read_counters<N: Nodes + ?Sized>(
    nodes: &N,
    at: CounterAt<'_>,
    phase_one: &mut PhaseOne,
    deadline: Instant,
) -> Result<(), LockError> {
    let args = [Arg::Bytes(at.member)];
    let request = at.inspect(&args);
    let granted = phase_one.granted;
    let skip = NodeMask::matching(nodes.count(), |i| !granted.contains(i));
    let take = |reply: Value| {
        let seen = parse_inspect(reply)?;
        phase_one.read(seen.counter).map(|()| Outcome::Granted)
    };
    // The reads that did not answer in time need not land.
    quorum_round(nodes, &request, skip, deadline, take)
        .await
        .map(drop)
}

/// Sends `request` to every node but `skip` and counts their answers (`take`) until a
/// quorum answered [`Outcome::Granted`] or too few still can, by `deadline`: the round,
/// or why there was no quorum. The skipped nodes count as refusing.
async fn quorum_round<N: Nodes + ?Sized>(
    nodes: &N,
    request: &Request<'_>,
    skip: NodeMask,
    deadline: Instant,
    mut take: impl FnMut(Value) -> Result<Outcome, NodeError>,
) -> Result<Round<N::Call>, LockError> {
    let plan = Plan {
        skip,
        deadline,
        purpose: Purpose::Decide,
    };
    let mut round = nodes.send(request, plan);
    let mut votes = Votes::new(nodes.count());
    for _ in (0..nodes.count()).filter(|i| skip.contains(*i)) {
        votes.skipped();
    }
    while votes.undecided() {
        round.wake_after(votes.to_decide());
        let Some((i, reply)) = round.next().await else {
            break;
        };
        votes.count(nodes.label(i), reply.and_then(&mut take));
    }
    if votes.reached() {
        Ok(round)
    } else {
        Err(votes.no_quorum())
    }
}

/// Fenced acquisitions of this process that got their number in one round trip.
static ONE_ROUND: AtomicU64 = AtomicU64::new(0);
/// Fenced acquisitions of this process that needed phase 2.
static TWO_ROUNDS: AtomicU64 = AtomicU64::new(0);

/// Counts a fenced acquisition that got `number` (the `redlock_fenced_total` metric, and
/// [`rounds`]).
pub(crate) fn count(number: Number) {
    let (counter, rounds) = match number {
        Number::Accepted(_) => (&ONE_ROUND, "1"),
        Number::Raise(_) => (&TWO_ROUNDS, "2"),
    };
    counter.fetch_add(1, Ordering::Relaxed);
    crate::metrics::fenced(rounds);
}

/// How many fenced acquisitions of this process got their number in one round trip and
/// how many needed phase 2, since it started: what the load benchmark reports as the
/// phase-2 share. Not part of the API (use the `redlock_fenced_total` metric).
#[doc(hidden)]
pub fn rounds() -> (u64, u64) {
    (
        ONE_ROUND.load(Ordering::Relaxed),
        TWO_ROUNDS.load(Ordering::Relaxed),
    )
}

/// The key of the sorted set that holds `name`'s fencing counter under the key prefix
/// `prefix`, and its member whose score is the counter (the name's hash slot, in decimal
/// digits), for a client with one set per node (`per_slot` false: no Redis
/// Cluster among its nodes) or a set per slot; `None` for an empty name. Not part of the
/// API: for tests and tools that look at the counters.
#[doc(hidden)]
pub fn counter_of(prefix: &[u8], name: &[u8], per_slot: bool) -> Option<(Vec<u8>, Vec<u8>)> {
    let sets = if per_slot {
        crate::name::CounterSets::PerSlot
    } else {
        crate::name::CounterSets::One
    };
    crate::name::keys_for(prefix, name, sets)
        .ok()
        .map(|keys| (keys.counter, keys.member))
}

/// What phase 2 writes: the fencing number, under the name's counter key, on the nodes
/// where the lock key still holds the acquisition's value.
pub(crate) struct PhaseTwo<'a> {
    /// Where the name's counter is.
    pub(crate) at: CounterAt<'a>,
    /// The acquisition's value.
    pub(crate) value: &'a [u8],
    pub(crate) token: u64,
    /// The counter set's expiry, in ms (a retention and a half: `node::set_expiry_ms`).
    pub(crate) expiry_ms: u64,
}

/// Phase 2: raises the name's counter to the token on every node that may hold the lock
/// (not those `phase_one` saw refuse), by `deadline`. The round, once a quorum recorded
/// the number (the calls still out may land); otherwise why the number could not be
/// recorded.
pub(crate) async fn phase_two<N: Nodes + ?Sized>(
    nodes: &N,
    write: &PhaseTwo<'_>,
    phase_one: &PhaseOne,
    deadline: Instant,
) -> Result<Round<N::Call>, LockError> {
    let args = [
        Arg::Bytes(write.value),
        Arg::Int(write.token),
        Arg::Int(write.expiry_ms),
        Arg::Bytes(write.at.member),
    ];
    let request = Request::Script(Invocation {
        script: &FENCE_SCRIPT,
        keys: &write.at.keys,
        args: &args,
    });
    // The nodes that refused: the lock is not ours there.
    let take = |reply: Value| match parse_flag(reply)? {
        true => Ok(Outcome::Granted),
        false => Err(NodeError::LockLost),
    };
    quorum_round(nodes, &request, phase_one.refused, deadline, take).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_number_is_the_proposal_only_with_a_quorum_of_acceptances() {
        let mut p = PhaseOne::new(100);
        p.granted(0, FenceRead::Accepted);
        p.granted(1, FenceRead::Refused);
        p.granted(3, FenceRead::Accepted);
        assert_eq!(p.granted, NodeMask::matching(4, |i| i != 2));
        assert_eq!(p.number(2), Number::Accepted(100));
        assert_eq!(p.number(3), Number::Raise(101));
        assert!(p.read(Some(250)).is_ok());
        assert!(p.read(None).is_ok());
        assert_eq!(p.number(3), Number::Raise(251));
        assert!(!p.pinned());
        assert!(p.read(Some(MAX_NUMBER - 1)).is_ok());
        assert_eq!(p.number(3), Number::Raise(MAX_NUMBER));
        assert_eq!(p.highest(), Some(MAX_NUMBER - 1));
    }

    #[test]
    fn a_pinned_counter_does_not_count_and_is_marked_for_the_reset() {
        let mut p = PhaseOne::new(1_000);
        p.granted(0, FenceRead::Refused);
        p.granted(1, FenceRead::Refused);
        assert!(p.read(Some(MAX_NUMBER)).is_ok());
        assert!(p.pinned());
        assert_eq!(p.highest(), None);
        assert_eq!(p.number(2), Number::Raise(1_001));
        assert!(p.read(Some(500)).is_ok());
        assert!(p.read(Some(MAX_NUMBER + 1)).is_ok());
        assert_eq!(p.highest(), Some(500));
        assert_eq!(p.number(2), Number::Raise(1_001));
        assert!(p.read(Some(2_000)).is_ok());
        assert_eq!(p.number(2), Number::Raise(2_001));
        let mut below = PhaseOne::new(1_000);
        assert!(below.read(Some(MAX_NUMBER - 1)).is_ok());
        assert!(!below.pinned());
    }
}
