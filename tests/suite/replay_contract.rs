//! Replay's contract, one promise per test, over a real axum server, real hyper clients
//! and real redis-server nodes: the IETF Idempotency-Key draft's cases as the README's
//! table gives them, the request body counted by default, the lock name in every replay
//! rejection the hook sees, and gRPC records that keep what a gRPC client needs whatever
//! the header list.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};
use http_body_util::BodyExt;
use redis::AsyncCommands;
use support::Cluster;
use support::http::{HttpClient, Seen, exchange, http1, http2, serve};
use tokio::sync::Semaphore;
use tower_redlock::RedlockLayer;
use tower_redlock::layer::{Header, ReplayPolicy};

const KEY: &str = "Idempotency-Key";

/// The lock name the layers here (keyed by `KEY`) take for the key `key`.
fn lock_of(key: &str) -> String {
    support::header_lock(KEY, key)
}

/// The Redis key of that lock name.
fn key_of(key: &str) -> String {
    support::key_of(&lock_of(key))
}

/// Sends `req` and reads the whole response (it must not fail).
async fn send(client: &HttpClient, req: http::Request<Body>) -> Seen {
    exchange(client, req).await.expect("response")
}

fn post_to(
    addr: std::net::SocketAddr,
    path: &str,
    key: Option<&str>,
    body: &'static str,
) -> http::Request<Body> {
    let mut b = http::Request::post(format!("http://{addr}{path}"));
    if let Some(key) = key {
        b = b.header(KEY, key);
    }
    b.body(Body::from(body)).expect("request")
}

/// A payment route that counts its runs, answers 201 with the body it was sent, and
/// waits at `gate` when the body is "slow".
fn payments(
    layer: RedlockLayer<Header, tower_redlock::layer::BodyFingerprintLayer>,
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
) -> Router {
    let handler = move |body: String| {
        let (runs, gate) = (Arc::clone(&runs), Arc::clone(&gate));
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if body == "slow" {
                gate.acquire().await.expect("gate").forget();
            }
            (
                StatusCode::CREATED,
                [(header::CONTENT_TYPE, "application/json")],
                format!("{{\"paid\":\"{body}\"}}"),
            )
        }
    };
    Router::new()
        .route("/pay", post(handler.clone()))
        .route("/refund", post(handler))
        .route_layer(layer)
}

/// The draft's cases, as the README's table gives them: a missing key (when the route
/// requires one) is 400; a duplicate while the first runs is 409 with `Retry-After`; a
/// duplicate after it finished gets the first response, marked replayed; the same key
/// with another body is 422; after the retention the key is new again. Every rejection is
/// a problem document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idempotency_key_drafts_cases() {
    let cluster = Cluster::start(3);
    let (runs, gate) = (Arc::new(AtomicUsize::new(0)), Arc::new(Semaphore::new(0)));
    let layer = RedlockLayer::new(cluster.replay_client().await, Header::new(KEY).required())
        .fencing(false)
        .replay(Duration::from_secs(2));
    let addr = serve(payments(layer, Arc::clone(&runs), Arc::clone(&gate))).await;
    let client = http1();
    let problem = |seen: &Seen, status: u16, kind: &str| {
        assert_eq!(seen.status, status, "{}", seen.text());
        assert_eq!(
            seen.headers[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert!(
            seen.text().contains(&format!("\"kind\":\"{kind}\"")),
            "{}",
            seen.text()
        );
        assert!(!seen.replayed());
    };

    // Missing key.
    let missing = send(&client, post_to(addr, "/pay", None, "10")).await;
    problem(&missing, 400, "bad_request");
    // A malformed key, and a key sent twice.
    let malformed = send(&client, post_to(addr, "/pay", Some("\"unterminated"), "10")).await;
    problem(&malformed, 400, "bad_request");
    let mut twice = post_to(addr, "/pay", Some("\"k-0\""), "10");
    twice
        .headers_mut()
        .append(KEY, http::HeaderValue::from_static("\"k-1\""));
    problem(&send(&client, twice).await, 400, "bad_request");
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Concurrent duplicate.
    let first = tokio::spawn({
        let client = client.clone();
        async move { send(&client, post_to(addr, "/pay", Some("\"k-1\""), "slow")).await }
    });
    support::wait_for(
        "the first request to run",
        Duration::from_secs(10),
        || async { runs.load(Ordering::SeqCst) == 1 },
    )
    .await;
    let concurrent = send(&client, post_to(addr, "/pay", Some("\"k-1\""), "slow")).await;
    problem(&concurrent, 409, "busy");
    assert!(concurrent.headers.contains_key(header::RETRY_AFTER));
    gate.add_permits(1);
    let first = first.await.expect("first");
    assert_eq!(first.status, 201);

    // Completed duplicate: the same bytes, marked replayed; the bare token is the same key.
    for key in ["\"k-1\"", "k-1"] {
        let again = send(&client, post_to(addr, "/pay", Some(key), "slow")).await;
        assert_eq!(again.status, 201);
        assert_eq!(again.body, first.body);
        assert_eq!(again.headers[header::CONTENT_TYPE], "application/json");
        assert!(again.replayed());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Payload mismatch: another body, or another path, with the same key.
    let other_body = send(&client, post_to(addr, "/pay", Some("\"k-1\""), "20")).await;
    problem(&other_body, 422, "key_reused");
    let other_path = send(&client, post_to(addr, "/refund", Some("\"k-1\""), "slow")).await;
    problem(&other_path, 422, "key_reused");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Expired record: the key is new again.
    support::wait_for("the record to expire", Duration::from_secs(10), || async {
        cluster.nodes_holding(key_of("k-1")).await == 0
    })
    .await;
    let fresh = send(&client, post_to(addr, "/pay", Some("\"k-1\""), "30")).await;
    assert_eq!((fresh.status.as_u16(), fresh.replayed()), (201, false));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// By default the request body counts: the same key with another body is 422, without
/// any layer added. `body_fingerprint(n)` counts the first n bytes only, and
/// `without_body_fingerprint()` not at all (the first response is replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_key_with_another_body_is_422_by_default() {
    let cluster = Cluster::start(3);
    let client = http1();
    let base = || async {
        RedlockLayer::new(cluster.replay_client().await, Header::new(KEY))
            .fencing(false)
            .replay(Duration::from_secs(60))
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let counted = serve(payments(base().await, Arc::clone(&runs), Arc::clone(&gate))).await;
    assert_eq!(
        send(&client, post_to(counted, "/pay", Some("b-1"), "amount=10"))
            .await
            .status,
        201
    );
    let same = send(&client, post_to(counted, "/pay", Some("b-1"), "amount=10")).await;
    assert!(same.replayed());
    let other = send(&client, post_to(counted, "/pay", Some("b-1"), "amount=99")).await;
    assert_eq!(other.status, 422, "{}", other.text());
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Only the first 7 bytes count.
    let prefix = serve(payments(
        base().await.body_fingerprint(7),
        Arc::clone(&runs),
        Arc::clone(&gate),
    ))
    .await;
    assert_eq!(
        send(&client, post_to(prefix, "/pay", Some("b-2"), "amount=10"))
            .await
            .status,
        201
    );
    let beyond = send(&client, post_to(prefix, "/pay", Some("b-2"), "amount=99")).await;
    assert!(
        beyond.replayed(),
        "bodies that differ beyond the limit count as one"
    );
    let within = send(&client, post_to(prefix, "/pay", Some("b-2"), "amoun=10")).await;
    assert_eq!(within.status, 422);

    // Not at all.
    let handler = |body: String| async move { (StatusCode::CREATED, body) };
    let plain = serve(
        Router::new()
            .route("/pay", post(handler))
            .route_layer(base().await.without_body_fingerprint()),
    )
    .await;
    let first = send(&client, post_to(plain, "/pay", Some("b-3"), "amount=10")).await;
    let other = send(&client, post_to(plain, "/pay", Some("b-3"), "amount=99")).await;
    assert!(other.replayed());
    assert_eq!(other.body, first.body);
}

/// A rejection's kind and lock name, as the hook saw them.
type Named = (String, Option<Vec<u8>>);

/// The rejection hook gets the lock name with every replay rejection: a key reused for
/// another request (422), a record that cannot be read (503), a response that was too
/// large to keep (410).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rejection_hook_gets_the_lock_name_for_every_replay_rejection() {
    let cluster = Cluster::start(3);
    let seen: Arc<Mutex<Vec<Named>>> = Arc::default();
    let layer = RedlockLayer::new(cluster.replay_client().await, Header::new(KEY))
        .fencing(false)
        .replay_policy(ReplayPolicy::new(Duration::from_secs(60)).max_body(16))
        .on_rejection({
            let seen = Arc::clone(&seen);
            move |rejection, _head| {
                let name = rejection.lock_name().map(<[u8]>::to_vec);
                let kind = rejection.kind().as_str().to_owned();
                seen.lock().expect("seen").push((kind, name));
                rejection.into_response()
            }
        });
    let handler = |body: String| async move { (StatusCode::CREATED, body) };
    let addr = serve(
        Router::new()
            .route("/a", post(handler))
            .route("/b", post(handler))
            .route_layer(layer),
    )
    .await;
    let client = http1();
    // 422: the key reused on another path.
    assert_eq!(
        send(&client, post_to(addr, "/a", Some("h-1"), "x"))
            .await
            .status,
        201
    );
    assert_eq!(
        send(&client, post_to(addr, "/b", Some("h-1"), "x"))
            .await
            .status,
        422
    );
    // 410: the first response was over the 16-byte limit.
    let big = send(
        &client,
        post_to(addr, "/a", Some("h-2"), "more than sixteen bytes"),
    )
    .await;
    assert_eq!(big.status, 201);
    assert_eq!(big.text(), "more than sixteen bytes");
    let gone = send(
        &client,
        post_to(addr, "/a", Some("h-2"), "more than sixteen bytes"),
    )
    .await;
    assert_eq!(gone.status, 410, "{}", gone.text());
    assert!(!gone.replayed());
    // 503: a record this version cannot read, on every node.
    for i in 0..3 {
        let mut conn = cluster.raw(i).await;
        let _: () = conn
            .pset_ex(key_of("h-3"), &b"#record\ngarbage"[..], 60_000)
            .await
            .expect("PSETEX");
    }
    assert_eq!(
        send(&client, post_to(addr, "/a", Some("h-3"), "x"))
            .await
            .status,
        503
    );
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(
        seen,
        [
            ("key_reused".to_owned(), Some(lock_of("h-1").into_bytes())),
            (
                "response_not_kept".to_owned(),
                Some(lock_of("h-2").into_bytes())
            ),
            ("unavailable".to_owned(), Some(lock_of("h-3").into_bytes())),
        ]
    );
}

/// A gRPC reply replayed under a header list without `content-type` keeps its gRPC
/// content type, its `grpc-*` headers and its trailers (clients other than tonic refuse
/// a reply without them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_replay_keeps_what_grpc_clients_need_under_any_header_list() {
    let cluster = Cluster::start(3);
    let layer = RedlockLayer::new(
        cluster.replay_client().await,
        Header::new("idempotency-key"),
    )
    .fencing(false)
    .replay_policy(ReplayPolicy::new(Duration::from_secs(60)).headers([header::LOCATION]));
    let handler = || async {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        trailers.insert("grpc-message", http::HeaderValue::from_static("ok"));
        let frames = futures_util::stream::iter([
            Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from_static(
                b"\x00\x00\x00\x00\x02hi",
            ))),
            Ok(http_body::Frame::trailers(trailers)),
        ]);
        http::Response::builder()
            .header(header::CONTENT_TYPE, "application/grpc+proto")
            .header("grpc-encoding", "identity")
            .body(Body::new(http_body_util::StreamBody::new(frames)))
            .expect("response")
    };
    let addr = serve(
        Router::new()
            .route("/test.Svc/Call", post(handler))
            .route_layer(layer),
    )
    .await;
    let client = http2();
    let call = || {
        http::Request::post(format!("http://{addr}/test.Svc/Call"))
            .header(header::CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .header("idempotency-key", "g-1")
            .body(Body::from(&b"\x00\x00\x00\x00\x00"[..]))
            .expect("request")
    };
    let first = send(&client, call()).await;
    let again = send(&client, call()).await;
    assert!(again.replayed());
    assert_eq!(
        again.headers[header::CONTENT_TYPE],
        "application/grpc+proto"
    );
    assert_eq!(again.headers["grpc-encoding"], "identity");
    assert_eq!(again.body, first.body);
    let trailers = again.trailers.expect("trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["grpc-message"], "ok");
}

/// Extreme retentions still record: `Duration::MAX` keeps the record 100 years (a `PX` the
/// nodes accept), `Duration::ZERO` 1 ms (the handler runs again), and neither fails the
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_retentions_record_for_as_long_as_the_nodes_allow() {
    let cluster = Cluster::start(3);
    let client = http1();
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let cluster = &cluster;
    let layer = |retention| async move {
        RedlockLayer::new(cluster.replay_client().await, Header::new(KEY))
            .fencing(false)
            .replay_policy(ReplayPolicy::new(retention))
    };
    let forever = serve(payments(
        layer(Duration::MAX).await,
        Arc::clone(&runs),
        Arc::clone(&gate),
    ))
    .await;
    assert_eq!(
        send(&client, post_to(forever, "/pay", Some("r-1"), "1"))
            .await
            .status,
        201
    );
    assert!(
        send(&client, post_to(forever, "/pay", Some("r-1"), "1"))
            .await
            .replayed()
    );
    let mut conn = cluster.raw(0).await;
    let pttl: i64 = conn.pttl(key_of("r-1")).await.expect("PTTL");
    assert!(pttl > 50 * 365 * 24 * 3600 * 1000, "{pttl} ms");
    let at_once = serve(payments(
        layer(Duration::ZERO).await,
        Arc::clone(&runs),
        Arc::clone(&gate),
    ))
    .await;
    assert_eq!(
        send(&client, post_to(at_once, "/pay", Some("r-2"), "1"))
            .await
            .status,
        201
    );
    support::wait_for(
        "the 1 ms record to expire",
        Duration::from_secs(10),
        || async { cluster.nodes_holding(key_of("r-2")).await == 0 },
    )
    .await;
    let again = send(&client, post_to(at_once, "/pay", Some("r-2"), "1")).await;
    assert_eq!((again.status.as_u16(), again.replayed()), (201, false));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// A body that gives its size but never says it has ended (`is_end_stream` is only a
/// hint): its size marks its last frame, which an HTTP/1 client takes as the end.
struct Unmarked(Vec<Bytes>);

impl http_body::Body for Unmarked {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        let next = (!self.0.is_empty()).then(|| self.0.remove(0));
        std::task::Poll::Ready(next.map(|b| Ok(http_body::Frame::data(b))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.iter().map(|b| b.len() as u64).sum())
    }
}

/// On slow links too, a client that has the whole response finds the record on the
/// nodes: with 100 ms to every node, the record is there (read directly) the moment the
/// client has the last byte, for a sized body (also one that never says it ended) and
/// for a streamed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_is_on_the_nodes_before_the_client_has_the_last_byte() {
    let cluster = Cluster::start(3);
    let mut proxies = Vec::new();
    for node in &cluster.nodes {
        proxies.push(support::FaultProxy::start(node.addr()).await);
    }
    let redlock = support::builder(proxies.iter().map(support::FaultProxy::url))
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_secs(2))
        .build()
        .expect("build");
    support::warm(&redlock).await;
    for proxy in &proxies {
        proxy.set(support::Mode::Delay {
            to_node: (Duration::from_millis(100), Duration::from_millis(100)),
            to_client: (Duration::ZERO, Duration::ZERO),
        });
    }
    let sized = || async { (StatusCode::CREATED, "a sized body") };
    let streamed = || async {
        let chunks = futures_util::stream::iter(
            ["a ", "streamed ", "body"]
                .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c.as_bytes()))),
        );
        (StatusCode::CREATED, Body::from_stream(chunks))
    };
    let unmarked = || async {
        let parts = vec![Bytes::from_static(b"never "), Bytes::from_static(b"marked")];
        (StatusCode::CREATED, Body::new(Unmarked(parts)))
    };
    let layer = RedlockLayer::new(redlock, Header::new(KEY))
        .fencing(false)
        .replay(Duration::from_secs(60));
    let addr = serve(
        Router::new()
            .route("/sized", post(sized))
            .route("/streamed", post(streamed))
            .route("/unmarked", post(unmarked))
            .route_layer(layer),
    )
    .await;
    let client = http1();
    for (path, key) in [
        ("/sized", "slow-1"),
        ("/streamed", "slow-2"),
        ("/unmarked", "slow-3"),
    ] {
        let first = send(&client, post_to(addr, path, Some(key), "")).await;
        assert_eq!(first.status, 201);
        if path == "/sized" {
            // The size goes on with the body being recorded: content-length, not chunks.
            assert_eq!(first.headers[header::CONTENT_LENGTH], "12");
        }
        let mut records = 0;
        for i in 0..3 {
            let mut conn = cluster.raw(i).await;
            let value: Option<Vec<u8>> = conn.get(key_of(key)).await.expect("GET");
            records += usize::from(value.is_some_and(|v| v.starts_with(b"#record\n")));
        }
        assert_eq!(
            records, 3,
            "{path}: the record reached {records} node(s) when the client had it all"
        );
    }
}

/// A gRPC reply is kept only when it is one message with a status a retry would repeat:
/// a streaming reply (two messages) and an `UNAVAILABLE` one run again on the retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_replies_of_several_messages_or_a_retryable_status_are_not_kept() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let reply = |body: &'static [u8], status: &'static str| {
        let runs = Arc::clone(&runs);
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static(status));
            let frames = futures_util::stream::iter([
                Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from_static(body))),
                Ok(http_body::Frame::trailers(trailers)),
            ]);
            async move {
                http::Response::builder()
                    .header(header::CONTENT_TYPE, "application/grpc")
                    .body(Body::new(http_body_util::StreamBody::new(frames)))
                    .expect("response")
            }
        }
    };
    let layer = RedlockLayer::new(
        cluster.replay_client().await,
        Header::new("idempotency-key"),
    )
    .fencing(false)
    .replay(Duration::from_secs(60));
    let addr = serve(
        Router::new()
            .route(
                "/test.Svc/Stream",
                post(reply(b"\x00\x00\x00\x00\x01a\x00\x00\x00\x00\x01b", "0")),
            )
            .route(
                "/test.Svc/Unavailable",
                post(reply(b"\x00\x00\x00\x00\x01a", "14")),
            )
            .route("/test.Svc/Ok", post(reply(b"\x00\x00\x00\x00\x01a", "0")))
            .route_layer(layer),
    )
    .await;
    let client = http2();
    let call = |method: &str, key: &str| {
        http::Request::post(format!("http://{addr}/test.Svc/{method}"))
            .header(header::CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .header("idempotency-key", key)
            .body(Body::from(&b"\x00\x00\x00\x00\x00"[..]))
            .expect("request")
    };
    for (method, key, kept) in [
        ("Stream", "gs-1", false),
        ("Unavailable", "gs-2", false),
        ("Ok", "gs-3", true),
    ] {
        let before = runs.load(Ordering::SeqCst);
        send(&client, call(method, key)).await;
        let again = send(&client, call(method, key)).await;
        assert_eq!(again.replayed(), kept, "{method}");
        assert_eq!(
            runs.load(Ordering::SeqCst) - before,
            if kept { 1 } else { 2 },
            "{method}"
        );
    }
}

/// A response being recorded holds its lock until its body has ended (and its record is
/// stored), as `ResponseBody::holds_lock` says.
#[tokio::test]
async fn a_recorded_response_holds_its_lock_until_its_body_ends() {
    use tower::{Layer, ServiceExt, service_fn};
    let cluster = Cluster::start(3);
    let svc = RedlockLayer::new(cluster.replay_client().await, Header::new(KEY))
        .fencing(false)
        .replay(Duration::from_secs(60))
        .without_body_fingerprint()
        .layer(service_fn(|_req: http::Request<Body>| async {
            let chunks = futures_util::stream::iter(
                ["one ", "two"].map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c.as_bytes()))),
            );
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from_stream(chunks)))
        }));
    let req = http::Request::post("/x")
        .header(KEY, "held-1")
        .body(Body::empty())
        .expect("request");
    let mut body = svc.oneshot(req).await.expect("response").into_body();
    assert!(body.holds_lock());
    assert_eq!(cluster.nodes_holding(key_of("held-1")).await, 3);
    let mut got = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            got.extend_from_slice(&data);
        }
    }
    assert_eq!(got, b"one two");
    assert!(
        !body.holds_lock(),
        "the record is stored and the lock released"
    );
}
