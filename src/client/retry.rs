//! The retry loop around an attempt: the budget (attempts, waiting time, deadline), the
//! wait in this client's queue for a busy name (woken by its release), and the jittered
//! pause after other failures.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"])
//!     .max_attempts(5)
//!     .retry_delay(Duration::from_millis(50), Duration::from_millis(10))
//!     .build()?;
//! // Up to 5 attempts, waiting at most 5 × (50 ms + 10 ms) in all for the holder's release.
//! let lock = redlock.lock("report:7").await?;
//! redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::Redlock;
use super::acquire::{Acquired, Attempt, Target};
use super::spans::{Operation, elapsed_us};
use crate::error::LockError;
use crate::name::Resource;
use crate::quorum::later;
use crate::waiters::Ticket;

/// A missed attempt, as the pause before the next sees it.
struct Missed<'a> {
    failure: &'a LockError,
    /// Whether another client, not this one, holds the name somewhere.
    by_others: bool,
}

impl Attempt {
    /// The outcome of an acquisition that ended with this attempt (its `attempts`th),
    /// holding `ticket` in this client's queue for the name: the next waiter waits for
    /// the lock's release, or need not wait at all (there is a record).
    fn finish_queued(self, attempts: u32, ticket: Option<Ticket>) -> Result<Acquired, LockError> {
        if let Some(t) = ticket {
            match &self {
                Self::Held(lock) => t.acquired(lock.valid_until),
                _ => t.done(),
            }
        }
        self.finish(attempts)
    }
}

impl Redlock {
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
        let past = |d: Option<Instant>| d.is_some_and(|d| Instant::now() >= d);
        // Arrival order: behind the tasks of this client that already wait for the name.
        let mut ticket = None;
        if self.inner.waiters.has_queue(&target.resource.key) {
            // The queue subscribes when its head finds another client holding the name.
            let t = self.inner.waiters.join(&target.resource.key);
            t.wait(self.retry_pause(), budget.waits_until).await;
            ticket = Some(t);
        }
        let mut attempt = 1;
        let mut previous: Option<LockError> = None;
        loop {
            // A deadline that passed while queued still leaves one honest attempt.
            let outer = budget
                .deadline
                .filter(|d| attempt > 1 || Instant::now() < *d);
            if let Some(t) = &ticket {
                t.attempting();
            }
            let (failure, by_others) = match self.attempt(target, outer, attempt).await {
                Attempt::Missed { error, by_others } => (error, by_others),
                done => return done.finish_queued(attempt, ticket),
            };
            if past(budget.deadline) && failure.cut_by_deadline() {
                // The deadline cut the last attempt short: the attempt before says more.
                return Err(previous.unwrap_or(failure).with_attempts(attempt));
            }
            if !failure.is_retryable() || attempt >= budget.attempts {
                return Err(failure.with_attempts(attempt));
            }
            let missed = Missed {
                failure: &failure,
                by_others,
            };
            self.pause(target, missed, &mut ticket, budget.waits_until)
                .await;
            if past(budget.deadline) {
                return Err(failure.with_attempts(attempt));
            }
            previous = Some(failure);
            attempt += 1;
        }
    }

    /// The wait after a missed attempt, before the next. Waiting means waiting: a head of
    /// the queue that will hear the release sleeps until then, or until the holder's key
    /// expires, instead of short polls that spend its attempts; one that will not hear it
    /// polls. Other failures pause a jittered delay. No wait lasts past `waits_until`.
    async fn pause(
        &self,
        target: &Target,
        missed: Missed<'_>,
        ticket: &mut Option<Ticket>,
        waits_until: Option<Instant>,
    ) {
        let LockError::Busy { retry_after, .. } = missed.failure else {
            // Nodes kept out by the restart quarantine come back at a known time.
            let pause = self.retry_pause().max(missed.failure.quarantine_left());
            let mut wake = later(Instant::now(), pause);
            if let Some(end) = waits_until {
                wake = wake.min(end);
            }
            tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
            return;
        };
        let Some(t) = ticket else {
            let t = self.inner.waiters.join(&target.resource.key);
            if missed.by_others {
                t.subscribe(&self.inner.nodes, self.inner.node_timeout)
                    .await;
            }
            t.busy(*retry_after);
            if !t.is_head() {
                t.wait(self.retry_pause(), waits_until).await;
            }
            // The first waiter tries again at once: a release that came before it queued
            // up (or before its subscriptions were in place) told nobody.
            *ticket = Some(t);
            return;
        };
        t.busy(*retry_after);
        if missed.by_others && !t.subscribed() {
            // Only the nodes can tell of another client's release: subscribe, then try
            // again at once (a release before that told nobody).
            t.subscribe(&self.inner.nodes, self.inner.node_timeout)
                .await;
        } else {
            // Told of the release (by this client's own holder, or by the nodes), the head
            // waits up to the holder's TTL; otherwise it polls.
            t.wait(self.retry_pause(), waits_until).await;
        }
    }

    /// A random pause from the retry policy: `[base, base + jitter)`.
    pub(crate) fn retry_pause(&self) -> Duration {
        jittered(self.inner.retry_delay, self.inner.retry_jitter)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
