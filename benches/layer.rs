//! Layer overhead (the last workload of `BENCHMARKS.md`): an axum 0.8 route `POST /hook`
//! that answers 200 "ok" at once, served plain, behind `RedlockLayer` keyed by the
//! `x-request-id` header (fencing off), behind `RedlockLayer` with fencing on, and behind
//! `RedlockLayer` with replay, every timed request a retry answered from its record
//! (**replayed**), on 1 and 5 local redis-server nodes started by the test harness. With
//! `LAYER_BASELINE_EXE=path` (this bench built from another commit) the replayed variant
//! also runs served by that binary (**replayed-before**), interleaved with the others, so
//! that a change's cost per replayed request is measured in the same run. The body key
//! (issue 42): the plain route sent a 2 KiB JSON body (**plain, 2 KiB body**), and
//! `RedlockLayer::from_body` with `BodyKey::json("id")` (**body key**, fencing off) sent
//! the same body with its id in it; the body key's cost is measured against the plain
//! route with the body. And with no layer, the handler itself locking and unlocking the
//! header's value (**lock in the handler**): what any handler that waits twice on Redis
//! costs the HTTP server, so that the layer's own share of its cost shows.
//!
//! `cargo bench -p tower-redlock-benches --bench layer --features axum,json` (or `scripts/bench layer`).
//!
//! The server runs in a child process (this binary, re-executed with
//! `LAYER_BENCH_SERVE=variant,url,...`), so that its CPU (the time on CPU of each of its
//! threads, `/proc/<pid>/task/*/schedstat`, in ns) is measured apart from the load
//! generator's. The child prints its port on stdout
//! and serves until its stdin closes (or the parent dies: `PR_SET_PDEATHSIG`). The load
//! generator (this process) drives it over 32 HTTP/1.1 connections, one task each, every
//! request with a unique `x-request-id`, after a warm-up of 1,000 requests. The three
//! variants run interleaved, `LAYER_REPEATS` times, on nodes flushed before each run; the
//! report gives the medians, and the layer's cost per request (locked − plain, fenced −
//! plain, per repeat, median). After the variants of each repeat, the client alone (no
//! HTTP) takes and releases a lock per "request" from 32 tasks in this process, so that
//! the layer's CPU compares with the client's at the same concurrency in the same run.
//!
//! Environment:
//! - `LAYER_QUICK=1`: a smoke run (2,000 requests, one repeat);
//! - `LAYER_REQUESTS`, `LAYER_REPEATS`: sizes (default 20,000 and 3);
//! - `LAYER_BASELINE_EXE=path`: the replayed-before variant's server binary;
//! - `LAYER_REPORT=path`: also write the report (a `## Layer overhead` section, to be merged
//!   into `docs/performance.md`) to that file. By default the report goes to stdout only.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use common::{
    env_parse, flush_all, fmt_num, median, percentile_us, process_cpu_us, range, redis_cpu_us,
    source_state,
};

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use redis::aio::MultiplexedConnection;
use tokio::sync::watch;

// ---------------------------------------------------------------------------------------
// Configuration

const TTL: Duration = Duration::from_secs(10);
const CONNECTIONS: usize = 32;
const WARMUP_REQUESTS: usize = 1_000;
const NODE_COUNTS: [usize; 2] = [1, 5];
const KEY_HEADER: &str = "x-request-id";
const SERVE_ENV: &str = "LAYER_BENCH_SERVE";
/// After the last response, before the end snapshot: lets releases still under way on the
/// nodes beyond the quorum finish, so that they are counted.
const SETTLE: Duration = Duration::from_millis(50);

struct Config {
    requests: usize,
    repeats: usize,
    report: Option<String>,
}

impl Config {
    fn from_env() -> Self {
        if let Some(arg) = std::env::args().skip(1).find(|a| !a.starts_with('-')) {
            panic!(
                "unknown argument {arg:?}: the layer benchmark takes none (see LAYER_* in benches/layer.rs)"
            );
        }
        let quick = std::env::var("LAYER_QUICK").is_ok_and(|v| v != "0" && !v.is_empty());
        let (requests, repeats) = if quick { (2_000, 1) } else { (20_000, 3) };
        let cfg = Self {
            requests: env_parse("LAYER_REQUESTS").unwrap_or(requests),
            repeats: env_parse("LAYER_REPEATS").unwrap_or(repeats),
            report: std::env::var("LAYER_REPORT")
                .ok()
                .filter(|p| !p.is_empty())
                .map(|p| common::repo_path(&p)),
        };
        assert!(cfg.requests > 0, "LAYER_REQUESTS must be positive");
        assert!(cfg.repeats > 0, "LAYER_REPEATS must be positive");
        cfg
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Plain,
    Locked,
    Fenced,
    Replayed,
    /// The replayed variant, served by `LAYER_BASELINE_EXE`.
    ReplayedBefore,
    /// The plain route, sent a 2 KiB JSON body.
    PlainBody,
    /// `RedlockLayer::from_body` with `BodyKey::json("id")`, sent a 2 KiB JSON body.
    BodyKey,
    /// No layer: the handler itself locks and unlocks the header's value with the client
    /// (what the layer does, without its guard, token, span and response handling).
    Handler,
}

const VARIANTS: [Variant; 8] = [
    Variant::Plain,
    Variant::Locked,
    Variant::Handler,
    Variant::Fenced,
    Variant::Replayed,
    Variant::ReplayedBefore,
    Variant::PlainBody,
    Variant::BodyKey,
];

/// The size of the JSON body the body variants send.
const JSON_BODY: usize = 2048;
const BASELINE_ENV: &str = "LAYER_BASELINE_EXE";

/// The index in [`variants`] of what the `v`-th variant is measured against. The plain
/// body variant is measured against plain (what a 2 KiB body costs HTTP alone).
fn base_index(v: usize) -> usize {
    let all = variants();
    let base = match all.get(v) {
        Some(Variant::BodyKey) => Variant::PlainBody,
        _ => Variant::Plain,
    };
    all.iter().position(|x| *x == base).unwrap_or(0)
}

/// The variants of this run: the baseline's only with `LAYER_BASELINE_EXE`.
fn variants() -> Vec<Variant> {
    let baseline = std::env::var(BASELINE_ENV).is_ok_and(|p| !p.is_empty());
    VARIANTS
        .into_iter()
        .filter(|v| baseline || *v != Variant::ReplayedBefore)
        .collect()
}

/// How many records a replayed run answers from (the warm-up writes them).
const REPLAY_KEYS: usize = WARMUP_REQUESTS;

impl Variant {
    fn id(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Locked => "locked",
            Variant::Fenced => "fenced",
            Variant::Replayed | Variant::ReplayedBefore => "replayed",
            Variant::PlainBody => "plain-body",
            Variant::BodyKey => "body-key",
            Variant::Handler => "handler",
        }
    }

    /// Whether its requests carry a JSON body (with the id in it).
    fn has_body(self) -> bool {
        matches!(self, Variant::PlainBody | Variant::BodyKey)
    }

    /// Whether its requests are retries answered from records.
    fn replays(self) -> bool {
        matches!(self, Variant::Replayed | Variant::ReplayedBefore)
    }

    fn label(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Locked => "locked",
            Variant::Fenced => "locked-fenced",
            Variant::Replayed => "replayed",
            Variant::ReplayedBefore => "replayed-before",
            Variant::PlainBody => "plain, 2 KiB body",
            Variant::BodyKey => "body key, 2 KiB JSON",
            Variant::Handler => "lock in the handler",
        }
    }

    fn parse(s: &str) -> Self {
        VARIANTS
            .into_iter()
            .find(|v| v.id() == s)
            .unwrap_or_else(|| panic!("unknown variant {s:?}"))
    }
}

// ---------------------------------------------------------------------------------------
// The server (child process)

async fn hook() -> &'static str {
    "ok"
}

/// The server's client of the nodes at `urls`, warmed up.
async fn server_client(urls: Vec<String>, fencing: bool) -> tower_redlock::Redlock {
    let redlock = support::builder(urls)
        .ttl(TTL)
        .fencing(fencing)
        .build()
        .expect("build tower-redlock");
    support::warm(&redlock).await;
    redlock
}

/// The handler variant's route: locks the request's key, unlocks it, answers.
async fn lock_in_handler(
    axum::extract::State(redlock): axum::extract::State<tower_redlock::Redlock>,
    headers: http::HeaderMap,
) -> (http::StatusCode, &'static str) {
    let Some(key) = headers.get(KEY_HEADER) else {
        return (http::StatusCode::BAD_REQUEST, "no key");
    };
    match redlock.lock(key.as_bytes()).await {
        Ok(lock) => {
            let _ = redlock.unlock(&lock).await;
            (http::StatusCode::OK, "ok")
        }
        Err(_) => (http::StatusCode::CONFLICT, "busy"),
    }
}

/// The child: builds the router for `LAYER_BENCH_SERVE=variant,url,...`, prints its port
/// and serves until stdin closes.
fn serve_child(spec: &str) {
    let mut parts = spec.split(',');
    let variant = Variant::parse(parts.next().unwrap_or_default());
    let urls: Vec<String> = parts.map(str::to_owned).collect();
    // The parent closes our stdin to stop us (and so does its death).
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        std::process::exit(0);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let app = Router::new().route("/hook", post(hook));
        let app = match variant {
            Variant::Plain | Variant::PlainBody => app,
            Variant::Handler => {
                let redlock = server_client(urls, false).await;
                Router::new()
                    .route("/hook", post(lock_in_handler))
                    .with_state(redlock)
            }
            Variant::BodyKey => {
                let redlock = server_client(urls, false).await;
                let key = tower_redlock::layer::BodyKey::json("id");
                app.route_layer(tower_redlock::RedlockLayer::from_body(redlock, key))
            }
            _ => {
                let redlock = server_client(urls, variant == Variant::Fenced).await;
                let layer = tower_redlock::RedlockLayer::new(
                    redlock,
                    tower_redlock::layer::Header::new(KEY_HEADER).required(),
                );
                if variant.replays() {
                    app.route_layer(layer.replay(Duration::from_secs(600)))
                } else {
                    app.route_layer(layer)
                }
            }
        };
        use axum::serve::ListenerExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        println!("{port}");
        axum::serve(listener, app).await.expect("serve");
    });
}

/// A server child process, killed on drop.
struct Server {
    variant: Variant,
    child: Child,
    stdin: Option<ChildStdin>,
    addr: SocketAddr,
}

impl Server {
    /// Starts the server for `variant` over `urls`. Call from the main thread: the child's
    /// `PR_SET_PDEATHSIG` fires when the thread that spawned it ends.
    fn start(variant: Variant, urls: &[String]) -> Self {
        let exe = match variant {
            Variant::ReplayedBefore => std::env::var(BASELINE_ENV)
                .map(std::path::PathBuf::from)
                .expect("LAYER_BASELINE_EXE"),
            _ => std::env::current_exe().expect("current exe"),
        };
        let mut spec = variant.id().to_owned();
        for url in urls {
            spec.push(',');
            spec.push_str(url);
        }
        let mut cmd = Command::new(exe);
        cmd.env(SERVE_ENV, spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: prctl in the child before exec; async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn the server child");
        let stdin = child.stdin.take();
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("child stdout"))
            .read_line(&mut line)
            .expect("read the child's port");
        let port: u16 = line.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the {} server child printed {line:?}, not a port",
                variant.id()
            )
        });
        Self {
            variant,
            child,
            stdin,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// The child's CPU so far, in µs: the time on CPU of each of its threads, in ns
    /// (`/proc/<pid>/task/<tid>/schedstat`, first field), not the clock ticks of
    /// `/proc/<pid>/stat`, whose 10 ms are ± 0.5 µs per request at 20,000 requests. The
    /// server's threads (tokio's workers) live as long as it does.
    fn cpu_us(&self) -> f64 {
        let pid = self.child.id();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap_or_else(|e| panic!("read /proc/{pid}/task: {e}"));
        let ns: u64 = tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
            .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        ns as f64 / 1e3
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// Measurements

/// One timed run of one variant. Latencies in µs, CPU in µs per request.
#[derive(Clone, Copy, Default)]
struct Metrics {
    throughput: f64,
    p50: f64,
    p99: f64,
    server_cpu: f64,
    redis_cpu: f64,
    errors: u64,
}

impl Metrics {
    /// Prints the run on stderr as it ends: `unit` is what a request is (`req`, `pair`),
    /// `process` whose CPU was measured.
    fn log(
        &self,
        nodes: usize,
        rep: usize,
        repeats: usize,
        what: &str,
        (unit, process): (&str, &str),
    ) {
        eprintln!(
            "N={nodes} repeat {}/{repeats} {what} {:>7.0} {unit}/s  p50 {:>6.0} µs  p99 {:>6.0} µs  \
             {process} {:>6.1} µs/{unit}  Redis {:>6.1} µs/{unit}  errors {}",
            rep + 1,
            self.throughput,
            self.p50,
            self.p99,
            self.server_cpu,
            self.redis_cpu,
            self.errors,
        );
    }
}

// ---------------------------------------------------------------------------------------
// The load generator

type Sender = SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Sender {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the server child");
    tcp.set_nodelay(true).expect("nodelay");
    let (sender, conn) = http1::handshake(TokioIo::new(tcp))
        .await
        .expect("HTTP/1 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

/// What one request returned: `Ok` for 200 "ok", else a description of the error.
async fn request(
    sender: &mut Sender,
    addr: SocketAddr,
    id: &str,
    body: bool,
) -> Result<(), String> {
    let body = if body {
        // `{"id":"...","pad":"xx..."}`, JSON_BODY bytes.
        let head = format!(r#"{{"id":"{id}","pad":""#);
        let pad = JSON_BODY.saturating_sub(head.len() + 2);
        Bytes::from(format!("{head}{}\"}}", "x".repeat(pad)))
    } else {
        Bytes::new()
    };
    let req = http::Request::post("/hook")
        .header(http::header::HOST, addr.to_string())
        .header(KEY_HEADER, id)
        .body(Full::new(body))
        .expect("request");
    sender
        .ready()
        .await
        .map_err(|e| format!("connection: {e}"))?;
    let res = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let (parts, body) = res.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    if parts.status == http::StatusCode::OK {
        Ok(())
    } else {
        Err(format!(
            "{} {:?}",
            parts.status,
            String::from_utf8_lossy(&body)
        ))
    }
}

/// What one task measured.
#[derive(Default)]
struct TaskSamples {
    latency_ns: Vec<u64>,
    errors: Vec<String>,
}

/// The operations the tasks of one phase share out: `total` of them, counted by `next`,
/// with ids `{tag}-{i}` (`{tag}-{i % keys}` when `keys` is given: retries of those).
#[derive(Clone, Copy)]
struct Share<'a> {
    tag: &'a str,
    next: &'a AtomicUsize,
    total: usize,
    keys: Option<usize>,
    /// Whether the requests carry the JSON body.
    body: bool,
}

impl Share<'_> {
    /// The id of the next operation, while fewer than `total` are taken.
    fn next_id(self) -> Option<String> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let key = self.keys.map_or(i, |keys| i % keys.max(1));
        (i < self.total).then(|| format!("{}-{key}", self.tag))
    }
}

impl TaskSamples {
    /// Records operation `id`, started at `t0`: its wall time, and its error if any.
    fn record(&mut self, id: &str, t0: Instant, result: Result<(), String>) {
        self.latency_ns.push(t0.elapsed().as_nanos() as u64);
        if let Err(e) = result {
            self.errors.push(format!("{id}: {e}"));
        }
    }
}

/// Requests from a shared counter until `total` are taken; ids are `{tag}-{i}`.
async fn drive(sender: &mut Sender, addr: SocketAddr, share: Share<'_>, samples: &mut TaskSamples) {
    while let Some(id) = share.next_id() {
        let t0 = Instant::now();
        let result = request(sender, addr, &id, share.body).await;
        if result.is_err() && sender.is_closed() {
            *sender = connect(addr).await;
        }
        samples.record(&id, t0, result);
    }
}

/// Ends a timed phase of `requests` operations that started at `t0`, with what its tasks
/// measured: waits `SETTLE` for work still under way, then takes the CPU of the measured
/// process (`cpu`, from `cpu0`) and of the nodes (from `redis0`). Prints the first errors,
/// labelled with `what`.
async fn finish(
    requests: usize,
    t0: Instant,
    samples: TaskSamples,
    (cpu0, cpu): (f64, impl Fn() -> f64),
    redis0: f64,
    conns: &mut [MultiplexedConnection],
    what: &str,
) -> Metrics {
    let elapsed = t0.elapsed();
    tokio::time::sleep(SETTLE).await;
    let cpu1 = cpu();
    let redis1 = redis_cpu_us(conns).await;
    let TaskSamples {
        mut latency_ns,
        errors,
    } = samples;
    latency_ns.sort_unstable();
    for e in errors.iter().take(10) {
        eprintln!("  failed ({what}): {e}");
    }
    if errors.len() > 10 {
        eprintln!("  ... and {} more", errors.len() - 10);
    }
    let n = requests as f64;
    Metrics {
        throughput: n / elapsed.as_secs_f64(),
        p50: percentile_us(&latency_ns, 50.0),
        p99: percentile_us(&latency_ns, 99.0),
        server_cpu: (cpu1 - cpu0) / n,
        redis_cpu: (redis1 - redis0) / n,
        errors: errors.len() as u64,
    }
}

/// Waits for the tasks and puts their samples together (after `errors` from earlier).
async fn join(
    handles: Vec<tokio::task::JoinHandle<TaskSamples>>,
    errors: Vec<String>,
) -> TaskSamples {
    let mut all = TaskSamples {
        latency_ns: Vec::new(),
        errors,
    };
    for h in handles {
        let s = h.await.expect("load task");
        all.latency_ns.extend(s.latency_ns);
        all.errors.extend(s.errors);
    }
    all
}

/// One run: `CONNECTIONS` tasks on their own connections, `WARMUP_REQUESTS` in total
/// (untimed), then `requests` in total (timed).
async fn run(
    server: &Server,
    conns: &mut [MultiplexedConnection],
    tag: &str,
    requests: usize,
) -> Metrics {
    let addr = server.addr;
    let warm_next = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let (go_tx, go_rx) = watch::channel(false);
    let ready = Arc::new(tokio::sync::Barrier::new(CONNECTIONS + 1));
    let handles: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let (warm_next, next, ready) = (warm_next.clone(), next.clone(), ready.clone());
            let mut go = go_rx.clone();
            // A replayed run: the warm-up writes the records the timed requests retry.
            let keys = server.variant.replays().then_some(REPLAY_KEYS);
            let body = server.variant.has_body();
            let tag = if keys.is_some() {
                "replay".to_owned()
            } else {
                tag.to_owned()
            };
            tokio::spawn(async move {
                let mut sender = connect(addr).await;
                let mut warm = TaskSamples::default();
                let warm_tag = if keys.is_some() {
                    tag.clone()
                } else {
                    format!("{tag}w")
                };
                let share = Share {
                    tag: &warm_tag,
                    next: &warm_next,
                    total: WARMUP_REQUESTS,
                    keys,
                    body,
                };
                drive(&mut sender, addr, share, &mut warm).await;
                let mut s = TaskSamples {
                    latency_ns: Vec::with_capacity(requests / CONNECTIONS + 1),
                    errors: warm.errors,
                };
                ready.wait().await;
                go.wait_for(|go| *go).await.expect("start signal");
                let share = Share {
                    tag: &tag,
                    next: &next,
                    total: requests,
                    keys,
                    body,
                };
                drive(&mut sender, addr, share, &mut s).await;
                s
            })
        })
        .collect();
    ready.wait().await;
    // Start: Redis first, then the server, so that our INFO calls are not in the window.
    let redis0 = redis_cpu_us(conns).await;
    let cpu0 = server.cpu_us();
    let t0 = Instant::now();
    go_tx.send(true).expect("start signal");
    let samples = join(handles, Vec::new()).await;
    let what = format!("{} {tag}", server.variant.label());
    let cpu = (cpu0, || server.cpu_us());
    finish(requests, t0, samples, cpu, redis0, conns, &what).await
}

/// The client alone, for comparison: `CONNECTIONS` tasks in this process (no HTTP), each
/// taking a lock on a fresh name and releasing it, as the locked route does per request;
/// `WARMUP_REQUESTS` pairs untimed, then `requests` pairs timed. CPU is this process's.
async fn run_client(
    redlock: &tower_redlock::Redlock,
    conns: &mut [MultiplexedConnection],
    tag: &str,
    requests: usize,
) -> Metrics {
    async fn pairs(redlock: &tower_redlock::Redlock, share: Share<'_>, samples: &mut TaskSamples) {
        while let Some(name) = share.next_id() {
            let t0 = Instant::now();
            let result = match redlock.try_lock(&name).await {
                Ok(lock) => match redlock.unlock(&lock).await.released() {
                    n if n >= redlock.quorum() => Ok(()),
                    n => Err(format!("released on {n} nodes")),
                },
                Err(e) => Err(e.to_string()),
            };
            samples.record(&name, t0, result);
        }
    }
    let run = |tag: String, next: Arc<AtomicUsize>, total: usize| {
        let redlock = redlock.clone();
        tokio::spawn(async move {
            let mut s = TaskSamples::default();
            let share = Share {
                tag: &tag,
                next: &next,
                total,
                keys: None,
                body: false,
            };
            pairs(&redlock, share, &mut s).await;
            s
        })
    };
    let warm_next = Arc::new(AtomicUsize::new(0));
    let warm: Vec<_> = (0..CONNECTIONS)
        .map(|_| run(format!("{tag}w"), Arc::clone(&warm_next), WARMUP_REQUESTS))
        .collect();
    let warm = join(warm, Vec::new()).await;
    let redis0 = redis_cpu_us(conns).await;
    let cpu0 = process_cpu_us();
    let t0 = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..CONNECTIONS)
        .map(|_| run(tag.to_owned(), Arc::clone(&next), requests))
        .collect();
    let samples = join(handles, warm.errors).await;
    let what = format!("client alone {tag}");
    let cpu = (cpu0, process_cpu_us);
    finish(requests, t0, samples, cpu, redis0, conns, &what).await
}

/// The runs of one node count: `runs[repeat][variant]`.
struct Cell {
    nodes: usize,
    runs: Vec<Vec<Metrics>>,
    /// The client alone (no HTTP), per repeat.
    client: Vec<Metrics>,
}

impl Cell {
    fn median(&self, v: usize, field: fn(&Metrics) -> f64) -> f64 {
        let mut values: Vec<f64> = self.runs.iter().map(|r| field(&r[v])).collect();
        median(&mut values)
    }

    /// Median over the repeats of `variant − its base` (plain, or plain with the same body).
    fn delta(&self, v: usize, field: fn(&Metrics) -> f64) -> f64 {
        self.between(v, base_index(v), field)
    }

    /// Median over the repeats of `variant ÷ its base`.
    fn ratio(&self, v: usize, field: fn(&Metrics) -> f64) -> f64 {
        let b = base_index(v);
        let mut values: Vec<f64> = self
            .runs
            .iter()
            .map(|r| field(&r[v]) / field(&r[b]))
            .collect();
        median(&mut values)
    }

    /// Median over the repeats of `a − b` (two variants of the same repeat).
    fn between(&self, a: usize, b: usize, field: fn(&Metrics) -> f64) -> f64 {
        let mut values: Vec<f64> = self
            .runs
            .iter()
            .map(|r| field(&r[a]) - field(&r[b]))
            .collect();
        median(&mut values)
    }

    fn errors(&self, v: usize) -> u64 {
        self.runs.iter().map(|r| r[v].errors).sum()
    }

    /// Median over the repeats of the client alone's `field`.
    fn client_median(&self, field: fn(&Metrics) -> f64) -> f64 {
        let mut values: Vec<f64> = self.client.iter().map(field).collect();
        median(&mut values)
    }

    /// Median over the repeats of (`variant` − plain) server CPU ÷ the client alone's CPU
    /// per pair.
    fn layer_to_client(&self, v: usize) -> String {
        let mut values: Vec<f64> = self
            .runs
            .iter()
            .zip(&self.client)
            .map(|(r, c)| (r[v].server_cpu - r[0].server_cpu) / c.server_cpu)
            .collect();
        with_spread(&mut values)
    }
}

/// The median of `values` with the lowest and highest in brackets: `1.15 [1.04–1.36]`.
fn with_spread(values: &mut [f64]) -> String {
    let (lowest, highest) = range(values);
    format!("{:.2} [{lowest:.2}–{highest:.2}]", median(values))
}

async fn bench(cfg: &Config) -> Vec<Cell> {
    let mut cells = Vec::new();
    let mut run_id = 0usize;
    for n in NODE_COUNTS {
        let cluster = support::Cluster::start(n);
        let urls = cluster.urls();
        let mut conns = Vec::with_capacity(n);
        for i in 0..n {
            conns.push(cluster.raw(i).await);
        }
        let servers: Vec<Server> = variants()
            .into_iter()
            .map(|v| Server::start(v, &urls))
            .collect();
        let client = support::builder(urls.clone())
            .ttl(TTL)
            .fencing(false)
            .build()
            .expect("build tower-redlock");
        support::warm(&client).await;
        let mut cell = Cell {
            nodes: n,
            runs: Vec::with_capacity(cfg.repeats),
            client: Vec::with_capacity(cfg.repeats),
        };
        for rep in 0..cfg.repeats {
            let mut trio = vec![Metrics::default(); servers.len()];
            for (v, server) in servers.iter().enumerate() {
                run_id += 1;
                flush_all(&mut conns).await;
                let m = run(server, &mut conns, &format!("r{run_id}"), cfg.requests).await;
                let what = format!("{:<13}", server.variant.label());
                m.log(n, rep, cfg.repeats, &what, ("req", "server"));
                trio[v] = m;
            }
            cell.runs.push(trio);
            run_id += 1;
            flush_all(&mut conns).await;
            let m = run_client(&client, &mut conns, &format!("r{run_id}"), cfg.requests).await;
            m.log(n, rep, cfg.repeats, "client alone ", ("pair", "client"));
            cell.client.push(m);
        }
        flush_all(&mut conns).await;
        drop(servers);
        cells.push(cell);
    }
    cells
}

// ---------------------------------------------------------------------------------------
// The report

fn report(cfg: &Config, cells: &[Cell], source: &str, elapsed: Duration) -> String {
    let mut env: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("LAYER_") && k != SERVE_ENV)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.sort();
    let mut command = env.join(" ");
    if !command.is_empty() {
        command.push(' ');
    }
    command.push_str("cargo bench -p tower-redlock-benches --bench layer --features axum,json");
    let redis_bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "## Layer overhead\n");
    let _ = writeln!(
        w,
        "Generated by `benches/layer.rs`. An axum 0.8 route `POST /hook` answering 200 \"ok\" \
         at once, served **plain**, behind `RedlockLayer` keyed by the `{KEY_HEADER}` header \
         (`Header::new(\"{KEY_HEADER}\").required()`, fencing off: **locked**), and the same \
         with fencing on (**locked-fenced**); with no layer, the handler locking and unlocking the \
         header's value itself (**lock in the handler**). The variants ran interleaved, {} time(s), on the \
         same loopback redis-server nodes (flushed before each run); the tables give the \
         median over the repeats. Compare variants of the same run, not absolute figures \
         from other runs.\n",
        cfg.repeats
    );
    common::context_lines(
        w,
        &format!("`{command}` (or `scripts/bench layer`)"),
        source,
        "axum 0.8, hyper 1",
        &redis_bin,
    );
    let _ = writeln!(
        w,
        "- setup: bench profile (release). The server is a child process (tokio \
         multi-thread runtime, worker threads = cores, `axum::serve`, TCP_NODELAY); the load \
         generator is the parent (its own tokio multi-thread runtime): {CONNECTIONS} HTTP/1.1 \
         keep-alive connections, one task each, sending the next request when the last \
         response's body is in; every request has a unique `{KEY_HEADER}`. Per run: \
         {WARMUP_REQUESTS} warm-up requests, then {} timed. Server, load generator and \
         redis-server nodes share the same cores. TTL {} s, restart quarantine off, layer \
         defaults otherwise (reject when busy, release before the response, auto-extend \
         on). **client alone**: the same lock + unlock per request without HTTP, \
         {CONNECTIONS} tasks in the load generator's process (its CPU by `getrusage`), on \
         the same nodes after the variants of each repeat; req = one pair. Run time {:.0} s",
        cfg.requests,
        TTL.as_secs(),
        elapsed.as_secs_f64(),
    );
    let _ = writeln!(
        w,
        "- metrics: latencies in µs, nearest-rank percentiles of per-request wall times \
         (request sent to body received); req/s = timed requests ÷ wall time of the timed \
         phase; server CPU = the time on CPU of the server process's threads \
         (`/proc/<pid>/task/*/schedstat`, in ns) over the timed phase (+{} ms for releases \
         still under way), per request; Redis CPU = sum over the nodes of \
         `used_cpu_user + used_cpu_sys`, per request; errors = responses other than 200 and \
         failed requests (warm-up included), total over the repeats (must be 0: every name \
         is fresh).\n",
        SETTLE.as_millis(),
    );
    let _ = writeln!(
        w,
        "| N | variant | req/s | p50 µs | p99 µs | server CPU µs/req | Redis CPU µs/req | errors |\n\
         |---|---|---:|---:|---:|---:|---:|---:|"
    );
    for cell in cells {
        for (v, variant) in variants().iter().enumerate() {
            let errors = cell.errors(v);
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                cell.nodes,
                variant.label(),
                fmt_num(cell.median(v, |m| m.throughput)),
                fmt_num(cell.median(v, |m| m.p50)),
                fmt_num(cell.median(v, |m| m.p99)),
                fmt_num(cell.median(v, |m| m.server_cpu)),
                fmt_num(cell.median(v, |m| m.redis_cpu)),
                must_be_zero(errors),
            );
        }
        let errors: u64 = cell.client.iter().map(|m| m.errors).sum();
        let _ = writeln!(
            w,
            "| {} | client alone (pairs) | {} | {} | {} | {} | {} | {} |",
            cell.nodes,
            fmt_num(cell.client_median(|m| m.throughput)),
            fmt_num(cell.client_median(|m| m.p50)),
            fmt_num(cell.client_median(|m| m.p99)),
            fmt_num(cell.client_median(|m| m.server_cpu)),
            fmt_num(cell.client_median(|m| m.redis_cpu)),
            must_be_zero(errors),
        );
    }
    let _ = writeln!(
        w,
        "\n**The layer's cost per request**: variant − plain (÷ plain for req/s), per repeat \
         from the same run, median over the repeats. Layer CPU = the server's extra CPU per \
         request; + Redis = that plus the nodes' CPU per request. ÷ client = layer CPU ÷ the \
         client alone's CPU per pair in the same repeat (both at {CONNECTIONS} concurrent \
         requests; fencing off, so for the locked row and the lock in the handler only; the \
         lowest and highest repeat in brackets).\n"
    );
    let _ = writeln!(
        w,
        "| N | variant | layer CPU µs/req | ÷ client | Redis CPU µs/req | layer + Redis CPU µs/req | Δ p50 µs | Δ p99 µs | req/s ÷ plain |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for cell in cells {
        for (v, variant) in variants().iter().enumerate().skip(1) {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} |",
                cell.nodes,
                variant.label(),
                fmt_num(cell.delta(v, |m| m.server_cpu)),
                if matches!(variant, Variant::Locked | Variant::Handler) {
                    cell.layer_to_client(v)
                } else {
                    "—".to_owned()
                },
                fmt_num(cell.delta(v, |m| m.redis_cpu)),
                fmt_num(cell.delta(v, |m| m.server_cpu + m.redis_cpu)),
                fmt_num(cell.delta(v, |m| m.p50)),
                fmt_num(cell.delta(v, |m| m.p99)),
                cell.ratio(v, |m| m.throughput),
            );
        }
    }
    let names = variants();
    let at = |v: Variant| names.iter().position(|n| *n == v);
    if let (Some(locked), Some(handler)) = (at(Variant::Locked), at(Variant::Handler)) {
        let _ = writeln!(
            w,
            "\n**Where the layer's cost goes** (medians over the repeats of per-repeat \
             differences, server CPU µs per request): *waiting in a handler* = the lock in \
             the handler − plain − the client alone's pair (what serving a request that \
             waits twice on Redis costs the HTTP server beyond the lock itself: its \
             connection task woken and polled again); *the layer itself* = locked − the \
             lock in the handler (extractor, guard and keep-alive, token in the extensions, \
             span, response wrapping); *÷ the lock in the handler* = (locked − plain) ÷ (the \
             lock in the handler − plain): what the layer costs the server for the same lock \
             and unlock written by hand in the handler (median, lowest and highest repeat in \
             brackets).\n\n| N | client alone µs/pair | waiting in a handler \
             µs/req | the layer itself µs/req | locked − plain µs/req | ÷ the lock in the handler |\n\
             |---|---:|---:|---:|---:|---:|"
        );
        for cell in cells {
            let mut waiting: Vec<f64> = cell
                .runs
                .iter()
                .zip(&cell.client)
                .map(|(r, c)| r[handler].server_cpu - r[0].server_cpu - c.server_cpu)
                .collect();
            let mut to_handler: Vec<f64> = cell
                .runs
                .iter()
                .map(|r| {
                    (r[locked].server_cpu - r[0].server_cpu)
                        / (r[handler].server_cpu - r[0].server_cpu)
                })
                .collect();
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} |",
                cell.nodes,
                fmt_num(cell.client_median(|m| m.server_cpu)),
                fmt_num(median(&mut waiting)),
                fmt_num(cell.between(locked, handler, |m| m.server_cpu)),
                fmt_num(cell.delta(locked, |m| m.server_cpu)),
                with_spread(&mut to_handler),
            );
        }
        let _ = writeln!(
            w,
            "\nThe layer itself, function by function (a `perf` profile of the locked server \
             against the lock in the handler, before and after the changes it led to): \
             [`layer-profile.md`](layer-profile.md)."
        );
    }
    if let (Some(now), Some(before)) = (at(Variant::Replayed), at(Variant::ReplayedBefore)) {
        let _ = writeln!(
            w,
            "\n**Replayed, this build ÷ the baseline** (`{BASELINE_ENV}`, same run, median over \
             the repeats of the per-repeat ratio): the layer's cost per replayed request \
             (server CPU − plain) and p50.\n\n| N | layer CPU ÷ before | p50 ÷ before | req/s ÷ before |\n|---|---:|---:|---:|"
        );
        for cell in cells {
            let ratio = |field: fn(&Metrics) -> f64, minus_plain: bool| {
                let mut values: Vec<f64> = cell
                    .runs
                    .iter()
                    .map(|r| {
                        let plain = if minus_plain { field(&r[0]) } else { 0.0 };
                        (field(&r[now]) - plain) / (field(&r[before]) - plain)
                    })
                    .collect();
                median(&mut values)
            };
            let _ = writeln!(
                w,
                "| {} | {:.2} | {:.2} | {:.2} |",
                cell.nodes,
                ratio(|m| m.server_cpu, true),
                ratio(|m| m.p50, false),
                ratio(|m| m.throughput, false),
            );
        }
    }
    out
}

/// An error count for the report: bold when it is not zero.
fn must_be_zero(errors: u64) -> String {
    if errors == 0 {
        "0".to_owned()
    } else {
        format!("**{errors} (MUST BE 0)**")
    }
}

fn main() {
    if let Ok(spec) = std::env::var(SERVE_ENV) {
        serve_child(&spec);
        return;
    }
    let cfg = Config::from_env();
    let source = source_state();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let started = Instant::now();
    // block_on runs `bench` on this (main) thread, which spawns the server children.
    let cells = rt.block_on(bench(&cfg));
    let text = report(&cfg, &cells, &source, started.elapsed());
    println!("{text}");
    if let Some(path) = &cfg.report {
        std::fs::write(path, &text).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
        eprintln!("report written to {path}");
    }
    let errors: u64 = cells
        .iter()
        .flat_map(|c| c.runs.iter().flatten().chain(&c.client))
        .map(|m| m.errors)
        .sum();
    assert_eq!(
        errors, 0,
        "{errors} requests did not get a 200 or pairs failed"
    );
}
