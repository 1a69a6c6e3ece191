//! Deterministic fault scenarios: the node restart that breaks plain Redlock (and the
//! restart quarantine that prevents it), a node's clock jumping forward (which breaks
//! mutual exclusion; fencing still rejects the stale writer), and how quarantines show.

use crate::support;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use support::fenced::{FencedStore, Write};
use support::jepsen::{Verdict, report};
use support::{Cluster, RedisNode, wait_for};
use tower_redlock::{Lock, LockError, NodeError, Redlock};

const TTL: Duration = Duration::from_secs(2);

/// Client A takes the lock on nodes 0, 1 and 2 only: nodes 3 and 4 hold a stranger's key
/// while A acquires.
async fn lock_on_first_three(cluster: &Cluster, a: &Redlock, name: &str) -> Lock {
    let key = format!("redlock:{{{name}}}");
    for i in [3, 4] {
        let mut conn = cluster.raw(i).await;
        let _: () = conn.set(&key, "stranger").await.expect("SET");
    }
    let lock = a.try_lock(name).await.expect("A locks nodes 0-2");
    for i in [3, 4] {
        let mut conn = cluster.raw(i).await;
        let _: () = conn.del(&key).await.expect("DEL");
    }
    lock
}

fn fence(lock: &Lock) -> u64 {
    lock.fencing_token().expect("fencing is on")
}

/// Whether B got the lock while A's validity still ran, and how a late write by A fared.
struct Outcome {
    overlap: bool,
    b_error: Option<LockError>,
    a_late_write: Option<Write>,
}

/// A holds nodes 0-2; node 2 restarts empty; B, which has talked to every node before,
/// tries until A's validity ends.
async fn restart_scenario(quarantine: bool) -> Outcome {
    let mut cluster = Cluster::start(5);
    cluster.age_ledgers();
    let store_node = RedisNode::start();
    let store = FencedStore::connect(&store_node.url())
        .await
        .expect("store");
    let a = support::builder(cluster.urls())
        .ttl(TTL)
        .build()
        .expect("A");
    let b = Redlock::builder(cluster.urls())
        .ttl(TTL)
        .node_timeout(Duration::from_millis(50))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(10))
        .restart_quarantine(quarantine)
        .build()
        .expect("B");
    support::warm(&b).await; // B knows every node

    let la = lock_on_first_three(&cluster, &a, "res").await;
    assert_eq!(
        store.write("res", fence(&la), "A").await.expect("write"),
        Write::Accepted
    );
    tokio::task::block_in_place(|| cluster.nodes[2].restart());
    let (overlap, b_error, a_late_write) = match b.lock_until("res", TTL, la.valid_until()).await {
        Ok(lb) => {
            let overlap = Instant::now() < la.valid_until();
            assert!(fence(&lb) > fence(&la), "fencing numbers still grow");
            assert_eq!(
                store.write("res", fence(&lb), "B").await.expect("write"),
                Write::Accepted
            );
            let late = store
                .write("res", fence(&la), "A again")
                .await
                .expect("write");
            (overlap, None, Some(late))
        }
        Err(e) => (false, Some(e), None),
    };
    Outcome {
        overlap,
        b_error,
        a_late_write,
    }
}

fn row(scenario: &str, took: Duration, faults: &str, acquisitions: usize, o: &Outcome) {
    let rejected = u64::from(matches!(o.a_late_write, Some(Write::Stale { .. })));
    let accepted = u64::from(matches!(o.a_late_write, Some(Write::Accepted)));
    let v = Verdict {
        acquisitions,
        overlaps: usize::from(o.overlap),
        stale_writes_accepted: accepted,
        stale_writes_rejected: rejected,
        late_writes: accepted + rejected,
        ..Verdict::default()
    };
    report(scenario, took, faults, &v);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_breaks_plain_redlock_and_the_quarantine_prevents_it() {
    let started = Instant::now();
    let off = restart_scenario(false).await;
    row(
        "restart, quarantine off",
        started.elapsed(),
        "1 node restarted empty",
        1 + usize::from(off.b_error.is_none()),
        &off,
    );
    assert!(off.overlap, "without quarantine B takes the lock A holds");
    assert!(
        matches!(off.a_late_write, Some(Write::Stale { .. })),
        "fencing rejects A's write after B's"
    );

    let started = Instant::now();
    let on = restart_scenario(true).await;
    row(
        "restart, quarantine on",
        started.elapsed(),
        "1 node restarted empty",
        1 + usize::from(on.b_error.is_none()),
        &on,
    );
    assert!(
        !on.overlap,
        "the quarantine keeps B out while A holds the lock"
    );
    assert!(
        matches!(on.b_error, Some(LockError::Busy { .. })),
        "B finds the lock busy: {:?}",
        on.b_error
    );
}

/// Node 2's clock jumps forward past the TTL while A holds nodes 0-2: A's key there expires
/// at once, B takes nodes 2-4, and both believe they hold the lock. Fencing still orders
/// them: the store refuses A's write once B has written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_jump_breaks_mutual_exclusion_but_fencing_rejects_the_stale_writer() {
    let started = Instant::now();
    let cluster = Cluster {
        nodes: vec![
            RedisNode::start(),
            RedisNode::start(),
            RedisNode::start_with_fake_clock(),
            RedisNode::start(),
            RedisNode::start(),
        ],
    };
    let store_node = RedisNode::start();
    let store = FencedStore::connect(&store_node.url())
        .await
        .expect("store");
    let ttl = Duration::from_secs(5);
    let a = support::builder(cluster.urls())
        .ttl(ttl)
        .build()
        .expect("A");
    let b = support::builder(cluster.urls())
        .ttl(ttl)
        .retry_delay(Duration::from_millis(5), Duration::from_millis(10))
        .build()
        .expect("B");
    let la = lock_on_first_three(&cluster, &a, "clock").await;
    // B cannot get it while A's keys live.
    assert!(matches!(
        b.try_lock("clock").await,
        Err(LockError::Busy { .. })
    ));
    cluster.nodes[2].set_clock_offset(60);
    let lb = b
        .lock_until("clock", ttl, la.valid_until())
        .await
        .expect("B locks nodes 2-4 after node 2's clock jumped");
    let overlap = la.is_held();
    assert!(overlap, "both hold the lock: mutual exclusion is broken");
    assert!(fence(&lb) > fence(&la));
    assert_eq!(
        store.write("clock", fence(&lb), "B").await.expect("write"),
        Write::Accepted
    );
    let late = store.write("clock", fence(&la), "A").await.expect("write");
    assert_eq!(
        late,
        Write::Stale {
            highest: fence(&lb)
        }
    );
    row(
        "clock jump (+60 s on 1 node)",
        started.elapsed(),
        "faketime: 1 node's clock +60 s",
        2,
        &Outcome {
            overlap,
            b_error: None,
            a_late_write: Some(late),
        },
    );
}

/// Fresh nodes hold no ledger: the first client makes one and every client keeps them out
/// for the TTL from their start (nothing tells a new node from one restarted empty),
/// saying so in the no-quorum error; then the lock is granted.
#[tokio::test]
async fn new_nodes_are_quarantined_for_a_ttl_from_their_start() {
    let cluster = Cluster::start(3);
    let r = Redlock::builder(cluster.urls())
        .ttl(Duration::from_secs(1))
        .node_timeout(Duration::from_millis(100))
        .build()
        .expect("build");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    wait_for(
        "a no-quorum error naming quarantined nodes",
        Duration::from_secs(5),
        || {
            let r = r.clone();
            let seen = std::sync::Arc::clone(&seen);
            async move {
                match r.try_lock("young").await {
                    Err(LockError::NoQuorum { failures, .. })
                        if failures
                            .iter()
                            .all(|f| matches!(f.error, NodeError::Quarantined { .. })) =>
                    {
                        *seen.lock().expect("seen") = failures;
                        true
                    }
                    _ => false,
                }
            }
        },
    )
    .await;
    let failures = seen.lock().expect("seen").clone();
    // The attempt stops once the quorum is out of reach: 2 of 3 nodes.
    assert!(failures.len() >= 2, "{failures:?}");
    let message = LockError::NoQuorum {
        needed: 2,
        reached: 0,
        held_elsewhere: 0,
        failures,
        attempts: 1,
    }
    .to_string();
    // The cause leads, with how long it lasts and the setting that decides it.
    assert!(message.starts_with("no quorum yet: "), "{message}");
    assert!(
        message.contains("restart quarantine for up to"),
        "{message}"
    );
    assert!(message.contains("restart_quarantine(false)"), "{message}");
    wait_for("the quarantine to end", Duration::from_secs(5), || {
        let r = r.clone();
        async move { r.try_lock("young").await.is_ok() }
    })
    .await;
}

/// A node restarted empty answers without its ledger: quarantined for the TTL although the
/// client knew it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_is_detected_by_its_missing_ledger() {
    let mut cluster = Cluster::start(3);
    let ttl = Duration::from_secs(1);
    cluster.age_ledgers();
    let r = Redlock::builder(cluster.urls())
        .ttl(ttl)
        .node_timeout(Duration::from_millis(100))
        .build()
        .expect("build");
    let lock = r.lock("run-id").await.expect("old nodes are trusted");
    let _ = r.unlock(&lock).await;
    tokio::task::block_in_place(|| {
        cluster.nodes[0].restart();
        cluster.nodes[1].kill();
    });
    let node0 = cluster.nodes[0].addr();
    wait_for(
        "node 0 quarantined after its restart",
        Duration::from_secs(5),
        || {
            let r = r.clone();
            let node0 = node0.clone();
            async move {
                matches!(r.try_lock("run-id").await, Err(LockError::NoQuorum { failures, .. })
                if failures.iter().any(|f| f.node == node0
                    && matches!(f.error, NodeError::Quarantined { .. })))
            }
        },
    )
    .await;
}

/// With the TLS feature, a TLS handshake with a server that speaks plain text fails, and
/// the error says why, never only "timed out". (Before the crate chose a crypto provider
/// itself, this connect panicked in the background task; the panic's message is now the
/// node's error, see `src/node.rs`.) A plain Redis port sends nothing back to a TLS
/// handshake, so the connect times out, and the message asks whether the port is the
/// server's TLS port; a server that answers with something else is
/// `NodeError::Tls { problem: TlsProblem::NotTls, .. }` (`tests/suite/tls.rs`).
#[cfg(feature = "tls-rustls")]
#[tokio::test]
async fn a_failed_tls_connect_reports_its_cause() {
    let node = support::RedisNode::start();
    let redlock = support::builder([format!("rediss://127.0.0.1:{}", node.port())])
        .node_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(200))
        .build()
        .expect("build");
    let err = redlock.try_lock("tls").await.expect_err("plain server");
    let text = err.to_string();
    println!("{text}");
    assert!(!text.ends_with("timed out"), "{text}");
    let LockError::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err:?}");
    };
    assert!(
        matches!(&failures[0].error, NodeError::Connection(detail)
            if detail.contains("connect timeout") && detail.contains("tls-port")),
        "{err:?}"
    );
}

/// Sentinel-managed nodes: a failover on one node is followed (the sentinels name the new
/// master), the promoted replica is quarantined like a restarted node (it may lack lock
/// keys), then used again; contending lockers never overlap across it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_followed_and_quarantined_without_overlaps() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use support::sentinel::SentinelNode;
    use tower_redlock::{NodeConfig, NodeStatus};

    let nodes: Vec<SentinelNode> = (0..3)
        .map(|i| SentinelNode::start(&format!("locks-{i}")))
        .collect();
    let ttl = Duration::from_secs(2);
    let redlock = Redlock::builder(
        nodes
            .iter()
            .map(|n| NodeConfig::sentinel([n.sentinel_url()], n.name.clone())),
    )
    .ttl(ttl)
    .node_timeout(Duration::from_millis(100))
    .build()
    .expect("build");
    // The nodes are young: wait out their first quarantine.
    wait_for("a usable quorum", Duration::from_secs(15), || async {
        redlock.health().await.usable() == 3
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let (overlaps, held) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let lockers: Vec<_> = (0..4)
        .map(|_| {
            let (redlock, stop, inside) = (redlock.clone(), stop.clone(), inside.clone());
            let (overlaps, held) = (overlaps.clone(), held.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let Ok(lock) = redlock
                        .lock_until("failover", ttl, Instant::now() + Duration::from_millis(500))
                        .await
                    else {
                        continue;
                    };
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    if lock.is_held() {
                        held.fetch_add(1, Ordering::SeqCst);
                    }
                    inside.fetch_sub(1, Ordering::SeqCst);
                    let _ = redlock.unlock(&lock).await;
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = held.load(Ordering::SeqCst);
    let failing = &nodes[0];
    tokio::task::block_in_place(|| failing.failover());
    wait_for(
        "the promoted replica's quarantine",
        Duration::from_secs(15),
        || async {
            matches!(
                redlock.health().await.nodes()[0].status(),
                NodeStatus::Quarantined { .. }
            )
        },
    )
    .await;
    wait_for(
        "the node back in service",
        Duration::from_secs(15),
        || async { redlock.health().await.nodes()[0].status() == &NodeStatus::Up },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for locker in lockers {
        locker.await.expect("locker");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "holds overlapped");
    assert!(
        held.load(Ordering::SeqCst) > before,
        "locks were granted across the failover"
    );
}

/// A Redis Cluster as one node: lock, extend, fencing and release run on the shard that
/// owns the name (every key of a lock shares its slot); with that shard's master dead,
/// only the names on it fail, with a per-node error, and the others still lock.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_locks_on_the_owning_shard_and_a_dead_shard_fails_only_its_names() {
    use support::cluster::RedisCluster;
    use tower_redlock::{NodeConfig, NodeStatus, QuarantineReason};

    let mut cluster = RedisCluster::start();
    let redlock = Redlock::builder([NodeConfig::cluster(cluster.urls())])
        .ttl(Duration::from_secs(5))
        .node_timeout(Duration::from_millis(300))
        .build()
        .expect("build");
    // Its masters are new (no ledger): the first check of its shards quarantines the node
    // as a fresh single node would be.
    let status = redlock.health().await.nodes()[0].status().clone();
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
    wait_for(
        "the cluster node usable",
        Duration::from_secs(10),
        || async { redlock.health().await.ready() },
    )
    .await;
    let mut lock = redlock.lock("shard-a").await.expect("lock on the cluster");
    let first = lock.fencing_token().expect("fenced");
    let owner = cluster.owner(lock.key());
    assert!(cluster.holds(owner, lock.key()));
    // With a cluster node the counters' set is one per slot, on the lock key's shard.
    let (counters, member) =
        tower_redlock::fencing::counter_of(b"redlock:", b"shard-a", true).expect("a valid name");
    assert!(counters.starts_with(b"redlock:#fencing{"), "{counters:?}");
    assert_eq!(cluster.owner(&counters), owner);
    assert!(cluster.holds(owner, &counters));
    assert_eq!(member, b"6591".to_vec(), "the slot of shard-a");
    redlock
        .extend(&mut lock, Duration::from_secs(5))
        .await
        .expect("extend");
    assert!(matches!(
        redlock.try_lock("shard-a").await,
        Err(LockError::Busy { .. })
    ));
    assert_eq!(redlock.unlock(&lock).await.released(), 1);
    let again = redlock.lock("shard-a").await.expect("lock again");
    assert!(again.fencing_token() > Some(first));
    let _ = redlock.unlock(&again).await;

    // A name on the shard about to die, and one on another shard.
    let key = |name: &str| format!("redlock:{{{name}}}").into_bytes();
    let on_owner = |i: usize| {
        (0..1000)
            .map(|n| format!("name-{n}"))
            .find(|name| (cluster.owner(&key(name)) == owner) == (i == owner))
            .expect("a name")
    };
    let doomed = on_owner(owner);
    let other = on_owner((owner + 1) % 3);
    cluster.masters[owner].kill();
    let err = redlock
        .try_lock(&doomed)
        .await
        .expect_err("its shard is dead");
    let LockError::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err:?}");
    };
    assert!(failures[0].node.starts_with("cluster:"), "{err}");
    let lock = redlock
        .lock(&other)
        .await
        .expect("another shard still locks");
    let _ = redlock.unlock(&lock).await;
}
