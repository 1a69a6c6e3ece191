//! [`ConfigError`]: a configuration the builder refuses, and what to change.
//!
//! ```
//! use tower_redlock::{ConfigError, Redlock};
//!
//! let err = Redlock::builder(["redis://a:1", "redis://b:1"]).build().unwrap_err();
//! assert_eq!(err, ConfigError::EvenNodeCount { nodes: 2 });
//! ```

use std::fmt;
use std::time::Duration;

use crate::defaults::{
    DEFAULT_FENCING_RETENTION, MAX_TTL, MIN_RETENTION_TO_TTL_RATIO, MIN_TTL_TO_TIMEOUT_RATIO,
};

/// A configuration the builder refuses; returned by [`RedlockBuilder::build`](crate::RedlockBuilder::build)
/// and, for per-call TTL overrides, inside [`LockError::Config`](crate::LockError::Config).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The node list is empty: pass one URL (a single instance) or an odd number of
    /// independent masters such as 3 or 5.
    NoNodes,
    /// The node list has an even number of nodes: use one fewer or one more (an even count
    /// tolerates no more failed nodes than one node fewer).
    EvenNodeCount {
        /// How many nodes were given.
        nodes: usize,
    },
    /// The same node appears twice, which would let one server count twice towards the
    /// quorum: every node must be a distinct, independent Redis master.
    DuplicateNode {
        /// The node, without credentials.
        node: String,
    },
    /// A node URL could not be parsed or is not supported: expected
    /// `redis://[user:password@]host:port[/db]`, or `rediss://...` with the `tls-rustls`
    /// feature.
    InvalidUrl {
        /// The URL, without credentials.
        url: String,
        /// What the parser said.
        reason: String,
    },
    /// The TLS settings could not be used for a node (unreadable certificates or key):
    /// give PEM certificates, and a PEM private key for the client certificate.
    Tls {
        /// The node (`host:port`).
        node: String,
        /// What went wrong.
        reason: String,
    },
    /// TLS certificates were given, but no node uses TLS: use `rediss://` URLs.
    TlsWithoutTlsNodes,
    /// A Sentinel-managed node was given without any sentinel: give their URLs.
    NoSentinels {
        /// The master's name.
        master: String,
    },
    /// A node skips certificate verification (`rediss://...#insecure`) without the
    /// `tls-insecure` feature: trust its CA with `tls_root_certificates` instead.
    InsecureTls {
        /// The node (`host:port`).
        node: String,
    },
    /// The TTL is zero (below one millisecond): give a TTL of at least a few seconds.
    ZeroTtl,
    /// The TTL is above [`MAX_TTL`](crate::defaults::MAX_TTL): use a shorter TTL and
    /// extend the lock (a guard does it for you).
    TtlTooLong {
        /// The TTL asked for.
        ttl: Duration,
    },
    /// The per-node timeout is zero: give a few tens of milliseconds (the default is 50 ms).
    ZeroNodeTimeout,
    /// The per-node timeout is not far below the TTL: it must be at most
    /// TTL / [`MIN_TTL_TO_TIMEOUT_RATIO`](crate::defaults::MIN_TTL_TO_TIMEOUT_RATIO), so
    /// that a slow node cannot eat the lock's validity: lower the timeout or raise the TTL.
    NodeTimeoutTooLong {
        /// The per-node timeout.
        node_timeout: Duration,
        /// The TTL it was checked against.
        ttl: Duration,
    },
    /// The clock drift factor is outside `[0, 0.5)`: the usual value is 0.01.
    DriftFactorOutOfRange {
        /// The factor asked for.
        drift_factor: f64,
    },
    /// The minimum validity is not below the TTL minus the drift allowance, so no lock could
    /// ever be granted: lower it or raise the TTL.
    MinValidityTooLong {
        /// The minimum validity asked for.
        min_validity: Duration,
        /// The TTL it was checked against.
        ttl: Duration,
    },
    /// `max_attempts` is zero: give at least 1 (1 means no retry).
    ZeroAttempts,
    /// The connect timeout is zero: give at least the time a TCP (and TLS) handshake takes.
    ZeroConnectTimeout,
    /// The check interval is zero: give the time between two background checks of a node
    /// (`Duration::MAX` for none).
    ZeroCheckInterval,
    /// The fencing retention is shorter than
    /// [`MIN_RETENTION_TO_TTL_RATIO`](crate::defaults::MIN_RETENTION_TO_TTL_RATIO) times the
    /// TTL: a counter could expire while numbers near it are still in use. Raise the
    /// retention (the default is 24 h) or lower the TTL.
    FencingRetentionTooShort {
        /// The retention asked for.
        retention: Duration,
        /// The TTL it was checked against.
        ttl: Duration,
    },
    /// The client is fenced and its TTL is longer than the default fencing retention
    /// ([`DEFAULT_FENCING_RETENTION`](crate::defaults::DEFAULT_FENCING_RETENTION), 24 h)
    /// allows (at least
    /// [`MIN_RETENTION_TO_TTL_RATIO`](crate::defaults::MIN_RETENTION_TO_TTL_RATIO) times
    /// the TTL): set
    /// [`fencing_retention`](crate::RedlockBuilder::fencing_retention) explicitly (and
    /// give every client of the same nodes and key prefix that retention), or lower the
    /// TTL. The default is not stretched silently, so that clients with different TTLs do
    /// not end up with different retentions.
    FencingRetentionNeeded {
        /// The TTL.
        ttl: Duration,
    },
    /// The key prefix has a `{` that does not open a non-empty `{...}` within the prefix,
    /// so a lock key and its fencing counter could land in different hash slots: remove
    /// it, or close it (such as `"{app}:lock:"`).
    KeyPrefixBrace {
        /// The prefix, as text (lossy).
        prefix: String,
    },
    /// The extension fraction of a guard is outside `(0, 1)`: guards extend their lock
    /// every TTL × fraction; the usual value is 1/3.
    ExtendFractionOutOfRange {
        /// The fraction asked for.
        fraction: f64,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoNodes => f.write_str("no Redis nodes given"),
            Self::EvenNodeCount { nodes } => write!(f, "an even number of nodes given ({nodes})"),
            Self::DuplicateNode { node } => write!(f, "node {node} is listed twice"),
            Self::InvalidUrl { url, reason } => write!(f, "invalid Redis URL {url:?}: {reason}"),
            Self::Tls { node, reason } => {
                write!(
                    f,
                    "the TLS settings cannot be used for node {node}: {reason}"
                )
            }
            Self::NoSentinels { master } => {
                write!(f, "the Sentinel-managed node {master:?} has no sentinel")
            }
            Self::TlsWithoutTlsNodes => {
                f.write_str("TLS certificates were given but no node uses TLS (rediss://)")
            }
            Self::InsecureTls { node } => write!(
                f,
                "node {node} skips TLS certificate verification without the `tls-insecure` feature"
            ),
            Self::ZeroTtl => f.write_str("the TTL is zero"),
            Self::TtlTooLong { ttl } => {
                write!(f, "the TTL {ttl:?} is longer than the maximum {MAX_TTL:?}")
            }
            Self::ZeroNodeTimeout => f.write_str("the per-node timeout is zero"),
            Self::NodeTimeoutTooLong { node_timeout, ttl } => write!(
                f,
                "the per-node timeout {node_timeout:?} is above the TTL {ttl:?} / \
                 {MIN_TTL_TO_TIMEOUT_RATIO}"
            ),
            Self::DriftFactorOutOfRange { drift_factor } => {
                write!(f, "the drift factor {drift_factor} is outside [0, 0.5)")
            }
            Self::MinValidityTooLong { min_validity, ttl } => write!(
                f,
                "the minimum validity {min_validity:?} leaves no room in the TTL {ttl:?} once \
                 the drift allowance is taken off"
            ),
            Self::ZeroAttempts => f.write_str("max_attempts is zero"),
            Self::ZeroConnectTimeout => f.write_str("the connect timeout is zero"),
            Self::ZeroCheckInterval => f.write_str("the check interval is zero"),
            _ => self.fmt_rest(f),
        }
    }
}

impl ConfigError {
    /// [`Display`](fmt::Display) of the variants from the fencing retention on.
    fn fmt_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FencingRetentionTooShort { retention, ttl } => write!(
                f,
                "the fencing retention {retention:?} is shorter than \
                     {MIN_RETENTION_TO_TTL_RATIO} times the TTL {ttl:?}"
            ),
            Self::FencingRetentionNeeded { ttl } => write!(
                f,
                "the TTL {ttl:?} needs a fencing retention of at least {MIN_RETENTION_TO_TTL_RATIO} \
                     times it, more than the default {DEFAULT_FENCING_RETENTION:?}: set \
                     fencing_retention explicitly (the same for every client of these nodes)"
            ),
            Self::KeyPrefixBrace { prefix } => write!(
                f,
                "the key prefix {prefix:?} has a '{{' without a non-empty '{{...}}' after it"
            ),
            Self::ExtendFractionOutOfRange { fraction } => {
                write!(f, "the extension fraction {fraction} is outside (0, 1)")
            }
            // Every other variant is written by `fmt`.
            other => write!(f, "{other:?}"),
        }
    }
}

impl std::error::Error for ConfigError {}
