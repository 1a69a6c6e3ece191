//! Fencing numbers against real redis-server nodes: they strictly increase with lock order,
//! through node failures and data loss, and a fenced store rejects a stale holder's write.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use support::Cluster;
use support::fenced::{FencedStore, Write};
use support::jepsen::Rng;
use tower_redlock::{Lock, RedlockBuilder};

/// A counter value far above any clock reading in microseconds (about 1.8e15 in 2026, this
/// is 2096), and still exact as a sorted set's score (below 2^53): once the counters start
/// there, proposals are refused and only the max-register can make numbers grow.
const FAR_FUTURE: u64 = 4_000_000_000_000_000;

fn builder(urls: Vec<String>) -> RedlockBuilder {
    support::builder(urls)
        .ttl(Duration::from_secs(5))
        .node_timeout(Duration::from_millis(100))
}

fn token(lock: &Lock) -> u64 {
    lock.fencing_token().expect("fencing is on by default")
}

/// The key of the sorted set that holds the fencing counter of `name` (default prefix,
/// nodes without a Redis Cluster), and its member whose score is the counter.
fn counter_key(name: &str) -> (Vec<u8>, Vec<u8>) {
    tower_redlock::fencing::counter_of(b"redlock:", name.as_bytes(), false).expect("a valid name")
}

/// Sets the counter of `name` (default prefix) on every node.
async fn seed_counters(cluster: &Cluster, name: &str, value: u64) {
    let (key, member) = counter_key(name);
    for i in 0..cluster.nodes.len() {
        let mut conn = cluster.raw(i).await;
        let _: () = conn.zadd(&key, &member, value).await.expect("ZADD");
    }
}

async fn counter_on(cluster: &Cluster, i: usize, name: &str) -> Option<u64> {
    let (key, member) = counter_key(name);
    let mut conn = cluster.raw(i).await;
    let score: Option<f64> = conn.zscore(key, member).await.expect("ZSCORE");
    score.map(|s| {
        assert!(s.fract() == 0.0 && s >= 0.0, "counter {s}");
        s as u64
    })
}

fn assert_strictly_increasing(tokens: &[u64]) {
    for (i, w) in tokens.windows(2).enumerate() {
        assert!(
            w[0] < w[1],
            "fencing number {} at acquisition {} is not above {} before it",
            w[1],
            i + 1,
            w[0]
        );
    }
}

#[tokio::test]
async fn extensions_keep_the_number_and_each_acquisition_gets_a_new_one() {
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    let mut lock = redlock.lock("invoice:7").await.expect("lock");
    let first = token(&lock);
    redlock
        .extend(&mut lock, Duration::from_secs(5))
        .await
        .expect("extend");
    assert_eq!(token(&lock), first, "an extension keeps the number");
    let guard = redlock.guard(lock);
    assert_eq!(guard.fencing_token(), Some(first), "the token carries it");
    let _ = guard.release().await;
    let next = redlock.lock("invoice:7").await.expect("lock again");
    assert!(token(&next) > first);
    // Phase 2 recorded the number on a quorum of nodes.
    let mut recorded = 0;
    for i in 0..3 {
        recorded += usize::from(counter_on(&cluster, i, "invoice:7").await == Some(token(&next)));
    }
    assert!(recorded >= 2, "recorded on {recorded} of 3 nodes");
}

#[tokio::test]
async fn without_fencing_there_is_no_number_and_no_counter() {
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls())
        .fencing(false)
        .build()
        .expect("build");
    assert!(!redlock.fencing());
    let lock = redlock.lock("request:abc").await.expect("lock");
    assert_eq!(lock.fencing_token(), None);
    let _ = redlock.unlock(&lock).await;
    for i in 0..3 {
        assert_eq!(counter_on(&cluster, i, "request:abc").await, None);
    }
    // A handle with fencing on shares the client and gets numbers.
    let fenced = redlock.with_fencing(true);
    let lock = fenced.lock("request:abc").await.expect("lock");
    assert!(lock.fencing_token().is_some());
}

/// A node that lost its counter answers with its clock in microseconds: numbers keep
/// growing as long as the clocks are ahead of them (see docs/fencing.md).
#[tokio::test]
async fn a_lost_counter_falls_back_to_the_clock() {
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    let lock = redlock.lock("ledger").await.expect("lock");
    let before = token(&lock);
    let _ = redlock.unlock(&lock).await;
    for i in 0..3 {
        let mut conn = cluster.raw(i).await;
        let (key, member) = counter_key("ledger");
        let _: () = conn.zrem(key, member).await.expect("ZREM");
    }
    let lock = redlock.lock("ledger").await.expect("lock");
    assert!(token(&lock) > before);
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros();
    // The number is the node's clock plus one, within the test's runtime.
    assert!(u128::from(token(&lock)) <= now_us + 1);
}

/// Calls of each of `commands` per node while `work` runs (`[node][command]`), once every
/// call has landed.
async fn calls_during<F: std::future::Future<Output = ()>, const N: usize>(
    cluster: &Cluster,
    commands: [&str; N],
    work: F,
) -> Vec<[u64; N]> {
    let mut before = Vec::new();
    for i in 0..cluster.nodes.len() {
        let mut counts = [0; N];
        for (count, command) in counts.iter_mut().zip(commands) {
            *count = cluster.command_calls(i, command).await;
        }
        before.push(counts);
    }
    work.await;
    for (i, counts) in before.iter_mut().enumerate() {
        for (count, command) in counts.iter_mut().zip(commands) {
            *count = cluster.command_calls(i, command).await - *count;
        }
    }
    before
}

/// A fresh name's proposal is accepted by every node: one round trip of plain commands
/// (`SET NX PX` and `ZADD GT CH`; no script, and no `PEXPIRE`: the set was renewed with
/// the first fenced request on each connection, the warm-up's), and the number is the
/// client's clock in microseconds.
#[tokio::test]
async fn a_fenced_acquisition_takes_one_round_trip() {
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    let lock = std::sync::Mutex::new(None);
    let calls = calls_during(&cluster, ["set", "zadd", "pexpire", "evalsha"], async {
        let held = redlock.lock("one-trip").await.expect("lock");
        *lock.lock().expect("lock slot") = Some(held);
    })
    .await;
    let lock = lock.into_inner().expect("lock slot").expect("locked");
    assert!(
        calls
            .iter()
            .all(|c| c[..3].iter().all(|n| *n <= 1) && c[3] == 0),
        "{calls:?}"
    );
    assert!(
        calls.iter().filter(|c| c[..3] == [1, 1, 0]).count() >= 2,
        "{calls:?}"
    );
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros();
    let number = u128::from(token(&lock));
    assert!(
        number <= now_us && number + 60_000_000 > now_us,
        "{number} vs {now_us}"
    );
    for i in 0..3 {
        let counter = counter_on(&cluster, i, "one-trip").await;
        assert!(
            counter.is_none_or(|c| c == token(&lock)),
            "node {i}: {counter:?}"
        );
    }
    let _ = redlock.unlock(&lock).await;
}

/// Counters above the client's clock refuse its proposal: phase 2 records one above them,
/// and from then on the client proposes above what it saw, in one round trip again.
#[tokio::test]
async fn a_refused_proposal_takes_phase_two_once_then_the_clock_catches_up() {
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    seed_counters(&cluster, "ahead", FAR_FUTURE).await;
    let mut tokens = Vec::new();
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let slot = std::sync::Mutex::new(None);
        let calls = calls_during(&cluster, ["evalsha"], async {
            *slot.lock().expect("slot") = Some(redlock.lock("ahead").await.expect("lock"));
        })
        .await;
        let lock = slot.into_inner().expect("slot").expect("locked");
        tokens.push(token(&lock));
        rounds.push(calls.into_iter().map(|[n]| n).max().unwrap_or(0));
        let _ = redlock.unlock(&lock).await;
    }
    assert_eq!(tokens[0], FAR_FUTURE + 1, "one above the counters");
    assert_strictly_increasing(&tokens);
    // The read and phase 2 are a script each; the fast path runs none.
    assert_eq!(rounds, [2, 0, 0], "phase 2 only for the first acquisition");
    // Phase 2 renews the set's expiry as phase 1 does, to a retention and a half (24 h
    // here): never shorter than what the renewals promise.
    let day_ms = 24 * 3600 * 1000;
    let set = counter_key("ahead").0;
    support::wait_for(
        "a retention and a half of expiry on every node",
        Duration::from_secs(5),
        || async {
            let mut all = true;
            for i in 0..3 {
                let left = pttl(&cluster, i, &set).await;
                all &= left > day_ms * 5 / 4 && left <= day_ms * 3 / 2;
            }
            all
        },
    )
    .await;
}

/// The counterexample of docs/fencing.md: with the maximum of per-node `INCR`s, the 21st
/// number is below the 20th; with the max-register, every number is above the one before.
/// The counters start far above the clock, so only phase 2 can make the numbers grow.
#[tokio::test]
async fn naive_incr_goes_backwards_ours_does_not() {
    let cluster = Cluster::start(5);
    let redlock = builder(cluster.urls()).build().expect("build");
    seed_counters(&cluster, "account", FAR_FUTURE).await;
    let mut conns = Vec::new();
    for i in 0..5 {
        conns.push(cluster.raw(i).await);
    }
    // (acquisitions, nodes that grant them): the others are held by a stranger's key.
    let schedule: [(usize, [usize; 3]); 3] = [(10, [0, 1, 2]), (10, [2, 3, 4]), (1, [0, 3, 4])];
    let mut ours = Vec::new();
    let mut naive = Vec::new();
    for (count, granting) in schedule {
        for (i, conn) in conns.iter_mut().enumerate() {
            if !granting.contains(&i) {
                let _: () = conn
                    .set("redlock:{account}", "stranger")
                    .await
                    .expect("SET");
            }
        }
        for _ in 0..count {
            let lock = redlock.try_lock("account").await.expect("quorum of 3");
            let t = token(&lock);
            for &i in &granting {
                assert_eq!(
                    counter_on(&cluster, i, "account").await,
                    Some(t),
                    "phase 2 recorded the number on granting node {i}"
                );
            }
            ours.push(t);
            let _ = redlock.unlock(&lock).await;
            // The naive scheme on the same nodes: INCR where granted, take the largest.
            let mut highest = 0u64;
            for &i in &granting {
                let n: u64 = conns[i].incr("naive:account", 1).await.expect("INCR");
                highest = highest.max(n);
            }
            naive.push(highest);
        }
        for conn in &mut conns {
            let _: () = conn.del("redlock:{account}").await.expect("DEL");
        }
    }
    assert_eq!(naive[19], 20);
    assert_eq!(naive[20], 11, "the naive scheme goes backwards");
    assert_strictly_increasing(&ours);
    assert!(ours[0] > FAR_FUTURE);
}

/// 16 tasks contend for one name; each records its number while it holds the lock, so the
/// record is in lock order. The counters start far above the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_tasks_get_increasing_unique_numbers() {
    let cluster = Cluster::start(5);
    let redlock = builder(cluster.urls())
        .retry_delay(Duration::from_millis(1), Duration::from_millis(4))
        .build()
        .expect("build");
    seed_counters(&cluster, "hot", FAR_FUTURE).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let redlock = redlock.clone();
            let order = Arc::clone(&order);
            tokio::spawn(async move {
                for _ in 0..20 {
                    let lock = redlock
                        .lock_until("hot", Duration::from_secs(5), deadline)
                        .await
                        .expect("lock within the deadline");
                    order
                        .lock()
                        .expect("no panics while holding")
                        .push(token(&lock));
                    tokio::task::yield_now().await;
                    let _ = redlock.unlock(&lock).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let order = order.lock().expect("no panics").clone();
    assert_eq!(order.len(), 16 * 20);
    assert_strictly_increasing(&order);
    assert!(order[0] > FAR_FUTURE);
}

/// Holder A is "paused" past its validity without extending; B takes the lock and writes;
/// A's late write is refused by the fenced store.
#[tokio::test]
async fn a_stale_holders_write_is_rejected() {
    let cluster = Cluster::start(3);
    let redlock = support::builder(cluster.urls())
        .ttl(Duration::from_millis(300))
        .node_timeout(Duration::from_millis(30))
        .retry_delay(Duration::from_millis(5), Duration::from_millis(10))
        .build()
        .expect("build");
    let store = FencedStore::connect(&cluster.nodes[0].url())
        .await
        .expect("store");
    let a = redlock.lock("account:9").await.expect("A locks");
    assert_eq!(
        store
            .write("balance:9", token(&a), "A-1")
            .await
            .expect("write"),
        Write::Accepted
    );
    // A stops here, without extending. B waits until A's keys expire, then takes over.
    let b = redlock
        .lock_until(
            "account:9",
            Duration::from_millis(300),
            Instant::now() + Duration::from_secs(10),
        )
        .await
        .expect("B locks once A's lock expired");
    assert!(!a.is_held(), "B got the lock only after A's validity");
    assert!(token(&b) > token(&a));
    assert_eq!(
        store
            .write("balance:9", token(&b), "B-1")
            .await
            .expect("write"),
        Write::Accepted
    );
    // A wakes up and writes as if it still held the lock.
    assert_eq!(
        store
            .write("balance:9", token(&a), "A-2")
            .await
            .expect("write"),
        Write::Stale { highest: token(&b) }
    );
    assert_eq!(
        store.read("balance:9").await.expect("read"),
        Some((token(&b), "B-1".to_owned()))
    );
    // B can write again with the same number.
    assert_eq!(
        store
            .write("balance:9", token(&b), "B-2")
            .await
            .expect("write"),
        Write::Accepted
    );
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// SIGSTOP until the phase ends.
    Pause,
    /// SIGKILL; restarted empty when the phase ends.
    Kill,
    /// Killed and restarted empty at once.
    Restart,
}

/// 10,000 acquisitions of one name, one after another, on 5 nodes; every 500 a random
/// minority (1 or 2 nodes) is paused, killed, or restarted with its data gone. Every
/// number is strictly above the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_sequential_acquisitions_through_failures_and_data_loss() {
    const TOTAL: usize = 10_000;
    const PHASE: usize = 500;
    let seed = std::env::var("NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f00d_u64);
    let mut rng = Rng(seed);
    let mut cluster = Cluster::start(5);
    let redlock = support::builder(cluster.urls())
        .ttl(Duration::from_secs(2))
        .node_timeout(Duration::from_millis(50))
        .connect_timeout(Duration::from_millis(200))
        .retry_delay(Duration::from_millis(1), Duration::from_millis(4))
        .build()
        .expect("build");
    let mut faults: Vec<(usize, Fault)> = Vec::new();
    let mut injected = [0usize; 3];
    let mut last = 0u64;
    let mut retried = 0u32;
    for i in 0..TOTAL {
        if i % PHASE == 0 {
            tokio::task::block_in_place(|| {
                for (node, fault) in faults.drain(..) {
                    match fault {
                        Fault::Pause => cluster.nodes[node].resume(),
                        Fault::Kill => cluster.nodes[node].restart(),
                        Fault::Restart => {}
                    }
                }
                let size = 1 + rng.below(2);
                let mut chosen: Vec<usize> = Vec::new();
                while chosen.len() < size {
                    let node = rng.below(5);
                    if !chosen.contains(&node) {
                        chosen.push(node);
                    }
                }
                for node in chosen {
                    let fault = [Fault::Pause, Fault::Kill, Fault::Restart][rng.below(3)];
                    injected[fault as usize] += 1;
                    match fault {
                        Fault::Pause => cluster.nodes[node].pause(),
                        Fault::Kill => cluster.nodes[node].kill(),
                        Fault::Restart => cluster.nodes[node].restart(),
                    }
                    faults.push((node, fault));
                }
            });
        }
        let lock = redlock
            .lock_until(
                "sequence",
                Duration::from_secs(2),
                Instant::now() + Duration::from_secs(30),
            )
            .await
            .unwrap_or_else(|e| panic!("acquisition {i} (faults {faults:?}): {e}"));
        retried += lock.attempts() - 1;
        let t = token(&lock);
        assert!(
            t > last,
            "acquisition {i}: fencing number {t} is not above {last} (faults {faults:?}, seed {seed})"
        );
        last = t;
        let _ = redlock.unlock(&lock).await;
    }
    println!(
        "{TOTAL} acquisitions, {} pauses, {} kills, {} restarts with data loss, {retried} retries",
        injected[0], injected[1], injected[2]
    );
}

async fn used_memory(cluster: &Cluster) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut cluster.raw(0).await)
        .await
        .expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}

async fn db_size(cluster: &Cluster) -> i64 {
    redis::cmd("DBSIZE")
        .query_async(&mut cluster.raw(0).await)
        .await
        .expect("DBSIZE")
}

/// The fencing counters on the first node: the members of its counters set.
async fn counter_count(cluster: &Cluster) -> i64 {
    cluster
        .raw(0)
        .await
        .zcard(counter_key("any").0)
        .await
        .expect("ZCARD")
}

/// The counters' memory is bounded whatever the names: 100,000 distinct names locked once
/// each leave one set on the node (the only key) with a counter per hash slot they fell
/// in, at most 16,384, and after the retention the set expires and memory is back at the
/// baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_of_distinct_names_stay_bounded_and_expire_after_the_retention() {
    const NAMES: usize = 100_000;
    const TASKS: usize = 64;
    let cluster = Cluster::start(1);
    let retention = Duration::from_secs(10);
    let redlock = cluster
        .client(|b| {
            b.ttl(Duration::from_millis(500))
                .fencing_retention(retention)
        })
        .await;
    // The baseline once the client's connections and scripts are in place (with the
    // warm-up's counter, which goes too: its set expires with the others).
    let baseline = used_memory(&cluster).await;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let redlock = redlock.clone();
            tokio::spawn(async move {
                for i in (t..NAMES).step_by(TASKS) {
                    let lock = redlock.lock(format!("order:{i:06}")).await.expect("lock");
                    let _ = redlock.unlock(&lock).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("locker");
    }
    let (grown, counters, keys) = (
        used_memory(&cluster).await - baseline,
        counter_count(&cluster).await,
        db_size(&cluster).await,
    );
    println!(
        "fencing counters: {grown} bytes for {NAMES} names ({counters} counters, {keys} keys)"
    );
    // 100,000 names fill every slot but a handful.
    assert!(
        (16_000..=16_384).contains(&counters),
        "{counters} counters for {NAMES} names"
    );
    assert_eq!(keys, 1, "the set is the only key");
    // docs/fencing.md gives this figure: about 100 bytes per slot.
    assert!(
        grown < 3 * 1024 * 1024,
        "{grown} bytes for {counters} counters"
    );
    // Back to the baseline within 1%, or 128 KiB: `used_memory` also counts the buffers
    // of each connected client (some 20 KiB each), and a client that reconnected under
    // load may leave the server a connection more or less than at the baseline.
    let tolerance = (baseline / 100).max(128 * 1024);
    // The set expires a retention and a half after its last renewal.
    let deadline = Instant::now() + retention * 3 / 2 + Duration::from_secs(60);
    loop {
        let (keys, grown) = (
            db_size(&cluster).await,
            used_memory(&cluster).await - baseline,
        );
        if keys == 0 && grown.abs() <= tolerance {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the counters did not go: {keys} keys left, memory {grown} bytes off the baseline \
             ({baseline} bytes)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The names of one hash slot share its counter, whatever their length: long names in
/// one slot leave one counter, and each of them gets a number above all before.
#[tokio::test]
async fn names_of_one_slot_share_a_counter_and_their_numbers_increase() {
    let cluster = Cluster::start(1);
    let redlock = builder(cluster.urls()).build().expect("build");
    // `t` is the hash tag of every lock key here (`redlock:{t}…}`): one slot.
    let names: Vec<String> = (0..100)
        .map(|i| format!("t}}{i:03}{}", "x".repeat(200)))
        .collect();
    let mut tokens = Vec::new();
    for name in &names {
        let lock = redlock.lock(name).await.expect("lock");
        tokens.push(token(&lock));
        let _ = redlock.unlock(&lock).await;
    }
    assert_strictly_increasing(&tokens);
    let (set, member) = counter_key(&names[0]);
    assert_eq!(counter_key(&names[99]), (set.clone(), member.clone()));
    let mut conn = cluster.raw(0).await;
    let count: usize = conn.zcard(&set).await.expect("ZCARD");
    // The warm-up's name and the slot of `t`.
    assert!(count <= 2, "{count} counters");
    assert_eq!(
        counter_on(&cluster, 0, &names[0]).await,
        tokens.last().copied()
    );
}

/// A name locked again within the retention reads its counter; after the counter expired
/// its numbers are seeded from the node clocks, still above every earlier number.
#[tokio::test]
async fn numbers_keep_increasing_before_and_after_the_counter_expires() {
    let cluster = Cluster::start(3);
    let redlock = cluster
        .client(|b| {
            b.ttl(Duration::from_millis(200))
                .node_timeout(Duration::from_millis(20))
                .fencing_retention(Duration::from_secs(2))
        })
        .await;
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let lock = redlock.lock("expiring").await.expect("lock");
        tokens.push(token(&lock));
        let _ = redlock.unlock(&lock).await;
    }
    assert!(counter_on(&cluster, 0, "expiring").await.is_some());
    support::wait_for(
        "the counters to expire",
        Duration::from_secs(10),
        || async {
            let mut gone = true;
            for i in 0..3 {
                gone &= counter_on(&cluster, i, "expiring").await.is_none();
            }
            gone
        },
    )
    .await;
    let lock = redlock.lock("expiring").await.expect("lock");
    tokens.push(token(&lock));
    let _ = redlock.unlock(&lock).await;
    assert_strictly_increasing(&tokens);
}

/// The time to live of `key` on node `i`, in ms (-2: none such, -1: no expiry).
async fn pttl(cluster: &Cluster, i: usize, key: &[u8]) -> i64 {
    cluster.raw(i).await.pttl(key).await.expect("PTTL")
}

/// The set of counters gets its expiry (a retention and a half) from the first fenced
/// request on each connection, and not again there for a quarter retention: later ones
/// send no `PEXPIRE`. A node that restarted without its data gets the set back with an
/// expiry at once, not a quarter retention later: the reconnect's first fenced request
/// renews it (with the restart quarantine on, the first after its quarantine is over).
#[tokio::test]
async fn a_counter_set_is_renewed_once_per_quarter_retention_and_after_a_restart() {
    renewals_before_and_after_a_restart(false).await;
}

/// [`a_counter_set_is_renewed_once_per_quarter_retention_and_after_a_restart`] with the
/// restart quarantine on.
#[tokio::test]
async fn a_counter_set_is_renewed_after_a_restarted_node_left_its_quarantine() {
    renewals_before_and_after_a_restart(true).await;
}

async fn renewals_before_and_after_a_restart(quarantine: bool) {
    let mut cluster = Cluster::start(3);
    let (ttl, retention) = (Duration::from_secs(1), Duration::from_secs(600));
    if quarantine {
        // Not quarantined as new nodes at the first connect.
        cluster.age_ledgers();
    }
    let redlock = builder(cluster.urls())
        .ttl(ttl)
        .fencing_retention(retention)
        .restart_quarantine(quarantine)
        .build()
        .expect("build");
    support::warm(&redlock).await;
    let set = counter_key("t}a").0;
    let lock_and_unlock = |name: &'static str| {
        let redlock = &redlock;
        async move {
            let lock = redlock.lock(name).await.expect("lock");
            let _ = redlock.unlock(&lock).await;
        }
    };
    lock_and_unlock("t}a").await;
    assert_eq!(counter_key("t}b").0, set);
    let expiry_ms = i64::try_from(retention.as_millis() * 3 / 2).expect("ms");
    support::wait_for(
        "the set's expiry on every node",
        Duration::from_secs(5),
        || async {
            let mut all = true;
            for i in 0..3 {
                all &= pttl(&cluster, i, &set).await > expiry_ms - 60_000;
            }
            all
        },
    )
    .await;
    let calls = calls_during(&cluster, ["zadd", "pexpire"], async {
        for _ in 0..3 {
            lock_and_unlock("t}b").await;
        }
    })
    .await;
    assert!(calls.iter().all(|c| c[1] == 0), "{calls:?}");
    assert!(calls.iter().filter(|c| c[0] == 3).count() >= 2, "{calls:?}");
    // The restarted node is empty; the next acquisitions give it the set back, expiring.
    cluster.nodes[0].restart();
    support::wait_for(
        "the set back on the restarted node, with an expiry",
        Duration::from_secs(10),
        || async {
            lock_and_unlock("t}b").await;
            pttl(&cluster, 0, &set).await > expiry_ms - 60_000
        },
    )
    .await;
}

/// A retention of `Duration::MAX` (keep counters "for ever") works: counters are kept 100
/// years (their set expires after 150, a retention and a half).
#[tokio::test]
async fn an_endless_retention_keeps_counters_a_hundred_years() {
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls())
        .fencing_retention(Duration::MAX)
        .build()
        .expect("build");
    let lock = redlock.lock("forever").await.expect("lock");
    let _ = redlock.unlock(&lock).await;
    let expiry_ms = 150 * 365 * 24 * 3600 * 1000_i64;
    for i in 0..3 {
        // A node beyond the quorum may take a moment to get its commands.
        let left = || async {
            let mut conn = cluster.raw(i).await;
            let left: i64 = conn.pttl(counter_key("forever").0).await.expect("PTTL");
            left
        };
        support::wait_for(
            "the counter on every node",
            Duration::from_secs(5),
            || async { left().await != -2 },
        )
        .await;
        let left = left().await;
        assert!(
            left > expiry_ms - 60_000 && left <= expiry_ms,
            "node {i}: {left} ms"
        );
    }
}

#[test]
fn retention_and_prefix_settings_are_checked() {
    let url = ["redis://127.0.0.1:1"];
    let short = support::builder(url)
        .ttl(Duration::from_secs(10))
        .fencing_retention(Duration::from_secs(60))
        .build();
    assert!(
        matches!(
            short,
            Err(tower_redlock::ConfigError::FencingRetentionTooShort { .. })
        ),
        "{short:?}"
    );
    let brace = support::builder(url).key_prefix("app{lock:").build();
    assert!(
        matches!(
            brace,
            Err(tower_redlock::ConfigError::KeyPrefixBrace { .. })
        ),
        "{brace:?}"
    );
    assert!(
        support::builder(url)
            .key_prefix("{app}:lock:")
            .build()
            .is_ok()
    );
}

/// The fencing retention of the dropped-connection test: the shortest the builder takes for
/// its 1 s TTL.
const SHORT_RETENTION: Duration = Duration::from_secs(10);

/// A counter written after a dropped connection lives a retention, and a client whose
/// clock is behind still gets a higher number (issue 37's schedule, which made numbers go
/// back): one node, retention 10 s. Client A renews its set of counters at its first
/// acquisition; a while later the server closes A's connection (`CLIENT KILL`, as an idle
/// `timeout`, a proxy or a blip would) just as A's next renewal falls due, so that
/// acquisition fails; the next one reconnects and writes A's number. The set must then
/// have at least a retention left: the renewal rides on the new connection's first fenced
/// request (it used to count as done at the failed acquisition, leaving the set the few
/// seconds left of the first renewal). Then client B, another process whose clock is 9.9 s
/// behind (within the bound: the clocks differ by less than the retention minus the node
/// timeout), locks the name 9.1 s after A's write: within the retention the counter still
/// holds A's number, so B's proposal, below it, is refused, and B's number is above A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_written_after_a_dropped_connection_lives_a_retention() {
    let cluster = Cluster::start(1);
    let a = builder(cluster.urls())
        .ttl(Duration::from_secs(1))
        .node_timeout(Duration::from_millis(50))
        .fencing_retention(SHORT_RETENTION)
        .build()
        .expect("build");
    let name = "dropped";
    let set = counter_key(name).0;
    let first = a.lock(name).await.expect("lock");
    let _ = a.unlock(&first).await;
    support::wait_for(
        "the first renewal 6 s old",
        Duration::from_secs(15),
        || async { pttl(&cluster, 0, &set).await < 9_000 },
    )
    .await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query_async(&mut cluster.raw(0).await)
        .await
        .expect("CLIENT KILL");
    assert!(killed >= 1, "A's connection closed by the server");
    // On the closed connection (it may fail, or reconnect in time: either way).
    if let Ok(lock) = a.try_lock(name).await {
        let _ = a.unlock(&lock).await;
    }
    let lock = a.lock(name).await.expect("lock after the reconnect");
    let written = Instant::now();
    let t_a = token(&lock);
    let _ = a.unlock(&lock).await;
    let left = pttl(&cluster, 0, &set).await;
    assert!(
        left >= i64::try_from(SHORT_RETENTION.as_millis()).expect("ms"),
        "the counter written at {t_a} has {left} ms left, less than the retention"
    );
    tokio::time::sleep_until((written + Duration::from_millis(9_100)).into()).await;
    let out = tokio::task::block_in_place(|| {
        support::run_skewed_child(
            module_path!(),
            "skewed_client_locks_once",
            "-9.9",
            &[
                ("REDLOCK_CHILD_NODE", cluster.urls()[0].clone()),
                ("REDLOCK_CHILD_NAME", name.to_owned()),
            ],
        )
    });
    let t_b = child_number(&out);
    assert!(
        t_b > t_a,
        "B (clock 9.9 s behind) got {t_b}, not above A's {t_a}: the numbers went back"
    );
}

/// The fencing number a child process printed.
fn child_number(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.split("FENCE=").nth(1))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("the child's number: {out}"))
}

/// Clients whose clocks differ, on contended names, where a node lacks the latest
/// counter: a proposal that only a minority of the granting nodes accepts is not the
/// number. Client A's third node is down, so its numbers reach nodes 0 and 1 only, while
/// two of its tasks contend for the names. Then client B, another process whose clock is
/// 2 s behind, locks each name on all three nodes: its proposal is below A's numbers on
/// nodes 0 and 1 and accepted on node 2 alone, one acceptance where the quorum is two.
/// B must read the counters and take a number above A's (an acquisition that took its
/// proposal with fewer than a quorum of acceptances would hand out a lower one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_proposal_one_node_accepts_reads_before_taking_a_number() {
    let cluster = Cluster::start(3);
    let mut a_nodes = cluster.urls()[..2].to_vec();
    a_nodes.push(format!("redis://127.0.0.1:{}", support::free_port()));
    let a = builder(a_nodes)
        .ttl(Duration::from_secs(2))
        .node_timeout(Duration::from_millis(100))
        .build()
        .expect("build");
    let names = ["contended:0", "contended:1"];
    let highest = Arc::new(Mutex::new(std::collections::HashMap::new()));
    let tasks = (0..2).map(|_| {
        let (a, highest) = (a.clone(), Arc::clone(&highest));
        tokio::spawn(async move {
            for round in 0..6 {
                let name = names[round % 2];
                let lock = a.lock(name).await.expect("A locks with two nodes of three");
                let t = token(&lock);
                let _ = a.unlock(&lock).await;
                let mut highest = highest.lock().expect("not poisoned");
                let entry = highest.entry(name).or_insert(0);
                *entry = t.max(*entry);
            }
        })
    });
    for task in futures_util::future::join_all(tasks).await {
        task.expect("A's task");
    }
    for name in names {
        let t_a = highest.lock().expect("not poisoned")[name];
        let out = tokio::task::block_in_place(|| {
            support::run_skewed_child(
                module_path!(),
                "skewed_client_locks_once",
                "-2",
                &[
                    ("REDLOCK_CHILD_NODE", cluster.urls().join(",")),
                    ("REDLOCK_CHILD_NAME", name.to_owned()),
                ],
            )
        });
        let t_b = child_number(&out);
        assert!(
            t_b > t_a,
            "B (clock 2 s behind) got {t_b} for {name}, not above A's {t_a}: it took a \
             proposal that one node of three accepted"
        );
    }
}

/// The second client of [`a_counter_written_after_a_dropped_connection_lives_a_retention`]
/// and [`a_client_whose_proposal_one_node_accepts_reads_before_taking_a_number`]: run by
/// them as a child process whose clock libfaketime moved; locks a name once on the nodes
/// `REDLOCK_CHILD_NODE` (comma-separated) and prints its fencing number.
#[tokio::test]
#[ignore = "a child process of a_counter_written_after_a_dropped_connection_lives_a_retention"]
async fn skewed_client_locks_once() {
    let nodes = std::env::var("REDLOCK_CHILD_NODE").expect("run only as a child process");
    let name = std::env::var("REDLOCK_CHILD_NAME").expect("run only as a child process");
    let b = builder(nodes.split(',').map(str::to_owned).collect())
        .ttl(Duration::from_secs(1))
        .node_timeout(Duration::from_millis(50))
        .fencing_retention(SHORT_RETENTION)
        .build()
        .expect("build");
    let lock = b.lock(&name).await.expect("lock");
    println!("FENCE={}", token(&lock));
    let _ = b.unlock(&lock).await;
}

/// Numbers the handlers behind [`replaying`] were given, in order.
type Numbers = Arc<Mutex<Vec<Option<u64>>>>;

/// `redlock` behind a replay layer keyed by `Idempotency-Key`, around a handler that
/// records its fencing number in `numbers` and answers with the key and the number; the
/// service takes the key and answers with the response's body (200 only).
fn replaying(
    redlock: &tower_redlock::Redlock,
    numbers: &Numbers,
) -> tower::util::BoxCloneService<&'static str, String, tower::BoxError> {
    use tower::{Layer, ServiceExt, service_fn};
    let numbers = Arc::clone(numbers);
    let svc = tower_redlock::RedlockLayer::new(
        redlock.clone(),
        tower_redlock::layer::Header::new("idempotency-key"),
    )
    .replay(Duration::from_secs(60))
    .layer(service_fn(move |req: http::Request<_>| {
        let token = req.extensions().get::<tower_redlock::LockToken>().cloned();
        let number = token.and_then(|t| t.fencing_token());
        numbers.lock().expect("numbers").push(number);
        let key = req.headers().get("idempotency-key").cloned();
        async move {
            let body = format!("{key:?} ran with {number:?}");
            Ok::<_, std::convert::Infallible>(http::Response::new(body))
        }
    }));
    let svc = svc
        .map_request(|key: &'static str| {
            http::Request::post("/pay")
                .header("idempotency-key", key)
                .body(String::new())
                .expect("request")
        })
        .map_err(tower::BoxError::from)
        .and_then(|res: http::Response<_>| async move {
            assert_eq!(res.status(), 200);
            let body = http_body_util::BodyExt::collect(res.into_body()).await?;
            Ok(String::from_utf8(body.to_bytes().to_vec())?)
        });
    tower::util::BoxCloneService::new(svc)
}

/// A replay layer goes down once per request, fenced or not: a request whose key has a
/// record is answered from it in the round trip of the lock's own commands (`SET NX PX`,
/// fenced with `ZADD GT CH`, then `GET` and `PTTL` of the key), with no script after them;
/// a request that runs its handler gets its number (fenced) from the same commands, and
/// the next key's is higher.
#[tokio::test]
async fn a_replay_takes_one_round_trip_fenced_or_not() {
    use tower::ServiceExt;
    let cluster = Cluster::start(3);
    for fenced in [true, false] {
        let redlock = builder(cluster.urls())
            .fencing(fenced)
            .build()
            .expect("build");
        support::warm(&redlock).await;
        let numbers = Numbers::default();
        let svc = replaying(&redlock, &numbers);
        let send = |key| svc.clone().oneshot(key);
        let (a, b) = if fenced { ("a", "b") } else { ("c", "d") };
        let first = send(a).await.expect("first");
        let second = send(b).await.expect("second");
        let ran = numbers.lock().expect("numbers").clone();
        match ran[..] {
            [Some(a), Some(b)] if fenced => assert!(b > a, "{ran:?}"),
            [None, None] if !fenced => {}
            _ => panic!("two handlers, numbers only when fenced: {ran:?}"),
        }

        cluster.reset_stats().await;
        let replayed = send(a).await.expect("replayed");
        support::wait_for(
            "every node read the key",
            Duration::from_secs(5),
            || async {
                let mut all = true;
                for i in 0..3 {
                    all &= cluster.command_calls(i, "get").await > 0;
                }
                all
            },
        )
        .await;
        assert_eq!(replayed, first);
        assert_ne!(first, second);
        assert_eq!(
            numbers.lock().expect("numbers").len(),
            2,
            "no handler ran again"
        );
        let mut without_script = 0;
        for i in 0..3 {
            let calls = [
                cluster.command_calls(i, "set").await,
                cluster.command_calls(i, "get").await,
                cluster.command_calls(i, "evalsha").await,
            ];
            // A node that answered after a quorum of records may get the release of the
            // attempt's value (a script that reads the key too); no node runs the holder
            // script.
            assert!(calls[2] <= 1, "node {i}: set, get, evalsha {calls:?}");
            assert_eq!(
                calls[..2],
                [1, 1 + calls[2]],
                "node {i}: set, get, evalsha {calls:?}"
            );
            without_script += usize::from(calls[2] == 0);
        }
        assert!(without_script >= 2, "a quorum answered in one round trip");
    }
}

/// Over RESP3 the nodes are reached on redis-rs's connections, whose replies to the
/// replay's reads (`GET`, `PTTL`) come in RESP3's shapes (a null of its own): fenced or
/// not, a finished request is replayed from its record and its handler runs once, and a
/// second key still gets its own answer (and a higher number, fenced).
#[tokio::test]
async fn a_replay_over_resp3_finds_the_record() {
    use tower::ServiceExt;
    let cluster = Cluster::start(3);
    for fenced in [true, false] {
        let redlock = cluster
            .client_over("/?protocol=resp3", |b| b.fencing(fenced))
            .await;
        let numbers = Numbers::default();
        let svc = replaying(&redlock, &numbers);
        let (a, b) = if fenced {
            ("r3-a", "r3-b")
        } else {
            ("r3-c", "r3-d")
        };
        let first = svc.clone().oneshot(a).await.expect("first");
        assert_eq!(svc.clone().oneshot(a).await.expect("replayed"), first);
        let second = svc.clone().oneshot(b).await.expect("second");
        assert_ne!(first, second);
        let ran = numbers.lock().expect("numbers").clone();
        match ran[..] {
            [Some(a), Some(b)] if fenced => assert!(b > a, "{ran:?}"),
            [None, None] if !fenced => {}
            _ => panic!("two handlers, numbers only when fenced: {ran:?}"),
        }
    }
}

/// On a Redis Cluster node a replay's `SET` goes alone (one keyed command per request),
/// and a refused one asks the holder script for the record: fenced or not, a finished
/// request is replayed and its handler runs once.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_on_a_cluster_node_finds_the_record() {
    use tower::ServiceExt;
    let cluster = tokio::task::block_in_place(support::cluster::RedisCluster::start);
    tokio::task::block_in_place(|| cluster.age_ledgers());
    for fenced in [true, false] {
        // The restart quarantine on, as by default: acquisitions on a cluster say where they
        // ran, with the `SET` alone in its request.
        let redlock =
            tower_redlock::Redlock::builder([tower_redlock::NodeConfig::cluster(cluster.urls())])
                .fencing(fenced)
                .build()
                .expect("build");
        support::wait_for("the node usable", Duration::from_secs(10), || async {
            redlock.health().await.usable() == 1
        })
        .await;
        let numbers = Numbers::default();
        let svc = replaying(&redlock, &numbers);
        let key = if fenced { "fenced" } else { "unfenced" };
        let first = svc.clone().oneshot(key).await.expect("first");
        assert_eq!(svc.clone().oneshot(key).await.expect("replayed"), first);
        let ran = numbers.lock().expect("numbers").clone();
        assert_eq!(ran.len(), 1, "ran once: {ran:?}");
        assert_eq!(ran[0].is_some(), fenced, "{ran:?}");
    }
}
