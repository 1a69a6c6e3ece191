//! Connecting a node: the background task that (re)connects, with backoff, the
//! handshake (`INFO`, the scripts and the node's ledger in one round trip, then the
//! ledger's swap when the judge changed it), the restart quarantine and the
//! one-vote-per-server check, and [`Node::connection`], which every call goes through
//! when the connection is not ready at once. A node's first connect starts its
//! background check ([`Node::watch`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // `build` starts each node's connect task; a lock taken at once waits for it.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("job:1").await?;
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use futures_util::FutureExt;
use redis::{AsyncConnectionConfig, Client, Value};
use tokio::time::timeout_at;

use super::handshake::{Replies, evicting_policy, handshake_pipe, info_field};
use super::judging::Settled;
use super::loss::{Role, ServerInfo};
use super::{
    BACKOFF_MAX, BACKOFF_MIN, Conn, Connector, Link, Node, NodeState, Owner, Quarantine, wire,
};
use crate::error::NodeError;

/// A connection just opened, and what its server said of itself.
pub(super) struct Opened {
    conn: Conn,
    info: ServerInfo,
    /// The node's ledger, judged (with the restart quarantine on).
    ledger: Option<Settled>,
    /// When, on this client's monotonic clock, the server read its clock for `INFO
    /// server` (the middle of the handshake's request).
    clock_at: Instant,
    /// The server's eviction policy, if it may evict keys (see [`evicting_policy`]) and
    /// the client does not allow it.
    evicting: Option<String>,
}

impl Node {
    /// Starts connecting in the background if the node is not connected or connecting.
    /// Must be called within a tokio runtime.
    pub(crate) fn kick(self: &Arc<Self>) {
        let mut st = self.state();
        if matches!(st.slot, Link::Idle | Link::Down { .. }) {
            self.start_connect(&mut st);
        }
    }

    fn start_connect(self: &Arc<Self>, st: &mut NodeState) {
        st.slot = Link::Connecting;
        let node = Arc::clone(self);
        tokio::spawn(async move {
            // Dropped unfinished (the runtime shut down): the node can connect again.
            let mut unfinished = Unfinished(Some(&node));
            let outcome = AssertUnwindSafe(node.open())
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Err(NodeError::Connection(
                        format!(
                            "the connect task panicked: {}",
                            panic_message(&*panic).trim()
                        )
                        .into(),
                    ))
                });
            if let Ok(Opened {
                conn: Conn::Own(wire),
                ..
            }) = &outcome
            {
                // Releases it has not written when it breaks go on the next connection.
                let weak = Arc::downgrade(&node);
                wire.on_unsent(move |unsent| Node::resend(&weak, unsent));
            }
            node.connected(outcome);
            unfinished.0 = None;
            node.watch();
        });
    }

    /// Opens a connection: connects, reads `INFO` and the ledger and loads the scripts in
    /// one round trip (and swaps the ledger in another when the judge changed it), within
    /// the connect timeout. A server that is not a master is refused: for a Sentinel-managed
    /// node, the next connect asks the sentinels again.
    async fn open(&self) -> Result<Opened, NodeError> {
        let deadline = tokio::time::Instant::from_std(crate::quorum::later(
            crate::clock::now(),
            self.settings.connect_timeout,
        ));
        let client = match &self.connector {
            #[cfg(feature = "cluster")]
            Connector::Cluster(cluster) => return self.open_cluster(cluster, deadline).await,
            Connector::Direct(client) => (**client).clone(),
            Connector::Sentinel(master) => {
                match timeout_at(deadline, master.resolve(self.settings.connect_timeout)).await {
                    Ok(found) => found?,
                    Err(_) => {
                        return Err(NodeError::Connection(
                            "no sentinel answered within the connect timeout".into(),
                        ));
                    }
                }
            }
        };
        let tls = matches!(
            client.get_connection_info().addr(),
            redis::ConnectionAddr::TcpTls { .. }
        );
        let opened = match timeout_at(deadline, self.handshake(&client)).await {
            Ok(Ok(Ok(opened))) => opened,
            Ok(Ok(Err(refused))) => return Err(refused),
            Ok(Err(e)) => return Err(self.connect_failed(e, tls)),
            Err(_) => return Err(self.connect_timed_out(tls)),
        };
        match refusal(&opened) {
            Some(refused) => Err(refused),
            None => Ok(opened),
        }
    }

    /// Opens a Redis Cluster connection within `deadline`, its shards checked with the
    /// restart quarantine. No `INFO` here (there is one server per shard: the shards' check
    /// reads theirs) and no `SCRIPT LOAD` (a shard that lacks a script gets it by `EVAL` on
    /// first use).
    #[cfg(feature = "cluster")]
    async fn open_cluster(
        &self,
        cluster: &super::ClusterNode,
        deadline: tokio::time::Instant,
    ) -> Result<Opened, NodeError> {
        let mut conn = match timeout_at(deadline, cluster.client.get_async_connection()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) if !e.is_timeout() => return Err(NodeError::from(e)),
            Ok(Err(_)) | Err(_) => return Err(self.connect_timed_out(false)),
        };
        if self.settings.quarantine {
            // A check cut short leaves shards unchecked: the first acquisition on each
            // checks again.
            let _ = timeout_at(deadline, self.check_shards(cluster, &mut conn)).await;
        }
        Ok(Opened {
            conn: Conn::Cluster(conn),
            info: ServerInfo::default(),
            ledger: None,
            clock_at: crate::clock::now(),
            evicting: None,
        })
    }

    /// Connects through `client` and, in one round trip, reads `INFO server`, `INFO
    /// replication`, `INFO memory` and `INFO persistence`, loads the scripts and (with the
    /// restart quarantine) reads the node's ledger and raises its horizon; then judges the
    /// ledger, swapping it when the verdict changed it.
    async fn handshake(&self, client: &Client) -> redis::RedisResult<Result<Opened, NodeError>> {
        let mut conn = self.connect_to(client).await?;
        let horizon = &self.settings.horizon;
        let ledger = self
            .settings
            .quarantine
            .then(|| (&self.ledger, horizon.own_ms()));
        let sent = crate::clock::now();
        let replies: Vec<redis::RedisResult<Value>> =
            handshake_pipe(ledger).query_async(&mut conn).await?;
        // The server read its clock for `INFO server` between the two; the ledger's age is
        // measured from the reply's arrival (the long side).
        let received = crate::clock::now();
        let clock_at = sent + received.saturating_duration_since(sent) / 2;
        let replies = Replies::split(replies, ledger.is_some())?;
        if let Some(memory) = &replies.memory {
            self.saw_memory(memory);
        }
        let evicting = replies
            .memory
            .and_then(|memory| self.refuses_eviction(&memory));
        let server = self.server_text(replies.server)?;
        let info = ServerInfo::parse([
            server.as_str(),
            replies.replication.as_str(),
            replies.persistence.as_str(),
        ]);
        let ledger = match replies.ledger {
            // A replica is refused before its ledger counts (see `refusal`).
            Some(_) if info.role != Role::Master && info.role != Role::Unknown => None,
            Some(Err(refused)) => return Ok(Err(refused)),
            Some(Ok(read)) => match self.settle_over(&conn, &info, read, received).await {
                Ok(settled) => Some(settled),
                Err(e) => return Ok(Err(e)),
            },
            None => None,
        };
        Ok(Ok(Opened {
            conn,
            info,
            ledger,
            clock_at,
            evicting,
        }))
    }

    /// `INFO server`'s text. A server that refuses `INFO` (an ACL without `+info`) is
    /// refused with the restart quarantine; without it, it only loses the same-server check.
    fn server_text(&self, server: redis::RedisResult<String>) -> redis::RedisResult<String> {
        match server {
            Ok(server) => Ok(server),
            Err(e) if self.settings.quarantine => Err(e),
            Err(e) => {
                tracing::debug!(node = %self.label, error = %e, "redlock node: INFO not allowed; no same-server check");
                Ok(String::new())
            }
        }
    }

    /// The connection to the server behind `client`: our own for plain TCP, redis-rs's
    /// otherwise.
    async fn connect_to(&self, client: &Client) -> redis::RedisResult<Conn> {
        Ok(match wire::plain_tcp(client) {
            Some((host, port, tcp)) => {
                let wire = wire::Wire::connect(host, port, tcp).await?;
                wire::handshake(&wire, client.get_connection_info().redis_settings()).await?;
                Conn::Own(wire)
            }
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.settings.connect_timeout))
                    .set_response_timeout(None);
                Conn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                )
            }
        })
    }

    /// The error of a handshake that failed with `e` (over TLS if `tls`).
    fn connect_failed(&self, e: redis::RedisError, tls: bool) -> NodeError {
        let no_info = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
            && e.to_string().to_ascii_lowercase().contains("info");
        if self.settings.quarantine && no_info {
            return NodeError::Redis(
                format!(
                    "the user may not run INFO, which the restart quarantine needs: grant it \
                     +info, or turn restart_quarantine off ({e})"
                )
                .into(),
            );
        }
        if e.is_timeout() {
            return self.connect_timed_out(tls);
        }
        NodeError::from(e)
    }

    /// What `INFO memory` (`memory`) says of eviction: `Some(policy)` when the server may
    /// evict keys ([`evicting_policy`]) and the client does not allow it (the connect is
    /// then refused with [`NodeError::Evicting`]); with
    /// [`allow_eviction`](crate::RedlockBuilder::allow_eviction), a warning instead, once
    /// per node.
    fn refuses_eviction(&self, memory: &str) -> Option<String> {
        let policy = evicting_policy(memory)?;
        if !self.settings.allow_eviction {
            return Some(policy.to_owned());
        }
        if self.eviction_warned.swap(true, Ordering::Relaxed) {
            return None;
        }
        let maxmemory = info_field(memory, "maxmemory").unwrap_or("?");
        tracing::warn!(
            node = %self.label,
            policy,
            maxmemory,
            "redlock node may evict keys (maxmemory-policy is not noeviction, and allow_eviction \
             is on): an evicted lock key lets another client take a held lock, and an evicted \
             fencing counter lets fencing numbers go back; set maxmemory-policy noeviction on \
             lock nodes"
        );
        None
    }

    /// The error of a connect that got no answer in time (over TLS if `tls`). A plain
    /// Redis port answers a TLS handshake with nothing at all, so over TLS the message
    /// asks whether the port is the TLS one.
    fn connect_timed_out(&self, tls: bool) -> NodeError {
        let hint = if tls {
            " (a rediss:// node: is the port the server's tls-port? A plain port does not \
             answer a TLS handshake)"
        } else {
            ""
        };
        NodeError::Connection(
            format!(
                "no answer within the connect timeout of {:?}{hint}",
                self.settings.connect_timeout
            )
            .into(),
        )
    }

    /// Whether the server behind `info` already counts for another node of the client;
    /// if not, it counts for this one from now on.
    fn same_server(&self, info: &ServerInfo) -> Option<String> {
        if info.run_id.is_empty() {
            return None;
        }
        let mut servers = self
            .settings
            .servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        servers.retain(|_, owner| owner.index != self.index);
        match servers.get(&info.run_id) {
            Some(owner) => Some(owner.label.clone()),
            None => {
                let owner = Owner {
                    index: self.index,
                    label: self.label.clone(),
                };
                servers.insert(info.run_id.clone(), owner);
                None
            }
        }
    }

    /// A connect finished with `outcome`: the node is ready, or down until its backoff
    /// runs out.
    fn connected(&self, outcome: Result<Opened, NodeError>) {
        let outcome = outcome.and_then(|opened| match self.same_server(&opened.info) {
            Some(other) => Err(NodeError::SameServer { node: other }),
            None => Ok(opened),
        });
        {
            let mut st = self.state();
            match outcome {
                Ok(opened) => self.ready(&mut st, opened),
                Err(NodeError::SameServer { node }) => {
                    if st.same_server_as.as_deref() != Some(node.as_str()) {
                        tracing::error!(
                            node = %self.label,
                            same_as = %node,
                            "redlock node is the same Redis server as another node of this client (equal run_id): it is left out, so the server counts once toward the quorum; list each server once"
                        );
                    }
                    st.same_server_as = Some(node.clone());
                    st.slot = Link::Down {
                        error: NodeError::SameServer { node },
                        retry_at: crate::quorum::later(crate::clock::now(), BACKOFF_MAX),
                    };
                    st.backoff = BACKOFF_MAX;
                }
                Err(error) => {
                    tracing::warn!(node = %self.label, %error, retry_in = ?st.backoff, "redlock node connect failed");
                    st.slot = Link::Down {
                        error,
                        retry_at: crate::quorum::later(crate::clock::now(), st.backoff),
                    };
                    st.backoff = (st.backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// The node is connected through `opened` (the state is locked by the caller): its
    /// judged ledger kept (the quarantine), and ready.
    fn ready(&self, st: &mut NodeState, opened: Opened) {
        let Opened {
            conn,
            info,
            ledger,
            clock_at,
            evicting: _,
        } = opened;
        if let Some(time_us) = info.time_us {
            self.settings.clocks.record(self.index, time_us, clock_at);
        }
        tracing::debug!(
            node = %self.label,
            version = %info.version,
            uptime_s = info.uptime.as_secs(),
            "redlock node connected"
        );
        if let Some(settled) = &ledger {
            self.judged(st, settled);
        }
        if !info.version.is_empty() {
            st.version = Some(info.version.clone());
        }
        self.saw_persistence(st, info.append_only);
        st.run_id = (!info.run_id.is_empty()).then(|| info.run_id.clone());
        st.same_server_as = None;
        st.generation += 1;
        st.connected_at = Some(crate::clock::now());
        st.slot = Link::Ready(conn);
        st.backoff = BACKOFF_MIN;
        self.consecutive_timeouts.store(0, Ordering::Relaxed);
    }

    /// A connect task dropped before it finished: the node is down, ready to reconnect.
    fn connect_abandoned(&self) {
        {
            let mut st = self.state();
            if matches!(st.slot, Link::Connecting) {
                st.slot = Link::Down {
                    error: NodeError::Connection(
                        "the connect task was dropped before it finished (its tokio runtime shut down?)"
                            .into(),
                    ),
                    retry_at: crate::clock::now(),
                };
            }
        }
        self.changed.notify_waiters();
    }

    /// Waits for a connect in progress (starting one if the node is idle, or down with
    /// its backoff run out); at once when the node is connected, or down.
    pub(crate) async fn settle(self: &Arc<Self>) {
        let _ = self.connection(Quarantine::Ignored).await;
    }

    /// The current connection, waiting for a connect in progress. Fails at once while the
    /// node is down and its backoff has not run out, and, when the `quarantine` applies,
    /// while it is quarantined.
    pub(super) async fn connection(
        self: &Arc<Self>,
        quarantine: Quarantine,
    ) -> Result<(Conn, u64), NodeError> {
        loop {
            let notified = self.changed.notified();
            {
                let mut st = self.state();
                match &st.slot {
                    Link::Ready(conn) => {
                        let ready = (conn.clone(), st.generation);
                        if quarantine == Quarantine::Applies
                            && let Some((remaining, reason)) =
                                self.quarantine_left(&mut st, crate::clock::now())
                        {
                            return Err(NodeError::Quarantined { remaining, reason });
                        }
                        return Ok(ready);
                    }
                    Link::Connecting => {}
                    Link::Idle => self.start_connect(&mut st),
                    Link::Down { error, retry_at } => {
                        if crate::clock::now() < *retry_at {
                            return Err(error.clone());
                        }
                        self.start_connect(&mut st);
                    }
                }
            }
            notified.await;
        }
    }
}

/// Resets the node when a connect task is dropped before it finished.
struct Unfinished<'a>(Option<&'a Arc<Node>>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(node) = self.0 {
            node.connect_abandoned();
        }
    }
}

/// Why a server just `opened` may not be a lock node, if it may not: it evicts keys (and
/// the client does not allow it), or it is not a master.
fn refusal(opened: &Opened) -> Option<NodeError> {
    if let Some(policy) = &opened.evicting {
        return Some(NodeError::Evicting {
            policy: policy.clone(),
        });
    }
    match &opened.info.role {
        Role::Other(role) => Some(NodeError::NotMaster { role: role.clone() }),
        Role::Master | Role::Unknown => None,
    }
}

/// The message of a panic payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}
