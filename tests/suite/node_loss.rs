//! Node loss decided by the nodes (`src/node/loss/`), over real servers: every way a node
//! loses keys that the clients once judged each on its own, and the routine operations
//! that lose nothing and must not take a node out of service. Each test here failed before
//! the nodes kept a ledger and a horizon (`docs/reliability.md`, "Ways a node loses
//! keys"). The harness takes the server binary from `REDIS_SERVER`, so `scripts/test`
//! runs this file on Redis and on Valkey.

use crate::support;

use std::time::{Duration, Instant};

use support::proxy::{FaultProxy, Mode};
use support::{CapturedLogs, Cluster, RedisNode, query_port, wait_for};
use tower_redlock::{Lock, NodeConfig, NodeStatus, QuarantineReason, Redlock};

/// How often the clients here check their nodes in the background.
const CHECK: Duration = Duration::from_millis(200);

/// A client as users build one (the restart quarantine on) with `ttl`.
fn client(nodes: Vec<NodeConfig>, ttl: Duration) -> Redlock {
    Redlock::builder(nodes)
        .ttl(ttl)
        .node_timeout(Duration::from_millis(100))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(10))
        .check_interval(CHECK)
        .build()
        .expect("build")
}

fn configs(urls: Vec<String>) -> Vec<NodeConfig> {
    urls.into_iter().map(NodeConfig::from).collect()
}

/// Waits until every node of `redlock` is usable.
async fn usable(redlock: &Redlock) {
    let n = redlock.health().await.nodes().len();
    wait_for("every node usable", Duration::from_secs(10), || async {
        redlock.health().await.usable() == n
    })
    .await;
}

/// `holder` takes `name` on every node but the one on `stranger_port`, which holds a
/// stranger's key meanwhile.
async fn lock_without(holder: &Redlock, stranger_port: u16, name: &str) -> Lock {
    let key = format!("redlock:{{{name}}}");
    let set = |cmd: &redis::Cmd| query_port::<()>(stranger_port, cmd);
    set(redis::cmd("SET").arg(&key).arg("stranger")).expect("SET");
    let lock = holder.try_lock(name).await.expect("the holder locks");
    set(redis::cmd("DEL").arg(&key)).expect("DEL");
    lock
}

/// Tries to take `name` until `until` (the holder's validity): a grant before then is a
/// second holder, reported.
async fn second_holder(who: &str, client: &Redlock, name: &str, until: Instant) -> Option<String> {
    while Instant::now() < until {
        if let Ok(lock) = client.try_lock(name).await {
            if Instant::now() < until {
                return Some(format!(
                    "{who} got the lock with {:?} of the holder's validity left",
                    until.saturating_duration_since(Instant::now())
                ));
            }
            let _ = client.unlock(&lock).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// How much longer `redlock` keeps node `i` out, and why.
async fn quarantine(redlock: &Redlock, i: usize) -> Option<(Duration, QuarantineReason)> {
    match redlock.health().await.nodes()[i].status() {
        NodeStatus::Quarantined { remaining, reason } => Some((*remaining, *reason)),
        _ => None,
    }
}

/// Case 1: process A locks with a 6 s TTL, B with 1 s. A node that held A's key restarts
/// empty: B keeps it out for A's TTL (the horizon A raised on every node), not its own,
/// and never takes A's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_ttl_client_keeps_a_lost_node_out_for_the_longest_ttl_in_use() {
    let mut nodes = Cluster::start(3);
    nodes.age_ledgers();
    let long = client(configs(nodes.urls()), Duration::from_secs(6));
    let short = client(configs(nodes.urls()), Duration::from_secs(1));
    usable(&long).await;
    usable(&short).await;
    let lock = lock_without(&long, nodes.nodes[2].port(), "victim").await;
    let until = lock.valid_until();
    tokio::task::block_in_place(|| nodes.nodes[1].restart());
    wait_for("B sees the node lost", Duration::from_secs(5), || async {
        quarantine(&short, 1).await.is_some()
    })
    .await;
    let (left, reason) = quarantine(&short, 1).await.expect("quarantined");
    assert_eq!(reason, QuarantineReason::Empty);
    assert!(
        left > Duration::from_secs(3),
        "A's 6 s, not B's 1 s: {left:?}"
    );
    let overlap = second_holder("B (1 s TTL)", &short, "victim", until).await;
    assert_eq!(overlap, None);
}

/// Case 2: a replica promoted by hand whose old replication id was cleared since (its
/// backlog freed after `repl-backlog-ttl`), met by a client that never saw it: `INFO`
/// shows no promotion and a long uptime, but the ledger it replicated names the old
/// master, so it is kept out while the old master's lock can be valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_master_whose_old_replication_id_was_cleared_is_still_kept_out() {
    let ttl = Duration::from_secs(6);
    let mut old = RedisNode::start();
    let replica = RedisNode::start_replica_of(old.port());
    let plain = Cluster::start(2);
    plain.age_ledgers();
    old.age_ledger();
    // Older than the TTL: before the ledger, a client meeting it first trusted it.
    wait_for(
        "the replica older than the TTL",
        Duration::from_secs(20),
        || {
            let aged = replica.uptime_secs().is_some_and(|u| u > ttl.as_secs());
            async move { aged }
        },
    )
    .await;
    let mut nodes = vec![NodeConfig::from(old.url())];
    nodes.extend(configs(plain.urls()));
    let holder = client(nodes, ttl);
    usable(&holder).await;
    let lock = lock_without(&holder, plain.nodes[1].port(), "promoted").await;
    let until = lock.valid_until();
    let key = lock.key().to_vec();
    // The replica lacks the key (replication is asynchronous), then takes over.
    let on_replica = |cmd: &redis::Cmd| query_port::<redis::Value>(replica.port(), cmd);
    on_replica(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("replica-read-only")
            .arg("no"),
    );
    on_replica(redis::cmd("DEL").arg(&key));
    on_replica(redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
    tokio::task::block_in_place(|| old.kill());
    on_replica(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-backlog-ttl")
            .arg("1"),
    );
    wait_for(
        "the old replication id cleared",
        Duration::from_secs(10),
        || {
            let cleared =
                query_port::<String>(replica.port(), redis::cmd("INFO").arg("replication"))
                    .is_some_and(|i| {
                        i.contains("master_replid2:0000000000000000000000000000000000000000")
                    });
            async move { cleared }
        },
    )
    .await;
    let mut nodes = vec![NodeConfig::from(replica.url())];
    nodes.extend(configs(plain.urls()));
    let newcomer = client(nodes, ttl);
    let overlap = second_holder("a client that meets it now", &newcomer, "promoted", until).await;
    assert_eq!(overlap, None);
}

/// Case 3: behind a proxy that hides `run_id`, a node that restarts empty is still seen
/// (by its missing ledger), and the hidden field is said once, at `warn`. (A
/// current-thread runtime: the logs are captured on this thread.)
#[tokio::test]
async fn a_node_whose_info_hides_its_run_id_is_judged_by_its_ledger() {
    let logs = CapturedLogs::start();
    let mut nodes = Cluster::start(3);
    nodes.age_ledgers();
    let proxy = FaultProxy::start(nodes.nodes[1].addr()).await;
    proxy.set(Mode::HideRunId);
    let urls = vec![nodes.nodes[0].url(), proxy.url(), nodes.nodes[2].url()];
    let holder = client(configs(urls.clone()), Duration::from_secs(4));
    let other = client(configs(urls), Duration::from_secs(4));
    usable(&holder).await;
    usable(&other).await;
    let lock = lock_without(&holder, nodes.nodes[2].port(), "hidden").await;
    let until = lock.valid_until();
    nodes.nodes[1].restart();
    let overlap = second_holder("the other client", &other, "hidden", until).await;
    assert_eq!(overlap, None);
    assert!(logs.contains("tells no run_id"), "{}", logs.text());
}

/// Case 4: `FLUSHALL` on a node under live connections is seen within one check
/// interval, and a node with an append-only file that comes back empty (its volume lost)
/// shows as emptied, not as reloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_node_is_kept_out_within_one_check_interval() {
    let nodes = Cluster::start(3);
    nodes.age_ledgers();
    let ttl = Duration::from_secs(4);
    // The flushed process older than the horizon, as a node in service is: a process
    // younger than it, found empty, lost its data at its start at the latest (see
    // `node::loss::judge`), a case only the aged ledger above could put in service (on a
    // loaded machine the flush came more than a second after the start, and the other
    // client's quarantine ended before the holder's validity).
    wait_for("the node older than the horizon", ttl * 3, || {
        let aged = nodes.nodes[1]
            .uptime_secs()
            .is_some_and(|u| u >= ttl.as_secs());
        async move { aged }
    })
    .await;
    let holder = client(configs(nodes.urls()), ttl);
    let other = client(configs(nodes.urls()), ttl);
    usable(&holder).await;
    usable(&other).await;
    let lock = lock_without(&holder, nodes.nodes[2].port(), "flushed").await;
    let until = lock.valid_until();
    let flushed = Instant::now();
    let _: () = query_port(nodes.nodes[1].port(), &redis::cmd("FLUSHALL")).expect("FLUSHALL");
    wait_for("the flush seen", Duration::from_secs(5), || async {
        quarantine(&other, 1).await.is_some()
    })
    .await;
    assert!(
        flushed.elapsed() < CHECK * 5,
        "seen {:?} after the flush",
        flushed.elapsed()
    );
    let overlap = second_holder("the other client", &other, "flushed", until).await;
    assert_eq!(overlap, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_append_only_file_is_lost_shows_as_emptied() {
    let dir = format!("redlock-test-lost-aof-{}", support::free_port());
    let args = ["--appendonly", "yes", "--appenddirname", &dir].map(String::from);
    let mut node = RedisNode::start_with_args(None, args.to_vec());
    node.age_ledger();
    let redlock = client(vec![NodeConfig::from(node.url())], Duration::from_secs(3));
    usable(&redlock).await;
    tokio::task::block_in_place(|| {
        node.kill();
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&dir));
        node.restart();
    });
    wait_for(
        "the node judged emptied",
        Duration::from_secs(5),
        || async {
            matches!(
                quarantine(&redlock, 0).await,
                Some((_, QuarantineReason::Empty))
            )
        },
    )
    .await;
    drop(node);
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&dir));
}

/// Case 6: a new replication id without any loss keeps the node in service: a backup by
/// `SYNC` (`redis-cli --rdb`) on a master without a backlog, its backlog freed after
/// `repl-backlog-ttl`, and the first replica attached to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replication_id_without_a_loss_keeps_the_node_in_service() {
    let master = RedisNode::start();
    master.age_ledger();
    let port = master.port();
    let set = |name: &str, value: &str| {
        query_port::<()>(port, redis::cmd("CONFIG").arg("SET").arg(name).arg(value))
    };
    set("repl-backlog-ttl", "1").expect("CONFIG SET");
    let redlock = client(
        vec![NodeConfig::from(master.url())],
        Duration::from_secs(30),
    );
    usable(&redlock).await;
    let replid = || {
        query_port::<String>(port, redis::cmd("INFO").arg("replication")).and_then(|i| {
            i.lines().find_map(|l| {
                l.trim_end()
                    .strip_prefix("master_replid:")
                    .map(str::to_owned)
            })
        })
    };
    let dump = std::env::temp_dir().join(format!("redlock-test-backup-{port}.rdb"));
    let mut replica = None;
    let ops: [(&str, &dyn Fn() -> Option<RedisNode>); 3] = [
        ("a backup by SYNC (redis-cli --rdb)", &|| {
            let out = std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string(), "--rdb"])
                .arg(&dump)
                .output()
                .expect("redis-cli --rdb");
            assert!(out.status.success(), "{out:?}");
            None
        }),
        ("the backlog freed after repl-backlog-ttl", &|| None),
        ("the first replica attached", &|| {
            Some(RedisNode::start_replica_of(port))
        }),
    ];
    for (what, op) in ops {
        let before = replid();
        if let Some(started) = tokio::task::block_in_place(op) {
            replica = Some(started);
        }
        wait_for(
            &format!("{what}: a new replication id"),
            Duration::from_secs(15),
            || {
                let changed = replid().is_some_and(|now| Some(now) != before);
                async move { changed }
            },
        )
        .await;
        // The background check has judged the change (two intervals), and so does health.
        tokio::time::sleep(CHECK * 2).await;
        assert_eq!(
            redlock.health().await.nodes()[0].status(),
            &NodeStatus::Up,
            "{what}"
        );
        let lock = redlock.try_lock("routine").await.expect(what);
        let _ = redlock.unlock(&lock).await;
    }
    drop(replica);
    let _ = std::fs::remove_file(dump);
}

/// Case 8: every client ends a quarantine at the same moment, whenever it noticed the
/// loss: one that saw the node restart at once, and one that only talks to it later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_ends_a_quarantine_at_the_same_moment() {
    let mut nodes = Cluster::start(3);
    nodes.age_ledgers();
    let ttl = Duration::from_secs(4);
    let early = client(configs(nodes.urls()), ttl);
    // Checks its nodes in the background only rarely: it meets the restart late.
    let late = Redlock::builder(nodes.urls())
        .ttl(ttl)
        .check_interval(Duration::from_secs(3600))
        .build()
        .expect("build");
    usable(&early).await;
    usable(&late).await;
    tokio::task::block_in_place(|| nodes.nodes[0].restart());
    wait_for(
        "the early client sees the loss",
        Duration::from_secs(5),
        || async { quarantine(&early, 0).await.is_some() },
    )
    .await;
    let early_end = Instant::now() + quarantine(&early, 0).await.expect("quarantined").0;
    // The late client's first word with the node since the restart, 1.5 s later (its
    // connection found broken, then made again).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    wait_for(
        "the late client judges the node",
        Duration::from_secs(5),
        || async { quarantine(&late, 0).await.is_some() },
    )
    .await;
    let (left, _) = quarantine(&late, 0).await.expect("quarantined");
    let late_end = Instant::now() + left;
    let apart = late_end
        .saturating_duration_since(early_end)
        .max(early_end.saturating_duration_since(late_end));
    assert!(apart < Duration::from_millis(300), "ends {apart:?} apart");
}

/// Case 5, stale sentinels: three sentinels for one master name, one of them stale (it
/// names another server). The master is the one a majority names, whichever answers
/// first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_is_the_one_a_majority_of_the_sentinels_names() {
    use support::sentinel::{Sentinel, SentinelNode};
    let group = tokio::task::block_in_place(|| SentinelNode::start("locks-m"));
    let elsewhere = RedisNode::start();
    let (second, stale) = tokio::task::block_in_place(|| {
        (
            Sentinel::monitoring("locks-m", group.master.port()),
            Sentinel::monitoring("locks-m", elsewhere.port()),
        )
    });
    group.age_ledgers();
    elsewhere.age_ledger();
    let node = NodeConfig::sentinel([stale.url(), group.sentinel_url(), second.url()], "locks-m");
    let redlock = client(vec![node], Duration::from_secs(4));
    usable(&redlock).await;
    let lock = redlock.try_lock("named").await.expect("locked");
    let held =
        |port: u16| query_port::<bool>(port, redis::cmd("EXISTS").arg(lock.key())) == Some(true);
    assert!(
        held(group.master.port()),
        "on the master the majority names"
    );
    assert!(
        !held(elsewhere.port()),
        "not on the stale sentinel's server"
    );
}

/// Case 5, split brain: the sentinels come to name another master while the connected one
/// still says it is a master (it did not hear of the failover). The client leaves it
/// within one check interval, unasked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaves_a_master_its_sentinels_no_longer_name_within_one_interval() {
    use support::sentinel::Sentinel;
    let first = RedisNode::start();
    let next = RedisNode::start();
    first.age_ledger();
    next.age_ledger();
    let sentinels: Vec<Sentinel> = tokio::task::block_in_place(|| {
        (0..3)
            .map(|_| Sentinel::monitoring("locks-s", first.port()))
            .collect()
    });
    let node = NodeConfig::sentinel(sentinels.iter().map(Sentinel::url), "locks-s");
    let redlock = client(vec![node], Duration::from_secs(4));
    usable(&redlock).await;
    // The client's connections: not the sentinels' (named `sentinel-...`), not this query.
    let clients_on = |port: u16| {
        query_port::<String>(port, redis::cmd("CLIENT").arg("LIST")).map_or(0, |list| {
            list.lines()
                .filter(|l| !l.contains("cmd=client|list") && !l.contains("name=sentinel"))
                .count()
        })
    };
    assert_eq!(clients_on(next.port()), 0);
    tokio::task::block_in_place(|| {
        for sentinel in &sentinels {
            sentinel.remonitor("locks-s", next.port());
        }
    });
    let moved = Instant::now();
    wait_for(
        "the client on the master the sentinels name",
        Duration::from_secs(5),
        || {
            let there = clients_on(next.port()) > 0;
            async move { there }
        },
    )
    .await;
    assert!(
        moved.elapsed() < CHECK * 5,
        "moved after {:?}",
        moved.elapsed()
    );
}

/// Case 5, the split-brain window of the README's Deployments section: with
/// `min-replicas-to-write 1` and `min-replicas-max-lag 2`, a master cut off from its
/// replica refuses writes, locks included, within the lag and two seconds (the replica
/// acknowledges once a second, and Redis counts the lag in whole seconds and checks it
/// once a second: `L` + 2 s at the latest), and half a second for this test's polling;
/// before, it took them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_cut_off_from_its_replicas_stops_taking_locks_within_the_lag() {
    let lag = Duration::from_secs(2);
    let master = RedisNode::start_with_args(
        None,
        [
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            "2",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut replica = RedisNode::start_replica_of(master.port());
    wait_for(
        "the master to count a good replica",
        Duration::from_secs(20),
        || {
            let good = query_port::<String>(master.port(), redis::cmd("INFO").arg("replication"))
                .is_some_and(|i| i.contains("min_slaves_good_slaves:1"));
            async move { good }
        },
    )
    .await;
    master.age_ledger();
    let redlock = client(vec![NodeConfig::from(master.url())], Duration::from_secs(4));
    usable(&redlock).await;
    let lock = redlock
        .try_lock("window")
        .await
        .expect("locks with its replica");
    let _ = redlock.unlock(&lock).await;
    replica.pause();
    let cut = Instant::now();
    wait_for("the master refusing locks", lag * 4, || async {
        match redlock.try_lock("window").await {
            Ok(lock) => {
                let _ = redlock.unlock(&lock).await;
                false
            }
            Err(e) => {
                assert!(e.to_string().contains("NOREPLICAS"), "{e}");
                true
            }
        }
    })
    .await;
    let window = cut.elapsed();
    assert!(
        window <= lag + Duration::from_millis(2_500),
        "locks taken {window:?} after the cut"
    );
    replica.resume();
}

/// Case 7: a Redis Cluster that announces hostnames (`cluster-preferred-endpoint-type
/// hostname`, so redis-rs keys its connections by hostname) has its shards judged, and
/// locks.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_hostname_endpoints_locks() {
    use support::cluster::RedisCluster;
    let cluster = tokio::task::block_in_place(|| {
        RedisCluster::start_with(&[
            "--cluster-announce-hostname",
            "localhost",
            "--cluster-preferred-endpoint-type",
            "hostname",
        ])
    });
    tokio::task::block_in_place(|| cluster.age_ledgers());
    let redlock = client(
        vec![NodeConfig::cluster(cluster.urls())],
        Duration::from_secs(4),
    );
    usable(&redlock).await;
    let lock = redlock.try_lock("by-hostname").await.expect("locked");
    assert!(cluster.holds(cluster.owner(lock.key()), lock.key()));
    assert_eq!(redlock.unlock(&lock).await.released(), 1);
}

/// Case 7: a name in a slot that is being resharded (`CLUSTER SETSLOT ... MIGRATING` on
/// its master, `IMPORTING` on another) runs on the importing master, by `ASK`: a master
/// the client judged, so the lock holds.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_in_a_slot_being_resharded_locks_on_the_importing_master() {
    use support::cluster::RedisCluster;
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    tokio::task::block_in_place(|| cluster.age_ledgers());
    let redlock = client(
        vec![NodeConfig::cluster(cluster.urls())],
        Duration::from_secs(4),
    );
    usable(&redlock).await;
    let name = "moving";
    let key = format!("redlock:{{{name}}}");
    let source = cluster.owner(key.as_bytes());
    let target = (source + 1) % cluster.masters.len();
    let slot: i64 = query_port(
        cluster.masters[0].port(),
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(&key),
    )
    .expect("CLUSTER KEYSLOT");
    let setslot = |on: usize, how: &str, other: usize| {
        let done: Option<String> = query_port(
            cluster.masters[on].port(),
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(how)
                .arg(cluster.node_id(other)),
        );
        assert_eq!(done.as_deref(), Some("OK"), "SETSLOT {how}");
    };
    setslot(target, "IMPORTING", source);
    setslot(source, "MIGRATING", target);
    let lock = redlock.try_lock(name).await.expect("locked mid-migration");
    // An importing master answers for the slot only after ASKING, on the same connection.
    let asked = redis::Client::open(cluster.masters[target].url())
        .and_then(|c| c.get_connection())
        .and_then(|mut c| {
            redis::pipe()
                .cmd("ASKING")
                .ignore()
                .cmd("EXISTS")
                .arg(&key)
                .query::<(bool,)>(&mut c)
        });
    assert_eq!(asked.ok(), Some((true,)), "on the importing master");
    assert_eq!(redlock.unlock(&lock).await.released(), 1);
}
