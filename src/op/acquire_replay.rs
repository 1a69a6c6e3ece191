//! What a replay acquisition does with a round's records beyond replaying a quorum's:
//! restores a record found on fewer nodes onto those that granted, and, with no record
//! anywhere, asks whether the granting nodes vouch that none was lost
//! ([`AfterLoss`]). Part of [`acquire`](super::acquire)'s attempt.
//!
//! ```text
//! a quorum's record              -> Attempt::recorded (replayed; a lock-only target: busy)
//! a minority's record + a quorum of grants -> restore onto the granting nodes -> replayed
//! no record, doubted grants      -> AfterLoss::Run: runs (counted) | Refuse: Unverifiable
//! no record, nodes kept out      -> their records read (never a grant), then as above
//! ```

use std::time::{Duration, Instant};

use super::acquire::{Acquire, Attempt};
use super::release::{Background, Held, complete_held};
use super::set_replies::SetReplies;
use crate::core::{Accepts, AfterLoss, Target};
use crate::error::{LockError, RecordBytes};
use crate::node::Doubts;
use crate::quorum::NodeMask;
use crate::round::{Nodes, Plan, Purpose};
use crate::scripts::{
    AcquireReply, Arg, HELD_OR_RECORD_SCRIPT, Invocation, Request, parse_acquire,
};

impl Attempt {
    /// The attempt that found the name's record on a quorum of its `nodes`: the name's work
    /// is done, and its record is handed back (our SETs are released); an acquisition that
    /// wants the lock only finds the name held.
    pub(super) fn recorded(target: &Target, record: Vec<u8>, nodes: usize) -> Self {
        match target.accepts {
            Accepts::LockOrRecord { .. } => Attempt::Record(RecordBytes(record)),
            Accepts::Lock => Attempt::Missed {
                error: LockError::Busy {
                    held_elsewhere: 1,
                    nodes,
                    retry_after: None,
                    attempts: 1,
                },
                by_others: true,
            },
        }
    }
}

impl<B: Background, N: Nodes + ?Sized> Acquire<'_, B, N> {
    /// What a replay acquisition granted by a quorum, with no record found, does about the
    /// granting nodes that may have lost the name's record (see
    /// [`Doubts`](crate::node::Doubts)): with [`AfterLoss::Run`] it runs (counted); with
    /// [`AfterLoss::Refuse`], unless a quorum of the nodes that granted have held their
    /// data for the whole `retention`, the miss says when enough of them will.
    #[expect(
        clippy::result_large_err,
        reason = "an Attempt that is never Held (the large variant), moved once per miss"
    )]
    pub(super) fn vouched(
        &self,
        replies: &SetReplies,
        retention: Duration,
        after_loss: AfterLoss,
    ) -> Result<(), Attempt> {
        // Judged once, here, after the round: every node that granted answered before now
        // and was judged before it answered (its connect, at the latest), so what the
        // nodes' ledgers say now is at least as new as each answer (and only a replay
        // that found no record ever asks).
        let doubts = doubts_of(self.core.nodes());
        let granted = (0..self.core.nodes().count()).filter(|&i| replies.granted.contains(i));
        let now = crate::clock::now();
        let mut waits: Vec<Duration> = granted
            .map(|i| doubts.vouches_in(i, retention, true, now))
            .collect();
        let quorum = self.core.quorum();
        let vouching = waits.iter().filter(|w| w.is_zero()).count();
        if vouching >= quorum {
            return Ok(());
        }
        if after_loss == AfterLoss::Run {
            crate::metrics::replay_unverified();
            tracing::debug!(
                vouching,
                "redlock replay acquisition runs although nodes that granted may have lost its record (AfterLoss::Run)"
            );
            return Ok(());
        }
        waits.sort_unstable();
        Err(Attempt::missed(LockError::Unverifiable {
            vouching,
            granted: waits.len(),
            needed: quorum,
            retry_after: waits.get(quorum.saturating_sub(1)).copied(),
            attempts: 1,
        }))
    }

    /// For a replay acquisition a quorum granted with no record found: reads the name's
    /// record on the nodes the restart quarantine kept out, by `deadline`. The quarantine
    /// keeps out a node's grants, not its evidence: a node restarted with its data may be
    /// the only one left with the record (the others lost theirs), and the record is then
    /// the name's answer, restored onto the nodes that granted. A read only (the holder's
    /// TTL or the record): nothing is written on a node kept out.
    pub(super) async fn read_kept_out(
        &self,
        target: &Target,
        value: &str,
        replies: &mut SetReplies,
        deadline: Instant,
    ) {
        if !target.accepts.records() || !replies.records.is_empty() || replies.kept_out.len() == 0 {
            return;
        }
        let nodes = self.core.nodes();
        let kept_out = replies.kept_out;
        let plan = Plan {
            skip: NodeMask::matching(nodes.count(), |i| !kept_out.contains(i)),
            deadline,
            purpose: Purpose::Everywhere { after: None },
        };
        let args = [Arg::Bytes(value.as_bytes())];
        let request = Request::Script(Invocation {
            script: &HELD_OR_RECORD_SCRIPT,
            keys: &[&target.resource.key],
            args: &args,
        });
        let mut round = nodes.send(&request, plan);
        while let Some((i, reply)) = round.next().await {
            if let Ok(AcquireReply::Record(record)) = reply.and_then(parse_acquire) {
                replies.records.push(record);
                replies.foreign.insert(i);
            }
        }
    }

    /// Restores the name's `record`, found on `holders` nodes (fewer than a quorum), onto
    /// the nodes where our value is `held` (a quorum granted): replayed once a quorum
    /// holds it, short of nodes otherwise (our value then goes with the attempt's release).
    pub(super) async fn restore(
        &self,
        target: &Target,
        held: &Held<'_>,
        record: Vec<u8>,
        holders: usize,
    ) -> Attempt {
        let retention = match target.accepts {
            Accepts::LockOrRecord { retention, .. } => retention,
            Accepts::Lock => Duration::ZERO,
        };
        let restored = complete_held(self.core, held, &record, retention).await;
        let quorum = self.core.quorum();
        if holders.saturating_add(restored) >= quorum {
            crate::metrics::replay_restored();
            tracing::info!(
                found_on = holders,
                restored_on = restored,
                "redlock replay found the key's record on fewer than a quorum of nodes: restored onto the nodes that granted, and replayed"
            );
            return Attempt::Record(RecordBytes(record));
        }
        Attempt::missed(LockError::NoQuorum {
            needed: quorum,
            reached: holders.saturating_add(restored),
            held_elsewhere: 0,
            failures: Vec::new(),
            attempts: 1,
        })
    }
}

/// What a replay acquisition doubts of `nodes` now (see [`Doubts`]).
fn doubts_of<N: Nodes + ?Sized>(nodes: &N) -> Doubts {
    Doubts::judge((0..nodes.count()).map(|i| nodes.whole(i)).collect())
}
