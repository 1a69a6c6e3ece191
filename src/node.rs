//! One Redis master: its supervised connection, script loading and server identity.
//!
//! Each node keeps one pipelined connection, shared by every lock of the client: our own
//! ([`wire`]) for a plain-TCP node speaking RESP2, a `redis::aio::MultiplexedConnection`
//! for TLS, Unix sockets or RESP3, redis-rs's cluster connection for a cluster. Releases
//! that come while another is on its way go out together ([`batch`]). A background task
//! ([`connect`]) (re)connects: it opens the connection (authenticating and selecting the
//! database as the URL says), reads `INFO` (run id, uptime, version, replication) and
//! loads the scripts, all in one round trip. A command in flight on a node is a [`NodeCall`]
//! ([`call`]). The connection
//! is rebuilt after an I/O or protocol error, or after several consecutive timeouts (a hung
//! server); failed connects back off exponentially. While a node is down, operations fail
//! on it at once with the last connect error instead of waiting; every call is bounded by a
//! deadline, so a hung node never stalls an operation beyond it.
//!
//! **Restart-safe quorum.** A Redis node that restarts without persistence forgets its
//! lock keys, one flushed forgets them too, and a replica promoted by a failover lacks the
//! writes that had not reached it: any could grant a lock that another client still holds
//! through it (the "delayed restart" rule of the Redlock spec exists for this). What a
//! node lost is decided by the node itself ([`loss`]): its ledger, read with `INFO` at
//! every connect and every check, says since when its data is whole, and its horizon how
//! long any client's locks live. A node that may have lost keys takes no part in acquiring
//! or extending (releases still go to it) until the horizon has passed since the loss,
//! for every client alike; a server that is not a master is refused. Each node's
//! connection is checked every `check_interval` ([`check`]), so a flush, a demotion or a
//! failover under a live connection is seen within one interval.
//!
//! `impl Node` comes in layers that never call up: this file (the node's state, the
//! answers and timeouts of its calls), [`judging`] (one read judged and kept) and the
//! cluster's shards (use this file), [`connect`] (uses those), then [`check`] and [`call`]
//! (use all of them), and [`resend`] over [`call`] ([`connect`] names it as where a
//! connection of ours hands the releases it did not write when it breaks). [`loss`]
//! judges what a node keeps and says of itself, and [`batch`] keeps a node's queue of
//! releases; neither knows a node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{Client, Value};
use tokio::sync::Notify;

mod batch;
mod call;
mod check;
pub(crate) mod clocks;
#[cfg(feature = "cluster")]
mod cluster;
mod connect;
mod handshake;
pub(crate) mod judging;
pub(crate) mod loss;
mod renewals;
mod resend;
mod resp;
pub(crate) mod running;
mod storage;
mod wire;

pub(crate) use call::{NodeCall, Sending};
pub(crate) use loss::{Doubts, Horizon, Whole};

/// Whether a node's restart quarantine applies to a call: it does to the calls that decide
/// an acquisition or an extension (a quarantined node refuses them at once, and a cluster
/// node notes where each ran); releases, records and checks go to the node anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quarantine {
    /// The call decides: a quarantined node refuses it.
    Applies,
    /// The call goes to the node whatever its quarantine.
    Ignored,
}
#[cfg(test)]
pub(crate) use renewals::{due_after, mark_of};
pub(crate) use renewals::{renewal_interval, set_expiry_ms};

use crate::error::{NodeError, QuarantineReason};
use crate::sentinel::SentinelMaster;
use loss::{LedgerKeys, NodeLoss};

/// How a node finds its server: a fixed address, the master the sentinels name, or a
/// Redis Cluster (each key on the shard that owns its slot).
pub(crate) enum Connector {
    Direct(Box<Client>),
    Sentinel(Box<SentinelMaster>),
    #[cfg(feature = "cluster")]
    Cluster(Box<cluster::ClusterNode>),
}

#[cfg(feature = "cluster")]
pub(crate) use cluster::ClusterNode;

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
    /// Whether nodes that may have lost keys are quarantined.
    pub(crate) quarantine: bool,
    /// The client's key prefix: the nodes' ledgers go under it (see `loss`).
    pub(crate) key_prefix: Arc<[u8]>,
    /// The length of a quarantine: the longest TTL any client of the nodes uses.
    pub(crate) horizon: Arc<Horizon>,
    /// How often each node's connection is checked in the background (role, ledger).
    pub(crate) check_every: Duration,
    /// The client's running releases (what `shutdown` waits for): each release the node
    /// still sends after its caller stopped waiting (queued, or to send again) counts in it.
    pub(crate) releases: Arc<running::Releases>,
    /// The servers the client's nodes reached: `run_id` -> the node that counts for it.
    pub(crate) servers: Arc<Mutex<HashMap<String, Owner>>>,
    /// How many sets of fencing counters the client keeps on each node.
    pub(crate) counter_sets: usize,
    /// The longest a connection goes between two renewals of a set of counters (a
    /// quarter of the fencing retention; see `renewals`).
    pub(crate) renew_every: Duration,
    /// The client's estimates of its nodes' clocks: each handshake gives its node's.
    pub(crate) clocks: Arc<clocks::NodeClocks>,
    /// Whether a node that may evict keys is taken (with a warning) rather than refused.
    pub(crate) allow_eviction: bool,
}

/// The node that counts for a server: its index and label.
#[derive(Debug, Clone)]
pub(crate) struct Owner {
    index: usize,
    label: String,
}

enum Link {
    /// Never connected yet.
    Idle,
    /// A connect task is running.
    Connecting,
    /// Connected.
    Ready(Conn),
    /// The last connect failed; the next one may start at `retry_at`.
    Down { error: NodeError, retry_at: Instant },
}

struct NodeState {
    slot: Link,
    /// Increases with every successful connect.
    generation: u64,
    /// When the current connection was made (none before the first).
    connected_at: Option<Instant>,
    backoff: Duration,
    /// What this client knows of the node's losses (its ledger as last read).
    loss: NodeLoss,
    /// On a Redis Cluster node, the same of each shard's master, by cluster node id.
    shard_losses: HashMap<String, NodeLoss>,
    /// The node counts in the quarantined-nodes gauge.
    counted: bool,
    /// The server's `run_id` on the last connect, if `INFO` told.
    run_id: Option<String>,
    /// The node whose server this node's address also reaches, if any (logged once).
    same_server_as: Option<String>,
    /// The server's version, from the last connect that could read it.
    version: Option<String>,
    /// Whether the server keeps an append-only file, as its `INFO persistence` last said.
    append_only: Option<bool>,
}

/// One Redis master.
pub(crate) struct Node {
    /// The node's position in the client's list.
    index: usize,
    label: String,
    connector: Connector,
    settings: NodeSettings,
    state: Mutex<NodeState>,
    changed: Notify,
    consecutive_timeouts: AtomicU32,
    /// The releases waiting to go out together while another is on its way.
    releases: Arc<batch::Releases>,
    /// The node refused a `PUBLISH` of a release: its releases tell no waiter.
    untold: AtomicBool,
    /// When fenced acquisitions renew the node's sets of counters.
    renewals: renewals::Renewals,
    /// The node's eviction policy was warned about.
    eviction_warned: AtomicBool,
    /// That `INFO` tells no `run_id` or role was warned about.
    info_warned: AtomicBool,
    /// That the node keeps no append-only file was warned about (to a replay).
    aof_warned: AtomicBool,
    /// The node is near its `maxmemory`, as last seen (see [`storage`]).
    near_full: AtomicBool,
    /// The background check runs (see [`check`]).
    watched: AtomicBool,
    /// Where the node's ledger and horizon are.
    ledger: LedgerKeys,
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
        let renewals = renewals::Renewals::new(settings.counter_sets, settings.renew_every);
        let releases = batch::Releases::counting_in(Arc::clone(&settings.releases));
        Self {
            index,
            label,
            connector,
            state: Mutex::new(NodeState {
                slot: Link::Idle,
                generation: 0,
                connected_at: None,
                backoff: BACKOFF_MIN,
                loss: NodeLoss::default(),
                shard_losses: HashMap::new(),
                counted: false,
                run_id: None,
                same_server_as: None,
                version: None,
                append_only: None,
            }),
            changed: Notify::new(),
            consecutive_timeouts: AtomicU32::new(0),
            releases: Arc::new(releases),
            untold: AtomicBool::new(false),
            eviction_warned: AtomicBool::new(false),
            info_warned: AtomicBool::new(false),
            aof_warned: AtomicBool::new(false),
            near_full: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            ledger: LedgerKeys::new(&settings.key_prefix),
            renewals,
            settings,
        }
    }

    /// The node's position in its client's list.
    pub(crate) fn index(&self) -> usize {
        self.index
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

    fn state(&self) -> MutexGuard<'_, NodeState> {
        // The state stays consistent at every point a panic could occur, so a poisoned
        // lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Since when the node's data is whole, as a replay acquisition sees it (see
    /// [`loss::doubts`]); the first time the node is known to keep no append-only file,
    /// warns once that its records do not survive a restart.
    pub(crate) fn whole(&self) -> Whole {
        let st = self.state();
        self.warn_replay_without_aof(&st);
        st.loss.whole()
    }

    /// How much longer from `now` the node is quarantined, and why, if it is (the state is
    /// locked by the caller). Keeps the quarantined-nodes gauge and logs the end of a
    /// quarantine.
    fn quarantine_left(
        &self,
        st: &mut NodeState,
        now: Instant,
    ) -> Option<(Duration, QuarantineReason)> {
        let horizon = &*self.settings.horizon;
        let left = std::iter::once(&st.loss)
            .chain(st.shard_losses.values())
            .filter_map(|loss| loss.quarantine(now, horizon))
            .max_by_key(|(left, _)| *left);
        let gauge = |m| crate::metrics::gauge(crate::metrics::Gauge::QuarantinedNodes, m);
        match (&left, st.counted) {
            (Some(_), false) => {
                st.counted = true;
                gauge(crate::metrics::Move::Up);
            }
            (None, true) => {
                st.counted = false;
                gauge(crate::metrics::Move::Down);
                tracing::info!(node = %self.label, "redlock node quarantine over: it takes part in acquisitions again");
            }
            _ => {}
        }
        left
    }

    /// Drops the connection of `generation` (if still current) so the next call reconnects.
    /// Our own connection is closed at once: what it had not written yet (a straggling
    /// `SET`, say) is never sent, so it cannot reach the node after a release sent on the
    /// next connection; its calls still out fail (as timed out, when `why` is a timeout).
    fn invalidate(&self, generation: u64, why: &NodeError) {
        let old = {
            let mut st = self.state();
            if st.generation != generation || !matches!(st.slot, Link::Ready(_)) {
                return;
            }
            tracing::debug!(node = %self.label, error = %why, "redlock node connection dropped");
            let down = Link::Down {
                error: why.clone(),
                retry_at: crate::clock::now(),
            };
            std::mem::replace(&mut st.slot, down)
        };
        if let Link::Ready(Conn::Own(wire)) = old {
            wire.close(*why == NodeError::Timeout);
        }
    }

    /// How much longer the node is quarantined, and why, if it is.
    pub(crate) fn quarantined_for(&self) -> Option<(Duration, QuarantineReason)> {
        let mut st = self.state();
        self.quarantine_left(&mut st, crate::clock::now())
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

    /// Whether the node is a Redis Cluster (each command on the shard of its keys).
    fn is_cluster(&self) -> bool {
        match &self.connector {
            Connector::Direct(_) | Connector::Sentinel(_) => false,
            #[cfg(feature = "cluster")]
            Connector::Cluster(_) => true,
        }
    }

    /// Whether releases to this node may go out together in one script call: not on a
    /// cluster, where the keys of one call must share a hash slot.
    fn batches_releases(&self) -> bool {
        !self.is_cluster()
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
            tracing::debug!(node = %self.label, "redlock node stopped answering: {n} consecutive timeouts");
            self.invalidate(generation, &NodeError::Timeout);
        }
    }
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
            key_prefix: Arc::from(&b"redlock:"[..]),
            horizon: Arc::new(Horizon::new(1, Duration::from_secs(1), false)),
            check_every: Duration::from_secs(1),
            releases: Arc::default(),
            servers: Arc::default(),
            counter_sets: 1,
            renew_every: Duration::from_secs(3600),
            clocks: Arc::new(clocks::NodeClocks::new(1, Duration::from_secs(1))),
            allow_eviction: false,
        };
        let node = Node::new(0, "n".into(), Connector::Direct(Box::new(client)), settings);
        let before = Instant::now();
        {
            let mut st = node.state();
            st.generation = 1;
            st.connected_at = Some(before + Duration::from_millis(1));
            st.slot = Link::Down {
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
}
