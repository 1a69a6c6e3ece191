//! Sentinel-managed nodes for the tests: per node one master, one replica and one
//! `redis-server --sentinel` watching them, all on free loopback ports.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{RedisNode, free_port, query_port, redis_server_binary, wait_blocking};

/// One `redis-server --sentinel` process on a free port, killed on drop.
pub struct Sentinel {
    pub port: u16,
    child: Option<Child>,
    conf: PathBuf,
}

impl Sentinel {
    /// A sentinel that monitors the master on `master_port` as `name` (quorum 1: it
    /// decides a failover alone).
    pub fn monitoring(name: &str, master_port: u16) -> Self {
        let port = free_port();
        let conf = std::env::temp_dir().join(format!(
            "redlock-sentinel-{}-{port}.conf",
            std::process::id()
        ));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 5000\n"
            ),
        )
        .expect("write the sentinel config");
        let child = Command::new(redis_server_binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let sentinel = Self {
            port,
            child: Some(child),
            conf,
        };
        wait_blocking("the sentinel to answer", Duration::from_secs(10), || {
            sentinel.names(name).is_some()
        });
        sentinel
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port of the master it names as `name`, if any.
    pub fn names(&self, name: &str) -> Option<u16> {
        let addr: Option<(String, u16)> = query_port(
            self.port,
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(name),
        )?;
        addr.map(|(_, port)| port)
    }

    /// Makes it monitor the master on `master_port` as `name` from now on (as after a
    /// failover it took part in).
    pub fn remonitor(&self, name: &str, master_port: u16) {
        let _: Option<String> =
            query_port(self.port, redis::cmd("SENTINEL").arg("REMOVE").arg(name));
        let done: Option<String> = query_port(
            self.port,
            redis::cmd("SENTINEL")
                .arg("MONITOR")
                .arg(name)
                .arg("127.0.0.1")
                .arg(master_port)
                .arg(1),
        );
        assert_eq!(done.as_deref(), Some("OK"), "SENTINEL MONITOR");
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.conf);
    }
}

/// One master, its replica, and a sentinel that monitors them as `name`.
pub struct SentinelNode {
    pub name: String,
    pub master: RedisNode,
    pub replica: RedisNode,
    sentinel: Sentinel,
    sentinel_port: u16,
}

impl SentinelNode {
    pub fn start(name: &str) -> Self {
        let master = RedisNode::start();
        let replica = RedisNode::start_replica_of(master.port());
        let sentinel = Sentinel::monitoring(name, master.port());
        let node = Self {
            name: name.to_owned(),
            master,
            replica,
            sentinel_port: sentinel.port,
            sentinel,
        };
        wait_blocking(
            "the sentinel to know the replica",
            Duration::from_secs(30),
            || node.replicas() >= 1,
        );
        node
    }

    /// The sentinel's URL.
    pub fn sentinel_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.sentinel_port)
    }

    /// The port of the master, as the sentinel says.
    pub fn master_port(&self) -> Option<u16> {
        let addr: Option<(String, u16)> = query_port(
            self.sentinel_port,
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.name),
        )?;
        addr.map(|(_, port)| port)
    }

    /// How many replicas the sentinel knows.
    fn replicas(&self) -> usize {
        query_port::<Vec<redis::Value>>(
            self.sentinel_port,
            redis::cmd("SENTINEL").arg("replicas").arg(&self.name),
        )
        .map_or(0, |r| r.len())
    }

    /// Forces a failover and waits until the sentinel names the former replica as master.
    pub fn failover(&self) {
        let before = self.start_failover();
        self.wait_failover(before);
    }

    /// Forces a failover (`SENTINEL FAILOVER`) without waiting for it: the port of the
    /// master before it, for [`wait_failover`](Self::wait_failover).
    /// A sentinel that has just found its replica refuses a failover (`NOGOODSLAVE`) until
    /// it has heard from the replica: asked again until it starts one.
    pub fn start_failover(&self) -> Option<u16> {
        let before = self.master_port();
        wait_blocking(
            "SENTINEL FAILOVER to start",
            Duration::from_secs(30),
            || {
                let started: Option<String> = query_port(
                    self.sentinel_port,
                    redis::cmd("SENTINEL").arg("failover").arg(&self.name),
                );
                started.as_deref() == Some("OK")
            },
        );
        before
    }

    /// Waits until the sentinel names another master than the one on port `before`.
    pub fn wait_failover(&self, before: Option<u16>) {
        wait_blocking("the failover", Duration::from_secs(30), || {
            let now = self.master_port();
            now.is_some() && now != before
        });
    }

    /// Makes the replica lack `key`, as a replica does that the write had not reached when
    /// its master failed (replication is asynchronous): deletes it there, behind the
    /// master's back, and checks that the master still has it.
    pub fn lose_on_replica(&self, key: &[u8]) {
        let replica = self.replica.port();
        let set = |value: &str| {
            let done: Option<String> = query_port(
                replica,
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("replica-read-only")
                    .arg(value),
            );
            assert_eq!(done.as_deref(), Some("OK"), "CONFIG SET replica-read-only");
        };
        wait_blocking(
            "the replica to have the key",
            Duration::from_secs(10),
            || query_port::<bool>(replica, redis::cmd("EXISTS").arg(key)) == Some(true),
        );
        set("no");
        let deleted: Option<i64> = query_port(replica, redis::cmd("DEL").arg(key));
        set("yes");
        assert_eq!(deleted, Some(1), "DEL on the replica");
        assert_eq!(
            query_port::<bool>(self.master.port(), redis::cmd("EXISTS").arg(key)),
            Some(true),
            "the master keeps the key"
        );
    }

    /// Gives the master the ledger a client would have made long ago (see
    /// [`super::age_ledger`]); its replica has it too.
    pub fn age_ledgers(&self) {
        self.master.age_ledger();
    }
}
