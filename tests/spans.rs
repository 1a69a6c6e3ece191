//! The spans of the client's operations, seen by a test subscriber. In a test binary of
//! their own: `tracing` caches, per call site, whether any subscriber is interested, and
//! tests on other threads hitting the same call sites for the first time while this one
//! sets its subscriber up could leave that cache saying "no".

mod support;

use std::time::Duration;

use support::{Cluster, builder};

/// The spans of acquire, extend and release carry node count, quorum, attempts, elapsed
/// time and outcome; a hash of the name unless names are opted in; never the value.
#[tokio::test]
async fn spans_show_counts_and_outcomes_and_never_the_value() {
    let logs = support::CapturedLogs::start_with(tracing_subscriber::fmt::format::FmtSpan::CLOSE);
    let text = || logs.text();

    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    let mut lock = redlock.lock("order-secret-42").await.expect("lock");
    redlock
        .extend(&mut lock, Duration::from_secs(5))
        .await
        .expect("extend");
    redlock.unlock(&lock).await;
    let logged = text();
    for needle in [
        "redlock.acquire{",
        "redlock.extend{",
        "redlock.release{",
        "nodes=3",
        "quorum=2",
        "attempts=1",
        "outcome=\"acquired\"",
        "outcome=\"extended\"",
        "released=3",
        "elapsed_us=",
        "lock=#",
    ] {
        assert!(
            logged.contains(needle),
            "{needle:?} missing from:\n{logged}"
        );
    }
    assert!(
        !logged.contains("order-secret-42"),
        "the name shows:\n{logged}"
    );
    assert!(!logged.contains(lock.value()), "the value shows:\n{logged}");

    let named = builder(cluster.urls())
        .log_lock_names(true)
        .build()
        .expect("build");
    let lock = named.lock("order-public-7").await.expect("lock");
    named.unlock(&lock).await;
    assert!(text().contains("lock=order-public-7"), "{}", text());
}
