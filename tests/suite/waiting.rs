//! Waiting for a busy lock: woken by the release through pub/sub, with the jittered retry
//! as the backstop, against real Redis nodes.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{Cluster, wait_for};
use tower_redlock::{Lock, Redlock};

/// A backstop so long that only a notification can explain a fast handoff.
const SLOW_BACKSTOP: Duration = Duration::from_secs(3);

async fn subscribers(cluster: &Cluster, i: usize, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut cluster.raw(i).await)
        .await
        .expect("PUBSUB NUMSUB");
    n
}

/// Waits until every node has a subscriber on `channel`: the waiter is queued.
async fn wait_subscribed(cluster: &Cluster, channel: &str) {
    wait_for(
        "the waiter's subscriptions",
        Duration::from_secs(5),
        || async {
            let mut all = true;
            for i in 0..cluster.nodes.len() {
                all &= subscribers(cluster, i, channel).await == 1;
            }
            all
        },
    )
    .await;
}

/// A client whose retry delay is [`SLOW_BACKSTOP`]: only a notification can make it go
/// sooner.
async fn slow_waiter(cluster: &Cluster) -> Redlock {
    cluster
        .client(|b| b.retry_delay(SLOW_BACKSTOP, Duration::ZERO).max_attempts(5))
        .await
}

/// Spawns a `lock()` of `name` and returns when it got the lock, with the instant.
fn spawn_waiter(redlock: &Redlock, name: &'static str) -> tokio::task::JoinHandle<Instant> {
    let redlock = redlock.clone();
    tokio::spawn(async move {
        let lock = redlock.lock(name).await.expect("the waiter gets the lock");
        let got = Instant::now();
        let _ = redlock.unlock(&lock).await;
        got
    })
}

#[tokio::test]
async fn a_waiter_acquires_right_after_the_release_not_after_the_retry_delay() {
    let cluster = Cluster::start(3);
    let holder = cluster.client(|b| b).await;
    let waiter = slow_waiter(&cluster).await;
    let lock = holder.lock("handoff").await.expect("lock");
    let task = spawn_waiter(&waiter, "handoff");
    wait_subscribed(&cluster, "redlock:{handoff}").await;
    let released = Instant::now();
    let _ = holder.unlock(&lock).await;
    let got = task.await.expect("waiter task");
    let handoff = got.saturating_duration_since(released);
    assert!(
        handoff < Duration::from_millis(500),
        "the waiter took {handoff:?} (its retry delay is {SLOW_BACKSTOP:?})"
    );
    // The last waiter gone, the subscriptions go too.
    wait_for("the unsubscriptions", Duration::from_secs(5), || async {
        subscribers(&cluster, 0, "redlock:{handoff}").await == 0
    })
    .await;
}

/// Whether every node of `cluster` holds `key`.
async fn on_every_node(cluster: &Cluster, key: &str) -> bool {
    let mut all = true;
    for i in 0..cluster.nodes.len() {
        let n: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut cluster.raw(i).await)
            .await
            .expect("EXISTS");
        all &= n == 1;
    }
    all
}

/// `holder` takes `name`, and a task of `waiter` waits for it: back once the waiter listens
/// on every node and has marked them all.
async fn queued(
    cluster: &Cluster,
    holder: &Redlock,
    waiter: &Redlock,
    name: &'static str,
) -> (Lock, tokio::task::JoinHandle<Instant>) {
    let lock = holder.lock(name).await.expect("lock");
    let task = spawn_waiter(waiter, name);
    wait_subscribed(cluster, &format!("redlock:{{{name}}}")).await;
    wait_for("the waiter's marks", Duration::from_secs(5), || {
        on_every_node(cluster, "redlock:#waiting")
    })
    .await;
    (lock, task)
}

/// Releases `lock`; how long after that `task`'s waiter got it.
async fn handoff(
    holder: &Redlock,
    lock: &Lock,
    task: tokio::task::JoinHandle<Instant>,
) -> Duration {
    let released = Instant::now();
    let _ = holder.unlock(lock).await;
    let got = task.await.expect("waiter task");
    got.saturating_duration_since(released)
}

/// A release tells the waiters only while a waiter of another client has marked the
/// nodes: with nobody waiting, releases alone and in batches publish nothing; once another
/// client waits, the release publishes on every node, and the waiter goes at once.
#[tokio::test]
async fn a_release_publishes_only_while_another_client_waits() {
    let cluster = Cluster::start(3);
    let holder = cluster.client(|b| b).await;
    cluster.reset_stats().await;
    let lock = holder.lock("quiet").await.expect("lock");
    let _ = holder.unlock(&lock).await;
    let names: Vec<String> = (0..40).map(|i| format!("quiet-{i}")).collect();
    let locks = futures_util::future::join_all(names.iter().map(|n| holder.lock(n))).await;
    let locks: Vec<_> = locks.into_iter().map(|l| l.expect("lock")).collect();
    let released = futures_util::future::join_all(locks.iter().map(|l| holder.unlock(l))).await;
    assert!(released.iter().all(|r| r.released() == 3), "{released:?}");
    for i in 0..3 {
        assert!(cluster.command_calls(i, "evalsha").await > 0, "node {i}");
        assert_eq!(
            cluster.command_calls(i, "publish").await,
            0,
            "node {i} told nobody's waiters"
        );
    }

    let waiter = slow_waiter(&cluster).await;
    let (lock, task) = queued(&cluster, &holder, &waiter, "told").await;
    cluster.reset_stats().await;
    let handoff = handoff(&holder, &lock, task).await;
    assert!(
        handoff < Duration::from_millis(500),
        "the waiter took {handoff:?} (its retry delay is {SLOW_BACKSTOP:?})"
    );
    for i in 0..3 {
        assert!(
            cluster.command_calls(i, "publish").await >= 1,
            "node {i} did not tell the waiter"
        );
    }
}

/// A waiter of another client's lock that marked a quorum of nodes counts on hearing the
/// release: it does not poll while the holder's key lives, and goes at the release.
#[tokio::test]
async fn a_marked_waiter_does_not_poll_while_the_holder_lives() {
    let cluster = Cluster::start(3);
    let holder = cluster.client(|b| b.ttl(Duration::from_secs(30))).await;
    let pause = Duration::from_millis(50);
    let waiter = cluster
        .client(|b| b.retry_delay(pause, Duration::ZERO).max_attempts(1000))
        .await;
    let (lock, task) = queued(&cluster, &holder, &waiter, "long").await;
    cluster.reset_stats().await;
    // Twenty of its retry delays: a waiter that polled would try about twenty times.
    let window = pause * 20;
    tokio::time::sleep(window).await;
    // Its attempt right after marking may fall in the window, and so may a mark's SET.
    let sets = cluster.command_calls(0, "set").await;
    assert!(
        sets <= 2,
        "{sets} SETs on node 0 in {window:?}: the waiter polled"
    );
    let handoff = handoff(&holder, &lock, task).await;
    assert!(
        handoff < Duration::from_millis(500),
        "the waiter took {handoff:?}"
    );
}

#[tokio::test]
async fn a_lost_notification_costs_at_most_the_backstop() {
    let cluster = Cluster::start(3);
    let backstop = Duration::from_millis(400);
    let holder = cluster.client(|b| b).await;
    let waiter = cluster
        .client(|b| b.retry_delay(backstop, Duration::ZERO).max_attempts(50))
        .await;
    let lock = holder.lock("lost-note").await.expect("lock");
    let task = spawn_waiter(&waiter, "lost-note");
    wait_subscribed(&cluster, "redlock:{lost-note}").await;
    // Cut every subscription connection, then release while they are down: the
    // messages go nowhere.
    for i in 0..3 {
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut cluster.raw(i).await)
            .await
            .expect("CLIENT KILL");
    }
    let released = Instant::now();
    let _ = holder.unlock(&lock).await;
    let got = task.await.expect("waiter task");
    let took = got.saturating_duration_since(released);
    // One backstop delay, plus a round of node calls, with room for a loaded machine.
    assert!(took < backstop * 4, "the waiter took {took:?}");
}

#[tokio::test]
async fn waiters_of_one_client_go_in_arrival_order() {
    let cluster = Cluster::start(3);
    let redlock = slow_waiter(&cluster).await;
    // Another client holds the name first: the queue subscribes, and the first waiter is
    // woken by the nodes' messages, the others by the releases of this client.
    let other = cluster.client(|b| b).await;
    let first = other.lock("queue").await.expect("lock");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let redlock = redlock.clone();
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let lock = redlock
                .lock("queue")
                .await
                .expect("each waiter gets its turn");
            order.lock().expect("order").push(i);
            let _ = redlock.unlock(&lock).await;
        }));
        // The next one arrives once this one is queued.
        wait_for("the waiter to queue", Duration::from_secs(5), || async {
            subscribers(&cluster, 0, "redlock:{queue}").await == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = other.unlock(&first).await;
    let t = Instant::now();
    for task in tasks {
        task.await.expect("waiter");
    }
    // Ten handoffs by notification, none by the 3 s backstop.
    assert!(t.elapsed() < SLOW_BACKSTOP, "{:?}", t.elapsed());
    assert_eq!(*order.lock().expect("order"), (0..10).collect::<Vec<_>>());
}

#[tokio::test]
async fn without_subscribe_permission_waiting_polls_and_says_so() {
    let cluster = Cluster::start(1);
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nosub",
            "on",
            ">secret",
            "~*",
            "&*",
            "+@all",
            "-subscribe",
        ])
        .query_async(&mut cluster.raw(0).await)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://nosub:secret@127.0.0.1:{}", cluster.nodes[0].port());
    let logs = support::CapturedLogs::start();
    let redlock = support::builder([url])
        .retry_delay(Duration::from_millis(100), Duration::from_millis(50))
        .build()
        .expect("build");
    support::warm(&redlock).await;
    // Held by another client: only the nodes could tell of its release.
    let holder = cluster.client(|b| b).await;
    let lock = holder.lock("acl").await.expect("lock");
    let task = spawn_waiter(&redlock, "acl");
    wait_for("the refusal to be logged", Duration::from_secs(5), || {
        let seen = logs.contains("refused SUBSCRIBE");
        async move { seen }
    })
    .await;
    let _ = holder.unlock(&lock).await;
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the waiter gets the lock by polling")
        .expect("waiter task");
    assert!(!logs.contains("secret"), "a credential was logged");
}

/// A release by the waiter's own client wakes it directly, as soon as the deletes are on
/// their way, without the nodes' messages: the waiter does not even subscribe, and with a
/// retry delay of seconds it still gets the lock at once.
#[tokio::test]
async fn a_release_by_the_same_client_wakes_its_waiter_without_pub_sub() {
    let cluster = Cluster::start(3);
    let redlock = slow_waiter(&cluster).await;
    let lock = redlock.lock("local").await.expect("lock");
    cluster.reset_stats().await;
    let task = spawn_waiter(&redlock, "local");
    // Its first attempt finds the key taken (the busy path asks for the holder's TTL by
    // script), and so does the one right after it queued up: then it waits.
    wait_for("the waiter to queue up", Duration::from_secs(5), || async {
        cluster.command_calls(0, "evalsha").await >= 2
    })
    .await;
    let released = Instant::now();
    let _ = redlock.unlock(&lock).await;
    let got = task.await.expect("waiter task");
    let handoff = got.saturating_duration_since(released);
    assert!(
        handoff < SLOW_BACKSTOP / 2,
        "the waiter took {handoff:?} (its retry delay is {SLOW_BACKSTOP:?})"
    );
    for i in 0..3 {
        assert_eq!(
            cluster.command_calls(i, "subscribe").await,
            0,
            "node {i}: a waiter for this client's own lock subscribed"
        );
    }
}

/// `lock()` gives up within its retry budget: 5 attempts 20-30 ms apart on a name held
/// for a minute end with `Busy` after about 150 ms, whether another client or this one
/// holds the name, instead of waiting in the queue for the holder's TTL. `lock_until`
/// keeps its own deadline.
#[tokio::test]
async fn lock_gives_up_within_its_retry_budget() {
    let cluster = Cluster::start(3);
    let budgeted = |b: tower_redlock::RedlockBuilder| {
        b.ttl(Duration::from_secs(60))
            .max_attempts(5)
            .retry_delay(Duration::from_millis(20), Duration::from_millis(10))
    };
    let holder = cluster.client(budgeted).await;
    let other = cluster.client(budgeted).await;
    let held = holder.lock("budget").await.expect("lock");
    for (who, client) in [("another client", &other), ("the holder's client", &holder)] {
        // Twice: the second call finds the queue the first one left (or joins it).
        for _ in 0..2 {
            let outcome = tokio::time::timeout(Duration::from_secs(10), client.lock("budget"))
                .await
                .unwrap_or_else(|_| panic!("{who}: lock() still waits after 10 s"));
            match outcome {
                Err(tower_redlock::LockError::Busy { attempts, .. }) => {
                    assert!((1..=5).contains(&attempts), "{who}: {attempts} attempts");
                }
                other => panic!("{who}: expected Busy, got {other:?}"),
            }
        }
    }
    // Two waiters of one client at once: both give up (the one behind the head too).
    let (a, b) = tokio::join!(other.lock("budget"), other.lock("budget"));
    assert!(
        matches!(a, Err(tower_redlock::LockError::Busy { .. })),
        "{a:?}"
    );
    assert!(
        matches!(b, Err(tower_redlock::LockError::Busy { .. })),
        "{b:?}"
    );
    // lock_until waits by its deadline, not by the attempts' budget.
    let until = Instant::now() + Duration::from_millis(600);
    let outcome = other
        .lock_until("budget", Duration::from_secs(60), until)
        .await;
    assert!(matches!(
        outcome,
        Err(tower_redlock::LockError::Busy { .. })
    ));
    assert!(
        Instant::now() >= until,
        "lock_until gave up before its deadline"
    );
    let _ = holder.unlock(&held).await;
}

/// A replay layer that rejects a busy name (the default) makes its one attempt at once, as
/// a layer without replay does: it does not queue behind a task of its client that waits
/// for the same name (it used to queue there: here it waited out the holder's 10 s TTL
/// behind the waiter, and then ran instead of answering 409).
#[tokio::test]
async fn a_replay_request_rejected_when_busy_does_not_queue_behind_a_waiter() {
    use tower::ServiceExt;
    use tower_redlock::RedlockLayer;
    use tower_redlock::layer::Header;

    let cluster = Cluster::start(3);
    let holder = cluster.client(|b| b).await;
    let waiter = slow_waiter(&cluster).await;
    let name: &'static str =
        Box::leak(support::header_lock("idempotency-key", "busy").into_boxed_str());
    let (lock, task) = queued(&cluster, &holder, &waiter, name).await;
    let layer = RedlockLayer::new(waiter.clone(), Header::new("idempotency-key").required())
        .replay(Duration::from_secs(60));
    let service = axum::Router::new()
        .route("/pay", axum::routing::post(|| async { "ran" }))
        .route_layer(layer);
    let request = http::Request::post("/pay")
        .header("idempotency-key", "busy")
        .body(axum::body::Body::empty())
        .expect("request");
    let sent = Instant::now();
    let response = service.oneshot(request).await.expect("response");
    let took = sent.elapsed();
    assert_eq!(response.status(), http::StatusCode::CONFLICT);
    assert!(
        took < Duration::from_secs(1),
        "the busy answer took {took:?} (the waiter's retry delay is {SLOW_BACKSTOP:?})"
    );
    let _ = holder.unlock(&lock).await;
    task.await
        .expect("the waiter gets the lock after the release");
}
