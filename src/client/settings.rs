//! The client's state from its builder: every builder setting validated, the nodes built
//! ([`node_list`](super::node_list)), and each checked setting handed to the subsystem
//! that owns it (the core, fencing, the retry policy, spans, keep-alive, waiters).
//!
//! ```
//! use tower_redlock::{ConfigError, Redlock};
//!
//! // build() checks every setting before it builds a node.
//! let err = Redlock::builder(["redis://127.0.0.1:6379"]).max_attempts(0).build().unwrap_err();
//! assert_eq!(err, ConfigError::ZeroAttempts);
//! ```

use std::sync::Arc;
use std::time::Duration;

use super::builder::RedlockBuilder;
use crate::core::{Core, CoreParts, Fenced, KeySpace, Timing, check_retention, check_ttl};
use crate::defaults::DEFAULT_FENCING_RETENTION;
use crate::error::ConfigError;
use crate::fencing::{Clock, Fencing};
use crate::keepalive::inbox::{Guards, KeepAlive};
use crate::name::{CounterSets, prefix_keeps_tags};
use crate::node::clocks::NodeClocks;
use crate::node::{Horizon, NodeSettings};
use crate::node::{renewal_interval, set_expiry_ms};
use crate::op::observe::Observe;
use crate::op::retry::RetryPolicy;
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
        let fencing_retention = self.checked_fencing_retention()?;
        if !prefix_keeps_tags(&self.key_prefix) {
            return Err(ConfigError::KeyPrefixBrace {
                prefix: String::from_utf8_lossy(&self.key_prefix).into_owned(),
            });
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::ZeroConnectTimeout);
        }
        if self.check_interval.is_zero() {
            return Err(ConfigError::ZeroCheckInterval);
        }
        if !(self.extend_fraction > 0.0 && self.extend_fraction < 1.0) {
            return Err(ConfigError::ExtendFractionOutOfRange {
                fraction: self.extend_fraction,
            });
        }
        Ok(fencing_retention)
    }

    /// The fencing counters' retention: the one set (checked against the TTL, at most
    /// what a node takes), or the default, which a fenced client's TTL must fit.
    fn checked_fencing_retention(&self) -> Result<Duration, ConfigError> {
        match self.fencing_retention {
            Some(retention) => {
                check_retention(retention, self.ttl)?;
                // A node refuses an expiry past the largest time it can represent.
                Ok(retention.min(LONGEST_RETENTION))
            }
            // One default for every client, never stretched by a long TTL.
            None => {
                if self.fencing {
                    check_retention(DEFAULT_FENCING_RETENTION, self.ttl)
                        .map_err(|_| ConfigError::FencingRetentionNeeded { ttl: self.ttl })?;
                }
                Ok(DEFAULT_FENCING_RETENTION)
            }
        }
    }

    /// What every node shares: the connection settings, the quarantine, the key space and
    /// the fencing counters' upkeep.
    fn node_settings(
        &self,
        fencing_retention: Duration,
        counter_sets: CounterSets,
        horizon: &Arc<Horizon>,
    ) -> NodeSettings {
        NodeSettings {
            connect_timeout: self.connect_timeout,
            reconnect_after_timeouts: self.reconnect_after_timeouts,
            quarantine: self.restart_quarantine,
            key_prefix: Arc::from(self.key_prefix.as_slice()),
            horizon: Arc::clone(horizon),
            check_every: self.check_interval,
            releases: Arc::default(),
            servers: Arc::default(),
            counter_sets: counter_sets.count(),
            renew_every: renewal_interval(fencing_retention),
            clocks: Arc::new(NodeClocks::new(self.nodes.len(), self.fencing_clock_bound)),
            allow_eviction: self.allow_eviction,
        }
    }

    /// The timing of the client's operations.
    fn timing(&self, fencing_retention: Duration) -> Timing {
        Timing {
            ttl: self.ttl,
            node_timeout: self.node_timeout,
            drift_factor: self.drift_factor,
            min_validity: self.min_validity,
            fencing_retention,
        }
    }

    /// The client's state and whether its acquisitions are fenced, once every setting is
    /// checked.
    pub(super) fn state(self) -> Result<(State, Fenced), ConfigError> {
        let fencing_retention = self.validate()?;
        let horizon = Arc::new(Horizon::new(
            self.nodes.len(),
            self.ttl,
            self.restart_quarantine,
        ));
        let counter_sets = if self.nodes.iter().any(|node| node.as_cluster().is_some()) {
            CounterSets::PerSlot
        } else {
            CounterSets::One
        };
        let node_settings = self.node_settings(fencing_retention, counter_sets, &horizon);
        let nodes = self.nodes(&node_settings)?;
        let retry = self.retry_policy();
        let n = nodes.len();
        let core = Core::new(CoreParts {
            nodes: nodes.into_boxed_slice(),
            count: n,
            timing: self.timing(fencing_retention),
            keys: KeySpace {
                prefix: self.key_prefix,
                counter_sets,
            },
            horizon,
            releases: Arc::clone(&node_settings.releases),
        });
        let clock = Clock::new(node_settings.clocks);
        let fenced = if self.fencing {
            Fenced::Yes
        } else {
            Fenced::No
        };
        let state = State {
            core: Arc::new(core),
            fencing: Fencing::new(clock, set_expiry_ms(fencing_retention)),
            retry,
            observe: Observe::new(self.log_names),
            keep_alive: KeepAlive {
                fraction: self.extend_fraction,
                max_hold: self.max_hold,
                max_extensions: self.max_extensions,
            },
            guards: Guards::default(),
            waiters: Waiters::new(n, quorum::quorum(n)),
        };
        Ok((state, fenced))
    }

    /// The retry loop's policy, from the retry settings.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::new(
            self.max_attempts,
            self.retry_delay,
            self.retry_jitter,
            self.retry_deadline,
        )
    }
}

/// The longest fencing retention: 100 years (the counter sets' expiry, a retention and a
/// half, must be one the nodes take: a `PEXPIRE` of `Duration::MAX` is refused, "invalid
/// expire time").
const LONGEST_RETENTION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// What a client's clones share, grouped by the subsystem that owns it.
#[derive(Debug)]
pub(super) struct State {
    /// The nodes, timing, key space and lifecycle every operation runs over (shared with
    /// the keep-alive driver, which holds it weakly).
    pub(super) core: Arc<Core>,
    /// The proposal clock and the counters' expiry.
    pub(super) fencing: Fencing,
    pub(super) retry: RetryPolicy,
    pub(super) observe: Observe,
    pub(super) keep_alive: KeepAlive,
    /// The keep-alive driver of this client's guards, while one runs.
    pub(super) guards: Guards,
    /// The tasks waiting for a lock, woken on release.
    pub(super) waiters: Arc<Waiters>,
}
