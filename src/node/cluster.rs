//! A Redis Cluster node's shards under watch: which masters serve slots, how each was
//! reached, and the check that every acquisition landed on a master this client judged,
//! over the connection it judged.
//!
//! A shard whose master changed (a failover promoted a replica that may lack lock keys),
//! restarted, or was flushed must not take part in acquisitions until every lock it may
//! have lost has expired, like a single node. redis-rs's cluster connection follows such
//! changes by itself (it refreshes its slot map after a `MOVED` and reconnects in the
//! background), so the crate cannot wait to be told: every acquisition on a cluster node
//! carries two more commands, `CLIENT INFO` (the server's address of the connection it
//! went out on, and that connection's id) and `LASTSAVE` (which a restart moves).
//! Together they say where the command ran: on a master the last check judged, over the
//! connection it checked ([`Landed`], [`ShardMap::trusts`]); a resharding's `ASK` to the
//! importing master lands on a judged master too. Anything else (a new master, a new
//! connection, a restart) makes the node check its shards again before the answer counts
//! ([`Node::check_shards`]): `CLUSTER NODES` for the masters, then on each master `INFO`
//! and its ledger (in the master's lowest slot), judged by the same judge as a single
//! node (see `loss`). A shard that may have lost keys quarantines the whole node. The
//! background check runs the same check every `check_interval`.
//!
//! Masters are reached by the address redis-rs keys them by: the IP, or with
//! `cluster-preferred-endpoint-type hostname` the announced hostname.
//!
//! ```no_run
//! # #[cfg(feature = "cluster")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::{NodeConfig, Redlock};
//!
//! let redlock = Redlock::builder([NodeConfig::cluster(["redis://10.0.0.1:6379"])]).build()?;
//! let lock = redlock.lock("job:1").await?; // runs on the shard of job:1, checked
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use futures_util::future::join_all;
use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::judging::{LedgerRead, Settled, settle};
use super::loss::{LedgerKeys, Role, ServerInfo};
use super::{Node, NodeState};
use crate::error::NodeError;

/// A Redis Cluster node's client and what it knows of the shards.
pub(crate) struct ClusterNode {
    pub(crate) client: redis::cluster::ClusterClient,
    shards: Mutex<ShardMap>,
    /// Held while the shards are checked: one check at a time.
    checking: tokio::sync::Mutex<()>,
    /// How many checks completed: a caller that waited for another's check uses it.
    checks: AtomicU64,
}

impl ClusterNode {
    pub(crate) fn new(client: redis::cluster::ClusterClient) -> Self {
        Self {
            client,
            shards: Mutex::new(ShardMap::default()),
            checking: tokio::sync::Mutex::new(()),
            checks: AtomicU64::new(0),
        }
    }

    pub(super) fn shards(&self) -> std::sync::MutexGuard<'_, ShardMap> {
        self.shards.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where an acquisition's commands ran, from the two commands it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Landed {
    /// The server's address of the connection (`laddr` of `CLIENT INFO`).
    pub(crate) server: String,
    pub(crate) token: Token,
}

/// What changes when the connection to a master is made again or its server restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    /// The connection's id on the server (`CLIENT INFO`'s `id`).
    pub(crate) client_id: u64,
    /// `LASTSAVE`: the server's start, or its last save.
    pub(crate) lastsave: i64,
}

/// How many commands an acquisition on a cluster node carries after its own
/// ([`add_probe`]).
const PROBE: usize = 2;

/// Appends the commands that say where a pipeline ran: `CLIENT INFO` and `LASTSAVE`.
/// redis-rs routes both with the pipeline's keyed commands (neither has a key).
fn add_probe(pipe: &mut redis::Pipeline) {
    pipe.cmd("CLIENT").arg("INFO").cmd("LASTSAVE");
}

impl Landed {
    /// Reads the replies to [`PROBE`]: `CLIENT INFO` and `LASTSAVE`.
    pub(crate) fn parse(client_info: &Value, lastsave: &Value) -> Option<Self> {
        let info = match client_info {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?,
            Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => s.as_str(),
            _ => return None,
        };
        let field = |name: &str| {
            info.split_ascii_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        };
        let Value::Int(lastsave) = lastsave else {
            return None;
        };
        Some(Self {
            server: field("laddr")?.to_owned(),
            token: Token {
                client_id: field("id")?.parse().ok()?,
                lastsave: *lastsave,
            },
        })
    }
}

/// A master as `CLUSTER NODES` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Master {
    pub(crate) id: String,
    pub(crate) host: String,
    /// The hostname it announces (`cluster-announce-hostname`), if any.
    pub(crate) hostname: Option<String>,
    pub(crate) port: u16,
    /// Its slot ranges, inclusive.
    pub(crate) slots: Vec<(u16, u16)>,
}

impl Master {
    /// The addresses redis-rs may key the master's connection by: its IP, then its
    /// hostname (with `cluster-preferred-endpoint-type hostname`).
    /// How to reach it: by its lowest slot first (through redis-rs's slot map, so over the
    /// very connection a keyed command for its slots takes, whose landing the check then
    /// vouches for), then by each of its addresses.
    fn routes(&self) -> impl Iterator<Item = SingleNodeRoutingInfo> + '_ {
        let by_slot =
            SingleNodeRoutingInfo::SpecificNode(Route::new(self.ledger_slot(), SlotAddr::Master));
        std::iter::once(by_slot).chain(std::iter::once(&self.host).chain(&self.hostname).map(
            |host| SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: self.port,
            },
        ))
    }

    /// The slot its ledger is in: its lowest.
    fn ledger_slot(&self) -> u16 {
        self.slots.iter().map(|r| r.0).min().unwrap_or(0)
    }
}

/// The masters that serve slots, from `CLUSTER NODES` (failed ones left out).
pub(crate) fn masters(nodes: &str) -> Vec<Master> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut words = line.split_ascii_whitespace();
            let id = words.next()?;
            let addr = words.next()?;
            let flags = words.next()?;
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
                return None;
            }
            // `ip:port@cport[,hostname]`
            let (addr, hostname) = match addr.split_once(',') {
                Some((addr, name)) => (addr, (!name.is_empty()).then(|| name.to_owned())),
                None => (addr, None),
            };
            let (host, port) = addr.split('@').next()?.rsplit_once(':')?;
            let slots: Vec<(u16, u16)> = words
                .skip(5)
                .filter(|w| !w.starts_with('['))
                .filter_map(|range| match range.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => range.parse().ok().map(|s| (s, s)),
                })
                .collect();
            let port = port.parse().ok()?;
            (!slots.is_empty() && !host.is_empty()).then(|| Master {
                id: id.to_owned(),
                host: host.to_owned(),
                hostname,
                port,
                slots,
            })
        })
        .collect()
}

/// A master the last check judged: how it was reached, and its version.
#[derive(Debug, Clone)]
struct Judged {
    server: String,
    token: Token,
    version: String,
    /// The route that reached it, and where its ledger is (for the horizon's raise).
    ledger: Option<(SingleNodeRoutingInfo, LedgerKeys)>,
}

/// What the last check found: the masters by node id.
#[derive(Debug, Default)]
pub(crate) struct ShardMap {
    /// Every master ever judged, by node id (kept when it leaves: a failover's old master
    /// may come back).
    masters: HashMap<String, Judged>,
}

impl ShardMap {
    /// Whether an acquisition that ran as `landed` says counts: it ran on a master the
    /// last check judged, over the connection checked then, and the server did not
    /// restart since. (A name in a slot being resharded may run on the importing master,
    /// by `ASK`: judged as well.)
    pub(crate) fn trusts(&self, landed: &Landed) -> bool {
        self.masters
            .values()
            .any(|m| m.server == landed.server && m.token == landed.token)
    }

    /// Records a check's masters that answered.
    fn record(&mut self, judged: Vec<(String, Judged)>) {
        self.masters.extend(judged);
    }

    /// Where the masters of the last check keep their ledgers.
    fn ledgers(&self) -> Vec<(SingleNodeRoutingInfo, LedgerKeys)> {
        self.masters
            .values()
            .filter_map(|m| m.ledger.clone())
            .collect()
    }

    /// The oldest version of a master judged, if any.
    fn oldest_version(&self) -> Option<&str> {
        self.masters
            .values()
            .map(|m| m.version.as_str())
            .filter(|v| !v.is_empty())
            .min_by(|a, b| version_key(a).cmp(&version_key(b)))
    }
}

/// Whether `replies`, sent by `route`, came from master `m`: the `CLUSTER MYID` reply at
/// `at` names it. A server that refuses `CLUSTER MYID` (an ACL without `+cluster|myid`)
/// is taken at its address, never by a slot (a slot map may be behind).
fn reached(replies: &[Value], at: usize, m: &Master, route: &SingleNodeRoutingInfo) -> bool {
    match replies.get(at) {
        Some(Value::ServerError(_)) | None => {
            matches!(route, SingleNodeRoutingInfo::ByAddress { .. })
        }
        Some(v) => redis::from_redis_value_ref::<String>(v).is_ok_and(|id| id == m.id),
    }
}

/// A version's numbers, for ordering (`7.0.15` -> `[7, 0, 15]`).
fn version_key(version: &str) -> Vec<u64> {
    version.split('.').map(|n| n.parse().unwrap_or(0)).collect()
}

/// What one master said of itself in a check.
struct Seen {
    info: ServerInfo,
    landed: Landed,
    /// The route that reached it.
    route: SingleNodeRoutingInfo,
    /// Its ledger's read, with the restart quarantine on.
    read: Option<Result<LedgerRead, NodeError>>,
    /// When its reply arrived.
    received: Instant,
    /// Its clock as of the client's base (see `node::clocks::NodeClocks`), if `INFO server`
    /// told.
    clock: Option<u64>,
}

/// The error of an acquisition whose probe (`CLIENT INFO`, `LASTSAVE`) the server
/// refused with `refused`; `version`, the oldest version of the shards judged.
fn probe_refused(refused: &redis::RedisError, version: Option<&str>) -> NodeError {
    let text = refused.to_string();
    let unknown = text.to_ascii_lowercase().contains("unknown subcommand");
    let message = if unknown {
        format!(
            "the restart quarantine checks where a cluster node's commands run with CLIENT \
             INFO, which needs Redis 6.2 or later (the shards run {}): upgrade them, or turn \
             restart_quarantine off ({text})",
            version.unwrap_or("an older version")
        )
    } else {
        format!(
            "the restart quarantine checks where a cluster node's commands run with CLIENT \
             INFO and LASTSAVE, which the server refused: grant the user +client|info \
             +lastsave, or turn restart_quarantine off ({text})"
        )
    };
    NodeError::Redis(message.into())
}

impl Node {
    /// The node's cluster, if it is one.
    pub(super) fn cluster(&self) -> Option<&ClusterNode> {
        match &self.connector {
            super::Connector::Cluster(cluster) => Some(cluster),
            _ => None,
        }
    }

    /// Runs an acquisition's `call` on `cluster`'s connection `conn`, with the commands
    /// that say where it ran ([`PROBE`]); a landing the last check does not vouch for
    /// makes the node check its shards first. A shard that may have lost keys fails the
    /// call (the node is quarantined); the command's own answer otherwise.
    pub(super) async fn acquire_on_cluster(
        &self,
        cluster: &ClusterNode,
        call: &crate::scripts::Call,
        conn: &mut ClusterConnection,
    ) -> redis::RedisResult<Result<Value, NodeError>> {
        let (mut pipe, then) = call.for_cluster();
        add_probe(&mut pipe);
        let mut replies: Vec<Value> = pipe.query_async(conn).await?;
        let probe = replies.split_off(replies.len().saturating_sub(PROBE));
        if let Some(refused) = probe.iter().find_map(|v| v.clone().extract_error().err()) {
            let version = cluster.shards().oldest_version().map(str::to_owned);
            return Ok(Err(probe_refused(&refused, version.as_deref())));
        }
        let landed = match probe.as_slice() {
            [info, lastsave] => Landed::parse(info, lastsave),
            _ => None,
        };
        if let Some(refusal) = self.landed_well(cluster, conn, landed.as_ref()).await {
            return Ok(Err(refusal));
        }
        let then = match then {
            Some(then) => Some(then.query_async::<Value>(conn).await?),
            None => None,
        };
        let first = call.first_of(replies, then);
        Ok(call.finish(first, conn).await.map_err(NodeError::from))
    }

    /// `None` if an acquisition that ran as `landed` counts, checking the shards first if
    /// the last check does not vouch for it; otherwise why not.
    async fn landed_well(
        &self,
        cluster: &ClusterNode,
        conn: &mut ClusterConnection,
        landed: Option<&Landed>,
    ) -> Option<NodeError> {
        let trusted = || landed.is_some_and(|landed| cluster.shards().trusts(landed));
        if !trusted() {
            self.check_shards(cluster, conn).await;
        }
        if let Some((remaining, reason)) = self.quarantined_for() {
            return Some(NodeError::Quarantined { remaining, reason });
        }
        (!trusted()).then(|| {
            NodeError::Redis(
                "the cluster shard that took the name is not one this client could check \
                 (a failover or a reconnect under way?): the answer does not count"
                    .into(),
            )
        })
    }

    /// Raises every judged shard's horizon to `ttl_ms`: all must take it.
    pub(super) async fn announce_on_cluster(
        &self,
        cluster: &ClusterNode,
        conn: &mut ClusterConnection,
        ttl_ms: u64,
    ) -> Result<(), NodeError> {
        let ledgers = cluster.shards().ledgers();
        if ledgers.is_empty() {
            return Err(NodeError::Redis(
                "no shard of the cluster was checked yet: the horizon has nowhere to go".into(),
            ));
        }
        for (route, keys) in ledgers {
            let reply = conn
                .route_command(keys.raise(ttl_ms), RoutingInfo::SingleNode(route))
                .await?;
            let ms = super::loss::ledger::horizon_value(&reply).map_err(|e| {
                NodeError::Redis(format!("the horizon's raise on a shard: {e}").into())
            })?;
            self.settings
                .horizon
                .heard(self.index, ms, crate::clock::now());
        }
        Ok(())
    }

    /// Checks the cluster's shards (once at a time; a caller that waited for another's
    /// check uses it): every master `CLUSTER NODES` lists, judged by its ledger and what
    /// it says of itself. A master that may have lost keys quarantines the node.
    pub(crate) async fn check_shards(&self, cluster: &ClusterNode, conn: &mut ClusterConnection) {
        let before = cluster.checks.load(Ordering::Acquire);
        let _one = cluster.checking.lock().await;
        if cluster.checks.load(Ordering::Acquire) != before {
            return;
        }
        let nodes = conn
            .route_command(
                redis::cmd("CLUSTER").arg("NODES").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .and_then(|v| Ok(redis::from_redis_value::<String>(v)?));
        let masters = match nodes {
            Ok(nodes) => masters(&nodes),
            Err(e) => {
                tracing::warn!(node = %self.label, error = %e, "redlock cluster node: CLUSTER NODES failed; its shards stay unchecked");
                return;
            }
        };
        let seen = join_all(masters.iter().map(|m| self.see(conn.clone(), m))).await;
        // The cluster node's clock: its slowest shard's (a lower cap is the safe side).
        if let Some(clock) = seen.iter().flatten().filter_map(|s| s.clock).min() {
            self.settings.clocks.set(self.index, clock);
        }
        let judged = join_all(
            masters
                .iter()
                .zip(seen)
                .filter_map(|(m, seen)| Some((m, seen?)))
                .map(|(m, seen)| self.judge_shard(conn.clone(), m, seen)),
        )
        .await;
        let mut judged_masters = Vec::new();
        {
            let mut st = self.state();
            for (id, judged, settled) in judged {
                if let Some(settled) = settled {
                    self.keep_shard(&mut st, &id, &settled);
                }
                if st.version.is_none() && !judged.version.is_empty() {
                    st.version = Some(judged.version.clone());
                }
                judged_masters.push((id, judged));
            }
        }
        cluster.shards().record(judged_masters);
        cluster.checks.fetch_add(1, Ordering::Release);
    }

    /// Keeps a shard's judged ledger (the state locked by the caller).
    fn keep_shard(&self, st: &mut NodeState, id: &str, settled: &Settled) {
        let loss = st.shard_losses.entry(id.to_owned()).or_default();
        self.keep_judged(loss, settled);
    }

    /// Judges master `m` from what it said (`seen`), swapping its ledger over `conn`:
    /// its node id, how it was reached, and the judged ledger (`None` with the restart
    /// quarantine off, or when its ledger could not be judged this time).
    async fn judge_shard(
        &self,
        conn: ClusterConnection,
        m: &Master,
        seen: Seen,
    ) -> (String, Judged, Option<Settled>) {
        let Seen {
            info,
            landed,
            route,
            read,
            received,
            clock: _,
        } = seen;
        let keys = LedgerKeys::in_slot(&self.settings.key_prefix, m.ledger_slot());
        let judged = Judged {
            server: landed.server,
            token: landed.token,
            version: info.version.clone(),
            ledger: Some((route.clone(), keys.clone())),
        };
        let settled = match read {
            Some(Ok(read)) => {
                let send = move |cmd: redis::Cmd| {
                    let mut conn = conn.clone();
                    let route = RoutingInfo::SingleNode(route.clone());
                    async move { conn.route_command(cmd, route).await }
                };
                let length = self.settings.horizon.length();
                match settle(&keys, (&info, None), read, (received, length), send).await {
                    Ok(settled) => Some(settled),
                    Err(e) => {
                        tracing::warn!(node = %self.label, shard = %judged.server, error = %e, "redlock cluster shard's ledger could not be judged");
                        None
                    }
                }
            }
            Some(Err(e)) => {
                tracing::debug!(node = %self.label, shard = %judged.server, error = %e, "redlock cluster shard's ledger not read (its slot moving?)");
                None
            }
            None => None,
        };
        (m.id.clone(), judged, settled)
    }

    /// The request of [`see`](Self::see) for master `m`, and how many replies it has:
    /// `INFO`, the probe's commands, `CLUSTER MYID`, and with the restart quarantine the
    /// ledger's read in `m`'s ledger slot.
    fn see_pipe(&self, m: &Master) -> (redis::Pipeline, usize) {
        let mut pipe = redis::pipe();
        pipe.cmd("INFO")
            .arg("server")
            .cmd("INFO")
            .arg("replication");
        add_probe(&mut pipe);
        pipe.cmd("CLUSTER").arg("MYID");
        let judging = self.settings.quarantine;
        if judging {
            let keys = LedgerKeys::in_slot(&self.settings.key_prefix, m.ledger_slot());
            keys.read_into(&mut pipe, self.settings.horizon.own_ms());
        }
        (pipe, 2 + PROBE + 1 + if judging { 2 } else { 0 })
    }

    /// `m`'s replies to its check's pipeline, by the first of its routes that reaches it,
    /// and that route; `None` if none did.
    async fn ask(
        &self,
        conn: &mut ClusterConnection,
        m: &Master,
    ) -> Option<(Vec<Value>, SingleNodeRoutingInfo)> {
        let (pipe, count) = self.see_pipe(m);
        for route in m.routes() {
            match conn
                .route_pipeline(pipe.clone(), 0, count, route.clone())
                .await
            {
                Ok(replies) if reached(&replies, 2 + PROBE, m, &route) => {
                    return Some((replies, route));
                }
                Ok(_) => {} // another master's answer, or unverified by slot
                Err(e) if e.kind() == redis::ErrorKind::ClusterConnectionNotFound => {}
                Err(e) => {
                    tracing::debug!(node = %self.label, shard = %m.host, error = %e, "redlock cluster shard did not answer its check");
                    return None;
                }
            }
        }
        None
    }

    /// What master `m` says of itself (`INFO`, the probe's commands, and with the restart
    /// quarantine its ledger), over the cluster connection, by the first of its
    /// [`routes`](Master::routes) that reaches it (`CLUSTER MYID` tells: a slot map behind
    /// a reshard reaches another master); `None` if it did not answer as a master.
    async fn see(&self, mut conn: ClusterConnection, m: &Master) -> Option<Seen> {
        let judging = self.settings.quarantine;
        let sent = crate::clock::now();
        let (replies, route) = self.ask(&mut conn, m).await?;
        let received = crate::clock::now();
        let clock_at = sent + received.saturating_duration_since(sent) / 2;
        let mut replies = replies.into_iter();
        let mut next = || replies.next().unwrap_or(Value::Nil);
        let (server, replication, client_info, lastsave) = (next(), next(), next(), next());
        let _id = next();
        let text = |v: &Value| redis::from_redis_value_ref::<String>(v).unwrap_or_default();
        let info = ServerInfo::parse([text(&server).as_str(), text(&replication).as_str()]);
        let landed = Landed::parse(&client_info, &lastsave)?;
        if info.role != Role::Master {
            return None;
        }
        let read = judging.then(|| {
            let as_result = |v: Value| v.extract_error();
            LedgerRead::parse(Some(as_result(next())), Some(as_result(next())))
        });
        let clock = info
            .time_us
            .map(|us| self.settings.clocks.estimate(us, clock_at));
        Some(Seen {
            info,
            landed,
            route,
            read,
            received,
            clock,
        })
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
