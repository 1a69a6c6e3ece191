//! Releases that must get through: past a refused notification, past a caller that stops
//! polling, and never overtaken by their own acquisition across a reconnect; against real
//! Redis nodes.

use crate::support;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::join_all;
use support::{CapturedLogs, Cluster, wait_for};
use tower_redlock::{Lock, LockError, Redlock};

/// The key of lock `name` under the default prefix.
fn key(name: &str) -> String {
    format!("redlock:{{{name}}}")
}

/// Polls `future` once: it must still be pending (its command is on its way, or what it
/// waits for is held up).
async fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) {
    let mut future = future;
    let pending = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_pending()));
    assert!(
        pending.await,
        "finished at its first poll: nothing held it up"
    );
}

/// Takes the lock of each of `names` at once, each of which must be granted.
async fn lock_all(
    redlock: &Redlock,
    names: impl IntoIterator<Item = impl AsRef<[u8]>>,
) -> Vec<Lock> {
    let locks = join_all(names.into_iter().map(|n| redlock.lock(n))).await;
    locks.into_iter().map(|l| l.expect("lock")).collect()
}

/// A user whose ACL lets it run `PUBLISH` but not on the lock channels (Redis 7's default
/// `acl-pubsub-default resetchannels`), nor `MGET` (a rule written before batched releases
/// read with it): releases still release, while a waiter of another client has marked the
/// node so that they publish. A single unlock reports the key released, a batch of
/// releases (read key by key, `MGET` refused) deletes every key of the batch, and the
/// refusal is named once per node.
#[tokio::test]
async fn a_refused_publish_does_not_stop_a_release() {
    let cluster = Cluster::start(1);
    let mut admin = cluster.raw(0).await;
    // The README's rule without the channel pattern and `+mget`.
    let rule = "SETUSER locker on >secret resetkeys ~redlock:* resetchannels -@all +set +get \
                +pttl +del +pexpire +publish +zadd +zscore +evalsha +eval +script|load +info \
                +subscribe +unsubscribe +ping";
    let mut acl = redis::cmd("ACL");
    for word in rule.split_whitespace() {
        acl.arg(word);
    }
    let _: () = acl.query_async(&mut admin).await.expect("ACL SETUSER");
    // Another client waits for some lock on the node: releases tell the waiters.
    let _: () = redis::cmd("SET")
        .arg("redlock:#waiting")
        .arg(1)
        .arg("PX")
        .arg(600_000)
        .query_async(&mut admin)
        .await
        .expect("SET the waiting key");
    let url = format!(
        "redis://locker:secret@127.0.0.1:{}",
        cluster.nodes[0].port()
    );
    let logs = CapturedLogs::start();
    let redlock = Redlock::builder([url])
        .restart_quarantine(false)
        .build()
        .expect("build");

    let lock = redlock.lock("no-channel").await.expect("lock");
    assert_eq!(cluster.nodes_holding(key("no-channel")).await, 1);
    let report = redlock.unlock(&lock).await;
    assert_eq!(report.released(), 1, "{report:?}");
    assert!(report.failures().is_empty(), "{report:?}");
    assert_eq!(cluster.nodes_holding(key("no-channel")).await, 0);

    // Released together: merged into script calls as our connection writes them.
    let names: Vec<String> = (0..40).map(|i| format!("batch-{i}")).collect();
    let locks = lock_all(&redlock, &names).await;
    assert_eq!(cluster.nodes_holding(key(&names[0])).await, 1);
    let reports = join_all(locks.iter().map(|l| redlock.unlock(l))).await;
    for (name, report) in names.iter().zip(&reports) {
        assert_eq!(report.released(), 1, "{name}: {report:?}");
        assert_eq!(
            cluster.nodes_holding(key(name)).await,
            0,
            "{name} is still locked"
        );
    }
    let text = logs.text();
    assert_eq!(
        text.matches("refused PUBLISH").count(),
        1,
        "one warning per node that names the refused command: {text}"
    );
    assert!(
        text.contains("&<key prefix>*"),
        "it says what fixes it: {text}"
    );
}

/// The URL tail for a client over our own connections or (`resp3`) redis-rs's, where a
/// release on its way holds its node's release turn.
fn tail(resp3: bool) -> &'static str {
    if resp3 { "/?protocol=resp3" } else { "" }
}

/// A client of `cluster` over our own connections or (`resp3`) redis-rs's: a TTL that
/// outlasts the test, a node timeout of 100 ms.
async fn short_timeout_client(cluster: &Cluster, resp3: bool) -> Redlock {
    cluster
        .client_over(tail(resp3), |b| {
            b.ttl(Duration::from_secs(60))
                .node_timeout(Duration::from_millis(100))
        })
        .await
}

/// A release polled once and then left alone without being dropped (pinned in a
/// `select!` loop, stored, leaked) does not stall the client's other releases to that
/// node on our own connection, which has no release turn. (On redis-rs's connections it
/// holds the node's turn until its deadline.)
#[tokio::test]
async fn a_release_left_unpolled_does_not_stall_the_others() {
    let cluster = Cluster::start(1);
    let redlock = cluster.client(|b| b.ttl(Duration::from_secs(60))).await;
    let a = redlock.lock("stalled").await.expect("lock");
    assert_eq!(cluster.nodes_holding(key("stalled")).await, 1);
    let mut stalled = Box::pin(redlock.unlock(&a));
    poll_once(stalled.as_mut()).await;
    wait_for(
        "the stalled release's delete",
        Duration::from_secs(5),
        || async { cluster.nodes_holding(key("stalled")).await == 0 },
    )
    .await;
    for i in 0..5 {
        let lock = redlock.lock(format!("after-{i}")).await.expect("lock");
        let report = redlock.unlock(&lock).await;
        assert_eq!(report.released(), 1, "release {i}: {report:?}");
    }
    let locks = lock_all(&redlock, (0..20).map(|i| format!("together-{i}"))).await;
    for report in join_all(locks.iter().map(|l| redlock.unlock(l))).await {
        assert_eq!(report.released(), 1, "{report:?}");
    }
    drop(stalled);
}

/// When the stalled release's answer does not come (the node is paused), the releases
/// after it (on redis-rs's connections, queued behind it until its deadline passes)
/// reach the node even though their own callers stopped waiting meanwhile.
#[tokio::test]
async fn releases_behind_a_stalled_turn_still_reach_the_node() {
    for resp3 in [false, true] {
        releases_behind_a_stalled_release_still_reach_the_node(resp3).await;
    }
}

async fn releases_behind_a_stalled_release_still_reach_the_node(resp3: bool) {
    let mut cluster = Cluster::start(1);
    let redlock = short_timeout_client(&cluster, resp3).await;
    let a = redlock.lock("stalled").await.expect("lock");
    let b = redlock.lock("behind").await.expect("lock");
    assert_eq!(cluster.nodes_holding(key("behind")).await, 1);
    cluster.nodes[0].pause();
    let mut stalled = Box::pin(redlock.unlock(&a));
    poll_once(stalled.as_mut()).await;
    // Behind the stalled release; the node does not answer in time.
    let report = redlock.unlock(&b).await;
    assert_eq!(report.released(), 0, "{report:?}");
    cluster.nodes[0].resume();
    wait_for(
        "the queued release's delete",
        Duration::from_secs(5),
        || async { cluster.nodes_holding(key("behind")).await == 0 },
    )
    .await;
    drop(stalled);
}

/// Releases our own connection to a node has not written yet when it is dropped (behind
/// requests the paused node does not answer, which time out and make the node reconnect)
/// go out on its next connection, and delete their keys once the node answers again,
/// though their callers stopped waiting long before. Nothing is reported as lost.
#[tokio::test]
async fn releases_not_written_when_the_connection_drops_go_on_the_next_one() {
    let logs = CapturedLogs::start();
    let mut cluster = Cluster::start(1);
    let _redlock = releases_left_unwritten(&mut cluster).await;
    cluster.nodes[0].resume();
    for name in UNWRITTEN {
        wait_for(
            "the release sent again on the next connection",
            Duration::from_secs(10),
            || async { cluster.nodes_holding(key(name)).await == 0 },
        )
        .await;
    }
    wait_for("the resend's end", Duration::from_secs(10), || async {
        logs.contains("releases sent again to a node after its connection broke")
    })
    .await;
    assert!(!logs.contains("could not be sent to a node after its connection broke"));
}

/// When the next connection never comes (the node is gone), the releases sent again fail,
/// and the client says that their keys stay until their TTL.
#[tokio::test]
async fn releases_not_sent_again_are_reported() {
    let logs = CapturedLogs::start();
    let mut cluster = Cluster::start(1);
    let _redlock = releases_left_unwritten(&mut cluster).await;
    cluster.nodes[0].kill();
    wait_for("the warning", Duration::from_secs(10), || async {
        logs.contains("could not be sent to a node after its connection broke")
    })
    .await;
}

/// `shutdown` waits for the releases to be sent again after a broken connection, though
/// their callers stopped waiting long before: while the node is still paused it is not
/// done, and once it returns, their keys are gone.
#[tokio::test]
async fn shutdown_waits_for_the_releases_sent_again() {
    let mut cluster = Cluster::start(1);
    let redlock = releases_left_unwritten(&mut cluster).await;
    shutdown_waits_for_the_paused_node(&mut cluster, &redlock, &UNWRITTEN).await;
}

/// `shutdown` waits for a release queued behind another on redis-rs's connections (the
/// node's batch task sends it), though its caller stopped waiting: while the node is
/// paused it is not done, and once it returns, the keys are gone.
#[tokio::test]
async fn shutdown_waits_for_the_queued_releases() {
    let mut cluster = Cluster::start(1);
    let redlock = short_timeout_client(&cluster, true).await;
    let names = ["first", "queued"];
    let locks = lock_all(&redlock, names).await;
    cluster.nodes[0].pause();
    let reports = join_all(locks.iter().map(|l| redlock.unlock(l))).await;
    for report in &reports {
        assert_eq!(report.released(), 0, "the node is paused: {report:?}");
    }
    shutdown_waits_for_the_paused_node(&mut cluster, &redlock, &names).await;
}

/// `redlock.shutdown()` is not done while `cluster`'s one node is paused (releases of
/// `names` are still on their way to it); once the node is resumed it finishes with
/// every release answered, and none of `names` is locked any more.
async fn shutdown_waits_for_the_paused_node(
    cluster: &mut Cluster,
    redlock: &Redlock,
    names: &[&str],
) {
    let shutdown = redlock.shutdown();
    tokio::pin!(shutdown);
    poll_once(shutdown.as_mut()).await;
    cluster.nodes[0].resume();
    assert_eq!(shutdown.await.unfinished(), 0);
    for name in names {
        assert_eq!(cluster.nodes_holding(key(name)).await, 0, "{name}");
    }
}

/// Releases merged into one call while the node's script cache is empty (`SCRIPT FLUSH`)
/// still delete their keys: the merged call is refused with `NOSCRIPT`, and each release
/// falls back to `EVAL` as it would alone. The releases wait behind four acquisitions that
/// the paused node holds up, so they go out together in one call once it answers.
#[tokio::test]
async fn merged_releases_fall_back_when_the_scripts_were_flushed() {
    let mut cluster = Cluster::start(1);
    let redlock = cluster
        .client(|b| {
            b.ttl(Duration::from_secs(60))
                .node_timeout(Duration::from_secs(2))
        })
        .await;
    let names = ["flushed-0", "flushed-1", "flushed-2"];
    let locks = lock_all(&redlock, names).await;
    let mut raw = cluster.raw(0).await;
    for command in [["SCRIPT", "FLUSH"], ["CONFIG", "RESETSTAT"]] {
        let _: () = redis::cmd(command[0])
            .arg(command[1])
            .query_async(&mut raw)
            .await
            .expect(command[0]);
    }
    let busy = pause_behind_four_acquisitions(&mut cluster, &redlock, "flushed-busy").await;
    let mut unlocks = Box::pin(join_all(locks.iter().map(|l| redlock.unlock(l))));
    poll_once(unlocks.as_mut()).await;
    cluster.nodes[0].resume();
    let (attempts, reports) = tokio::join!(join_all(busy), unlocks);
    assert!(attempts.iter().all(Result::is_ok), "{attempts:?}");
    for report in &reports {
        assert_eq!(report.released(), 1, "{report:?}");
    }
    for name in names {
        assert_eq!(cluster.nodes_holding(key(name)).await, 0, "{name}");
    }
    // One merged call was refused (not one per release), and each release ran as `EVAL`.
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw)
        .await
        .expect("INFO");
    let calls = |command: &str| {
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse::<u32>().ok())
            .unwrap_or(0)
    };
    assert_eq!((calls("evalsha"), calls("eval")), (1, 3), "{stats}");
}

/// The locks whose releases are left unwritten by [`releases_left_unwritten`].
const UNWRITTEN: [&str; 2] = ["unwritten-0", "unwritten-1"];

/// Takes the locks of [`UNWRITTEN`] on `cluster`'s one node, pauses the node, puts four
/// acquisitions on the connection (deep enough that releases wait for its next write) and
/// releases the locks: the acquisitions time out, the node reconnects, and the releases,
/// never written, are sent again. Returns once every call has given up (the releases'
/// reports say so); the node is still paused.
async fn releases_left_unwritten(cluster: &mut Cluster) -> Redlock {
    let redlock = cluster
        .client(|b| {
            b.ttl(Duration::from_secs(60))
                .node_timeout(Duration::from_millis(200))
                .connect_timeout(Duration::from_secs(20))
                .reconnect_after_timeouts(1)
        })
        .await;
    let locks = lock_all(&redlock, UNWRITTEN).await;
    assert_eq!(cluster.nodes_holding(key(UNWRITTEN[1])).await, 1);
    let busy = pause_behind_four_acquisitions(cluster, &redlock, "busy").await;
    let unlocks = join_all(locks.iter().map(|l| redlock.unlock(l)));
    let (attempts, reports) = tokio::join!(join_all(busy), unlocks);
    assert!(attempts.iter().all(Result::is_err), "the node is paused");
    for report in &reports {
        assert_eq!(report.released(), 0, "{report:?}");
    }
    redlock
}

/// `shutdown()` waits for the releases on their way: 200 guards dropped at once (their
/// releases spawned in the background, most of them queued behind one another for each
/// node) on nodes 40 ms away (a fault proxy delays every chunk), then a shutdown, and no
/// lock key is left on any node the moment it returns. After it, acquisitions and
/// extensions fail with `LockError::Closed`, for every clone, while a lock taken before can
/// still be released. On a current-thread runtime, so the dropped guards' release tasks
/// have not even started when the shutdown begins.
#[tokio::test]
async fn shutdown_sends_the_queued_releases_and_closes_the_client() {
    use support::{FaultProxy, Mode};

    let cluster = Cluster::start(3);
    let mut proxies = Vec::new();
    for url in cluster.urls() {
        proxies.push(FaultProxy::start(url.trim_start_matches("redis://").to_owned()).await);
    }
    let redlock = support::builder(proxies.iter().map(FaultProxy::url))
        .fencing(false)
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_secs(1))
        .build()
        .expect("build");
    support::warm(&redlock).await;
    let names: Vec<String> = (0..200).map(|i| format!("shutdown-{i}")).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(redlock.acquire(name).await.expect("acquire"));
    }
    let mut kept = redlock.lock("kept").await.expect("lock");
    // One round trip per node to count the keys, on connections opened beforehand.
    let mut raw = Vec::new();
    for i in 0..3 {
        raw.push(cluster.raw(i).await);
    }
    let locked = |raw: &mut Vec<redis::aio::MultiplexedConnection>| {
        let mut exists = redis::cmd("EXISTS");
        for name in &names {
            exists.arg(key(name));
        }
        let raw = raw.clone();
        async move {
            let mut held = 0;
            for mut conn in raw {
                held += exists
                    .query_async::<usize>(&mut conn)
                    .await
                    .expect("EXISTS");
            }
            held
        }
    };
    assert_eq!(locked(&mut raw).await, 600);
    for proxy in &proxies {
        proxy.set(Mode::delay(Duration::from_millis(40)));
    }
    drop(guards);
    let clone = redlock.clone();
    let report = redlock.shutdown().await;
    assert_eq!(report.unfinished(), 0);
    assert_eq!(
        locked(&mut raw).await,
        0,
        "keys still locked after the shutdown"
    );
    assert_eq!(
        clone.try_lock("after").await.unwrap_err(),
        LockError::Closed
    );
    assert_eq!(clone.lock("after").await.unwrap_err(), LockError::Closed);
    assert!(matches!(
        clone.acquire("after").await,
        Err(LockError::Closed)
    ));
    assert_eq!(
        clone.extend(&mut kept, Duration::from_secs(5)).await,
        Err(LockError::Closed)
    );
    assert_eq!(clone.unlock(&kept).await.released(), 3);
}

/// An acquisition held up by a paused node.
type Busy<'a> = Pin<Box<dyn Future<Output = Result<Lock, LockError>> + 'a>>;

/// Pauses `cluster`'s one node and puts four acquisitions (`{prefix}-0` to `-3`) on
/// `redlock`'s connection to it, deep enough that releases after them wait for the
/// connection's next write: the acquisitions, still pending.
async fn pause_behind_four_acquisitions<'a>(
    cluster: &mut Cluster,
    redlock: &'a Redlock,
    prefix: &str,
) -> Vec<Busy<'a>> {
    cluster.nodes[0].pause();
    let mut busy: Vec<Busy<'a>> = (0..4)
        .map(|i| Box::pin(redlock.try_lock(format!("{prefix}-{i}"))) as Busy<'a>)
        .collect();
    for attempt in &mut busy {
        poll_once(attempt.as_mut()).await;
    }
    // The connection's task writes them (the tests' runtime has one thread: it runs now).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    busy
}
