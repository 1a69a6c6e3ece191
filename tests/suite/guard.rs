//! LockGuard: auto-extension and the lost signal, against real Redis nodes.

use crate::support;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use support::{Cluster, wait_for};
use tower_redlock::{LockError, LostReason, RedlockBuilder};

/// TTL 600 ms, extended every 200 ms.
fn builder(cluster: &Cluster) -> RedlockBuilder {
    support::builder(cluster.urls())
        .ttl(Duration::from_millis(600))
        .node_timeout(Duration::from_millis(50))
}

#[tokio::test]
async fn a_holder_keeps_its_lock_for_three_ttls_then_releases() {
    let cluster = Cluster::start(3);
    let redlock = builder(&cluster).build().expect("build");
    let other = builder(&cluster).build().expect("build");
    support::warm(&redlock).await;
    support::warm(&other).await;
    let guard = redlock.acquire("long-job").await.expect("acquire");
    let token = guard.token();
    let first_deadline = token.valid_until();
    let end = Instant::now() + Duration::from_millis(1_800);
    let mut checks = 0;
    while Instant::now() < end {
        match other.try_lock("long-job").await {
            Err(LockError::Busy { .. }) => {}
            other => panic!("the lock slipped at {checks}: {other:?}"),
        }
        assert!(token.is_held());
        checks += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(checks > 20);
    assert!(
        token.valid_until() > first_deadline + Duration::from_millis(900),
        "extended"
    );
    let report = guard.release().await;
    assert!(report.released() >= 2);
    assert_eq!(token.lost_reason(), Some(LostReason::Released));
    let lock = other
        .try_lock("long-job")
        .await
        .expect("free after release");
    let _ = other.unlock(&lock).await;
}

#[tokio::test]
async fn deleting_the_key_on_a_majority_fires_the_lost_signal_within_one_interval() {
    let cluster = Cluster::start(3);
    let redlock = support::builder(cluster.urls())
        .ttl(Duration::from_secs(3))
        .build()
        .expect("build");
    support::warm(&redlock).await;
    let guard = redlock.acquire("deleted").await.expect("acquire");
    let token = guard.token();
    let key = b"redlock:{deleted}";
    for i in [0, 1] {
        let mut conn = cluster.raw(i).await;
        let _: () = conn.del(key).await.expect("DEL");
    }
    let deleted_at = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), token.lost())
        .await
        .expect("the lost signal fires");
    let took = deleted_at.elapsed();
    assert!(took <= Duration::from_millis(1_000 + 300), "after {took:?}");
    match reason {
        LostReason::ExtendFailed(LockError::NotHeld { .. }) => {}
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert!(!token.is_held());
    assert!(!guard.is_held());
    // What was left of ours is cleaned up.
    wait_for("our last key to go", Duration::from_secs(5), || async {
        cluster.nodes_holding(key).await == 0
    })
    .await;
}

#[tokio::test]
async fn a_paused_majority_fires_the_lost_signal_before_the_deadline() {
    let mut cluster = Cluster::start(3);
    let redlock = builder(&cluster).build().expect("build");
    support::warm(&redlock).await;
    let guard = redlock.acquire("paused").await.expect("acquire");
    let token = guard.token();
    cluster.nodes[0].pause();
    cluster.nodes[2].pause();
    let reason = tokio::time::timeout(Duration::from_secs(5), token.lost())
        .await
        .expect("the lost signal fires");
    let fired = Instant::now();
    assert!(
        fired < token.valid_until(),
        "fired {:?} after the deadline",
        fired - token.valid_until()
    );
    let LostReason::ExtendFailed(error @ LockError::NoQuorum { .. }) = &reason else {
        panic!("expected a failed extension without quorum, got {reason:?}");
    };
    // The first failure leaves room in the validity for a retry: every attempt is counted.
    assert!(error.attempts() >= Some(2), "{error:?}");
    assert!(!token.is_held());
    cluster.nodes[0].resume();
    cluster.nodes[2].resume();
}

#[tokio::test]
async fn is_held_turns_false_at_the_deadline_without_an_extension() {
    let cluster = Cluster::start(1);
    let redlock = builder(&cluster)
        .max_extensions(Some(0))
        .build()
        .expect("build");
    let guard = redlock.acquire("no-extension").await.expect("acquire");
    let token = guard.token();
    assert!(token.is_held());
    tokio::time::sleep_until(tokio::time::Instant::from_std(token.valid_until())).await;
    assert!(!token.is_held(), "held past the validity deadline");
    let reason = tokio::time::timeout(Duration::from_secs(5), token.lost())
        .await
        .expect("the signal follows");
    assert_eq!(reason, LostReason::MaxExtensionsReached);
}

#[tokio::test]
async fn the_maximum_hold_releases_and_says_why() {
    let cluster = Cluster::start(3);
    let redlock = builder(&cluster)
        .max_hold(Some(Duration::from_millis(900)))
        .build()
        .expect("build");
    support::warm(&redlock).await;
    let guard = redlock.acquire("bounded").await.expect("acquire");
    let acquired = Instant::now();
    let token = guard.token();
    let reason = tokio::time::timeout(Duration::from_secs(5), token.lost())
        .await
        .expect("the signal fires");
    assert_eq!(reason, LostReason::MaxHoldReached);
    assert!(acquired.elapsed() >= Duration::from_millis(850));
    wait_for(
        "the lock to be released",
        Duration::from_secs(5),
        || async { cluster.nodes_holding(b"redlock:{bounded}").await == 0 },
    )
    .await;
    drop(guard);
}

#[test]
fn dropping_a_guard_while_the_runtime_shuts_down_neither_panics_nor_blocks() {
    let cluster = Cluster::start(1);
    let urls = cluster.urls();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let redlock = support::builder(urls).build().expect("build");
        let guard = redlock.acquire("shutdown").await.expect("acquire");
        // A task that holds the guard forever: it is dropped by the shutdown.
        tokio::spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
    });
    let t = Instant::now();
    drop(rt);
    assert!(t.elapsed() < Duration::from_secs(2), "shutdown blocked");
    // Outside any runtime, dropping a guard is fine too.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let guard = rt.block_on(async {
        support::builder(cluster.urls())
            .build()
            .expect("build")
            .acquire("outside")
            .await
            .expect("acquire")
    });
    drop(rt);
    drop(guard);
}

/// One keep-alive driver per client extends every guard; a client that outlives the
/// runtime its driver ran on starts a new driver, so its guards never silently stop
/// extending.
#[test]
fn guards_keep_extending_in_numbers_and_across_runtimes() {
    let cluster = Cluster::start(3);
    let redlock = {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let redlock = builder(&cluster).build().expect("build");
            support::warm(&redlock).await;
            let guard = redlock.acquire("first-runtime").await.expect("acquire");
            let _ = guard.release().await;
            redlock
        })
    }; // that runtime, and the driver it ran, are gone
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let other = builder(&cluster).build().expect("build");
        support::warm(&other).await;
        let guards: Vec<_> =
            futures_util::future::join_all((0..10).map(|i| redlock.acquire(format!("many-{i}"))))
                .await
                .into_iter()
                .map(|g| g.expect("acquire"))
                .collect();
        let first: Vec<_> = guards.iter().map(|g| g.valid_until()).collect();
        let end = Instant::now() + Duration::from_millis(1_800);
        while Instant::now() < end {
            for (i, guard) in guards.iter().enumerate() {
                assert!(
                    guard.is_held(),
                    "guard {i} lost its lock: {:?}",
                    guard.lost_reason()
                );
            }
            match other.try_lock("many-3").await {
                Err(LockError::Busy { .. }) => {}
                slipped => panic!("the lock slipped: {slipped:?}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (guard, first) in guards.iter().zip(first) {
            assert!(
                guard.valid_until() > first + Duration::from_millis(900),
                "not extended"
            );
        }
        for guard in guards {
            assert!(guard.release().await.released() >= 2);
        }
    });
}

/// A guard whose keep-alive driver went away with its runtime is told so at once: its
/// token reports the loss, instead of the lock silently running out.
#[test]
fn a_guard_whose_keep_alive_driver_stopped_is_marked_lost() {
    let cluster = Cluster::start(1);
    let first = tokio::runtime::Runtime::new().expect("runtime");
    let (redlock, guard) = first.block_on(async {
        let redlock = builder(&cluster).build().expect("build");
        let guard = redlock.acquire("driver-gone").await.expect("acquire");
        (redlock, guard)
    });
    let token = guard.token();
    assert_eq!(token.lost_reason(), None);
    drop(first); // drops the driver task, which held the guard's lock
    assert_eq!(token.lost_reason(), Some(LostReason::KeepAliveStopped));
    assert!(!token.is_held());
    // From another runtime (where the old connection is found dead and replaced), the
    // name can be locked again and new guards are extended by a new driver.
    let second = tokio::runtime::Runtime::new().expect("runtime");
    second.block_on(async {
        let _ = guard.release().await;
        let again = redlock.acquire("driver-gone").await.expect("acquire");
        tokio::time::sleep(Duration::from_millis(900)).await; // past the 600 ms TTL
        assert!(again.is_held(), "{:?}", again.lost_reason());
        let _ = again.release().await;
    });
}

/// The keep-alive driver sleeps until its earliest lock is due; a guard handed in later
/// with an earlier due time (a shorter TTL) wakes it, and is extended in time.
#[tokio::test]
async fn a_guard_due_sooner_than_the_others_wakes_the_keep_alive_driver() {
    let cluster = Cluster::start(3);
    let redlock = support::builder(cluster.urls())
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_millis(50))
        .build()
        .expect("build");
    support::warm(&redlock).await;
    // First extension due in 10 s: the driver sleeps until then.
    let long = redlock.acquire("long-ttl").await.expect("acquire");
    let short = redlock.guard(
        redlock
            .lock_with_ttl("short-ttl", Duration::from_millis(600))
            .await
            .expect("lock"),
    );
    let token = short.token();
    let first = token.valid_until();
    wait_for(
        "the short lock's first extension",
        Duration::from_millis(1_500),
        || {
            let extended = token.valid_until() > first;
            async move { extended }
        },
    )
    .await;
    assert!(token.is_held(), "{:?}", token.lost_reason());
    assert!(short.release().await.released() >= 2);
    assert!(long.release().await.released() >= 2);
}

/// Lost means lost without extension too: a guard that cannot extend (made outside a
/// tokio runtime, so no keep-alive task runs) is lost when its validity runs out:
/// `lost()` resolves with `Expired`, `is_held()` turns false and `lost_reason()` agrees.
/// A guard that is extended is not: its `lost()` stays pending past three TTLs.
#[test]
fn a_guard_without_extension_is_lost_when_its_validity_runs_out() {
    let cluster = Cluster::start(1);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (redlock, lock) = runtime.block_on(async {
        let redlock = builder(&cluster).build().expect("build");
        let lock = redlock.lock("unextended").await.expect("lock");
        (redlock, lock)
    });
    let guard = redlock.guard(lock); // outside the runtime: nothing extends it
    let token = guard.token();
    runtime.block_on(async {
        assert!(token.is_held());
        assert_eq!(token.lost_reason(), None);
        let reason = tokio::time::timeout(Duration::from_secs(5), token.lost())
            .await
            .expect("the lost signal fires at the deadline");
        assert_eq!(reason, LostReason::Expired);
        assert!(
            Instant::now() >= token.valid_until(),
            "not before the deadline"
        );
        assert!(!token.is_held());
        assert_eq!(token.lost_reason(), Some(LostReason::Expired));
        let extended = redlock.acquire("extended").await.expect("acquire");
        let pending = tokio::time::timeout(Duration::from_millis(1_800), extended.lost()).await;
        assert!(pending.is_err(), "an extended guard was lost: {pending:?}");
        assert!(extended.is_held());
        let _ = extended.release().await;
        let _ = guard.release().await;
    });
}
