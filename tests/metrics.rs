//! The `metrics` feature: a debugging recorder sees the counters, histograms and gauges of
//! the client, the guard and the layer, with the names and labels the docs list.
#![cfg(feature = "metrics")]

mod support;

use std::convert::Infallible;
use std::time::Duration;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::{Cluster, wait_for};
use tokio::sync::Semaphore;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_redlock::layer::Header;
use tower_redlock::{LockError, LostReason, RedlockLayer};

/// What the recorder saw, summed over its snapshots (each snapshot resets counters,
/// gauges and histograms, so a gauge's snapshots are deltas that add up to its value).
struct Totals {
    snapshotter: Snapshotter,
    seen: Mutex<HashMap<String, (f64, usize)>>,
}

impl Totals {
    /// Takes a snapshot and adds it in; keyed by name, or `name{label=value}` too.
    fn refresh(&self) {
        let mut seen = self.seen.lock().expect("totals");
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let (amount, samples) = match value {
                DebugValue::Counter(n) => (n as f64, 0),
                DebugValue::Gauge(g) => (g.into_inner(), 0),
                DebugValue::Histogram(h) => (0.0, h.len()),
            };
            let mut names = vec![key.name().to_owned()];
            names.extend(
                key.labels()
                    .map(|l| format!("{}{{{}={}}}", key.name(), l.key(), l.value())),
            );
            for name in names {
                let entry = seen.entry(name).or_default();
                entry.0 += amount;
                entry.1 += samples;
            }
        }
    }

    /// A counter's or gauge's value (`name` or `name{label=value}`).
    fn value(&self, name: &str) -> f64 {
        self.refresh();
        self.seen
            .lock()
            .expect("totals")
            .get(name)
            .map_or(0.0, |v| v.0)
    }

    /// How many samples a histogram got.
    fn samples(&self, name: &str) -> usize {
        self.refresh();
        self.seen
            .lock()
            .expect("totals")
            .get(name)
            .map_or(0, |v| v.1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_metrics_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let s = Totals {
        snapshotter: recorder.snapshotter(),
        seen: Mutex::default(),
    };
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let cluster = Cluster::start(3);
    let redlock = cluster
        .client(|b| {
            b.ttl(Duration::from_millis(600))
                .node_timeout(Duration::from_millis(50))
                .max_hold(Some(Duration::from_millis(300)))
        })
        .await;
    let acquired_before = s.value("redlock_acquire_total{outcome=acquired}");

    // An acquisition, a busy attempt, a release.
    let lock = redlock.try_lock("m-1").await.expect("lock");
    assert!(matches!(
        redlock.try_lock("m-1").await,
        Err(LockError::Busy { .. })
    ));
    let _ = redlock.unlock(&lock).await;
    assert_eq!(
        s.value("redlock_acquire_total{outcome=acquired}"),
        acquired_before + 1.0
    );
    assert_eq!(s.value("redlock_acquire_total{outcome=busy}"), 1.0);
    assert!(s.value("redlock_released_total") >= 1.0);
    assert!(s.samples("redlock_acquire_seconds") >= 2);
    assert!(s.samples("redlock_hold_seconds") >= 1);

    // A guard held past its maximum hold is lost, and the held-locks gauge follows it.
    let guard = redlock.acquire("m-2").await.expect("guard");
    assert_eq!(s.value("redlock_held_locks"), 1.0);
    assert_eq!(guard.lost().await, LostReason::MaxHoldReached);
    assert_eq!(s.value("redlock_lost_total{reason=max_hold}"), 1.0);
    drop(guard);
    assert_eq!(s.value("redlock_held_locks"), 0.0);

    // A lock call waiting for a busy name shows in the waiting gauge.
    let held = redlock.try_lock("m-3").await.expect("lock");
    let waiter = tokio::spawn({
        let redlock = redlock.clone();
        async move { redlock.lock("m-3").await }
    });
    wait_for("a waiter", Duration::from_secs(5), || async {
        s.value("redlock_waiting") == 1.0
    })
    .await;
    let _ = redlock.unlock(&held).await;
    let got = waiter
        .await
        .expect("waiter")
        .expect("lock after the release");
    let _ = redlock.unlock(&got).await;
    assert_eq!(s.value("redlock_waiting"), 0.0);

    // The layer's replays.
    let svc = ServiceBuilder::new()
        .layer(
            RedlockLayer::new(redlock.clone(), Header::new("idempotency-key"))
                .replay(Duration::from_secs(60)),
        )
        .service(service_fn(|_req: http::Request<_>| async {
            Ok::<_, Infallible>(http::Response::new(String::from("done")))
        }));
    for _ in 0..3 {
        let req = http::Request::post("/m")
            .header("idempotency-key", "m-4")
            .body(String::new())
            .expect("request");
        let res = svc.clone().oneshot(req).await.expect("response");
        assert_eq!(res.status(), 200);
        // The response is recorded once its body has gone out whole.
        let body = http_body_util::BodyExt::collect(res.into_body()).await;
        assert_eq!(body.expect("body").to_bytes(), "done");
    }
    assert_eq!(s.value("redlock_replayed_total"), 2.0);

    // The nodes run without an append-only file (the harness's `--appendonly no`).
    let _ = redlock.health().await;
    assert_eq!(s.value("redlock_nodes_without_aof"), 3.0);

    // Young nodes in the restart quarantine are counted. The TTL (the quarantine's length)
    // leaves a slow machine time to connect all three before the first one's ends.
    let young = Cluster::start(3);
    let quarantined = tower_redlock::Redlock::builder(young.urls())
        .ttl(Duration::from_secs(5))
        .build()
        .expect("build");
    let _ = quarantined.try_lock("m-5").await;
    // The attempt is decided once two nodes failed; the health check waits for every node
    // to connect (and be found young).
    let _ = quarantined.health().await;
    wait_for(
        "every young node quarantined",
        Duration::from_secs(5),
        || async { s.value("redlock_quarantined_nodes") == 3.0 },
    )
    .await;
}

/// Every rejection the layer answers is counted with its kind: a busy key (409), a
/// malformed key (400) and, with replay on, a key reused on another path (422).
///
/// The test records into its own recorder, local to its thread: its runtime is
/// single-threaded, so the layer, the client and their tasks all run there, and neither
/// test sees the other's counts.
#[tokio::test]
async fn rejections_are_counted_by_kind() {
    let recorder = DebuggingRecorder::new();
    let s = Totals {
        snapshotter: recorder.snapshotter(),
        seen: Mutex::default(),
    };
    let _local = metrics::set_default_local_recorder(&recorder);
    let cluster = Cluster::start(1);
    let redlock = cluster.client(|b| b).await;
    let started = Arc::new(Semaphore::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let handler = {
        let (started, gate) = (started.clone(), gate.clone());
        service_fn(move |_req: http::Request<_>| {
            let (started, gate) = (started.clone(), gate.clone());
            async move {
                started.add_permits(1);
                gate.acquire().await.expect("gate").forget();
                Ok::<_, Infallible>(http::Response::new(String::from("paid")))
            }
        })
    };
    let svc = ServiceBuilder::new()
        .layer(
            RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
                .replay(Duration::from_secs(60)),
        )
        .service(handler);
    let request = |path: &str, key: &'static str| {
        http::Request::post(path)
            .header("idempotency-key", key)
            .body(String::new())
            .expect("request")
    };
    let counted = |kind: &str| s.value(&format!("redlock_layer_rejections_total{{kind={kind}}}"));

    // The first request runs (and waits at the gate) while a duplicate is busy.
    let first = status(svc.clone(), request("/pay", r#""r-1""#));
    let duplicate = async {
        started.acquire().await.expect("the first runs").forget();
        let busy = status(svc.clone(), request("/pay", "r-1")).await;
        gate.add_permits(1);
        busy
    };
    assert_eq!(tokio::join!(first, duplicate), (200, 409));
    assert_eq!(counted("busy"), 1.0);

    assert_eq!(status(svc.clone(), request("/pay", r#""r-2"#)).await, 400);
    assert_eq!(counted("bad_request"), 1.0);

    assert_eq!(status(svc.clone(), request("/other", "r-1")).await, 422);
    for (kind, want) in [
        ("busy", 1.0),
        ("bad_request", 1.0),
        ("key_reused", 1.0),
        ("unavailable", 0.0),
        ("internal", 0.0),
        ("response_not_kept", 0.0),
    ] {
        assert_eq!(counted(kind), want, "{kind}");
    }
    assert_eq!(s.value("redlock_layer_rejections_total"), 3.0);
}

/// The status of `svc`'s answer to `req`, its body read to the end.
async fn status<S, B>(svc: S, req: http::Request<String>) -> u16
where
    S: tower::Service<http::Request<String>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let res = svc.oneshot(req).await.expect("response");
    let status = res.status().as_u16();
    http_body_util::BodyExt::collect(res.into_body())
        .await
        .expect("body");
    status
}
