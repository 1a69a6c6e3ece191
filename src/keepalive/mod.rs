//! The keep-alive driver: one task per client that extends every guarded lock when it is
//! due, instead of one task per lock.
//!
//! A guard hands its lock to the driver ([`start`]) and takes it back when released
//! ([`stop`]), through the driver's inbox ([`inbox`]): neither wakes the
//! driver task unless the lock is due before the driver would wake anyway, so a lock held
//! for less than its first extension interval costs the driver nothing. The driver keeps
//! the locks in a queue ordered by due time and sleeps until the earliest; extensions that
//! are due run concurrently inside the driver task, through the operations over the
//! client's core (`op::extend`, `op::release`). It holds the core and the waiters weakly
//! and ends once the client and every guard are gone. If the runtime
//! that ran it shut down, the next guard starts a new one on its own runtime. A driver
//! that stops while it still has locks (its runtime shut down, or a panic) never leaves
//! them silently unextended: their tokens are marked lost
//! ([`LostReason::KeepAliveStopped`]).
//!
//! ```text
//! guard a taken   -> start(a): inbox, due at a's TTL / 3      (the driver is not woken)
//! guard b taken   -> start(b): inbox, due earlier than the driver wakes -> woken
//! driver          -> take(), sleep until the earliest due -> Extend a, Extend b (concurrently)
//! guard a gone    -> stop(a): never extended again
//! extension fails -> a's token is marked lost, then a is released
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tracing::Instrument;

use crate::core::Core;
use crate::error::LockError;
use crate::op::extend::Extend;
use crate::op::observe::Observe;
use crate::op::release::Release;
use crate::op::retry::RetryPolicy;
use crate::quorum::later;
use crate::token::{Lock, LostReason, Shared};
use crate::waiters::Waiters;

pub(crate) mod inbox;

use inbox::{Guards, Inbox, KeepAlive, Start};

/// What the driver extends and releases with, as a client lends it: its core and
/// waiters, its guards (the driver's inbox), how its operations are observed and how long
/// a failed extension pauses.
#[derive(Clone, Copy)]
pub(crate) struct Keeper<'a> {
    pub(crate) core: &'a Arc<Core>,
    pub(crate) waiters: &'a Arc<Waiters>,
    pub(crate) guards: &'a Guards,
    pub(crate) observe: Observe,
    pub(crate) retry: RetryPolicy,
}

impl Keeper<'_> {
    /// A handle that does not keep the client alive, for the driver task.
    fn downgrade(self) -> Dormant {
        Dormant {
            core: Arc::downgrade(self.core),
            waiters: Arc::downgrade(self.waiters),
            observe: self.observe,
            retry: self.retry,
        }
    }
}

/// The driver's hold on the client: weak, so that the client can go away.
struct Dormant {
    core: Weak<Core>,
    waiters: Weak<Waiters>,
    observe: Observe,
    retry: RetryPolicy,
}

impl Dormant {
    /// The client's core and waiters, while the client lives.
    fn upgrade(&self) -> Option<Alive> {
        Some(Alive {
            core: self.core.upgrade()?,
            waiters: self.waiters.upgrade()?,
            observe: self.observe,
            retry: self.retry,
        })
    }
}

/// The client, while the driver acts for it.
#[derive(Clone)]
struct Alive {
    core: Arc<Core>,
    waiters: Arc<Waiters>,
    observe: Observe,
    retry: RetryPolicy,
}

/// Hands the lock of `shared` to the driver of `keeper`'s client, starting one if none
/// runs. Returns the lock's id for [`stop`], or `None` outside a tokio runtime (the lock
/// then runs out). The driver is only woken if the lock is due before it would wake anyway.
pub(crate) fn start(keeper: Keeper<'_>, shared: Arc<Shared>, policy: KeepAlive) -> Option<u64> {
    let handle = tokio::runtime::Handle::try_current().ok()?;
    let id = keeper.guards.next_id();
    let (interval, hold_end) = timing(&shared.lock, &policy);
    let start = Start {
        id,
        due: due(hold_end, later(shared.lock.started(), interval)),
        shared,
        policy,
        span: tracing::Span::current(),
    };
    let mut driver = keeper.guards.driver();
    let start = match driver.as_ref() {
        Some(inbox) => match inbox.start(start) {
            Ok(()) => return Some(id),
            Err(start) => start,
        },
        None => start,
    };
    // No driver, or its runtime is gone: start one here.
    let inbox = Arc::new(Inbox::default());
    inbox.start(start).ok()?;
    let handed = Handed {
        inbox: Arc::clone(&inbox),
        locks: HashMap::new(),
    };
    handle.spawn(drive(keeper.downgrade(), handed));
    *driver = Some(inbox);
    Some(id)
}

/// Stops extending lock `id` of a client with `guards` (its guard is releasing it).
/// Never wakes the driver.
pub(crate) fn stop(guards: &Guards, id: u64) {
    if let Some(inbox) = guards.driver().as_ref() {
        inbox.stop(id);
    }
}

/// One guarded lock, between extensions.
struct Entry {
    shared: Arc<Shared>,
    /// The span of the code that took the guard.
    span: tracing::Span,
    /// The lock as of its last extension.
    lock: Lock,
    policy: KeepAlive,
    hold_end: Option<Instant>,
    interval: Duration,
    extensions: u32,
    /// Attempts at the current extension (retries of a transient failure included).
    attempts: u32,
}

impl Entry {
    fn new(start: Start) -> Self {
        let Start {
            shared,
            policy,
            span,
            ..
        } = start;
        let lock = shared.lock.clone();
        let (interval, hold_end) = timing(&lock, &policy);
        Self {
            span,
            hold_end,
            shared,
            lock,
            policy,
            interval,
            extensions: 0,
            attempts: 0,
        }
    }

    /// When to act next: the next extension, or the end of the hold if sooner.
    fn due(&self, next: Instant) -> Instant {
        due(self.hold_end, next)
    }
}

/// How `lock`, kept alive per `policy`, is extended: the interval between extensions, and
/// the end of the longest hold, if there is one.
fn timing(lock: &Lock, policy: &KeepAlive) -> (Duration, Option<Instant>) {
    let interval = lock.ttl().mul_f64(policy.fraction);
    (interval, policy.max_hold.map(|h| later(lock.started(), h)))
}

/// When to act next: at `next`, or at the end of the hold if sooner.
fn due(hold_end: Option<Instant>, next: Instant) -> Instant {
    hold_end.map_or(next, |end| end.min(next))
}

/// What a piece of the driver's work came to: an extension of a lock with its result, or
/// `None` for a finished release.
type Done = Option<(u64, Entry, Result<(), LockError>)>;

type Work = Pin<Box<dyn Future<Output = Done> + Send>>;

/// The locks the driver keeps alive, by id, and their due times.
#[derive(Default)]
struct Queue {
    entries: HashMap<u64, Entry>,
    /// Due times; an id no longer in `entries` (stopped) is skipped when it comes up.
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Locks whose extension is running.
    in_flight: HashSet<u64>,
    /// Locks stopped while their extension was running: not to be scheduled again.
    stopped: HashSet<u64>,
}

impl Queue {
    fn stop(&mut self, id: u64) {
        if self.entries.remove(&id).is_none() && self.in_flight.contains(&id) {
            self.stopped.insert(id);
        }
    }

    /// An extension of `id` came back; false if the lock was stopped meanwhile.
    fn landed(&mut self, id: u64) -> bool {
        self.in_flight.remove(&id);
        !self.stopped.remove(&id)
    }

    fn schedule(&mut self, id: u64, entry: Entry, at: Instant) {
        self.entries.insert(id, entry);
        self.due.push(Reverse((at, id)));
    }

    fn next_due(&self) -> Option<Instant> {
        self.due.peek().map(|Reverse((at, _))| *at)
    }

    /// The next entry whose time has come.
    fn pop_due(&mut self, now: Instant) -> Option<(u64, Entry)> {
        while let Some(Reverse((at, id))) = self.due.peek().copied() {
            if at > now {
                return None;
            }
            self.due.pop();
            if let Some(entry) = self.entries.remove(&id) {
                return Some((id, entry));
            }
        }
        None
    }
}

/// The locks a driver has taken from its inbox and not yet been told to stop: marked lost,
/// with those still in the inbox, if the driver goes away (dropped with its runtime, or
/// unwound by a panic) while they are there.
struct Handed {
    inbox: Arc<Inbox>,
    locks: HashMap<u64, Arc<Shared>>,
}

impl Drop for Handed {
    fn drop(&mut self) {
        self.inbox.close();
        for shared in self.locks.values() {
            shared.mark_lost(LostReason::KeepAliveStopped);
        }
    }
}

/// The driver's loop. `handed` is built by the caller, so that a driver dropped before its
/// first poll still marks the locks in its inbox lost.
async fn drive(client: Dormant, mut handed: Handed) {
    let mut queue = Queue::default();
    let mut work: FuturesUnordered<Work> = FuturesUnordered::new();
    let timer = tokio::time::sleep_until(tokio::time::Instant::now());
    tokio::pin!(timer);
    loop {
        let client_gone = take_inbox(&mut handed, &mut queue);
        if client_gone && queue.entries.is_empty() && work.is_empty() {
            return;
        }
        // Due entries, after the inbox: a lock taken back is never extended again.
        let now = crate::clock::now();
        if queue.next_due().is_some_and(|at| at <= now) {
            let Some(alive) = client.upgrade() else {
                return;
            };
            while let Some((id, entry)) = queue.pop_due(now) {
                if let Some(w) = act(&alive, id, entry, &mut queue) {
                    work.push(w);
                }
            }
        }
        let next_due = queue.next_due();
        if !handed.inbox.wait_until(next_due) {
            continue;
        }
        if let Some(at) = next_due {
            timer.as_mut().reset(tokio::time::Instant::from_std(at));
        }
        tokio::select! {
            () = handed.inbox.told() => {}
            // Due entries are acted on at the top of the loop.
            () = &mut timer, if next_due.is_some() => {}
            Some(done) = work.next(), if !work.is_empty() => {
                let Some((id, entry, result)) = done else { continue };
                if !queue.landed(id) {
                    continue;
                }
                let Some(alive) = client.upgrade() else { return };
                if let Some(w) = extended(&alive, id, entry, result, &mut queue) {
                    work.push(w);
                }
            }
        }
    }
}

/// Takes what the inbox holds into the driver's `queue`: the stops, then the starts.
/// Whether the client is gone.
fn take_inbox(handed: &mut Handed, queue: &mut Queue) -> bool {
    let taken = handed.inbox.take();
    for id in taken.stops {
        handed.locks.remove(&id);
        queue.stop(id);
    }
    for start in taken.starts {
        handed.locks.insert(start.id, Arc::clone(&start.shared));
        let (id, due) = (start.id, start.due);
        queue.schedule(id, Entry::new(start), due);
    }
    taken.client_gone
}

/// An entry is due: stop at the maximum hold, let the lock run out after the last allowed
/// extension, or extend it.
fn act(client: &Alive, id: u64, mut entry: Entry, queue: &mut Queue) -> Option<Work> {
    if entry.shared.lost_reason().is_some() {
        return None;
    }
    let now = crate::clock::now();
    if entry.hold_end.is_some_and(|end| now >= end) {
        return Some(finish(client, entry, LostReason::MaxHoldReached));
    }
    if entry.shared.stall.fire_if_stalled(now) {
        let lock = client.observe.shown_name(entry.lock.name());
        entry.span.in_scope(|| {
            tracing::warn!(%lock, timeout = ?entry.shared.stall.timeout(), "redlock layer: the response body holding the lock was not read for its stall timeout: releasing");
        });
        return Some(finish(client, entry, LostReason::BodyStalled));
    }
    if entry
        .policy
        .max_extensions
        .is_some_and(|max| entry.extensions >= max)
    {
        let end = entry.lock.valid_until();
        if now < end {
            // Let the last validity run out, then say so (and clean up); whoever sees the
            // deadline pass first gives this reason.
            entry.shared.runs_out_as(LostReason::MaxExtensionsReached);
            queue.schedule(id, entry, end);
            return None;
        }
        return Some(finish(client, entry, LostReason::MaxExtensionsReached));
    }
    entry.attempts = entry.attempts.saturating_add(1);
    queue.in_flight.insert(id);
    let core = Arc::clone(&client.core);
    let observe = client.observe;
    let span = entry.span.clone();
    Some(Box::pin(
        async move {
            let ttl = entry.lock.ttl();
            let extend = Extend { core: &core };
            let result = extend.observed(observe, &mut entry.lock, ttl).await;
            Some((id, entry, result))
        }
        .instrument(span),
    ))
}

/// An extension came back: schedule the next one, retry a transient failure while the
/// validity leaves room, or declare the lock lost.
fn extended(
    client: &Alive,
    id: u64,
    mut entry: Entry,
    result: Result<(), LockError>,
    queue: &mut Queue,
) -> Option<Work> {
    if entry.shared.lost_reason().is_some() {
        return None; // released meanwhile
    }
    match result {
        Ok(()) => {
            entry.extensions += 1;
            entry.attempts = 0;
            entry.shared.set_valid_until(entry.lock.valid_until());
            tracing::trace!(extensions = entry.extensions, "redlock guard extended");
            let at = entry.due(later(entry.lock.started(), entry.interval));
            queue.schedule(id, entry, at);
            None
        }
        Err(failure) => {
            let retry_in = client.retry.pause();
            let needed = retry_in.saturating_add(client.core.node_timeout().saturating_mul(2));
            if failure.is_retryable() && entry.lock.remaining() > needed {
                tracing::debug!(?failure, "redlock guard extension failed: retrying");
                let at = entry.due(later(crate::clock::now(), retry_in));
                queue.schedule(id, entry, at);
                return None;
            }
            let error = failure.with_attempts(entry.attempts);
            let lock = client.observe.shown_name(entry.lock.name());
            entry.span.in_scope(|| {
                tracing::warn!(%lock, %error, "redlock guard lost its lock");
            });
            Some(finish(client, entry, LostReason::ExtendFailed(error)))
        }
    }
}

/// Signals the loss first (so holders stop at once), then releases what is left.
fn finish(client: &Alive, entry: Entry, reason: LostReason) -> Work {
    entry.shared.mark_lost(reason);
    let client = client.clone();
    Box::pin(async move {
        let release = Release {
            core: &client.core,
            waiters: &client.waiters,
        };
        let _ = release.unlock(client.observe, &entry.lock).await;
        None
    })
}
