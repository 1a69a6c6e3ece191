//! A local Redis Cluster for the tests: 3 masters (no replicas) started with
//! `--cluster-enabled yes` and joined with `redis-cli --cluster create`.
#![allow(dead_code, unreachable_pub)]

use std::process::Command;
use std::time::{Duration, Instant};

use super::{RedisNode, query_port};

/// Three masters that share the 16,384 slots.
pub struct RedisCluster {
    pub masters: Vec<RedisNode>,
}

impl RedisCluster {
    /// Starts three masters and joins them; a join that does not complete in 30 s (a
    /// cluster bus that could not connect, under a loaded machine) is tried again with new
    /// nodes, three times at most.
    pub fn start() -> Self {
        for _ in 0..3 {
            if let Some(cluster) = Self::try_start() {
                return cluster;
            }
        }
        panic!("could not start a Redis Cluster in three tries");
    }

    fn try_start() -> Option<Self> {
        let masters: Vec<RedisNode> = (0..3)
            .map(|_| {
                RedisNode::start_with_args(
                    None,
                    vec![
                        "--cluster-enabled".into(),
                        "yes".into(),
                        // The cluster bus on a port found free, not the default port +
                        // 10000, which another process may hold.
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
                    ],
                )
            })
            .collect();
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
        let cluster = Self { masters };
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

    /// Whether `key` exists on master `i`.
    pub fn holds(&self, i: usize, key: &[u8]) -> bool {
        query_port::<bool>(self.masters[i].port(), redis::cmd("EXISTS").arg(key)).unwrap_or(false)
    }
}

/// Whether the `myself` line of `CLUSTER NODES` lists `slot`.
fn owns(nodes: &str, slot: i64) -> bool {
    let Some(line) = nodes.lines().find(|l| l.contains("myself")) else {
        return false;
    };
    line.split_whitespace().skip(8).any(|range| {
        let mut bounds = range.splitn(2, '-').filter_map(|b| b.parse::<i64>().ok());
        match (bounds.next(), bounds.next()) {
            (Some(a), Some(b)) => (a..=b).contains(&slot),
            (Some(a), None) => a == slot,
            _ => false,
        }
    })
}
