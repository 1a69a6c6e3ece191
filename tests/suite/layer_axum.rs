//! RedlockLayer in axum, over real HTTP/1 and HTTP/2 connections and real Redis nodes.

use crate::support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use axum::{Extension, Router};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use http_body_util::BodyExt;
use redis::AsyncCommands;
use support::http::{HttpClient, exchange, http1, http2, post as post_req, send, serve};
use support::{Cluster, wait_for};
use tokio::sync::Semaphore;
use tower_redlock::RedlockLayer;
use tower_redlock::layer::{Header, RedlockService, ResponseFuture, WaitPolicy};
use tower_redlock::{LockToken, Redlock};

const KEY_HEADER: &str = "x-delivery";

/// The lock name the layers here (keyed by `KEY_HEADER`) take for the delivery `id`.
fn lock_of(id: &str) -> String {
    support::header_lock(KEY_HEADER, id)
}

/// The Redis key of that lock name.
fn key_of(id: &str) -> String {
    support::key_of(&lock_of(id))
}

#[derive(Clone)]
struct App {
    runs: Arc<AtomicUsize>,
    /// Handler runs that ended, by completing or by being dropped.
    ended: Arc<AtomicUsize>,
    inside: Arc<AtomicUsize>,
    spans: Arc<Mutex<Vec<(Instant, Instant)>>>,
    gate: Arc<Semaphore>,
    started: Arc<Semaphore>,
}

impl App {
    fn new() -> Self {
        Self {
            runs: Arc::default(),
            ended: Arc::default(),
            inside: Arc::default(),
            spans: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
            started: Arc::new(Semaphore::new(0)),
        }
    }
}

/// Marks the end of a handler run, whether it completed or was dropped.
struct Running(App);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.fetch_add(1, Ordering::SeqCst);
    }
}

/// Counts its runs, checks no two overlap, and waits for the test to open the gate.
async fn gated(State(app): State<App>, token: LockToken) -> String {
    let begin = Instant::now();
    app.runs.fetch_add(1, Ordering::SeqCst);
    assert_eq!(
        app.inside.fetch_add(1, Ordering::SeqCst),
        0,
        "handlers overlap"
    );
    let running = Running(app.clone());
    app.started.add_permits(1);
    assert!(token.is_held());
    app.gate.acquire().await.expect("gate").forget();
    drop(running);
    app.spans
        .lock()
        .expect("spans")
        .push((begin, Instant::now()));
    String::from_utf8_lossy(token.name()).into_owned()
}

async fn redlock(cluster: &Cluster) -> Redlock {
    redlock_with(cluster, Duration::from_secs(30), Duration::from_millis(50)).await
}

/// A node timeout for the tests about queues and order, not about timeouts: far above
/// the stalls of a 2-core machine running the suite's tests side by side.
const SLOW_MACHINE_TIMEOUT: Duration = Duration::from_millis(500);

/// A client with warm connections.
async fn redlock_with(cluster: &Cluster, ttl: Duration, node_timeout: Duration) -> Redlock {
    cluster
        .client(|b| {
            b.ttl(ttl)
                .node_timeout(node_timeout)
                .retry_delay(Duration::from_millis(5), Duration::from_millis(10))
        })
        .await
}

/// TTL 600 ms: a guard extends it every 200 ms.
async fn short_ttl_redlock(cluster: &Cluster) -> Redlock {
    redlock_with(
        cluster,
        Duration::from_millis(600),
        Duration::from_millis(50),
    )
    .await
}

/// Sends one delivery in a task of its own.
fn spawn_delivery(
    client: HttpClient,
    addr: std::net::SocketAddr,
    id: &'static str,
) -> tokio::task::JoinHandle<support::http::Reply> {
    tokio::spawn(
        async move { send(&client, post_req(addr, "/hook", Some((KEY_HEADER, id)))).await },
    )
}

/// The gated route behind `layer` (a `RedlockLayer` with or without replay).
fn app<L>(layer: L, state: App) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service:
        tower::Service<http::Request<Body>, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<http::Request<Body>>>::Response:
        axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<http::Request<Body>>>::Future: Send + 'static,
{
    Router::new()
        .route("/hook", post(gated))
        .route_layer(layer)
        .with_state(state)
}

async fn duplicates_run_once(client: HttpClient) {
    let cluster = Cluster::start(3);
    let state = App::new();
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER));
    let addr = serve(app(layer, state.clone())).await;
    let mut calls: FuturesUnordered<_> = (0..100)
        .map(|_| {
            send(
                &client,
                post_req(addr, "/hook", Some((KEY_HEADER, "evt-1"))),
            )
        })
        .collect();
    // 99 duplicates are answered 409 while the one holder waits at the gate.
    for _ in 0..99 {
        let reply = calls.next().await.expect("reply");
        assert_eq!(reply.status, 409, "{}", reply.body);
        let secs: u64 = reply.headers["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("seconds");
        // The holder's 30 s TTL, capped by the layer's default of 1 s.
        assert_eq!(secs, 1, "Retry-After {secs}");
    }
    state.gate.add_permits(1);
    let last = calls.next().await.expect("reply");
    assert_eq!(last.status, 200);
    assert_eq!(last.body, lock_of("evt-1"), "the token names the lock");
    assert_eq!(state.runs.load(Ordering::SeqCst), 1);
    wait_for(
        "the lock to be released",
        Duration::from_secs(5),
        || async { cluster.nodes_holding(key_of("evt-1")).await == 0 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_run_once_over_http1() {
    duplicates_run_once(http1()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_run_once_over_http2() {
    duplicates_run_once(http2()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_wait_policy_duplicates_run_one_after_another() {
    let cluster = Cluster::start(3);
    let state = App::new();
    state.gate.add_permits(1000);
    // A node timeout far above a busy machine's stalls: this test is about the queue, and
    // with the suite's tests side by side a 50 ms timeout sometimes cost one request.
    let redlock = redlock_with(&cluster, Duration::from_secs(30), SLOW_MACHINE_TIMEOUT).await;
    let layer = RedlockLayer::new(redlock, Header::new(KEY_HEADER))
        .wait(WaitPolicy::up_to(Duration::from_secs(60)).max_waiters(128));
    let addr = serve(app(layer, state.clone())).await;
    let client = http2();
    let replies: Vec<_> = (0..100)
        .map(|_| {
            send(
                &client,
                post_req(addr, "/hook", Some((KEY_HEADER, "evt-w"))),
            )
        })
        .collect::<FuturesUnordered<_>>()
        .collect()
        .await;
    let statuses: Vec<_> = replies.iter().map(|r| r.status).collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(state.runs.load(Ordering::SeqCst), 100);
    let mut spans = state.spans.lock().expect("spans").clone();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[1].0 >= w[0].1, "handler runs overlap");
    }
}

#[tokio::test]
async fn requests_without_a_name_pass_through_and_bad_ones_get_400() {
    let cluster = Cluster::start(1);
    let r = redlock(&cluster).await;
    async fn optional(token: Option<LockToken>) -> &'static str {
        if token.is_some() {
            "locked"
        } else {
            "unlocked"
        }
    }
    let app = Router::new()
        .route("/optional", post(optional))
        .route_layer(RedlockLayer::new(r.clone(), Header::new(KEY_HEADER)))
        .merge(
            Router::new()
                .route("/required", post(optional))
                .route_layer(RedlockLayer::new(r, Header::new(KEY_HEADER).required())),
        );
    let addr = serve(app).await;
    let client = http1();
    let reply = send(&client, post_req(addr, "/optional", None)).await;
    assert_eq!(
        (reply.status.as_u16(), reply.body.as_str()),
        (200, "unlocked")
    );
    let reply = send(
        &client,
        post_req(addr, "/optional", Some((KEY_HEADER, "a"))),
    )
    .await;
    assert_eq!(
        (reply.status.as_u16(), reply.body.as_str()),
        (200, "locked")
    );
    let reply = send(&client, post_req(addr, "/required", None)).await;
    assert_eq!(reply.status, 400);
    assert!(reply.body.contains(KEY_HEADER), "{}", reply.body);
    let reply = send(&client, post_req(addr, "/optional", Some((KEY_HEADER, "")))).await;
    assert_eq!(reply.status, 400);
}

#[tokio::test]
async fn no_quorum_is_503_with_the_node_causes_for_the_logs_not_the_client() {
    let mut cluster = Cluster::start(3);
    let r = redlock(&cluster).await;
    let seen: Arc<Mutex<Vec<tower_redlock::layer::Rejection>>> = Arc::default();
    let log = seen.clone();
    let layer =
        RedlockLayer::new(r, Header::new(KEY_HEADER)).on_rejection(move |rejection, _head| {
            log.lock().expect("log").push(rejection.clone());
            rejection
        });
    let addr = serve(app(layer, App::new())).await;
    cluster.nodes[0].kill();
    cluster.nodes[1].kill();
    let reply = send(&http1(), post_req(addr, "/hook", Some((KEY_HEADER, "q")))).await;
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.headers["retry-after"], "1",
        "a 503 advises when to retry"
    );
    assert!(
        !reply.body.contains("127.0.0.1"),
        "internal addresses leak: {}",
        reply.body
    );
    let seen = seen.lock().expect("log");
    let rejection = seen.first().expect("the hook saw the rejection");
    assert_eq!(rejection.lock_name(), Some(lock_of("q").as_bytes()));
    match rejection.lock_error() {
        Some(tower_redlock::LockError::NoQuorum { failures, .. }) => {
            let nodes: Vec<&str> = failures.iter().map(|f| f.node.as_str()).collect();
            assert!(
                nodes.contains(&cluster.nodes[0].addr().as_str()),
                "{nodes:?}"
            );
            assert!(
                nodes.contains(&cluster.nodes[1].addr().as_str()),
                "{nodes:?}"
            );
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
}

#[tokio::test]
async fn busy_stays_busy_while_a_minority_of_nodes_is_down() {
    let mut cluster = Cluster::start(5);
    let state = App::new();
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER));
    let addr = serve(app(layer, state.clone())).await;
    cluster.nodes[0].kill();
    cluster.nodes[1].kill();
    let client = http1();
    let holder = spawn_delivery(client.clone(), addr, "minority");
    state.started.acquire().await.expect("holder runs").forget();
    for _ in 0..5 {
        let reply = send(
            &client,
            post_req(addr, "/hook", Some((KEY_HEADER, "minority"))),
        )
        .await;
        assert_eq!(reply.status, 409, "{}", reply.body);
    }
    state.gate.add_permits(1);
    assert_eq!(holder.await.expect("holder").status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_request_releases_the_lock() {
    let cluster = Cluster::start(3);
    let state = App::new();
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER));
    let addr = serve(app(layer, state.clone())).await;
    for client in [http1(), http2()] {
        let request = spawn_delivery(client, addr, "gone");
        // The handler runs (and so holds the lock) ...
        state.started.acquire().await.expect("started").forget();
        assert!(cluster.nodes_holding(key_of("gone")).await >= 2);
        // ... when the client goes away; the gate never opens.
        request.abort();
        wait_for(
            "the lock to be released on every node",
            Duration::from_secs(5),
            || async { cluster.nodes_holding(key_of("gone")).await == 0 },
        )
        .await;
        let runs = state.runs.load(Ordering::SeqCst);
        wait_for(
            "the handler future to be dropped",
            Duration::from_secs(5),
            || async { state.ended.load(Ordering::SeqCst) == runs },
        )
        .await;
        assert!(
            state.spans.lock().expect("spans").is_empty(),
            "the handler never completed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_body_end_mode_the_lock_is_held_while_the_body_streams() {
    let cluster = Cluster::start(3);
    let r = redlock(&cluster).await;
    type Chunks = tokio::sync::mpsc::Receiver<Result<bytes::Bytes, Infallible>>;
    let streams: Arc<Mutex<Vec<Chunks>>> = Arc::default();
    let source = streams.clone();
    let handler = move || {
        let source = source.clone();
        async move {
            let rx = source
                .lock()
                .expect("streams")
                .pop()
                .expect("a stream per request");
            Body::from_stream(tokio_stream_from(rx))
        }
    };
    let app = Router::new()
        .route("/stream", post(handler))
        .route_layer(RedlockLayer::new(r, Header::new(KEY_HEADER)).release_on_body_end());
    let addr = serve(app).await;
    let client = http2();
    // Starts a streaming response for lock `name` and reads its first chunk.
    let open = |name: &'static str| {
        let (client, streams) = (client.clone(), streams.clone());
        async move {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            streams.lock().expect("streams").push(rx);
            let res = client
                .request(post_req(addr, "/stream", Some((KEY_HEADER, name))))
                .await
                .expect("response");
            let mut body = res.into_body();
            tx.send(Ok(bytes::Bytes::from_static(b"first")))
                .await
                .expect("send");
            let frame = body.frame().await.expect("frame").expect("ok");
            assert_eq!(frame.into_data().ok().as_deref(), Some(&b"first"[..]));
            (tx, body)
        }
    };

    // Read to the end.
    let (tx, mut body) = open("s1").await;
    assert!(
        cluster.nodes_holding(key_of("s1")).await >= 2,
        "held while streaming"
    );
    drop(tx);
    while let Some(frame) = body.frame().await {
        frame.expect("frame");
    }
    wait_for(
        "release after the body ended",
        Duration::from_secs(5),
        || async { cluster.nodes_holding(key_of("s1")).await == 0 },
    )
    .await;

    // Drop the body half-way.
    let (tx, body) = open("s2").await;
    assert!(
        cluster.nodes_holding(key_of("s2")).await >= 2,
        "held while streaming"
    );
    drop(body);
    wait_for(
        "release after the body was dropped",
        Duration::from_secs(5),
        || async { cluster.nodes_holding(key_of("s2")).await == 0 },
    )
    .await;
    drop(tx);
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiter_bound_rejects_the_excess_at_once() {
    let cluster = Cluster::start(3);
    let state = App::new();
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER))
        .wait(WaitPolicy::up_to(Duration::from_secs(30)).max_waiters(4));
    let addr = serve(app(layer, state.clone())).await;
    let client = http2();
    let holder = spawn_delivery(client.clone(), addr, "hot");
    state.started.acquire().await.expect("holder runs").forget();
    let mut waiting: FuturesUnordered<_> = (0..50)
        .map(|_| send(&client, post_req(addr, "/hook", Some((KEY_HEADER, "hot")))))
        .collect();
    let t = Instant::now();
    for _ in 0..46 {
        let reply = waiting.next().await.expect("reply");
        assert_eq!(reply.status, 409, "{}", reply.body);
    }
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "rejections were not immediate"
    );
    // The 4 waiters get the lock one after another once the holder finishes.
    state.gate.add_permits(5);
    assert_eq!(holder.await.expect("holder").status, 200);
    for _ in 0..4 {
        assert_eq!(waiting.next().await.expect("reply").status, 200);
    }
    assert_eq!(state.runs.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn a_rejection_hook_sees_the_request_and_answers_with_any_axum_response() {
    use axum::Json;
    use axum::response::IntoResponse;
    use tower_redlock::layer::RejectionKind;

    let cluster = Cluster::start(1);
    let r = redlock(&cluster).await;
    let holder = r.try_lock(lock_of("taken")).await.expect("lock");
    let layer = RedlockLayer::new(r.clone(), Header::new(KEY_HEADER).required()).on_rejection(
        |rejection, head| {
            let request_id = head
                .headers
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
                .to_owned();
            match rejection.kind() {
                RejectionKind::Busy { .. } => Ok((
                    http::StatusCode::TOO_MANY_REQUESTS,
                    [("x-request-id", request_id.clone())],
                    Json(vec![request_id, head.uri.path().to_owned()]),
                )
                    .into_response()),
                _ => Err(rejection),
            }
        },
    );
    let addr = serve(app(layer, App::new())).await;
    let client = http1();

    let mut busy = post_req(addr, "/hook", Some((KEY_HEADER, "taken")));
    busy.headers_mut()
        .insert("x-request-id", http::HeaderValue::from_static("req-7"));
    let reply = send(&client, busy).await;
    assert_eq!(reply.status, 429, "{}", reply.body);
    assert_eq!(reply.headers["x-request-id"], "req-7");
    assert_eq!(reply.headers["content-type"], "application/json");
    assert_eq!(reply.body, r#"["req-7","/hook"]"#);

    // Err(rejection): the default answer, still negotiated to the request's Accept.
    let mut bad = post_req(addr, "/hook", None);
    bad.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static("application/problem+json"),
    );
    let reply = send(&client, bad).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.headers["content-type"], "application/problem+json");
    assert!(
        reply.body.contains(r#""kind":"bad_request""#),
        "{}",
        reply.body
    );
    assert_eq!(r.unlock(&holder).await.released(), 1);
}

#[tokio::test]
async fn default_rejections_speak_problem_json_to_clients_that_accept_it() {
    let mut cluster = Cluster::start(3);
    let r = redlock(&cluster).await;
    let _holder = r.try_lock(lock_of("held")).await.expect("lock");
    let layer = RedlockLayer::new(r.clone(), Header::new(KEY_HEADER));
    let addr = serve(app(layer, App::new())).await;
    let client = http1();
    let request = |key: &'static str, accept: Option<&'static str>| {
        let mut req = post_req(addr, "/hook", Some((KEY_HEADER, key)));
        if let Some(accept) = accept {
            req.headers_mut()
                .insert(http::header::ACCEPT, http::HeaderValue::from_static(accept));
        }
        req
    };

    let reply = send(&client, request("held", Some("application/problem+json"))).await;
    assert_eq!(reply.status, 409);
    assert_eq!(reply.headers["content-type"], "application/problem+json");
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(
        reply.body,
        r#"{"type":"https://docs.rs/tower-redlock/latest/tower_redlock/layer/problems/index.html#busy","title":"The key is locked by another request","status":409,"detail":"the resource is locked by another request; retry later","kind":"busy","retry_after":1}"#
    );
    let reply = send(
        &client,
        request("held", Some("application/json, */*;q=0.5")),
    )
    .await;
    assert_eq!(reply.headers["content-type"], "application/json");
    assert!(reply.body.starts_with('{'), "{}", reply.body);
    for accept in [
        None,
        Some("*/*"),
        Some("text/html"),
        Some("application/json;q=0"),
    ] {
        let reply = send(&client, request("held", accept)).await;
        assert_eq!(reply.status, 409);
        assert_eq!(
            reply.headers["content-type"], "text/plain; charset=utf-8",
            "Accept: {accept:?}"
        );
        assert_eq!(
            reply.body,
            "the resource is locked by another request; retry later\n"
        );
    }

    // No quorum: 503 with Retry-After, in problem+json too.
    cluster.nodes[0].kill();
    cluster.nodes[1].kill();
    let reply = send(&client, request("free", Some("application/problem+json"))).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.headers["retry-after"], "1");
    assert!(
        reply.body.contains(r#""status":503"#) && reply.body.contains(r#""kind":"unavailable""#),
        "{}",
        reply.body
    );
}

#[tokio::test]
async fn the_layer_works_in_router_layer_and_route_layer() {
    let cluster = Cluster::start(1);
    let r = redlock(&cluster).await;
    async fn token_name(Extension(token): Extension<LockToken>) -> Vec<u8> {
        token.name().to_vec()
    }
    let app: Router = Router::new()
        .route("/a", post(token_name))
        .layer(RedlockLayer::new(r, Header::new(KEY_HEADER).required()));
    let addr = serve(app).await;
    let reply = send(
        &http1(),
        post_req(addr, "/a", Some((KEY_HEADER, "via-layer"))),
    )
    .await;
    assert_eq!(
        (reply.status.as_u16(), reply.body),
        (200, lock_of("via-layer"))
    );
}

#[tokio::test]
async fn handlers_get_growing_fencing_numbers_unless_the_layer_turns_fencing_off() {
    let cluster = Cluster::start(3);
    let r = redlock(&cluster).await;
    async fn fence(token: LockToken) -> String {
        token
            .fencing_token()
            .map_or_else(|| "none".to_owned(), |n| n.to_string())
    }
    let app: Router = Router::new()
        .route("/fenced", post(fence))
        .route_layer(RedlockLayer::new(r.clone(), Header::new(KEY_HEADER)))
        .merge(
            Router::new()
                .route("/plain", post(fence))
                .route_layer(RedlockLayer::new(r, Header::new(KEY_HEADER)).fencing(false)),
        );
    let addr = serve(app).await;
    let client = http1();
    let mut numbers = Vec::new();
    for _ in 0..3 {
        let reply = send(
            &client,
            post_req(addr, "/fenced", Some((KEY_HEADER, "acct"))),
        )
        .await;
        assert_eq!(reply.status.as_u16(), 200);
        numbers.push(reply.body.parse::<u64>().expect("a fencing number"));
    }
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
    let reply = send(
        &client,
        post_req(addr, "/plain", Some((KEY_HEADER, "req-1"))),
    )
    .await;
    assert_eq!((reply.status.as_u16(), reply.body.as_str()), (200, "none"));
    for i in 0..3 {
        let mut conn = cluster.raw(i).await;
        let (key, member) =
            tower_redlock::fencing::counter_of(b"redlock:", lock_of("req-1").as_bytes(), false)
                .expect("a valid name");
        let counter: Option<f64> = conn.zscore(key, member).await.expect("ZSCORE");
        assert_eq!(
            counter, None,
            "no counter for a name locked without fencing"
        );
    }
}

/// Compile-time checks: Send and Clone where tower and axum need them.
#[allow(dead_code)]
fn static_checks() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    fn clone<T: Clone>() {}
    type Inner = axum::routing::Route;
    send::<RedlockLayer<Header>>();
    sync::<RedlockLayer<Header>>();
    clone::<RedlockLayer<Header>>();
    send::<RedlockService<Inner, Header>>();
    clone::<RedlockService<Inner, Header>>();
    send::<ResponseFuture<<Inner as tower::Service<http::Request<Body>>>::Future, Body, Infallible>>(
    );
    send::<tower_redlock::layer::ResponseBody<Body>>();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_keeps_its_lock_past_the_ttl() {
    let cluster = Cluster::start(3);
    let state = App::new();
    let layer = RedlockLayer::new(short_ttl_redlock(&cluster).await, Header::new(KEY_HEADER));
    let addr = serve(app(layer, state.clone())).await;
    let request = spawn_delivery(http1(), addr, "slow");
    state.started.acquire().await.expect("started").forget();
    let other = short_ttl_redlock(&cluster).await;
    // Three TTLs later the handler still holds its lock.
    let end = Instant::now() + Duration::from_millis(1_800);
    while Instant::now() < end {
        assert!(
            matches!(
                other.try_lock(lock_of("slow")).await,
                Err(tower_redlock::LockError::Busy { .. })
            ),
            "the lock slipped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    state.gate.add_permits(1);
    assert_eq!(request.await.expect("request").status, 200);
    assert_eq!(cluster.nodes_holding(key_of("slow")).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_abort_on_loss_a_destroyed_lock_drops_the_handler_and_answers_503() {
    let cluster = Cluster::start(3);
    let state = App::new();
    let layer = RedlockLayer::new(short_ttl_redlock(&cluster).await, Header::new(KEY_HEADER))
        .abort_on_loss(true);
    let addr = serve(app(layer, state.clone())).await;
    let request = spawn_delivery(http1(), addr, "doomed");
    state.started.acquire().await.expect("started").forget();
    for i in 0..3 {
        let mut conn = cluster.raw(i).await;
        let _: () = conn.del(key_of("doomed")).await.expect("DEL");
    }
    let reply = tokio::time::timeout(Duration::from_secs(5), request)
        .await
        .expect("answered")
        .expect("request");
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(reply.body.contains("lost"), "{}", reply.body);
    assert_eq!(
        state.ended.load(Ordering::SeqCst),
        1,
        "the handler future was dropped"
    );
    assert!(
        state.spans.lock().expect("spans").is_empty(),
        "the handler never completed"
    );
    assert_eq!(cluster.nodes_holding(key_of("doomed")).await, 0);
}

/// 50 requests for one key behind the wait policy run one at a time, in the order they
/// arrived, each woken by the release of the one before (the retry delay is seconds long,
/// so polling cannot explain the pace).
///
/// Tolerance: requests are sent 10 ms apart over separate connections, so two neighbours
/// may reach the server in either order; each request must run within 2 places of its
/// arrival and none may be skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_wait_policy_50_waiters_run_in_arrival_order() {
    let cluster = Cluster::start(3);
    let redlock = cluster
        .client(|b| {
            b.ttl(Duration::from_secs(30))
                .node_timeout(SLOW_MACHINE_TIMEOUT)
                .retry_delay(Duration::from_secs(3), Duration::ZERO)
        })
        .await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Semaphore::new(0));
    let entered = Arc::new(Semaphore::new(0));
    let handler = {
        let (order, gate, entered) = (order.clone(), gate.clone(), entered.clone());
        move |req: http::Request<Body>| {
            let (order, gate, entered) = (order.clone(), gate.clone(), entered.clone());
            async move {
                let seq: usize = req.headers()["x-seq"]
                    .to_str()
                    .expect("ascii")
                    .parse()
                    .expect("number");
                order.lock().expect("order").push(seq);
                entered.add_permits(1);
                gate.acquire().await.expect("gate").forget();
                "done"
            }
        }
    };
    let layer = RedlockLayer::new(redlock, Header::new(KEY_HEADER))
        .fencing(false)
        .wait(WaitPolicy::up_to(Duration::from_secs(120)).max_waiters(64));
    let app = Router::new()
        .route("/hook", post(handler))
        .route_layer(layer);
    let addr = serve(app).await;
    let client = http1();
    let request = |seq: usize| {
        let mut req = post_req(addr, "/hook", Some((KEY_HEADER, "evt-order")));
        req.headers_mut().insert("x-seq", seq.into());
        let client = client.clone();
        tokio::spawn(async move { send(&client, req).await.status })
    };
    let mut replies = vec![request(0)];
    entered.acquire().await.expect("first in").forget();
    for seq in 1..50 {
        replies.push(request(seq));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = Instant::now();
    gate.add_permits(50);
    for (seq, reply) in replies.into_iter().enumerate() {
        assert_eq!(reply.await.expect("request task"), 200, "request {seq}");
    }
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "49 handoffs took {:?}: they waited for the retry delay, not the release",
        t.elapsed()
    );
    let order = order.lock().expect("order").clone();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..50).collect::<Vec<_>>(),
        "every request ran once"
    );
    for (place, seq) in order.iter().enumerate() {
        assert!(
            place.abs_diff(*seq) <= 2,
            "arrival {seq} ran at place {place}: {order:?}"
        );
    }
}

/// A handler that counts its runs and answers with `status` (from the `x-status` header,
/// default 201), a JSON content type and the run number in the body.
/// Serves [`counting_app`] with replay (`retention`) on `cluster`; returns its address and
/// its run counter.
async fn serve_counting(
    cluster: &Cluster,
    retention: Duration,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = counting_app(redlock(cluster).await, runs.clone(), retention);
    (serve(app).await, runs)
}

fn counting_app(redlock: Redlock, runs: Arc<AtomicUsize>, replay: Duration) -> Router {
    counting_app_keyed_by(Header::new(KEY_HEADER), redlock, runs, replay)
}

/// [`counting_app`], with the lock names from `key`.
fn counting_app_keyed_by(
    key: Header,
    redlock: Redlock,
    runs: Arc<AtomicUsize>,
    replay: Duration,
) -> Router {
    let handler = move |req: http::Request<Body>| {
        let runs = runs.clone();
        async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let status = req
                .headers()
                .get("x-status")
                .and_then(|v| v.to_str().ok()?.parse::<u16>().ok())
                .and_then(|s| http::StatusCode::from_u16(s).ok())
                .unwrap_or(http::StatusCode::CREATED);
            (
                status,
                [(http::header::CONTENT_TYPE, "application/json")],
                format!("{{\"run\":{run}}}"),
            )
        }
    };
    let layer = RedlockLayer::new(redlock, key)
        .fencing(false)
        .replay(replay);
    Router::new()
        .route("/hook", post(handler.clone()))
        .route("/other", post(handler))
        .route_layer(layer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_retries_after_completion_get_the_first_response() {
    let cluster = Cluster::start(3);
    let (addr, runs) = serve_counting(&cluster, Duration::from_secs(60)).await;
    let client = http1();
    let first = send(
        &client,
        post_req(addr, "/hook", Some((KEY_HEADER, "evt-r"))),
    )
    .await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    cluster.reset_stats().await;
    for _ in 0..100 {
        let again = send(
            &client,
            post_req(addr, "/hook", Some((KEY_HEADER, "evt-r"))),
        )
        .await;
        assert_eq!(again.status, 201);
        assert_eq!(again.body, first.body);
        assert_eq!(again.headers["content-type"], "application/json");
        assert_eq!(again.headers[tower_redlock::layer::REPLAYED_HEADER], "true");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    // A replay is the acquire round trip only: per node and request its `SET NX PX` and
    // the reads of the key (`GET`, `PTTL`) in one request, no script, no release, no
    // second round.
    for i in 0..3 {
        for command in ["set", "get", "pttl"] {
            assert_eq!(
                cluster.command_calls(i, command).await,
                100,
                "node {i}: {command}"
            );
        }
        assert_eq!(cluster.command_calls(i, "evalsha").await, 0, "node {i}");
    }
}

/// A recorded response of 300 KB goes to the nodes and comes back intact: the replies
/// arrive over many reads of the node connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_a_large_response_is_recorded_and_replayed_intact() {
    let cluster = Cluster::start(3);
    let body: String = (0..300_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (body, runs) = (body.clone(), runs.clone());
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            async move { body }
        }
    };
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER))
        .fencing(false)
        .replay_policy(
            tower_redlock::layer::ReplayPolicy::new(Duration::from_secs(60)).max_body(1 << 20),
        );
    let addr = serve(
        Router::new()
            .route("/big", post(handler))
            .route_layer(layer),
    )
    .await;
    let client = http1();
    for round in 0..3 {
        let reply = send(
            &client,
            post_req(addr, "/big", Some((KEY_HEADER, "evt-big"))),
        )
        .await;
        assert_eq!(reply.status, 200, "round {round}");
        assert!(reply.body == body, "round {round}: the body changed");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_5xx_is_not_kept_and_records_expire() {
    let cluster = Cluster::start(3);
    let (addr, runs) = serve_counting(&cluster, Duration::from_secs(1)).await;
    let client = http1();
    let with_status = |status: &'static str| {
        let mut req = post_req(addr, "/hook", Some((KEY_HEADER, "evt-5")));
        req.headers_mut()
            .insert("x-status", http::HeaderValue::from_static(status));
        req
    };
    assert_eq!(send(&client, with_status("503")).await.status, 503);
    assert_eq!(send(&client, with_status("200")).await.status, 200);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a 5xx is retried");
    let replayed = send(&client, with_status("500")).await;
    assert_eq!(replayed.status, 200, "the kept 200 is replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    wait_for("the record to expire", Duration::from_secs(10), || async {
        cluster.nodes_holding(key_of("evt-5")).await == 0
    })
    .await;
    assert_eq!(send(&client, with_status("200")).await.status, 200);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "after the retention the handler runs again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_a_minority_down_still_records_and_replays() {
    let mut cluster = Cluster::start(5);
    let (addr, runs) = serve_counting(&cluster, Duration::from_secs(60)).await;
    let client = http1();
    cluster.nodes[0].kill();
    cluster.nodes[1].kill();
    let first = send(
        &client,
        post_req(addr, "/hook", Some((KEY_HEADER, "evt-m"))),
    )
    .await;
    assert_eq!(first.status, 201);
    cluster.nodes[1].restart(); // empty, like a node that never saw the record
    let again = send(
        &client,
        post_req(addr, "/hook", Some((KEY_HEADER, "evt-m"))),
    )
    .await;
    assert_eq!(again.status, 201);
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers[tower_redlock::layer::REPLAYED_HEADER], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_a_duplicate_while_running_is_409_then_replayed() {
    let cluster = Cluster::start(3);
    let state = App::new();
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER))
        .fencing(false)
        .replay(Duration::from_secs(60));
    let addr = serve(app(layer, state.clone())).await;
    let client = http1();
    let first = spawn_delivery(client.clone(), addr, "evt-d");
    state.started.acquire().await.expect("first runs").forget();
    let dup = send(
        &client,
        post_req(addr, "/hook", Some((KEY_HEADER, "evt-d"))),
    )
    .await;
    assert_eq!(dup.status, 409);
    state.gate.add_permits(1);
    assert_eq!(first.await.expect("first").status, 200);
    let after = send(
        &client,
        post_req(addr, "/hook", Some((KEY_HEADER, "evt-d"))),
    )
    .await;
    assert_eq!((after.status.as_u16(), after.body), (200, lock_of("evt-d")));
    assert_eq!(after.headers[tower_redlock::layer::REPLAYED_HEADER], "true");
    assert_eq!(state.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_the_same_key_for_another_request_is_422() {
    let cluster = Cluster::start(3);
    let (addr, runs) = serve_counting(&cluster, Duration::from_secs(60)).await;
    let client = http1();
    let first = send(
        &client,
        post_req(addr, "/hook", Some((KEY_HEADER, "evt-f"))),
    )
    .await;
    assert_eq!(first.status, 201);
    let other = send(
        &client,
        post_req(addr, "/other", Some((KEY_HEADER, "evt-f"))),
    )
    .await;
    assert_eq!(other.status, 422, "{}", other.body);
    assert!(other.body.contains("different request"), "{}", other.body);
    let same = send(
        &client,
        post_req(addr, "/hook", Some((KEY_HEADER, "evt-f"))),
    )
    .await;
    assert_eq!((same.status.as_u16(), &same.body), (201, &first.body));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The IETF draft's contract end to end: `Idempotency-Key` is a structured-field string
/// (`"k"` and `k` are one key; a list or a repeated header is 400), and the replay layer's
/// rejections are problem documents unless the client asks for text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_keys_are_sf_strings_and_rejections_are_problem_documents() {
    let cluster = Cluster::start(3);
    let r = redlock(&cluster).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = counting_app_keyed_by(
        Header::new("Idempotency-Key"),
        r.clone(),
        runs.clone(),
        Duration::from_secs(60),
    );
    let addr = serve(app).await;
    let client = http1();
    let request = |path: &str, keys: &[&'static str], accept: Option<&'static str>| {
        let mut req = post_req(addr, path, None);
        for key in keys {
            req.headers_mut()
                .append("idempotency-key", http::HeaderValue::from_static(key));
        }
        if let Some(accept) = accept {
            req.headers_mut()
                .insert(http::header::ACCEPT, http::HeaderValue::from_static(accept));
        }
        req
    };
    let problem = |reply: &support::http::Reply, status: u16, kind: &str| {
        assert_eq!(reply.status, status, "{}", reply.body);
        assert_eq!(reply.headers["content-type"], "application/problem+json");
        assert!(
            reply.body.contains(&format!(r#""status":{status}"#))
                && reply.body.contains(&format!(r#""kind":"{kind}""#)),
            "{}",
            reply.body
        );
    };

    let first = send(&client, request("/hook", &[r#""pay-1""#], None)).await;
    assert_eq!(
        (first.status.as_u16(), first.body.as_str()),
        (201, r#"{"run":1}"#)
    );
    for same in ["pay-1", r#" "pay-1";v=2 "#] {
        let again = send(&client, request("/hook", &[same], None)).await;
        assert_eq!(
            (again.status.as_u16(), &again.body),
            (201, &first.body),
            "{same}"
        );
        assert!(again.replayed(), "{same}");
    }

    // The key on another request: 422, a problem document without Accept or with */*.
    for accept in [None, Some("*/*")] {
        let other = send(&client, request("/other", &["pay-1"], accept)).await;
        problem(&other, 422, "key_reused");
        assert!(other.body.contains("different request"), "{}", other.body);
    }
    let text = send(&client, request("/other", &["pay-1"], Some("text/plain"))).await;
    assert_eq!(text.status, 422);
    assert_eq!(text.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(
        text.body,
        "the key this request carries was already used for a different request; a new \
         request needs a new key\n"
    );

    // Keys that are not one sf-string.
    let list = send(&client, request("/hook", &[r#""pay-2", "pay-3""#], None)).await;
    problem(&list, 400, "bad_request");
    assert!(list.body.contains("it is a list"), "{}", list.body);
    let twice = send(
        &client,
        request("/hook", &[r#""pay-2""#, r#""pay-2""#], None),
    )
    .await;
    problem(&twice, 400, "bad_request");
    assert!(
        twice
            .body
            .contains("the idempotency-key header is sent more than once"),
        "{}",
        twice.body
    );
    let empty = send(&client, request("/hook", &[r#""""#], None)).await;
    problem(&empty, 400, "bad_request");

    // Busy: a problem document with Retry-After.
    let holder = r
        .try_lock(support::header_lock("idempotency-key", "held"))
        .await
        .expect("lock");
    let busy = send(&client, request("/hook", &[r#""held""#], None)).await;
    problem(&busy, 409, "busy");
    assert_eq!(busy.headers["retry-after"], "1");
    let busy = send(&client, request("/hook", &["held"], Some("text/*"))).await;
    assert_eq!(
        (busy.status.as_u16(), busy.body.as_str()),
        (
            409,
            "the resource is locked by another request; retry later\n"
        )
    );
    assert_eq!(r.unlock(&holder).await.released(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the first request ran");
}

/// A handler that panics leaves no record: the lock is released and the retry runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_a_panicking_handler_leaves_no_record() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        move || {
            let runs = runs.clone();
            async move {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("the first run fails");
                }
                "ok"
            }
        }
    };
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER))
        .fencing(false)
        .replay(Duration::from_secs(60));
    let app = Router::new()
        .route("/hook", post(handler))
        .route_layer(layer);
    let addr = serve(app).await;
    let client = http1();
    let failed = client
        .request(post_req(addr, "/hook", Some((KEY_HEADER, "evt-p"))))
        .await;
    assert!(
        failed.is_err(),
        "the connection closes when the handler panics"
    );
    wait_for(
        "the lock to be released",
        Duration::from_secs(5),
        || async { cluster.nodes_holding(key_of("evt-p")).await == 0 },
    )
    .await;
    let retry = send(
        &client,
        post_req(addr, "/hook", Some((KEY_HEADER, "evt-p"))),
    )
    .await;
    assert_eq!((retry.status.as_u16(), retry.body.as_str()), (200, "ok"));
    assert!(!retry.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// With [`BodyFingerprintLayer`] outside the lock, the same key with another body is 422;
/// the handler still reads the whole body (also beyond the fingerprint's limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_and_body_fingerprints_another_body_is_422() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        move |body: String| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                (
                    http::StatusCode::CREATED,
                    format!("got {} bytes", body.len()),
                )
            }
        }
    };
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new("Idempotency-Key"))
        .fencing(false)
        .replay(Duration::from_secs(60));
    let app = Router::new().route("/pay", post(handler)).route_layer(
        tower::ServiceBuilder::new()
            .layer(tower_redlock::layer::BodyFingerprintLayer::new(16))
            .layer(layer),
    );
    let addr = serve(app).await;
    let client = http1();
    let with_body = |body: &str| {
        http::Request::post(format!("http://{addr}/pay"))
            .header("idempotency-key", "pay-b")
            .body(Body::from(body.to_owned()))
            .expect("request")
    };
    let long = "amount=10;".repeat(100);
    let first = send(&client, with_body(&long)).await;
    assert_eq!(
        (first.status.as_u16(), first.body.as_str()),
        (201, "got 1000 bytes")
    );
    let other = send(&client, with_body("amount=99")).await;
    assert_eq!(other.status, 422, "{}", other.body);
    let same = send(&client, with_body(&long)).await;
    assert_eq!(
        (same.status.as_u16(), same.body.as_str()),
        (201, "got 1000 bytes")
    );
    assert_eq!(same.headers[tower_redlock::layer::REPLAYED_HEADER], "true");
    // Beyond the 16 bytes fingerprinted, bodies count as the same request.
    let same_start = send(&client, with_body(&"amount=10;".repeat(3))).await;
    assert_eq!(same_start.status, 201, "{}", same_start.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A completion record in the layer's format (`src/layer/record.rs`): the marker, the
/// request's fingerprint, the status, `headers` (name, value), and `body`.
fn record_bytes(
    fingerprint: &[u8; 32],
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
) -> Vec<u8> {
    let put = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&u32::try_from(bytes.len()).expect("len").to_be_bytes());
        out.extend_from_slice(bytes);
    };
    let mut out = b"#record\n".to_vec();
    out.extend_from_slice(fingerprint);
    out.extend_from_slice(&status.to_be_bytes());
    out.extend_from_slice(&u32::try_from(headers.len()).expect("len").to_be_bytes());
    for (name, value) in headers {
        put(&mut out, name.as_bytes());
        put(&mut out, value.as_bytes());
    }
    out.push(1);
    put(&mut out, body);
    out
}

/// The default fingerprint of a `POST {path}` without credentials.
fn post_fingerprint(path: &str) -> [u8; 32] {
    let req = http::Request::post(path).body(()).expect("request");
    *tower_redlock::layer::RequestFingerprint::of(&req, b"").as_bytes()
}

/// Stores `record` under the lock key of delivery `id` on node `i`, for a minute.
async fn store_record(cluster: &Cluster, i: usize, id: &str, record: &[u8]) {
    let mut conn = cluster.raw(i).await;
    let key = key_of(id);
    let _: () = conn.pset_ex(key, record, 60_000).await.expect("PSETEX");
}

/// Whether node `i` holds a completion record under the lock key of delivery `id`.
async fn record_on(cluster: &Cluster, i: usize, id: &str) -> bool {
    let mut conn = cluster.raw(i).await;
    let value: Option<Vec<u8>> = conn.get(key_of(id)).await.expect("GET");
    value.is_some_and(|v| v.starts_with(b"#record\n"))
}

/// A POST of delivery `key` to `path` carrying the caller's `credential` (a header:
/// `Authorization`, `Cookie`).
fn as_caller(
    addr: std::net::SocketAddr,
    path: &str,
    key: &str,
    (name, value): (http::HeaderName, &'static str),
) -> http::Request<Body> {
    let mut req = post_req(addr, path, Some((KEY_HEADER, key)));
    req.headers_mut()
        .insert(name, http::HeaderValue::from_static(value));
    req
}

/// A handler that answers 201 `run {n}`, counting its runs in `runs`.
fn counting_runs(
    runs: &Arc<AtomicUsize>,
) -> impl Fn() -> std::future::Ready<(http::StatusCode, String)> + Clone + Send + Sync + 'static {
    let runs = Arc::clone(runs);
    move || {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready((http::StatusCode::CREATED, format!("run {run}")))
    }
}

/// A second caller that sends another caller's idempotency key (same method and path) is
/// never answered with the first caller's stored response: the default fingerprint
/// includes a hash of the `Authorization` header, so it gets 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_another_caller_with_the_same_key_never_gets_the_first_callers_response() {
    let cluster = Cluster::start(3);
    let (addr, runs) = serve_counting(&cluster, Duration::from_secs(60)).await;
    let client = http1();
    let as_caller =
        |token: &'static str| as_caller(addr, "/hook", "1", (http::header::AUTHORIZATION, token));
    let alice = send(&client, as_caller("Bearer alice")).await;
    assert_eq!(
        (alice.status.as_u16(), alice.body.as_str()),
        (201, "{\"run\":1}")
    );
    let bob = send(&client, as_caller("Bearer bob")).await;
    assert_ne!(bob.body, alice.body, "bob got alice's stored response");
    assert!(!bob.replayed());
    assert_eq!(bob.status, 422, "{}", bob.body);
    let anonymous = send(&client, post_req(addr, "/hook", Some((KEY_HEADER, "1")))).await;
    assert_eq!(anonymous.status, 422, "{}", anonymous.body);
    let again = send(&client, as_caller("Bearer alice")).await;
    assert_eq!((again.status.as_u16(), &again.body), (201, &alice.body));
    assert_eq!(again.headers[tower_redlock::layer::REPLAYED_HEADER], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// With `auto_extend(false)`, a handler that outlives its lock leaves no record, even
/// where its key survived (a node whose key lives a little longer): the lock is just
/// released, the response is cut short (its body fails: no complete answer without its
/// record), and the retry runs the handler again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_a_handler_that_lost_its_lock_leaves_no_record() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(Semaphore::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let handler = {
        let (runs, started, gate) = (runs.clone(), started.clone(), gate.clone());
        move || {
            let (runs, started, gate) = (runs.clone(), started.clone(), gate.clone());
            async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                if run == 1 {
                    started.add_permits(1);
                    gate.acquire().await.expect("gate").forget();
                }
                (http::StatusCode::CREATED, format!("run {run}"))
            }
        }
    };
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER))
        .fencing(false)
        .ttl(Duration::from_millis(500))
        .auto_extend(false)
        .replay(Duration::from_secs(60));
    let app = Router::new()
        .route("/hook", post(handler))
        .route_layer(layer);
    let addr = serve(app).await;
    let client = http1();
    let first = {
        let client = client.clone();
        tokio::spawn(async move {
            exchange(
                &client,
                post_req(addr, "/hook", Some((KEY_HEADER, "evt-l"))),
            )
            .await
        })
    };
    started.acquire().await.expect("started").forget();
    // Node 0's key outlives the others (as on a node whose clock runs slow). Its SET may
    // still be landing when the quorum of the others decided.
    wait_for("the lock on node 0", Duration::from_secs(5), || async {
        cluster.get(0, key_of("evt-l")).await.is_some()
    })
    .await;
    let mut conn = cluster.raw(0).await;
    let longer: bool = conn
        .pexpire(key_of("evt-l"), 30_000)
        .await
        .expect("PEXPIRE");
    assert!(longer, "the lock key is on node 0");
    wait_for(
        "the lock to expire on nodes 1 and 2",
        Duration::from_secs(10),
        || async {
            cluster.get(1, key_of("evt-l")).await.is_none()
                && cluster.get(2, key_of("evt-l")).await.is_none()
        },
    )
    .await;
    gate.add_permits(1);
    let first = first.await.expect("first");
    assert!(
        first.is_err(),
        "the response without its record came complete: {:?}",
        first.map(|seen| seen.text())
    );
    for i in 0..3 {
        assert!(
            !record_on(&cluster, i, "evt-l").await,
            "a record on node {i}"
        );
    }
    let retry = send(
        &client,
        post_req(addr, "/hook", Some((KEY_HEADER, "evt-l"))),
    )
    .await;
    assert_eq!((retry.status.as_u16(), retry.body.as_str()), (201, "run 2"));
    assert!(!retry.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Only a record a quorum of nodes agrees on is replayed: two different records on a
/// minority each are never answered (the name is busy until they expire), a record on a
/// minority alone is restored onto the nodes that grant and then replayed (the handler
/// does not run), and a record on a quorum is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_only_a_record_a_quorum_agrees_on_is_replayed() {
    let cluster = Cluster::start(3);
    let (addr, runs) = serve_counting(&cluster, Duration::from_secs(60)).await;
    let client = http1();
    let fingerprint = post_fingerprint("/hook");
    let a = record_bytes(&fingerprint, 201, &[], b"record A");
    let b = record_bytes(&fingerprint, 201, &[], b"record B");
    let hook = |name: &'static str| post_req(addr, "/hook", Some((KEY_HEADER, name)));

    // Two runs recorded on one node each: no quorum agrees, neither is replayed.
    store_record(&cluster, 0, "evt-split", &a).await;
    store_record(&cluster, 1, "evt-split", &b).await;
    for _ in 0..10 {
        let reply = send(&client, hook("evt-split")).await;
        assert!(
            !reply.body.contains("record"),
            "answered with a minority record: {}",
            reply.body
        );
        assert_eq!(reply.status, 409, "{}", reply.body);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // A record on one node of three: the others grant the lock, the record is restored
    // onto them and replayed; the handler does not run.
    store_record(&cluster, 0, "evt-minority", &a).await;
    let restored = send(&client, hook("evt-minority")).await;
    assert_eq!(
        (restored.status.as_u16(), restored.body.as_str()),
        (201, "record A")
    );
    assert_eq!(
        restored.headers[tower_redlock::layer::REPLAYED_HEADER],
        "true"
    );
    for i in 0..3 {
        assert!(record_on(&cluster, i, "evt-minority").await, "node {i}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // A record on two nodes of three, another on the third: the quorum's is replayed.
    store_record(&cluster, 0, "evt-agreed", &a).await;
    store_record(&cluster, 1, "evt-agreed", &a).await;
    store_record(&cluster, 2, "evt-agreed", &b).await;
    for _ in 0..10 {
        let reply = send(&client, hook("evt-agreed")).await;
        assert_eq!(
            (reply.status.as_u16(), reply.body.as_str()),
            (201, "record A")
        );
        assert_eq!(reply.headers[tower_redlock::layer::REPLAYED_HEADER], "true");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A stored record with more header fields than a `HeaderMap` can hold (written by anyone
/// with access to the nodes) is refused with 503, not a panic: the connection stays up and
/// the next request on it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_a_record_with_absurdly_many_headers_is_503_not_a_panic() {
    let cluster = Cluster::start(3);
    let (addr, runs) = serve_counting(&cluster, Duration::from_secs(60)).await;
    let headers: Vec<(String, String)> = (0..40_000)
        .map(|i| (format!("x-h{i}"), "v".to_owned()))
        .collect();
    let record = record_bytes(&post_fingerprint("/hook"), 201, &headers, b"huge");
    for i in 0..3 {
        store_record(&cluster, i, "evt-huge", &record).await;
    }
    let client = http1();
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(post_req(addr, "/hook", Some((KEY_HEADER, "evt-huge")))),
    )
    .await
    .expect("answered in time")
    .expect("an answer, not a dropped connection");
    assert_eq!(reply.status(), 503);
    let next = send(
        &client,
        post_req(addr, "/hook", Some((KEY_HEADER, "evt-fine"))),
    )
    .await;
    assert_eq!(
        (next.status.as_u16(), next.body.as_str()),
        (201, "{\"run\":1}")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// An app that authenticates by session cookie names its caller with `Caller::cookie`:
/// another session that sends the same key gets 422, never the first session's response,
/// and with `PerPrincipal` each session's keys are its own (without a source, both
/// sessions were one caller: the second got the first's response).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_a_caller_named_by_its_session_cookie_is_told_apart() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = counting_runs(&runs);
    let session = || tower_redlock::layer::Caller::cookie("session");
    let shared = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER).required())
        .fencing(false)
        .replay(Duration::from_secs(60))
        .caller(session());
    let scoped = RedlockLayer::new(
        redlock(&cluster).await,
        tower_redlock::layer::PerPrincipal::new(Header::new(KEY_HEADER).required()),
    )
    .fencing(false)
    .replay(Duration::from_secs(60))
    .caller(session());
    let app = Router::new()
        .route("/hook", post(handler.clone()).route_layer(shared))
        .route("/scoped", post(handler).route_layer(scoped));
    let addr = serve(app).await;
    let client = http1();
    let as_session = |path: &'static str, cookie: &'static str| {
        as_caller(addr, path, "1", (http::header::COOKIE, cookie))
    };
    let alice = send(&client, as_session("/hook", "theme=dark; session=alice")).await;
    assert_eq!((alice.status.as_u16(), alice.body.as_str()), (201, "run 1"));
    let bob = send(&client, as_session("/hook", "session=bob")).await;
    assert_eq!(bob.status, 422, "bob got {:?}", bob.body);
    let again = send(&client, as_session("/hook", "session=alice; theme=light")).await;
    assert_eq!((again.status.as_u16(), again.body.as_str()), (201, "run 1"));
    assert!(again.replayed());

    let alice = send(&client, as_session("/scoped", "session=alice")).await;
    let bob = send(&client, as_session("/scoped", "session=bob")).await;
    assert_eq!(
        (alice.body.as_str(), bob.body.as_str()),
        ("run 2", "run 3"),
        "each session runs its own request"
    );
    let again = send(&client, as_session("/scoped", "session=bob")).await;
    assert_eq!((again.body.as_str(), again.replayed()), ("run 3", true));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// A request that failed authentication does not decide what the authenticated retry
/// with the same key gets: its 401 is not kept, so the retry with a valid token runs and
/// its 201 is kept (a kept 401 made the retry, another caller by its token, a 422).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_a_401_is_not_kept_and_the_authenticated_retry_runs() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        move |headers: http::HeaderMap| {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                match headers.get(http::header::AUTHORIZATION) {
                    Some(token) if token == "Bearer fresh" => {
                        (http::StatusCode::CREATED, format!("run {run}"))
                    }
                    _ => (http::StatusCode::UNAUTHORIZED, "token expired".to_owned()),
                }
            }
        }
    };
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER).required())
        .fencing(false)
        .replay(Duration::from_secs(60));
    let addr = serve(Router::new().route("/pay", post(handler).route_layer(layer))).await;
    let client = http1();
    let with_token =
        |token: &'static str| as_caller(addr, "/pay", "7", (http::header::AUTHORIZATION, token));
    let expired = send(&client, with_token("Bearer expired")).await;
    assert_eq!(expired.status, 401);
    let fresh = send(&client, with_token("Bearer fresh")).await;
    assert_eq!(
        (fresh.status.as_u16(), fresh.body.as_str()),
        (201, "run 2"),
        "the authenticated retry runs"
    );
    let again = send(&client, with_token("Bearer fresh")).await;
    assert_eq!((again.body.as_str(), again.replayed()), ("run 2", true));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// With `PerPrincipal`, each caller's idempotency keys are its own (as Stripe scopes them
/// to the account): another caller with the same key runs its own request, and each
/// caller's retries get its own response back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_and_per_principal_each_caller_runs_its_own_request() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = counting_runs(&runs);
    let layer = RedlockLayer::new(
        redlock(&cluster).await,
        tower_redlock::layer::PerPrincipal::new(Header::new(KEY_HEADER).required()),
    )
    .fencing(false)
    .replay(Duration::from_secs(60));
    let addr = serve(
        Router::new()
            .route("/hook", post(handler))
            .route_layer(layer),
    )
    .await;
    let client = http1();
    let as_caller =
        |token: &'static str| as_caller(addr, "/hook", "1", (http::header::AUTHORIZATION, token));
    let alice = send(&client, as_caller("Bearer alice")).await;
    assert_eq!((alice.status.as_u16(), alice.body.as_str()), (201, "run 1"));
    let bob = send(&client, as_caller("Bearer bob")).await;
    assert_eq!((bob.status.as_u16(), bob.body.as_str()), (201, "run 2"));
    assert!(!bob.replayed());
    for (token, body) in [("Bearer alice", "run 1"), ("Bearer bob", "run 2")] {
        let again = send(&client, as_caller(token)).await;
        assert_eq!((again.status.as_u16(), again.body.as_str()), (201, body));
        assert_eq!(again.headers[tower_redlock::layer::REPLAYED_HEADER], "true");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A handler that keeps its token where the test sees it, then works for `work`.
fn outliving_app<L>(layer: L, work: Duration, seen: Arc<Mutex<Option<LockToken>>>) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service:
        tower::Service<http::Request<Body>, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<http::Request<Body>>>::Response:
        axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<http::Request<Body>>>::Future: Send + 'static,
{
    let handler = move |token: LockToken| {
        let seen = seen.clone();
        async move {
            *seen.lock().expect("seen") = Some(token);
            tokio::time::sleep(work).await;
            "done"
        }
    };
    Router::new()
        .route("/hook", post(handler))
        .route_layer(layer)
}

/// Lost means lost without auto-extension: with `auto_extend(false)` and
/// `abort_on_loss(true)`, a handler that outlives its 600 ms lock is stopped when the
/// validity runs out: 503, and its token's `lost()` says `Expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auto_extension_abort_on_loss_answers_503_when_the_lock_runs_out() {
    let cluster = Cluster::start(3);
    let seen = Arc::new(Mutex::new(None));
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER))
        .ttl(Duration::from_millis(600))
        .auto_extend(false)
        .abort_on_loss(true);
    let addr = serve(outliving_app(layer, Duration::from_secs(3), seen.clone())).await;
    let started = Instant::now();
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        spawn_delivery(http1(), addr, "ran-out"),
    )
    .await
    .expect("answered")
    .expect("request");
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(reply.body.contains("validity"), "{}", reply.body);
    assert!(
        started.elapsed() < Duration::from_millis(2_500),
        "stopped at the deadline, not after the handler: {:?}",
        started.elapsed()
    );
    let token = seen.lock().expect("seen").clone().expect("the handler ran");
    let reason = tokio::time::timeout(Duration::from_secs(1), token.lost())
        .await
        .expect("lost");
    assert_eq!(reason, tower_redlock::LostReason::Expired);
    assert!(!token.is_held());
}

/// The same handler with auto-extension on keeps its lock past several TTLs and finishes
/// with 200: the deadline `lost()` waits for moves with each extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auto_extension_abort_on_loss_lets_a_long_handler_finish() {
    let cluster = Cluster::start(3);
    let seen = Arc::new(Mutex::new(None));
    let layer = RedlockLayer::new(redlock(&cluster).await, Header::new(KEY_HEADER))
        .ttl(Duration::from_millis(600))
        .abort_on_loss(true);
    let addr = serve(outliving_app(layer, Duration::from_secs(2), seen.clone())).await;
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        spawn_delivery(http1(), addr, "kept"),
    )
    .await
    .expect("answered")
    .expect("request");
    assert_eq!((reply.status.as_u16(), reply.body.as_str()), (200, "done"));
    let token = seen.lock().expect("seen").clone().expect("the handler ran");
    assert_eq!(
        token.lost_reason(),
        Some(tower_redlock::LostReason::Released)
    );
}

/// A fresh stack (restart quarantine on) answers 503 with a problem type of its own and
/// advises the quarantine's real remaining time, not the 1 s default cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_the_restart_quarantine_the_503_says_so_and_advises_its_end() {
    let cluster = Cluster::start(3);
    let redlock = Redlock::builder(cluster.urls())
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_millis(100))
        .max_attempts(1)
        .build()
        .expect("build");
    assert!(!redlock.health().await.ready());
    let layer = RedlockLayer::new(redlock, Header::new(KEY_HEADER));
    let addr = serve(app(layer, App::new())).await;
    let mut request = post_req(addr, "/hook", Some((KEY_HEADER, "early")));
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static("application/problem+json"),
    );
    let reply = send(&http1(), request).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(
        reply
            .body
            .contains(tower_redlock::layer::problems::QUARANTINE),
        "{}",
        reply.body
    );
    let retry_after: u64 = reply.headers[http::header::RETRY_AFTER]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((2..=10).contains(&retry_after), "Retry-After {retry_after}");
}

/// A client that stops reading mid-body no longer holds its key: the server stops taking
/// the endless body's frames once the socket is full, the lock is released once the body
/// has gone unread for the stall timeout, a retry with the same key runs, and the stalled
/// response ends (the connection closes) instead of streaming on. Both ways a body holds
/// its lock: recorded for replay, and with `release_on_body_end`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_mid_body_releases_its_key_after_the_stall_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let endless = {
        let runs = runs.clone();
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            async move {
                let chunk = bytes::Bytes::from(vec![b'x'; 64 << 10]);
                let frames = futures_util::stream::repeat_with(move || {
                    Ok::<_, Infallible>(http_body::Frame::data(chunk.clone()))
                });
                Body::new(http_body_util::StreamBody::new(frames))
            }
        }
    };
    let stall = Some(Duration::from_millis(300));
    let recorded = RedlockLayer::new(short_ttl_redlock(&cluster).await, Header::new(KEY_HEADER))
        .fencing(false)
        .replay(Duration::from_secs(60))
        .stall_timeout(stall);
    let held = RedlockLayer::new(short_ttl_redlock(&cluster).await, Header::new(KEY_HEADER))
        .fencing(false)
        .release_on_body_end()
        .stall_timeout(stall);
    let app = Router::new()
        .route("/recorded", post(endless.clone()).route_layer(recorded))
        .route("/held", post(endless).route_layer(held));
    let addr = serve(app).await;
    let observer = redlock(&cluster).await;
    for (path, id) in [("/recorded", "stall-1"), ("/held", "stall-2")] {
        let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\n{KEY_HEADER}: {id}\r\ncontent-length: 0\r\n\r\n"
        );
        socket.write_all(request.as_bytes()).await.expect("request");
        let lock = lock_of(id);
        wait_for("the handler's lock", Duration::from_secs(5), || async {
            observer.inspect(&lock).await.expect("inspect").held_on() >= 2
        })
        .await;
        // The client reads nothing: once the socket is full the body goes unread.
        wait_for(
            "the stalled body's lock released",
            Duration::from_secs(20),
            || async { observer.inspect(&lock).await.expect("inspect").held_on() == 0 },
        )
        .await;
        let before = runs.load(Ordering::SeqCst);
        let retry = tokio::time::timeout(
            Duration::from_secs(5),
            http1().request(post_req(addr, path, Some((KEY_HEADER, id)))),
        )
        .await
        .expect("the retry's head")
        .expect("the retry");
        assert_eq!(retry.status(), 200, "{path}: the key is free again");
        assert_eq!(runs.load(Ordering::SeqCst), before + 1, "{path}: it ran");
        drop(retry);
        // Reading again, the stalled response ends: what was buffered, then the close.
        let mut sink = vec![0; 1 << 20];
        let drained = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match socket.read(&mut sink).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(drained.is_ok(), "{path}: the stalled response streamed on");
    }
}
