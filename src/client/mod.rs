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
//! The operations live in one file each: [`builder`] (settings and checks), `acquire`
//! (one attempt of the algorithm and the retry loop), `extend`, `release`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::error::{ConfigError, LockError};
use crate::name::{Resource, keys_for};
use crate::quorum::{self, later};
use crate::token::Lock;

mod acquire;
pub(crate) mod builder;
#[cfg(feature = "tls-rustls")]
mod builder_tls;
mod extend;
mod health;
mod lifecycle;
mod node_config;
mod node_list;
mod release;
mod retry;
mod settings;
mod shutdown;
pub(crate) mod spans;
#[cfg(feature = "tls-rustls")]
mod tls;

pub(crate) use acquire::Acquired;
use acquire::{Accepts, Target};
pub use builder::RedlockBuilder;
pub use health::{Health, Inspection, NodeHealth, NodeStatus};
pub use lifecycle::Shutdown;
pub use node_config::NodeConfig;
pub use release::Released;
pub(crate) use release::{Deletion, Wake};
use retry::Budget;

use crate::keepalive_inbox::{Guards, KeepAlive};
use settings::{Settings, check_retention, check_ttl, ttl_ms};

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
///         redlock.unlock(&lock).await;
///     }
///     Err(LockError::Busy { .. }) => println!("another worker runs the job"),
///     Err(e) => return Err(e.into()),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Redlock {
    inner: Arc<Settings>,
    fencing: bool,
}

impl RedlockBuilder {
    /// Checks the configuration and creates the client.
    ///
    /// No I/O happens here and unreachable nodes are not an error: when called within a
    /// tokio runtime, connecting to every node starts in the background at once (failures
    /// are logged and retried with backoff); otherwise on the first operation.
    pub fn build(self) -> Result<Redlock, ConfigError> {
        let settings = self.settings()?;
        if tokio::runtime::Handle::try_current().is_ok() {
            // Connecting starts at once, in the background.
            for node in settings.nodes.iter() {
                node.kick();
            }
        }
        Ok(Redlock {
            fencing: settings.fencing,
            inner: Arc::new(settings),
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
        self.fencing
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
    pub fn with_fencing(&self, on: bool) -> Redlock {
        Redlock {
            inner: Arc::clone(&self.inner),
            fencing: on,
        }
    }

    /// How many nodes this client uses.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.inner.nodes.len())
    }

    /// The default TTL.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The per-node timeout.
    pub fn node_timeout(&self) -> Duration {
        self.inner.node_timeout
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
    pub async fn lock(&self, name: impl AsRef<[u8]>) -> Result<Lock, LockError> {
        self.lock_with_ttl(name, self.inner.ttl).await
    }

    /// Like [`lock`](Self::lock) with a TTL for this call only.
    pub async fn lock_with_ttl(
        &self,
        name: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<Lock, LockError> {
        let target = self.target(name.as_ref(), ttl, Accepts::Lock)?;
        let now = Instant::now();
        let budget = match self.inner.retry_deadline {
            Some(d) => Budget {
                attempts: self.inner.max_attempts,
                ..Budget::until(later(now, d))
            },
            None => Budget::attempts(
                self.inner.max_attempts,
                self.inner.retry_delay,
                self.inner.retry_jitter,
                now,
            ),
        };
        self.lock_only(self.retry(&target, budget).await)
    }

    /// Acquires `name` with `ttl`, retrying with the jittered delay until `deadline`
    /// (the attempt limit of the retry policy does not apply). No node call runs past
    /// the deadline.
    pub async fn lock_until(
        &self,
        name: impl AsRef<[u8]>,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lock, LockError> {
        let target = self.target(name.as_ref(), ttl, Accepts::Lock)?;
        self.lock_only(self.retry(&target, Budget::until(deadline)).await)
    }

    /// Makes one attempt to acquire `name` with the default TTL.
    pub async fn try_lock(&self, name: impl AsRef<[u8]>) -> Result<Lock, LockError> {
        self.try_lock_with_ttl(name, self.inner.ttl).await
    }

    /// Like [`try_lock`](Self::try_lock) with a TTL for this call only.
    pub async fn try_lock_with_ttl(
        &self,
        name: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<Lock, LockError> {
        let target = self.target(name.as_ref(), ttl, Accepts::Lock)?;
        let attempt = async { self.attempt(&target, None, 1).await.finish(1) };
        self.lock_only(self.observed(&target.resource, attempt).await)
    }

    /// Releases `lock` on every node: deletes the key only where it still holds the lock's
    /// value, so a lock that expired and was taken by another client is left alone.
    ///
    /// Waits for every node's answer (each bounded by the per-node timeout) and reports how
    /// many still held the lock. Keys on nodes that failed expire at the end of the TTL.
    pub async fn unlock(&self, lock: &Lock) -> Released {
        self.release(lock).await
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

    /// Acquires `name` for the layer's replay: one attempt, or (with a `deadline`) waiting
    /// until then. A completion record that a quorum of nodes hold under the key comes
    /// back as [`Acquired::Record`] instead of a lock.
    pub(crate) async fn acquire_or_replay(
        &self,
        name: &[u8],
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Acquired, LockError> {
        let target = self.target(name, ttl, Accepts::LockOrRecord)?;
        let budget = deadline.map_or_else(Budget::once, Budget::until);
        self.retry(&target, budget).await
    }

    /// The lock of an acquisition that takes nothing else for an answer
    /// ([`Accepts::Lock`]: a record it finds makes the name busy, so none comes back).
    fn lock_only(&self, acquired: Result<Acquired, LockError>) -> Result<Lock, LockError> {
        match acquired? {
            Acquired::Lock(lock) => Ok(lock),
            Acquired::Record { attempts, .. } => Err(LockError::Busy {
                held_elsewhere: self.quorum(),
                nodes: self.node_count(),
                retry_after: None,
                attempts,
            }),
        }
    }

    /// How a guard keeps its locks alive (builder settings).
    pub(crate) fn keep_alive(&self) -> KeepAlive {
        self.inner.keep_alive
    }

    /// This client's guards (the keep-alive driver and the ids of guarded locks).
    pub(crate) fn guards(&self) -> &Guards {
        &self.inner.guards
    }

    /// A handle that does not keep the client alive (for its background tasks).
    pub(crate) fn downgrade(&self) -> WeakRedlock {
        WeakRedlock {
            inner: Arc::downgrade(&self.inner),
            fencing: self.fencing,
        }
    }

    /// What acquiring `name` for `ttl`, taking `accepts` for an answer, is after.
    fn target(&self, name: &[u8], ttl: Duration, accepts: Accepts) -> Result<Target, LockError> {
        self.inner.lifecycle.check_open()?;
        Ok(Target {
            resource: self.resource(name, ttl)?,
            ttl,
            accepts,
        })
    }

    fn resource(&self, name: &[u8], ttl: Duration) -> Result<Arc<Resource>, LockError> {
        check_ttl(ttl, self.inner.node_timeout)?;
        self.note_ttl(ttl);
        let drift = quorum::drift(ttl, self.inner.drift_factor);
        if self.inner.min_validity.saturating_add(drift) >= ttl {
            return Err(LockError::Config(ConfigError::MinValidityTooLong {
                min_validity: self.inner.min_validity,
                ttl,
            }));
        }
        if self.fencing {
            check_retention(self.inner.fencing_retention, ttl)?;
        }
        let keys = keys_for(&self.inner.key_prefix, name, self.inner.counter_sets)?;
        Ok(Arc::new(Resource {
            name: name.into(),
            key: keys.lock.into(),
            counter_key: keys.counter.into(),
            counter_member: keys.member.into(),
            counter_set: keys.set,
        }))
    }

    /// Records a TTL in use: the longest one sets the length of node quarantines.
    fn note_ttl(&self, ttl: Duration) {
        self.inner
            .max_ttl_ms
            .fetch_max(ttl_ms(ttl), Ordering::Relaxed);
    }

    /// The deadline of node calls that start now, within an operation that started at
    /// `start`: the per-node timeout, cut by the usable part of the TTL and by `outer`.
    fn call_deadline(&self, start: Instant, ttl: Duration, outer: Option<Instant>) -> Instant {
        let usable = ttl.saturating_sub(quorum::drift(ttl, self.inner.drift_factor));
        let deadline = later(Instant::now(), self.inner.node_timeout).min(later(start, usable));
        outer.map_or(deadline, |o| o.min(deadline))
    }
}

/// A [`Redlock`] that does not keep the client alive.
#[derive(Debug)]
pub(crate) struct WeakRedlock {
    inner: Weak<Settings>,
    fencing: bool,
}

impl WeakRedlock {
    /// The client, if a handle on it still exists.
    pub(crate) fn upgrade(&self) -> Option<Redlock> {
        Some(Redlock {
            inner: self.inner.upgrade()?,
            fencing: self.fencing,
        })
    }
}
