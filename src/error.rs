//! Errors: what went wrong, on which node, and what to do about it.
//!
//! There are three layers of errors:
//!
//! - [`ConfigError`]: the builder refused a configuration (no nodes, a bad URL, a zero TTL,
//!   ...). Fix the configuration; retrying will not help.
//! - [`LockError`]: an operation did not get or keep the lock. Each variant says why:
//!   [`Busy`](LockError::Busy) (someone else holds it), [`NoQuorum`](LockError::NoQuorum)
//!   (too many nodes failed, each with its [`NodeFailure`]),
//!   [`ValidityExhausted`](LockError::ValidityExhausted), [`NotHeld`](LockError::NotHeld),
//!   [`InvalidName`](LockError::InvalidName) and [`Config`](LockError::Config).
//! - [`NodeError`]: why one Redis node did not take part in a quorum.
//!
//! ```
//! use tower_redlock::{ConfigError, Redlock};
//!
//! let err = Redlock::builder(Vec::<String>::new()).build().unwrap_err();
//! assert!(matches!(err, ConfigError::NoNodes));
//! println!("{err}"); // says what happened and what to do
//! ```

use std::fmt;
use std::time::Duration;

/// A configuration the builder refuses; returned by [`RedlockBuilder::build`](crate::RedlockBuilder::build)
/// and, for per-call TTL overrides, inside [`LockError::Config`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The node list is empty.
    NoNodes,
    /// The node list has an even number of nodes.
    EvenNodeCount {
        /// How many nodes were given.
        nodes: usize,
    },
    /// The same node appears twice, which would let one server count twice towards the quorum.
    DuplicateNode {
        /// The node, without credentials.
        node: String,
    },
    /// A node URL could not be parsed or is not supported.
    InvalidUrl {
        /// The URL, without credentials.
        url: String,
        /// What the parser said.
        reason: String,
    },
    /// The TTL is zero (below one millisecond).
    ZeroTtl,
    /// The TTL is above [`MAX_TTL`](crate::MAX_TTL).
    TtlTooLong {
        /// The TTL asked for.
        ttl: Duration,
    },
    /// The per-node timeout is zero.
    ZeroNodeTimeout,
    /// The per-node timeout is not far below the TTL: it must be at most
    /// TTL / [`MIN_TTL_TO_TIMEOUT_RATIO`](crate::MIN_TTL_TO_TIMEOUT_RATIO).
    NodeTimeoutTooLong {
        /// The per-node timeout.
        node_timeout: Duration,
        /// The TTL it was checked against.
        ttl: Duration,
    },
    /// The clock drift factor is outside `[0, 0.5)`.
    DriftFactorOutOfRange {
        /// The factor asked for.
        drift_factor: f64,
    },
    /// The minimum validity is not below the TTL minus the drift allowance, so no lock could
    /// ever be granted.
    MinValidityTooLong {
        /// The minimum validity asked for.
        min_validity: Duration,
        /// The TTL it was checked against.
        ttl: Duration,
    },
    /// `max_attempts` is zero.
    ZeroAttempts,
    /// The connect timeout is zero.
    ZeroConnectTimeout,
    /// The extension fraction of a guard is outside `(0, 1)`.
    ExtendFractionOutOfRange {
        /// The fraction asked for.
        fraction: f64,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoNodes => f.write_str(
                "no Redis nodes given: pass one URL (single instance) or an odd number of \
                 independent masters such as 3 or 5",
            ),
            Self::EvenNodeCount { nodes } => write!(
                f,
                "{nodes} nodes given: use an odd number ({} or {}); an even count tolerates no \
                 more failed nodes than one node fewer",
                nodes - 1,
                nodes + 1
            ),
            Self::DuplicateNode { node } => write!(
                f,
                "node {node} is listed twice: every node must be a distinct, independent Redis master"
            ),
            Self::InvalidUrl { url, reason } => write!(
                f,
                "invalid Redis URL {url:?}: {reason}; expected redis://[user:password@]host:port[/db] \
                 or rediss://... (with the `tls-rustls` feature)"
            ),
            Self::ZeroTtl => f.write_str("the TTL is zero: give a TTL of at least a few seconds"),
            Self::TtlTooLong { ttl } => write!(
                f,
                "the TTL {ttl:?} is longer than the maximum {:?}: use a shorter TTL and extend the lock",
                crate::MAX_TTL
            ),
            Self::ZeroNodeTimeout => f.write_str(
                "the per-node timeout is zero: give a few tens of milliseconds (the default is 50 ms)",
            ),
            Self::NodeTimeoutTooLong { node_timeout, ttl } => write!(
                f,
                "the per-node timeout {node_timeout:?} is not far below the TTL {ttl:?}: it must be at \
                 most TTL / {} so that a slow node cannot eat the lock's validity; lower the timeout \
                 or raise the TTL",
                crate::MIN_TTL_TO_TIMEOUT_RATIO
            ),
            Self::DriftFactorOutOfRange { drift_factor } => write!(
                f,
                "the drift factor {drift_factor} is outside [0, 0.5): the usual value is 0.01"
            ),
            Self::MinValidityTooLong { min_validity, ttl } => write!(
                f,
                "the minimum validity {min_validity:?} leaves no room in the TTL {ttl:?} once the \
                 drift allowance is taken off: lower it or raise the TTL"
            ),
            Self::ZeroAttempts => {
                f.write_str("max_attempts is zero: give at least 1 (1 means no retry)")
            }
            Self::ZeroConnectTimeout => f.write_str(
                "the connect timeout is zero: give at least the time a TCP (and TLS) handshake takes",
            ),
            Self::ExtendFractionOutOfRange { fraction } => write!(
                f,
                "the extension fraction {fraction} is outside (0, 1): guards extend their lock \
                 every TTL * fraction; the usual value is 1/3"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why one node did not count towards a quorum.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeError {
    /// The node did not answer within the per-node timeout (or the lock's remaining
    /// validity, if shorter). The node may be hung, paused or far away.
    Timeout,
    /// The node refused the TCP connection: nothing listens on that port.
    Refused,
    /// The node could not be reached or the connection broke (I/O error, TLS or
    /// authentication failure, connect timeout).
    Connection(String),
    /// The node answered with a Redis error, such as `WRONGTYPE` for a key that holds a
    /// value of another type.
    Redis(String),
    /// The node answered something that is not the Redis protocol or not the reply our
    /// script returns: it is probably not a Redis server.
    Protocol(String),
    /// The lock key no longer held our value when the fencing number was to be recorded
    /// (it expired, or the node lost its data in between).
    LockLost,
    /// The node restarted (its run id changed), or it has been up for less than the
    /// longest TTL in use, so it may have lost lock keys that are still valid: it takes
    /// no part in acquiring or extending until every such lock has expired. See
    /// [`RedlockBuilder::restart_quarantine`](crate::RedlockBuilder::restart_quarantine).
    Quarantined {
        /// How much longer the quarantine lasts.
        remaining: Duration,
    },
}

impl NodeError {
    /// Whether this error means the connection must be rebuilt.
    pub(crate) fn breaks_connection(&self) -> bool {
        matches!(
            self,
            Self::Refused | Self::Connection(_) | Self::Protocol(_)
        )
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("timed out"),
            Self::Refused => f.write_str("connection refused"),
            Self::Connection(e) => write!(f, "connection failed: {e}"),
            Self::Redis(e) => write!(f, "Redis error: {e}"),
            Self::Protocol(e) => write!(f, "protocol error (is this a Redis server?): {e}"),
            Self::Quarantined { remaining } => write!(
                f,
                "restarted or started recently and may have lost lock keys: kept out of \
                 acquisitions for another {remaining:?} (releases still go to it)"
            ),
            Self::LockLost => f.write_str(
                "the lock key vanished before its fencing number was recorded (expired or data lost)",
            ),
        }
    }
}

impl std::error::Error for NodeError {}

impl From<redis::RedisError> for NodeError {
    fn from(e: redis::RedisError) -> Self {
        use redis::ErrorKind;
        if e.is_connection_refusal() {
            return Self::Refused;
        }
        if e.is_timeout() {
            return Self::Timeout;
        }
        match e.kind() {
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType | ErrorKind::RESP3NotSupported => {
                Self::Protocol(e.to_string())
            }
            ErrorKind::Server(_) | ErrorKind::Extension => Self::Redis(e.to_string()),
            _ => Self::Connection(e.to_string()),
        }
    }
}

/// One node's failure within an operation: which node and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFailure {
    /// The node's address (`host:port`, without credentials).
    pub node: String,
    /// What went wrong there.
    pub error: NodeError,
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.error)
    }
}

/// Why an operation on a lock (acquire, extend) did not succeed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LockError {
    /// Another client holds the lock on enough nodes that no quorum is possible.
    Busy {
        /// On how many nodes another client's value was found (in the last attempt).
        held_elsewhere: usize,
        /// How many nodes there are.
        nodes: usize,
        /// The longest remaining TTL seen on the other client's keys: a hint for when to
        /// retry. `None` when no node reported one.
        retry_after: Option<Duration>,
        /// How many attempts were made.
        attempts: u32,
    },
    /// Too many nodes failed (timeouts, refused connections, Redis errors) to reach the
    /// quorum. Each failure is listed with its node.
    NoQuorum {
        /// How many nodes had to agree.
        needed: usize,
        /// How many agreed.
        reached: usize,
        /// How many answered that another client holds the lock.
        held_elsewhere: usize,
        /// The nodes that failed in the last attempt and why; nodes whose answer was not
        /// awaited once the outcome was certain are not listed.
        failures: Vec<NodeFailure>,
        /// How many attempts were made.
        attempts: u32,
    },
    /// A quorum was reached, but so late that less than the minimum validity was left of
    /// the TTL once the elapsed time and the drift allowance were taken off.
    ValidityExhausted {
        /// How long the attempt took.
        elapsed: Duration,
        /// The TTL asked for.
        ttl: Duration,
        /// How many attempts were made.
        attempts: u32,
    },
    /// The lock is no longer ours on a quorum of nodes (it expired, or someone deleted or
    /// replaced it): extending it is not possible. Acquire it again.
    NotHeld {
        /// On how many nodes the lock was still ours.
        held_on: usize,
        /// How many nodes had to agree.
        needed: usize,
        /// Nodes that failed outright, if any.
        failures: Vec<NodeFailure>,
    },
    /// The lock name was rejected.
    InvalidName {
        /// Why.
        reason: &'static str,
    },
    /// A per-call setting (such as a TTL override) is invalid.
    Config(ConfigError),
    /// The operating system's random number generator failed.
    Entropy(String),
}

impl LockError {
    /// Whether retrying later can help (busy, no quorum, validity exhausted).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Busy { .. } | Self::NoQuorum { .. } | Self::ValidityExhausted { .. }
        )
    }

    pub(crate) fn set_attempts(&mut self, n: u32) {
        match self {
            Self::Busy { attempts, .. }
            | Self::NoQuorum { attempts, .. }
            | Self::ValidityExhausted { attempts, .. } => *attempts = n,
            _ => {}
        }
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Busy {
                held_elsewhere,
                nodes,
                retry_after,
                attempts,
            } => {
                write!(
                    f,
                    "the lock is held by another client on {held_elsewhere} of {nodes} nodes \
                     (after {attempts} attempt(s))"
                )?;
                match retry_after {
                    Some(d) => write!(
                        f,
                        "; it expires in about {d:?}: retry then, or wait with lock()"
                    ),
                    None => f.write_str("; retry later, or wait with lock()"),
                }
            }
            Self::NoQuorum {
                needed,
                reached,
                held_elsewhere,
                failures,
                attempts,
            } => {
                write!(
                    f,
                    "no quorum: {reached} node(s) granted the lock, {needed} needed"
                )?;
                if *held_elsewhere > 0 {
                    write!(f, ", {held_elsewhere} held by another client")?;
                }
                write!(
                    f,
                    " (after {attempts} attempt(s)); check that a majority of nodes is up and reachable"
                )?;
                for (i, fail) in failures.iter().enumerate() {
                    f.write_str(if i == 0 { ": " } else { "; " })?;
                    write!(f, "{fail}")?;
                }
                Ok(())
            }
            Self::ValidityExhausted {
                elapsed,
                ttl,
                attempts,
            } => write!(
                f,
                "the quorum took {elapsed:?} of the TTL {ttl:?}, leaving too little validity \
                 (after {attempts} attempt(s)); nodes are slow: raise the TTL or lower the per-node timeout"
            ),
            Self::NotHeld {
                held_on,
                needed,
                failures,
            } => {
                write!(
                    f,
                    "the lock is no longer held: it is ours on {held_on} node(s), {needed} needed; \
                     it expired or was taken over: acquire it again"
                )?;
                for (i, fail) in failures.iter().enumerate() {
                    f.write_str(if i == 0 { " (failed: " } else { "; " })?;
                    write!(f, "{fail}")?;
                    if i + 1 == failures.len() {
                        f.write_str(")")?;
                    }
                }
                Ok(())
            }
            Self::InvalidName { reason } => write!(f, "invalid lock name: {reason}"),
            Self::Config(e) => write!(f, "invalid setting: {e}"),
            Self::Entropy(e) => write!(
                f,
                "the operating system's random number generator failed: {e}"
            ),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for LockError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}
