//! The core every operation runs over, and nothing more: the nodes, the timing (TTL
//! checks, drift, validity, the deadline of node calls, the quorum), the key space (the
//! prefix, where the fencing counters are), what an acquisition is after, and whether the
//! client still takes locks ([`lifecycle`]).
//!
//! The operations (`crate::op`) take a `&Core` and their other collaborators (the fencing
//! clock, the waiters) explicitly; the client builds the core once and shares it.
//!
//! ```text
//! ttl 3 s, drift factor 0.01      drift    = 3 s × 0.01 + 2 ms         = 32 ms
//! node timeout 50 ms              deadline = min(now + 50 ms, start + ttl - drift, outer)
//! 5 nodes                         quorum   = 5/2 + 1                    = 3
//! acquired after 12 ms            validity = 3 s - 12 ms - 32 ms        = 2.956 s (> min?)
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::defaults::{MAX_TTL, MIN_RETENTION_TO_TTL_RATIO, MIN_TTL_TO_TIMEOUT_RATIO};
use crate::error::{ConfigError, LockError};
use crate::name::{CounterSets, Resource, keys_for};
use crate::node::running::{Releases, Running};
use crate::node::{Horizon, Node};
use crate::quorum::{self, later};

pub(crate) mod lifecycle;

use lifecycle::Lifecycle;
pub use lifecycle::Shutdown;

/// What every operation needs (see the module docs). `N` is the nodes' list: the client's
/// [`Node`]s, or fake nodes in the operations' unit tests.
#[derive(Debug)]
pub(crate) struct Core<N: ?Sized = [Arc<Node>]> {
    timing: Timing,
    keys: KeySpace,
    /// The longest TTL any client of the nodes uses (shared with the nodes: the length
    /// of their quarantines).
    horizon: Arc<Horizon>,
    lifecycle: Lifecycle,
    /// How many nodes (and `quorum`, how many must agree).
    count: usize,
    quorum: usize,
    nodes: Box<N>,
}

/// The checked timing settings of a client.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// The default TTL.
    pub(crate) ttl: Duration,
    pub(crate) node_timeout: Duration,
    pub(crate) drift_factor: f64,
    /// A lock with less validity than this is not held.
    pub(crate) min_validity: Duration,
    /// How long a fencing counter lives after its last fenced acquisition (a fenced
    /// acquisition's TTL must stay well below it).
    pub(crate) fencing_retention: Duration,
}

/// Where a client's keys are: its prefix, and the layout of the fencing counters.
#[derive(Debug, Clone)]
pub(crate) struct KeySpace {
    pub(crate) prefix: Vec<u8>,
    pub(crate) counter_sets: CounterSets,
}

/// Whether an acquisition gets a fencing number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fenced {
    Yes,
    No,
}

/// What a [`Core`] is made of.
pub(crate) struct CoreParts<N: ?Sized> {
    /// The nodes, `count` of them.
    pub(crate) nodes: Box<N>,
    pub(crate) count: usize,
    pub(crate) timing: Timing,
    pub(crate) keys: KeySpace,
    /// Shared with the nodes: their quarantines last that long; this client's TTLs go
    /// into it.
    pub(crate) horizon: Arc<Horizon>,
    /// The count of running releases (the releases the nodes still send on their own
    /// count there too).
    pub(crate) releases: Arc<Releases>,
}

impl<N: ?Sized> Core<N> {
    /// The core made of `parts`.
    pub(crate) fn new(parts: CoreParts<N>) -> Self {
        let CoreParts {
            nodes,
            count,
            timing,
            keys,
            horizon,
            releases,
        } = parts;
        Self {
            timing,
            keys,
            horizon,
            lifecycle: Lifecycle::new(releases),
            count,
            quorum: quorum::quorum(count),
            nodes,
        }
    }

    /// How many nodes there are.
    pub(crate) fn node_count(&self) -> usize {
        self.count
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub(crate) fn quorum(&self) -> usize {
        self.quorum
    }

    /// The nodes.
    pub(crate) fn nodes(&self) -> &N {
        &self.nodes
    }

    /// The default TTL.
    pub(crate) fn ttl(&self) -> Duration {
        self.timing.ttl
    }

    /// The per-node timeout.
    pub(crate) fn node_timeout(&self) -> Duration {
        self.timing.node_timeout
    }

    /// The drift allowance of a lock of `ttl` (CONTRIBUTING.md, "The algorithm", step 4).
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        quorum::drift(ttl, self.timing.drift_factor)
    }

    /// The validity left of a lock of `ttl` taken `elapsed` ago with `drift`: `None`
    /// unless it is above the minimum (step 4).
    pub(crate) fn validity(
        &self,
        ttl: Duration,
        elapsed: Duration,
        drift: Duration,
    ) -> Option<Duration> {
        quorum::validity(ttl, elapsed, drift).filter(|v| *v > self.timing.min_validity)
    }

    /// The deadline of node calls that start now, within an operation that started at
    /// `start`: the per-node timeout, cut by the usable part of the TTL and by `outer`.
    pub(crate) fn call_deadline(
        &self,
        start: Instant,
        ttl: Duration,
        outer: Option<Instant>,
    ) -> Instant {
        let usable = ttl.saturating_sub(self.drift(ttl));
        let deadline =
            later(crate::clock::now(), self.timing.node_timeout).min(later(start, usable));
        outer.map_or(deadline, |o| o.min(deadline))
    }

    /// Checks a TTL for one call and records it in use (the longest sets the length of
    /// node quarantines; one longer than any this client announced is announced before
    /// its first lock: see `op::announce`).
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<(), LockError> {
        check_ttl(ttl, self.timing.node_timeout)?;
        self.horizon.uses(ttl);
        Ok(())
    }

    /// The horizon: the longest TTL any client of the nodes uses, as this client knows it.
    pub(crate) fn horizon(&self) -> &Horizon {
        &self.horizon
    }

    /// The keys of lock `name` held for `ttl` (checked, and with enough validity left
    /// above the minimum; with `fenced`, well within the counters' retention).
    pub(crate) fn resource(
        &self,
        name: &[u8],
        ttl: Duration,
        fenced: Fenced,
    ) -> Result<Arc<Resource>, LockError> {
        self.check_ttl(ttl)?;
        let min_validity = self.timing.min_validity;
        if min_validity.saturating_add(self.drift(ttl)) >= ttl {
            return Err(LockError::Config(ConfigError::MinValidityTooLong {
                min_validity,
                ttl,
            }));
        }
        if fenced == Fenced::Yes {
            check_retention(self.timing.fencing_retention, ttl)?;
        }
        let keys = keys_for(&self.keys.prefix, name, self.keys.counter_sets)?;
        Ok(Arc::new(Resource::new(name, keys)))
    }

    /// What acquiring `name` for `ttl` is after, taking `accepts` for an answer; `Closed`
    /// once the client was shut down.
    pub(crate) fn target(
        &self,
        name: &[u8],
        ttl: Duration,
        accepts: Accepts,
        fenced: Fenced,
    ) -> Result<Target, LockError> {
        self.check_open()?;
        Ok(Target {
            resource: self.resource(name, ttl, fenced)?,
            ttl,
            accepts,
            fenced,
        })
    }

    /// `Err(LockError::Closed)` once the client was shut down.
    pub(crate) fn check_open(&self) -> Result<(), LockError> {
        self.lifecycle.check_open()
    }

    /// Counts a release as running until the returned value is dropped (for `shutdown`).
    pub(crate) fn release_running(&self) -> Running {
        self.lifecycle.release_running()
    }

    /// The client's lifecycle (closing it, waiting for its releases).
    pub(crate) fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }
}

/// What an acquisition is after: a name's keys, for how long, what may answer it, and
/// whether it gets a fencing number.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) resource: Arc<Resource>,
    pub(crate) ttl: Duration,
    pub(crate) accepts: Accepts,
    pub(crate) fenced: Fenced,
}

/// What an acquisition takes for an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accepts {
    /// The lock only.
    Lock,
    /// The lock, or the completion record stored under its key (the layer's replay),
    /// which lives for `retention`. A record found on fewer than a quorum of nodes, next
    /// to a quorum of grants, is restored onto them and replayed; without a record, what
    /// a grant from a node that may have lost the key's record gets is `after_loss`'s
    /// (see `node::loss::doubts`).
    LockOrRecord {
        /// How long the name's completion record lives.
        retention: Duration,
        /// What a key gets when nodes that granted may have lost its record.
        after_loss: AfterLoss,
    },
}

impl Accepts {
    /// Whether a completion record is an answer (the layer's replay).
    pub(crate) fn records(self) -> bool {
        matches!(self, Accepts::LockOrRecord { .. })
    }
}

/// What a replay acquisition does with a key whose record may have been lost: no node
/// answered with one, but nodes that granted lost data (restarted empty, were flushed,
/// took over from a failover) within the retention, later than their peers, and may have
/// held it (without persistence, a record on those nodes alone is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AfterLoss {
    /// Run the handler (the default): no instance refuses keys for longer than the
    /// restart quarantine, and a key whose record was lost with every node that held it
    /// runs again. Counted (`redlock_replay_unverified_total`) and logged at `debug`.
    #[default]
    Run,
    /// Refuse the key (503 `#replay-unverifiable`, with the time to wait) until a quorum
    /// of the nodes that grant it have held their data for the whole retention: never a
    /// second run, at the cost of refusing every new key on those nodes for up to a
    /// retention after a loss.
    Refuse,
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

/// A duration in whole milliseconds (saturating).
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}
