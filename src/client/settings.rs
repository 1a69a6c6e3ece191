//! The client's checked settings: every builder setting validated, the nodes built
//! ([`node_list`](super::node_list)), and the checks that per-call settings share.
//!
//! ```
//! use tower_redlock::{ConfigError, Redlock};
//!
//! // build() checks every setting before it builds a node.
//! let err = Redlock::builder(["redis://127.0.0.1:6379"]).max_attempts(0).build().unwrap_err();
//! assert_eq!(err, ConfigError::ZeroAttempts);
//! ```

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::builder::RedlockBuilder;
use super::lifecycle::Lifecycle;
use crate::defaults::{
    DEFAULT_FENCING_RETENTION, MAX_TTL, MIN_RETENTION_TO_TTL_RATIO, MIN_TTL_TO_TIMEOUT_RATIO,
};
use crate::error::ConfigError;
use crate::fencing::Clock;
use crate::keepalive_inbox::{Guards, KeepAlive};
use crate::name::{CounterSets, prefix_keeps_tags};
use crate::node::clocks::NodeClocks;
use crate::node::{Node, NodeSettings, renewal_interval, set_expiry_ms};
use crate::quorum;
use crate::waiters::Waiters;

impl RedlockBuilder {
    /// Checks every setting but the nodes' own (see [`nodes`](Self::nodes)): the fencing
    /// retention to use when they are sound.
    fn validate(&self) -> Result<Duration, ConfigError> {
        let n = self.nodes.len();
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
        if self
            .min_validity
            .saturating_add(quorum::drift(self.ttl, self.drift_factor))
            >= self.ttl
        {
            return Err(ConfigError::MinValidityTooLong {
                min_validity: self.min_validity,
                ttl: self.ttl,
            });
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::ZeroAttempts);
        }
        let fencing_retention = match self.fencing_retention {
            Some(retention) => {
                check_retention(retention, self.ttl)?;
                // A node refuses an expiry past the largest time it can represent.
                retention.min(LONGEST_RETENTION)
            }
            // One default for every client, never stretched by a long TTL.
            None => {
                if self.fencing {
                    check_retention(DEFAULT_FENCING_RETENTION, self.ttl)
                        .map_err(|_| ConfigError::FencingRetentionNeeded { ttl: self.ttl })?;
                }
                DEFAULT_FENCING_RETENTION
            }
        };
        if !prefix_keeps_tags(&self.key_prefix) {
            return Err(ConfigError::KeyPrefixBrace {
                prefix: String::from_utf8_lossy(&self.key_prefix).into_owned(),
            });
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::ZeroConnectTimeout);
        }
        if !(self.extend_fraction > 0.0 && self.extend_fraction < 1.0) {
            return Err(ConfigError::ExtendFractionOutOfRange {
                fraction: self.extend_fraction,
            });
        }
        Ok(fencing_retention)
    }

    /// The client's settings and nodes, once every setting is checked.
    pub(super) fn settings(self) -> Result<Settings, ConfigError> {
        let fencing_retention = self.validate()?;
        let max_ttl_ms = Arc::new(AtomicU64::new(ttl_ms(self.ttl)));
        let cluster = self.nodes.iter().any(|node| node.as_cluster().is_some());
        let counter_sets = CounterSets::for_nodes(cluster);
        let node_settings = NodeSettings {
            connect_timeout: self.connect_timeout,
            reconnect_after_timeouts: self.reconnect_after_timeouts,
            quarantine: self.restart_quarantine,
            key_prefix: Arc::from(self.key_prefix.as_slice()),
            max_ttl_ms: Arc::clone(&max_ttl_ms),
            servers: Arc::default(),
            counter_sets: counter_sets.count(),
            renew_every: renewal_interval(fencing_retention),
            clocks: Arc::new(NodeClocks::new(self.nodes.len(), self.fencing_clock_bound)),
            allow_eviction: self.allow_eviction,
        };
        let nodes = self.nodes(&node_settings)?;
        let n = nodes.len();
        Ok(Settings {
            nodes: nodes.into(),
            ttl: self.ttl,
            node_timeout: self.node_timeout,
            drift_factor: self.drift_factor,
            max_attempts: self.max_attempts,
            retry_delay: self.retry_delay,
            retry_jitter: self.retry_jitter,
            retry_deadline: self.retry_deadline,
            key_prefix: self.key_prefix,
            log_names: self.log_names,
            min_validity: self.min_validity,
            max_ttl_ms,
            keep_alive: KeepAlive {
                fraction: self.extend_fraction,
                max_hold: self.max_hold,
                max_extensions: self.max_extensions,
            },
            fencing: self.fencing,
            fencing_retention,
            counter_sets,
            clock: Clock::new(node_settings.clocks),
            counters_expiry_ms: set_expiry_ms(fencing_retention),
            guards: Guards::default(),
            waiters: Waiters::new(n, quorum::quorum(n)),
            lifecycle: Lifecycle::default(),
        })
    }
}

/// The checked settings of a client, shared by its clones.
#[derive(Debug)]
pub(crate) struct Settings {
    /// Shared, so that a round's background work can hold the list with one reference.
    pub(crate) nodes: Arc<[Arc<Node>]>,
    pub(crate) ttl: Duration,
    pub(crate) node_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) max_attempts: u32,
    pub(crate) retry_delay: Duration,
    pub(crate) retry_jitter: Duration,
    pub(crate) retry_deadline: Option<Duration>,
    pub(crate) key_prefix: Vec<u8>,
    /// Whether spans and logs show lock names (otherwise a hash).
    pub(crate) log_names: bool,
    pub(crate) min_validity: Duration,
    /// The longest TTL used so far, in ms (shared with the nodes, for quarantines).
    pub(crate) max_ttl_ms: Arc<AtomicU64>,
    pub(crate) keep_alive: KeepAlive,
    /// Whether acquisitions get a fencing number unless a handle says otherwise.
    pub(crate) fencing: bool,
    /// How long a fencing counter lives after its last fenced acquisition.
    pub(crate) fencing_retention: Duration,
    /// Where the fencing counters live on the nodes.
    pub(crate) counter_sets: CounterSets,
    /// Where this client's fencing proposals come from.
    pub(crate) clock: Clock,
    /// The expiry, in ms, a renewal gives a set of fencing counters (a retention and a
    /// half; the nodes decide when to send one: see `node::renewals`).
    pub(crate) counters_expiry_ms: u64,
    /// The keep-alive driver of this client's guards, while one runs.
    pub(crate) guards: Guards,
    /// The tasks waiting for a lock, woken on release.
    pub(crate) waiters: Arc<Waiters>,
    /// Whether the client was shut down, and the releases it still runs.
    pub(crate) lifecycle: Lifecycle,
}

/// Checks a TTL against the limits and the per-node timeout.
pub(crate) fn check_ttl(ttl: Duration, node_timeout: Duration) -> Result<(), ConfigError> {
    if ttl.as_millis() == 0 {
        return Err(ConfigError::ZeroTtl);
    }
    if ttl > MAX_TTL {
        return Err(ConfigError::TtlTooLong { ttl });
    }
    if node_timeout.is_zero() {
        return Err(ConfigError::ZeroNodeTimeout);
    }
    if node_timeout
        .checked_mul(MIN_TTL_TO_TIMEOUT_RATIO)
        .is_none_or(|t| t > ttl)
    {
        return Err(ConfigError::NodeTimeoutTooLong { node_timeout, ttl });
    }
    Ok(())
}

/// Checks a fencing retention against a TTL.
pub(crate) fn check_retention(retention: Duration, ttl: Duration) -> Result<(), ConfigError> {
    if ttl
        .checked_mul(MIN_RETENTION_TO_TTL_RATIO)
        .is_none_or(|min| retention < min)
    {
        return Err(ConfigError::FencingRetentionTooShort { retention, ttl });
    }
    Ok(())
}

/// The longest fencing retention: 100 years (the counter sets' expiry, a retention and a
/// half, must be one the nodes take: a `PEXPIRE` of `Duration::MAX` is refused, "invalid
/// expire time").
const LONGEST_RETENTION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// A TTL in whole milliseconds.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}
