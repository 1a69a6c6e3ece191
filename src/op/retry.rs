//! The retry loop around an attempt: the budget (attempts, waiting time, deadline), the
//! wait in this client's queue for a busy name (woken by its release), and the jittered
//! pause after other failures.
//!
//! ```text
//! Retry { acquire, waiters, policy }.run(&target, budget)
//!   [queued behind this client's waiters for the name]
//!   attempt 1 -> Held / Record: done
//!             -> Missed(busy):  join the queue (subscribe if another client holds it),
//!                               wait for the release or the holder's TTL -> attempt 2 ...
//!             -> Missed(other): sleep [delay, delay + jitter)        -> attempt 2 ...
//!   until the budget's attempts are made or its deadline passed
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tracing::Instrument;

use super::acquire::{Acquire, Acquired, Attempt};
use super::mark::mark_waiting;
use super::observe::{Observe, Operation, elapsed_us};
use super::release::Background;
use crate::core::{Core, Target};
use crate::error::LockError;
use crate::name::Resource;
use crate::quorum::later;
use crate::waiters::{Ticket, Waiters};

/// A client's retry policy: how many attempts, the pause between them, and the overall
/// deadline of a `lock()` call, if any.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    max_attempts: u32,
    delay: Duration,
    jitter: Duration,
    deadline: Option<Duration>,
}

impl RetryPolicy {
    /// At most `max_attempts` attempts, pausing `[delay, delay + jitter)` between them,
    /// within `deadline` of the call if given.
    pub(crate) fn new(
        max_attempts: u32,
        delay: Duration,
        jitter: Duration,
        deadline: Option<Duration>,
    ) -> Self {
        Self {
            max_attempts,
            delay,
            jitter,
            deadline,
        }
    }

    /// The budget of a `lock()` call that starts `now`.
    pub(crate) fn budget(&self, now: Instant) -> RetryBudget {
        match self.deadline {
            Some(d) => RetryBudget {
                attempts: self.max_attempts,
                ..RetryBudget::until(later(now, d))
            },
            None => RetryBudget::attempts(self.max_attempts, self.delay, self.jitter, now),
        }
    }

    /// A random pause from the policy: `[delay, delay + jitter)`.
    pub(crate) fn pause(&self) -> Duration {
        jittered(self.delay, self.jitter)
    }
}

/// What bounds a retried acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryBudget {
    /// At most this many attempts.
    attempts: u32,
    /// No attempt starts and no node call runs past it (a deadline that passes while
    /// waiting still leaves one attempt).
    deadline: Option<Instant>,
    /// No wait between attempts (in the queue for a busy name, or a pause after another
    /// failure) lasts past it: at or before `deadline`.
    waits_until: Option<Instant>,
}

impl RetryBudget {
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
    fn attempts(attempts: u32, delay: Duration, jitter: Duration, now: Instant) -> Self {
        let pause = delay.saturating_add(jitter);
        Self {
            attempts,
            deadline: None,
            waits_until: Some(later(now, pause.saturating_mul(attempts))),
        }
    }
}

/// The retry operation: `acquire`'s attempts, queued in `waiters` for a busy name, paused
/// per `policy`.
pub(crate) struct Retry<'a, B> {
    pub(crate) acquire: Acquire<'a, B>,
    pub(crate) waiters: &'a Arc<Waiters>,
    pub(crate) policy: &'a RetryPolicy,
}

impl<B: Background> Retry<'_, B> {
    /// Tries an attempt until one succeeds, fails for good, or the `budget` is spent (its
    /// attempts made, or its deadline passed). While the name is busy it waits in the
    /// client's queue for the name (see `crate::waiters`): woken by the release, or after
    /// a jittered pause; other failures sleep a jittered pause. No wait outlasts the
    /// budget's waiting time: once it is spent, the attempts left go without pauses.
    pub(crate) async fn run(
        &self,
        target: &Target,
        budget: RetryBudget,
    ) -> Result<Acquired, LockError> {
        let past = |d: Option<Instant>| d.is_some_and(|d| crate::clock::now() >= d);
        // Arrival order: behind the tasks of this client that already wait for the name.
        let mut ticket = None;
        if self.waiters.has_queue(&target.resource.key) {
            // The queue subscribes when its head finds another client holding the name.
            let t = self.waiters.join(&target.resource.key);
            t.wait(self.policy.pause(), budget.waits_until).await;
            ticket = Some(t);
        }
        let mut attempt = 1;
        let mut previous: Option<LockError> = None;
        loop {
            // A deadline that passed while queued still leaves one honest attempt.
            let outer = budget
                .deadline
                .filter(|d| attempt > 1 || crate::clock::now() < *d);
            if let Some(t) = &ticket {
                t.attempting();
            }
            let (failure, by_others) = match self.acquire.attempt(target, outer, attempt).await {
                Attempt::Missed { error, by_others } => (error, by_others),
                done => return finish_queued(done, attempt, ticket),
            };
            if past(budget.deadline) && failure.cut_by_deadline() {
                // The deadline cut the last attempt short: the attempt before says more.
                return Err(previous.unwrap_or(failure).with_attempts(attempt));
            }
            if !failure.is_retryable() || attempt >= budget.attempts {
                return Err(failure.with_attempts(attempt));
            }
            let wait = Wait {
                failure: &failure,
                by_others,
                waits_until: budget.waits_until,
            };
            self.pause(target, wait, &mut ticket).await;
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
    async fn pause(&self, target: &Target, wait: Wait<'_>, ticket: &mut Option<Ticket>) {
        let LockError::Busy { retry_after, .. } = wait.failure else {
            // Nodes kept out by the restart quarantine come back at a known time.
            let pause = self.policy.pause().max(wait.failure.quarantine_left());
            let mut wake = later(crate::clock::now(), pause);
            if let Some(end) = wait.waits_until {
                wake = wake.min(end);
            }
            tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
            return;
        };
        let Some(t) = ticket else {
            let t = self.waiters.join(&target.resource.key);
            if wait.by_others {
                self.listen(target, &t, *retry_after, wait.waits_until)
                    .await;
            }
            t.busy(*retry_after);
            if !t.is_head() {
                t.wait(self.policy.pause(), wait.waits_until).await;
            }
            // The first waiter tries again at once: a release that came before it queued
            // up (or before its subscriptions were in place) told nobody.
            *ticket = Some(t);
            return;
        };
        t.busy(*retry_after);
        let subscribed = t.subscribed();
        if wait.by_others {
            // Only the nodes can tell of another client's release, and only while the
            // mark is there: subscribed if not yet, the mark renewed for this wait.
            self.listen(target, t, *retry_after, wait.waits_until).await;
        }
        if !wait.by_others || subscribed {
            // Told of the release (by this client's own holder, or by the nodes), the head
            // waits up to the holder's TTL; otherwise it polls.
            t.wait(self.policy.pause(), wait.waits_until).await;
        }
        // Just subscribed: it tries again at once (a release before that told nobody).
    }

    /// Listens for another client's release of `t`'s name: subscribes the queue (unless
    /// it is already), then marks the nodes for the wait of its head (see `super::mark`),
    /// unless the queue's last mark lasts long enough: until the head's next attempt at the
    /// latest (the holder's TTL, `retry_after`, or a retry pause; no later than
    /// `waits_until`), with a margin for that attempt and the mark after it, so a mark
    /// renewed at each wait never lapses while the queue waits.
    async fn listen(
        &self,
        target: &Target,
        t: &Ticket,
        retry_after: Option<Duration>,
        waits_until: Option<Instant>,
    ) {
        let core = self.acquire.core;
        t.subscribe(core.nodes(), core.node_timeout()).await;
        let now = crate::clock::now();
        let mut next = later(now, retry_after.unwrap_or_else(|| self.policy.pause()));
        if let Some(end) = waits_until {
            next = next.min(end);
        }
        let until = later(next, MARK_MARGIN.saturating_add(core.node_timeout()));
        if t.marked_until(until) {
            return;
        }
        let marked = mark_waiting(core, &target.resource, until.saturating_duration_since(now));
        t.marked(until, marked.await >= core.quorum());
    }
}

/// How long a waiter's mark outlasts the head's next attempt (besides a node timeout).
const MARK_MARGIN: Duration = Duration::from_secs(1);

/// Runs `acquisition` of `resource` in a `redlock.acquire` span (per `observe`) that
/// records the attempts, the elapsed time and the outcome, and counts it in the metrics.
pub(crate) fn observed<N: ?Sized>(
    observe: Observe,
    core: &Core<N>,
    resource: &Resource,
    acquisition: impl Future<Output = Result<Acquired, LockError>>,
) -> impl Future<Output = Result<Acquired, LockError>> {
    // Not an `async fn`: one would keep `acquisition` both as its argument and as the
    // future it awaits, twice the acquisition's size in every caller's future.
    let span = observe.span(core, Operation::Acquire, &resource.name);
    let start = crate::clock::now();
    acquisition.instrument(span.clone()).map(move |result| {
        let (attempts, outcome) = match &result {
            Ok(Acquired::Lock(lock)) => (lock.attempts, "acquired"),
            Ok(Acquired::Record { attempts, .. }) => (*attempts, "replayed"),
            Err(error) => (error.attempts().unwrap_or(1), error.outcome()),
        };
        crate::metrics::acquired(outcome, crate::clock::since(start).as_secs_f64());
        if !span.is_disabled() {
            span.record("attempts", attempts);
            span.record("elapsed_us", elapsed_us(start));
            span.record("outcome", outcome);
        }
        result
    })
}

/// What the wait after a missed attempt goes by: why it missed, whether another client
/// holds the name somewhere, and the end of the budget's waiting time.
struct Wait<'a> {
    failure: &'a LockError,
    by_others: bool,
    waits_until: Option<Instant>,
}

/// The outcome of an acquisition that ended with `attempt` (its `attempts`th), holding
/// `ticket` in this client's queue for the name: the next waiter waits for the lock's
/// release, or need not wait at all (there is a record).
fn finish_queued(
    attempt: Attempt,
    attempts: u32,
    ticket: Option<Ticket>,
) -> Result<Acquired, LockError> {
    if let Some(t) = ticket {
        match &attempt {
            Attempt::Held(lock) => t.acquired(lock.valid_until),
            _ => t.done(),
        }
    }
    attempt.finish(attempts)
}

/// A random delay in `[base, base + jitter)` (saturating at `Duration::MAX`).
fn jittered(base: Duration, jitter: Duration) -> Duration {
    let nanos = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return base;
    }
    let r = getrandom::u64().unwrap_or_else(|_| {
        // The OS generator failing is next to impossible; any spread will do for jitter.
        u64::from(std::time::Instant::now().elapsed().subsec_nanos()) ^ 0x9e37_79b9_7f4a_7c15
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
