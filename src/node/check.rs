//! A node's check: `INFO server`, `INFO replication`, `INFO persistence` and `INFO memory` (and, with the restart quarantine,
//! the node's ledger and horizon) in one timed round trip, judged as at a connect. Run by
//! `health()`, and in the background every `check_interval` ([`Node::watch`]), so that a
//! node flushed, demoted, promoted again or failed over under a live connection is seen
//! within one interval, by every client alike. Also the horizon's raise before a longer
//! TTL's first lock ([`Node::announce`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let health = redlock.health().await;
//! println!("{} of {} nodes usable", health.usable(), health.nodes().len());
//! # Ok(()) }
//! ```

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::Value;
use tokio::time::timeout_at;

use super::judging::LedgerRead;
use super::loss::Role;
use super::{Conn, Node, Quarantine};
use crate::error::NodeError;

/// The outcome of a check of one node ([`Node::check`]).
pub(crate) struct Check {
    pub(crate) result: Result<(), NodeError>,
    pub(crate) round_trip: Option<Duration>,
    pub(crate) version: Option<String>,
    pub(crate) role: Option<String>,
    /// Whether the server keeps an append-only file, as it last said.
    pub(crate) append_only: Option<bool>,
}

impl Node {
    /// Starts the node's background check, once per node: every `check_interval`, while
    /// the client lives, the node is checked ([`check`](Self::check)), which also
    /// reconnects it when it is down and its backoff ran out. Must be called within a tokio
    /// runtime; if that runtime ends, the next connect starts the check again.
    pub(super) fn watch(self: &Arc<Self>) {
        if self.watched.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let every = self.settings.check_every;
        tokio::spawn(async move {
            let _unwatched = Unwatched(weak.clone());
            loop {
                tokio::time::sleep(every).await;
                let Some(node) = weak.upgrade() else {
                    return;
                };
                let deadline = crate::quorum::later(crate::clock::now(), node.connect_timeout());
                let _ = node.check(deadline).await;
            }
        });
    }

    /// A check within `deadline`: `INFO server` and `INFO replication` (and the ledger's
    /// read, with the restart quarantine) in one round trip, timed, then judged.
    pub(crate) async fn check(self: &Arc<Self>, deadline: Instant) -> Check {
        let failed = |error| self.check_of(Err(error), None, None);
        let deadline = tokio::time::Instant::from_std(deadline);
        let (mut conn, generation) =
            match timeout_at(deadline, self.connection(Quarantine::Ignored)).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return failed(e),
                Err(_) => return failed(NodeError::Timeout),
            };
        #[cfg(feature = "cluster")]
        if let (Some(cluster), Conn::Cluster(c)) = (self.cluster(), &mut conn) {
            return self.check_cluster(cluster, c, deadline).await;
        }
        let judging = self.settings.quarantine && !self.is_cluster();
        let start = crate::clock::now();
        let replies = timeout_at(
            deadline,
            self.check_pipe(judging)
                .query_async::<Vec<redis::RedisResult<Value>>>(&mut conn),
        )
        .await;
        let received = crate::clock::now();
        let round_trip = received.saturating_duration_since(start);
        let replies = match replies {
            Ok(Ok(replies)) => replies,
            Ok(Err(e)) => {
                let e = NodeError::from(e);
                if e.breaks_connection() {
                    self.invalidate(generation, &e);
                }
                return failed(e);
            }
            Err(_) => return failed(NodeError::Timeout),
        };
        let read = Read {
            conn: &conn,
            generation,
            received,
            deadline,
        };
        let (result, role) = self.judge_check(replies, judging, read).await;
        self.check_of(result, Some(round_trip), role)
    }

    /// A check that came to `result` (with its `round_trip` and the `role` the node gave,
    /// where it answered), with the version and persistence the node last told.
    fn check_of(
        &self,
        result: Result<(), NodeError>,
        round_trip: Option<Duration>,
        role: Option<String>,
    ) -> Check {
        let st = self.state();
        Check {
            result,
            round_trip,
            version: st.version.clone(),
            role,
            append_only: st.append_only,
        }
    }

    /// A check's request (see [`check_pipe`](super::judging::check_pipe)): the ledger's
    /// read with it if `judging`.
    fn check_pipe(&self, judging: bool) -> redis::Pipeline {
        let ledger = judging.then(|| (&self.ledger, self.settings.horizon.own_ms()));
        super::judging::check_pipe(ledger)
    }

    /// Judges a check's `replies` read as `read` says (with the ledger's, if `judging`):
    /// a server no longer a master, or no longer named by the sentinels, is left (the
    /// connection dropped); the ledger judged. The outcome, and the role the server said.
    async fn judge_check(
        &self,
        replies: Vec<redis::RedisResult<Value>>,
        judging: bool,
        read: Read<'_>,
    ) -> (Result<(), NodeError>, Option<String>) {
        let mut replies = replies.into_iter();
        let (info, memory) = super::judging::check_info(&mut replies);
        self.saw_memory(&memory);
        self.saw_persistence(&mut self.state(), info.append_only);
        let role = match &info.role {
            Role::Master => Some("master".to_owned()),
            Role::Other(role) => Some(role.clone()),
            Role::Unknown => None,
        };
        let left = match &info.role {
            // Demoted (a failover): reconnect, which for a Sentinel-managed node finds the
            // new master.
            Role::Other(role) => Some(NodeError::NotMaster { role: role.clone() }),
            _ => self.sentinels_moved(read.deadline).await,
        };
        if let Some(left) = left {
            self.invalidate(read.generation, &left);
            return (Err(left), role);
        }
        if !judging {
            return (Ok(()), role);
        }
        let settling = match LedgerRead::parse(replies.next(), replies.next()) {
            Ok(ledger) => {
                let settle = self.settle_over(read.conn, &info, ledger, read.received);
                timeout_at(read.deadline, settle)
                    .await
                    .unwrap_or(Err(NodeError::Timeout))
            }
            Err(e) => Err(e),
        };
        let result = settling.map(|settled| self.judged(&mut self.state(), &settled));
        (result, role)
    }

    /// For a Sentinel-managed node, whether a majority of its sentinels now name another
    /// master than the one connected, which still says it is one (a split brain: the old
    /// master did not hear of the failover): the error to reconnect with, which asks the
    /// sentinels again.
    async fn sentinels_moved(&self, deadline: tokio::time::Instant) -> Option<NodeError> {
        let super::Connector::Sentinel(master) = &self.connector else {
            return None;
        };
        let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
        let (host, port) = master.moved(timeout).await?;
        tracing::warn!(
            node = %self.label,
            master = %format!("{host}:{port}"),
            "redlock node's sentinels name another master than the one connected, which still \
             says it is one (a split brain?): reconnecting to the one they name"
        );
        Some(NodeError::Connection(
            format!("the sentinels now name another master, {host}:{port}: reconnecting").into(),
        ))
    }

    /// Raises the node's horizon to `ttl_ms` (on a Redis Cluster node, every judged
    /// shard's), quarantined or not.
    pub(crate) async fn announce(self: &Arc<Self>, ttl_ms: u64) -> Result<(), NodeError> {
        let (mut conn, _) = self.connection(Quarantine::Ignored).await?;
        #[cfg(feature = "cluster")]
        if let (Some(cluster), super::Conn::Cluster(c)) = (self.cluster(), &mut conn) {
            return self.announce_on_cluster(cluster, c, ttl_ms).await;
        }
        let horizon = &self.settings.horizon;
        super::judging::raise_horizon((&self.ledger, &mut conn), ttl_ms, horizon, self.index).await
    }

    /// The background check and `health()` of a cluster node: its shards checked, timed.
    #[cfg(feature = "cluster")]
    async fn check_cluster(
        &self,
        cluster: &super::ClusterNode,
        conn: &mut redis::cluster_async::ClusterConnection,
        deadline: tokio::time::Instant,
    ) -> Check {
        let start = crate::clock::now();
        let checked = tokio::time::timeout_at(deadline, self.check_shards(cluster, conn)).await;
        let result = checked.map_err(|_| NodeError::Timeout);
        let round_trip = Some(crate::clock::since(start));
        self.check_of(result, round_trip, Some("master".to_owned()))
    }
}

/// How a check's replies were read: over which connection (of which generation), when
/// they arrived (what the node's clock said is at most that old: the long side for a
/// loss's age), and by when the check must end.
struct Read<'a> {
    conn: &'a Conn,
    generation: u64,
    received: Instant,
    deadline: tokio::time::Instant,
}

/// Lets the next connect start a node's background check again once the task that ran it
/// ended (its runtime shut down).
struct Unwatched(Weak<Node>);

impl Drop for Unwatched {
    fn drop(&mut self) {
        if let Some(node) = self.0.upgrade() {
            node.watched.store(false, Ordering::Release);
        }
    }
}
