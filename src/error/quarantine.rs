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
/// [`NodeStatus::Quarantined`](crate::NodeStatus::Quarantined)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuarantineReason {
    /// Its `run_id` changed since this client last connected: it restarted, or another
    /// server answers at its address (a failover), and it may have lost keys.
    Restarted,
    /// On first contact it had been up for less than the longest TTL in use.
    Young,
    /// It became a master less than the longest TTL ago, or at a time nothing tells (a
    /// failover promoted a replica, which may lack the last writes of the old master).
    Promoted,
    /// A shard of a Redis Cluster node has a new master, or its master restarted.
    ShardChanged,
}

impl std::fmt::Display for QuarantineReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Restarted => "it restarted (new run id)",
            Self::Young => "it started less than the longest TTL ago",
            Self::Promoted => "it became a master less than the longest TTL ago (a failover)",
            Self::ShardChanged => "a shard of the cluster has a new or restarted master",
        })
    }
}
