//! Acquiring: one attempt of the algorithm (CONTRIBUTING.md, "The algorithm"), and the retry
//! loop around it.
//!
//! ```text
//! start -> SET NX PX on every node at once -> quorum? -> [fencing phase 2] -> validity > min?
//!       -> held                       otherwise -> release on every node -> Busy / NoQuorum / ...
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::Redlock;
use super::release::Wake;
use super::spans::{Operation, elapsed_us};
use crate::error::{LockError, RecordBytes};
use crate::fanout::{self, Round};
use crate::fencing::{self, PhaseOne};
use crate::quorum::later;
use crate::quorum::{self, NodeMask, Outcome};
use crate::scripts::{
    ACQUIRE_FENCED_SCRIPT, ACQUIRE_OR_REPLAY_SCRIPT, AcquireReply, Arg, Invocation, Request,
    parse_acquire,
};
use crate::token::{Lock, Resource, new_value};
use crate::waiters::Ticket;

/// What the `SET NX PX` round of one attempt came to.
struct SetRound {
    round: Round,
    /// The nodes that answered that another client holds the key.
    foreign: NodeMask,
    /// The completion record found under the key on a quorum of nodes, if any (records
    /// on fewer nodes, or records that differ, count as other holders).
    record: Option<Vec<u8>>,
    /// The longest remaining TTL of another holder's keys.
    retry_after: Option<Duration>,
    /// Whether some node holds the key with another client's value (not this client's).
    held_by_others: bool,
    fencing: PhaseOne,
}

/// What one attempt came to.
#[derive(Debug)]
pub(super) enum Attempt {
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
    fn missed(error: LockError) -> Self {
        Self::Missed {
            error,
            by_others: false,
        }
    }

    /// The outcome of an acquisition that made `attempts` attempts and ended with this.
    pub(super) fn finish(self, attempts: u32) -> Result<Acquired, LockError> {
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

/// Why a `SET NX PX` round did not reach its quorum: busy when a quorum answered and
/// some said another client holds the lock, short of nodes otherwise.
fn set_failure(round: Round, retry_after: Option<Duration>, by_others: bool) -> Attempt {
    let tally = &round.tally;
    if tally.is_busy() {
        Attempt::Missed {
            error: LockError::Busy {
                held_elsewhere: tally.held_elsewhere(),
                nodes: tally.nodes(),
                retry_after,
                attempts: 1,
            },
            by_others,
        }
    } else {
        Attempt::missed(round.no_quorum())
    }
}

impl Redlock {
    /// One attempt: the algorithm's steps 1 to 5 (CONTRIBUTING.md, "The algorithm").
    pub(super) async fn attempt(
        &self,
        target: &Target,
        outer: Option<Instant>,
        attempt: u32,
    ) -> Attempt {
        let Target { resource, ttl, .. } = target;
        let ttl = *ttl;
        let value: Arc<str> = match new_value(self.inner.waiters.id()) {
            Ok(value) => value.into(),
            Err(error) => return Attempt::missed(error),
        };
        // If this future is dropped while the SETs are out, release in the background.
        let mut pending = PendingRelease {
            redlock: self,
            resource,
            value: Some(Arc::clone(&value)),
            ttl,
        };
        let ttl = Duration::from_millis(super::ttl_ms(ttl));
        let drift = quorum::drift(ttl, self.inner.drift_factor);
        // 1-3. SET NX PX everywhere at once, decided as early as the outcome is certain.
        let start = Instant::now();
        let SetRound {
            mut round,
            foreign,
            retry_after,
            held_by_others,
            record,
            fencing: phase_one,
        } = self.set_round(target, &value, ttl, start, outer).await;
        let nodes = round.tally.nodes();
        let stragglers = round.stragglers.take();
        let mut outcome = if let Some(record) = record {
            // The name's work is done: hand back its record (our SETs are released below).
            // An acquisition that wants the lock only finds the name held.
            Err(match target.accepts {
                Accepts::LockOrRecord => Attempt::Record(RecordBytes(record)),
                Accepts::Lock => Attempt::Missed {
                    error: LockError::Busy {
                        held_elsewhere: 1,
                        nodes,
                        retry_after: None,
                        attempts: 1,
                    },
                    by_others: true,
                },
            })
        } else if round.reached() {
            Ok(None)
        } else {
            Err(set_failure(round, retry_after, held_by_others))
        };
        // Fencing phase 2: record the number on the nodes we hold, while we hold them.
        if self.fencing
            && outcome.is_ok()
            && quorum::validity(ttl, start.elapsed(), drift).is_some()
        {
            let deadline = self.call_deadline(start, ttl, outer);
            outcome = self
                .fence(resource, &value, &phase_one, deadline)
                .await
                .map_err(Attempt::missed);
        }
        // 4. Held only with a quorum and validity left.
        let elapsed = start.elapsed();
        let validity = quorum::validity(ttl, elapsed, drift);
        let outcome = match (outcome, validity) {
            (Ok(fence), Some(v)) if v > self.inner.min_validity => {
                tracing::debug!(
                    nodes = self.inner.nodes.len(),
                    fenced = fence.is_some(),
                    elapsed_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
                    "redlock acquired"
                );
                pending.value = None;
                // The SETs still out land in the background, on every node that answers.
                let landing = stragglers.map(fanout::Stragglers::land);
                return Attempt::Held(Lock {
                    resource: Arc::clone(resource),
                    value,
                    started: start,
                    acquired_at: start,
                    valid_until: later(start, v),
                    ttl,
                    attempts: attempt,
                    fence,
                    foreign,
                    landing,
                });
            }
            (Ok(_), _) => Attempt::missed(LockError::ValidityExhausted {
                elapsed,
                ttl,
                attempts: 1,
            }),
            (Err(missed), _) => missed,
        };
        // 5. Failed: release on every node, including those that failed or did not answer
        // in time (their SET may have run while the reply was lost).
        self.release_key(
            &resource.key,
            value.as_bytes(),
            ttl,
            foreign,
            None,
            Wake::AtQuorum,
        )
        .await;
        pending.value = None;
        tracing::debug!(nodes = self.inner.nodes.len(), failure = ?outcome, "redlock attempt failed");
        outcome
    }

    /// Fencing phase 2 with the number phase 1 read: the number, or why it could not be
    /// recorded on a quorum.
    async fn fence(
        &self,
        resource: &Resource,
        value: &str,
        phase_one: &PhaseOne,
        deadline: Instant,
    ) -> Result<Option<u64>, LockError> {
        let token = phase_one.token();
        let keys = [&*resource.key, &*resource.counter_key];
        let retention_ms = super::ttl_ms(self.inner.fencing_retention);
        let mut round = fencing::phase_two(
            &self.inner.nodes,
            &keys,
            value.as_bytes(),
            token,
            retention_ms,
            deadline,
            phase_one.refused,
        )
        .await;
        if round.reached() {
            if let Some(stragglers) = round.stragglers.take() {
                stragglers.land();
            }
            Ok(Some(token))
        } else {
            Err(round.no_quorum())
        }
    }

    /// Step 2: `SET NX PX` on every node at once (as a script that also reads the
    /// fencing counter when fencing is on).
    async fn set_round(
        &self,
        target: &Target,
        value: &str,
        ttl: Duration,
        start: Instant,
        outer: Option<Instant>,
    ) -> SetRound {
        let resource = &target.resource;
        let ttl_ms = super::ttl_ms(ttl);
        let keys = [&*resource.key, &*resource.counter_key];
        let args = [Arg::Bytes(value.as_bytes()), Arg::Int(ttl_ms)];
        let request = if self.fencing {
            Request::Script(Invocation {
                script: &ACQUIRE_FENCED_SCRIPT,
                keys: &keys,
                args: &args,
            })
        } else if target.accepts == Accepts::LockOrRecord {
            Request::Script(Invocation {
                script: &ACQUIRE_OR_REPLAY_SCRIPT,
                keys: &keys[..1],
                args: &args,
            })
        } else {
            Request::SetNx {
                key: &resource.key,
                value: value.as_bytes(),
                ttl_ms,
            }
        };
        let deadline = self.call_deadline(start, ttl, outer);
        let mut retry_after = None;
        let mut held_by_others = false;
        let mut foreign = NodeMask::default();
        // The completion records found, one per node that answered with one.
        let mut records: Vec<Vec<u8>> = Vec::new();
        let mut fencing = PhaseOne::default();
        // Once a node answers with a completion record, every answer is awaited: the
        // nodes that answered with it need no release afterwards.
        let saw_record = AtomicBool::new(false);
        let round = fanout::decide_or_wait(
            &self.inner.nodes,
            &request,
            deadline,
            |_| true,
            |i, reply| {
                let outcome = reply.and_then(parse_acquire).and_then(|r| match r {
                    AcquireReply::Won { fence: None } => Ok(Outcome::Granted),
                    AcquireReply::Won { fence: Some(read) } => {
                        fencing.granted(read).map(|()| Outcome::Granted)
                    }
                    AcquireReply::HeldElsewhere { pttl, ours } => {
                        retry_after = retry_after.max(pttl);
                        held_by_others |= !ours;
                        foreign.insert(i);
                        Ok(Outcome::HeldElsewhere)
                    }
                    AcquireReply::Record(r) => {
                        saw_record.store(true, Ordering::Relaxed);
                        records.push(r);
                        foreign.insert(i);
                        Ok(Outcome::HeldElsewhere)
                    }
                });
                if !matches!(outcome, Ok(Outcome::Granted)) {
                    // Not ours there: phase 2 of fencing skips the node.
                    fencing.refused.insert(i);
                }
                outcome
            },
            || saw_record.load(Ordering::Relaxed),
        )
        .await;
        let record = agreed_record(records, self.quorum());
        SetRound {
            round,
            foreign,
            record,
            retry_after,
            held_by_others,
            fencing,
        }
    }

    /// [`retry_inner`](Self::retry_inner), observed (see [`observed`](Self::observed)).
    pub(super) async fn retry(
        &self,
        target: &Target,
        budget: Budget,
    ) -> Result<Acquired, LockError> {
        let acquisition = self.retry_inner(target, budget);
        self.observed(&target.resource, acquisition).await
    }

    /// Runs `acquisition` of `resource` in a `redlock.acquire` span that records the
    /// attempts, the elapsed time and the outcome, and counts it in the metrics.
    pub(super) async fn observed(
        &self,
        resource: &Resource,
        acquisition: impl Future<Output = Result<Acquired, LockError>>,
    ) -> Result<Acquired, LockError> {
        let span = self.span(Operation::Acquire, &resource.name);
        let start = Instant::now();
        let result = acquisition.instrument(span.clone()).await;
        let (attempts, outcome) = match &result {
            Ok(Acquired::Lock(lock)) => (lock.attempts, "acquired"),
            Ok(Acquired::Record { attempts, .. }) => (*attempts, "replayed"),
            Err(error) => (error.attempts().unwrap_or(1), error.outcome()),
        };
        crate::metrics::acquired(outcome, start.elapsed().as_secs_f64());
        if !span.is_disabled() {
            span.record("attempts", attempts);
            span.record("elapsed_us", elapsed_us(start));
            span.record("outcome", outcome);
        }
        result
    }

    /// Tries `attempt` until it succeeds, fails for good, or the `budget` is spent (its
    /// attempts made, or its deadline passed). While the name is busy it waits in the
    /// client's queue for the name (see `crate::waiters`): woken by the release, or after
    /// a jittered pause; other failures sleep a jittered pause. No wait outlasts the
    /// budget's waiting time: once it is spent, the attempts left go without pauses.
    async fn retry_inner(&self, target: &Target, budget: Budget) -> Result<Acquired, LockError> {
        let resource = &target.resource;
        let Budget {
            attempts: max_attempts,
            deadline,
            waits_until,
        } = budget;
        let past = |d: Option<Instant>| d.is_some_and(|d| Instant::now() >= d);
        // Arrival order: behind the tasks of this client that already wait for the name.
        let mut ticket = None;
        if self.inner.waiters.has_queue(&resource.key) {
            // The queue subscribes when its head finds another client holding the name.
            let t = self.queue_up(resource, false).await;
            t.wait(self.retry_pause(), waits_until).await;
            ticket = Some(t);
        }
        let mut attempt = 1;
        let mut previous: Option<LockError> = None;
        loop {
            // A deadline that passed while queued still leaves one honest attempt.
            let outer = deadline.filter(|d| attempt > 1 || Instant::now() < *d);
            if let Some(t) = &ticket {
                t.attempting();
            }
            let (failure, by_others) = match self.attempt(target, outer, attempt).await {
                Attempt::Held(lock) => {
                    if let Some(t) = ticket {
                        // The next waiter waits for this lock's release.
                        t.acquired(lock.valid_until);
                    }
                    return Ok(Acquired::Lock(lock));
                }
                Attempt::Record(record) => {
                    if let Some(t) = &ticket {
                        // The waiters behind need not wait for a release: there is a record.
                        t.done();
                    }
                    return Ok(Acquired::Record {
                        record,
                        attempts: attempt,
                    });
                }
                Attempt::Missed { error, by_others } => (error, by_others),
            };
            if past(deadline) && failure.cut_by_deadline() {
                // The deadline cut the last attempt short: the attempt before says more.
                return Err(previous.unwrap_or(failure).with_attempts(attempt));
            }
            if !failure.is_retryable() || attempt >= max_attempts {
                return Err(failure.with_attempts(attempt));
            }
            match (&failure, &ticket) {
                // Waiting means waiting: a head that will hear the release sleeps until
                // then, or until the holder's key expires, instead of short polls that
                // spend its attempts; one that will not hear it polls.
                (LockError::Busy { retry_after, .. }, Some(t)) => {
                    t.busy(*retry_after);
                    if by_others && !t.subscribed() {
                        // Only the nodes can tell of another client's release: subscribe,
                        // then try again at once (a release before that told nobody).
                        t.subscribe(&self.inner.nodes, self.inner.node_timeout)
                            .await;
                    } else {
                        // Told of the release (by this client's own holder, or by the
                        // nodes), the head waits up to the holder's TTL; otherwise it polls.
                        t.wait(self.retry_pause(), waits_until).await;
                    }
                }
                (LockError::Busy { retry_after, .. }, None) => {
                    let t = self.queue_up(resource, by_others).await;
                    t.busy(*retry_after);
                    if !t.is_head() {
                        t.wait(self.retry_pause(), waits_until).await;
                    }
                    // The first waiter tries again at once: a release that came before it
                    // queued up (or before its subscriptions were in place) told nobody.
                    ticket = Some(t);
                }
                _ => {
                    // Nodes kept out by the restart quarantine come back at a known time.
                    let pause = self.retry_pause().max(failure.quarantine_left());
                    let mut wake = later(Instant::now(), pause);
                    if let Some(end) = waits_until {
                        wake = wake.min(end);
                    }
                    tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
                }
            }
            if past(deadline) {
                return Err(failure.with_attempts(attempt));
            }
            previous = Some(failure);
            attempt += 1;
        }
    }

    /// A place in this client's queue for `resource`; with `subscribe`, subscribed to its
    /// release.
    async fn queue_up(&self, resource: &Resource, subscribe: bool) -> Ticket {
        let (nodes, timeout) = (&self.inner.nodes, self.inner.node_timeout);
        self.inner
            .waiters
            .join(&resource.key, nodes, timeout, subscribe)
            .await
    }

    /// A random pause from the retry policy: `[base, base + jitter)`.
    pub(crate) fn retry_pause(&self) -> Duration {
        jittered(self.inner.retry_delay, self.inner.retry_jitter)
    }
}

/// What an acquisition is after: a name's keys, for how long, and what may answer it.
pub(crate) struct Target {
    pub(crate) resource: Arc<Resource>,
    pub(crate) ttl: Duration,
    pub(crate) accepts: Accepts,
}

/// What an acquisition takes for an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accepts {
    /// The lock only.
    Lock,
    /// The lock, or the completion record stored under its key (the layer's replay): the
    /// record comes back as [`Acquired::Record`].
    LockOrRecord,
}

/// What bounds a retried acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// At most this many attempts.
    pub(crate) attempts: u32,
    /// No attempt starts and no node call runs past it (a deadline that passes while
    /// waiting still leaves one attempt).
    pub(crate) deadline: Option<Instant>,
    /// No wait between attempts (in the queue for a busy name, or a pause after another
    /// failure) lasts past it: at or before `deadline`.
    pub(crate) waits_until: Option<Instant>,
}

impl Budget {
    /// One attempt.
    pub(crate) fn once() -> Self {
        Self {
            attempts: 1,
            deadline: None,
            waits_until: None,
        }
    }

    /// As many attempts as fit before `deadline`.
    pub(crate) fn until(deadline: Instant) -> Self {
        Self {
            attempts: u32::MAX,
            deadline: Some(deadline),
            waits_until: Some(deadline),
        }
    }

    /// `attempts` attempts, waiting in all no longer than the pauses between them would
    /// take at their longest: `attempts × (delay + jitter)` from `now`.
    pub(crate) fn attempts(attempts: u32, delay: Duration, jitter: Duration, now: Instant) -> Self {
        let pause = delay.saturating_add(jitter);
        Self {
            attempts,
            deadline: None,
            waits_until: Some(later(now, pause.saturating_mul(attempts))),
        }
    }
}

/// The record that at least `quorum` of `records` (one per node) are, byte for byte: the
/// one to replay. Records on fewer nodes, or that differ (two runs that each recorded on a
/// minority, such as a handler that outlived its lock next to the next holder's), are
/// never replayed: those nodes count as held by another client.
fn agreed_record(mut records: Vec<Vec<u8>>, quorum: usize) -> Option<Vec<u8>> {
    let at = records
        .iter()
        .position(|r| records.iter().filter(|other| *other == r).count() >= quorum)?;
    Some(records.swap_remove(at))
}

/// A random delay in `[base, base + jitter)` (saturating at `Duration::MAX`).
fn jittered(base: Duration, jitter: Duration) -> Duration {
    let nanos = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return base;
    }
    let r = getrandom::u64().unwrap_or_else(|_| {
        // The OS generator failing is next to impossible; any spread will do for jitter.
        u64::from(Instant::now().elapsed().subsec_nanos()) ^ 0x9e37_79b9_7f4a_7c15
    });
    base.saturating_add(Duration::from_nanos(r % nanos))
}

/// Releases an acquisition attempt's value in the background if the attempt's future is
/// dropped before it finished (the SETs may have landed).
struct PendingRelease<'a> {
    redlock: &'a Redlock,
    resource: &'a Arc<Resource>,
    value: Option<Arc<str>>,
    ttl: Duration,
}

impl Drop for PendingRelease<'_> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            // The replies are unknown: release everywhere.
            self.redlock.release_in_background(
                Arc::clone(self.resource),
                value,
                self.ttl,
                NodeMask::default(),
                None,
                Wake::AtQuorum,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_record_a_quorum_agrees_on_is_replayed() {
        let (a, b) = (b"#record\na".to_vec(), b"#record\nb".to_vec());
        assert_eq!(agreed_record(vec![a.clone(), b.clone()], 2), None);
        assert_eq!(agreed_record(vec![a.clone()], 2), None);
        assert_eq!(
            agreed_record(vec![b.clone(), a.clone(), a.clone()], 2),
            Some(a.clone())
        );
        assert_eq!(agreed_record(vec![a.clone()], 1), Some(a));
        assert_eq!(agreed_record(Vec::new(), 1), None);
    }

    #[test]
    fn jitter_stays_in_range() {
        let base = Duration::from_millis(10);
        let jitter = Duration::from_millis(5);
        let mut distinct = std::collections::HashSet::new();
        for _ in 0..1000 {
            let d = jittered(base, jitter);
            assert!(d >= base && d < base + jitter, "{d:?}");
            distinct.insert(d);
        }
        assert!(distinct.len() > 100, "jitter is not random");
        assert_eq!(jittered(base, Duration::ZERO), base);
        assert_eq!(jittered(Duration::MAX, jitter), Duration::MAX);
    }
}
