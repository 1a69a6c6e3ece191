//! A Redis Cluster node's shards under watch: which master serves each slot, who each is
//! (`run_id`, replication id), and the check that every acquisition landed on a master
//! this client judged, over the connection it judged.
//!
//! A shard whose master changed (a failover promoted a replica that may lack lock keys) or
//! restarted (without persistence it forgot them) must not take part in acquisitions
//! until every lock it may have lost has expired, like a restarted node. redis-rs's
//! cluster connection follows such changes by itself (it refreshes its slot map after a
//! `MOVED` and reconnects in the background), so the crate cannot wait to be told: every
//! acquisition on a cluster node carries two more commands, `CLIENT INFO` (the server's
//! address of the connection it went out on, and that connection's id) and `LASTSAVE`
//! (which a restart moves). Together with the key's slot they say where the command ran:
//! on the master the last check found for that slot, over the connection it checked
//! ([`Landed`], [`ShardMap::trusts`]). Anything else (another master, a new connection, a
//! restart) makes the node check its shards again before the answer counts
//! ([`Node::check_shards`]): `CLUSTER NODES` for the masters and their slots, then `INFO`
//! on each master, judged by the same rule as a single node (see `identity`). A master
//! that restarted or was promoted less than the longest TTL ago quarantines the whole
//! node.
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
use std::time::Duration;

use futures_util::future::join_all;
use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::Node;
use super::identity::{Identity, PromotionMarker, Role, ServerInfo, quarantine_for};
use crate::error::{NodeError, QuarantineReason};
use crate::name::slot::{SLOTS, slot};

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

    fn shards(&self) -> std::sync::MutexGuard<'_, ShardMap> {
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
    pub(crate) port: u16,
    /// Its slot ranges, inclusive.
    pub(crate) slots: Vec<(u16, u16)>,
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
                port,
                slots,
            })
        })
        .collect()
}

/// A master the last check judged: who it was, and the connection it was judged over.
#[derive(Debug, Clone)]
struct Judged {
    identity: Identity,
    server: String,
    token: Token,
}

/// What the last check found: the masters by node id, and which serves each slot.
#[derive(Debug, Default)]
pub(crate) struct ShardMap {
    /// Every master ever judged, by node id (kept when it leaves: should it come back,
    /// its identity tells whether it restarted).
    masters: HashMap<String, Judged>,
    /// For each slot, the node id of its master at the last check.
    owners: Vec<Option<std::sync::Arc<str>>>,
    /// Whether a check ever completed (the first one meets every master first).
    checked: bool,
}

impl ShardMap {
    /// Whether an acquisition of a key in `slot` that ran as `landed` says counts: it ran
    /// on the master the last check found for the slot, over the connection checked then,
    /// and the server did not restart since.
    pub(crate) fn trusts(&self, slot: u16, landed: &Landed) -> bool {
        let Some(Some(owner)) = self.owners.get(usize::from(slot)) else {
            return false;
        };
        self.masters
            .get(&**owner)
            .is_some_and(|m| m.server == landed.server && m.token == landed.token)
    }

    /// Records a check: `masters` as `CLUSTER NODES` listed them, and for those that
    /// answered, who they are and how they were reached.
    fn record(&mut self, masters: &[Master], judged: Vec<(String, Judged)>) {
        let mut owners = vec![None; SLOTS];
        for m in masters {
            let id: std::sync::Arc<str> = m.id.as_str().into();
            for &(a, b) in &m.slots {
                for s in a..=b.min(SLOTS as u16 - 1) {
                    owners[usize::from(s)] = Some(std::sync::Arc::clone(&id));
                }
            }
        }
        self.owners = owners;
        self.masters.extend(judged);
        self.checked = true;
    }
}

/// What one master said of itself in a check.
struct Seen {
    info: ServerInfo,
    landed: Landed,
    /// How long it has been a master at least (its promotion marker).
    master_for: Duration,
    /// Its clock as of the client's base (see `node::clocks::NodeClocks`), if `INFO server`
    /// told.
    clock: Option<u64>,
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
        let mut pipe = call.as_pipeline();
        add_probe(&mut pipe);
        let mut replies: Vec<Value> = pipe.query_async(conn).await?;
        let probe = replies.split_off(replies.len().saturating_sub(PROBE));
        if let Some(refused) = probe.iter().find_map(|v| v.clone().extract_error().err()) {
            return Ok(Err(NodeError::Redis(
                format!(
                    "the restart quarantine checks where a cluster node's commands run with \
                     CLIENT INFO and LASTSAVE, which the server refused: grant the user \
                     +client|info +lastsave, or turn restart_quarantine off ({refused})"
                )
                .into(),
            )));
        }
        let landed = match probe.as_slice() {
            [info, lastsave] => Landed::parse(info, lastsave),
            _ => None,
        };
        let slot = slot(call.key());
        if let Some(refusal) = self.landed_well(cluster, conn, slot, landed.as_ref()).await {
            return Ok(Err(refusal));
        }
        let first = call.first_of(replies);
        Ok(call.finish(first, conn).await.map_err(NodeError::from))
    }

    /// `None` if an acquisition in `slot` that ran as `landed` counts, checking the
    /// shards first if the last check does not vouch for it; otherwise why not.
    async fn landed_well(
        &self,
        cluster: &ClusterNode,
        conn: &mut ClusterConnection,
        slot: u16,
        landed: Option<&Landed>,
    ) -> Option<NodeError> {
        let trusted = || landed.is_some_and(|landed| cluster.shards().trusts(slot, landed));
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

    /// Checks the cluster's shards (once at a time; a caller that waited for another's
    /// check uses it): every master `CLUSTER NODES` lists, judged by what it says of
    /// itself. A master that may have lost keys quarantines the node.
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
        let max_ttl = self.max_ttl();
        let mut judged = Vec::new();
        {
            let map = cluster.shards();
            let mut st = self.state();
            for (m, seen) in masters.iter().zip(seen) {
                let Some(seen) = seen else { continue };
                let known = map.masters.get(&m.id).map(|j| &j.identity);
                let first = !map.checked;
                let verdict = quarantine_for(known, &seen.info, seen.master_for, max_ttl);
                if let Some((length, reason)) = verdict {
                    let reason = if first {
                        reason
                    } else {
                        QuarantineReason::ShardChanged
                    };
                    tracing::debug!(node = %self.label, shard = %seen.landed.server, "redlock cluster shard may have lost lock keys");
                    self.quarantine(&mut st, length, reason);
                }
                if let Some(identity) = seen.info.identity() {
                    let Landed { server, token } = seen.landed;
                    judged.push((
                        m.id.clone(),
                        Judged {
                            identity,
                            server,
                            token,
                        },
                    ));
                }
            }
        }
        cluster.shards().record(&masters, judged);
        cluster.checks.fetch_add(1, Ordering::Release);
    }

    /// What master `m` says of itself (`INFO`, the probe's commands, and for a promoted
    /// master its marker), over the cluster connection; `None` if it did not answer as a
    /// master.
    async fn see(&self, mut conn: ClusterConnection, m: &Master) -> Option<Seen> {
        let route = || SingleNodeRoutingInfo::ByAddress {
            host: m.host.clone(),
            port: m.port,
        };
        let mut pipe = redis::pipe();
        pipe.cmd("INFO")
            .arg("server")
            .cmd("INFO")
            .arg("replication");
        add_probe(&mut pipe);
        let sent = std::time::Instant::now();
        let replies = conn.route_pipeline(pipe, 0, 2 + PROBE, route()).await;
        let clock_at = sent + sent.elapsed() / 2;
        let replies = match replies {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(node = %self.label, shard = %m.host, error = %e, "redlock cluster shard did not answer its check");
                return None;
            }
        };
        let [server, replication, client_info, lastsave] = replies.as_slice() else {
            return None;
        };
        let text = |v: &Value| redis::from_redis_value_ref::<String>(v).unwrap_or_default();
        let info = ServerInfo::parse([text(server).as_str(), text(replication).as_str()]);
        let landed = Landed::parse(client_info, lastsave)?;
        if info.role != Role::Master {
            return None;
        }
        let master_for = if info.promoted {
            let first_slot = m.slots.first().map_or(0, |r| r.0);
            let marker =
                PromotionMarker::in_slot(&self.settings.key_prefix, &info.replid, first_slot);
            match conn.route_pipeline(marker.commands(), 0, 2, route()).await {
                Ok(replies) => PromotionMarker::master_for(&replies),
                Err(_) => Duration::ZERO,
            }
        } else {
            Duration::ZERO
        };
        let clock = info
            .time_us
            .map(|us| self.settings.clocks.estimate(us, clock_at));
        Some(Seen {
            info,
            landed,
            master_for,
            clock,
        })
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
