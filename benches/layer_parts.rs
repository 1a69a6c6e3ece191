//! Where the layer's own time goes, without HTTP or Redis: `RedlockLayer` over the
//! in-process test lock (`testing::InMemoryLock`) around a `service_fn` that answers at
//! once, one request at a time on a current-thread runtime, so nothing waits and every
//! figure is CPU. Each row turns one part on or off; the differences between rows are the
//! parts' costs (the layer's logic is the same whatever lock it holds).
//!
//! - `service alone`: the inner service called through `tower::Service`, the request and
//!   response built and dropped (what every row pays);
//! - `lock alone`: the test lock's acquire and release of a guard (what the layer asks of
//!   its lock: a guard kept alive, then released), without the layer;
//! - `layer`: the defaults (a required header, auto-extension on, release before the
//!   response) around the service;
//! - then one change each: auto-extension off; released at the body's end; the request's
//!   `redlock.layer` span recorded by a subscriber; fencing numbers; replay (every
//!   response kept: the record is built and stored).
//!
//! Reports, per request, the median over `PARTS_ROUNDS` rounds (default 15) of
//! `PARTS_REQUESTS` requests (default 20,000): wall time, and heap allocations (a
//! counting global allocator). `cargo bench -p tower-redlock-benches --bench layer_parts --features testing,axum`.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use http::{Request, Response};
use http_body_util::BodyExt;
use tower::{Layer, Service, ServiceExt};
use tower_redlock::RedlockLayer;
use tower_redlock::layer::Header;
use tower_redlock::testing::InMemoryLock;

mod common;

#[global_allocator]
static GLOBAL: common::Counting = common::Counting;

const KEY_HEADER: &str = "x-request-id";

/// One row: ns and allocations per request, medians over the rounds.
struct Row {
    what: &'static str,
    ns: f64,
    allocations: f64,
}

fn request(i: u64) -> Request<String> {
    let mut req = Request::new(String::new());
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = http::Uri::from_static("/hook");
    let id = http::HeaderValue::from_str(&format!("req-{i}"))
        .unwrap_or_else(|_| http::HeaderValue::from_static("req"));
    req.headers_mut().insert(KEY_HEADER, id);
    req
}

fn answer<B>(_req: Request<B>) -> std::future::Ready<Result<Response<String>, Infallible>> {
    std::future::ready(Ok(Response::new(String::from("ok"))))
}

/// Calls `svc` with `n` fresh requests, reading each response's body; ns and
/// allocations per request.
async fn drive<S, B>(svc: &mut S, n: u64, first: u64) -> (f64, f64)
where
    S: Service<Request<String>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let allocations = common::allocations();
    let start = Instant::now();
    for i in first..first + n {
        let svc = svc.ready().await.expect("ready");
        let res = svc.call(request(i)).await.expect("answered");
        assert_eq!(res.status(), http::StatusCode::OK, "request {i}");
        let _ = res.into_body().collect().await.expect("body");
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    let allocations = (common::allocations() - allocations) as f64 / n as f64;
    (ns, allocations)
}

/// The test lock's acquire and release, `n` fresh names; ns and allocations per pair.
async fn lock_alone(lock: &InMemoryLock, n: u64, first: u64) -> (f64, f64) {
    let allocations = common::allocations();
    let start = Instant::now();
    for i in first..first + n {
        let guard = lock.acquire(format!("req-{i}")).await.expect("free");
        let _ = guard.release().await;
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    let allocations = (common::allocations() - allocations) as f64 / n as f64;
    (ns, allocations)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The variants, each a service over a fresh test lock.
const VARIANTS: [&str; 9] = [
    "service alone",
    "lock alone",
    "layer",
    "layer, auto-extension off",
    "layer, released at the body's end",
    "layer, span recorded",
    "layer, fencing",
    "layer, replay",
    "layer, replay, span recorded",
];

async fn run(variant: &str, n: u64, first: u64) -> (f64, f64) {
    let lock = InMemoryLock::new().with_ttl(Duration::from_secs(30));
    let layer = || RedlockLayer::new(lock.clone(), Header::new(KEY_HEADER).required());
    match variant {
        "service alone" => drive(&mut tower::service_fn(answer), n, first).await,
        "lock alone" => lock_alone(&lock, n, first).await,
        "layer" | "layer, span recorded" => {
            drive(&mut layer().layer(tower::service_fn(answer)), n, first).await
        }
        "layer, auto-extension off" => {
            drive(
                &mut layer().auto_extend(false).layer(tower::service_fn(answer)),
                n,
                first,
            )
            .await
        }
        "layer, released at the body's end" => {
            drive(
                &mut layer()
                    .release_on_body_end()
                    .layer(tower::service_fn(answer)),
                n,
                first,
            )
            .await
        }
        "layer, fencing" => {
            let fenced = lock.with_fencing(true);
            let layer = RedlockLayer::new(fenced, Header::new(KEY_HEADER).required());
            drive(&mut layer.layer(tower::service_fn(answer)), n, first).await
        }
        "layer, replay" | "layer, replay, span recorded" => {
            let layer = layer().replay(Duration::from_secs(600));
            drive(&mut layer.layer(tower::service_fn(answer)), n, first).await
        }
        other => panic!("unknown variant {other}"),
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n: u64 = common::env_parse("PARTS_REQUESTS").unwrap_or(20_000);
    let rounds: usize = common::env_parse("PARTS_ROUNDS").unwrap_or(15);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // The span rows run under a subscriber that records the layer's spans (and nothing
    // it would print: `redlock.layer` at debug, everything else off).
    let recording = tracing_subscriber::fmt()
        .with_env_filter("off,tower_redlock::layer=debug")
        .with_writer(std::io::sink)
        .finish();
    let recording = tracing::Dispatch::new(recording);
    let mut samples: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); VARIANTS.len()];
    let mut first = 0;
    // Interleaved: round after round, every variant once.
    for _ in 0..rounds {
        for (i, variant) in VARIANTS.iter().enumerate() {
            let (ns, allocations) = if variant.contains("span recorded") {
                tracing::dispatcher::with_default(&recording, || {
                    rt.block_on(run(variant, n, first))
                })
            } else {
                rt.block_on(run(variant, n, first))
            };
            first += n;
            samples[i].0.push(ns);
            samples[i].1.push(allocations);
        }
    }
    let rows: Vec<Row> = VARIANTS
        .iter()
        .zip(samples)
        .map(|(what, (ns, allocations))| Row {
            what,
            ns: median(ns),
            allocations: median(allocations),
        })
        .collect();
    let base = rows
        .iter()
        .find(|r| r.what == "service alone")
        .map_or(0.0, |r| r.ns);
    let layer = rows
        .iter()
        .find(|r| r.what == "layer")
        .map_or(0.0, |r| r.ns);
    let lock = rows
        .iter()
        .find(|r| r.what == "lock alone")
        .map_or(0.0, |r| r.ns);
    println!("## The layer's parts\n");
    println!(
        "Generated by `benches/layer_parts.rs` (`cargo bench -p tower-redlock-benches --bench layer_parts --features \
         testing`, or `scripts/bench layer`): `RedlockLayer` over the in-process test lock \
         (`testing::InMemoryLock`) around a `service_fn` that answers at once, one request at a \
         time on a current-thread runtime, no HTTP and no Redis, so every figure is CPU. Each \
         row turns one part on or off; {n} requests per round, {rounds} rounds, the variants \
         interleaved, medians. **service alone**: the request and response built, the inner \
         service called, the body read (every row pays it); **lock alone**: the test lock's \
         acquire and release of a guard (kept alive), no layer; **layer**: the defaults \
         around the service (a required header, auto-extension, release before the \
         response). The layer's own logic is layer − service alone − lock alone.\n"
    );
    println!("| variant | ns/req | − service alone | − layer | allocations/req |");
    println!("|---|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.1} |",
            r.what,
            r.ns,
            r.ns - base,
            r.ns - layer,
            r.allocations
        );
    }
    println!(
        "\nThe layer's own logic: {:.0} ns per request (layer − service alone − lock alone).",
        layer - base - lock
    );
}
