//! The [`Redlock`] client: a handle on N independent Redis masters and its operations.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::builder([
//!     "redis://127.0.0.1:7001",
//!     "redis://127.0.0.1:7002",
//!     "redis://127.0.0.1:7003",
//! ])
//! .ttl(Duration::from_secs(5))
//! .node_timeout(Duration::from_millis(50))
//! .max_attempts(20)
//! .retry_delay(Duration::from_millis(20), Duration::from_millis(40))
//! .key_prefix("myapp:lock:")
//! .build()?;
//!
//! let mut lock = redlock.lock("report:2026-11").await?; // waits, per the retry policy
//! // ... work ...
//! redlock.extend(&mut lock, Duration::from_secs(5)).await?; // need more time
//! // ... more work ...
//! let report = redlock.unlock(&lock).await;
//! assert!(report.released() >= redlock.quorum());
//! # Ok(()) }
//! ```
//!
//! The client is a facade: each public method builds one operation (`crate::op`) over the
//! client's core (`crate::core`) and runs it. The builder's files ([`builder`],
//! `settings`, `node_list`, `node_config`, TLS) make the state it shares, grouped by the
//! subsystem that owns each part.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::{Accepts, AfterLoss, Fenced, Target};
use crate::error::{ConfigError, LockError};
use crate::keepalive::Keeper;
use crate::keepalive::inbox::{Guards, KeepAlive};
use crate::op::acquire::Acquire;
use crate::op::extend::Extend;
use crate::op::inspect;
use crate::op::release::{Background, Release};
use crate::op::retry::{Retry, RetryBudget, observed};
use crate::token::Lock;

pub(crate) mod builder;
mod builder_fencing;
#[cfg(feature = "tls-rustls")]
mod builder_tls;
mod node_config;
mod node_list;
mod settings;

use settings::State;
#[cfg(feature = "tls-rustls")]
mod tls;

pub use crate::core::Shutdown;
pub(crate) use crate::op::acquire::Acquired;
pub use crate::op::inspect::{Health, Inspection, NodeHealth, NodeStatus};
pub use crate::op::release::Released;
pub(crate) use crate::op::release::{Deletion, Wake};
pub use builder::RedlockBuilder;
pub use node_config::NodeConfig;

/// A Redlock client over N independent Redis masters (N = 1 is the plain single-instance
/// lock; 3 or 5 is Redlock proper).
///
/// Cheap to clone: clones share the nodes' connections. Every operation sends to all nodes
/// at once, bounds each node's call by the per-node timeout (or the remaining validity, if
/// shorter), and decides as soon as the quorum (`N/2 + 1`) is reached or can no longer be.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_redlock::{LockError, Redlock};
///
/// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
/// match redlock.try_lock("job:nightly").await {
///     Ok(lock) => {
///         // ... the job, within lock.remaining() ...
///         let _ = redlock.unlock(&lock).await;
///     }
///     Err(LockError::Busy { .. }) => println!("another worker runs the job"),
///     Err(e) => return Err(e.into()),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Redlock {
    inner: Arc<State>,
    fencing: Fenced,
}

impl RedlockBuilder {
    /// Checks the configuration and creates the client.
    ///
    /// No I/O happens here and unreachable nodes are not an error: when called within a
    /// tokio runtime, connecting to every node starts in the background at once (failures
    /// are logged and retried with backoff); otherwise on the first operation.
    pub fn build(self) -> Result<Redlock, ConfigError> {
        let (state, fencing) = self.state()?;
        if tokio::runtime::Handle::try_current().is_ok() {
            // Connecting starts at once, in the background.
            for node in state.core.nodes().iter() {
                node.kick();
            }
        }
        Ok(Redlock {
            fencing,
            inner: Arc::new(state),
        })
    }
}

impl Redlock {
    /// A builder over the given nodes: URLs such as `redis://127.0.0.1:7001` or
    /// `rediss://user:password@host:6380/0` (TLS needs the `tls-rustls` feature), or any
    /// [`NodeConfig`]: a `redis::ConnectionInfo` or a `redis::Client`.
    pub fn builder<I, S>(nodes: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<NodeConfig>,
    {
        RedlockBuilder::new(nodes)
    }

    /// Whether acquisitions through this handle get a fencing number.
    pub fn fencing(&self) -> bool {
        self.fencing == Fenced::Yes
    }

    /// A handle on the same nodes and connections whose acquisitions do (`true`) or do not
    /// get a fencing number, whatever the builder said. Turn it off for names that are
    /// unique per request (idempotency keys), where there is nothing to fence and the
    /// counter would only take memory.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_redlock::Redlock;
    ///
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let plain = redlock.with_fencing(false);
    /// let lock = plain.lock("request:5f1c9e").await?;
    /// assert_eq!(lock.fencing_token(), None);
    /// # Ok(()) }
    /// ```
    #[must_use = "`with_fencing` returns a new handle with the setting; this one keeps its own"]
    pub fn with_fencing(&self, on: bool) -> Redlock {
        Redlock {
            inner: Arc::clone(&self.inner),
            fencing: if on { Fenced::Yes } else { Fenced::No },
        }
    }

    /// How many nodes this client uses.
    pub fn node_count(&self) -> usize {
        self.inner.core.node_count()
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.core.quorum()
    }

    /// The default TTL.
    pub fn ttl(&self) -> Duration {
        self.inner.core.ttl()
    }

    /// The per-node timeout.
    pub fn node_timeout(&self) -> Duration {
        self.inner.core.node_timeout()
    }

    /// Whether every node has room for whole replay records: none is near its
    /// `maxmemory`, as last seen (see `node::storage`).
    pub(crate) fn room_for_records(&self) -> bool {
        self.inner
            .core
            .nodes()
            .iter()
            .all(|node| node.has_room_for_records())
    }

    /// Acquires `name` with the default TTL, retrying per the retry policy (max attempts,
    /// jittered delay, optional deadline).
    ///
    /// What bounds the wait: at most [`max_attempts`](RedlockBuilder::max_attempts)
    /// attempts, and, while the name is busy, no waiting past `max_attempts × (retry_delay +
    /// jitter)` from the call (with a [`retry_deadline`](RedlockBuilder::retry_deadline),
    /// that deadline instead). A waiter woken by the holder's release attempts at once, so
    /// it usually gets the lock long before; once the waiting time is spent, the attempts
    /// left are made without pauses and the call ends ([`LockError::Busy`] for a name
    /// still held). Each attempt takes at most the per-node timeout (twice with fencing),
    /// so `lock()` returns within that waiting time plus the attempts' own time, usually
    /// a round trip each. To wait by time alone, use [`lock_until`](Self::lock_until).
    ///
    /// An attempt returns as soon as a quorum of nodes granted the lock; nodes that had not
    /// answered by then are not waited for (their `SET` usually went out already and lands
    /// too; a node still connecting may miss it). [`unlock`](Self::unlock) goes to every node.
    #[must_use = "the lock stays held until its TTL runs out unless released: keep the `Lock` and pass it to `unlock`"]
    pub async fn lock(&self, name: impl AsRef<[u8]>) -> Result<Lock, LockError> {
        self.lock_with_ttl(name, self.ttl()).await
    }

    /// Like [`lock`](Self::lock) with a TTL for this call only.
    #[must_use = "the lock stays held until its TTL runs out unless released: keep the `Lock` and pass it to `unlock`"]
    pub async fn lock_with_ttl(
        &self,
        name: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<Lock, LockError> {
        let target = self.target(name.as_ref(), ttl, Accepts::Lock)?;
        let budget = self.inner.retry.budget(crate::clock::now());
        self.lock_only(self.retry(&target, budget).await)
    }

    /// Acquires `name` with `ttl`, retrying with the jittered delay until `deadline`
    /// (the attempt limit of the retry policy does not apply). No node call runs past
    /// the deadline.
    #[must_use = "the lock stays held until its TTL runs out unless released: keep the `Lock` and pass it to `unlock`"]
    pub async fn lock_until(
        &self,
        name: impl AsRef<[u8]>,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lock, LockError> {
        let target = self.target(name.as_ref(), ttl, Accepts::Lock)?;
        self.lock_only(self.retry(&target, RetryBudget::until(deadline)).await)
    }

    /// Makes one attempt to acquire `name` with the default TTL.
    #[must_use = "the lock stays held until its TTL runs out unless released: keep the `Lock` and pass it to `unlock`"]
    pub async fn try_lock(&self, name: impl AsRef<[u8]>) -> Result<Lock, LockError> {
        self.try_lock_with_ttl(name, self.ttl()).await
    }

    /// Like [`try_lock`](Self::try_lock) with a TTL for this call only.
    #[must_use = "the lock stays held until its TTL runs out unless released: keep the `Lock` and pass it to `unlock`"]
    pub async fn try_lock_with_ttl(
        &self,
        name: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<Lock, LockError> {
        let target = self.target(name.as_ref(), ttl, Accepts::Lock)?;
        self.lock_only(self.once(&target).await)
    }

    /// Releases `lock` on every node: deletes the key only where it still holds the lock's
    /// value, so a lock that expired and was taken by another client is left alone.
    ///
    /// Waits for every node's answer (each bounded by the per-node timeout) and reports how
    /// many still held the lock. Keys on nodes that failed expire at the end of the TTL.
    pub async fn unlock(&self, lock: &Lock) -> Released {
        self.release_op().unlock(self.inner.observe, lock).await
    }

    /// Extends `lock` so that it lives `ttl` from now on every node where it is still ours,
    /// with the same quorum and validity rule as acquiring. On success the lock's validity
    /// deadline moves.
    ///
    /// Fails with [`LockError::NotHeld`] when the lock's validity has already run out
    /// (without asking the nodes: another client may have held it in the meantime), or when
    /// it is no longer ours on a quorum (it expired or was taken over), with [`LockError::NoQuorum`] when too many nodes failed,
    /// and with [`LockError::ValidityExhausted`] when the quorum came too late. A failed
    /// extension leaves the lock's deadline as it was.
    pub async fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), LockError> {
        self.extend_once(lock, ttl).await
    }

    /// Checks every node now (one round trip each, bounded by the per-node timeout): up,
    /// quarantined or down with the cause, its round-trip time, version and role; and
    /// whether a quorum is usable ([`Health::ready`]), for a readiness probe.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let health = redlock.health().await;
    /// for node in health.nodes() {
    ///     println!("{}: {:?}, round trip {:?}", node.node(), node.status(), node.round_trip());
    /// }
    /// if !health.ready() {
    ///     eprintln!("only {} usable nodes, {} needed", health.usable(), health.quorum());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn health(&self) -> Health {
        inspect::health(&self.inner.core).await
    }

    /// What the nodes hold for `name` now: on how many nodes its key exists, the longest
    /// remaining TTL, the highest fencing number, and whether a completion record is
    /// stored. The lock's value is never read out. Fails only for an invalid name.
    pub async fn inspect(&self, name: impl AsRef<[u8]>) -> Result<Inspection, LockError> {
        inspect::inspect(&self.inner.core, name.as_ref(), self.fencing).await
    }

    /// Shuts the client down, for every clone: acquisitions and extensions from now on
    /// fail with [`LockError::Closed`] (releases still go out: a lock taken before can
    /// still be unlocked, and a dropped guard still releases), and the call waits for every
    /// release still running, queued for a node or in flight, to get its nodes' answers.
    ///
    /// Each release is bounded by its own deadline (the per-node timeout, or the connect
    /// timeout for one that waits for a reconnect), so the wait is too: it ends once none
    /// is left, and in any case after twice the longer of the per-node and connect
    /// timeouts; [`Shutdown::unfinished`] says how many were still running then. Calling
    /// it again waits again. Without it, dropping the last clone still lets the releases
    /// on their way finish as long as the tokio runtime runs, but a process that exits at
    /// once may cut them short.
    /// See [`Shutdown`] for an example.
    pub async fn shutdown(&self) -> Shutdown {
        let core = &self.inner.core;
        let connect = core
            .nodes()
            .first()
            .map_or(Duration::ZERO, |n| n.connect_timeout());
        let bound = core.node_timeout().max(connect).saturating_mul(2);
        core.lifecycle().shutdown(bound).await
    }

    /// Acquires `name` for the layer's replay: one attempt, or (with a `deadline`) waiting
    /// until then. A completion record that a quorum of nodes hold under the key (or that
    /// fewer hold, restored onto the nodes that granted) comes back as
    /// [`Acquired::Record`] instead of a lock; where nodes that granted may have lost the
    /// key's record, `after_loss` decides ([`LockError::Unverifiable`] when it refuses).
    pub(crate) async fn acquire_or_replay(
        &self,
        name: &[u8],
        ttl: Duration,
        (retention, after_loss): (Duration, AfterLoss),
        deadline: Option<Instant>,
    ) -> Result<Acquired, LockError> {
        let accepts = Accepts::LockOrRecord {
            retention,
            after_loss,
        };
        let target = self.target(name, ttl, accepts)?;
        match deadline {
            Some(deadline) => self.retry(&target, RetryBudget::until(deadline)).await,
            // One attempt, as `try_lock` makes it: no queue and no retry loop.
            None => self.once(&target).await,
        }
    }

    /// One extension attempt (see [`Redlock::extend`]), in a `redlock.extend` span.
    pub(crate) async fn extend_once(
        &self,
        lock: &mut Lock,
        ttl: Duration,
    ) -> Result<(), LockError> {
        let extend = Extend {
            core: &self.inner.core,
        };
        extend.observed(self.inner.observe, lock, ttl).await
    }

    /// Replaces `lock`'s value with `record` for `retention` on every node where the lock
    /// is still ours (the layer's completion record), which releases it there, and
    /// releases it on the nodes that did not answer; returns on how many nodes the record
    /// was stored.
    pub(crate) async fn complete(&self, lock: &Lock, record: &[u8], retention: Duration) -> usize {
        self.release_op()
            .complete(self.inner.observe, lock, record, retention)
            .await
    }

    /// Spawns the release of `deletion`, if a tokio runtime is running; otherwise the keys
    /// expire at the end of their TTL. Never blocks.
    pub(crate) fn release_in_background(&self, deletion: Deletion) {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let redlock = self.clone();
                // The release carries the span of the code that dropped the lock.
                let span = self.inner.observe.span(
                    &self.inner.core,
                    crate::op::observe::Operation::Release,
                    &deletion.resource.name,
                );
                // Counted from now, before the task runs, for `shutdown`.
                let running = self.inner.core.release_running();
                let release = async move {
                    let _ = redlock.release_op().run(&deletion).await;
                    drop(running);
                };
                handle.spawn(tracing::Instrument::instrument(release, span));
            }
            Err(_) => tracing::debug!("no tokio runtime: the lock will expire at its TTL"),
        }
    }

    /// How lock `name` appears in spans and logs: the name, or `#` and a hash of it.
    pub(crate) fn shown_name(&self, name: &[u8]) -> String {
        self.inner.observe.shown_name(name)
    }

    /// The lock of an acquisition that takes nothing else for an answer.
    fn lock_only(&self, acquired: Result<Acquired, LockError>) -> Result<Lock, LockError> {
        acquired?.lock_or_busy(self.quorum(), self.node_count())
    }

    /// How a guard keeps its locks alive (builder settings).
    pub(crate) fn keep_alive(&self) -> KeepAlive {
        self.inner.keep_alive
    }

    /// This client's guards (the keep-alive driver and the ids of guarded locks).
    pub(crate) fn guards(&self) -> &Guards {
        &self.inner.guards
    }

    /// What the keep-alive driver extends and releases with.
    pub(crate) fn keeper(&self) -> Keeper<'_> {
        let inner = &*self.inner;
        Keeper {
            core: &inner.core,
            waiters: &inner.waiters,
            guards: &inner.guards,
            observe: inner.observe,
            retry: inner.retry,
        }
    }

    /// What acquiring `name` for `ttl`, taking `accepts` for an answer, is after.
    fn target(&self, name: &[u8], ttl: Duration, accepts: Accepts) -> Result<Target, LockError> {
        self.inner.core.target(name, ttl, accepts, self.fencing)
    }

    /// The acquire operation over this client.
    fn acquire_op(&self) -> Acquire<'_, Self> {
        let inner = &*self.inner;
        Acquire {
            core: &inner.core,
            fencing: &inner.fencing,
            waiters: &inner.waiters,
            background: self,
        }
    }

    /// The release operation over this client.
    fn release_op(&self) -> Release<'_> {
        Release {
            core: &self.inner.core,
            waiters: &self.inner.waiters,
        }
    }

    /// One attempt at `target`, in its `redlock.acquire` span: not queued behind this
    /// client's waiters for the name (a busy name is the answer).
    async fn once(&self, target: &Target) -> Result<Acquired, LockError> {
        let attempt = async { self.acquire_op().attempt(target, None, 1).await.finish(1) };
        observed(
            self.inner.observe,
            &self.inner.core,
            &target.resource,
            attempt,
        )
        .await
    }

    /// The retried acquisition of `target` within `budget`, observed.
    async fn retry(&self, target: &Target, budget: RetryBudget) -> Result<Acquired, LockError> {
        let retry = Retry {
            acquire: self.acquire_op(),
            waiters: &self.inner.waiters,
            policy: &self.inner.retry,
        };
        let acquisition = retry.run(target, budget);
        observed(
            self.inner.observe,
            &self.inner.core,
            &target.resource,
            acquisition,
        )
        .await
    }
}

impl Background for Redlock {
    fn release_in_background(&self, deletion: Deletion) {
        Redlock::release_in_background(self, deletion);
    }
}
