//! [`QuarantineReason`]: why the restart quarantine keeps a node out of acquisitions, as
//! [`NodeError::Quarantined`](crate::NodeError::Quarantined) and
//! [`NodeStatus::Quarantined`](crate::NodeStatus::Quarantined) say it.
//!
//! ```
//! use tower_redlock::QuarantineReason;
//!
//! let reason = QuarantineReason::Promoted;
//! assert!(reason.to_string().contains("became a master"));
//! ```

/// Why the restart quarantine keeps a node out of acquisitions (see
/// [`NodeStatus::Quarantined`](crate::NodeStatus::Quarantined)). The node's own ledger
/// records it, so every client of the node gives the same reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuarantineReason {
    /// It answered without its ledger, the key that names its dataset: it restarted
    /// empty, was flushed (`FLUSHALL`), is a replica that never synced, or is new to these
    /// clients (nothing tells these apart). Every key it held may be gone.
    Empty,
    /// Another server process answers than at the last judgement, started less than the
    /// longest TTL ago: it restarted and reloaded its data from a file, so writes since
    /// its last save may be gone.
    Restarted,
    /// It became a master: a failover promoted a replica (another process than at the last
    /// judgement, running for longer than the longest TTL), or a master was demoted and
    /// promoted again. Writes replication had not carried may be gone.
    Promoted,
}

impl std::fmt::Display for QuarantineReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Empty => {
                "it answered without its ledger (restarted empty, flushed, a replica that never synced, or new)"
            }
            Self::Restarted => "it restarted (another run id) and reloaded its data from a file",
            Self::Promoted => "it became a master (a failover)",
        })
    }
}
