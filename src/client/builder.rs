//! [`RedlockBuilder`]: every setting of a [`Redlock`](crate::Redlock), its default, and the checks
//! [`build`](RedlockBuilder::build) makes.
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::{ConfigError, Redlock};
//!
//! let err = Redlock::builder(["redis://127.0.0.1:6379"])
//!     .ttl(Duration::from_millis(100))
//!     .node_timeout(Duration::from_millis(50)) // more than TTL / 10
//!     .build()
//!     .unwrap_err();
//! assert!(matches!(err, ConfigError::NodeTimeoutTooLong { .. }));
//! ```

use std::time::Duration;

use super::node_config::NodeConfig;
use crate::defaults::{
    DEFAULT_ALLOW_EVICTION, DEFAULT_CHECK_INTERVAL, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR,
    DEFAULT_EXTEND_FRACTION, DEFAULT_FENCING, DEFAULT_FENCING_CLOCK_BOUND, DEFAULT_KEY_PREFIX,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_NODE_TIMEOUT, DEFAULT_RECONNECT_AFTER_TIMEOUTS,
    DEFAULT_RESTART_QUARANTINE, DEFAULT_RETRY_DELAY, DEFAULT_RETRY_JITTER, DEFAULT_TTL,
};

/// Builds a [`Redlock`](crate::Redlock); see [`Redlock::builder`](crate::Redlock::builder). Every setting has a documented default;
/// [`build`](Self::build) checks them all.
#[derive(Debug, Clone)]
#[must_use = "a `RedlockBuilder` does nothing until `.build()`; each setter returns the builder with its setting"]
pub struct RedlockBuilder {
    pub(super) nodes: Vec<NodeConfig>,
    pub(super) ttl: Duration,
    pub(super) node_timeout: Duration,
    pub(super) drift_factor: f64,
    pub(super) max_attempts: u32,
    pub(super) retry_delay: Duration,
    pub(super) retry_jitter: Duration,
    pub(super) retry_deadline: Option<Duration>,
    pub(super) key_prefix: Vec<u8>,
    pub(super) min_validity: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) check_interval: Duration,
    pub(super) reconnect_after_timeouts: u32,
    pub(super) extend_fraction: f64,
    pub(super) max_hold: Option<Duration>,
    pub(super) max_extensions: Option<u32>,
    pub(super) fencing: bool,
    pub(super) fencing_retention: Option<Duration>,
    pub(super) fencing_clock_bound: Duration,
    pub(super) allow_eviction: bool,
    pub(super) restart_quarantine: bool,
    pub(super) log_names: bool,
    #[cfg(feature = "tls-rustls")]
    pub(super) tls: super::tls::TlsSettings,
}

impl RedlockBuilder {
    /// A builder over the given nodes, with every default.
    pub(super) fn new<I, S>(nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<NodeConfig>,
    {
        Self {
            nodes: nodes.into_iter().map(Into::into).collect(),
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
            check_interval: DEFAULT_CHECK_INTERVAL,
            reconnect_after_timeouts: DEFAULT_RECONNECT_AFTER_TIMEOUTS,
            extend_fraction: DEFAULT_EXTEND_FRACTION,
            max_hold: None,
            max_extensions: None,
            fencing: DEFAULT_FENCING,
            fencing_retention: None,
            fencing_clock_bound: DEFAULT_FENCING_CLOCK_BOUND,
            allow_eviction: DEFAULT_ALLOW_EVICTION,
            restart_quarantine: DEFAULT_RESTART_QUARANTINE,
            log_names: false,
            #[cfg(feature = "tls-rustls")]
            tls: super::tls::TlsSettings::default(),
        }
    }

    /// The default TTL of locks ([`DEFAULT_TTL`]). Must be at least 1 ms and at most
    /// [`MAX_TTL`](crate::defaults::MAX_TTL); Redis expiries have millisecond precision, so finer parts are dropped.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Short, so a crashed holder blocks others for 5 s at most; a guard extends it while held.
    /// let redlock = Redlock::builder(nodes).ttl(Duration::from_secs(5)).build()?;
    /// assert_eq!(redlock.ttl(), Duration::from_secs(5));
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long to wait for each node's answer ([`DEFAULT_NODE_TIMEOUT`]). Must be at most
    /// TTL / [`MIN_TTL_TO_TIMEOUT_RATIO`](crate::defaults::MIN_TTL_TO_TIMEOUT_RATIO). Each call waits at most this long or the
    /// lock's remaining validity, whichever is shorter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Nodes in other zones answer in tens of ms: allow 200 ms (at most a tenth of the TTL).
    /// let redlock = Redlock::builder(nodes)
    ///     .ttl(Duration::from_secs(10))
    ///     .node_timeout(Duration::from_millis(200))
    ///     .build()?;
    /// assert_eq!(redlock.node_timeout(), Duration::from_millis(200));
    /// # Ok(()) }
    /// ```
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The clock drift factor ([`DEFAULT_DRIFT_FACTOR`]), in `[0, 0.5)`: the validity is
    /// shortened by `ttl * drift_factor + 2 ms` for clock rate differences between nodes.
    ///
    /// ```
    /// use tower_redlock::{ConfigError, Redlock};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Hosts without NTP discipline: allow their clocks to run 2% apart (200 ms of a 10 s TTL).
    /// let redlock = Redlock::builder(nodes).drift_factor(0.02).build()?;
    /// let too_big = Redlock::builder(nodes).drift_factor(0.5).build();
    /// assert!(matches!(too_big, Err(ConfigError::DriftFactorOutOfRange { .. })));
    /// # Ok(()) }
    /// ```
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// How many attempts [`Redlock::lock`](crate::Redlock::lock) makes before it gives up
    /// ([`DEFAULT_MAX_ATTEMPTS`]); at least 1. With the [`retry_delay`](Self::retry_delay)
    /// it also sets how long `lock()` waits for a busy name: at most `max_attempts ×
    /// (base + jitter)` from the call (see [`Redlock::lock`](crate::Redlock::lock)), unless
    /// a [`retry_deadline`](Self::retry_deadline) is set.
    ///
    /// ```
    /// use tower_redlock::{ConfigError, Redlock};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Wait up to 4.5 s for a busy lock: 30 attempts, 50-150 ms apart by default.
    /// let redlock = Redlock::builder(nodes).max_attempts(30).build()?;
    /// let none = Redlock::builder(nodes).max_attempts(0).build();
    /// assert!(matches!(none, Err(ConfigError::ZeroAttempts)));
    /// # Ok(()) }
    /// ```
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The wait between attempts: `base` plus a random jitter in `[0, jitter)`
    /// ([`DEFAULT_RETRY_DELAY`], [`DEFAULT_RETRY_JITTER`]). The jitter keeps competing
    /// clients out of lock-step.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Locks held for minutes: poll every 1 to 1.5 s rather than every 50-150 ms.
    /// let redlock = Redlock::builder(nodes)
    ///     .retry_delay(Duration::from_secs(1), Duration::from_millis(500))
    ///     .max_attempts(120)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn retry_delay(mut self, base: Duration, jitter: Duration) -> Self {
        self.retry_delay = base;
        self.retry_jitter = jitter;
        self
    }

    /// An overall deadline for [`Redlock::lock`](crate::Redlock::lock), counted from the call (none by default):
    /// no attempt starts and no node call runs past it. It replaces the waiting time that
    /// [`max_attempts`](Self::max_attempts) and the retry delay set; the attempt limit
    /// still applies.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Inside a request with a time budget: bound the wait by time, not by attempts.
    /// let redlock = Redlock::builder(nodes)
    ///     .max_attempts(u32::MAX)
    ///     .retry_deadline(Some(Duration::from_millis(500)))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn retry_deadline(mut self, deadline: Option<Duration>) -> Self {
        self.retry_deadline = deadline;
        self
    }

    /// The prefix of every key ([`DEFAULT_KEY_PREFIX`]): the key of lock `name` is
    /// `{prefix}{name}`.
    ///
    /// ```
    /// use tower_redlock::{ConfigError, Redlock};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Two applications share the nodes: keep their lock names apart.
    /// let redlock = Redlock::builder(nodes).key_prefix("billing:lock:").build()?;
    /// let open_tag = Redlock::builder(nodes).key_prefix("billing:{lock:").build();
    /// assert!(matches!(open_tag, Err(ConfigError::KeyPrefixBrace { .. })));
    /// # Ok(()) }
    /// ```
    pub fn key_prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.key_prefix = prefix.as_ref().to_vec();
        self
    }

    /// Locks whose validity would be no longer than this are refused with
    /// [`LockError::ValidityExhausted`](crate::LockError::ValidityExhausted) (default zero: any positive validity is accepted).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // The work needs 3 s: refuse a lock that a slow acquisition left with less than that.
    /// let redlock = Redlock::builder(nodes)
    ///     .ttl(Duration::from_secs(10))
    ///     .min_validity(Duration::from_secs(3))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn min_validity(mut self, min: Duration) -> Self {
        self.min_validity = min;
        self
    }

    /// The time allowed to (re)connect to a node, load the scripts and read its
    /// `INFO` ([`DEFAULT_CONNECT_TIMEOUT`]). Connecting runs in the background: operations
    /// wait for it only up to their per-node timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Nodes across a WAN, with TLS handshakes: allow 3 s to (re)connect.
    /// let redlock = Redlock::builder(nodes).connect_timeout(Duration::from_secs(3)).build()?;
    /// # Ok(()) }
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How often each node's connection is checked in the background
    /// ([`DEFAULT_CHECK_INTERVAL`]: 1 s): its role (a master demoted by a failover is left
    /// for the new one) and, with the [restart quarantine](Self::restart_quarantine), its
    /// ledger, so a node flushed, failed over or demoted and promoted again under a live
    /// connection is kept out of acquisitions within one interval. The check also
    /// reconnects a node that is down. One round trip per node and interval;
    /// `Duration::MAX` checks only at connects and in `health()`. Zero is
    /// [`ConfigError::ZeroCheckInterval`](crate::ConfigError::ZeroCheckInterval).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Short locks: see a flushed node within 200 ms.
    /// let redlock = Redlock::builder(nodes)
    ///     .ttl(Duration::from_secs(2))
    ///     .check_interval(Duration::from_millis(200))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn check_interval(mut self, interval: Duration) -> Self {
        self.check_interval = interval;
        self
    }

    /// After this many consecutive timeouts on a node its connection is rebuilt
    /// ([`DEFAULT_RECONNECT_AFTER_TIMEOUTS`]; 0 counts as 1).
    ///
    /// ```
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Behind a proxy that drops idle connections silently: rebuild after the first timeout.
    /// let redlock = Redlock::builder(nodes).reconnect_after_timeouts(1).build()?;
    /// # Ok(()) }
    /// ```
    pub fn reconnect_after_timeouts(mut self, timeouts: u32) -> Self {
        self.reconnect_after_timeouts = timeouts.max(1);
        self
    }

    /// Whether a node that may evict keys is used anyway, with a warning
    /// ([`DEFAULT_ALLOW_EVICTION`]: off, it is refused).
    ///
    /// A node with a memory limit (`maxmemory` not 0) and a `maxmemory-policy` other than
    /// `noeviction` may evict keys under memory pressure, and every key of ours has a TTL,
    /// so the `volatile-*` policies evict them too: an evicted lock key lets a second
    /// client take a lock that is still held, and an evicted fencing counter lets the
    /// numbers go back at once (its only protection is then the clients' clocks, with no
    /// margin). Such a node is refused at connect with
    /// [`NodeError::Evicting`](crate::NodeError::Evicting) (an acquisition that cannot
    /// get a quorum without it fails with a no-quorum error that shows it), and connects
    /// again after a backoff, so that a fix of its configuration is picked up. A node
    /// without a memory limit (the default) evicts nothing, whatever its policy. With this
    /// on, such a node is used, and the client warns once per node, as before this
    /// setting existed.
    ///
    /// ```
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // A shared cache with `allkeys-lru`, accepted knowingly for best-effort locks.
    /// let redlock = Redlock::builder(nodes).allow_eviction(true).build()?;
    /// # Ok(()) }
    /// ```
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// Whether a node that may have lost keys is kept out of acquisitions and extensions
    /// until the locks it may have lost have expired ([`DEFAULT_RESTART_QUARANTINE`]: on).
    ///
    /// A Redis node restarted without persistence has forgotten its lock keys and would
    /// grant a lock that another client still holds through it: with 5 nodes, client A
    /// holds nodes 1-3, node 3 restarts empty, client B takes nodes 3-5, and both hold
    /// the lock. The Redlock spec's remedy is to keep a restarted node unavailable for a
    /// TTL; the clients enforce it together. Each node keeps a ledger under the key
    /// prefix (`<prefix>#ledger`, no TTL): an epoch that names its dataset and the moment
    /// of its last possible loss, on its own clock; and a horizon (`<prefix>#horizon`):
    /// the longest TTL any client of the nodes uses, raised by each client at every
    /// connect and check, and before its first lock with a longer TTL than it announced.
    /// Every connect and every background check ([`check_interval`](Self::check_interval))
    /// reads both with `INFO`: a node without its ledger (restarted empty, flushed, a
    /// replica that never synced, or new), another server process (a restart that
    /// reloaded a file, a failover), or the same process promoted again is kept out until
    /// the horizon has passed since that moment, the same moment and length for every
    /// client. A new replication id alone (a replica attached, a backup, the backlog
    /// freed) keeps the node in service. A Redis Cluster shard is judged the same way and
    /// quarantines its cluster node. A server that is not a master is refused
    /// ([`NodeError::NotMaster`](crate::NodeError::NotMaster)). A quarantined node fails
    /// acquire and extend at once with
    /// [`NodeError::Quarantined`](crate::NodeError::Quarantined), which the no-quorum error
    /// lists with its reason; releases still go to it. Quarantines are logged (`warn`)
    /// when they start. With it off, none of these checks is made (no ledger is kept, and
    /// a cluster node's acquisitions carry no `CLIENT INFO` and `LASTSAVE`).
    ///
    /// Switch it off only for nodes with `appendonly yes` and `appendfsync always` and no
    /// replicas that could be promoted, or for throwaway nodes started empty by the same
    /// program (tests, demos).
    ///
    /// ```
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Every node runs with `appendonly yes` and `appendfsync always`: a restart loses no keys.
    /// let redlock = Redlock::builder(nodes).restart_quarantine(false).build()?;
    /// # Ok(()) }
    /// ```
    pub fn restart_quarantine(mut self, on: bool) -> Self {
        self.restart_quarantine = on;
        self
    }

    /// Whether spans and log lines show lock names (off by default: a short hash of the
    /// name instead, since names can carry customer or payment ids). Lock values are never
    /// logged. See the `redlock.acquire`, `redlock.extend` and `redlock.release` spans.
    ///
    /// ```
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Names are job names, not customer ids: show them in spans and logs.
    /// let redlock = Redlock::builder(nodes).log_lock_names(true).build()?;
    /// # Ok(()) }
    /// ```
    pub fn log_lock_names(mut self, on: bool) -> Self {
        self.log_names = on;
        self
    }
}
