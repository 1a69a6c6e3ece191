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
    let _ = redlock.unlock(&lock).await;
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
    let _ = named.unlock(&lock).await;
    assert!(text().contains("lock=order-public-7"), "{}", text());
}

/// A node that stops answering while the others still make a quorum: its calls are left
/// to land in the background, and when `reconnect_after_timeouts` of them in a row get no
/// answer in time its connection is dropped, so that a new one serves it once it is back.
#[tokio::test]
async fn a_node_that_hangs_behind_a_quorum_gets_a_new_connection() {
    let logs = support::CapturedLogs::start();
    let mut cluster = Cluster::start(3);
    let redlock = builder(cluster.urls())
        .node_timeout(Duration::from_millis(100))
        .reconnect_after_timeouts(2)
        .build()
        .expect("build");
    support::warm(&redlock).await;
    let mut raw = cluster.raw(2).await;
    let connections = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("total_connections_received in INFO stats")
    };
    let mut info = redis::cmd("INFO");
    info.arg("stats");
    let before = connections(info.query_async(&mut raw).await.expect("INFO"));
    cluster.nodes[2].pause();
    for i in 0..2 {
        // The other two nodes make the quorum; the hung node's call is left behind. The
        // lock is left to expire.
        let _ = redlock
            .try_lock(format!("behind-{i}"))
            .await
            .expect("a quorum without the hung node");
    }
    support::wait_for(
        "the hung node's connection to be dropped",
        Duration::from_secs(10),
        || async { logs.contains("2 consecutive timeouts") },
    )
    .await;
    cluster.nodes[2].resume();
    let mut round = 0;
    support::wait_for(
        "a new connection to the node once it is back",
        Duration::from_secs(10),
        || {
            round += 1;
            let (redlock, raw, info) = (&redlock, raw.clone(), info.clone());
            async move {
                let mut raw = raw;
                let lock = redlock.try_lock(format!("back-{round}")).await;
                if let Ok(lock) = lock {
                    let _ = redlock.unlock(&lock).await;
                }
                let now = connections(info.query_async(&mut raw).await.expect("INFO"));
                now > before
            }
        },
    )
    .await;
}

/// Each request the layer locks runs in a `redlock.layer` span that records its outcome:
/// acquired, replayed, or rejected with the kind; the lock as a hash, never the name.
#[tokio::test]
async fn the_layer_span_records_each_requests_outcome() {
    use tower::{Layer, ServiceExt, service_fn};
    use tower_redlock::RedlockLayer;
    use tower_redlock::layer::Header;

    let logs = support::CapturedLogs::start_with(tracing_subscriber::fmt::format::FmtSpan::CLOSE);
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    let svc = RedlockLayer::new(redlock.clone(), Header::new("idempotency-key").required())
        .fencing(false)
        .replay(Duration::from_secs(60))
        .without_body_fingerprint()
        .layer(service_fn(|_req: http::Request<String>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::from("done")))
        }));
    let call = |key: Option<&str>| {
        let mut req = http::Request::post("/pay");
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        let req = req.body(String::new()).expect("request");
        let svc = svc.clone();
        async move {
            let res = svc.oneshot(req).await.expect("response");
            let status = res.status();
            http_body_util::BodyExt::collect(res.into_body())
                .await
                .expect("body");
            status
        }
    };
    assert_eq!(call(Some("span-secret-1")).await, 200);
    assert_eq!(call(Some("span-secret-1")).await, 200);
    let held = redlock
        .lock(support::header_lock("idempotency-key", "span-secret-2"))
        .await
        .expect("lock");
    assert_eq!(call(Some("span-secret-2")).await, 409);
    let _ = redlock.unlock(&held).await;
    assert_eq!(call(None).await, 400);
    let logged = logs.text();
    for needle in [
        "redlock.layer{lock=#",
        "outcome=\"acquired\"",
        "outcome=\"replayed\"",
        "outcome=\"rejected\" rejection=\"busy\"",
        "outcome=\"rejected\" rejection=\"bad_request\"",
    ] {
        assert!(
            logged.contains(needle),
            "{needle:?} missing from:\n{logged}"
        );
    }
    assert!(!logged.contains("span-secret"), "a name shows:\n{logged}");
}

/// A completion record that reaches fewer than a quorum of nodes is logged, and its body
/// fails (`NotRecorded`); one that reaches exactly a quorum is not, and its body is whole.
#[tokio::test]
async fn a_record_stored_on_too_few_nodes_is_logged() {
    use std::sync::{Arc, Mutex};
    use tower::{Layer, ServiceExt, service_fn};
    use tower_redlock::RedlockLayer;
    use tower_redlock::layer::Header;

    const TOO_FEW: &str = "stored the completion record on too few nodes";
    let logs = support::CapturedLogs::start();
    for (kill, warned) in [(1, false), (2, true)] {
        let cluster = Arc::new(Mutex::new(Cluster::start(3)));
        let urls = cluster.lock().expect("cluster").urls();
        let redlock = builder(urls)
            .node_timeout(Duration::from_millis(200))
            .build()
            .expect("build");
        support::warm(&redlock).await;
        let before = logs.text().matches(TOO_FEW).count();
        let svc = RedlockLayer::new(redlock, Header::new("idempotency-key"))
            .fencing(false)
            .replay(Duration::from_secs(60))
            .without_body_fingerprint()
            .layer(service_fn({
                let cluster = Arc::clone(&cluster);
                move |_req: http::Request<String>| {
                    // The handler ran with the lock on 3 nodes; `kill` of them die now.
                    let mut cluster = cluster.lock().expect("cluster");
                    for node in cluster.nodes.iter_mut().take(kill) {
                        node.kill();
                    }
                    async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(String::from("done")))
                    }
                }
            }));
        let req = http::Request::post("/pay")
            .header("idempotency-key", format!("few-{kill}"))
            .body(String::new())
            .expect("request");
        let res = svc.oneshot(req).await.expect("response");
        let body = http_body_util::BodyExt::collect(res.into_body()).await;
        // Too few: no complete response without its record.
        match body {
            Ok(_) => assert!(!warned, "{kill} node(s) down: a complete body"),
            Err(e) => assert!(
                warned && e.is::<tower_redlock::layer::NotRecorded>(),
                "{kill} node(s) down: {e}"
            ),
        }
        let after = logs.text().matches(TOO_FEW).count();
        assert_eq!(
            after > before,
            warned,
            "{kill} node(s) down:\n{}",
            logs.text()
        );
    }
}

/// At debug, a replay and the completion that released the lock say what happened: no
/// "attempt failed" with the record's bytes, no "released=0 not_held=3" that reads as a
/// lost lock.
#[tokio::test]
async fn a_replay_and_the_release_after_recording_log_what_happened() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use tower::{Layer, ServiceExt, service_fn};

    let logs = support::CapturedLogs::start();
    let cluster = Cluster::start(3);
    let redlock = builder(cluster.urls()).build().expect("build");
    support::warm(&redlock).await;
    let svc = tower_redlock::RedlockLayer::new(
        redlock,
        tower_redlock::layer::Header::new("x-delivery-id"),
    )
    .replay(Duration::from_secs(60))
    .layer(service_fn(
        |_req: http::Request<tower_redlock::layer::PrefixedBody<Full<Bytes>>>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(
                "secret-response-body",
            ))))
        },
    ));
    for _ in 0..2 {
        let req = http::Request::post("/hook")
            .header("x-delivery-id", "evt-1")
            .body(Full::default())
            .expect("request");
        let res = svc.clone().oneshot(req).await.expect("response");
        let body = res.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(body, "secret-response-body");
    }
    let logged = logs.text();
    for needle in [
        "redlock released by its completion record",
        "stored=3 unanswered=0",
        "redlock attempt found the name's completion record",
    ] {
        assert!(
            logged.contains(needle),
            "{needle:?} missing from:\n{logged}"
        );
    }
    for wrong in ["failure=Record", "not_held=3", "secret-response-body"] {
        assert!(!logged.contains(wrong), "{wrong:?} in:\n{logged}");
    }
}
