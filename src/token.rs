//! Held locks: [`Lock`], the [`LockToken`] a handler gets (its value for compare-and-set,
//! its fencing number), and the signal that tells it the lock was lost ([`LostReason`]).
//! Names, keys and values are made in `crate::name`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?;
//! assert_eq!(lock.name(), b"invoice:42");
//! assert_eq!(lock.value().len(), 16 + 2 * tower_redlock::defaults::VALUE_LEN);
//! println!("valid for another {:?}", lock.remaining());
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::error::LockError;
use crate::landing::Landing;
use crate::name::Resource;
use crate::quorum::NodeMask;
use crate::stall::StallWatch;

/// A lock this client holds (or held): returned by [`Redlock::lock`](crate::Redlock::lock)
/// and [`Redlock::try_lock`](crate::Redlock::try_lock).
///
/// It is a plain handle: dropping it does not release the lock, which then expires at the
/// end of its TTL. Release it with [`Redlock::unlock`](crate::Redlock::unlock). Cloning is
/// cheap. `Debug` output never shows the value.
///
/// A `Lock` dropped unused keeps the name locked for a whole TTL with no way to release it,
/// so it is `#[must_use]` (the warning, made an error here):
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # async fn demo(redlock: tower_redlock::Redlock) -> Result<(), tower_redlock::LockError> {
/// redlock.try_lock("invoice:42").await?; // unused `Lock` that must be used
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "dropping a `Lock` does not release it: it stays held until its TTL runs out; release it with `Redlock::unlock`, or hand it to `Redlock::guard`"]
pub struct Lock {
    pub(crate) resource: Arc<Resource>,
    pub(crate) value: Arc<str>,
    pub(crate) started: Instant,
    /// When the acquisition started (`started` moves with each extension).
    pub(crate) acquired_at: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) ttl: Duration,
    pub(crate) attempts: u32,
    pub(crate) fence: Option<u64>,
    /// Nodes that held another client's value when this lock was acquired: our value never
    /// reached them, so releasing skips them.
    pub(crate) foreign: NodeMask,
    /// The acquisition's calls still landing on the nodes that had not answered when the
    /// quorum was reached: a release waits for them.
    pub(crate) landing: Option<Landing>,
}

impl Lock {
    /// The fencing number of this acquisition, if fencing is on (see [`crate::fencing`]):
    /// strictly greater than that of every acquisition of the same name that completed
    /// before this one started. Send it with every write to a store that keeps the highest
    /// number it has seen and refuses lower ones.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// The lock name, as given.
    pub fn name(&self) -> &[u8] {
        &self.resource.name
    }

    /// The Redis key (prefix and name, or prefix and hash for long names).
    pub fn key(&self) -> &[u8] {
        &self.resource.key
    }

    /// The unique value stored under the key: [`VALUE_LEN`](crate::defaults::VALUE_LEN) random bytes, hex-encoded.
    /// Use it for compare-and-set on a downstream store; keep it out of logs.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// When the lock stops being valid (on this process's monotonic clock). Past this
    /// instant another client may hold it.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// The validity left, zero once [`valid_until`](Self::valid_until) has passed.
    pub fn remaining(&self) -> Duration {
        self.valid_until
            .saturating_duration_since(crate::clock::now())
    }

    /// Whether the lock is still held as far as this process can tell: its validity
    /// deadline is ahead. A `Lock` is not told of a loss (a node that lost the key, a
    /// failed extension); a [`LockGuard`](crate::LockGuard)'s [`LockToken::is_held`] is,
    /// and answers the same question with that knowledge.
    pub fn is_held(&self) -> bool {
        crate::clock::now() < self.valid_until
    }

    /// When the attempt (or the extension) that set the current validity started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The TTL set on the nodes by the last acquire or extend.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How many attempts the acquisition took (1 if the first one succeeded).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &String::from_utf8_lossy(&self.resource.name))
            .field("value", &"<redacted>")
            .field("remaining", &self.remaining())
            .field("fencing_token", &self.fence)
            .field("ttl", &self.ttl)
            .field("attempts", &self.attempts)
            .finish()
    }
}

/// What a holder learns about its lock: handed out by [`LockGuard::token`](crate::LockGuard::token)
/// and, behind [`RedlockLayer`](crate::RedlockLayer), found in the request
/// extensions: `Extension<LockToken>` (or plain `LockToken` with the `axum` feature) in
/// axum, `request.lock_token()` in tonic ([`LockTokenExt`](crate::layer)), and
/// `request.extensions().get::<LockToken>()` in hyper.
///
/// Cheap to clone; every clone sees the same state. Use [`value`](Self::value) for
/// compare-and-set on a downstream store (`write if current_lock == value`), check
/// [`is_held`](Self::is_held) right before committing a write, and `select!` on
/// [`lost`](Self::lost) to stop work when the lock is lost. `Debug` output never shows the
/// value.
#[derive(Clone)]
pub struct LockToken {
    shared: Arc<Shared>,
}

impl LockToken {
    pub(crate) fn from_shared(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The lock name. Behind a [`RedlockLayer`](crate::RedlockLayer): the layer's
    /// namespace, a space, and the extractor's name (see
    /// [`RedlockLayer::namespace`](crate::RedlockLayer::namespace)), what the layer locked.
    pub fn name(&self) -> &[u8] {
        self.shared.lock.name()
    }

    /// The lock's unique value: [`VALUE_LEN`](crate::defaults::VALUE_LEN) random bytes, hex-encoded.
    pub fn value(&self) -> &str {
        self.shared.lock.value()
    }

    /// The fencing number, if fencing is on: it strictly increases with each new holder of
    /// the name (see [`crate::fencing`]) and stays the same across extensions. Pass it with
    /// every write to the store the lock protects, which refuses numbers lower than the
    /// highest it has seen.
    pub fn fencing_token(&self) -> Option<u64> {
        self.shared.lock.fencing_token()
    }

    /// When the lock stops being valid (on this process's monotonic clock); moves with
    /// each extension.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// The validity left, zero once the deadline has passed.
    pub fn remaining(&self) -> Duration {
        self.valid_until()
            .saturating_duration_since(crate::clock::now())
    }

    /// Whether the lock is still held: not lost, and the validity deadline is ahead (it
    /// turns false at the deadline even if no extension could run). Past the deadline the
    /// lock counts as lost ([`LostReason::Expired`]), with or without auto-extension.
    pub fn is_held(&self) -> bool {
        self.shared.is_held()
    }

    /// Resolves when the lock is lost (or released), with the reason: at the latest when
    /// its validity runs out ([`LostReason::Expired`], also without auto-extension, e.g.
    /// behind a layer with [`auto_extend(false)`](crate::RedlockLayer::auto_extend)).
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }

    /// Why the lock was lost, if it was (past the validity deadline, at the latest
    /// [`LostReason::Expired`]).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.expire_if_due();
        self.shared.lost_reason()
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockToken")
            .field("name", &String::from_utf8_lossy(self.name()))
            .field("value", &"<redacted>")
            .field("fencing_token", &self.fencing_token())
            .field("remaining", &self.remaining())
            .field("lost", &self.lost_reason())
            .finish()
    }
}

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
    /// The background task that extends guarded locks stopped (its tokio runtime shut
    /// down, or it panicked): the lock runs out at the end of its validity.
    KeepAliveStopped,
    /// The lock's validity ran out without an extension: auto-extension was off (a
    /// [`RedlockLayer`](crate::RedlockLayer) with `auto_extend(false)`, a lock taken for a
    /// fixed TTL), or nothing extended it in time. Another client may hold the name now.
    Expired,
    /// The server stopped taking the frames of the response body that held the lock (its
    /// client stopped reading) for the layer's
    /// [`stall_timeout`](crate::RedlockLayer::stall_timeout): the lock was released, and
    /// the body fails if it is polled again.
    BodyStalled,
}

impl LostReason {
    /// The `reason` label of `redlock_lost_total`; `None` for a release (not a loss).
    fn metric_label(&self) -> Option<&'static str> {
        match self {
            Self::ExtendFailed(_) => Some("extend_failed"),
            Self::MaxHoldReached => Some("max_hold"),
            Self::MaxExtensionsReached => Some("max_extensions"),
            Self::KeepAliveStopped => Some("keep_alive_stopped"),
            Self::Expired => Some("expired"),
            Self::BodyStalled => Some("body_stalled"),
            Self::Released => None,
        }
    }
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
            Self::KeepAliveStopped => f.write_str(
                "the task that extends the lock stopped (its runtime shut down, or it panicked)",
            ),
            Self::Expired => f.write_str("the lock's validity ran out without an extension"),
            Self::BodyStalled => f.write_str(
                "the response body holding the lock was not read for its stall timeout: released",
            ),
        }
    }
}

/// The state every token of one acquisition shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) lock: Lock,
    valid_until: Mutex<Instant>,
    /// The reason the lock is lost for when its validity runs out: [`LostReason::Expired`],
    /// unless the keep-alive driver said why no extension follows.
    runs_out_as: Mutex<LostReason>,
    /// Why the lock was lost, once it is (the first reason).
    lost: Mutex<Option<LostReason>>,
    /// Tells the holders waiting in [`lost`](Self::lost) that it is.
    told: Notify,
    /// Whether the response body that holds the lock (the layer's) is still read.
    pub(crate) stall: StallWatch,
}

impl Shared {
    /// Shared state for `lock`; a response body that holds it stalls after `stall` (see
    /// [`StallWatch`]).
    pub(crate) fn new(lock: Lock, stall: Option<Duration>) -> Arc<Self> {
        let valid_until = Mutex::new(lock.valid_until());
        Arc::new(Self {
            lock,
            valid_until,
            runs_out_as: Mutex::new(LostReason::Expired),
            lost: Mutex::new(None),
            told: Notify::new(),
            stall: StallWatch::new(stall),
        })
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_valid_until(&self, t: Instant) {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = t;
    }

    /// Records why the lock was lost (the first reason wins); whether this was the first.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        {
            let mut lost = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
            if lost.is_some() {
                return false;
            }
            // Counted before the holders are told, so that whoever sees the loss sees it
            // counted too.
            if let Some(label) = reason.metric_label() {
                crate::metrics::lost(label);
            }
            *lost = Some(reason);
        }
        self.told.notify_waiters();
        true
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Says why the lock will be lost when its validity runs out, if not
    /// [`LostReason::Expired`] (the keep-alive driver made its last allowed extension).
    pub(crate) fn runs_out_as(&self, reason: LostReason) {
        *self
            .runs_out_as
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = reason;
    }

    /// Marks the lock lost if its validity deadline has passed; whether it is lost.
    pub(crate) fn expire_if_due(&self) -> bool {
        if self.lost_reason().is_some() {
            return true;
        }
        if crate::clock::now() < self.valid_until() {
            return false;
        }
        let reason = self
            .runs_out_as
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.mark_lost(reason);
        true
    }

    pub(crate) fn is_held(&self) -> bool {
        !self.expire_if_due()
    }

    /// Waits for the lost signal or the validity deadline, whichever comes first; the
    /// deadline is read again after each wake, since extensions move it. Outside a tokio
    /// runtime (no timer), for the signal only.
    pub(crate) async fn lost(&self) -> LostReason {
        loop {
            // Told from the moment it exists: a loss marked after the look below wakes it.
            let told = self.told.notified();
            if let Some(reason) = self.lost_reason() {
                return reason;
            }
            if self.expire_if_due() {
                continue;
            }
            if tokio::runtime::Handle::try_current().is_err() {
                // No tokio timer here: only the signal can tell.
                told.await;
                continue;
            }
            let deadline = tokio::time::Instant::from_std(self.valid_until());
            tokio::select! {
                () = told => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

#[cfg(test)]
#[path = "token_tests.rs"]
mod tests;
