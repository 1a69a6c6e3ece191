//! [`NodeError`]: why one Redis node did not take part in a quorum, with the `redis` error
//! behind it as its `source()`.
//!
//! ```
//! use tower_redlock::{NodeError, NodeFailure};
//!
//! let failure = NodeFailure { node: "127.0.0.1:7001".into(), error: NodeError::Timeout };
//! assert_eq!(failure.to_string(), "127.0.0.1:7001: timed out");
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{QuarantineReason, TlsProblem};

/// Why one node did not count towards a quorum.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeError {
    /// The node did not answer within the per-node timeout (or the lock's remaining
    /// validity, if shorter). The node may be hung, paused or far away.
    Timeout,
    /// The node refused the TCP connection: nothing listens on that port.
    Refused,
    /// The node could not be reached or the connection broke (I/O error, authentication
    /// failure, connect timeout).
    Connection(ErrorDetail),
    /// The connection's TLS handshake failed (a `rediss://` node): `problem` says which
    /// TLS problem it was and what to do, `detail` what the TLS library said. The node
    /// connects again with backoff, as after a [`Connection`](Self::Connection) error.
    Tls {
        /// Which TLS problem: a version mismatch, an untrusted CA, a certificate for
        /// another name, a client certificate required or refused, a server that does not
        /// speak TLS, ...
        problem: TlsProblem,
        /// The TLS library's words, and the `redis` error behind them as the
        /// [`source`](std::error::Error::source).
        detail: ErrorDetail,
    },
    /// The node answered with a Redis error, such as `WRONGTYPE` for a key that holds a
    /// value of another type.
    Redis(ErrorDetail),
    /// The node answered something that is not the Redis protocol or not the reply our
    /// script returns: it is probably not a Redis server.
    Protocol(ErrorDetail),
    /// The lock key no longer held our value when the fencing number was to be recorded
    /// (it expired, or the node lost its data in between).
    LockLost,
    /// The node may have lost lock keys that are still valid (it restarted, started, or
    /// became a master less than the longest TTL in use ago: `reason` says which): it
    /// takes no part in acquiring or extending until every such lock has expired
    /// (releases still go to it). See
    /// [`RedlockBuilder::restart_quarantine`](crate::RedlockBuilder::restart_quarantine).
    Quarantined {
        /// How much longer the quarantine lasts.
        remaining: Duration,
        /// Why the node may have lost keys.
        reason: QuarantineReason,
    },
    /// The server at the node's address is not a master (`role` is what `INFO
    /// replication` said, such as `slave`): lock keys must go to masters, so the node
    /// connects again after a backoff. For a Sentinel-managed node the sentinels named a
    /// replica (a stale or misconfigured sentinel, or a failover under way), and the next
    /// connect asks them again; for a node given by address, point it at the master.
    NotMaster {
        /// The role the server reported.
        role: String,
    },
    /// The node's address reaches the same Redis server (equal `run_id`) as another node
    /// of the client, such as `127.0.0.1:6379` and `localhost:6379`: it is left out, so the
    /// server counts once toward the quorum. List each server once.
    SameServer {
        /// The node (`host:port`) that counts for the server.
        node: String,
    },
    /// The server may evict keys: it has a memory limit (`maxmemory`) and a
    /// `maxmemory-policy` other than `noeviction` (`policy`), so it is refused, and
    /// connects again after a backoff. An evicted lock key lets a second client take a
    /// lock that is still held, and an evicted fencing counter lets fencing numbers go
    /// back. Set `maxmemory-policy noeviction` on lock nodes (or remove the limit), or
    /// accept the risk with
    /// [`RedlockBuilder::allow_eviction`](crate::RedlockBuilder::allow_eviction).
    Evicting {
        /// The server's `maxmemory-policy`.
        policy: String,
    },
}

impl NodeError {
    /// Whether this error means the connection must be rebuilt.
    pub(crate) fn breaks_connection(&self) -> bool {
        matches!(
            self,
            Self::Refused | Self::Connection(_) | Self::Tls { .. } | Self::Protocol(_)
        )
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("timed out"),
            Self::Refused => f.write_str("connection refused"),
            Self::Connection(e) => write!(f, "connection failed: {e}"),
            Self::Tls { problem, detail } => write!(f, "TLS failed: {problem} ({detail})"),
            Self::Redis(e) => write!(f, "Redis error: {e}"),
            Self::Protocol(e) => write!(f, "protocol error (is this a Redis server?): {e}"),
            Self::Quarantined { remaining, reason } => write!(
                f,
                "in the restart quarantine for another {remaining:?} (it may have lost lock keys: {reason})"
            ),
            Self::NotMaster { role } => write!(
                f,
                "the server is not a master (role:{role}); lock nodes must be masters"
            ),
            Self::SameServer { node } => {
                write!(f, "the same Redis server as node {node} (equal run_id)")
            }
            Self::Evicting { policy } => write!(
                f,
                "the server may evict lock keys and fencing counters (maxmemory-policy \
                 {policy} with a maxmemory limit): set maxmemory-policy noeviction on lock \
                 nodes, or opt in with RedlockBuilder::allow_eviction(true)"
            ),
            Self::LockLost => {
                f.write_str("the lock key vanished before its fencing number was recorded")
            }
        }
    }
}

impl std::error::Error for NodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connection(d)
            | Self::Tls { detail: d, .. }
            | Self::Redis(d)
            | Self::Protocol(d) => d.source(),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for NodeError {
    fn from(e: redis::RedisError) -> Self {
        use redis::ErrorKind;
        if e.is_connection_refusal() {
            return Self::Refused;
        }
        if e.is_timeout() {
            return Self::Timeout;
        }
        if let Some(problem) = TlsProblem::of(&e) {
            return Self::Tls {
                problem,
                detail: ErrorDetail::from(e),
            };
        }
        match e.kind() {
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType | ErrorKind::RESP3NotSupported => {
                Self::Protocol(ErrorDetail::from(e))
            }
            ErrorKind::Server(_) | ErrorKind::Extension => Self::Redis(ErrorDetail::from(e)),
            _ => Self::Connection(ErrorDetail::from(e)),
        }
    }
}

/// What a [`NodeError`] says, and the `redis` error behind it, if there was one, as its
/// [`source`](std::error::Error::source).
///
/// It reads as the message (`Deref<Target = str>`, `Display`); two details are equal when
/// their messages are.
///
/// ```
/// use tower_redlock::NodeError;
///
/// let err = NodeError::Redis("WRONGTYPE Operation against a key".into());
/// if let NodeError::Redis(detail) = &err {
///     assert!(detail.contains("WRONGTYPE"));
/// }
/// ```
#[derive(Debug, Clone)]
pub struct ErrorDetail {
    message: String,
    cause: Option<Arc<redis::RedisError>>,
}

impl ErrorDetail {
    /// The message.
    pub fn as_str(&self) -> &str {
        &self.message
    }

    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<redis::RedisError> for ErrorDetail {
    fn from(e: redis::RedisError) -> Self {
        Self {
            message: e.to_string(),
            cause: Some(Arc::new(e)),
        }
    }
}

impl From<String> for ErrorDetail {
    fn from(message: String) -> Self {
        Self {
            message,
            cause: None,
        }
    }
}

impl From<&str> for ErrorDetail {
    fn from(message: &str) -> Self {
        Self::from(message.to_owned())
    }
}

impl std::ops::Deref for ErrorDetail {
    type Target = str;

    fn deref(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ErrorDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl PartialEq for ErrorDetail {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
    }
}

impl Eq for ErrorDetail {}

/// One node's failure within an operation: which node and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFailure {
    /// The node's address (`host:port`, without credentials).
    pub node: String,
    /// What went wrong there.
    pub error: NodeError,
}

impl NodeFailure {
    /// The failure of the node labelled `node`.
    pub(crate) fn new(node: &str, error: NodeError) -> Self {
        Self {
            node: node.to_owned(),
            error,
        }
    }
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.error)
    }
}
