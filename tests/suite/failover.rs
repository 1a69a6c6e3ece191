//! Failovers that promote a replica which lacks a lock key (replication is asynchronous):
//! whenever a client started (before, during or after the failover), none gets the name
//! while the first holder's lock can still be valid. Real `redis-server --sentinel`
//! processes and real replicas; the harness takes the server binary from `REDIS_SERVER`,
//! so `scripts/test` runs this file on Redis and on Valkey.

use crate::support;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use support::sentinel::SentinelNode;
use support::{Cluster, RedisNode, wait_for};
use tower_redlock::{
    Lock, LockError, NodeConfig, NodeError, NodeStatus, QuarantineReason, Redlock,
};

const TTL: Duration = Duration::from_secs(8);

/// A client as users build one: the restart quarantine on.
fn client(nodes: Vec<NodeConfig>) -> Redlock {
    Redlock::builder(nodes)
        .ttl(TTL)
        .node_timeout(Duration::from_millis(100))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(10))
        .build()
        .expect("build")
}

/// Tries to take `name` until `until` (the holder's validity): a grant before then is a
/// second holder, reported with who got it.
async fn second_holder(
    who: &'static str,
    client: Redlock,
    name: &str,
    until: Instant,
) -> Option<String> {
    match client.lock_until(name, TTL, until).await {
        Ok(_) if Instant::now() < until => Some(format!(
            "{who} got the lock with {:?} of the holder's validity left",
            until.saturating_duration_since(Instant::now())
        )),
        Ok(lock) => {
            let _ = client.unlock(&lock).await;
            None
        }
        Err(_) => None,
    }
}

/// While a failover runs: the client that was running, and one started now over `nodes`,
/// try to take `name` until `until` (see [`second_holder`]).
fn during_the_failover(
    running: &Redlock,
    nodes: Vec<NodeConfig>,
    name: &'static str,
    until: Instant,
) -> Vec<tokio::task::JoinHandle<Option<String>>> {
    vec![
        tokio::spawn(second_holder(
            "the running client",
            running.clone(),
            name,
            until,
        )),
        tokio::spawn(second_holder(
            "a client started during the failover",
            client(nodes),
            name,
            until,
        )),
    ]
}

/// The end of a failover scenario, once it is over: a client started after it sees node 0
/// (`what`) quarantined as promoted, and neither it nor the clients already trying
/// (`probes`) gets `name` before `until`, the holder's validity; then the name is free
/// again. The client started after the failover.
async fn after_the_failover(
    nodes: Vec<NodeConfig>,
    what: &str,
    probes: Vec<tokio::task::JoinHandle<Option<String>>>,
    name: &str,
    until: Instant,
) -> Redlock {
    let after = client(nodes);
    let status = after.health().await.nodes()[0].status().clone();
    // Another server process than the ledger names: `Promoted`, or `Restarted` for a
    // replica started less than the longest TTL ago (as the tests' replicas are).
    assert!(
        matches!(
            status,
            NodeStatus::Quarantined {
                reason: QuarantineReason::Promoted | QuarantineReason::Restarted,
                remaining
            } if remaining > TTL / 2
        ),
        "a client started after the failover sees {what} quarantined: {status:?}"
    );
    let started_after = "a client started after the failover";
    let mut overlaps = Vec::new();
    overlaps.extend(second_holder(started_after, after.clone(), name, until).await);
    for probe in probes {
        overlaps.extend(probe.await.expect("probe"));
    }
    assert!(overlaps.is_empty(), "second holders: {overlaps:?}");
    wait_for("the name free again", TTL * 3, || async {
        match after.try_lock(name).await {
            Ok(lock) => {
                let _ = after.unlock(&lock).await;
                true
            }
            Err(_) => false,
        }
    })
    .await;
    after
}

/// `holder` takes `name` on the first two of three nodes: the third holds a stranger's key
/// while it acquires.
async fn lock_on_first_two(holder: &Redlock, plain: &Cluster, name: &str) -> Lock {
    let key = format!("redlock:{{{name}}}");
    let mut third = plain.raw(1).await;
    let _: () = third.set(&key, "stranger").await.expect("SET");
    let lock = holder.try_lock(name).await.expect("the holder locks");
    let _: () = third.del(&key).await.expect("DEL");
    lock
}

/// Node 0 is Sentinel-managed (a master and a replica); nodes 1 and 2 are plain masters,
/// all older than the TTL. The holder takes the name on node 0 and node 1; the replica
/// lacks the key; Sentinel fails over to it. A client that was running, one started during
/// the failover and one started after it all try for the rest of the holder's validity:
/// the promoted replica and node 2 would make a quorum, so only the quarantine of the
/// promoted replica stands between them and a second holder. Afterwards the name is free
/// again and the node back in service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_to_a_replica_that_lacks_the_key_makes_no_second_holder() {
    let sentinel = SentinelNode::start("locks-f");
    let plain = Cluster::start(2);
    tokio::task::block_in_place(|| sentinel.age_ledgers());
    plain.age_ledgers();
    let nodes = || {
        let mut nodes = vec![NodeConfig::sentinel(
            [sentinel.sentinel_url()],
            sentinel.name.clone(),
        )];
        nodes.extend(plain.urls().into_iter().map(NodeConfig::from));
        nodes
    };
    let running = client(nodes());
    wait_for("every node usable", Duration::from_secs(10), || async {
        running.health().await.usable() == 3
    })
    .await;
    let holder = client(nodes());
    let name = "failover-victim";
    let lock = lock_on_first_two(&holder, &plain, name).await;
    let until = lock.valid_until();
    tokio::task::block_in_place(|| sentinel.lose_on_replica(lock.key()));

    let before = tokio::task::block_in_place(|| sentinel.start_failover());
    let probes = during_the_failover(&running, nodes(), name, until);
    tokio::task::block_in_place(|| sentinel.wait_failover(before));
    let after = after_the_failover(nodes(), "the promoted replica", probes, name, until).await;
    wait_for("the promoted replica up", TTL * 2, || async {
        after.health().await.nodes()[0].status() == &NodeStatus::Up
    })
    .await;
}

/// A node whose address reaches a replica is refused with `NotMaster`, never trusted;
/// once the replica is promoted (by hand here, as an operator or a script would), the next
/// connect judges it as a master promoted a moment ago, whatever its uptime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_refused_and_judged_again_once_promoted() {
    let master = RedisNode::start();
    let replica = RedisNode::start_replica_of(master.port());
    // A TTL long enough that a loaded machine's slow health reads still see most of it.
    let ttl = Duration::from_secs(10);
    let aged = Cluster {
        nodes: vec![master, replica],
    };
    aged.nodes[0].age_ledger();
    let redlock = Redlock::builder([aged.nodes[1].url()])
        .ttl(ttl)
        .node_timeout(Duration::from_millis(100))
        .build()
        .expect("build");
    let err = redlock.try_lock("replica").await.expect_err("a replica");
    let LockError::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err:?}");
    };
    assert!(
        matches!(&failures[0].error, NodeError::NotMaster { role } if role == "slave"),
        "{err}"
    );
    assert!(err.to_string().contains("not a master"), "{err}");
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut aged.raw(1).await)
        .await
        .expect("TIME");
    let promoted_at_ms = secs * 1_000 + micros / 1_000;
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut aged.raw(1).await)
        .await
        .expect("REPLICAOF NO ONE");
    wait_for(
        "the promoted replica quarantined",
        Duration::from_secs(10),
        || async {
            matches!(
                redlock.health().await.nodes()[0].status(),
                NodeStatus::Quarantined {
                    reason: QuarantineReason::Promoted | QuarantineReason::Restarted,
                    remaining
                } if *remaining > ttl / 2
            )
        },
    )
    .await;
    // Dated by the node's clock at the promotion, not by the replica process's start.
    let ledger: String = redis::cmd("GET")
        .arg("redlock:#ledger")
        .query_async(&mut aged.raw(1).await)
        .await
        .expect("the ledger");
    let since_ms: u64 = ledger
        .split(' ')
        .nth(2)
        .and_then(|f| f.parse().ok())
        .expect("the ledger's since");
    assert!(
        since_ms >= promoted_at_ms,
        "the loss dated at {since_ms}, before the promotion at {promoted_at_ms}"
    );
    assert!(
        matches!(
            redlock.try_lock("replica").await,
            Err(LockError::NoQuorum { .. })
        ),
        "no lock on a node promoted a moment ago"
    );
}

/// A Redis Cluster node, then the plain masters of `plain`.
#[cfg(feature = "cluster")]
fn cluster_then_plain(
    cluster: &support::cluster::RedisCluster,
    plain: &Cluster,
) -> Vec<NodeConfig> {
    let mut nodes = vec![NodeConfig::cluster(cluster.urls())];
    nodes.extend(plain.urls().into_iter().map(NodeConfig::from));
    nodes
}

/// A client over `nodes` once every shard of `cluster` has a ledger made long ago (so that
/// only a failover or a restart can keep a node out) and every node is usable.
#[cfg(feature = "cluster")]
async fn running_client(
    cluster: &support::cluster::RedisCluster,
    nodes: Vec<NodeConfig>,
) -> Redlock {
    tokio::task::block_in_place(|| cluster.age_ledgers());
    let running = client(nodes);
    wait_for("every node usable", Duration::from_secs(10), || async {
        running.health().await.usable() == 3
    })
    .await;
    running
}

/// The same failover on a Redis Cluster node: its shard for the name fails over
/// (`CLUSTER FAILOVER FORCE`) to a replica cut off before the holder locked, so it lacks
/// the key; nodes 1 and 2 are plain masters. A client that was running, one started during
/// the failover and one started after it: none gets the name while the holder's lock can
/// still be valid, and the promoted shard shows as quarantined.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_shard_failover_to_a_replica_that_lacks_the_key_makes_no_second_holder() {
    use support::cluster::RedisCluster;

    let name = "failover-victim";
    let key = format!("redlock:{{{name}}}");
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    let owner = cluster.owner(key.as_bytes());
    let replica = tokio::task::block_in_place(|| cluster.add_replica(owner));
    let plain = Cluster::start(2);
    plain.age_ledgers();
    let nodes = || cluster_then_plain(&cluster, &plain);
    let running = running_client(&cluster, nodes()).await;
    tokio::task::block_in_place(|| cluster.cut_replica(replica));
    let holder = client(nodes());
    let lock = lock_on_first_two(&holder, &plain, name).await;
    let until = lock.valid_until();
    assert!(
        cluster.holds(owner, key.as_bytes()),
        "the old master has the key"
    );

    tokio::task::block_in_place(|| cluster.start_failover(replica));
    let probes = during_the_failover(&running, nodes(), name, until);
    tokio::task::block_in_place(|| cluster.wait_promoted(replica, key.as_bytes()));
    // Just promoted, the node may refuse a command for a moment (the cluster's state not
    // settled yet): wait for its answer, then check it. The probes may have written their
    // own value there already (a cluster acquisition learns where it landed with its
    // answer, and a quarantined shard's vote does not count): only the holder's matters.
    let mut value = None;
    tokio::task::block_in_place(|| {
        support::wait_blocking(
            "the promoted replica's answer",
            Duration::from_secs(10),
            || {
                value = support::query_port::<Option<String>>(
                    cluster.replicas[replica].port(),
                    redis::cmd("GET").arg(&key),
                );
                value.is_some()
            },
        );
    });
    assert_ne!(
        value.flatten().as_deref(),
        Some(lock.value()),
        "the promoted replica lacks the holder's key"
    );
    after_the_failover(nodes(), "the cluster node", probes, name, until).await;
}

/// A Redis Cluster shard's master restarts empty (same node id, from its nodes.conf; no
/// replica to fail over to) while a client that knew it keeps running: its connection is
/// rebuilt behind the crate's back by redis-rs, and the crate still sees the restart (a
/// new connection, a new `LASTSAVE`, then a new `run_id`) and quarantines the node, for
/// its horizon (a minute here, longer than any restart takes).
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_cluster_shard_is_quarantined_by_a_running_client() {
    use support::cluster::RedisCluster;

    let name = "restart-victim";
    let key = format!("redlock:{{{name}}}");
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    let owner = cluster.owner(key.as_bytes());
    let plain = Cluster::start(2);
    plain.age_ledgers();
    let nodes = || cluster_then_plain(&cluster, &plain);
    let running = running_client(&cluster, nodes()).await;
    // A minute's lock on another name: the running client's horizon (so the length of
    // the quarantine it gives the shard) outlives a restart that is slow under load.
    let long = running
        .try_lock_with_ttl("horizon-minute", Duration::from_secs(60))
        .await
        .expect("a minute's lock");
    let _ = running.unlock(&long).await;
    let holder = client(nodes());
    let lock = lock_on_first_two(&holder, &plain, name).await;
    let until = lock.valid_until();
    tokio::task::block_in_place(|| cluster.masters[owner].restart());
    wait_for("the restarted shard back", Duration::from_secs(20), || {
        let back = support::query_port::<String>(
            cluster.masters[owner].port(),
            redis::cmd("CLUSTER").arg("INFO"),
        )
        .is_some_and(|i| i.contains("cluster_state:ok"));
        async move { back }
    })
    .await;
    assert!(
        !cluster.holds(owner, key.as_bytes()),
        "the restart lost the key"
    );
    let overlap = second_holder("the running client", running.clone(), name, until).await;
    assert_eq!(overlap, None);
    let status = running.health().await.nodes()[0].status().clone();
    assert!(
        matches!(
            status,
            NodeStatus::Quarantined {
                reason: QuarantineReason::Empty,
                ..
            }
        ),
        "{status:?}"
    );
}

/// A master demoted and promoted again while this client's connection to it stayed up and
/// carried no write (so no `READONLY` told it): a health check sees its replication id
/// changed, reconnects, and the node is quarantined as promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_demoted_and_promoted_again_under_a_live_connection_is_seen_by_health() {
    let servers = Cluster::start(2);
    let ttl = Duration::from_secs(2);
    servers.age_ledgers();
    let redlock = Redlock::builder([servers.nodes[0].url()])
        .ttl(ttl)
        .node_timeout(Duration::from_millis(100))
        .build()
        .expect("build");
    assert_eq!(redlock.health().await.nodes()[0].status(), &NodeStatus::Up);
    let mut admin = servers.raw(0).await;
    let other = servers.nodes[1].port().to_string();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(&other)
        .query_async(&mut admin)
        .await
        .expect("REPLICAOF");
    wait_for(
        "the demoted master in sync",
        Duration::from_secs(10),
        || {
            let synced = support::query_port::<String>(
                servers.nodes[0].port(),
                redis::cmd("INFO").arg("replication"),
            )
            .is_some_and(|i| i.contains("master_link_status:up"));
            async move { synced }
        },
    )
    .await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut admin)
        .await
        .expect("REPLICAOF NO ONE");
    wait_for(
        "the node quarantined as promoted",
        Duration::from_secs(10),
        || async {
            matches!(
                redlock.health().await.nodes()[0].status(),
                NodeStatus::Quarantined {
                    reason: QuarantineReason::Promoted,
                    ..
                }
            )
        },
    )
    .await;
}
