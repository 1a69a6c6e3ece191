//! Fencing numbers and clocks, against real `redis-server` processes: a client whose clock
//! is far ahead cannot drag the counters forward (its proposals are capped by the nodes'
//! own clocks, see `RedlockBuilder::fencing_clock_bound`), and a counter pinned at the
//! largest number a score holds exactly (2^53) is reset by the next acquisition that reads
//! it instead of failing every acquisition of its slot for ever (`docs/fencing.md`).

use crate::support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::AsyncCommands;
use support::{CapturedLogs, Cluster};
use tower_redlock::Lock;
use tower_redlock::defaults::DEFAULT_FENCING_CLOCK_BOUND;
use tower_redlock::fencing::counter_of;

/// The largest whole number a sorted set's score holds exactly.
const MAX_NUMBER: u64 = 1 << 53;

/// Room for the time between the child's acquisition and the checks, on a loaded machine.
const SLACK: Duration = Duration::from_secs(5);

/// This host's wall clock in µs (the test process's clock is not faked).
fn now_us() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_micros()).expect("fits")
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).expect("fits")
}

fn token(lock: &Lock) -> u64 {
    lock.fencing_token().expect("fencing is on")
}

/// The counters of `name` on every node of `cluster` (`None` where there is none).
async fn counters(cluster: &Cluster, name: &str) -> Vec<Option<f64>> {
    let (key, member) = counter_of(b"redlock:", name.as_bytes(), false).expect("a name");
    let mut out = Vec::new();
    for i in 0..cluster.nodes.len() {
        let score: Option<f64> = cluster
            .raw(i)
            .await
            .zscore(&key, &member)
            .await
            .expect("ZSCORE");
        out.push(score);
    }
    out
}

/// Runs [`client_ahead_locks_once`] in a child process whose clock is an hour ahead, on
/// `cluster`'s nodes, locking `name` (with the clock bound `bound`: `"default"` or
/// `"max"`): its fencing number, and whether it warned about its clock.
fn lock_from_an_hour_ahead(cluster: &Cluster, name: &str, bound: &str) -> (u64, bool) {
    let out = tokio::task::block_in_place(|| {
        support::run_skewed_child(
            module_path!(),
            "client_ahead_locks_once",
            "+3600",
            &[
                ("REDLOCK_CHILD_NODES", cluster.urls().join(",")),
                ("REDLOCK_CHILD_NAME", name.to_owned()),
                ("REDLOCK_CHILD_BOUND", bound.to_owned()),
            ],
        )
    });
    let number = out
        .lines()
        .find_map(|l| l.split("FENCE=").nth(1))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("the child's number: {out}"));
    (number, out.contains("WARNED=true"))
}

/// A client process whose clock is an hour ahead locks a name: its number is above the
/// one before (the lock works), but within the bound (and some slack) of real time, on
/// every node's counter too; it warned once about its clock; and the next number of a
/// client in sync is above the skewed one and near real time as well: the counters were
/// not dragged an hour ahead. The same child with the bound off (`Duration::MAX`) drags
/// them by the hour, which the check above would have caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_clock_an_hour_ahead_does_not_drag_the_counters() {
    let cluster = Cluster::start(3);
    let redlock = support::builder(cluster.urls()).build().expect("build");
    let name = "clock-ahead";
    let lock = redlock.lock(name).await.expect("lock");
    let before = token(&lock);
    let _ = redlock.unlock(&lock).await;

    let (skewed, warned) = lock_from_an_hour_ahead(&cluster, name, "default");
    let ceiling = now_us() + us(DEFAULT_FENCING_CLOCK_BOUND + SLACK);
    assert!(
        skewed > before,
        "the skewed client's number {skewed} is not above {before}"
    );
    assert!(
        skewed <= ceiling,
        "the skewed client's number {skewed} is {} s beyond real time plus the bound",
        (skewed - ceiling) / 1_000_000
    );
    assert!(warned, "the skewed client did not warn about its clock");
    for counter in counters(&cluster, name).await {
        let counter = counter.expect("a counter on every node");
        assert!(counter <= ceiling as f64, "a counter dragged to {counter}");
    }

    let lock = redlock
        .lock(name)
        .await
        .expect("lock after the skewed client");
    let after = token(&lock);
    let _ = redlock.unlock(&lock).await;
    assert!(after > skewed, "{after} is not above the skewed {skewed}");
    assert!(
        after <= now_us() + us(DEFAULT_FENCING_CLOCK_BOUND + SLACK),
        "the next number {after} was dragged ahead of real time"
    );

    // The control: without the bound, the same child drags the counter an hour ahead.
    let (unbounded, _) = lock_from_an_hour_ahead(&cluster, "clock-ahead-unbounded", "max");
    assert!(
        unbounded > now_us() + 3_000_000_000,
        "without the bound the child's number {unbounded} should be an hour ahead"
    );
}

/// The child of [`a_client_clock_an_hour_ahead_does_not_drag_the_counters`]: run in a
/// process whose clock libfaketime moved; locks a name once (right after the client is
/// built, so its first proposal already finds the nodes' clocks) and prints its fencing
/// number and whether it warned about its clock.
#[tokio::test]
#[ignore = "a child process of a_client_clock_an_hour_ahead_does_not_drag_the_counters"]
async fn client_ahead_locks_once() {
    let nodes = std::env::var("REDLOCK_CHILD_NODES").expect("run only as a child process");
    let name = std::env::var("REDLOCK_CHILD_NAME").expect("run only as a child process");
    let bound = std::env::var("REDLOCK_CHILD_BOUND").expect("run only as a child process");
    let logs = CapturedLogs::start();
    let mut builder = support::builder(nodes.split(','));
    if bound == "max" {
        builder = builder.fencing_clock_bound(Duration::MAX);
    }
    let redlock = builder.build().expect("build");
    let lock = redlock.lock(&name).await.expect("lock");
    // A second acquisition: the warning is said once.
    let again = redlock.lock("clock-ahead-again").await.expect("lock");
    let warnings = logs.text().matches("ahead of the nodes' clocks").count();
    assert!(warnings <= 1, "warned {warnings} times: {}", logs.text());
    println!("FENCE={}", token(&lock));
    println!("WARNED={}", warnings == 1);
    let _ = redlock.unlock(&lock).await;
    let _ = redlock.unlock(&again).await;
}

/// A counter set by hand to 2^53, or to `+inf`, on every node, which no `ZADD GT` can
/// raise: the next acquisition reads it, resets it to its own number in phase 2 (logging
/// an error, once) and succeeds; the numbers after it strictly increase, and the
/// counters on the nodes are below the maximum again.
#[tokio::test]
async fn a_counter_pinned_at_the_maximum_is_reset_by_the_next_acquisition() {
    let cluster = Cluster::start(3);
    let redlock = support::builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    let logs = CapturedLogs::start();
    for (name, pinned) in [("pinned-2-53", "9007199254740992"), ("pinned-inf", "+inf")] {
        let (key, member) = counter_of(b"redlock:", name.as_bytes(), false).expect("a name");
        for i in 0..3 {
            let _: i64 = redis::cmd("ZADD")
                .arg(&key)
                .arg(pinned)
                .arg(&member)
                .query_async(&mut cluster.raw(i).await)
                .await
                .expect("ZADD");
        }
        let mut last = 0;
        for round in 0..4 {
            let lock = redlock
                .lock(name)
                .await
                .unwrap_or_else(|e| panic!("{name}, acquisition {round}: {e}"));
            let number = token(&lock);
            let _ = redlock.unlock(&lock).await;
            assert!(number < MAX_NUMBER, "{name}: {number}");
            assert!(number > last, "{name}: {number} after {last}");
            last = number;
        }
        for counter in counters(&cluster, name).await {
            let counter = counter.expect("a counter on every node");
            assert!(
                counter < MAX_NUMBER as f64,
                "{name}: still pinned: {counter}"
            );
        }
    }
    let errors = logs
        .text()
        .matches("fencing counter at its maximum")
        .count();
    assert_eq!(errors, 2, "one error per pinned slot: {}", logs.text());
}
