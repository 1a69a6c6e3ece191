//! Replay across node restarts, over real redis-server nodes and real axum servers (app
//! instances): after two of three nodes restart empty, every instance, one that saw the
//! restarts and one started after them, answers alike once the restart quarantine ends: a
//! finished delivery whose record survives on the third node is replayed (the record
//! restored onto the others), a new delivery runs, and no instance answers 503 for longer
//! than the quarantine. With `AfterLoss::Refuse`, new keys are refused meanwhile instead.
//! Nodes with an append-only file keep replaying across restarts.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::StatusCode;
use support::http::{HttpClient, Seen, exchange, http1, serve};
use support::{Cluster, RedisNode, wait_for};
use tower_redlock::layer::{AfterLoss, Header, ReplayPolicy, problems};
use tower_redlock::{NodeStatus, Redlock, RedlockLayer};

const ID: &str = "x-delivery-id";
/// How long a finished delivery's response is kept.
const RETENTION: Duration = Duration::from_secs(6);

/// A webhook receiver that counts its runs, behind a replaying layer on `redlock`.
async fn receiver(redlock: Redlock, runs: Arc<AtomicUsize>) -> std::net::SocketAddr {
    receiver_with(redlock, runs, AfterLoss::Run).await
}

/// [`receiver`], doing `after_loss` with keys whose record may have been lost.
async fn receiver_with(
    redlock: Redlock,
    runs: Arc<AtomicUsize>,
    after_loss: AfterLoss,
) -> std::net::SocketAddr {
    let policy = ReplayPolicy::new(RETENTION).after_loss(after_loss);
    receiver_under(redlock, runs, policy).await
}

/// [`receiver`], replaying under `policy`.
async fn receiver_under(
    redlock: Redlock,
    runs: Arc<AtomicUsize>,
    policy: ReplayPolicy,
) -> std::net::SocketAddr {
    let handler = move || {
        let runs = Arc::clone(&runs);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            "credited"
        }
    };
    let layer = RedlockLayer::new(redlock, Header::new(ID).required().structured(false))
        .replay_policy(policy);
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

/// Redelivers `id` to `addr` until the answer is not a 503 (the nodes coming back answer
/// `#unavailable`, then `#quarantine`), and the handler never runs meanwhile: that answer,
/// and how long after `since` it came.
async fn until_answered(
    client: &HttpClient,
    addr: std::net::SocketAddr,
    id: &str,
    (runs, since): (&AtomicUsize, Instant),
) -> (Seen, Duration) {
    let before = runs.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let seen = deliver(client, addr, id).await;
        if seen.status != StatusCode::SERVICE_UNAVAILABLE {
            return (seen, since.elapsed());
        }
        assert_eq!(runs.load(Ordering::SeqCst), before, "{}", seen.text());
        let kind = problem_type(&seen);
        assert!(
            kind == problems::UNAVAILABLE || kind == problems::QUARANTINE,
            "{kind}: {}",
            seen.text()
        );
        assert!(Instant::now() < deadline, "still 503: {}", seen.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Nodes with a 1 s TTL, aged (in service long before the test), and a client over them as
/// deployed (the restart quarantine on).
fn client(urls: Vec<String>) -> Redlock {
    Redlock::builder(urls)
        .ttl(Duration::from_secs(1))
        .node_timeout(Duration::from_millis(50))
        .build()
        .expect("build")
}

/// The newcomer's trial: three app instances, two of three nodes restarted empty. Once the
/// quarantine ends, every instance (both that saw the restarts, and one started after)
/// replays the finished delivery from the survivor's record and runs new deliveries, and
/// none answers 503 for longer than the quarantine and a reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_answers_alike_after_a_majority_restarted_empty() {
    let mut cluster = Cluster::start(3);
    cluster.age_ledgers();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut instances = Vec::new();
    for _ in 0..2 {
        let redlock = client(cluster.urls());
        support::warm(&redlock).await;
        instances.push(receiver(redlock, Arc::clone(&runs)).await);
    }
    let http = http1();
    let first = deliver(&http, instances[0], "evt-46").await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert!(deliver(&http, instances[1], "evt-46").await.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let restarted = Instant::now();
    tokio::task::block_in_place(|| {
        cluster.nodes[1].restart();
        cluster.nodes[2].restart();
    });
    instances.push(receiver(client(cluster.urls()), Arc::clone(&runs)).await);
    for (i, addr) in instances.into_iter().enumerate() {
        let (seen, after) = until_answered(&http, addr, "evt-46", (&runs, restarted)).await;
        assert_eq!(seen.status, StatusCode::OK, "instance {i}: {}", seen.text());
        assert!(
            seen.replayed(),
            "instance {i}: the finished delivery replays"
        );
        assert_eq!(seen.text(), "credited");
        assert!(
            after < Duration::from_secs(4),
            "instance {i}: 503 for {after:?} after the restarts"
        );
        let new = deliver(&http, addr, &format!("evt-new-{i}")).await;
        assert_eq!(new.status, StatusCode::OK, "instance {i}: {}", new.text());
        assert!(!new.replayed(), "instance {i}: a new delivery runs");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "once, then three new deliveries"
    );
}

/// Refusing keys whose record may have been lost (`AfterLoss::Refuse`): after the same
/// restarts, a new key is refused with `#replay-unverifiable` (and the time to wait) on
/// an instance that saw them and on one started after; the finished key still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_after_a_loss_refuses_new_keys_and_still_replays_finished_ones() {
    let mut cluster = Cluster::start(3);
    cluster.age_ledgers();
    let runs = Arc::new(AtomicUsize::new(0));
    let redlock = client(cluster.urls());
    support::warm(&redlock).await;
    let running = receiver_with(redlock, Arc::clone(&runs), AfterLoss::Refuse).await;
    let http = http1();
    assert_eq!(
        deliver(&http, running, "evt-7").await.status,
        StatusCode::OK
    );
    let restarted = Instant::now();
    tokio::task::block_in_place(|| {
        cluster.nodes[1].restart();
        cluster.nodes[2].restart();
    });
    let late = receiver_with(client(cluster.urls()), Arc::clone(&runs), AfterLoss::Refuse).await;
    for addr in [running, late] {
        let (replayed, _) = until_answered(&http, addr, "evt-7", (&runs, restarted)).await;
        assert!(replayed.replayed(), "{}", replayed.text());
        let new = deliver(&http, addr, "evt-8").await;
        assert_eq!(
            new.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            new.text()
        );
        assert_eq!(problem_type(&new), problems::REPLAY_UNVERIFIABLE);
        let advice: u64 = new.headers[http::header::RETRY_AFTER]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("seconds");
        assert!((1..=RETENTION.as_secs()).contains(&advice), "{advice}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A node that logs every write to an append-only file (synced at once) and reloads it
/// when it restarts.
fn aof() -> RedisNode {
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
}

/// Stops `cluster`'s nodes and removes their append-only files.
fn remove_aof(cluster: Cluster) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_an_append_only_file_keep_replaying_across_restarts() {
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
    remove_aof(cluster);
}

/// The record survives only on a node that restarted with its data (an append-only file),
/// which every client keeps out for a TTL after the restart; the two others restarted
/// empty a moment before and are back in service. A client that refuses keys whose record
/// may have been lost (`AfterLoss::Refuse`) reads the record of the node it keeps out (a
/// read, never a grant), restores it onto the two and replays it: the handler does not run
/// again. Before, the round never asked the kept-out node, and the two young nodes vouched
/// for each other as peers of one age (the simulation's seed 8466921549206095768).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_kept_only_on_a_quarantined_node_is_replayed() {
    let mut cluster = Cluster {
        nodes: vec![aof(), RedisNode::start(), RedisNode::start()],
    };
    cluster.age_ledgers();
    // As deployed (the restart quarantine on), with a 3 s TTL: the kept-out node's
    // quarantine, the window the delivery must fall in.
    let redlock = Redlock::builder(cluster.urls())
        .ttl(Duration::from_secs(3))
        .node_timeout(Duration::from_millis(100))
        .build()
        .expect("build");
    support::warm(&redlock).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let policy = ReplayPolicy::new(Duration::from_secs(60)).after_loss(AfterLoss::Refuse);
    let addr = receiver_under(redlock.clone(), Arc::clone(&runs), policy).await;
    let http = http1();
    assert_eq!(deliver(&http, addr, "evt-9").await.status, StatusCode::OK);

    tokio::task::block_in_place(|| {
        cluster.nodes[1].restart();
        cluster.nodes[2].restart();
    });
    let status = |i: usize| {
        let redlock = redlock.clone();
        async move { redlock.health().await.nodes()[i].status().clone() }
    };
    wait_for(
        "the two empty nodes in service",
        Duration::from_secs(20),
        || async { status(1).await == NodeStatus::Up && status(2).await == NodeStatus::Up },
    )
    .await;
    tokio::task::block_in_place(|| cluster.nodes[0].restart());
    wait_for(
        "the node with the record kept out",
        Duration::from_secs(10),
        || async { matches!(status(0).await, NodeStatus::Quarantined { .. }) },
    )
    .await;
    let seen = deliver(&http, addr, "evt-9").await;
    assert!(
        matches!(status(0).await, NodeStatus::Quarantined { .. }),
        "the delivery came while the node was kept out"
    );
    assert_eq!(seen.status, StatusCode::OK, "{}", seen.text());
    assert!(seen.replayed(), "{}", seen.text());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    remove_aof(cluster);
}

/// A response whose record reaches fewer than a quorum of nodes (two of three stop
/// answering while its body streams) never reaches the client complete: its body fails
/// before its last bytes. Once the nodes answer again, the retry gets the response back
/// from the node that has the record (restored onto the others), without a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_whose_record_reaches_too_few_nodes_fails_and_its_retry_replays() {
    use futures_util::StreamExt;
    use http_body_util::BodyExt;

    let mut cluster = Cluster::start(3);
    cluster.age_ledgers();
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Notify::new());
    let handler = {
        let (runs, gate) = (Arc::clone(&runs), Arc::clone(&gate));
        move || {
            let (runs, gate) = (Arc::clone(&runs), Arc::clone(&gate));
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                // The first part at once; the last once the test opens the gate.
                let parts = futures_util::stream::iter([0, 1]).then(move |i| {
                    let gate = Arc::clone(&gate);
                    async move {
                        if i == 1 {
                            gate.notified().await;
                        }
                        Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"credited "))
                    }
                });
                Body::from_stream(parts)
            }
        }
    };
    let redlock = client(cluster.urls());
    support::warm(&redlock).await;
    let layer =
        RedlockLayer::new(redlock, Header::new(ID).required().structured(false)).replay(RETENTION);
    let addr = serve(
        Router::new()
            .route("/hook", post(handler))
            .route_layer(layer),
    )
    .await;
    let http = http1();
    let req = http::Request::post(format!("http://{addr}/hook"))
        .header(ID, "evt-9")
        .body(Body::empty())
        .expect("request");
    let res = http.request(req).await.expect("response head");
    let mut body = res.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert_eq!(first.data_ref().map(|d| d.len()), Some(9));
    tokio::task::block_in_place(|| {
        cluster.nodes[1].pause();
        cluster.nodes[2].pause();
    });
    gate.notify_one();
    let mut rest = Ok(());
    while let Some(frame) = body.frame().await {
        if let Err(e) = frame {
            rest = Err(e);
            break;
        }
    }
    assert!(rest.is_err(), "the body ends with an error, not complete");
    tokio::task::block_in_place(|| {
        cluster.nodes[1].resume();
        cluster.nodes[2].resume();
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let replayed = loop {
        let seen = deliver(&http, addr, "evt-9").await;
        if seen.status == StatusCode::OK {
            break seen;
        }
        assert!(Instant::now() < deadline, "{}", seen.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(replayed.replayed(), "{}", replayed.text());
    assert_eq!(replayed.text(), "credited credited ");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

/// The doubts come from the nodes' ledgers as the connects read them, so an app instance
/// started after the restarts doubts the restarted nodes from its very first request:
/// with `AfterLoss::Refuse`, a new key sent as that first request, once the quarantine is
/// over, is refused like on every other instance (the doubts used to be read before the
/// connects finished: that first request judged no node and ran). And an instance
/// started over nodes that lost nothing runs its first request. On one thread, with the
/// request sent as the client is built: its connects run only once the request waits.
#[tokio::test(flavor = "current_thread")]
async fn an_instance_started_after_the_restarts_doubts_from_its_first_request() {
    use tower::{Layer, ServiceExt, service_fn};
    let mut cluster = Cluster::start(3);
    cluster.age_ledgers();
    let urls = cluster.urls();
    let runs = Arc::new(AtomicUsize::new(0));
    // A fresh instance (unfenced: no fencing proposal waits for the connects) and its
    // first request, a new key: its status and problem type.
    let first_request = |key: &'static str| {
        let redlock = client(urls.clone()).with_fencing(false);
        let runs = Arc::clone(&runs);
        let policy = ReplayPolicy::new(RETENTION).after_loss(AfterLoss::Refuse);
        let svc = RedlockLayer::new(redlock, Header::new(ID).required().structured(false))
            .replay_policy(policy)
            .layer(service_fn(move |_req: http::Request<_>| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
            }));
        let req = http::Request::post("/hook")
            .header(ID, key)
            .body(String::new())
            .expect("request");
        async move {
            let res = svc.oneshot(req).await.expect("response");
            let status = res.status();
            let body = http_body_util::BodyExt::collect(res.into_body())
                .await
                .expect("body")
                .to_bytes();
            let text = String::from_utf8_lossy(&body).into_owned();
            let kind = if text.contains(problems::REPLAY_UNVERIFIABLE) {
                problems::REPLAY_UNVERIFIABLE
            } else {
                ""
            };
            (status, kind)
        }
    };
    assert_eq!(first_request("evt-calm").await.0, StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let restarted = Instant::now();
    cluster.nodes[1].restart();
    cluster.nodes[2].restart();
    // The quarantine over, as a client that reads the ledgers sees it.
    let probe = client(urls.clone());
    support::wait_for("the quarantine over", Duration::from_secs(10), || async {
        probe.health().await.ready()
    })
    .await;
    let first = first_request("evt-first").await;
    assert!(
        restarted.elapsed() < RETENTION,
        "the test outran the retention"
    );
    assert_eq!(
        first,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            problems::REPLAY_UNVERIFIABLE
        )
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
