//! The lock seam: [`LockBackend`], what [`RedlockLayer`](crate::RedlockLayer) and
//! [`LockGuard`](crate::LockGuard) need from a lock service: acquire a name (or find its
//! completion record), keep a held lock alive, release it, and store a completion record
//! where it is held.
//!
//! [`Redlock`](crate::Redlock) implements it over Redis; with the `testing` feature,
//! [`testing::InMemoryLock`](crate::testing::InMemoryLock) implements it in process, for
//! unit tests of handlers behind the layer. The layer is generic over it (no dynamic
//! dispatch per request), and the trait is sealed: its methods are the crate's own, so they
//! can follow the algorithm's needs without breaking users.
//!
//! ```
//! use tower_redlock::{LockBackend, Redlock, RedlockLayer};
//! use tower_redlock::layer::Header;
//!
//! // Any backend serves the same layer.
//! fn locked<L: LockBackend>(lock: L) -> RedlockLayer<Header, tower_redlock::layer::NoBodyFingerprint, L> {
//!     RedlockLayer::new(lock, Header::new("idempotency-key"))
//! }
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = locked(Redlock::builder(["redis://127.0.0.1:6379"]).build()?);
//! # let _ = layer; Ok(()) }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

// The layer reaches the client through this seam only (it imports nothing from `client/`).
pub(crate) use crate::client::{Acquired, Redlock, Released};
use crate::core::AfterLoss;
use crate::error::LockError;
use crate::token::Shared;

mod redlock;

/// A lock service the layer and the guard can hold locks with: [`Redlock`](crate::Redlock)
/// (Redis), or, with the `testing` feature,
/// [`testing::InMemoryLock`](crate::testing::InMemoryLock) (in process, for tests).
///
/// Sealed: implemented by this crate's lock services only.
#[expect(
    private_bounds,
    reason = "sealed: the seam's methods and the types crossing it are the crate's own"
)]
pub trait LockBackend: Clone + Send + Sync + 'static + sealed::Backend {}

impl<T: Clone + Send + Sync + 'static + sealed::Backend> LockBackend for T {}

/// How an acquisition through the seam goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acquisition {
    /// The lock, or the name's completion record (the layer's replay), which lives this
    /// long (the replay retention), and what a key gets when nodes that granted may have
    /// lost its record.
    pub(crate) replay: Option<(Duration, AfterLoss)>,
    /// One attempt (`None`), or waiting for the name until then.
    pub(crate) until: Option<Instant>,
}

/// On how many nodes a completion record was stored, of how many needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) on: usize,
    pub(crate) needed: usize,
}

pub(crate) mod sealed {
    use super::{
        Acquired, Acquisition, Arc, Duration, Future, LockError, Released, Shared, Stored,
    };

    /// The seam's operations (see [`LockBackend`](super::LockBackend)).
    pub(crate) trait Backend {
        /// The TTL of acquisitions that do not give one.
        fn default_ttl(&self) -> Duration;

        /// This backend, its acquisitions fenced (`true`) or not.
        fn fenced(&self, on: bool) -> Self;

        /// Acquires `name` for `ttl` as `how` says.
        fn acquire(
            &self,
            name: &[u8],
            ttl: Duration,
            how: Acquisition,
        ) -> impl Future<Output = Result<Acquired, LockError>> + Send;

        /// Starts keeping the lock of `shared` alive (extending it, when `extend`) while
        /// its guard lives: an id for [`stop`](Self::stop), if something runs.
        fn keep(&self, shared: &Arc<Shared>, extend: bool) -> Option<u64>;

        /// Stops what [`keep`](Self::keep) started under `id`.
        fn stop(&self, id: u64);

        /// Releases the lock of `shared` everywhere it is held.
        fn release(&self, shared: Arc<Shared>) -> impl Future<Output = Released> + Send + 'static;

        /// Releases the lock of `shared` without waiting (a guard dropped while held).
        fn release_in_background(&self, shared: &Shared);

        /// Stores `record` under the name of `shared`'s lock where the lock is still held,
        /// kept for `retention`, and releases the lock: the record takes its place, and
        /// the nodes that did not answer get a release (one trip down, one round trip
        /// where every node answers).
        fn complete(
            &self,
            shared: Arc<Shared>,
            record: Vec<u8>,
            retention: Duration,
        ) -> impl Future<Output = Stored> + Send + 'static;

        /// A lock name as logs show it (a hash, unless names are logged).
        fn shown_name(&self, name: &[u8]) -> String;

        /// Whether records may keep their response: no node is near its memory limit
        /// (records are then kept as "completed, not kept", and locks keep working).
        fn room_for_records(&self) -> bool;
    }
}
