//! An in-process lock for unit tests: [`InMemoryLock`] stands in for [`Redlock`](crate::Redlock)
//! behind [`RedlockLayer`](crate::RedlockLayer), so the handlers behind it are tested under
//! `cargo test` with no Redis server, including their 409, 503 and lost-lock paths.
//! Enabled by the `testing` feature (a dev-dependency feature:
//! `tower-redlock = { version = "..", features = ["testing"] }` under `[dev-dependencies]`).
//!
//! It keeps the promises the layer relies on: a name is held by one request at a time
//! (until released, or its TTL runs out without a guard extending it), fencing numbers
//! increase with each holder of a name, and completion records (replay) are kept for
//! their retention. A test can make the next acquisition of a name busy or unavailable
//! ([`fail_next_acquire`](InMemoryLock::fail_next_acquire)), every acquisition unavailable
//! ([`set_unavailable`](InMemoryLock::set_unavailable)), or a held lock lost
//! ([`lose`](InMemoryLock::lose)). It is not a model of Redis's timing: nothing is slow and
//! no node fails halfway.
//!
//! The names a layer locks here are the names it locks in Redis: its namespace, a space,
//! then the extractor's name (`header:idempotency-key order-1`; see
//! [`RedlockLayer::namespace`](crate::RedlockLayer::namespace)).
//! [`RedlockLayer::lock_name_for`](crate::RedlockLayer::lock_name_for) gives the name of a
//! key, for the methods below that take one.
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use axum::body::Body;
//! use axum::http::{Request, StatusCode};
//! use axum::{Router, routing::post};
//! use tower::ServiceExt; // oneshot
//! use tower_redlock::layer::Header;
//! use tower_redlock::testing::{Failure, InMemoryLock};
//! use tower_redlock::{LockBackend, LockToken, RedlockLayer};
//!
//! async fn charge(token: LockToken) -> String {
//!     format!("charged, fencing number {:?}", token.fencing_token())
//! }
//!
//! // The application's router, generic over the lock: `Redlock` in main, the
//! // in-memory lock in tests.
//! fn app<L: LockBackend>(lock: L) -> Router {
//!     Router::new()
//!         .route("/charge", post(charge))
//!         .layer(RedlockLayer::new(lock, Header::new("idempotency-key")))
//! }
//!
//! let lock = InMemoryLock::new();
//! let app = app(lock.clone());
//! let request = || {
//!     Request::post("/charge")
//!         .header("idempotency-key", "order-1")
//!         .body(Body::empty())
//!         .unwrap()
//! };
//!
//! let ok = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(ok.status(), StatusCode::OK);
//!
//! // The layer locks its names in its namespace (here the header's): the name of the
//! // key `order-1` is `header:idempotency-key order-1`.
//! let name = "header:idempotency-key order-1";
//! lock.fail_next_acquire(name, Failure::Busy);
//! let busy = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(busy.status(), StatusCode::CONFLICT);
//!
//! lock.fail_next_acquire(name, Failure::Unavailable);
//! let down = app.oneshot(request()).await.unwrap();
//! assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
//! # }
//! # #[cfg(not(feature = "axum"))]
//! # fn main() {}
//! ```
//!
//! **Behind a layer that waits** ([`RedlockLayer::wait`](crate::RedlockLayer::wait)),
//! [`Failure::Busy`] fails one attempt and the layer tries again, so the request still
//! gets the lock (200). For the 409 such a layer answers, hold the name with
//! [`acquire`](InMemoryLock::acquire) past the wait. And for a handler that must notice a
//! lost lock, [`lose`](InMemoryLock::lose) it while the handler runs: its
//! [`LockToken::is_held`](crate::LockToken::is_held) turns false and
//! [`LockToken::lost`](crate::LockToken::lost) resolves.
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use axum::body::Body;
//! use axum::http::{Request, StatusCode};
//! use axum::{Router, routing::post};
//! use tower::ServiceExt; // oneshot
//! use tower_redlock::layer::{Header, WaitPolicy};
//! use tower_redlock::testing::InMemoryLock;
//! use tower_redlock::{LockToken, LostReason, RedlockLayer};
//!
//! // A handler that stops writing as soon as its lock is lost.
//! async fn export(token: LockToken) -> String {
//!     let reason = token.lost().await; // the work, cut short by the loss
//!     assert!(!token.is_held());
//!     match reason {
//!         LostReason::ExtendFailed(_) => "stopped: the lock was lost".to_owned(),
//!         other => format!("stopped: {other}"),
//!     }
//! }
//!
//! let lock = InMemoryLock::new();
//! let layer = RedlockLayer::new(lock.clone(), Header::new("report"))
//!     .wait(WaitPolicy::up_to(Duration::from_millis(50)));
//! let name = layer.lock_name_for::<Body>("r-7"); // "header:report r-7"
//! let app = Router::new().route("/export", post(export)).layer(layer);
//! let request = || Request::post("/export").header("report", "r-7").body(Body::empty()).unwrap();
//!
//! // Another holder for longer than the layer waits: 409.
//! let other = lock.acquire(&name).await.unwrap();
//! let busy = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(busy.status(), StatusCode::CONFLICT);
//! drop(other);
//!
//! // The lock lost while the handler runs: the handler sees it.
//! let running = tokio::spawn(app.oneshot(request()));
//! while !lock.lose(&name) {
//!     tokio::task::yield_now().await;
//! }
//! let res = running.await.unwrap().unwrap();
//! assert_eq!(res.status(), StatusCode::OK);
//! let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
//! assert_eq!(body, "stopped: the lock was lost");
//! # }
//! # #[cfg(not(feature = "axum"))]
//! # fn main() {}
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::defaults::{DEFAULT_FENCING, DEFAULT_TTL};
use crate::error::LockError;
use crate::guard::LockGuard;

mod backend;
mod names;

pub use names::Failure;
use names::Names;

/// An in-process lock service for tests: what [`Redlock`](crate::Redlock) is to
/// [`RedlockLayer`](crate::RedlockLayer), without a server (see the [module docs](self)).
///
/// Cheap to clone; clones share the names. Create one per test, so that tests running in
/// parallel do not see each other's names.
#[derive(Clone)]
pub struct InMemoryLock {
    state: Arc<State>,
    ttl: Duration,
    fencing: bool,
}

/// What every clone shares.
#[derive(Debug, Default)]
struct State {
    names: Names,
    /// Every acquisition fails as unavailable while set.
    unavailable: AtomicBool,
    /// Woken whenever a name may have become free (a release, a record, a loss).
    freed: Notify,
}

impl fmt::Debug for InMemoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryLock")
            .field("ttl", &self.ttl)
            .field("fencing", &self.fencing)
            .field(
                "unavailable",
                &self.state.unavailable.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl Default for InMemoryLock {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryLock {
    /// An empty lock service with [`Redlock`](crate::Redlock)'s defaults: a TTL of
    /// [`DEFAULT_TTL`] and fencing numbers on.
    pub fn new() -> Self {
        Self {
            state: Arc::default(),
            ttl: DEFAULT_TTL,
            fencing: DEFAULT_FENCING,
        }
    }

    /// The TTL of locks taken without one (the layer's [`ttl`](crate::RedlockLayer::ttl)
    /// overrides it). A lock whose guard does not extend it
    /// ([`auto_extend(false)`](crate::RedlockLayer::auto_extend)) runs out after it.
    #[must_use = "`with_ttl` returns the lock with the new TTL"]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// A handle on the same names whose acquisitions do (`true`) or do not get fencing
    /// numbers.
    #[must_use = "`with_fencing` returns a new handle with the setting; this one keeps its own"]
    pub fn with_fencing(&self, on: bool) -> Self {
        Self {
            fencing: on,
            ..self.clone()
        }
    }

    /// Makes the next acquisition attempt of `name` fail with `failure` instead of looking
    /// at the name (calls queue up: one failure per attempt, in order). Behind a layer,
    /// `name` is the layer's lock name (its namespace, a space, the key; see
    /// [`RedlockLayer::lock_name_for`](crate::RedlockLayer::lock_name_for)).
    pub fn fail_next_acquire(&self, name: impl AsRef<[u8]>, failure: Failure) {
        self.state.names.queue(name.as_ref(), failure);
    }

    /// While `on`, every acquisition fails as if no quorum of nodes answered
    /// ([`LockError::NoQuorum`]; the layer answers 503). Held locks stay held.
    pub fn set_unavailable(&self, on: bool) {
        self.state.unavailable.store(on, Ordering::Relaxed);
    }

    /// Makes `name`'s lock lost, as when its holder's extension finds the key gone: the
    /// name is free at once, and a holder's [`LockToken::lost`](crate::LockToken::lost)
    /// resolves with [`LostReason::ExtendFailed`](crate::LostReason::ExtendFailed)
    /// (behind the layer with [`abort_on_loss`](crate::RedlockLayer::abort_on_loss), the
    /// request is answered 503). Whether the name was held.
    pub fn lose(&self, name: impl AsRef<[u8]>) -> bool {
        let lost = self.state.names.lose(name.as_ref(), Instant::now());
        self.state.freed.notify_waiters();
        lost
    }

    /// Whether `name` is held now. A layer's lock names carry its namespace: look them up
    /// with [`RedlockLayer::lock_name_for`](crate::RedlockLayer::lock_name_for).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use tower_redlock::RedlockLayer;
    /// use tower_redlock::layer::Header;
    /// use tower_redlock::testing::InMemoryLock;
    ///
    /// let lock = InMemoryLock::new();
    /// let layer = RedlockLayer::new(lock.clone(), Header::new("idempotency-key"));
    /// let name = layer.lock_name_for::<()>("order-1"); // "header:idempotency-key order-1"
    /// // Another holder of the name: the layer's requests with key order-1 are busy.
    /// let other = lock.acquire(&name).await.unwrap();
    /// assert!(lock.is_locked(&name) && !lock.is_locked("order-1"));
    /// # drop(other); }
    /// ```
    pub fn is_locked(&self, name: impl AsRef<[u8]>) -> bool {
        self.state.names.is_held(name.as_ref(), Instant::now())
    }

    /// `name`'s completion record (the layer's replay), while it is kept: its bytes, in
    /// the crate's record format.
    pub fn record(&self, name: impl AsRef<[u8]>) -> Option<Vec<u8>> {
        self.state
            .names
            .record(name.as_ref(), Instant::now())
            .map(|record| record.to_vec())
    }

    /// Forgets `name`'s completion record, as if its retention ran out; whether there was
    /// one.
    pub fn forget_record(&self, name: impl AsRef<[u8]>) -> bool {
        self.state.names.forget_record(name.as_ref())
    }

    /// Acquires `name` (one attempt, with this handle's TTL) and guards it: held until the
    /// guard is released or dropped. A test takes a name this way to play another holder
    /// (the layer's requests for it are then busy).
    #[must_use = "dropping the `LockGuard` releases the lock at once: bind it for as long as the test needs the lock"]
    pub async fn acquire(&self, name: impl AsRef<[u8]>) -> Result<LockGuard<Self>, LockError> {
        let lock = self.try_lock(name.as_ref(), self.ttl).await?;
        Ok(LockGuard::new(self.clone(), lock, true))
    }
}
