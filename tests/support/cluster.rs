//! A local Redis Cluster for the tests: 3 masters started with `--cluster-enabled yes`
//! and joined with `redis-cli --cluster create`, and replicas added on demand
//! (`redis-cli --cluster add-node --cluster-slave`).
#![allow(dead_code, unreachable_pub)]

use std::process::Command;
use std::time::{Duration, Instant};

use super::{RedisNode, query_port, wait_blocking};

/// Three masters that share the 16,384 slots, and the replicas added to them.
pub struct RedisCluster {
    pub masters: Vec<RedisNode>,
    pub replicas: Vec<RedisNode>,
}

/// A `redis-server` in cluster mode on a free port, with `extra` arguments.
fn cluster_node(extra: &[&str]) -> RedisNode {
    let mut args: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
    args.extend([
        "--cluster-enabled".into(),
        "yes".into(),
        // The cluster bus on a port found free, not the default port + 10000, which
        // another process may hold.
        "--cluster-port".into(),
        "{port}".into(),
        "--cluster-config-file".into(),
        std::env::temp_dir()
            .join(format!(
                "redlock-cluster-{}-{{port}}.conf",
                std::process::id()
            ))
            .to_string_lossy()
            .into_owned(),
        "--cluster-node-timeout".into(),
        "1000".into(),
        "--cluster-require-full-coverage".into(),
        "no".into(),
    ]);
    RedisNode::start_with_args(None, args)
}

impl RedisCluster {
    /// Starts three masters and joins them; a join that does not complete in 30 s (a
    /// cluster bus that could not connect, under a loaded machine) is tried again with new
    /// nodes, three times at most.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start) with more `redis-server` arguments for every master.
    pub fn start_with(extra: &[&str]) -> Self {
        for _ in 0..3 {
            if let Some(cluster) = Self::try_start(extra) {
                return cluster;
            }
        }
        panic!("could not start a Redis Cluster in three tries");
    }

    fn try_start(extra: &[&str]) -> Option<Self> {
        let masters: Vec<RedisNode> = (0..3).map(|_| cluster_node(extra)).collect();
        let addrs: Vec<String> = masters.iter().map(RedisNode::addr).collect();
        // `redis-cli --cluster create` waits for the join without a limit of its own.
        let out = Command::new("timeout")
            .arg("30")
            .arg("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli (Debian's redis-tools, installed with redis-server)");
        if !out.status.success() {
            eprintln!(
                "redis-cli --cluster create failed, trying again: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            return None;
        }
        let cluster = Self {
            masters,
            replicas: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster.masters.iter().all(|m| {
            query_port::<String>(m.port(), redis::cmd("CLUSTER").arg("INFO"))
                .is_some_and(|i| i.contains("cluster_state:ok"))
        }) {
            if Instant::now() >= deadline {
                eprintln!("the cluster did not become ok, trying again");
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(cluster)
    }

    /// Seed URLs for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.masters.iter().map(RedisNode::url).collect()
    }

    /// The index of the master that owns `key`'s slot.
    pub fn owner(&self, key: &[u8]) -> usize {
        let slot: i64 = query_port(
            self.masters[0].port(),
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
        )
        .expect("CLUSTER KEYSLOT");
        self.masters
            .iter()
            .position(|m| {
                query_port::<String>(m.port(), redis::cmd("CLUSTER").arg("NODES"))
                    .is_some_and(|nodes| owns(&nodes, slot))
            })
            .expect("a master owns the slot")
    }

    /// Gives every master the ledger a client would have made long ago, in its lowest
    /// slot, where the crate looks for it (see [`super::age_ledger`]).
    pub fn age_ledgers(&self) {
        for m in &self.masters {
            let nodes: String =
                query_port(m.port(), redis::cmd("CLUSTER").arg("NODES")).expect("CLUSTER NODES");
            let lowest = nodes
                .lines()
                .find(|l| l.contains("myself"))
                .into_iter()
                .flat_map(|l| l.split_ascii_whitespace().skip(8))
                .filter(|w| !w.starts_with('['))
                .filter_map(|w| w.split('-').next()?.parse::<u16>().ok())
                .min()
                .expect("a master with slots");
            let key = ledger_key(lowest);
            assert!(
                super::age_ledger_at(m.port(), &key).is_some(),
                "the ledger on {}",
                m.port()
            );
        }
    }

    /// The node id of master `i`.
    pub fn node_id(&self, i: usize) -> String {
        query_port::<String>(self.masters[i].port(), redis::cmd("CLUSTER").arg("MYID"))
            .expect("CLUSTER MYID")
    }

    /// Adds a replica of master `i` and waits until it is in sync (its replication link up,
    /// so it keeps a replication backlog, as a replica in service does): its index in
    /// `replicas`.
    pub fn add_replica(&mut self, i: usize) -> usize {
        let replica = cluster_node(&[]);
        let out = Command::new("timeout")
            .arg("30")
            .arg("redis-cli")
            .arg("--cluster")
            .arg("add-node")
            .arg(replica.addr())
            .arg(self.masters[i].addr())
            .arg("--cluster-slave")
            .arg("--cluster-master-id")
            .arg(self.node_id(i))
            .output()
            .expect("run redis-cli");
        assert!(
            out.status.success(),
            "redis-cli --cluster add-node failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let port = replica.port();
        wait_blocking("the replica in sync", Duration::from_secs(30), || {
            query_port::<String>(port, redis::cmd("INFO").arg("replication")).is_some_and(|i| {
                i.contains("master_link_status:up") && i.contains("repl_backlog_active:1")
            })
        });
        self.replicas.push(replica);
        self.replicas.len() - 1
    }

    /// Cuts replica `r` off its master, as a lagging replica is: it stops taking the
    /// master's writes (its replication user is made one the master does not know, and
    /// its link dropped) while both keep running.
    pub fn cut_replica(&self, r: usize) {
        let port = self.replicas[r].port();
        for (name, value) in [("masteruser", "nobody"), ("masterauth", "nothing")] {
            let done: Option<String> =
                query_port(port, redis::cmd("CONFIG").arg("SET").arg(name).arg(value));
            assert_eq!(done.as_deref(), Some("OK"), "CONFIG SET {name}");
        }
        let _: Option<i64> = query_port(
            port,
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("master"),
        );
        wait_blocking("the replica cut off", Duration::from_secs(10), || {
            query_port::<String>(port, redis::cmd("INFO").arg("replication"))
                .is_some_and(|i| i.contains("master_link_status:down"))
        });
    }

    /// Makes replica `r` take over its master's slots without its master's consent
    /// (`CLUSTER FAILOVER FORCE`), as after a master failure; returns at once.
    pub fn start_failover(&self, r: usize) {
        let done: Option<String> = query_port(
            self.replicas[r].port(),
            redis::cmd("CLUSTER").arg("FAILOVER").arg("FORCE"),
        );
        assert_eq!(done.as_deref(), Some("OK"), "CLUSTER FAILOVER FORCE");
    }

    /// Waits until replica `r` is a master that owns `key`'s slot, by every master's view.
    /// A manual failover whose election failed is not tried again by the server (on a
    /// loaded machine the votes can come too late): one still a replica after
    /// [`FAILOVER_RETRY`] is asked again.
    pub fn wait_promoted(&self, r: usize, key: &[u8]) {
        let replica = self.replicas[r].port();
        let slot: i64 = query_port(replica, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .expect("CLUSTER KEYSLOT");
        let mut asked = Instant::now();
        wait_blocking("the failover", Duration::from_secs(60), || {
            let mine = query_port::<String>(replica, redis::cmd("CLUSTER").arg("NODES"));
            if asked.elapsed() >= FAILOVER_RETRY && mine.as_deref().is_some_and(still_replica) {
                let _: Option<String> =
                    query_port(replica, redis::cmd("CLUSTER").arg("FAILOVER").arg("FORCE"));
                asked = Instant::now();
            }
            mine.is_some_and(|nodes| owns(&nodes, slot))
                && self.masters.iter().filter(|m| m.is_running()).all(|m| {
                    query_port::<String>(m.port(), redis::cmd("CLUSTER").arg("NODES"))
                        .is_some_and(|nodes| owner_port(&nodes, slot) == Some(replica))
                })
        });
    }

    /// Whether `key` exists on master `i`.
    pub fn holds(&self, i: usize, key: &[u8]) -> bool {
        query_port::<bool>(self.masters[i].port(), redis::cmd("EXISTS").arg(key)).unwrap_or(false)
    }
}

/// How long a manual failover may take before [`RedisCluster::wait_promoted`] asks again.
const FAILOVER_RETRY: Duration = Duration::from_secs(10);

/// Whether the `myself` line of `CLUSTER NODES` says a replica.
fn still_replica(nodes: &str) -> bool {
    nodes
        .lines()
        .find(|l| l.contains("myself"))
        .is_some_and(|line| !line.contains("master"))
}

/// Whether the `myself` line of `CLUSTER NODES` lists `slot`.
fn owns(nodes: &str, slot: i64) -> bool {
    nodes
        .lines()
        .find(|l| l.contains("myself"))
        .is_some_and(|line| lists(line, slot))
}

/// The port of the node that `CLUSTER NODES` says owns `slot`.
fn owner_port(nodes: &str, slot: i64) -> Option<u16> {
    let line = nodes.lines().find(|line| lists(line, slot))?;
    let addr = line.split_whitespace().nth(1)?;
    addr.split('@').next()?.rsplit_once(':')?.1.parse().ok()
}

/// Whether a line of `CLUSTER NODES` lists `slot` among its node's slots.
fn lists(line: &str, slot: i64) -> bool {
    line.split_whitespace().skip(8).any(|range| {
        let mut bounds = range.splitn(2, '-').filter_map(|b| b.parse::<i64>().ok());
        match (bounds.next(), bounds.next()) {
            (Some(a), Some(b)) => (a..=b).contains(&slot),
            (Some(a), None) => a == slot,
            _ => false,
        }
    })
}

/// The key of the ledger of a shard whose lowest slot is `slot`: `redlock:#ledger{tag}`,
/// with the crate's tag for the slot (read off the fencing counters' key of a name in it).
fn ledger_key(slot: u16) -> Vec<u8> {
    let name = (0u32..)
        .map(|n| format!("n{n}"))
        .find(|name| crc16(name.as_bytes()) % 16384 == slot)
        .expect("a name in every slot");
    let (counters, _) = tower_redlock::fencing::counter_of(b"redlock:", name.as_bytes(), true)
        .expect("a valid name");
    let tag = counters
        .iter()
        .position(|&b| b == b'{')
        .map(|at| counters[at..].to_vec())
        .expect("a tagged key");
    [&b"redlock:#ledger"[..], &tag].concat()
}

/// Redis Cluster's CRC16 (XMODEM) of a key without a hash tag.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |mut crc, &b| {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
        crc
    })
}
