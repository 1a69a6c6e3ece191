//! Replay across node restarts, over real redis-server nodes and a real axum server: a
//! finished delivery whose record survives on one node of three while the two others
//! restart empty is never run again silently (the retry gets the distinct
//! `#replay-unverifiable` 503, from the client that saw the restarts and from one that
//! meets the nodes afterwards), until the retention has passed since the restarts; nodes
//! with an append-only file keep replaying across restarts.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::StatusCode;
use support::http::{HttpClient, Seen, exchange, http1, serve};
use support::{Cluster, RedisNode};
use tower_redlock::layer::{Header, problems};
use tower_redlock::{Redlock, RedlockLayer};

const ID: &str = "x-delivery-id";
/// How long a finished delivery's response is kept.
const RETENTION: Duration = Duration::from_secs(6);

/// A webhook receiver that counts its runs, behind a replaying layer on `redlock`.
async fn receiver(redlock: Redlock, runs: Arc<AtomicUsize>) -> std::net::SocketAddr {
    let handler = move || {
        let runs = Arc::clone(&runs);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            "credited"
        }
    };
    let layer =
        RedlockLayer::new(redlock, Header::new(ID).required().structured(false)).replay(RETENTION);
    serve(
        Router::new()
            .route("/hook", post(handler))
            .route_layer(layer),
    )
    .await
}

async fn deliver(client: &HttpClient, addr: std::net::SocketAddr, id: &str) -> Seen {
    let req = http::Request::post(format!("http://{addr}/hook"))
        .header(ID, id)
        .header(http::header::ACCEPT, "application/problem+json")
        .body(Body::empty())
        .expect("request");
    exchange(client, req).await.expect("response")
}

/// The problem type of a rejection (`""` for another answer).
fn problem_type(seen: &Seen) -> String {
    let text = seen.text();
    text.split("\"type\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_default()
        .to_owned()
}

/// Redelivers `id` until the answer is the `#replay-unverifiable` 503 (nodes coming back
/// answer the other 503s first: unavailable, then the quarantine); the handler never runs
/// meanwhile. The answer.
async fn until_unverifiable(
    client: &HttpClient,
    addr: std::net::SocketAddr,
    id: &str,
    runs: &AtomicUsize,
) -> Seen {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let seen = deliver(client, addr, id).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the handler ran again: {seen:?}"
        );
        assert_eq!(
            seen.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            seen.text()
        );
        let kind = problem_type(&seen);
        if kind == problems::REPLAY_UNVERIFIABLE {
            return seen;
        }
        assert!(
            kind == problems::UNAVAILABLE || kind == problems::QUARANTINE,
            "{kind}: {}",
            seen.text()
        );
        assert!(
            Instant::now() < deadline,
            "no unverifiable answer: {}",
            seen.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_delivery_never_runs_again_after_a_majority_restarted_empty() {
    let ttl = Duration::from_secs(1);
    let mut cluster = Cluster::start(3);
    cluster.age_ledgers();
    // The restart quarantine on, as deployed.
    let configure = |urls: Vec<String>| {
        Redlock::builder(urls)
            .ttl(ttl)
            .node_timeout(Duration::from_millis(50))
            .build()
            .expect("build")
    };
    let redlock = configure(cluster.urls());
    support::warm(&redlock).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = receiver(redlock, Arc::clone(&runs)).await;
    let client = http1();

    let first = deliver(&client, addr, "evt-46").await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let again = deliver(&client, addr, "evt-46").await;
    assert!(again.replayed(), "replayed before the restarts");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let restarted = Instant::now();
    tokio::task::block_in_place(|| {
        cluster.nodes[1].restart();
        cluster.nodes[2].restart();
    });
    // The client that saw the restarts.
    let refused = until_unverifiable(&client, addr, "evt-46", &runs).await;
    let advice: u64 = refused.headers[http::header::RETRY_AFTER]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=RETENTION.as_secs()).contains(&advice), "{advice}");
    assert!(
        refused.text().contains("\"kind\":\"unavailable\""),
        "{}",
        refused.text()
    );

    // A client that meets the nodes only now: the record left on node 0 is the evidence.
    let late_runs = Arc::new(AtomicUsize::new(1));
    let late = receiver(configure(cluster.urls()), Arc::clone(&late_runs)).await;
    until_unverifiable(&client, late, "evt-46", &late_runs).await;

    // Once the retention has passed since the restarts, the key is forgotten everywhere
    // (the surviving record expired too): a delivery runs, as for any expired key.
    let deadline = Instant::now() + RETENTION + Duration::from_secs(15);
    loop {
        let seen = deliver(&client, addr, "evt-46").await;
        if seen.status == StatusCode::OK {
            assert!(!seen.replayed());
            assert!(
                restarted.elapsed() >= RETENTION,
                "ran again {:?} after the restarts",
                restarted.elapsed()
            );
            break;
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{}", seen.text());
        assert!(Instant::now() < deadline, "still refused: {}", seen.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_an_append_only_file_keep_replaying_across_restarts() {
    let aof = || {
        RedisNode::start_with_args(
            None,
            [
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--appenddirname",
                "redlock-test-aof-{port}",
            ]
            .map(String::from)
            .to_vec(),
        )
    };
    let mut cluster = Cluster {
        nodes: (0..3).map(|_| aof()).collect(),
    };
    let redlock = cluster
        .client(|b| {
            b.ttl(Duration::from_secs(1))
                .node_timeout(Duration::from_millis(50))
        })
        .await;
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = receiver(redlock, Arc::clone(&runs)).await;
    let client = http1();
    assert_eq!(deliver(&client, addr, "evt-7").await.status, StatusCode::OK);

    tokio::task::block_in_place(|| {
        cluster.nodes[1].restart();
        cluster.nodes[2].restart();
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let seen = deliver(&client, addr, "evt-7").await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{}", seen.text());
        if seen.status == StatusCode::OK {
            assert!(seen.replayed(), "{}", seen.text());
            break;
        }
        // Only while the client reconnects.
        assert_eq!(
            problem_type(&seen),
            problems::UNAVAILABLE,
            "{}",
            seen.text()
        );
        assert!(Instant::now() < deadline, "{}", seen.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dirs = cluster
        .nodes
        .iter()
        .filter_map(|n| n.arg("--appenddirname").map(str::to_owned));
    let dirs: Vec<String> = dirs.collect();
    drop(cluster);
    for dir in dirs {
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(dir));
    }
}
