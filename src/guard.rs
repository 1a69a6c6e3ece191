//! [`LockGuard`] and its keep-alive: a held lock that extends itself while the work runs.
//!
//! The guard depends on its lock backend (it extends and releases through it, see
//! [`LockBackend`]); the client knows nothing of guards. `Redlock::acquire` and
//! `Redlock::guard` are defined here for that reason.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let guard = redlock.acquire("nightly-report").await?; // extended every TTL / 3
//! let _ = guard.release().await;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use crate::backend::{LockBackend, Stored};
use crate::client::{Redlock, Released};
use crate::error::LockError;
use crate::token::{Lock, LockToken, LostReason, Shared};

/// A held lock that extends itself while the work runs and says when it is lost.
///
/// A lock with a fixed TTL is either too short (the work outlives it and a second holder
/// starts) or too long (a crashed holder blocks everyone). A guard keeps a short TTL alive:
/// a background task extends the lock every `TTL * extend_fraction` (default a third of the
/// TTL), with the same quorum and validity rule as acquiring, until the guard is released
/// or dropped, or a maximum hold time or number of extensions is reached.
///
/// When an extension fails (the key is gone or replaced, no quorum answers in time, the
/// validity ran out, a maximum was reached), the guard and every [`LockToken`] cloned from
/// it learn it at once: [`LockToken::lost`] resolves with the [`LostReason`], and
/// [`LockToken::is_held`] turns false. `is_held` also turns false when the validity
/// deadline passes without a successful extension, even if the extension task could not run.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_redlock::Redlock;
///
/// let redlock = Redlock::builder(["redis://127.0.0.1:6379"])
///     .ttl(Duration::from_secs(6)) // extended every 2 s while held
///     .max_hold(Some(Duration::from_secs(600)))
///     .build()?;
/// let guard = redlock.acquire("nightly-report").await?;
/// let token = guard.token();
/// tokio::select! {
///     reason = token.lost() => eprintln!("lock lost ({reason}): stopping"),
///     _ = async { /* long work; check token.is_held() before each write */ } => {}
/// }
/// let _ = guard.release().await;
/// # Ok(()) }
/// ```
///
/// # Keep it bound
///
/// Dropping a guard releases its lock, so a guard written as a statement protects
/// nothing: `LockGuard` is `#[must_use]`, and the compiler warns (here made an error):
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # async fn demo(redlock: tower_redlock::Redlock) -> Result<(), tower_redlock::LockError> {
/// redlock.acquire("nightly-report").await?; // unused `LockGuard` that must be used
/// // ... the work runs without the lock ...
/// # Ok(()) }
/// ```
///
/// Bound to a name, it holds the lock until the end of the scope:
///
/// ```no_run
/// #![deny(unused_must_use)]
/// # async fn demo(redlock: tower_redlock::Redlock) -> Result<(), tower_redlock::LockError> {
/// let _guard = redlock.acquire("nightly-report").await?;
/// // ... the work runs under the lock, released when `_guard` goes out of scope ...
/// # Ok(()) }
/// ```
///
/// # Choosing the numbers
///
/// - **TTL**: how long others wait after a crash. With a guard it can be short (seconds):
///   it only has to outlast one extension interval plus a slow round of node calls.
/// - **Extension fraction**: extending at a third of the TTL leaves two thirds for retries
///   of a failed extension before the validity runs out.
/// - **Maximum hold**: a bound on how long a runaway holder can keep others out.
///
/// # What the lost signal cannot promise
///
/// The signal is a best effort from the holder's side: a process that is paused (a GC
/// pause, a VM migration, `SIGSTOP`) between checking [`LockToken::is_held`] and writing
/// can still write after its lock expired and another client took it. Only the store that
/// receives the write can reject such a late write, by comparing a fencing number that
/// grows with each new holder: [`LockToken::fencing_token`], see [`crate::fencing`].
///
/// Release it with [`release`](Self::release); dropping it releases in a spawned task
/// (never blocking, also while the runtime shuts down).
///
/// `L` is the lock service that holds it: [`Redlock`], or, in tests, the in-memory lock of
/// the `testing` feature (see [`LockBackend`]).
#[must_use = "dropping a `LockGuard` releases its lock at once: bind it (`let guard = ...`) for as long as the work needs the lock"]
pub struct LockGuard<L: LockBackend = Redlock> {
    backend: L,
    token: LockToken,
    /// The lock's id with the client's keep-alive driver, while it extends the lock.
    keep_alive: Option<u64>,
    released: bool,
}

impl<L: LockBackend> fmt::Debug for LockGuard<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl<L: LockBackend> LockGuard<L> {
    /// Guards `lock`, extending it in the background (when `extend`) the way `backend`
    /// keeps locks alive.
    pub(crate) fn new(backend: L, lock: Lock, extend: bool) -> Self {
        Self::watched(backend, lock, extend, None)
    }

    /// [`new`](Self::new), for a lock a response body will hold: released by the
    /// keep-alive driver once the body is not polled for `stall` (see `crate::stall`).
    pub(crate) fn watched(backend: L, lock: Lock, extend: bool, stall: Option<Duration>) -> Self {
        let shared = Shared::new(lock, stall);
        let keep_alive = backend.keep(&shared, extend);
        crate::metrics::gauge(crate::metrics::Gauge::HeldLocks, crate::metrics::Move::Up);
        Self {
            backend,
            token: LockToken::from_shared(shared),
            keep_alive,
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

    /// Stores `record` in place of the lock, kept for `retention`, where it is still held,
    /// and releases it, in one trip down (the layer's completion record; see
    /// [`LockBackend`]'s `complete`): `None` when the lock was lost before (another
    /// request may hold the name by now), and then only the release is sent. Dropped
    /// before it is done, the guard inside releases in the background, as a dropped
    /// guard does.
    pub(crate) async fn complete(mut self, record: Vec<u8>, retention: Duration) -> Option<Stored> {
        // From here on the validity only runs down.
        self.stop_extending();
        let shared = Arc::clone(self.token.shared());
        let stored = if shared.is_held() {
            let complete = self
                .backend
                .complete(Arc::clone(&shared), record, retention);
            Some(complete.await)
        } else {
            let _ = self.backend.release(Arc::clone(&shared)).await;
            None
        };
        shared.mark_lost(LostReason::Released);
        self.disarm();
        stored
    }

    /// The release, as a future that owns what it needs; the guard stays armed (dropping
    /// it still releases in the background) until [`disarm`](Self::disarm).
    pub(crate) fn release_future(&mut self) -> BoxFuture<'static, Released> {
        self.stop_extending();
        let shared = Arc::clone(self.token.shared());
        let release = self.backend.release(Arc::clone(&shared));
        // A combinator, not an `async` block: the block would keep the release's future
        // twice (captured, then awaited), a box of twice the size on every release.
        Box::pin(release.map(move |out| {
            shared.mark_lost(LostReason::Released);
            out
        }))
    }

    fn stop_extending(&mut self) {
        if let Some(id) = self.keep_alive.take() {
            self.backend.stop(id);
        }
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

impl Redlock {
    /// Acquires `name` like [`lock`](Self::lock) and returns a [`LockGuard`] that extends
    /// it in the background until released or dropped (see [`LockGuard`]).
    #[must_use = "dropping the `LockGuard` releases the lock at once: bind it for as long as the work needs the lock"]
    pub async fn acquire(&self, name: impl AsRef<[u8]>) -> Result<LockGuard, LockError> {
        let lock = self.lock(name).await?;
        Ok(self.guard(lock))
    }

    /// Guards a held lock: extends it in the background per the builder's
    /// [`extend_fraction`](crate::RedlockBuilder::extend_fraction),
    /// [`max_hold`](crate::RedlockBuilder::max_hold) and
    /// [`max_extensions`](crate::RedlockBuilder::max_extensions). Outside a tokio runtime the
    /// guard cannot extend; its lock then simply runs out.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // A lock taken with its own TTL, then kept alive like one from `acquire`.
    /// let lock = redlock.lock_with_ttl("import:customers", Duration::from_secs(3)).await?;
    /// let guard = redlock.guard(lock); // extended every second
    /// // ... the import ...
    /// let _ = guard.release().await;
    /// # Ok(()) }
    /// ```
    pub fn guard(&self, lock: Lock) -> LockGuard {
        LockGuard::new(self.clone(), lock, true)
    }
}

impl<L: LockBackend> std::ops::Deref for LockGuard<L> {
    type Target = LockToken;

    fn deref(&self) -> &LockToken {
        &self.token
    }
}

impl<L: LockBackend> Drop for LockGuard<L> {
    fn drop(&mut self) {
        crate::metrics::gauge(crate::metrics::Gauge::HeldLocks, crate::metrics::Move::Down);
        self.stop_extending();
        if !self.released {
            let shared = self.token.shared();
            shared.mark_lost(LostReason::Released);
            self.backend.release_in_background(shared);
        }
    }
}
