//! One Redis master: its supervised connection, script loading and server identity.
//!
//! Each node keeps one pipelined connection, shared by every lock of the client: our own
//! ([`wire`]) for a plain-TCP node speaking RESP2, a `redis::aio::MultiplexedConnection`
//! for TLS, Unix sockets or RESP3, redis-rs's cluster connection for a cluster. Releases
//! that come while another is on its way go out together ([`batch`]). A background task
//! (re)connects: it opens the connection (authenticating and selecting the database as
//! the URL says), reads `INFO server`
//! (run id, uptime, version) and loads the scripts, all in one round trip. The connection
//! is rebuilt after an I/O or protocol error, or after several consecutive timeouts (a hung
//! server); failed connects back off exponentially. While a node is down, operations fail
//! on it at once with the last connect error instead of waiting; every call is bounded by a
//! deadline, so a hung node never stalls an operation beyond it.
//!
//! **Restart-safe quorum.** A Redis node that restarts without persistence forgets its
//! lock keys, and could grant a lock that another client still holds through it (the
//! "delayed restart" rule of the Redlock spec exists for this). Every connect reads the
//! node's `run_id`: when it differs from the one seen before, the node restarted, and it is
//! quarantined for the longest TTL in use: it takes no part in acquiring or extending
//! (releases still go to it) until every lock it may have lost has expired. On first
//! contact, a node up for less than that TTL is quarantined for the difference. The
//! quarantine is timed on the client's monotonic clock.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};
use tokio::sync::Notify;
use tokio::time::timeout_at;

mod batch;
mod resp;
mod wire;

pub(crate) use batch::Waiting;
pub(crate) use wire::Writes;

use crate::error::NodeError;
use crate::scripts::{self, Call};
use crate::sentinel::SentinelMaster;

/// How a node finds its server: a fixed address, the master the sentinels name, or a
/// Redis Cluster (each key on the shard that owns its slot).
pub(crate) enum Connector {
    Direct(Box<Client>),
    Sentinel(Box<SentinelMaster>),
    #[cfg(feature = "cluster")]
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// A node's connection: our own pipelined connection (plain TCP), one redis-rs
/// multiplexed connection (TLS, Unix sockets, RESP3), or a cluster connection that routes
/// each command to the shard of its first key.
#[derive(Clone)]
pub(crate) enum Conn {
    Own(wire::Wire),
    Single(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Self::Own(c) => c.req_packed_command(cmd),
            Self::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Own(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Own(c) => c.get_db(),
            Self::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// Shortest wait before reconnecting after a failed connect.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest wait before reconnecting after repeated failed connects.
const BACKOFF_MAX: Duration = Duration::from_millis(1_000);

/// Connection settings shared by the nodes of a client.
#[derive(Debug, Clone)]
pub(crate) struct NodeSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) reconnect_after_timeouts: u32,
    /// Whether restarted or young nodes are quarantined.
    pub(crate) quarantine: bool,
    /// The longest TTL the client has used, in ms: the length of a quarantine.
    pub(crate) max_ttl_ms: Arc<AtomicU64>,
    /// The servers the client's nodes reached: `run_id` -> the node that counts for it.
    pub(crate) servers: Arc<Mutex<HashMap<String, Owner>>>,
}

/// The node that counts for a server: its index and label.
#[derive(Debug, Clone)]
pub(crate) struct Owner {
    index: usize,
    label: String,
}

/// Why a node is kept out of acquisitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuarantineCause {
    /// Its `run_id` changed: it restarted and may have lost its keys.
    Restarted,
    /// First contact, and it has been up for less than the longest TTL.
    Young { uptime: Duration },
}

/// How long to quarantine a node that just (re)connected, given the `run_id` seen before
/// (if any), what it says about itself now, and the longest TTL in use.
pub(crate) fn quarantine_for(
    previous_run_id: Option<&str>,
    info: &ServerInfo,
    max_ttl: Duration,
) -> Option<(Duration, QuarantineCause)> {
    match previous_run_id {
        Some(previous) if previous != info.run_id => Some((max_ttl, QuarantineCause::Restarted)),
        Some(_) => None,
        // `uptime_in_seconds` is rounded down, so this errs on the long side.
        None => max_ttl
            .checked_sub(info.uptime)
            .filter(|d| !d.is_zero())
            .map(|d| {
                (
                    d,
                    QuarantineCause::Young {
                        uptime: info.uptime,
                    },
                )
            }),
    }
}

/// What `INFO server` said on the last connect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    pub(crate) run_id: String,
    pub(crate) uptime: Duration,
    pub(crate) version: String,
}

impl ServerInfo {
    fn parse(info: &str) -> Self {
        let mut out = Self::default();
        for line in info.lines() {
            let Some((k, v)) = line.trim_end().split_once(':') else {
                continue;
            };
            match k {
                "run_id" => out.run_id = v.to_owned(),
                "redis_version" => out.version = v.to_owned(),
                "uptime_in_seconds" => {
                    out.uptime = Duration::from_secs(v.parse().unwrap_or(0));
                }
                _ => {}
            }
        }
        out
    }
}

/// How a round sends its command to a node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sending {
    /// Acquire and extend: a quarantined node fails at once (releases go to it too).
    pub(crate) acquiring: bool,
    /// Who writes the command on an idle connection of ours.
    pub(crate) writes: wire::Writes,
    /// When the round stops waiting: a release holds its node's turn at most that long.
    pub(crate) deadline: Instant,
}

/// A call started by [`Node::start`]; it owns what it needs, so it can outlive its round.
pub(crate) enum Start {
    /// The command is on the node's own connection.
    Sent(Started),
    /// A release queued for the node's next batch.
    Queued(batch::Waiting),
}

/// A call on the node's own connection whose command is sent: its answer is still to
/// come.
pub(crate) struct Started {
    node: Arc<Node>,
    /// The connection's generation, for [`Node::answered`].
    generation: u64,
    wire: wire::Wire,
    reply: wire::Reply,
}

/// What a [`Started`] call came to.
pub(crate) enum Answer {
    /// The node's answer.
    Done(Result<Value, NodeError>),
    /// The first answer asks for a follow-up (a script the node no longer has, or a taken
    /// key whose holder's TTL is needed): it runs in this future (rare, so boxed).
    More(BoxFuture<'static, Result<Value, NodeError>>),
}

impl Started {
    /// Polls for the answer to `call` (the call this was started with).
    pub(crate) fn poll_answer(&mut self, call: &Arc<Call>, cx: &mut Context<'_>) -> Poll<Answer> {
        let first = ready!(Pin::new(&mut self.reply).poll(cx));
        if call.needs_more(&first) {
            let (node, generation) = (Arc::clone(&self.node), self.generation);
            let (call, mut conn) = (Arc::clone(call), Conn::Own(self.wire.clone()));
            return Poll::Ready(Answer::More(Box::pin(async move {
                let answer = call.finish(first, &mut conn).await;
                node.answered(generation, answer)
            })));
        }
        Poll::Ready(Answer::Done(self.node.answered(self.generation, first)))
    }
}

enum Slot {
    /// Never connected yet.
    Idle,
    /// A connect task is running.
    Connecting,
    /// Connected.
    Ready(Conn),
    /// The last connect failed; the next one may start at `retry_at`.
    Down { error: NodeError, retry_at: Instant },
}

struct State {
    slot: Slot,
    /// Increases with every successful connect.
    generation: u64,
    /// When the current connection was made (none before the first).
    connected_at: Option<Instant>,
    backoff: Duration,
    /// The `run_id` of the first successful connect, updated on restarts.
    known_run_id: Option<String>,
    /// Kept out of acquire and extend until then.
    quarantined_until: Option<Instant>,
    /// The node whose server this node's address also reaches, if any (logged once).
    same_server_as: Option<String>,
    /// The server's version, from the last connect that could read it.
    version: Option<String>,
}

/// The outcome of a health check of one node ([`Node::check`]).
pub(crate) struct Check {
    pub(crate) result: Result<(), NodeError>,
    pub(crate) round_trip: Option<Duration>,
    pub(crate) version: Option<String>,
    pub(crate) role: Option<String>,
}

/// One Redis master.
pub(crate) struct Node {
    /// The node's position in the client's list.
    index: usize,
    label: String,
    connector: Connector,
    settings: NodeSettings,
    state: Mutex<State>,
    changed: Notify,
    consecutive_timeouts: AtomicU32,
    /// The releases waiting to go out together while another is on its way.
    releases: batch::Releases,
    /// The node refused a `PUBLISH` of a release: its releases tell no waiter.
    untold: AtomicBool,
    /// The node's eviction policy was warned about.
    eviction_warned: AtomicBool,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("addr", &self.label).finish()
    }
}

impl Node {
    pub(crate) fn new(
        index: usize,
        label: String,
        connector: Connector,
        settings: NodeSettings,
    ) -> Self {
        Self {
            index,
            label,
            connector,
            settings,
            state: Mutex::new(State {
                slot: Slot::Idle,
                generation: 0,
                connected_at: None,
                backoff: BACKOFF_MIN,
                known_run_id: None,
                quarantined_until: None,
                same_server_as: None,
                version: None,
            }),
            changed: Notify::new(),
            consecutive_timeouts: AtomicU32::new(0),
            releases: batch::Releases::default(),
            untold: AtomicBool::new(false),
            eviction_warned: AtomicBool::new(false),
        }
    }

    /// `host:port`, without credentials.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// The node's client, for connections of other kinds (pub/sub): for a Sentinel-managed
    /// node, that of the master found last (`None` before the first lookup).
    pub(crate) fn client(&self) -> Option<Client> {
        match &self.connector {
            Connector::Direct(client) => Some((**client).clone()),
            Connector::Sentinel(master) => master.current(),
            // Waiters on a cluster node poll it (pub/sub there is not per shard).
            #[cfg(feature = "cluster")]
            Connector::Cluster(_) => None,
        }
    }

    /// The time allowed to connect to the node.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.settings.connect_timeout
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every point a panic could occur, so a poisoned
        // lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How much longer the node is quarantined, if it is (the state is locked by the caller).
    fn quarantine_left(&self, st: &mut State) -> Option<Duration> {
        let until = st.quarantined_until?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            st.quarantined_until = None;
            crate::metrics::gauge(crate::metrics::Gauge::QuarantinedNodes, false);
            tracing::info!(node = %self.label, "redlock node quarantine over: it takes part in acquisitions again");
            return None;
        }
        Some(left)
    }

    /// Starts connecting in the background if the node is not connected or connecting.
    /// Must be called within a tokio runtime.
    pub(crate) fn kick(self: &Arc<Self>) {
        let mut st = self.state();
        if matches!(st.slot, Slot::Idle | Slot::Down { .. }) {
            self.start_connect(&mut st);
        }
    }

    fn start_connect(self: &Arc<Self>, st: &mut State) {
        st.slot = Slot::Connecting;
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
            node.connected(outcome);
            unfinished.0 = None;
        });
    }

    /// Opens a connection: connects, reads `INFO server` and loads the scripts in one
    /// round trip, within the connect timeout.
    async fn open(&self) -> Result<(Conn, ServerInfo), NodeError> {
        let deadline = tokio::time::Instant::from_std(crate::quorum::later(
            Instant::now(),
            self.settings.connect_timeout,
        ));
        let quarantine = self.settings.quarantine;
        let client = match &self.connector {
            #[cfg(feature = "cluster")]
            Connector::Cluster(cluster) => {
                // No INFO (there is one server per shard) and no SCRIPT LOAD (a shard that
                // lacks a script gets it by EVAL on first use).
                return match timeout_at(deadline, cluster.get_async_connection()).await {
                    Ok(Ok(conn)) => Ok((Conn::Cluster(conn), ServerInfo::default())),
                    Ok(Err(e)) if !e.is_timeout() => Err(NodeError::from(e)),
                    Ok(Err(_)) | Err(_) => Err(self.connect_timed_out()),
                };
            }
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
        let attempt = async {
            let mut conn = match wire::plain_tcp(&client) {
                Some((host, port)) => {
                    let wire = wire::Wire::connect(host, port).await?;
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
            };
            // `INFO server` feeds the restart quarantine and the same-server check; a user
            // that may not run it can still lock with the quarantine off.
            // `INFO memory` tells the eviction policy (see `warn_if_evicting`); a server
            // that refuses it is simply not checked.
            let mut pipe = redis::pipe();
            pipe.ignore_errors().cmd("INFO").arg("server");
            pipe.cmd("INFO").arg("memory");
            for s in scripts::all() {
                pipe.cmd("SCRIPT").arg("LOAD").arg(s.code);
            }
            let replies: Vec<redis::RedisResult<Value>> = pipe.query_async(&mut conn).await?;
            let mut replies = replies.into_iter();
            let info = replies.next().unwrap_or(Ok(Value::Nil));
            let memory = replies.next().and_then(Result::ok);
            if let Some(failed) = replies.find_map(Result::err) {
                return Err(failed); // a script could not be loaded
            }
            if let Some(memory) = memory.and_then(|v| redis::from_redis_value::<String>(v).ok()) {
                self.warn_if_evicting(&memory);
            }
            let info = match info {
                Ok(v) => redis::from_redis_value_ref::<String>(&v)?,
                Err(e) if quarantine => return Err(e),
                Err(e) => {
                    tracing::debug!(node = %self.label, error = %e, "redlock node: INFO not allowed; no same-server check");
                    String::new()
                }
            };
            Ok::<_, redis::RedisError>((conn, ServerInfo::parse(&info)))
        };
        match timeout_at(deadline, attempt).await {
            Ok(Ok(ok)) => Ok(ok),
            Ok(Err(e))
                if quarantine
                    && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
                    && e.to_string().to_ascii_lowercase().contains("info") =>
            {
                Err(NodeError::Redis(
                    format!(
                        "the user may not run INFO, which the restart quarantine needs: grant \
                         it +info, or turn restart_quarantine off ({e})"
                    )
                    .into(),
                ))
            }
            Ok(Err(e)) if !e.is_timeout() => Err(NodeError::from(e)),
            Ok(Err(_)) | Err(_) => Err(self.connect_timed_out()),
        }
    }

    /// Warns, once per node, when `INFO memory` shows a policy that evicts keys: lock keys
    /// and fencing counters must stay until they expire. An evicted lock key lets a second
    /// client take a lock that is still held; an evicted counter lets fencing numbers go
    /// back (the node's clock seeds a missing one). Only `noeviction` is safe: the
    /// `volatile-*` policies evict keys with a TTL, which is every key of ours.
    fn warn_if_evicting(&self, memory: &str) {
        let policy = memory
            .lines()
            .find_map(|l| l.trim_end().strip_prefix("maxmemory_policy:"));
        let Some(policy) = policy.filter(|p| *p != "noeviction") else {
            return;
        };
        if self.eviction_warned.swap(true, Ordering::Relaxed) {
            return;
        }
        let maxmemory = memory
            .lines()
            .find_map(|l| l.trim_end().strip_prefix("maxmemory:"))
            .unwrap_or("?");
        tracing::warn!(
            node = %self.label,
            policy,
            maxmemory,
            "redlock node may evict keys (maxmemory-policy is not noeviction): an evicted lock \
             key lets another client take a held lock, and an evicted fencing counter lets \
             fencing numbers go back; set maxmemory-policy noeviction on lock nodes"
        );
    }

    /// The error of a connect that got no answer in time.
    fn connect_timed_out(&self) -> NodeError {
        NodeError::Connection(
            format!(
                "no answer within the connect timeout of {:?}",
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
    fn connected(&self, outcome: Result<(Conn, ServerInfo), NodeError>) {
        let outcome = outcome.and_then(|(conn, info)| match self.same_server(&info) {
            Some(other) => Err(NodeError::SameServer { node: other }),
            None => Ok((conn, info)),
        });
        {
            let mut st = self.state();
            match outcome {
                Ok((conn, info)) => {
                    tracing::debug!(
                        node = %self.label,
                        version = %info.version,
                        uptime_s = info.uptime.as_secs(),
                        "redlock node connected"
                    );
                    // A node without a run id (a cluster, or INFO not allowed) is never
                    // quarantined: nothing tells its restarts.
                    if self.settings.quarantine && !info.run_id.is_empty() {
                        self.quarantine_after_connect(&mut st, &info);
                    }
                    if !info.version.is_empty() {
                        st.version = Some(info.version.clone());
                    }
                    st.known_run_id = Some(info.run_id);
                    st.same_server_as = None;
                    st.generation += 1;
                    st.connected_at = Some(Instant::now());
                    st.slot = Slot::Ready(conn);
                    st.backoff = BACKOFF_MIN;
                    self.consecutive_timeouts.store(0, Ordering::Relaxed);
                }
                Err(NodeError::SameServer { node }) => {
                    if st.same_server_as.as_deref() != Some(node.as_str()) {
                        tracing::error!(
                            node = %self.label,
                            same_as = %node,
                            "redlock node is the same Redis server as another node of this client (equal run_id): it is left out, so the server counts once toward the quorum; list each server once"
                        );
                    }
                    st.same_server_as = Some(node.clone());
                    st.slot = Slot::Down {
                        error: NodeError::SameServer { node },
                        retry_at: crate::quorum::later(Instant::now(), BACKOFF_MAX),
                    };
                    st.backoff = BACKOFF_MAX;
                }
                Err(error) => {
                    tracing::warn!(node = %self.label, %error, retry_in = ?st.backoff, "redlock node connect failed");
                    st.slot = Slot::Down {
                        error,
                        retry_at: crate::quorum::later(Instant::now(), st.backoff),
                    };
                    st.backoff = (st.backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Starts a quarantine if the node restarted or is young (see the module docs).
    fn quarantine_after_connect(&self, st: &mut State, info: &ServerInfo) {
        let max_ttl = Duration::from_millis(self.settings.max_ttl_ms.load(Ordering::Relaxed));
        let Some((length, cause)) = quarantine_for(st.known_run_id.as_deref(), info, max_ttl)
        else {
            return;
        };
        let until = crate::quorum::later(Instant::now(), length);
        if st.quarantined_until.is_none() {
            crate::metrics::gauge(crate::metrics::Gauge::QuarantinedNodes, true);
        }
        st.quarantined_until = Some(st.quarantined_until.map_or(until, |u| u.max(until)));
        match cause {
            QuarantineCause::Restarted => tracing::warn!(
                node = %self.label,
                quarantine = ?length,
                "redlock node restarted (new run id) and may have lost lock keys: kept out of acquisitions for the longest TTL"
            ),
            QuarantineCause::Young { uptime } => tracing::warn!(
                node = %self.label,
                ?uptime,
                quarantine = ?length,
                "redlock node started less than the longest TTL ago and may have lost lock keys: kept out of acquisitions until then"
            ),
        }
    }

    /// A connect task dropped before it finished: the node is down, ready to reconnect.
    fn connect_abandoned(&self) {
        {
            let mut st = self.state();
            if matches!(st.slot, Slot::Connecting) {
                st.slot = Slot::Down {
                    error: NodeError::Connection(
                        "the connect task was dropped before it finished (its tokio runtime shut down?)"
                            .into(),
                    ),
                    retry_at: Instant::now(),
                };
            }
        }
        self.changed.notify_waiters();
    }

    /// The current connection, waiting for a connect in progress. Fails at once while the
    /// node is down and its backoff has not run out, and, when `acquiring`, while it is
    /// quarantined.
    async fn connection(self: &Arc<Self>, acquiring: bool) -> Result<(Conn, u64), NodeError> {
        loop {
            let notified = self.changed.notified();
            {
                let mut st = self.state();
                match &st.slot {
                    Slot::Ready(conn) => {
                        let ready = (conn.clone(), st.generation);
                        if acquiring && let Some(remaining) = self.quarantine_left(&mut st) {
                            return Err(NodeError::Quarantined { remaining });
                        }
                        return Ok(ready);
                    }
                    Slot::Connecting => {}
                    Slot::Idle => self.start_connect(&mut st),
                    Slot::Down { error, retry_at } => {
                        if Instant::now() < *retry_at {
                            return Err(error.clone());
                        }
                        self.start_connect(&mut st);
                    }
                }
            }
            notified.await;
        }
    }

    /// Drops the connection of `generation` (if still current) so the next call reconnects.
    /// Our own connection is closed at once: what it had not written yet (a straggling
    /// `SET`, say) is never sent, so it cannot reach the node after a release sent on the
    /// next connection; its calls still out fail.
    fn invalidate(&self, generation: u64, why: &NodeError) {
        let old = {
            let mut st = self.state();
            if st.generation != generation || !matches!(st.slot, Slot::Ready(_)) {
                return;
            }
            tracing::debug!(node = %self.label, error = %why, "redlock node connection dropped");
            let down = Slot::Down {
                error: why.clone(),
                retry_at: Instant::now(),
            };
            std::mem::replace(&mut st.slot, down)
        };
        if let Slot::Ready(Conn::Own(wire)) = old {
            wire.close();
        }
    }

    /// How much longer the node is quarantined, if it is.
    pub(crate) fn quarantined_for(&self) -> Option<Duration> {
        let mut st = self.state();
        self.quarantine_left(&mut st)
    }

    /// A health check within `deadline`: `PING` and `INFO replication` (for the role) in
    /// one round trip, timed.
    pub(crate) async fn check(self: &Arc<Self>, deadline: Instant) -> Check {
        let failed = |error| Check {
            result: Err(error),
            round_trip: None,
            version: self.state().version.clone(),
            role: None,
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        let (mut conn, generation) = match timeout_at(deadline, self.connection(false)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return failed(e),
            Err(_) => return failed(NodeError::Timeout),
        };
        let start = Instant::now();
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .cmd("PING")
            .cmd("INFO")
            .arg("replication");
        let replies = timeout_at(
            deadline,
            pipe.query_async::<Vec<redis::RedisResult<Value>>>(&mut conn),
        )
        .await;
        let round_trip = start.elapsed();
        let mut replies = match replies {
            Ok(Ok(replies)) => replies.into_iter(),
            Ok(Err(e)) => {
                let e = NodeError::from(e);
                if e.breaks_connection() {
                    self.invalidate(generation, &e);
                }
                return failed(e);
            }
            Err(_) => return failed(NodeError::Timeout),
        };
        if let Some(Err(e)) = replies.next() {
            return failed(NodeError::from(e));
        }
        let role = replies
            .next()
            .and_then(Result::ok)
            .and_then(|v| redis::from_redis_value::<String>(v).ok())
            .and_then(|info| {
                info.lines()
                    .find_map(|l| l.trim_end().strip_prefix("role:").map(str::to_owned))
            });
        Check {
            result: Ok(()),
            round_trip: Some(round_trip),
            version: self.state().version.clone(),
            role,
        }
    }

    /// Runs one request (waiting for the connection first if need be). It has no time
    /// limit of its own: the round that sends it bounds all its nodes' calls with one
    /// timer at `deadline`, and reports a call it gave up on with
    /// [`timed_out`](Self::timed_out). With `acquiring` (acquire and extend), a
    /// quarantined node fails at once. A release sent while another is on its way to this
    /// node waits for it and then goes out together with the others that queued
    /// meanwhile (see the `batch` module).
    ///
    /// `on_sent` runs once the command is on our own connection to the node, where any
    /// later command goes after it (it never runs on redis-rs's connections).
    pub(crate) async fn call(
        self: &Arc<Self>,
        call: &Arc<Call>,
        sending: Sending,
        on_sent: impl FnOnce(),
    ) -> Result<Value, NodeError> {
        if call.is_release() && self.batches_releases() {
            return self.release(call, sending).await;
        }
        self.call_now(call, sending, None, on_sent).await
    }

    /// Starts `call` without waiting when the node's own connection is ready (and, with
    /// `acquiring`, the node is not quarantined): the command is then on the connection,
    /// or, for a release while another is on its way to the node, queued for the next
    /// batch (see the `batch` module). `None` otherwise: run [`call`](Self::call).
    pub(crate) fn start(self: &Arc<Self>, call: &Arc<Call>, sending: Sending) -> Option<Start> {
        let (wire, generation) = {
            let mut st = self.state();
            let wire = match &st.slot {
                Slot::Ready(Conn::Own(wire)) => wire.clone(),
                _ => return None,
            };
            if sending.acquiring && self.quarantine_left(&mut st).is_some() {
                return None;
            }
            (wire, st.generation)
        };
        let turn = if call.is_release() && self.batches_releases() {
            match self.take_turn_or_queue(call, sending.deadline) {
                batch::Release::Turn(turn) => Some(turn),
                batch::Release::Queued(waiting) => return Some(Start::Queued(waiting)),
                batch::Release::Alone => None,
            }
        } else {
            None
        };
        Some(Start::Sent(self.send_on(
            &wire,
            generation,
            call,
            turn,
            sending.writes,
        )))
    }

    /// Sends `call` on our own connection `wire` (of `generation`); `turn` if it is a
    /// release holding the node's turn, which the connection drops (hands on) as it reads
    /// the answer.
    fn send_on(
        self: &Arc<Self>,
        wire: &wire::Wire,
        generation: u64,
        call: &Call,
        turn: Option<batch::Turn>,
        writes: wire::Writes,
    ) -> Started {
        let reply = match turn {
            Some(turn) => wire.request_then(call.packed(), writes, Box::new(turn)),
            None => wire.request(call.packed(), writes),
        };
        Started {
            node: Arc::clone(self),
            generation,
            reply,
            wire: wire.clone(),
        }
    }

    /// Runs `call` on the current connection at once; `turn` if it is a release holding
    /// the node's turn (see the `batch` module); `on_sent` as for [`call`](Self::call).
    async fn call_now(
        self: &Arc<Self>,
        call: &Arc<Call>,
        sending: Sending,
        turn: Option<batch::Turn>,
        on_sent: impl FnOnce(),
    ) -> Result<Value, NodeError> {
        let (mut conn, generation) = self.connection(sending.acquiring).await?;
        let answer = match &conn {
            // The hot path: the command encoded once for the round.
            Conn::Own(wire) => {
                let mut started = self.send_on(wire, generation, call, turn, sending.writes);
                on_sent();
                return match std::future::poll_fn(|cx| started.poll_answer(call, cx)).await {
                    Answer::Done(answer) => answer,
                    Answer::More(more) => more.await,
                };
            }
            _ => Box::pin(call.run(&mut conn)).await,
        };
        drop(turn);
        self.answered(generation, answer)
    }

    /// Takes the answer of a request on the connection of `generation`: a request that
    /// got one clears the count of timeouts; one that shows the connection broken (or the
    /// master demoted) drops it.
    fn answered<T>(&self, generation: u64, answer: redis::RedisResult<T>) -> Result<T, NodeError> {
        match answer {
            Ok(v) => {
                if self.consecutive_timeouts.load(Ordering::Relaxed) != 0 {
                    self.consecutive_timeouts.store(0, Ordering::Relaxed);
                }
                Ok(v)
            }
            Err(e) => {
                // A master demoted to replica (a failover) refuses writes: reconnect, which
                // for a Sentinel-managed node finds the new master.
                let demoted =
                    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
                let e = NodeError::from(e);
                if demoted || e.breaks_connection() {
                    self.invalidate(generation, &e);
                }
                Err(e)
            }
        }
    }

    /// Whether releases to this node may go out together in one script call: not on a
    /// cluster, where the keys of one call must share a hash slot.
    fn batches_releases(&self) -> bool {
        match &self.connector {
            Connector::Direct(_) | Connector::Sentinel(_) => true,
            #[cfg(feature = "cluster")]
            Connector::Cluster(_) => false,
        }
    }

    /// A release or completion on this node did its work but the node refused the
    /// `PUBLISH` that tells the waiters (`message`, the server's error: an ACL without the
    /// command or the lock channels). Said once per node, in a warning; from then on this
    /// client's waiters do not count on the node's messages (they poll it instead).
    pub(crate) fn notifications_refused(&self, message: &str) {
        if !self.untold.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                node = %self.label,
                error = %message,
                "redlock node refused PUBLISH in a release: the lock was released, but waiters \
                 are not woken by this node and poll it instead (grant the client's ACL user \
                 +publish and the lock channels, the same pattern as its keys: &<key prefix>*)"
            );
        }
    }

    /// Whether this node refused to tell waiters of a release (see
    /// [`notifications_refused`](Self::notifications_refused)).
    pub(crate) fn tells_waiters(&self) -> bool {
        !self.untold.load(Ordering::Relaxed)
    }

    /// A call to this node, sent at `sent_at`, got no answer before its round's deadline:
    /// after `reconnect_after_timeouts` of them in a row, the connection is dropped, so
    /// that the next call reconnects. A call sent before the current connection was made
    /// does not count: the connection it went out on is gone already.
    pub(crate) fn timed_out(&self, sent_at: Instant) {
        let generation = {
            let st = self.state();
            if st.connected_at.is_none_or(|at| sent_at < at) {
                return;
            }
            st.generation
        };
        let n = self.consecutive_timeouts.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.settings.reconnect_after_timeouts {
            self.consecutive_timeouts.store(0, Ordering::Relaxed);
            self.invalidate(
                generation,
                &NodeError::Connection(format!("{n} consecutive timeouts").into()),
            );
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

/// The message of a panic payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timeouts of calls sent before the current connection was made do not count
    /// against it: a connection replaced after timeouts is not torn down again by the
    /// late timeouts of the calls it had taken.
    #[test]
    fn only_timeouts_on_the_current_connection_count() {
        let client = redis::Client::open("redis://127.0.0.1:1").expect("url");
        let settings = NodeSettings {
            connect_timeout: Duration::from_secs(1),
            reconnect_after_timeouts: 2,
            quarantine: false,
            max_ttl_ms: Arc::default(),
            servers: Arc::default(),
        };
        let node = Node::new(0, "n".into(), Connector::Direct(Box::new(client)), settings);
        let before = Instant::now();
        {
            let mut st = node.state();
            st.generation = 1;
            st.connected_at = Some(before + Duration::from_millis(1));
            st.slot = Slot::Down {
                error: NodeError::Timeout,
                retry_at: before,
            };
        }
        node.timed_out(before);
        node.timed_out(before);
        assert_eq!(node.consecutive_timeouts.load(Ordering::Relaxed), 0);
        let after = before + Duration::from_millis(2);
        node.timed_out(after);
        assert_eq!(node.consecutive_timeouts.load(Ordering::Relaxed), 1);
        node.timed_out(after);
        assert_eq!(
            node.consecutive_timeouts.load(Ordering::Relaxed),
            0,
            "reset: torn down"
        );
    }

    #[test]
    fn quarantine_rules() {
        let info = |run_id: &str, uptime: u64| ServerInfo {
            run_id: run_id.into(),
            uptime: Duration::from_secs(uptime),
            version: "7.0.0".into(),
        };
        let ttl = Duration::from_secs(30);
        // First contact: young nodes wait out the rest of the TTL, old ones are trusted.
        assert_eq!(
            quarantine_for(None, &info("a", 10), ttl),
            Some((
                Duration::from_secs(20),
                QuarantineCause::Young {
                    uptime: Duration::from_secs(10)
                }
            ))
        );
        assert_eq!(quarantine_for(None, &info("a", 30), ttl), None);
        assert_eq!(quarantine_for(None, &info("a", 3600), ttl), None);
        // Reconnects: the same process is trusted, a new one waits a whole TTL whatever
        // its uptime says.
        assert_eq!(quarantine_for(Some("a"), &info("a", 1), ttl), None);
        assert_eq!(
            quarantine_for(Some("a"), &info("b", 3600), ttl),
            Some((ttl, QuarantineCause::Restarted))
        );
    }

    #[test]
    fn parses_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n";
        let s = ServerInfo::parse(info);
        assert_eq!(s.version, "7.0.15");
        assert_eq!(s.run_id, "abc123");
        assert_eq!(s.uptime, Duration::from_secs(42));
    }
}
