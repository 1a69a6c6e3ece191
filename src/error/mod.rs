//! Errors: what went wrong, on which node, and what to do about it. Each message is one
//! sentence that says what happened; each variant's docs say what to do.
//!
//! There are three layers of errors:
//!
//! - [`ConfigError`]: the builder refused a configuration (no nodes, a bad URL, a zero TTL,
//!   ...). Fix the configuration; retrying will not help.
//! - [`LockError`]: an operation did not get or keep the lock. Each variant says why:
//!   [`Busy`](LockError::Busy) (someone else holds it), [`NoQuorum`](LockError::NoQuorum)
//!   (too many nodes failed, each with its [`NodeFailure`]),
//!   [`ValidityExhausted`](LockError::ValidityExhausted), [`NotHeld`](LockError::NotHeld),
//!   [`Unverifiable`](LockError::Unverifiable) (replay only),
//!   [`InvalidName`](LockError::InvalidName) and [`Config`](LockError::Config).
//! - [`NodeError`]: why one Redis node did not take part in a quorum; for a failed TLS
//!   handshake, [`NodeError::Tls`] with the [`TlsProblem`].
//!
//! ```
//! use tower_redlock::{ConfigError, Redlock};
//!
//! let err = Redlock::builder(Vec::<String>::new()).build().unwrap_err();
//! assert!(matches!(err, ConfigError::NoNodes));
//! println!("{err}"); // "no Redis nodes given"; the variant's docs say what to do
//! ```

use std::fmt;
use std::time::Duration;

mod config;
mod node;
mod quarantine;
mod tls;

pub use config::ConfigError;
pub use node::{ErrorDetail, NodeError, NodeFailure};
pub use quarantine::QuarantineReason;
pub use tls::TlsProblem;

/// Why an operation on a lock (acquire, extend) did not succeed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LockError {
    /// Another client holds the lock on enough nodes that no quorum is possible.
    ///
    /// Retry after `retry_after` (the layer's 409 and gRPC `ABORTED` say so), or wait
    /// longer with [`max_attempts`](crate::RedlockBuilder::max_attempts) or
    /// [`lock_until`](crate::Redlock::lock_until).
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
    ///
    /// Check that a majority of the nodes is up and reachable
    /// ([`Redlock::health`](crate::Redlock::health) says which are not). Nodes in the
    /// restart quarantine (they started or restarted less than the longest TTL ago and may
    /// have lost lock keys) come back by themselves; nodes started empty on purpose (tests,
    /// demos) can skip it with
    /// [`restart_quarantine(false)`](crate::RedlockBuilder::restart_quarantine).
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
    ///
    /// The nodes are slow for this TTL: raise the TTL, or lower the per-node timeout.
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
        /// How many attempts were made (a guard retries a failed extension while the
        /// validity leaves room).
        attempts: u32,
    },
    /// A replay acquisition (the layer's, with [`replay`](crate::RedlockLayer::replay)
    /// on, refusing keys after a loss: [`AfterLoss::Refuse`](crate::layer::AfterLoss))
    /// got a quorum and found no record, but too few of the nodes that granted it can
    /// vouch that the name has none: they lost data (restarted empty, were flushed, took
    /// over in a failover) within the replay retention, later than their peers, so a
    /// record written before may be gone from them. Granting the lock could run the
    /// handler a second time for a finished key; the layer answers 503
    /// ([`#replay-unverifiable`](crate::layer::problems#replay-unverifiable)).
    ///
    /// It ends by itself once enough nodes have held their data for the retention
    /// (`retry_after`). Persistent nodes (`appendonly yes`, with `appendfsync always` for
    /// no loss at all) keep their records across restarts and avoid it.
    Unverifiable {
        /// How many of the nodes that granted can vouch.
        vouching: usize,
        /// How many nodes granted.
        granted: usize,
        /// How many must vouch (the quorum).
        needed: usize,
        /// When enough of the nodes that granted will vouch, if they grant again.
        retry_after: Option<Duration>,
        /// How many attempts were made.
        attempts: u32,
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
    /// The client was shut down ([`Redlock::shutdown`](crate::Redlock::shutdown)): it
    /// takes and extends no more locks (releases still go out). Build a new client to lock
    /// again.
    Closed,
}

impl LockError {
    /// Whether retrying soon can help (busy, no quorum, validity exhausted).
    /// [`Unverifiable`](Self::Unverifiable) is not: it lasts until its `retry_after`.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Busy { .. } | Self::NoQuorum { .. } | Self::ValidityExhausted { .. }
        )
    }

    /// How many attempts the operation made, for the errors that come from talking to the
    /// nodes.
    pub fn attempts(&self) -> Option<u32> {
        match self {
            Self::Busy { attempts, .. }
            | Self::NoQuorum { attempts, .. }
            | Self::ValidityExhausted { attempts, .. }
            | Self::NotHeld { attempts, .. }
            | Self::Unverifiable { attempts, .. } => Some(*attempts),
            _ => None,
        }
    }
}

/// A stored response (the layer's completion record), kept out of `Debug` output and so
/// out of logs: it holds a response body.
pub(crate) struct RecordBytes(pub(crate) Vec<u8>);

impl fmt::Debug for RecordBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<record of {} bytes>", self.0.len())
    }
}

/// What the crate needs of an error inside: attempts are counted by the retry loop, which
/// stamps the final count ([`with_attempts`](LockError::with_attempts)); an attempt builds
/// its error with 1.
impl LockError {
    /// This error, from an operation that made `n` attempts.
    pub(crate) fn with_attempts(mut self, n: u32) -> Self {
        match &mut self {
            Self::Busy { attempts, .. }
            | Self::NoQuorum { attempts, .. }
            | Self::ValidityExhausted { attempts, .. }
            | Self::NotHeld { attempts, .. }
            | Self::Unverifiable { attempts, .. } => *attempts = n,
            Self::InvalidName { .. } | Self::Config(_) | Self::Entropy(_) | Self::Closed => {}
        }
        self
    }

    /// The outcome field of a span that ended with this error.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            Self::Busy { .. } => "busy",
            Self::NoQuorum { .. } => "no_quorum",
            Self::ValidityExhausted { .. } => "validity_exhausted",
            Self::NotHeld { .. } => "not_held",
            Self::Unverifiable { .. } => "unverifiable",
            Self::InvalidName { .. } | Self::Config(_) | Self::Entropy(_) => "error",
            Self::Closed => "closed",
        }
    }

    /// How long until the nodes the restart quarantine kept out of this attempt are back:
    /// the shortest remaining quarantine, or zero if no node was quarantined.
    pub(crate) fn quarantine_left(&self) -> Duration {
        match self {
            Self::NoQuorum { failures, .. } => failures
                .iter()
                .filter_map(|f| match f.error {
                    NodeError::Quarantined { remaining, .. } => Some(remaining),
                    _ => None,
                })
                .min()
                .unwrap_or_default(),
            _ => Duration::ZERO,
        }
    }

    /// Whether the attempt failed only because its node calls ran into the deadline.
    pub(crate) fn cut_by_deadline(&self) -> bool {
        matches!(self, Self::NoQuorum { failures, .. }
            if failures.iter().all(|f| f.error == NodeError::Timeout))
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
                     (after {attempts} attempt(s)), "
                )?;
                write_expiry(f, *retry_after)
            }
            Self::NoQuorum { .. } => self.fmt_no_quorum(f),
            Self::ValidityExhausted {
                elapsed,
                ttl,
                attempts,
            } => write!(
                f,
                "the quorum took {elapsed:?} of the {ttl:?} TTL, leaving too little validity \
                 (after {attempts} attempt(s))"
            ),
            Self::NotHeld {
                held_on,
                needed,
                failures,
                attempts,
            } => {
                write!(
                    f,
                    "the lock is no longer held: ours on {held_on} node(s), {needed} needed \
                     (after {attempts} attempt(s))"
                )?;
                write_failures(f, failures)
            }
            Self::Unverifiable { .. } => self.fmt_unverifiable(f),
            Self::InvalidName { reason } => write!(f, "invalid lock name: {reason}"),
            Self::Config(e) => write!(f, "invalid setting: {e}"),
            Self::Entropy(e) => write!(
                f,
                "the operating system's random number generator failed: {e}"
            ),
            Self::Closed => {
                f.write_str("the client was shut down (Redlock::shutdown): it takes no more locks")
            }
        }
    }
}

/// When a busy lock's key expires, as [`LockError::Busy`]'s message ends.
fn write_expiry(f: &mut fmt::Formatter<'_>, retry_after: Option<Duration>) -> fmt::Result {
    match retry_after {
        Some(d) => write!(f, "its key expiring in about {d:?}"),
        None => f.write_str("its key without expiry"),
    }
}

impl LockError {
    /// [`LockError::Unverifiable`]'s message.
    fn fmt_unverifiable(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self::Unverifiable {
            vouching,
            granted,
            needed,
            retry_after,
            attempts,
        } = self
        else {
            return Ok(());
        };
        write!(
            f,
            "the lock was granted, but only {vouching} of the {granted} node(s) that granted \
             it can vouch that the name has no completion record ({needed} needed): the \
             others restarted empty or were promoted within the replay retention (after \
             {attempts} attempt(s)); "
        )?;
        if let Some(d) = retry_after {
            write!(f, "enough of them will in about {d:?}; ")?;
        }
        f.write_str("persistent nodes (appendonly yes) avoid this")
    }

    /// [`LockError::NoQuorum`]'s message: the quarantine first when it is the only cause.
    fn fmt_no_quorum(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self::NoQuorum {
            needed,
            reached,
            held_elsewhere,
            failures,
            attempts,
        } = self
        else {
            return Ok(());
        };
        let quarantined = failures
            .iter()
            .map(|fail| match fail.error {
                NodeError::Quarantined { remaining, .. } => Some(remaining),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .and_then(|left| left.into_iter().max());
        if let Some(longest) = quarantined {
            // The nodes that answered: once the quarantined ones left no quorum, the
            // others' answers were not awaited (so no "0 granted" for them).
            write!(
                f,
                "no quorum yet: {} node(s) are in the restart quarantine for up to {longest:?} \
                 more, leaving no quorum of {needed} until then",
                failures.len()
            )?;
            if *reached > 0 {
                write!(f, " ({reached} granted)")?;
            }
            return write!(
                f,
                " (after {attempts} attempt(s); nodes started empty on purpose can skip it \
                 with restart_quarantine(false))"
            );
        }
        write!(
            f,
            "no quorum: {reached} node(s) granted the lock, {needed} needed"
        )?;
        if *held_elsewhere > 0 {
            write!(f, ", {held_elsewhere} held by another client")?;
        }
        write!(f, " (after {attempts} attempt(s))")?;
        write_failures(f, failures)
    }
}

/// `: failure; failure` after a message, when there are failures.
fn write_failures(f: &mut fmt::Formatter<'_>, failures: &[NodeFailure]) -> fmt::Result {
    for (i, fail) in failures.iter().enumerate() {
        f.write_str(if i == 0 { ": " } else { "; " })?;
        write!(f, "{fail}")?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_message_says_where_and_when_its_key_expires() {
        let busy = |retry_after| LockError::Busy {
            held_elsewhere: 2,
            nodes: 3,
            retry_after,
            attempts: 4,
        };
        assert_eq!(
            busy(Some(Duration::from_millis(1500))).to_string(),
            "the lock is held by another client on 2 of 3 nodes (after 4 attempt(s)), its key \
             expiring in about 1.5s"
        );
        assert_eq!(
            busy(None).to_string(),
            "the lock is held by another client on 2 of 3 nodes (after 4 attempt(s)), its key \
             without expiry"
        );
    }
}
