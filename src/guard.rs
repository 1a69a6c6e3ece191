//! [`LockGuard`]: a held lock that extends itself while the work runs and says when it is lost.
//!
//! A lock with a fixed TTL is either too short (the work outlives it and a second holder
//! starts) or too long (a crashed holder blocks everyone). A guard keeps a short TTL alive:
//! a background task extends the lock every `TTL * extend_fraction` (default a third of the
//! TTL), with the same quorum and validity rule as acquiring, until the guard is released
//! or dropped, or a maximum hold time or number of extensions is reached.
//!
//! When an extension fails (the key is gone or replaced, no quorum answers in time, the
//! validity ran out, a maximum was reached), the guard and every [`LockToken`] cloned from
//! it learn it at once: [`LockToken::lost`] resolves with the [`LostReason`], and
//! [`LockToken::is_held`] turns false. `is_held` also turns false when the validity
//! deadline passes without a successful extension, even if the extension task could not run.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"])
//!     .ttl(Duration::from_secs(6)) // extended every 2 s while held
//!     .max_hold(Some(Duration::from_secs(600)))
//!     .build()?;
//! let guard = redlock.acquire("nightly-report").await?;
//! let token = guard.token();
//! tokio::select! {
//!     reason = token.lost() => eprintln!("lock lost ({reason}): stopping"),
//!     _ = async { /* long work; check token.is_held() before each write */ } => {}
//! }
//! guard.release().await;
//! # Ok(()) }
//! ```
//!
//! # Choosing the numbers
//!
//! - **TTL**: how long others wait after a crash. With a guard it can be short (seconds):
//!   it only has to outlast one extension interval plus a slow round of node calls.
//! - **Extension fraction**: extending at a third of the TTL leaves two thirds for retries
//!   of a failed extension before the validity runs out.
//! - **Maximum hold**: a bound on how long a runaway holder can keep others out.
//!
//! # What the lost signal cannot promise
//!
//! The signal is a best effort from the holder's side: a process that is paused (a GC
//! pause, a VM migration, `SIGSTOP`) between checking [`LockToken::is_held`] and writing
//! can still write after its lock expired and another client took it. Only the store that
//! receives the write can reject such a late write, by comparing a fencing number that
//! grows with each new holder: [`LockToken::fencing_token`], see [`crate::fencing`].

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::{Redlock, Released};
use crate::error::LockError;
use crate::token::{Lock, LockToken};

/// Why a guarded lock was lost.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LostReason {
    /// An extension failed for good: the lock is no longer ours on a quorum, no quorum
    /// answered before the validity ran out, or the quorum came too late.
    ExtendFailed(LockError),
    /// The maximum hold time was reached; the lock was released.
    MaxHoldReached,
    /// The maximum number of extensions was made; the lock was released at the end of the
    /// last extension's validity.
    MaxExtensionsReached,
    /// The guard was released or dropped while a token was still in use.
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ExtendFailed(e) => write!(f, "extending the lock failed: {e}"),
            Self::MaxHoldReached => f.write_str("the maximum hold time was reached"),
            Self::MaxExtensionsReached => {
                f.write_str("the maximum number of extensions was reached")
            }
            Self::Released => f.write_str("the lock was released"),
        }
    }
}

/// The state every token of one acquisition shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) lock: Lock,
    valid_until: Mutex<Instant>,
    lost: watch::Sender<Option<LostReason>>,
}

impl Shared {
    pub(crate) fn new(lock: Lock) -> Arc<Self> {
        let valid_until = Mutex::new(lock.valid_until());
        Arc::new(Self {
            lock,
            valid_until,
            lost: watch::channel(None).0,
        })
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn set_valid_until(&self, t: Instant) {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = t;
    }

    /// Marks the lock lost (the first reason wins).
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        self.lost.send_if_modified(|cur| {
            if cur.is_none() {
                *cur = Some(reason);
                true
            } else {
                false
            }
        });
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.lost.borrow().clone()
    }

    pub(crate) fn is_held(&self) -> bool {
        self.lost.borrow().is_none() && Instant::now() < self.valid_until()
    }

    pub(crate) async fn lost(&self) -> LostReason {
        let mut rx = self.lost.subscribe();
        loop {
            if let Some(reason) = rx.borrow_and_update().clone() {
                return reason;
            }
            if rx.changed().await.is_err() {
                // Unreachable while `self` holds the sender; treat as released.
                return LostReason::Released;
            }
        }
    }
}

/// How a [`LockGuard`] keeps its lock alive; set on the builder
/// ([`extend_fraction`](crate::RedlockBuilder::extend_fraction),
/// [`max_hold`](crate::RedlockBuilder::max_hold),
/// [`max_extensions`](crate::RedlockBuilder::max_extensions)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeepAlive {
    pub(crate) fraction: f64,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) max_extensions: Option<u32>,
}

/// A held lock that extends itself in the background; see the [module docs](self).
///
/// Release it with [`release`](Self::release); dropping it releases in a spawned task
/// (never blocking, also while the runtime shuts down).
pub struct LockGuard {
    redlock: Redlock,
    token: LockToken,
    task: Option<JoinHandle<()>>,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// Guards `lock`, extending it in the background per `keep_alive` (if given).
    pub(crate) fn new(redlock: Redlock, lock: Lock, keep_alive: Option<KeepAlive>) -> Self {
        let shared = Shared::new(lock);
        let task = keep_alive.and_then(|ka| {
            let handle = tokio::runtime::Handle::try_current().ok()?;
            Some(handle.spawn(keep_alive_task(redlock.clone(), Arc::clone(&shared), ka)))
        });
        Self {
            redlock,
            token: LockToken::from_shared(shared),
            task,
            released: false,
        }
    }

    /// A token for this lock: cheap to clone, carries the lost signal. The guard itself
    /// dereferences to it, so `guard.is_held()`, `guard.lost()` and the rest work too.
    pub fn token(&self) -> LockToken {
        self.token.clone()
    }

    /// Stops extending and releases the lock on every node, reporting the outcome.
    pub async fn release(mut self) -> Released {
        self.release_now().await
    }

    /// The release, as a future that owns what it needs; the guard stays armed (dropping
    /// it still releases in the background) until [`disarm`](Self::disarm).
    pub(crate) fn release_future(&mut self) -> BoxFuture<'static, Released> {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let redlock = self.redlock.clone();
        let shared = Arc::clone(self.token.shared());
        Box::pin(async move {
            let out = redlock.unlock(&shared.lock).await;
            shared.mark_lost(LostReason::Released);
            out
        })
    }

    pub(crate) fn disarm(&mut self) {
        self.released = true;
    }

    async fn release_now(&mut self) -> Released {
        let out = self.release_future().await;
        self.disarm();
        out
    }
}

impl std::ops::Deref for LockGuard {
    type Target = LockToken;

    fn deref(&self) -> &LockToken {
        &self.token
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if !self.released {
            let shared = self.token.shared();
            shared.mark_lost(LostReason::Released);
            let lock = &shared.lock;
            self.redlock.release_in_background(
                Arc::clone(&lock.resource),
                Arc::clone(&lock.value),
                lock.ttl,
            );
        }
    }
}

/// Extends the lock every `ttl * fraction` until stopped, lost, or a maximum is reached.
async fn keep_alive_task(redlock: Redlock, shared: Arc<Shared>, ka: KeepAlive) {
    let mut lock = shared.lock.clone();
    let acquired = lock.started();
    let ttl = lock.ttl();
    let interval = ttl.mul_f64(ka.fraction);
    let hold_end = ka.max_hold.map(|h| acquired + h);
    let mut extensions = 0u32;
    let mut next = lock.started() + interval;
    loop {
        let wake = hold_end.map_or(next, |end| end.min(next));
        tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
        if hold_end.is_some_and(|end| Instant::now() >= end) {
            finish(&redlock, &shared, &lock, LostReason::MaxHoldReached).await;
            return;
        }
        if ka.max_extensions.is_some_and(|max| extensions >= max) {
            // Let the last validity run out, then say so (and clean up).
            let end = lock.valid_until();
            tokio::time::sleep_until(tokio::time::Instant::from_std(end)).await;
            finish(&redlock, &shared, &lock, LostReason::MaxExtensionsReached).await;
            return;
        }
        match redlock.extend(&mut lock, ttl).await {
            Ok(()) => {
                extensions += 1;
                shared.set_valid_until(lock.valid_until());
                next = lock.started() + interval;
                tracing::trace!(extensions, "redlock guard extended");
            }
            Err(e) => {
                // Retry a transient failure while the validity leaves room for one more
                // round of node calls; give up at once if the lock is no longer ours.
                let room = lock.remaining();
                let retry_in = redlock.retry_pause();
                if e.is_retryable() && room > retry_in + redlock.node_timeout() * 2 {
                    tracing::debug!(error = %e, "redlock guard extension failed: retrying");
                    next = Instant::now() + retry_in;
                    continue;
                }
                tracing::warn!(error = %e, "redlock guard lost its lock");
                finish(&redlock, &shared, &lock, LostReason::ExtendFailed(e)).await;
                return;
            }
        }
    }
}

/// Signals the loss first (so holders stop at once), then releases what is left.
async fn finish(redlock: &Redlock, shared: &Shared, lock: &Lock, reason: LostReason) {
    shared.mark_lost(reason);
    redlock.unlock(lock).await;
}
