//! The [`Redlock`] client and its [`RedlockBuilder`].
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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::{Client, Value};

use crate::error::{ConfigError, LockError, NodeError, NodeFailure};
use crate::guard::{KeepAlive, LockGuard};
use crate::node::{Node, NodeSettings};
use crate::quorum::{self, Decision, Outcome, Tally};
use crate::scripts::{
    ACQUIRE_FENCED_SCRIPT, ACQUIRE_SCRIPT, Arg, EXTEND_SCRIPT, FENCE_SCRIPT, Invocation,
    RELEASE_SCRIPT,
};
use crate::token::{Lock, Resource, key_for, new_value};

/// The per-node timeout must be at most `TTL / MIN_TTL_TO_TIMEOUT_RATIO`, so that waiting
/// for a slow node can never use more than a tenth of a lock's validity.
pub const MIN_TTL_TO_TIMEOUT_RATIO: u32 = 10;

/// The longest TTL accepted: one day. Longer work should extend its lock.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Default TTL of a lock: 10 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Default per-node timeout: 50 ms.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Default clock drift factor: 1 % of the TTL.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// Default number of attempts made by [`Redlock::lock`]: 10.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// Default base delay between attempts: 50 ms.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(50);
/// Default random jitter added to the base delay: up to 100 ms.
pub const DEFAULT_RETRY_JITTER: Duration = Duration::from_millis(100);
/// Default key prefix: `redlock:`.
pub const DEFAULT_KEY_PREFIX: &str = "redlock:";
/// Default connect timeout (TCP, TLS, `INFO` and `SCRIPT LOAD`): 1 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default number of consecutive timeouts after which a node's connection is rebuilt: 3.
pub const DEFAULT_RECONNECT_AFTER_TIMEOUTS: u32 = 3;
/// Default extension interval of a [`LockGuard`], as a fraction of the TTL: a third.
pub const DEFAULT_EXTEND_FRACTION: f64 = 1.0 / 3.0;
/// Fencing numbers are on by default: every acquisition carries one (see
/// [`crate::fencing`]), at the cost of a second round trip.
pub const DEFAULT_FENCING: bool = true;
/// Restarted and recently started nodes are quarantined by default (see
/// [`RedlockBuilder::restart_quarantine`]).
pub const DEFAULT_RESTART_QUARANTINE: bool = true;

/// Builds a [`Redlock`]; see [`Redlock::builder`]. Every setting has a documented default;
/// [`build`](Self::build) checks them all.
#[derive(Debug, Clone)]
pub struct RedlockBuilder {
    urls: Vec<String>,
    ttl: Duration,
    node_timeout: Duration,
    drift_factor: f64,
    max_attempts: u32,
    retry_delay: Duration,
    retry_jitter: Duration,
    retry_deadline: Option<Duration>,
    key_prefix: Vec<u8>,
    min_validity: Duration,
    connect_timeout: Duration,
    reconnect_after_timeouts: u32,
    extend_fraction: f64,
    max_hold: Option<Duration>,
    max_extensions: Option<u32>,
    fencing: bool,
    restart_quarantine: bool,
}

impl RedlockBuilder {
    /// The default TTL of locks ([`DEFAULT_TTL`]). Must be at least 1 ms and at most
    /// [`MAX_TTL`]; Redis expiries have millisecond precision, so finer parts are dropped.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long to wait for each node's answer ([`DEFAULT_NODE_TIMEOUT`]). Must be at most
    /// TTL / [`MIN_TTL_TO_TIMEOUT_RATIO`]. Each call waits at most this long or the
    /// lock's remaining validity, whichever is shorter.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The clock drift factor ([`DEFAULT_DRIFT_FACTOR`]), in `[0, 0.5)`: the validity is
    /// shortened by `ttl * drift_factor + 2 ms` for clock rate differences between nodes.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// How many attempts [`Redlock::lock`] makes before it gives up
    /// ([`DEFAULT_MAX_ATTEMPTS`]); at least 1.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The wait between attempts: `base` plus a random jitter in `[0, jitter)`
    /// ([`DEFAULT_RETRY_DELAY`], [`DEFAULT_RETRY_JITTER`]). The jitter keeps competing
    /// clients out of lock-step.
    pub fn retry_delay(mut self, base: Duration, jitter: Duration) -> Self {
        self.retry_delay = base;
        self.retry_jitter = jitter;
        self
    }

    /// An overall deadline for [`Redlock::lock`], counted from the call (none by default):
    /// no attempt starts and no node call runs past it.
    pub fn retry_deadline(mut self, deadline: Option<Duration>) -> Self {
        self.retry_deadline = deadline;
        self
    }

    /// The prefix of every key ([`DEFAULT_KEY_PREFIX`]): the key of lock `name` is
    /// `{prefix}{name}`.
    pub fn key_prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.key_prefix = prefix.as_ref().to_vec();
        self
    }

    /// Locks whose validity would be no longer than this are refused with
    /// [`LockError::ValidityExhausted`] (default zero: any positive validity is accepted).
    pub fn min_validity(mut self, min: Duration) -> Self {
        self.min_validity = min;
        self
    }

    /// The time allowed to (re)connect to a node, load the scripts and read its
    /// `INFO` ([`DEFAULT_CONNECT_TIMEOUT`]). Connecting runs in the background: operations
    /// wait for it only up to their per-node timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// After this many consecutive timeouts on a node its connection is rebuilt
    /// ([`DEFAULT_RECONNECT_AFTER_TIMEOUTS`]; 0 counts as 1).
    pub fn reconnect_after_timeouts(mut self, timeouts: u32) -> Self {
        self.reconnect_after_timeouts = timeouts.max(1);
        self
    }

    /// How often a [`LockGuard`] extends its lock, as a fraction of the TTL
    /// ([`DEFAULT_EXTEND_FRACTION`], a third), in `(0, 1)`. The rest of the validity is
    /// room to retry a failed extension before the lock is declared lost.
    pub fn extend_fraction(mut self, fraction: f64) -> Self {
        self.extend_fraction = fraction;
        self
    }

    /// The longest a [`LockGuard`] keeps extending its lock (none by default); then it
    /// releases it and reports [`LostReason::MaxHoldReached`](crate::LostReason::MaxHoldReached).
    pub fn max_hold(mut self, max: Option<Duration>) -> Self {
        self.max_hold = max;
        self
    }

    /// The most extensions a [`LockGuard`] makes (none by default); then the lock runs out
    /// and the guard reports [`LostReason::MaxExtensionsReached`](crate::LostReason::MaxExtensionsReached).
    pub fn max_extensions(mut self, max: Option<u32>) -> Self {
        self.max_extensions = max;
        self
    }

    /// Whether every acquisition gets a fencing number ([`DEFAULT_FENCING`]: on): a number
    /// that strictly increases with each new holder of a name, for a downstream store to
    /// reject writes from holders whose lock expired. It costs a second round trip per
    /// acquisition and one hash field per distinct name on every node; see
    /// [`crate::fencing`]. [`Redlock::with_fencing`] and
    /// [`RedlockLayer::fencing`](crate::RedlockLayer::fencing) switch it per use.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Whether a node that restarted is kept out of acquisitions and extensions until
    /// the locks it may have lost have expired ([`DEFAULT_RESTART_QUARANTINE`]: on).
    ///
    /// A Redis node restarted without persistence has forgotten its lock keys and would
    /// grant a lock that another client still holds through it: with 5 nodes, client A
    /// holds nodes 1-3, node 3 restarts empty, client B takes nodes 3-5, and both hold
    /// the lock. The Redlock spec's remedy is to keep a restarted node unavailable for a
    /// TTL; the client enforces it. On every (re)connect it reads `INFO server`: a node
    /// whose `run_id` changed is quarantined for the longest TTL this client has used (at
    /// least the default TTL), on first contact a node up for less than that is
    /// quarantined for the difference. A quarantined node fails acquire and extend at
    /// once with [`NodeError::Quarantined`], which the no-quorum error lists; releases
    /// still go to it. Quarantines are logged (`warn`) when they start.
    ///
    /// Switch it off only for nodes with `appendonly yes` and `appendfsync always`, or for
    /// throwaway nodes started empty by the same program (tests, demos). If other clients
    /// lock the same names with longer TTLs, give this client that TTL as its default.
    pub fn restart_quarantine(mut self, on: bool) -> Self {
        self.restart_quarantine = on;
        self
    }

    /// Checks the configuration and creates the client.
    ///
    /// No I/O happens here and unreachable nodes are not an error: when called within a
    /// tokio runtime, connecting to every node starts in the background at once (failures
    /// are logged and retried with backoff); otherwise on the first operation.
    pub fn build(self) -> Result<Redlock, ConfigError> {
        let n = self.urls.len();
        if n == 0 {
            return Err(ConfigError::NoNodes);
        }
        if n.is_multiple_of(2) {
            return Err(ConfigError::EvenNodeCount { nodes: n });
        }
        check_ttl(self.ttl, self.node_timeout)?;
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(ConfigError::DriftFactorOutOfRange {
                drift_factor: self.drift_factor,
            });
        }
        if self.min_validity + quorum::drift(self.ttl, self.drift_factor) >= self.ttl {
            return Err(ConfigError::MinValidityTooLong {
                min_validity: self.min_validity,
                ttl: self.ttl,
            });
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::ZeroAttempts);
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::ZeroConnectTimeout);
        }
        if !(self.extend_fraction > 0.0 && self.extend_fraction < 1.0) {
            return Err(ConfigError::ExtendFractionOutOfRange {
                fraction: self.extend_fraction,
            });
        }
        let max_ttl_ms = Arc::new(AtomicU64::new(ttl_ms(self.ttl)));
        let settings = NodeSettings {
            connect_timeout: self.connect_timeout,
            reconnect_after_timeouts: self.reconnect_after_timeouts,
            quarantine: self.restart_quarantine,
            max_ttl_ms: Arc::clone(&max_ttl_ms),
        };
        let mut nodes: Vec<Arc<Node>> = Vec::with_capacity(n);
        for url in &self.urls {
            let client = Client::open(url.as_str()).map_err(|e| ConfigError::InvalidUrl {
                url: redact(url),
                reason: e.to_string(),
            })?;
            let label = client.get_connection_info().addr().to_string();
            if nodes.iter().any(|other| other.label() == label) {
                return Err(ConfigError::DuplicateNode { node: label });
            }
            nodes.push(Arc::new(Node::new(label, client, settings.clone())));
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            for node in &nodes {
                node.kick();
            }
        }
        Ok(Redlock {
            inner: Arc::new(Inner {
                nodes,
                ttl: self.ttl,
                node_timeout: self.node_timeout,
                drift_factor: self.drift_factor,
                max_attempts: self.max_attempts,
                retry_delay: self.retry_delay,
                retry_jitter: self.retry_jitter,
                retry_deadline: self.retry_deadline,
                key_prefix: self.key_prefix,
                min_validity: self.min_validity,
                max_ttl_ms,
                keep_alive: KeepAlive {
                    fraction: self.extend_fraction,
                    max_hold: self.max_hold,
                    max_extensions: self.max_extensions,
                },
            }),
            fencing: self.fencing,
        })
    }
}

fn check_ttl(ttl: Duration, node_timeout: Duration) -> Result<(), ConfigError> {
    if ttl.as_millis() == 0 {
        return Err(ConfigError::ZeroTtl);
    }
    if ttl > MAX_TTL {
        return Err(ConfigError::TtlTooLong { ttl });
    }
    if node_timeout.is_zero() {
        return Err(ConfigError::ZeroNodeTimeout);
    }
    if node_timeout * MIN_TTL_TO_TIMEOUT_RATIO > ttl {
        return Err(ConfigError::NodeTimeoutTooLong { node_timeout, ttl });
    }
    Ok(())
}

/// A TTL in whole milliseconds.
fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

/// A URL with any `user:password@` part removed, for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[derive(Debug)]
struct Inner {
    nodes: Vec<Arc<Node>>,
    ttl: Duration,
    node_timeout: Duration,
    drift_factor: f64,
    max_attempts: u32,
    retry_delay: Duration,
    retry_jitter: Duration,
    retry_deadline: Option<Duration>,
    key_prefix: Vec<u8>,
    min_validity: Duration,
    /// The longest TTL used so far, in ms (shared with the nodes, for quarantines).
    max_ttl_ms: Arc<AtomicU64>,
    keep_alive: KeepAlive,
}

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
    inner: Arc<Inner>,
    fencing: bool,
}

/// The outcome of [`Redlock::unlock`]: on how many nodes our key was deleted.
///
/// Releasing never deletes a key that holds another client's value; a lock that already
/// expired simply counts as not held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    released: usize,
    not_held: usize,
    failures: Vec<NodeFailure>,
}

impl Released {
    /// Nodes on which the key still held our value and was deleted.
    pub fn released(&self) -> usize {
        self.released
    }

    /// Nodes on which the key no longer held our value (expired, or someone else's).
    pub fn not_held(&self) -> usize {
        self.not_held
    }

    /// Nodes that did not answer or failed; their keys expire at the end of the TTL.
    pub fn failures(&self) -> &[NodeFailure] {
        &self.failures
    }
}

enum AcquireReply {
    /// The key was set. With fencing: the node's counter for the name, raised to the
    /// node's clock in microseconds (0 without fencing).
    Won {
        counter: u64,
    },
    HeldElsewhere {
        pttl: Option<Duration>,
    },
}

fn parse_acquire(v: Value) -> Result<AcquireReply, NodeError> {
    let bad = |what: &dyn std::fmt::Debug| {
        NodeError::Protocol(format!("unexpected reply to the acquire script: {what:?}"))
    };
    let Value::Array(items) = v else {
        return Err(bad(&v));
    };
    match items.as_slice() {
        [Value::Int(1)] => Ok(AcquireReply::Won { counter: 0 }),
        [Value::Int(1), counter, secs, micros] => {
            let counter = match counter {
                Value::BulkString(b) if b.is_empty() => 0,
                other => decimal(other).ok_or_else(|| bad(&items))?,
            };
            let clock = decimal(secs)
                .zip(decimal(micros))
                .and_then(|(s, us)| s.checked_mul(1_000_000)?.checked_add(us))
                .ok_or_else(|| bad(&items))?;
            let counter = counter.max(clock);
            if counter == u64::MAX {
                return Err(NodeError::Protocol(
                    "the fencing counter is at its maximum and cannot grow".to_owned(),
                ));
            }
            Ok(AcquireReply::Won { counter })
        }
        [Value::Int(0), Value::Int(pttl)] => Ok(AcquireReply::HeldElsewhere {
            pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
        }),
        _ => Err(bad(&items)),
    }
}

/// Whether bit `i` of `mask` is set (false beyond bit 63).
fn bit(mask: u64, i: usize) -> bool {
    u32::try_from(i)
        .ok()
        .and_then(|i| mask.checked_shr(i))
        .is_some_and(|m| m & 1 == 1)
}

/// A non-negative decimal integer sent as a bulk string.
fn decimal(v: &Value) -> Option<u64> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

fn parse_flag(v: Value) -> Result<bool, NodeError> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(NodeError::Protocol(format!(
            "unexpected reply to a compare-and-set script: {other:?}"
        ))),
    }
}

/// Whether an attempt failed only because its node calls ran into the deadline.
fn cut_by_deadline(err: &LockError) -> bool {
    matches!(err, LockError::NoQuorum { failures, .. }
        if failures.iter().all(|f| f.error == NodeError::Timeout))
}

/// A random delay in `[base, base + jitter)`.
fn jittered(base: Duration, jitter: Duration) -> Duration {
    let nanos = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return base;
    }
    let r = getrandom::u64().unwrap_or_else(|_| {
        // The OS generator failing is next to impossible; any spread will do for jitter.
        u64::from(Instant::now().elapsed().subsec_nanos()) ^ 0x9e37_79b9_7f4a_7c15
    });
    base + Duration::from_nanos(r % nanos)
}

/// Releases an acquisition attempt's value in the background if the attempt's future is
/// dropped before it finished (the SETs may have landed).
struct PendingRelease<'a> {
    redlock: &'a Redlock,
    resource: &'a Arc<Resource>,
    value: Option<Arc<str>>,
    ttl: Duration,
}

impl Drop for PendingRelease<'_> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            self.redlock
                .release_in_background(Arc::clone(self.resource), value, self.ttl);
        }
    }
}

impl Redlock {
    /// Spawns a release of `value` on every node, if a tokio runtime is running;
    /// otherwise the keys expire at the end of their TTL. Never blocks.
    pub(crate) fn release_in_background(
        &self,
        resource: Arc<Resource>,
        value: Arc<str>,
        ttl: Duration,
    ) {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let redlock = self.clone();
                handle.spawn(async move {
                    redlock
                        .release_all(&resource.key, value.as_bytes(), ttl)
                        .await;
                });
            }
            Err(_) => tracing::debug!("no tokio runtime: the lock will expire at its TTL"),
        }
    }

    /// A builder over the given node URLs, such as `redis://127.0.0.1:7001` or
    /// `rediss://user:password@host:6380/0` (TLS needs the `tls-rustls` feature).
    pub fn builder<I, S>(nodes: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockBuilder {
            urls: nodes.into_iter().map(Into::into).collect(),
            ttl: DEFAULT_TTL,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retry_delay: DEFAULT_RETRY_DELAY,
            retry_jitter: DEFAULT_RETRY_JITTER,
            retry_deadline: None,
            key_prefix: DEFAULT_KEY_PREFIX.as_bytes().to_vec(),
            min_validity: Duration::ZERO,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            reconnect_after_timeouts: DEFAULT_RECONNECT_AFTER_TIMEOUTS,
            extend_fraction: DEFAULT_EXTEND_FRACTION,
            max_hold: None,
            max_extensions: None,
            fencing: DEFAULT_FENCING,
            restart_quarantine: DEFAULT_RESTART_QUARANTINE,
        }
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

    /// A random pause from the retry policy: `[base, base + jitter)`.
    pub(crate) fn retry_pause(&self) -> Duration {
        jittered(self.inner.retry_delay, self.inner.retry_jitter)
    }

    /// Acquires `name` like [`lock`](Self::lock) and returns a [`LockGuard`] that extends
    /// it in the background until released or dropped (see [`crate::guard`]).
    pub async fn acquire(&self, name: impl AsRef<[u8]>) -> Result<LockGuard, LockError> {
        let lock = self.lock(name).await?;
        Ok(self.guard(lock))
    }

    /// Guards a held lock: extends it in the background per the builder's
    /// [`extend_fraction`](RedlockBuilder::extend_fraction),
    /// [`max_hold`](RedlockBuilder::max_hold) and
    /// [`max_extensions`](RedlockBuilder::max_extensions). Outside a tokio runtime the
    /// guard cannot extend; its lock then simply runs out.
    pub fn guard(&self, lock: Lock) -> LockGuard {
        LockGuard::new(self.clone(), lock, Some(self.inner.keep_alive))
    }

    /// Guards a held lock without extending it: for the lost signal and drop-safe release
    /// only.
    pub(crate) fn guard_without_extension(&self, lock: Lock) -> LockGuard {
        LockGuard::new(self.clone(), lock, None)
    }

    /// Acquires `name` with the default TTL, retrying per the retry policy (max attempts,
    /// jittered delay, optional deadline).
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
        let resource = self.resource(name.as_ref(), ttl)?;
        let deadline = self.inner.retry_deadline.map(|d| Instant::now() + d);
        self.retry(&resource, ttl, deadline, self.inner.max_attempts)
            .await
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
        let resource = self.resource(name.as_ref(), ttl)?;
        self.retry(&resource, ttl, Some(deadline), u32::MAX).await
    }

    async fn retry(
        &self,
        resource: &Arc<Resource>,
        ttl: Duration,
        deadline: Option<Instant>,
        max_attempts: u32,
    ) -> Result<Lock, LockError> {
        let inner = &self.inner;
        let mut attempt = 1;
        let mut previous: Option<LockError> = None;
        loop {
            let mut err = match self.attempt(resource, ttl, deadline, attempt).await {
                Ok(lock) => return Ok(lock),
                Err(e) => e,
            };
            if deadline.is_some_and(|d| Instant::now() >= d)
                && cut_by_deadline(&err)
                && let Some(mut earlier) = previous.take()
            {
                // The deadline cut the last attempt short: the attempt before says more.
                earlier.set_attempts(attempt);
                return Err(earlier);
            }
            err.set_attempts(attempt);
            if !err.is_retryable() || attempt >= max_attempts {
                return Err(err);
            }
            let mut wake = Instant::now() + jittered(inner.retry_delay, inner.retry_jitter);
            if let Some(deadline) = deadline {
                wake = wake.min(deadline);
            }
            tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(err);
            }
            previous = Some(err);
            attempt += 1;
        }
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
        let resource = self.resource(name.as_ref(), ttl)?;
        self.attempt(&resource, ttl, None, 1).await
    }

    fn resource(&self, name: &[u8], ttl: Duration) -> Result<Arc<Resource>, LockError> {
        check_ttl(ttl, self.inner.node_timeout)?;
        self.inner
            .max_ttl_ms
            .fetch_max(ttl_ms(ttl), Ordering::Relaxed);
        if self.inner.min_validity + quorum::drift(ttl, self.inner.drift_factor) >= ttl {
            return Err(LockError::Config(ConfigError::MinValidityTooLong {
                min_validity: self.inner.min_validity,
                ttl,
            }));
        }
        let key = key_for(&self.inner.key_prefix, name)?;
        Ok(Arc::new(Resource {
            name: name.into(),
            key: key.into(),
            prefix_len: self.inner.key_prefix.len(),
        }))
    }

    /// Sends `inv` to the nodes whose index `to` accepts, all at once; the answers arrive
    /// as they come, with the node's index. With `acquiring`, quarantined nodes fail at
    /// once.
    fn send_all<'a>(
        &'a self,
        inv: &'a Invocation<'a>,
        by_sha: &'a redis::Cmd,
        deadline: Instant,
        to: impl Fn(usize) -> bool,
        acquiring: bool,
    ) -> FuturesUnordered<impl Future<Output = (usize, &'a Arc<Node>, Result<Value, NodeError>)> + 'a>
    {
        self.inner
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| to(*i))
            .map(move |(i, node)| async move {
                (i, node, node.call(inv, by_sha, deadline, acquiring).await)
            })
            .collect()
    }

    /// Sends `inv` (an acquire, fence or extend) to the nodes whose index `to` accepts (the
    /// others count as failed); feeds each answer to `on_reply` (which says whether it counts towards the quorum)
    /// until the outcome is certain.
    ///
    /// A failure is awaited further while it is undecided whether it is busy or short of
    /// nodes ([`Tally::busy_undecided`]), so that the error says which.
    async fn fan_out<F>(
        &self,
        inv: &Invocation<'_>,
        deadline: Instant,
        to: impl Fn(usize) -> bool,
        mut on_reply: F,
    ) -> Tally
    where
        F: FnMut(usize, &Node, Result<Value, NodeError>) -> Outcome,
    {
        let n = self.inner.nodes.len();
        let mut tally = Tally::new(n);
        for _ in (0..n).filter(|i| !to(*i)) {
            tally.record_outcome(Outcome::Failed);
        }
        let by_sha = inv.cmd(true);
        let mut calls = self.send_all(inv, &by_sha, deadline, to, true);
        while tally.decision() == Decision::Pending || tally.busy_undecided() {
            let Some((i, node, reply)) = calls.next().await else {
                break;
            };
            tally.record_outcome(on_reply(i, node, reply));
        }
        tally
    }

    /// The deadline of node calls that start now, within an operation that started at
    /// `start`: the per-node timeout, cut by the usable part of the TTL and by `outer`.
    fn call_deadline(&self, start: Instant, ttl: Duration, outer: Option<Instant>) -> Instant {
        let usable = ttl.saturating_sub(quorum::drift(ttl, self.inner.drift_factor));
        let deadline = (Instant::now() + self.inner.node_timeout).min(start + usable);
        outer.map_or(deadline, |o| o.min(deadline))
    }

    async fn attempt(
        &self,
        resource: &Arc<Resource>,
        ttl: Duration,
        outer_deadline: Option<Instant>,
        attempt: u32,
    ) -> Result<Lock, LockError> {
        let value: Arc<str> = new_value()?.into();
        // If this future is dropped while the SETs are out, release in the background.
        let mut pending = PendingRelease {
            redlock: self,
            resource,
            value: Some(Arc::clone(&value)),
            ttl,
        };
        let ttl_ms = ttl_ms(ttl);
        let ttl = Duration::from_millis(ttl_ms);
        let keys = [&*resource.key, self.inner.key_prefix.as_slice()];
        let args = [
            Arg::Bytes(value.as_bytes()),
            Arg::Int(ttl_ms),
            Arg::Bytes(resource.counter_field()),
        ];
        let inv = if self.fencing {
            Invocation {
                script: &ACQUIRE_FENCED_SCRIPT,
                keys: &keys,
                args: &args,
            }
        } else {
            Invocation {
                script: &ACQUIRE_SCRIPT,
                keys: &keys[..1],
                args: &args[..2],
            }
        };
        let n = self.inner.nodes.len();
        let start = Instant::now();
        let deadline = self.call_deadline(start, ttl, outer_deadline);

        let mut retry_after: Option<Duration> = None;
        let mut failures = Vec::new();
        let mut highest = 0u64;
        // Nodes that answered anything but a grant: not ours, so phase 2 skips them (a
        // bit per node; nodes beyond the 64th are always asked, which is harmless).
        let mut refused = 0u64;
        let tally = self
            .fan_out(
                &inv,
                deadline,
                |_| true,
                |i, node, reply| {
                    let outcome = match reply.and_then(parse_acquire) {
                        Ok(AcquireReply::Won { counter }) => {
                            highest = highest.max(counter);
                            return Outcome::Granted;
                        }
                        Ok(AcquireReply::HeldElsewhere { pttl }) => {
                            retry_after = retry_after.max(pttl);
                            Outcome::HeldElsewhere
                        }
                        Err(error) => {
                            failures.push(NodeFailure {
                                node: node.label().to_owned(),
                                error,
                            });
                            Outcome::Failed
                        }
                    };
                    refused |= u32::try_from(i)
                        .ok()
                        .and_then(|i| 1u64.checked_shl(i))
                        .unwrap_or(0);
                    outcome
                },
            )
            .await;
        let drift = quorum::drift(ttl, self.inner.drift_factor);
        let mut held = tally.decision() == Decision::Reached;
        let mut fence = None;
        // Phase 2 of fencing: record the new number on the nodes we hold, while we hold them.
        let mut fence_tally = None;
        if held && self.fencing && quorum::validity(ttl, start.elapsed(), drift).is_some() {
            let token = highest + 1; // parse_acquire keeps counters below u64::MAX
            failures.clear();
            let field = resource.counter_field();
            let args = [
                Arg::Bytes(value.as_bytes()),
                Arg::Bytes(field),
                Arg::Int(token),
            ];
            let inv = Invocation {
                script: &FENCE_SCRIPT,
                keys: &keys,
                args: &args,
            };
            let deadline = self.call_deadline(start, ttl, outer_deadline);
            let t = self
                .fan_out(
                    &inv,
                    deadline,
                    |i| !bit(refused, i),
                    |_, node, reply| {
                        let error = match reply.and_then(parse_flag) {
                            Ok(true) => return Outcome::Granted,
                            Ok(false) => NodeError::LockLost,
                            Err(error) => error,
                        };
                        failures.push(NodeFailure {
                            node: node.label().to_owned(),
                            error,
                        });
                        Outcome::Failed
                    },
                )
                .await;
            held = t.decision() == Decision::Reached;
            fence = held.then_some(token);
            fence_tally = Some(t);
        }
        let elapsed = start.elapsed();
        let validity = quorum::validity(ttl, elapsed, drift);

        if held && let Some(validity) = validity.filter(|v| *v > self.inner.min_validity) {
            tracing::debug!(
                nodes = n,
                granted = tally.successes(),
                fenced = fence.is_some(),
                elapsed_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
                validity_ms = u64::try_from(validity.as_millis()).unwrap_or(u64::MAX),
                "redlock acquired"
            );
            pending.value = None;
            return Ok(Lock {
                resource: Arc::clone(resource),
                value,
                started: start,
                valid_until: start + validity,
                ttl,
                attempts: attempt,
                fence,
            });
        }

        // Failed: release on every node, including those that failed or did not answer in
        // time (their SET may have run while the reply was lost).
        self.release_all(&resource.key, value.as_bytes(), ttl).await;
        pending.value = None;
        let err = if held {
            LockError::ValidityExhausted {
                elapsed,
                ttl,
                attempts: attempt,
            }
        } else if let Some(t) = fence_tally {
            // The lock went away on too many nodes before its fencing number was recorded.
            LockError::NoQuorum {
                needed: t.quorum(),
                reached: t.successes(),
                held_elsewhere: 0,
                failures,
                attempts: attempt,
            }
        } else if tally.is_busy() {
            LockError::Busy {
                held_elsewhere: tally.held_elsewhere(),
                nodes: n,
                retry_after,
                attempts: attempt,
            }
        } else {
            LockError::NoQuorum {
                needed: tally.quorum(),
                reached: tally.successes(),
                held_elsewhere: tally.held_elsewhere(),
                failures,
                attempts: attempt,
            }
        };
        tracing::debug!(nodes = n, granted = tally.successes(), held_elsewhere = tally.held_elsewhere(), error = %err, "redlock attempt failed");
        Err(err)
    }

    /// Compare-and-delete on every node, waiting for all answers (bounded by the per-node
    /// timeout).
    async fn release_all(&self, key: &[u8], value: &[u8], ttl: Duration) -> Released {
        let inv = Invocation {
            script: &RELEASE_SCRIPT,
            keys: &[key],
            args: &[Arg::Bytes(value)],
        };
        let by_sha = inv.cmd(true);
        let deadline = Instant::now() + self.inner.node_timeout.min(ttl);
        let mut calls = self.send_all(&inv, &by_sha, deadline, |_| true, false);
        let mut out = Released {
            released: 0,
            not_held: 0,
            failures: Vec::new(),
        };
        while let Some((_, node, reply)) = calls.next().await {
            match reply.and_then(parse_flag) {
                Ok(true) => out.released += 1,
                Ok(false) => out.not_held += 1,
                Err(error) => out.failures.push(NodeFailure {
                    node: node.label().to_owned(),
                    error,
                }),
            }
        }
        out
    }

    /// Releases `lock` on every node: deletes the key only where it still holds the lock's
    /// value, so a lock that expired and was taken by another client is left alone.
    ///
    /// Waits for every node's answer (each bounded by the per-node timeout) and reports how
    /// many still held the lock. Keys on nodes that failed expire at the end of the TTL.
    pub async fn unlock(&self, lock: &Lock) -> Released {
        let out = self
            .release_all(lock.key(), lock.value().as_bytes(), lock.ttl)
            .await;
        tracing::debug!(
            released = out.released,
            not_held = out.not_held,
            failed = out.failures.len(),
            "redlock released"
        );
        out
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
        check_ttl(ttl, self.inner.node_timeout)?;
        self.inner
            .max_ttl_ms
            .fetch_max(ttl_ms(ttl), Ordering::Relaxed);
        let ttl_ms = ttl_ms(ttl);
        let ttl = Duration::from_millis(ttl_ms);
        let keys = [lock.key()];
        let args = [Arg::Bytes(lock.value().as_bytes()), Arg::Int(ttl_ms)];
        let inv = Invocation {
            script: &EXTEND_SCRIPT,
            keys: &keys,
            args: &args,
        };
        let start = Instant::now();
        if start >= lock.valid_until {
            // The validity ran out: another client may have held the lock since, so the
            // hold cannot be continued, even if our keys are still there.
            return Err(LockError::NotHeld {
                held_on: 0,
                needed: self.quorum(),
                failures: Vec::new(),
            });
        }
        // The extension must take effect within the current validity.
        let deadline = self.call_deadline(start, ttl, Some(lock.valid_until));
        let mut not_held = 0;
        let mut failures = Vec::new();
        let tally = self
            .fan_out(
                &inv,
                deadline,
                |_| true,
                |_, node, reply| match reply.and_then(parse_flag) {
                    Ok(true) => Outcome::Granted,
                    Ok(false) => {
                        not_held += 1;
                        Outcome::Failed
                    }
                    Err(error) => {
                        failures.push(NodeFailure {
                            node: node.label().to_owned(),
                            error,
                        });
                        Outcome::Failed
                    }
                },
            )
            .await;
        let elapsed = start.elapsed();
        let drift = quorum::drift(ttl, self.inner.drift_factor);
        if tally.decision() == Decision::Reached {
            return match quorum::validity(ttl, elapsed, drift) {
                Some(validity) if validity > self.inner.min_validity => {
                    lock.started = start;
                    lock.valid_until = start + validity;
                    lock.ttl = ttl;
                    Ok(())
                }
                _ => Err(LockError::ValidityExhausted {
                    elapsed,
                    ttl,
                    attempts: 1,
                }),
            };
        }
        if not_held > 0 && not_held >= failures.len() {
            Err(LockError::NotHeld {
                held_on: tally.successes(),
                needed: tally.quorum(),
                failures,
            })
        } else {
            Err(LockError::NoQuorum {
                needed: tally.quorum(),
                reached: tally.successes(),
                held_elsewhere: 0,
                failures,
                attempts: 1,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credentials() {
        assert_eq!(
            redact("rediss://user:secret@host:6380/0"),
            "rediss://***@host:6380/0"
        );
        assert_eq!(redact("redis://host:1"), "redis://host:1");
    }

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
    }
}
