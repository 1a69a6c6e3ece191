//! The Redlock client against real redis-server nodes started by the harness.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::AsyncCommands;
use support::{Cluster, FaultProxy, GarbageServer, wait_for};
use tower_redlock::{ConfigError, Lock, LockError, NodeError, RedlockBuilder};

const NODE_TIMEOUT: Duration = Duration::from_millis(200);

fn builder(urls: Vec<String>) -> RedlockBuilder {
    support::builder(urls)
        .ttl(Duration::from_secs(5))
        .node_timeout(NODE_TIMEOUT)
}

async fn mutual_exclusion(n: usize) {
    let cluster = Cluster::start(n);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let redlock = redlock.clone();
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            let mut holds = Vec::new();
            for _ in 0..200 {
                match redlock.try_lock("shared").await {
                    Ok(lock) => {
                        let acquired = Instant::now();
                        assert_eq!(
                            inside.fetch_add(1, Ordering::SeqCst),
                            0,
                            "two holders at once"
                        );
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        let end = lock.valid_until().min(Instant::now());
                        holds.push((acquired, end));
                        let _ = redlock.unlock(&lock).await;
                    }
                    Err(LockError::Busy { .. }) => {}
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            holds
        }));
    }
    let mut holds = Vec::new();
    for t in tasks {
        holds.extend(t.await.expect("task"));
    }
    assert!(holds.len() >= 32, "too few acquisitions: {}", holds.len());
    holds.sort();
    for w in holds.windows(2) {
        assert!(w[1].0 >= w[0].1, "holds overlap: {:?} and {:?}", w[0], w[1]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_on_1_node() {
    mutual_exclusion(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_on_3_nodes() {
    mutual_exclusion(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_on_5_nodes() {
    mutual_exclusion(5).await;
}

#[tokio::test]
async fn two_of_five_killed_still_locks_and_unlocks() {
    let mut cluster = Cluster::start(5);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    cluster.nodes[0].kill();
    cluster.nodes[3].kill();
    for _ in 0..3 {
        let lock = redlock
            .lock("two-down")
            .await
            .expect("lock with 3 of 5 nodes");
        assert!(lock.is_held());
        let report = redlock.unlock(&lock).await;
        assert_eq!(report.released(), 3);
        assert_eq!(report.failures().len(), 2);
    }
    // A client built while the nodes are down works too.
    let fresh = builder(cluster.urls())
        .build()
        .expect("build with dead nodes");
    let lock = fresh.lock("two-down").await.expect("lock");
    assert_eq!(fresh.unlock(&lock).await.released(), 3);
}

#[tokio::test]
async fn three_of_five_killed_is_no_quorum_with_three_causes() {
    let mut cluster = Cluster::start(5);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    let dead: HashSet<String> = [1, 2, 4].iter().map(|i| cluster.nodes[*i].addr()).collect();
    for i in [1, 2, 4] {
        cluster.nodes[i].kill();
    }
    for _ in 0..3 {
        match redlock.try_lock("three-down").await {
            Err(LockError::NoQuorum {
                needed,
                reached,
                failures,
                ..
            }) => {
                assert_eq!(needed, 3);
                assert!(reached <= 2);
                assert_eq!(failures.len(), 3, "{failures:?}");
                let named: HashSet<String> = failures.iter().map(|f| f.node.clone()).collect();
                assert_eq!(named, dead);
                for f in &failures {
                    assert!(
                        matches!(f.error, NodeError::Refused | NodeError::Connection(_)),
                        "{f}"
                    );
                }
            }
            other => panic!("expected NoQuorum, got {other:?}"),
        }
    }
    // The error text names every failed node.
    let err = redlock.try_lock("three-down").await.expect_err("no quorum");
    let text = err.to_string();
    for addr in &dead {
        assert!(text.contains(addr.as_str()), "{text}");
    }
}

#[tokio::test]
async fn a_paused_node_does_not_stall_operations() {
    let mut cluster = Cluster::start(5);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    cluster.nodes[2].pause();
    let margin = Duration::from_millis(40);
    for i in 0..10 {
        let t = Instant::now();
        let lock = redlock
            .try_lock(format!("paused-{i}"))
            .await
            .expect("lock with one node paused");
        let took = t.elapsed();
        assert!(took < NODE_TIMEOUT + margin, "acquire took {took:?}");
        assert!(lock.is_held());
        assert!(lock.remaining() > Duration::from_secs(4));
        let t = Instant::now();
        let report = redlock.unlock(&lock).await;
        let took = t.elapsed();
        assert!(took < NODE_TIMEOUT + margin, "release took {took:?}");
        assert_eq!(report.released(), 4);
    }
    // Back in service after it resumes, without user action.
    cluster.nodes[2].resume();
    wait_for(
        "the resumed node to take part again",
        Duration::from_secs(10),
        || async {
            let lock = redlock.lock("resumed").await.expect("lock");
            redlock.unlock(&lock).await.released() == 5
        },
    )
    .await;
}

#[tokio::test]
async fn a_restarted_node_comes_back_without_user_action() {
    let mut cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    cluster.nodes[0].restart();
    wait_for(
        "the restarted node to take part again",
        Duration::from_secs(10),
        || async {
            let lock = redlock.lock("restarted").await.expect("lock");
            redlock.unlock(&lock).await.released() == 3
        },
    )
    .await;
}

#[tokio::test]
async fn a_failed_attempt_leaves_no_key_of_ours() {
    let cluster = Cluster::start(5);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    let key = b"redlock:{contended}";
    for i in 0..3 {
        let mut conn = cluster.raw(i).await;
        let _: () = conn.set(key, "someone-else").await.expect("SET");
    }
    cluster.reset_stats().await;
    let attempt = redlock.try_lock("contended").await;
    // The release after the failed attempt skips the nodes that answered with another
    // client's value (ours never reached them): one script everywhere, the holder's TTL
    // after the refused `SET` there, the release on the others (the fenced acquisition
    // itself is plain commands).
    for i in 0..5 {
        assert_eq!(cluster.command_calls(i, "evalsha").await, 1, "node {i}");
        assert_eq!(cluster.command_calls(i, "zadd").await, 1, "node {i}");
    }
    match attempt {
        Err(LockError::Busy {
            held_elsewhere,
            nodes,
            retry_after,
            ..
        }) => {
            assert_eq!((held_elsewhere, nodes), (3, 5));
            assert_eq!(retry_after, None, "the other keys have no TTL");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    for i in 0..5 {
        let v = cluster.get(i, key).await;
        if i < 3 {
            assert_eq!(v.as_deref(), Some("someone-else"), "node {i}");
        } else {
            assert_eq!(v, None, "node {i} still has our key");
        }
    }
}

#[tokio::test]
async fn busy_reports_the_holders_remaining_ttl() {
    let cluster = Cluster::start(3);
    let base = builder(cluster.urls()).build().expect("build");
    // Fenced acquisitions read the TTL in their script; unfenced ones are a plain SET NX PX
    // and ask for it only on the busy path.
    for fencing in [true, false] {
        let redlock = base.with_fencing(fencing);
        let holder = redlock.lock("ttl-hint").await.expect("lock");
        match redlock.try_lock("ttl-hint").await {
            Err(LockError::Busy {
                retry_after: Some(d),
                ..
            }) => {
                assert!(
                    d <= Duration::from_secs(5) && d > Duration::from_secs(3),
                    "fencing {fencing}: {d:?}"
                );
            }
            other => panic!("fencing {fencing}: expected Busy with a hint, got {other:?}"),
        }
        let _ = redlock.unlock(&holder).await;
    }
}

#[tokio::test]
async fn unlock_never_deletes_another_clients_key_and_extend_after_expiry_is_not_held() {
    let cluster = Cluster::start(3);
    let a = support::builder(cluster.urls())
        .node_timeout(Duration::from_millis(20))
        .build()
        .expect("build");
    let b = builder(cluster.urls()).build().expect("build");
    support::warm(&b).await;
    let mut lock_a = a
        .try_lock_with_ttl("expiring", Duration::from_millis(300))
        .await
        .expect("lock");
    wait_for(
        "A's key to expire on every node",
        Duration::from_secs(5),
        || async {
            let mut gone = true;
            for i in 0..3 {
                gone &= cluster.get(i, lock_a.key()).await.is_none();
            }
            gone
        },
    )
    .await;
    assert!(!lock_a.is_held());
    match a.extend(&mut lock_a, Duration::from_secs(1)).await {
        Err(LockError::NotHeld {
            held_on: 0,
            needed: 2,
            ..
        }) => {}
        other => panic!("expected NotHeld, got {other:?}"),
    }
    let lock_b = b.try_lock("expiring").await.expect("B takes the free lock");
    let report = a.unlock(&lock_a).await;
    assert_eq!(report.released(), 0);
    assert_eq!(report.not_held(), 3);
    for i in 0..3 {
        assert_eq!(
            cluster.get(i, lock_b.key()).await.as_deref(),
            Some(lock_b.value()),
            "B's key on node {i}"
        );
    }
    match a.extend(&mut lock_a, Duration::from_secs(1)).await {
        Err(LockError::NotHeld { held_on: 0, .. }) => {}
        other => panic!("extend of a lock taken over: expected NotHeld, got {other:?}"),
    }
    assert_eq!(b.unlock(&lock_b).await.released(), 3);
}

#[tokio::test]
async fn extend_of_a_lock_replaced_on_a_majority_is_not_held_and_touches_nothing() {
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    let mut lock = redlock.try_lock("replaced").await.expect("lock");
    for i in [0, 2] {
        let mut conn = cluster.raw(i).await;
        let _: () = conn.set(lock.key(), "intruder").await.expect("SET");
    }
    let before = lock.valid_until();
    match redlock.extend(&mut lock, Duration::from_secs(30)).await {
        Err(LockError::NotHeld {
            held_on, needed: 2, ..
        }) => assert!(held_on <= 1),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert_eq!(
        lock.valid_until(),
        before,
        "a failed extension keeps the old deadline"
    );
    for i in [0, 2] {
        let mut conn = cluster.raw(i).await;
        let pttl: i64 = conn.pttl(lock.key()).await.expect("PTTL");
        assert_eq!(pttl, -1, "the intruder's key got a TTL on node {i}");
    }
    let report = redlock.unlock(&lock).await;
    assert_eq!((report.released(), report.not_held()), (1, 2));
}

#[tokio::test]
async fn extend_moves_the_deadline_and_the_ttl_on_the_nodes() {
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    let mut lock = redlock
        .try_lock_with_ttl("extended", Duration::from_secs(2))
        .await
        .expect("lock");
    let before = lock.valid_until();
    redlock
        .extend(&mut lock, Duration::from_secs(30))
        .await
        .expect("extend");
    assert!(lock.valid_until() > before + Duration::from_secs(20));
    assert_eq!(lock.ttl(), Duration::from_secs(30));
    for i in 0..3 {
        let mut conn = cluster.raw(i).await;
        let pttl: i64 = conn.pttl(lock.key()).await.expect("PTTL");
        assert!(pttl > 20_000, "node {i}: {pttl}");
    }
    assert_eq!(redlock.unlock(&lock).await.released(), 3);
}

#[tokio::test]
async fn validity_is_below_the_ttl_and_shrinks_with_latency() {
    let cluster = Cluster::start(3);
    let mut proxies = Vec::new();
    for node in &cluster.nodes {
        proxies.push(FaultProxy::start(node.addr()).await);
    }
    let ttl = Duration::from_secs(5);
    let drift = tower_redlock::quorum::drift(ttl, tower_redlock::defaults::DEFAULT_DRIFT_FACTOR);
    let redlock = support::builder(proxies.iter().map(FaultProxy::url).collect::<Vec<_>>())
        .ttl(ttl)
        .node_timeout(Duration::from_millis(400))
        .build()
        .expect("build");
    support::warm(&redlock).await;
    let fast = redlock.try_lock("validity-fast").await.expect("lock");
    let fast_validity = fast.valid_until() - fast.started();
    assert!(fast_validity <= ttl - drift, "{fast_validity:?}");
    for p in &proxies {
        p.set_delay(Duration::from_millis(40));
    }
    let slow = redlock.try_lock("validity-slow").await.expect("lock");
    let slow_validity = slow.valid_until() - slow.started();
    // A round trip now takes at least 80 ms (40 ms each way).
    assert!(
        slow_validity <= ttl - drift - Duration::from_millis(80),
        "{slow_validity:?}"
    );
    assert!(slow_validity < fast_validity);
}

#[tokio::test]
async fn values_are_the_client_id_and_20_random_bytes_unique_across_100_000_acquisitions() {
    let cluster = Cluster::start(1);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    let values: Vec<String> = futures_util::stream::iter(0..100_000u32)
        .map(|i| {
            let redlock = redlock.clone();
            async move {
                let lock: Lock = redlock.try_lock(i.to_be_bytes()).await.expect("lock");
                lock.value().to_owned()
            }
        })
        .buffer_unordered(128)
        .collect()
        .await;
    let mut seen = HashSet::with_capacity(values.len());
    for v in values {
        assert_eq!(
            v.len(),
            56,
            "the client's id (16 hex digits), 20 bytes hex-encoded"
        );
        assert!(v.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(seen.insert(v), "duplicate value");
    }
    assert_eq!(seen.len(), 100_000);
}

#[tokio::test]
async fn a_waiter_gets_the_lock_after_the_holder_unlocks() {
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls())
        .max_attempts(200)
        .retry_delay(Duration::from_millis(10), Duration::from_millis(10))
        .build()
        .expect("build");
    support::warm(&redlock).await;
    let holder = redlock.lock("handover").await.expect("lock");
    let before = cluster.command_calls(0, "evalsha").await;
    let waiter = {
        let redlock = redlock.clone();
        tokio::spawn(async move {
            let lock = redlock.lock("handover").await;
            (lock, Instant::now())
        })
    };
    // The waiter's first attempt failed (acquire + release reached node 0) ...
    wait_for(
        "the waiter to fail an attempt",
        Duration::from_secs(5),
        || async { cluster.command_calls(0, "evalsha").await >= before + 2 },
    )
    .await;
    // ... then the holder lets go.
    let released_at = Instant::now();
    assert_eq!(redlock.unlock(&holder).await.released(), 3);
    let (lock, got_at) = waiter.await.expect("task");
    let lock = lock.expect("the waiter gets the lock");
    assert!(lock.attempts() >= 2, "attempts: {}", lock.attempts());
    assert!(lock.attempts() <= 200);
    assert!(got_at > released_at);
    let _ = redlock.unlock(&lock).await;
}

#[tokio::test]
async fn lock_honours_the_retry_deadline() {
    let cluster = Cluster::start(3);
    let holder_client = builder(cluster.urls()).build().expect("build");
    let holder = holder_client.lock("deadline").await.expect("lock");
    let deadline = Duration::from_millis(300);
    let waiter = builder(cluster.urls())
        .max_attempts(10_000)
        .retry_delay(Duration::from_millis(20), Duration::from_millis(20))
        .retry_deadline(Some(deadline))
        .build()
        .expect("build");
    support::warm(&waiter).await;
    let t = Instant::now();
    let err = waiter.lock("deadline").await.expect_err("held all along");
    let took = t.elapsed();
    match err {
        LockError::Busy { attempts, .. } => assert!(attempts > 1, "{attempts}"),
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(took >= deadline, "gave up early: {took:?}");
    assert!(
        took < deadline + Duration::from_millis(30),
        "overran: {took:?}"
    );
    let _ = holder_client.unlock(&holder).await;
}

#[tokio::test]
async fn max_attempts_bounds_the_retries() {
    let cluster = Cluster::start(1);
    // A short TTL kept alive by a guard: each retry waits at most the holder's remaining
    // TTL (waiting means waiting), and the holder never lets go.
    let redlock = support::builder(cluster.urls())
        .ttl(Duration::from_millis(500))
        .node_timeout(Duration::from_millis(50))
        .max_attempts(4)
        .retry_delay(Duration::from_millis(1), Duration::from_millis(1))
        .build()
        .expect("build");
    let holder = redlock.acquire("bounded").await.expect("lock");
    match redlock.lock("bounded").await {
        Err(LockError::Busy { attempts: 4, .. }) => {}
        other => panic!("expected Busy after 4 attempts, got {other:?}"),
    }
    let _ = holder.release().await;
}

#[tokio::test]
async fn bad_configurations_get_typed_errors() {
    let one = || vec!["redis://127.0.0.1:1".to_owned()];
    let check = |b: RedlockBuilder, pred: fn(&ConfigError) -> bool| {
        let err = b.build().expect_err("must be refused");
        assert!(pred(&err), "wrong error: {err:?}");
        assert!(!err.to_string().is_empty());
    };
    check(support::builder(Vec::<String>::new()), |e| {
        matches!(e, ConfigError::NoNodes)
    });
    check(
        support::builder(["redis://127.0.0.1:1", "redis://127.0.0.1:2"]),
        |e| matches!(e, ConfigError::EvenNodeCount { nodes: 2 }),
    );
    check(
        support::builder([
            "redis://127.0.0.1:1",
            "redis://127.0.0.1:1",
            "redis://127.0.0.1:3",
        ]),
        |e| matches!(e, ConfigError::DuplicateNode { .. }),
    );
    check(support::builder(["not a url"]), |e| {
        matches!(e, ConfigError::InvalidUrl { .. })
    });
    check(support::builder(["http://127.0.0.1:1"]), |e| {
        matches!(e, ConfigError::InvalidUrl { .. })
    });
    let err = support::builder(["redis://user:hunter2@127.0.0.1:1/x"])
        .build()
        .expect_err("bad db");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    check(support::builder(one()).ttl(Duration::ZERO), |e| {
        matches!(e, ConfigError::ZeroTtl)
    });
    check(
        support::builder(one()).ttl(Duration::from_micros(999)),
        |e| matches!(e, ConfigError::ZeroTtl),
    );
    check(
        support::builder(one()).ttl(Duration::from_secs(2 * 24 * 3600)),
        |e| matches!(e, ConfigError::TtlTooLong { .. }),
    );
    check(
        support::builder(one())
            .ttl(Duration::from_secs(1))
            .node_timeout(Duration::from_millis(101)),
        |e| matches!(e, ConfigError::NodeTimeoutTooLong { .. }),
    );
    check(support::builder(one()).node_timeout(Duration::ZERO), |e| {
        matches!(e, ConfigError::ZeroNodeTimeout)
    });
    for f in [-0.1, 0.5, 1.0, f64::NAN] {
        check(support::builder(one()).drift_factor(f), |e| {
            matches!(e, ConfigError::DriftFactorOutOfRange { .. })
        });
    }
    check(support::builder(one()).max_attempts(0), |e| {
        matches!(e, ConfigError::ZeroAttempts)
    });
    check(
        support::builder(one())
            .ttl(Duration::from_secs(1))
            .min_validity(Duration::from_secs(1)),
        |e| matches!(e, ConfigError::MinValidityTooLong { .. }),
    );
    check(
        support::builder(one()).connect_timeout(Duration::ZERO),
        |e| matches!(e, ConfigError::ZeroConnectTimeout),
    );
    // The bounds themselves are accepted.
    support::builder(one())
        .ttl(Duration::from_secs(1))
        .node_timeout(Duration::from_millis(100))
        .drift_factor(0.0)
        .build()
        .expect("timeout of exactly TTL/10");
}

#[tokio::test]
async fn bad_per_call_settings_and_names_get_typed_errors() {
    let cluster = Cluster::start(1);
    let redlock = builder(cluster.urls()).build().expect("build");
    assert!(matches!(
        redlock.try_lock("").await,
        Err(LockError::InvalidName { .. })
    ));
    assert!(matches!(
        redlock.try_lock_with_ttl("x", Duration::ZERO).await,
        Err(LockError::Config(ConfigError::ZeroTtl))
    ));
    assert!(matches!(
        redlock.lock_with_ttl("x", Duration::from_millis(100)).await,
        Err(LockError::Config(ConfigError::NodeTimeoutTooLong { .. }))
    ));
    // A huge name is hashed into a short key and works.
    let huge = vec![b'n'; 1 << 20];
    let lock = redlock.try_lock(&huge).await.expect("huge name");
    assert!(lock.key().len() < 100);
    assert_eq!(lock.name().len(), 1 << 20);
    assert!(matches!(
        redlock.try_lock(&huge).await,
        Err(LockError::Busy { .. })
    ));
    assert_eq!(redlock.unlock(&lock).await.released(), 1);
}

#[tokio::test]
async fn a_node_that_speaks_garbage_is_a_clear_per_node_error() {
    let garbage = GarbageServer::start().await;
    let redlock = builder(vec![garbage.url()]).build().expect("build");
    match redlock.try_lock("g").await {
        Err(LockError::NoQuorum { failures, .. }) => {
            assert_eq!(failures.len(), 1);
            assert_eq!(failures[0].node, format!("127.0.0.1:{}", garbage.port));
            assert!(
                matches!(failures[0].error, NodeError::Protocol(_)),
                "{:?}",
                failures[0].error
            );
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    // With two real nodes beside it, the quorum holds.
    let cluster = Cluster::start(2);
    let mut urls = cluster.urls();
    urls.push(garbage.url());
    let redlock = builder(urls).build().expect("build");
    let lock = redlock.lock("g").await.expect("2 of 3");
    let report = redlock.unlock(&lock).await;
    assert_eq!(report.released(), 2);
    assert_eq!(report.failures().len(), 1);
}

#[tokio::test]
async fn a_wrongtype_key_is_a_clear_per_node_error() {
    let cluster = Cluster::start(3);
    let base = builder(cluster.urls()).build().expect("build");
    for i in 0..3 {
        let mut conn = cluster.raw(i).await;
        let _: () = conn.lpush("redlock:{listy}", "x").await.expect("LPUSH");
    }
    for fencing in [true, false] {
        match base.with_fencing(fencing).try_lock("listy").await {
            Err(LockError::NoQuorum {
                failures,
                reached: 0,
                ..
            }) => {
                assert!(failures.len() >= 2, "{failures:?}");
                for f in &failures {
                    match &f.error {
                        NodeError::Redis(text) => {
                            assert!(text.contains("WRONGTYPE"), "{text}");
                            // The redis error behind it stays reachable for callers.
                            let source = std::error::Error::source(&f.error).expect("a source");
                            assert!(source.is::<redis::RedisError>(), "{source:?}");
                        }
                        other => panic!("expected a Redis error, got {other:?}"),
                    }
                }
            }
            other => panic!("expected NoQuorum, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_hung_node_at_connect_time_does_not_stall() {
    // A listener that accepts but never answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hung_url = format!("redis://{}", hung.local_addr().expect("addr"));
    let cluster = Cluster::start(2);
    let mut urls = cluster.urls();
    urls.push(hung_url);
    let redlock = builder(urls).build().expect("build");
    for i in 0..5 {
        let t = Instant::now();
        let lock = redlock.lock(format!("hung-{i}")).await.expect("2 of 3");
        assert!(
            t.elapsed() < NODE_TIMEOUT + Duration::from_millis(40),
            "{:?}",
            t.elapsed()
        );
        let t = Instant::now();
        let _ = redlock.unlock(&lock).await;
        assert!(
            t.elapsed() < NODE_TIMEOUT + Duration::from_millis(40),
            "{:?}",
            t.elapsed()
        );
    }
}

#[tokio::test]
async fn a_flushed_script_cache_falls_back_to_eval() {
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    for i in 0..3 {
        let mut conn = cluster.raw(i).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .expect("SCRIPT FLUSH");
    }
    let lock = redlock
        .try_lock("flushed")
        .await
        .expect("lock after SCRIPT FLUSH");
    // Nodes beyond the quorum may not have been awaited (see `Redlock::lock`).
    assert!(redlock.unlock(&lock).await.released() >= 2);
    // The fallback EVAL cached the scripts again on the nodes that answered.
    let mut recached = 0;
    for i in 0..3 {
        let mut conn = cluster.raw(i).await;
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await
            .expect("INFO");
        let scripts = info
            .lines()
            .find_map(|l| l.strip_prefix("number_of_cached_scripts:"))
            .and_then(|n| n.trim().parse::<u32>().ok())
            .expect("number_of_cached_scripts");
        // The release (a fenced acquisition is plain commands, and phase 2 of fencing,
        // which is a script, runs only when a quorum refused the proposal).
        recached += usize::from(scripts >= 1);
    }
    assert!(
        recached >= 2,
        "the scripts that ran are cached again on a quorum"
    );
}

#[tokio::test]
async fn dropping_an_acquisition_half_way_releases_what_landed() {
    let cluster = Cluster::start(1);
    let proxy = FaultProxy::start(cluster.nodes[0].addr()).await;
    let redlock = support::builder(vec![proxy.url()])
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_millis(2_000))
        .build()
        .expect("build");
    support::warm(&redlock).await;
    proxy.set_delay(Duration::from_millis(300));
    let attempt = {
        let redlock = redlock.clone();
        tokio::spawn(async move { redlock.try_lock("dropped").await })
    };
    // The SET reached the node; its reply is still on its way back through the proxy.
    wait_for("the SET to land", Duration::from_secs(5), || async {
        cluster.get(0, b"redlock:{dropped}").await.is_some()
    })
    .await;
    attempt.abort();
    assert!(attempt.await.expect_err("aborted").is_cancelled());
    wait_for("the background release", Duration::from_secs(5), || async {
        cluster.get(0, b"redlock:{dropped}").await.is_none()
    })
    .await;
}

#[tokio::test]
async fn an_unfenced_acquisition_is_one_plain_set_per_node() {
    let cluster = Cluster::start(1);
    let redlock = cluster.client(|b| b.fencing(false)).await;
    cluster.reset_stats().await;
    let lock = redlock.try_lock("plain").await.expect("free");
    let _ = redlock.unlock(&lock).await;
    assert_eq!(cluster.command_calls(0, "set").await, 1);
    // The release is the one script: compare-and-delete.
    assert_eq!(cluster.command_calls(0, "evalsha").await, 1);
    assert_eq!(cluster.command_calls(0, "eval").await, 0);
}

/// Releases sent to a node while others are on their way go out together, as one script
/// call, and each still gets its own answer: deleted, not held (another value there), or
/// the error of its own key (a list), without failing the others. On our own connection
/// the releases of one write are merged; on redis-rs's (RESP3 here) those queued behind
/// the release on its way go out as batches.
#[tokio::test]
async fn concurrent_releases_go_out_together_and_each_gets_its_own_answer() {
    concurrent_releases_go_out_together("").await;
}

#[tokio::test]
async fn concurrent_releases_over_resp3_go_out_together_and_each_gets_its_own_answer() {
    concurrent_releases_go_out_together("/?protocol=resp3").await;
}

async fn concurrent_releases_go_out_together(url_tail: &str) {
    const LOCKS: usize = 40;
    let cluster = Cluster::start(3);
    let redlock = cluster.client_over(url_tail, |b| b.fencing(false)).await;
    let mut locks = Vec::new();
    for i in 0..LOCKS {
        locks.push(redlock.try_lock(format!("batch-{i}")).await.expect("free"));
    }
    // Lock 5's key on node 0 becomes a list; lock 7's key on node 1 another client's value.
    let mut conn = cluster.raw(0).await;
    let _: () = conn.del("redlock:{batch-5}").await.expect("DEL");
    let _: () = conn.lpush("redlock:{batch-5}", "x").await.expect("LPUSH");
    let mut conn = cluster.raw(1).await;
    let _: () = conn
        .set("redlock:{batch-7}", "someone-else")
        .await
        .expect("SET");
    cluster.reset_stats().await;
    let released = futures_util::future::join_all(locks.iter().map(|l| redlock.unlock(l))).await;
    for (i, r) in released.iter().enumerate() {
        match i {
            5 => {
                assert_eq!((r.released(), r.not_held()), (2, 0), "{r:?}");
                assert_eq!(r.failures().len(), 1, "{r:?}");
                assert!(r.failures()[0].to_string().contains("WRONGTYPE"), "{r:?}");
            }
            7 => assert_eq!((r.released(), r.not_held()), (2, 1), "{r:?}"),
            _ => assert_eq!(
                (r.released(), r.failures().len()),
                (3, 0),
                "lock {i}: {r:?}"
            ),
        }
    }
    for node in 0..3 {
        let scripts = cluster.command_calls(node, "evalsha").await;
        assert!(
            scripts <= LOCKS as u64 / 4,
            "{scripts} script calls for {LOCKS} releases on node {node}: not batched"
        );
        // Each script read its keys at once (a batch's `MGET`, a lone release's `GET`),
        // and on node 0 lock 5's key once more if a batch read it: `MGET` reads a list
        // as nil, and `GET` gives its error.
        let reads =
            cluster.command_calls(node, "get").await + cluster.command_calls(node, "mget").await;
        assert!(
            (scripts..=scripts + u64::from(node == 0)).contains(&reads),
            "{reads} reads by {scripts} script calls on node {node}"
        );
    }
    for i in (0..LOCKS).filter(|i| ![5, 7].contains(i)) {
        assert_eq!(
            cluster
                .nodes_holding(format!("redlock:{{batch-{i}}}"))
                .await,
            0
        );
    }
    assert_eq!(
        cluster.get(1, "redlock:{batch-7}").await.as_deref(),
        Some("someone-else")
    );
}

/// Releases queued behind a release to a hung node give up at their deadline like any
/// call, the others' answers are not held up, and the node takes releases again once it
/// answers.
#[tokio::test]
async fn releases_queued_behind_a_hung_node_time_out_and_it_recovers() {
    let mut cluster = Cluster::start(3);
    let redlock = cluster.client(|b| b).await;
    let mut locks = Vec::new();
    for i in 0..10 {
        locks.push(redlock.try_lock(format!("hung-{i}")).await.expect("free"));
    }
    cluster.nodes[2].pause();
    let released = futures_util::future::join_all(locks.iter().map(|l| redlock.unlock(l))).await;
    for r in &released {
        assert_eq!(r.released(), 2, "{r:?}");
        assert!(
            matches!(r.failures(), [f] if f.error == NodeError::Timeout),
            "{r:?}"
        );
    }
    cluster.nodes[2].resume();
    wait_for(
        "the resumed node to take releases again",
        Duration::from_secs(10),
        || async {
            let lock = redlock.lock("hung-after").await.expect("lock");
            redlock.unlock(&lock).await.released() == 3
        },
    )
    .await;
}

/// A node connection the server cuts (`CLIENT KILL`) fails the calls on it at once with a
/// connection error, never a timeout, and is replaced without user action.
#[tokio::test]
async fn a_connection_the_server_cuts_fails_fast_and_is_replaced() {
    let cluster = Cluster::start(1);
    let redlock = builder(cluster.urls())
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_secs(2))
        .max_attempts(1)
        .build()
        .expect("build");
    support::warm(&redlock).await;
    let held = redlock.try_lock("cut-held").await.expect("lock");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut cluster.raw(0).await)
        .await
        .expect("CLIENT KILL");
    assert!(killed >= 1, "the client's connection was cut");
    let mut attempts = 0;
    wait_for("a new connection", Duration::from_secs(10), || {
        attempts += 1;
        let redlock = &redlock;
        let attempt = attempts;
        async move {
            let t = Instant::now();
            match redlock.try_lock(format!("cut-{attempt}")).await {
                Ok(lock) => {
                    let _ = redlock.unlock(&lock).await;
                    true
                }
                Err(LockError::NoQuorum { failures, .. }) => {
                    assert!(
                        t.elapsed() < Duration::from_secs(1),
                        "a cut connection waited for the 2 s node timeout: {failures:?}"
                    );
                    for f in &failures {
                        assert!(
                            matches!(f.error, NodeError::Connection(_) | NodeError::Refused),
                            "{failures:?}"
                        );
                    }
                    false
                }
                Err(other) => panic!("{other:?}"),
            }
        }
    })
    .await;
    // The lock taken before the cut is still there and released on the new connection.
    assert_eq!(redlock.unlock(&held).await.released(), 1);
}

/// `Duration::MAX` is a legal setting everywhere: a typed error where it cannot work, and
/// "no limit" where it means that; never a panic, a hang or a silent stop.
#[tokio::test]
async fn duration_max_settings_give_typed_errors_or_mean_no_limit() {
    let cluster = Cluster::start(1);
    let urls = cluster.urls();
    assert!(matches!(
        builder(urls.clone()).node_timeout(Duration::MAX).build(),
        Err(ConfigError::NodeTimeoutTooLong { .. })
    ));
    assert!(matches!(
        builder(urls.clone()).min_validity(Duration::MAX).build(),
        Err(ConfigError::MinValidityTooLong { .. })
    ));
    // No connect timeout: the node is still used.
    let patient = builder(urls.clone())
        .connect_timeout(Duration::MAX)
        .build()
        .expect("build");
    support::warm(&patient).await;
    // An endless retry delay and deadline: the waiter sleeps until the release wakes it.
    let holder = cluster.client(|b| b).await;
    let lock = holder.lock("max-delay").await.expect("lock");
    let waiter = cluster
        .client(|b| {
            b.retry_delay(Duration::MAX, Duration::MAX)
                .retry_deadline(Some(Duration::MAX))
        })
        .await;
    let task = tokio::spawn(async move { waiter.lock("max-delay").await.map(|l| l.attempts()) });
    wait_for("the waiter to queue", Duration::from_secs(5), || async {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("redlock:{max-delay}")
            .query_async(&mut cluster.raw(0).await)
            .await
            .expect("PUBSUB NUMSUB");
        n == 1
    })
    .await;
    let _ = holder.unlock(&lock).await;
    let attempts = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("woken by the release")
        .expect("task")
        .expect("the waiter gets the lock");
    assert!(attempts >= 2, "{attempts}");
    // No maximum hold: the guard keeps extending.
    let unlimited = cluster
        .client(|b| {
            b.ttl(Duration::from_millis(600))
                .node_timeout(Duration::from_millis(50))
                .max_hold(Some(Duration::MAX))
        })
        .await;
    let guard = unlimited.acquire("max-hold").await.expect("acquire");
    let first = guard.valid_until();
    wait_for("two extensions", Duration::from_secs(5), || {
        let extended = guard.valid_until() > first + Duration::from_millis(300);
        async move { extended }
    })
    .await;
    assert!(guard.is_held());
    let _ = guard.release().await;
}

/// The ACL line in the README is enough for every feature (fencing, quarantine, waking
/// waiters), and `INFO` is only needed by the restart quarantine.
#[tokio::test]
async fn the_readme_acl_rule_is_enough_and_info_is_only_for_the_quarantine() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let rule = readme
        .lines()
        .find(|l| l.starts_with("ACL SETUSER locker "))
        .expect("the README's ACL line");
    let cluster = Cluster::start(1);
    let mut admin = cluster.raw(0).await;
    let mut acl = redis::cmd("ACL");
    for word in rule.split_whitespace().skip(1) {
        acl.arg(word);
    }
    let _: () = acl
        .query_async(&mut admin)
        .await
        .expect("the README's ACL rule");
    let url = format!(
        "redis://locker:secret@127.0.0.1:{}",
        cluster.nodes[0].port()
    );
    let ttl = Duration::from_secs(1);
    cluster.age_ledgers(); // the quarantine stays on
    let client = |quarantine: bool| {
        tower_redlock::Redlock::builder([url.clone()])
            .ttl(ttl)
            .node_timeout(Duration::from_millis(50))
            .restart_quarantine(quarantine)
            .build()
            .expect("build")
    };
    let redlock = client(true);
    support::warm(&redlock).await;
    // A waiter behind a holder is woken by the release (SUBSCRIBE is allowed).
    let held = redlock.lock("acl-job").await.expect("lock");
    let waiter = {
        let redlock = redlock.clone();
        tokio::spawn(async move { redlock.lock("acl-job").await.map(|l| l.fencing_token()) })
    };
    let _ = redlock.unlock(&held).await;
    let fenced = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the lock")
        .expect("task")
        .expect("lock");
    assert!(fenced.is_some(), "fencing works with the rule");
    // Without INFO: the quarantine says what it needs; without the quarantine it works.
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "locker", "-info"])
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER -info");
    match client(true).try_lock("acl-job").await {
        Err(LockError::NoQuorum { failures, .. }) => {
            let text = failures[0].to_string();
            assert!(
                text.contains("INFO") && text.contains("restart_quarantine"),
                "{text}"
            );
        }
        other => panic!("expected a failure that names INFO, got {other:?}"),
    }
    let plain = client(false);
    support::warm(&plain).await;
}

/// Waiting means waiting: `lock()` with 40 attempts 50-150 ms apart (a waiting time of
/// 6 s) outlasts a holder that never releases (its key expires after 2 s) and a restart
/// quarantine of about 2 s in a few attempts, instead of spending them in a second.
#[tokio::test]
async fn lock_waits_across_the_holders_ttl_and_the_quarantine() {
    let cluster = Cluster::start(3);
    let holder = cluster
        .client(|b| {
            b.ttl(Duration::from_secs(2))
                .node_timeout(Duration::from_millis(100))
        })
        .await;
    let abandoned = holder.lock("abandoned").await.expect("lock");
    let waiter = cluster.client(|b| b.max_attempts(40)).await;
    let t = Instant::now();
    let lock = waiter
        .lock("abandoned")
        .await
        .expect("the key expires, then it is ours");
    assert!(
        t.elapsed()
            >= abandoned
                .remaining()
                .saturating_sub(Duration::from_millis(50))
    );
    assert!(lock.attempts() <= 4, "{} attempts", lock.attempts());
    let _ = waiter.unlock(&lock).await;

    // Fresh nodes and the quarantine on: kept out for about 2 s (the TTL minus uptime).
    let young = Cluster::start(3);
    let quarantined = tower_redlock::Redlock::builder(young.urls())
        .ttl(Duration::from_secs(2))
        .node_timeout(Duration::from_millis(100))
        .max_attempts(40)
        .build()
        .expect("build");
    let lock = quarantined
        .lock("after-quarantine")
        .await
        .expect("waits out the quarantine");
    assert!(lock.attempts() <= 4, "{} attempts", lock.attempts());
    let _ = quarantined.unlock(&lock).await;
}

/// Once the quorum has answered, the calls still out complete in the background: 512
/// concurrent locks from a fresh client (some nodes still connecting) land on all 5
/// nodes, and a release right after the acquisition leaves no key behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_land_on_every_healthy_node_not_only_a_quorum() {
    let cluster = Cluster::start(5);
    // Healthy nodes answer within the per-node timeout, even on a loaded machine.
    let redlock = support::builder(cluster.urls())
        .fencing(false)
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_secs(2))
        .build()
        .expect("build");
    let locks: Vec<Lock> = futures_util::stream::iter(0..512)
        .map(|i| {
            let redlock = redlock.clone();
            async move { redlock.lock(format!("land-{i}")).await.expect("lock") }
        })
        .buffer_unordered(512)
        .collect()
        .await;
    let dbsizes = || async {
        let mut sizes = Vec::new();
        for i in 0..5 {
            let n: u64 = redis::cmd("DBSIZE")
                .query_async(&mut cluster.raw(i).await)
                .await
                .expect("DBSIZE");
            sizes.push(n);
        }
        sizes
    };
    wait_for(
        "every lock on all 5 nodes",
        Duration::from_secs(10),
        || async { dbsizes().await == [512; 5] },
    )
    .await;
    // Locks released at once after a fresh acquisition leave nothing behind either.
    let fresh = support::builder(cluster.urls())
        .fencing(false)
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_secs(2))
        .key_prefix("released:")
        .build()
        .expect("build");
    for i in 0..64 {
        let lock = fresh.lock(format!("gone-{i}")).await.expect("lock");
        let released = fresh.unlock(&lock).await;
        assert!(released.released() >= 3, "{released:?}");
    }
    assert_eq!(
        dbsizes().await,
        [512; 5],
        "released locks leave no key behind"
    );
    for lock in &locks {
        let _ = redlock.unlock(lock).await;
    }
}

/// Addresses of one server (another host name and database, a proxy) count once: the
/// later one is left out with an error that says why, instead of the server counting
/// twice toward the quorum.
#[tokio::test]
async fn one_server_given_twice_counts_once() {
    let cluster = Cluster::start(2);
    let port = cluster.nodes[0].port();
    // A proxy in front of the server is one more address of it.
    let proxy = FaultProxy::start(cluster.nodes[0].addr()).await;
    let aliases = [
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}/1"),
        proxy.url(),
    ];
    let one_server = builder(aliases.to_vec()).build().expect("build");
    let err = one_server
        .try_lock("twice")
        .await
        .expect_err("one server cannot make a quorum of 2");
    let LockError::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err:?}");
    };
    let same: Vec<_> = failures
        .iter()
        .filter(|f| matches!(f.error, NodeError::SameServer { .. }))
        .collect();
    assert_eq!(same.len(), 2, "{err}");
    assert!(err.to_string().contains("same Redis server"), "{err}");
    // With another server beside it, the lock is held by the two real servers (database 0
    // on both addresses, so that the check below sees the key whichever address counts).
    let urls = vec![
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}"),
        cluster.nodes[1].url(),
    ];
    let two_servers = builder(urls).build().expect("build");
    let lock = two_servers.lock("twice").await.expect("2 of 3");
    assert_eq!(cluster.nodes_holding(lock.key()).await, 2);
}

/// A connect task dropped unfinished (its runtime shut down while the server hung) does
/// not leave the node "connecting" forever: a later runtime connects again.
#[test]
fn a_connect_cut_short_by_a_runtime_shutdown_does_not_wedge_the_node() {
    let mut node = support::RedisNode::start();
    let redlock = builder(vec![node.url()])
        .node_timeout(Duration::from_millis(100))
        .connect_timeout(Duration::from_secs(60))
        .build()
        .expect("build");
    node.pause();
    let first = tokio::runtime::Runtime::new().expect("runtime");
    let err = first
        .block_on(redlock.try_lock("cut-short"))
        .expect_err("the server hangs");
    assert!(matches!(err, LockError::NoQuorum { .. }), "{err:?}");
    drop(first); // drops the connect task, still waiting for the paused server
    node.resume();
    let second = tokio::runtime::Runtime::new().expect("runtime");
    second.block_on(async {
        wait_for(
            "the node to connect again",
            Duration::from_secs(10),
            || async { redlock.try_lock("cut-short").await.is_ok() },
        )
        .await;
    });
}

/// Health: per node up / quarantined / down with the cause, round trip, version and role,
/// and whether a quorum is usable now. Inspection: what the nodes hold for a name.
#[tokio::test]
async fn health_and_inspection_tell_what_the_nodes_hold() {
    let mut cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    let health = redlock.health().await;
    assert!(health.ready(), "{health:?}");
    assert_eq!((health.usable(), health.quorum()), (3, 2));
    for node in health.nodes() {
        assert_eq!(node.status(), &tower_redlock::NodeStatus::Up, "{node:?}");
        assert!(node.round_trip().is_some());
        assert!(node.version().is_some_and(|v| !v.is_empty()), "{node:?}");
        assert_eq!(node.role(), Some("master"));
    }

    let lock = redlock.lock("inspected").await.expect("lock");
    let seen = redlock.inspect("inspected").await.expect("inspect");
    assert_eq!((seen.held_on(), seen.nodes(), seen.record_on()), (3, 3, 0));
    assert!(seen.is_held(redlock.quorum()));
    assert!(
        seen.remaining()
            .is_some_and(|r| r <= Duration::from_secs(5)),
        "{seen:?}"
    );
    assert_eq!(seen.fencing(), lock.fencing_token());
    let _ = redlock.unlock(&lock).await;
    let gone = redlock.inspect("inspected").await.expect("inspect");
    assert_eq!((gone.held_on(), gone.remaining()), (0, None));
    assert_eq!(
        gone.fencing(),
        lock.fencing_token(),
        "counters outlive the lock"
    );
    assert!(matches!(
        redlock.inspect("").await,
        Err(LockError::InvalidName { .. })
    ));

    cluster.nodes[0].kill();
    let health = redlock.health().await;
    assert!(health.ready(), "2 of 3 still make a quorum");
    assert!(matches!(
        health.nodes()[0].status(),
        tower_redlock::NodeStatus::Down(NodeError::Refused | NodeError::Connection(_))
    ));
    cluster.nodes[1].kill();
    assert!(!redlock.health().await.ready());

    // New nodes under the restart quarantine are up but not usable.
    let fresh = Cluster::start(3);
    let quarantined = tower_redlock::Redlock::builder(fresh.urls())
        .build()
        .expect("build");
    let health = quarantined.health().await;
    assert!(!health.ready(), "{health:?}");
    assert!(
        health
            .nodes()
            .iter()
            .all(|n| matches!(n.status(), tower_redlock::NodeStatus::Quarantined { .. }))
    );
}

/// The no-quorum error of a restart quarantine counts what it knows: every quarantined
/// node (all 3 of a fresh stack, not the 2 that decided the round), and no "0 granted" for
/// a healthy node whose answer was not awaited once the quarantine left no quorum.
#[tokio::test]
async fn the_quarantine_error_counts_the_quarantined_nodes_and_no_unawaited_grant() {
    let ttl = Duration::from_secs(2);
    let quarantined = |urls| {
        tower_redlock::Redlock::builder(urls)
            .ttl(ttl)
            .node_timeout(NODE_TIMEOUT)
            .build()
            .expect("build")
    };
    let fresh = Cluster::start(3);
    let all = quarantined(fresh.urls());
    assert!(!all.health().await.ready()); // connected, each node without a ledger
    let error = all.try_lock("fresh").await.expect_err("quarantined");
    let text = error.to_string();
    assert!(
        text.contains("3 node(s) are in the restart quarantine"),
        "{text}"
    );
    assert!(!text.contains("granted"), "{text}");

    // Two nodes restarted empty next to one that kept its ledger (made by a first client,
    // whose quarantine of the new nodes is over).
    let mut mixed = Cluster::start(3);
    let first = quarantined(mixed.urls());
    // Every node in service, not only a quorum: the third's quarantine may end a moment
    // after the first two's, and the new client would count it too.
    wait_for(
        "the ledgers made and every node in service",
        ttl * 5,
        || async { first.health().await.usable() == 3 },
    )
    .await;
    mixed.nodes[0].restart();
    mixed.nodes[1].restart();
    let two = quarantined(mixed.urls());
    assert!(!two.health().await.ready());
    for _ in 0..20 {
        let text = two
            .try_lock("mixed")
            .await
            .expect_err("quarantined")
            .to_string();
        assert!(
            text.contains("2 node(s) are in the restart quarantine"),
            "{text}"
        );
        assert!(!text.contains("0 granted"), "{text}");
    }
}
