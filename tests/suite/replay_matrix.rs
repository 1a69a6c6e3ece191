//! Replay that never lies, as a matrix: protocol {HTTP/1, h2, gRPC unary} × response body
//! {empty, small sized, large sized, over the limit, streamed, streamed with a
//! `Content-Length` its handler set, behind tower-http's `CompressionLayer`} × outcome {clean, body error at byte k, client disconnect at byte
//! k, handler panic} × options {replay, replay + `release_on_body_end`}, over a real axum
//! server, real hyper HTTP/1 and h2 clients (gRPC: unary calls framed by hand over h2,
//! `content-type: application/grpc`, so the test controls every byte) and three real
//! redis-server nodes.
//!
//! For each cell it checks what the first client saw, where the lock is while the body
//! streams (a lock value on every node) and once the first exchange is over (the record on
//! every node as soon as the client has the whole response; else nothing, the lock
//! released), and what a retry gets: the same status, headers and bytes, marked replayed,
//! without the handler running; or, after a failure, the handler running again; or, for a
//! response over the size limit, the documented 410 / `ALREADY_EXISTS`.
//!
//! Cells that make no sense, and why (printed by the test as well):
//! - HTTP × empty body × {body error, disconnect} at byte k: an empty body has no byte k;
//!   its response is whole once its head is sent.
//! - compressed × disconnect: the client leaves after the response head (k = 0), since the
//!   compressor holds back what it has until it has more.

use crate::support;

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use redis::AsyncCommands;
use support::Cluster;
use support::http::{Seen, exchange, http1, http2, serve};
use tower_redlock::RedlockLayer;
use tower_redlock::layer::{Header, REPLAYED_HEADER};

const KEY: &str = "idempotency-key";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Http1,
    H2,
    Grpc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Empty,
    Small,
    Large,
    OverLimit,
    Streamed,
    /// Streamed (no size hint), its size in a `Content-Length` header the handler set: a
    /// server stops polling the body once that many bytes are out.
    Declared,
    Compressed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Clean,
    BodyError,
    Disconnect,
    Panic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opts {
    Replay,
    ReplayBodyEnd,
}

const PROTOS: [Proto; 3] = [Proto::Http1, Proto::H2, Proto::Grpc];
const SHAPES: [Shape; 7] = [
    Shape::Empty,
    Shape::Small,
    Shape::Large,
    Shape::OverLimit,
    Shape::Streamed,
    Shape::Declared,
    Shape::Compressed,
];
const OUTCOMES: [Outcome; 4] = [
    Outcome::Clean,
    Outcome::BodyError,
    Outcome::Disconnect,
    Outcome::Panic,
];

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Empty => "empty",
            Shape::Small => "small",
            Shape::Large => "large",
            Shape::OverLimit => "over",
            Shape::Streamed => "streamed",
            Shape::Declared => "declared",
            Shape::Compressed => "compressed",
        }
    }

    fn parse(s: &str) -> Self {
        SHAPES
            .into_iter()
            .find(|shape| shape.name() == s)
            .unwrap_or(Shape::Small)
    }

    /// The payload's size: the default replay limit is 256 KiB.
    fn payload_len(self) -> usize {
        match self {
            Shape::Empty => 0,
            Shape::Small => 100,
            Shape::Large => 100 * 1024,
            Shape::OverLimit => 300 * 1024,
            Shape::Streamed | Shape::Declared => 40 * 1024,
            Shape::Compressed => 64 * 1024,
        }
    }

    /// The size of the frames the handler's body yields.
    fn chunk_len(self) -> usize {
        match self {
            Shape::Small => 50,
            Shape::Streamed | Shape::Declared => 8 * 1024,
            _ => 16 * 1024,
        }
    }

    /// Whether an HTTP response gives its size (`content-length`).
    fn sized(self) -> bool {
        matches!(
            self,
            Shape::Empty | Shape::Small | Shape::Large | Shape::OverLimit
        )
    }
}

/// Why a cell makes no sense, if it does not.
fn not_applicable(proto: Proto, shape: Shape, outcome: Outcome) -> Option<&'static str> {
    match (proto, shape, outcome) {
        (Proto::Http1 | Proto::H2, Shape::Empty, Outcome::BodyError | Outcome::Disconnect) => {
            Some("an empty body has no byte k: its response is whole once its head is sent")
        }
        _ => None,
    }
}

/// The bytes of a response body (for gRPC: the framed message), cut into the frames the
/// handler yields; and k, the byte at which a failing body fails (a frame boundary in the
/// middle).
fn body_of(shape: Shape, grpc: bool) -> (Vec<Bytes>, usize) {
    let payload: Vec<u8> = if shape == Shape::Compressed && !grpc {
        // Text the compressor shrinks.
        (0..shape.payload_len())
            .map(|i| b"replay never lies "[i % 18])
            .collect()
    } else {
        (0..shape.payload_len())
            .map(|i| u8::try_from((i * 7 + i / 251) % 256).unwrap_or(0))
            .collect()
    };
    let bytes = if grpc {
        let mut framed = vec![u8::from(shape == Shape::Compressed)];
        framed.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(0).to_be_bytes());
        framed.extend_from_slice(&payload);
        framed
    } else {
        payload
    };
    let chunk = if grpc && shape == Shape::Empty {
        2
    } else {
        shape.chunk_len()
    };
    let chunks: Vec<Bytes> = bytes
        .chunks(chunk.max(1))
        .map(Bytes::copy_from_slice)
        .collect();
    let k = chunks
        .iter()
        .take(
            chunks
                .len()
                .div_ceil(2)
                .min(chunks.len().saturating_sub(1))
                .max(1),
        )
        .map(Bytes::len)
        .sum();
    (chunks, k)
}

/// How the handler's body ends.
#[derive(Clone, Copy, Debug)]
enum Fail {
    None,
    /// An error once k bytes are out.
    ErrorAt(usize),
    /// Stuck once k bytes are out, until dropped (the client leaves meanwhile).
    GateAt(usize),
}

/// The handler's response body: frames, a failure, trailers (gRPC).
struct CellBody {
    chunks: VecDeque<Bytes>,
    size: Option<u64>,
    fail: Fail,
    sent: usize,
    trailers: Option<HeaderMap>,
    /// Like a stream's body: it tells its end only when polled past its last frame.
    lazy_end: bool,
    /// Tells the test the body is stuck at its gate; counts the bodies dropped.
    stuck: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl Drop for CellBody {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl http_body::Body for CellBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.fail {
            Fail::ErrorAt(k) if self.sent >= k => {
                return Poll::Ready(Some(Err(std::io::Error::other(format!(
                    "the handler's body failed at byte {k}"
                )))));
            }
            Fail::GateAt(k) if self.sent >= k => {
                self.stuck.fetch_add(1, Ordering::SeqCst);
                // Never woken: the body stays here until it is dropped.
                return Poll::Pending;
            }
            _ => {}
        }
        if let Some(chunk) = self.chunks.pop_front() {
            self.sent += chunk.len();
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        !self.lazy_end
            && self.chunks.is_empty()
            && self.trailers.is_none()
            && matches!(self.fail, Fail::None)
    }

    fn size_hint(&self) -> SizeHint {
        match self.size {
            Some(size) => SizeHint::with_exact(size.saturating_sub(self.sent as u64)),
            None => SizeHint::default(),
        }
    }
}

/// The server's side: runs by key, and the bodies stuck and dropped.
#[derive(Clone, Default)]
struct Server {
    runs: Arc<Mutex<HashMap<String, usize>>>,
    stuck: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl Server {
    fn runs(&self, key: &str) -> usize {
        self.runs
            .lock()
            .expect("runs")
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

async fn handler(
    axum::extract::State(server): axum::extract::State<Server>,
    req: http::Request<Body>,
) -> http::Response<Body> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let key = header(KEY);
    *server.runs.lock().expect("runs").entry(key).or_default() += 1;
    let grpc = header("content-type").starts_with("application/grpc");
    let shape = Shape::parse(&header("x-shape"));
    let (chunks, k) = body_of(shape, grpc);
    let fail = match header("x-fail").as_str() {
        "error" => Fail::ErrorAt(k),
        "gate" => Fail::GateAt(if shape == Shape::Compressed { 0 } else { k }),
        "panic" => panic!("the handler panicked (a replay matrix cell)"),
        _ => Fail::None,
    };
    let mut res = http::Response::builder();
    let (size, trailers) = if grpc {
        res = res
            .status(StatusCode::OK)
            .header("content-type", "application/grpc+proto");
        if shape == Shape::Compressed {
            res = res.header("grpc-encoding", "gzip");
        }
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("grpc-message", HeaderValue::from_static("done"));
        (None, Some(trailers))
    } else {
        res = res
            .status(StatusCode::CREATED)
            .header("content-type", "application/octet-stream")
            .header("location", "/cells/1");
        let total: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        if shape == Shape::Declared {
            res = res.header("content-length", total);
        }
        (shape.sized().then_some(total), None)
    };
    let body = CellBody {
        chunks: chunks.into(),
        size,
        fail,
        sent: 0,
        trailers,
        lazy_end: shape == Shape::Declared,
        stuck: Arc::clone(&server.stuck),
        dropped: Arc::clone(&server.dropped),
    };
    res.body(Body::new(body)).unwrap_or_default()
}

/// The app for `opts`: the cell route (with a compressor behind the lock) behind the
/// replay layer.
async fn app(cluster: &Cluster, opts: Opts, server: Server) -> Router {
    let redlock = cluster
        .client(|b| {
            b.ttl(Duration::from_secs(30))
                .node_timeout(Duration::from_millis(200))
        })
        .await;
    let layer = RedlockLayer::new(redlock, Header::new(KEY))
        .fencing(false)
        .replay(Duration::from_secs(60));
    let route = post(handler).layer(tower_http::compression::CompressionLayer::new());
    let router = Router::new().route("/cell", route);
    match opts {
        Opts::Replay => router.route_layer(layer),
        Opts::ReplayBodyEnd => router.route_layer(layer.release_on_body_end()),
    }
    .with_state(server)
}

/// The request of a cell: `fail` on the first request, nothing on a retry.
fn request(
    addr: std::net::SocketAddr,
    proto: Proto,
    shape: Shape,
    key: &str,
    fail: &str,
) -> http::Request<Body> {
    let mut b = http::Request::post(format!("http://{addr}/cell"))
        .header(KEY, key)
        .header("x-shape", shape.name())
        .header("x-fail", fail);
    if shape == Shape::Compressed {
        b = b.header("accept-encoding", "gzip");
    }
    let body = if proto == Proto::Grpc {
        b = b
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        Body::from(&b"\x00\x00\x00\x00\x03req"[..])
    } else {
        Body::empty()
    };
    b.body(body).unwrap_or_default()
}

/// What a node holds under the lock key of an idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Nothing,
    Lock,
    Record,
}

async fn held(cluster: &Cluster, key: &str) -> Vec<Held> {
    let mut out = Vec::new();
    for i in 0..3 {
        let mut conn = cluster.raw(i).await;
        let value: Option<Vec<u8>> = conn
            .get(support::key_of(&support::header_lock(KEY, key)))
            .await
            .unwrap_or_default();
        out.push(match value {
            None => Held::Nothing,
            Some(v) if v.starts_with(b"#record\n") => Held::Record,
            Some(_) => Held::Lock,
        });
    }
    out
}

/// Waits (up to 10 s) until every node holds `want` under `key`.
async fn wait_held(cluster: &Cluster, key: &str, want: Held) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = held(cluster, key).await;
        if now.iter().all(|h| *h == want) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("nodes hold {now:?}, not {want:?} everywhere"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn grpc_status(seen: &Seen) -> Option<String> {
    seen.trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| seen.headers.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

struct Cell {
    proto: Proto,
    shape: Shape,
    outcome: Outcome,
    opts: Opts,
}

impl Cell {
    fn key(&self) -> String {
        format!(
            "{:?}-{}-{:?}-{:?}",
            self.proto,
            self.shape.name(),
            self.outcome,
            self.opts
        )
    }
}

/// Runs one cell; `Err` says what went wrong.
async fn run(
    cluster: &Cluster,
    addr: std::net::SocketAddr,
    server: &Server,
    cell: &Cell,
) -> Result<(), String> {
    let key = cell.key();
    let client = match cell.proto {
        Proto::Http1 => http1(),
        Proto::H2 | Proto::Grpc => http2(),
    };
    let grpc = cell.proto == Proto::Grpc;
    let (chunks, k) = body_of(cell.shape, grpc);
    let whole: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let fail = match cell.outcome {
        Outcome::Clean => "",
        Outcome::BodyError => "error",
        Outcome::Disconnect => "gate",
        Outcome::Panic => "panic",
    };
    let req = request(addr, cell.proto, cell.shape, &key, fail);
    // 1. The first exchange, and where the lock is.
    let first = match cell.outcome {
        Outcome::Clean => {
            let seen = exchange(&client, req).await?;
            let (want_status, compressed) = if grpc {
                (StatusCode::OK, false)
            } else {
                (StatusCode::CREATED, cell.shape == Shape::Compressed)
            };
            if seen.status != want_status {
                return Err(format!("first: status {}", seen.status));
            }
            if !compressed && seen.body.as_ref() != whole.as_slice() {
                return Err(format!(
                    "first: {} bytes, not the {} sent",
                    seen.body.len(),
                    whole.len()
                ));
            }
            if compressed
                && seen
                    .headers
                    .get("content-encoding")
                    .is_none_or(|v| v != "gzip")
            {
                return Err("first: not compressed".into());
            }
            if grpc && grpc_status(&seen).as_deref() != Some("0") {
                return Err(format!("first: grpc-status {:?}", grpc_status(&seen)));
            }
            // The client has the whole response: the record is there already.
            let now = held(cluster, &key).await;
            if now.iter().any(|h| *h != Held::Record) {
                return Err(format!("after a clean response the nodes hold {now:?}"));
            }
            Some(seen)
        }
        Outcome::BodyError => {
            if let Ok(seen) = exchange(&client, req).await {
                return Err(format!(
                    "a body that failed reached the client as complete: {} with {} bytes",
                    seen.status,
                    seen.body.len()
                ));
            }
            wait_held(cluster, &key, Held::Nothing).await?;
            None
        }
        Outcome::Disconnect => {
            let stuck = server.stuck.load(Ordering::SeqCst);
            let dropped = server.dropped.load(Ordering::SeqCst);
            let res = client
                .request(req)
                .await
                .map_err(|e| format!("request: {e}"))?;
            let mut body = res.into_body();
            let want = if cell.shape == Shape::Compressed {
                0
            } else {
                k
            };
            let mut got = 0;
            while got < want {
                match body.frame().await {
                    Some(Ok(frame)) => got += frame.data_ref().map_or(0, Bytes::len),
                    other => return Err(format!("the body ended early at {got}: {other:?}")),
                }
            }
            // The body is stuck at byte k: the lock is held on every node.
            support::wait_for(
                "the body to reach its gate",
                Duration::from_secs(10),
                || async { server.stuck.load(Ordering::SeqCst) > stuck },
            )
            .await;
            let now = held(cluster, &key).await;
            if now.iter().any(|h| *h != Held::Lock) {
                return Err(format!("while the body streams the nodes hold {now:?}"));
            }
            drop(body);
            drop(client);
            support::wait_for(
                "the server to drop the body",
                Duration::from_secs(10),
                || async { server.dropped.load(Ordering::SeqCst) > dropped },
            )
            .await;
            wait_held(cluster, &key, Held::Nothing).await?;
            None
        }
        Outcome::Panic => {
            if let Ok(seen) = exchange(&client, req).await {
                return Err(format!("a panic answered {}", seen.status));
            }
            wait_held(cluster, &key, Held::Nothing).await?;
            None
        }
    };
    // 2. The retry.
    let client = match cell.proto {
        Proto::Http1 => http1(),
        Proto::H2 | Proto::Grpc => http2(),
    };
    let retry = exchange(&client, request(addr, cell.proto, cell.shape, &key, "")).await?;
    let runs = server.runs(&key);
    match first {
        Some(first) => {
            if runs != 1 {
                return Err(format!("the handler ran {runs} times"));
            }
            if cell.shape == Shape::OverLimit {
                let refused = if grpc {
                    grpc_status(&retry).as_deref() == Some("6")
                } else {
                    retry.status == StatusCode::GONE
                };
                if !refused || retry.headers.contains_key(REPLAYED_HEADER) {
                    return Err(format!(
                        "retry of a response over the limit: {} grpc-status {:?}",
                        retry.status,
                        grpc_status(&retry)
                    ));
                }
                return Ok(());
            }
            if retry
                .headers
                .get(REPLAYED_HEADER)
                .is_none_or(|v| v != "true")
            {
                return Err(format!("retry not replayed: {}", retry.status));
            }
            if retry.status != first.status || retry.body != first.body {
                return Err(format!(
                    "retry got {} with {} bytes, not {} with {}",
                    retry.status,
                    retry.body.len(),
                    first.status,
                    first.body.len()
                ));
            }
            for name in [
                "content-type",
                "content-encoding",
                "location",
                "grpc-encoding",
            ] {
                if retry.headers.get(name) != first.headers.get(name) {
                    return Err(format!("retry's {name} differs"));
                }
            }
            if grpc {
                let (a, b) = (first.trailers.as_ref(), retry.trailers.as_ref());
                let field = |t: Option<&HeaderMap>, n: &str| t.and_then(|t| t.get(n)).cloned();
                if field(a, "grpc-status") != field(b, "grpc-status")
                    || field(a, "grpc-message") != field(b, "grpc-message")
                {
                    return Err(format!("retry's trailers {b:?}, not {a:?}"));
                }
            }
        }
        None => {
            if runs != 2 {
                return Err(format!(
                    "after a failed first run the handler ran {runs} times"
                ));
            }
            if retry.headers.contains_key(REPLAYED_HEADER) {
                return Err("the retry of a failed request was replayed".into());
            }
            let ok = if grpc {
                grpc_status(&retry).as_deref() == Some("0")
            } else {
                retry.status == StatusCode::CREATED
            };
            if !ok {
                return Err(format!("the retry's own run answered {}", retry.status));
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_never_lies_over_the_whole_matrix() {
    let cluster = Cluster::start(3);
    let mut table = String::new();
    let mut failures = Vec::new();
    let mut ran = 0;
    for opts in [Opts::Replay, Opts::ReplayBodyEnd] {
        let server = Server::default();
        let addr = serve(app(&cluster, opts, server.clone()).await).await;
        for proto in PROTOS {
            for shape in SHAPES {
                for outcome in OUTCOMES {
                    let cell = Cell {
                        proto,
                        shape,
                        outcome,
                        opts,
                    };
                    if let Some(why) = not_applicable(proto, shape, outcome) {
                        let _ = writeln!(table, "n/a  {}: {why}", cell.key());
                        continue;
                    }
                    ran += 1;
                    let result = tokio::time::timeout(
                        Duration::from_secs(30),
                        run(&cluster, addr, &server, &cell),
                    )
                    .await
                    .unwrap_or_else(|_| Err("timed out".into()));
                    let mark = if result.is_ok() { "ok  " } else { "FAIL" };
                    let _ = writeln!(table, "{mark} {}", cell.key());
                    if let Err(why) = result {
                        failures.push(format!("{}: {why}", cell.key()));
                    }
                }
            }
        }
    }
    println!("{table}");
    assert!(ran >= 130, "{ran} cells ran");
    assert!(
        failures.is_empty(),
        "{} cells failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
