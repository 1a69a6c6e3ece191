//! Acquiring: one attempt of the algorithm (CONTRIBUTING.md, "The algorithm", steps 1 to
//! 5); the retry loop around it is [`retry`](super::retry).
//!
//! ```text
//! Acquire { core, fencing, waiters, background }.attempt(&target, outer, n)
//!   start -> SET NX PX on every node at once -> quorum? -> [fencing phase 2] -> validity > min?
//!         -> Attempt::Held              otherwise -> release on every node -> Attempt::Missed
//!   a quorum holds the name's completion record   -> Attempt::Record (replay)
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::release::{Background, Deletion, Held, Release, Wake};
use super::set_replies::{SetReplies, agreed_record, count_set_round, only_record};
use crate::core::{Accepts, Core, Fenced, Target, ttl_ms};
use crate::error::{LockError, RecordBytes};
use crate::fencing::{self, CounterAt, Fencing, Number, PhaseOne, PhaseTwo};
use crate::name::{Resource, new_value};
use crate::node::Node;
use crate::quorum::{NodeMask, later};
use crate::round::{Nodes, Plan, Purpose, Round};
use crate::scripts::{FencedSet, MAX_NUMBER, Renewal, Request};
use crate::token::Lock;
use crate::votes::Votes;
use crate::waiters::Waiters;

#[cfg(test)]
#[path = "acquire_tests.rs"]
mod tests;

/// What one attempt came to.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// The lock is held.
    Held(Lock),
    /// The name's work is done: a quorum of nodes hold its completion record (only for an
    /// acquisition that accepts one, [`Accepts::LockOrRecord`]).
    Record(RecordBytes),
    /// No lock: why (its attempt count still 1), and whether another client, not this
    /// one, holds the name somewhere (only the nodes can tell of that holder's release).
    Missed { error: LockError, by_others: bool },
}

impl Attempt {
    /// A miss that says nothing of other clients.
    pub(super) fn missed(error: LockError) -> Self {
        Self::Missed {
            error,
            by_others: false,
        }
    }

    /// The outcome of an acquisition that made `attempts` attempts and ended with this.
    pub(crate) fn finish(self, attempts: u32) -> Result<Acquired, LockError> {
        match self {
            Self::Held(lock) => Ok(Acquired::Lock(lock)),
            Self::Record(record) => Ok(Acquired::Record { record, attempts }),
            Self::Missed { error, .. } => Err(error.with_attempts(attempts)),
        }
    }
}

/// What an acquisition got.
#[derive(Debug)]
pub(crate) enum Acquired {
    /// The lock.
    Lock(Lock),
    /// The name's completion record (with [`Accepts::LockOrRecord`] only): the layer
    /// replays it.
    Record { record: RecordBytes, attempts: u32 },
}

impl Acquired {
    /// The lock of an acquisition that takes nothing else for an answer
    /// ([`Accepts::Lock`]: a record it finds makes the name busy, so none comes back;
    /// `quorum` of `nodes` hold it).
    pub(crate) fn lock_or_busy(self, quorum: usize, nodes: usize) -> Result<Lock, LockError> {
        match self {
            Self::Lock(lock) => Ok(lock),
            Self::Record { attempts, .. } => Err(LockError::Busy {
                held_elsewhere: quorum,
                nodes,
                retry_after: None,
                attempts,
            }),
        }
    }
}

/// The time window of one attempt: when it started, its TTL and drift allowance (its
/// validity), and the caller's own deadline, if any.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    ttl: Duration,
    drift: Duration,
    outer: Option<Instant>,
}

impl Window {
    /// An attempt of `ttl` starting now on `core` (the drift its clocks allow), within
    /// the caller's `outer` deadline.
    fn starting_now<N: ?Sized>(core: &Core<N>, ttl: Duration, outer: Option<Instant>) -> Self {
        Self {
            start: crate::clock::now(),
            ttl,
            drift: core.drift(ttl),
            outer,
        }
    }
}

/// The acquire operation: one attempt over `core`'s nodes, with the client's `fencing`
/// (for fenced targets), its `waiters` (the client id in the value; woken by the release
/// of a miss) and who releases in the `background` when the attempt is dropped.
pub(crate) struct Acquire<'a, B, N: ?Sized = [Arc<Node>]> {
    pub(crate) core: &'a Core<N>,
    pub(crate) fencing: &'a Fencing,
    pub(crate) waiters: &'a Waiters,
    pub(crate) background: &'a B,
}

impl<B: Background, N: Nodes + ?Sized> Acquire<'_, B, N> {
    /// One attempt, the `attempt`th: the algorithm's steps 1 to 5.
    pub(crate) async fn attempt(
        &self,
        target: &Target,
        outer: Option<Instant>,
        attempt: u32,
    ) -> Attempt {
        // A TTL longer than any announced goes into the nodes' horizons first.
        if let Err(error) = super::announce::announce(self.core, target.ttl).await {
            return Attempt::missed(error);
        }
        let value: Arc<str> = match new_value(self.waiters.id()) {
            Ok(value) => value.into(),
            Err(error) => return Attempt::missed(error),
        };
        // If this future is dropped while the SETs are out, release in the background.
        let mut pending = PendingRelease {
            background: self.background,
            deletion: Some(Deletion {
                resource: Arc::clone(&target.resource),
                value: Arc::clone(&value),
                ttl: target.ttl,
                foreign: NodeMask::default(),
                landing: None,
                wake: Wake::AtQuorum,
            }),
        };
        let mut foreign = NodeMask::default();
        let missed = match self
            .hold(target, &value, outer, attempt, &mut foreign)
            .await
        {
            Ok(lock) => {
                pending.deletion = None;
                return Attempt::Held(lock);
            }
            Err(missed) => missed,
        };
        if let Some(deletion) = &mut pending.deletion {
            deletion.foreign = foreign;
            self.release_missed(deletion).await;
        }
        pending.deletion = None;
        self.log_missed(&missed);
        missed
    }

    /// Logs a missed attempt: a failure, or a replay (whose record stays out of the log).
    fn log_missed(&self, missed: &Attempt) {
        let nodes = self.core.node_count();
        match missed {
            Attempt::Record(_) => tracing::debug!(
                nodes,
                "redlock attempt found the name's completion record: its response is replayed"
            ),
            _ => tracing::debug!(nodes, failure = ?missed, "redlock attempt failed"),
        }
    }

    /// Step 5, after a missed attempt: releases its value on every node but the foreign
    /// ones, including those that failed or did not answer in time (their SET may have
    /// run while the reply was lost). With every node foreign (a replay found
    /// everywhere), nothing goes down.
    async fn release_missed(&self, deletion: &Deletion) {
        let release = Release {
            core: self.core,
            waiters: self.waiters,
        };
        let _ = release.run(deletion).await;
    }

    /// Steps 1 to 4: the lock held with `value`, or the missed attempt (its keys still to
    /// release; `foreign`, the nodes that answered with another client's value, skipped).
    async fn hold(
        &self,
        target: &Target,
        value: &Arc<str>,
        outer: Option<Instant>,
        attempt: u32,
        foreign: &mut NodeMask,
    ) -> Result<Lock, Attempt> {
        let core = self.core;
        let ttl = Duration::from_millis(ttl_ms(target.ttl));
        // 1-3. SET NX PX everywhere at once, decided as early as the outcome is certain.
        let window = Window::starting_now(core, ttl, outer);
        let (round, votes, replies) = self.sets(target, value, &window).await;
        *foreign = replies.foreign;
        let phase_one = match self.granted(target, votes, replies)? {
            Granted::Lock(phase_one) => phase_one,
            Granted::Restore { record, holders } => {
                let landing = round.land().await;
                let held = Held {
                    key: &target.resource.key,
                    waiting: target.resource.waiting_key.as_deref(),
                    value,
                    foreign: *foreign,
                    landing: landing.as_ref(),
                };
                return Err(self.restore(target, &held, record, holders).await);
            }
        };
        let mut fence = None;
        if let Some(mut phase_one) = phase_one {
            fence = self
                .number(&target.resource, value, &mut phase_one, &window)
                .await
                .map_err(Attempt::missed)?;
        }
        let validity = self.validity_left(&window, fence.is_some())?;
        Ok(Lock {
            resource: Arc::clone(&target.resource),
            value: Arc::clone(value),
            started: window.start,
            acquired_at: window.start,
            valid_until: later(window.start, validity),
            ttl,
            attempts: attempt,
            fence,
            foreign: *foreign,
            // The SETs still out land in the background, on every node that answers.
            landing: round.land().await,
        })
    }

    /// Step 4: held only with a quorum and validity left: how much, of a lock taken in
    /// `window` (`fenced`: with a number, for the log).
    #[expect(
        clippy::result_large_err,
        reason = "an Attempt that is never Held (the large variant), moved once per miss"
    )]
    fn validity_left(&self, window: &Window, fenced: bool) -> Result<Duration, Attempt> {
        let elapsed = crate::clock::since(window.start);
        let ttl = window.ttl;
        let validity = self
            .core
            .validity(ttl, elapsed, window.drift)
            .ok_or_else(|| {
                Attempt::missed(LockError::ValidityExhausted {
                    elapsed,
                    ttl,
                    attempts: 1,
                })
            })?;
        tracing::debug!(
            nodes = self.core.node_count(),
            fenced,
            elapsed_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            "redlock acquired"
        );
        Ok(validity)
    }

    /// Whether the `SET NX PX` round got the lock: for a fenced target, what phase 1
    /// learned (for the number); for a replay acquisition granted by a quorum next to the
    /// name's record on fewer nodes, that record to restore. Otherwise the attempt's
    /// outcome: the name's completion record (when `target` accepts one), busy when a
    /// quorum answered and some said another client holds the lock, short of nodes
    /// otherwise.
    #[expect(
        clippy::result_large_err,
        reason = "an Attempt that is never Held (the large variant), moved once per miss"
    )]
    fn granted(
        &self,
        target: &Target,
        votes: Votes,
        mut replies: SetReplies,
    ) -> Result<Granted, Attempt> {
        let nodes = votes.tally.nodes();
        let records = replies.records.len();
        if let Some(record) = agreed_record(&mut replies.records, self.core.quorum()) {
            return Err(Attempt::recorded(target, record, nodes));
        }
        if votes.reached() {
            if let Accepts::LockOrRecord {
                retention,
                after_loss,
            } = target.accepts
            {
                // The name's one record on fewer nodes than a quorum (the others lost it,
                // or a completion reached too few): the work is done, and the record is
                // its answer; restored onto the nodes that granted, it is replayed.
                if let Some(record) = only_record(&replies.records) {
                    return Ok(Granted::Restore {
                        record,
                        holders: records,
                    });
                }
                if records == 0 {
                    self.vouched(&replies, retention, after_loss)?;
                }
            }
            return Ok(Granted::Lock(
                (target.fenced == Fenced::Yes).then_some(replies.fencing),
            ));
        }
        Err(self.not_granted(target, votes, &replies))
    }

    /// Why a `SET NX PX` round that reached no quorum (and found no record a quorum
    /// agrees on) missed: busy when some node said another client holds the lock, short
    /// of nodes otherwise.
    fn not_granted(&self, target: &Target, votes: Votes, replies: &SetReplies) -> Attempt {
        let tally = &votes.tally;
        let records = replies.records.len();
        // To a replay acquisition, a record on fewer than a quorum of nodes and no holder
        // besides is no request holding the name: it is short of nodes (nodes that lost
        // the record, or are not back yet), and the record is evidence the key completed.
        let only_records = target.accepts.records()
            && records >= tally.held_elsewhere()
            && records < self.core.quorum();
        if !tally.is_busy() || only_records {
            return Attempt::missed(votes.no_quorum());
        }
        Attempt::Missed {
            error: LockError::Busy {
                held_elsewhere: tally.held_elsewhere(),
                nodes: tally.nodes(),
                retry_after: replies.retry_after,
                attempts: 1,
            },
            by_others: replies.held_by_others,
        }
    }

    /// The fencing number of an attempt that got its quorum: the proposal when a quorum
    /// accepted it; otherwise, while the attempt has validity left, the counters are read
    /// and phase 2 records one above them all, each round with the per-node timeout of
    /// its own (within the validity). `None` when that was needed but no validity was
    /// left (step 4 then gives up).
    async fn number(
        &self,
        resource: &Resource,
        value: &str,
        phase_one: &mut PhaseOne,
        window: &Window,
    ) -> Result<Option<u64>, LockError> {
        let core = self.core;
        let quorum = core.quorum();
        let deadline = || core.call_deadline(window.start, window.ttl, window.outer);
        let clock = self.fencing.clock();
        if phase_one.needs_read(quorum) {
            let elapsed = crate::clock::since(window.start);
            if crate::quorum::validity(window.ttl, elapsed, window.drift).is_none() {
                return Ok(None);
            }
            self.read_counters(resource, phase_one, deadline()).await?;
        }
        let number = phase_one.number(quorum);
        let recorded = match number {
            Number::Accepted(n) => n,
            // Fencing phase 2: record the number on the nodes we hold, while we hold them.
            Number::Raise(n) => {
                let write = PhaseTwo {
                    at: CounterAt::of(resource),
                    value: value.as_bytes(),
                    token: n,
                    expiry_ms: self.fencing.counters_expiry_ms(),
                };
                let round = fencing::phase_two(core.nodes(), &write, phase_one, deadline()).await?;
                // The number lands on the nodes that had not answered yet, too.
                round.land().await;
                n
            }
        };
        clock.saw(recorded);
        fencing::count(number);
        Ok(Some(recorded))
    }

    /// Reads `resource`'s counter into `phase_one` on the nodes whose grant it counted, by
    /// `deadline` (when too few accepted the proposal), and learns the highest.
    async fn read_counters(
        &self,
        resource: &Resource,
        phase_one: &mut PhaseOne,
        deadline: Instant,
    ) -> Result<(), LockError> {
        let at = CounterAt::of(resource);
        fencing::read_counters(self.core.nodes(), at, phase_one, deadline).await?;
        if phase_one.pinned() {
            tracing::error!(
                "redlock fencing counter at its maximum (2^53) on a node: this acquisition \
                 resets it to its own number in phase 2, a deliberate loss of that counter \
                 (a number that high can only come from a hand-written counter or a client \
                 with an unbounded clock); a store that saw such a number refuses the new \
                 ones until it is reset too"
            );
        }
        if let Some(highest) = phase_one.highest() {
            self.fencing.clock().saw(highest);
        }
        Ok(())
    }

    /// The fencing proposal of an attempt (0 when not fenced). Until a quorum of nodes
    /// gave an estimate of their clocks, the client's first acquisitions first wait for the
    /// connects under way (until that quorum, by `deadline`), so that the first proposals
    /// are capped by the nodes' clocks too; once one waited, the others do not (nodes
    /// that give no estimate cost no wait per acquisition).
    async fn propose(&self, fenced: Fenced, deadline: Instant) -> u64 {
        if fenced == Fenced::No {
            return 0;
        }
        let clock = self.fencing.clock();
        if !clock.bounded() && !clock.waited() {
            // Cut short: the proposal is the wall clock, as without an estimate.
            let settle = self.core.nodes().settle(|| clock.bounded());
            let _ = tokio::time::timeout_at(deadline.into(), settle).await;
            clock.waited_once();
        }
        // Two below the largest number a counter holds exactly, so that one above the
        // proposal is still below it: a counter at that largest number is pinned (see
        // `PhaseOne::read`), and the reset after it gives at most one less than that
        // number, never the number a holder before may have taken.
        clock.propose().min(MAX_NUMBER - 2)
    }

    /// Steps 2 and 3 of an attempt in `window`: the [`set_round`](Self::set_round), and
    /// when it reached a quorum with nodes kept out by the restart quarantine, what those
    /// nodes hold of the name.
    async fn sets(
        &self,
        target: &Target,
        value: &str,
        window: &Window,
    ) -> (Round<N::Call>, Votes, SetReplies) {
        let deadline = || {
            self.core
                .call_deadline(window.start, window.ttl, window.outer)
        };
        let (round, votes, mut replies) =
            self.set_round(target, value, window.ttl, deadline()).await;
        if votes.reached() && replies.kept_out.len() > 0 {
            // Boxed: a rare round (only while a node is kept out) that need not weigh on
            // every acquisition's future.
            Box::pin(self.read_kept_out(target, value, &mut replies, deadline())).await;
        }
        (round, votes, replies)
    }

    /// Step 2: `SET NX PX` on every node at once (fenced: followed by the proposal's
    /// `ZADD GT CH` on the name's counter, and the set's renewal, which each node sends
    /// only when due on its connection), until the outcome is certain or `deadline`. The
    /// round (its calls still out), the votes, and what the replies said.
    async fn set_round(
        &self,
        target: &Target,
        value: &str,
        ttl: Duration,
        deadline: Instant,
    ) -> (Round<N::Call>, Votes, SetReplies) {
        let proposal = self.propose(target.fenced, deadline).await;
        let replay = target.accepts.records();
        let request = self.set_request(target, value.as_bytes(), ttl_ms(ttl), proposal);
        let plan = Plan {
            skip: NodeMask::default(),
            deadline,
            purpose: Purpose::Decide,
        };
        let nodes = self.core.nodes();
        let round = nodes.send(&request, plan);
        count_set_round(nodes, round, SetReplies::new(proposal, replay)).await
    }

    /// Step 2's request for `target`: `SET NX PX`, fenced with the `ZADD GT CH` of
    /// `proposal` (and the set's renewal), and for a replay followed by the key's reads.
    fn set_request<'a>(
        &self,
        target: &'a Target,
        value: &'a [u8],
        ttl_ms: u64,
        proposal: u64,
    ) -> Request<'a> {
        let resource = &target.resource;
        let replay = target.accepts.records();
        if target.fenced == Fenced::No {
            let key = &resource.key[..];
            return if replay {
                Request::SetNxOrReplay { key, value, ttl_ms }
            } else {
                Request::SetNx { key, value, ttl_ms }
            };
        }
        let fenced = FencedSet {
            key: &resource.key,
            counters: &resource.counter_key,
            member: &resource.counter_member,
            value,
            ttl_ms,
            proposal,
            renew: Renewal {
                expire_ms: self.fencing.counters_expiry_ms(),
            },
            set: resource.counter_set,
        };
        if replay {
            // One round trip whatever the key holds: the key read with the lock's
            // commands.
            Request::FencedSetNxOrReplay(fenced)
        } else {
            Request::FencedSetNx(fenced)
        }
    }
}

/// What a `SET NX PX` round that got its quorum leads to.
enum Granted {
    /// The lock (for a fenced target, with what phase 1 learned).
    Lock(Option<PhaseOne>),
    /// A replay acquisition's record, found on `holders` nodes, to restore onto those
    /// that granted.
    Restore { record: Vec<u8>, holders: usize },
}

/// Releases an acquisition attempt's value in the background if the attempt's future is
/// dropped before it finished (the SETs may have landed).
struct PendingRelease<'a, B: Background> {
    background: &'a B,
    /// What to release (the replies are unknown: everywhere).
    deletion: Option<Deletion>,
}

impl<B: Background> Drop for PendingRelease<'_, B> {
    fn drop(&mut self) {
        if let Some(deletion) = self.deletion.take() {
            self.background.release_in_background(deletion);
        }
    }
}
