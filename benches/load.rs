//! Load comparison with rslock 0.10 on the workloads of `BENCHMARKS.md`: W1 (one task,
//! lock + unlock of fresh names), W2 (64 tasks, fresh names) and W3 (16 tasks contending
//! for one name, ~1 ms critical sections), on 1 and 5 local redis-server nodes started by
//! the test harness.
//!
//! `cargo bench -p tower-redlock-benches --bench load` (or `scripts/bench`). Each workload runs tower-redlock,
//! rslock and tower-redlock with fencing, one after the other, `LOAD_REPEATS` times on the
//! same nodes (flushed before each run), and reports the median of each metric and the
//! median of the per-repeat ratios to rslock. The report goes to stdout and to
//! `docs/performance.md`.
//!
//! Environment:
//! - `LOAD_QUICK=1`: a smoke run (W1 200 pairs, W2 2,000, W3 2 s, one repeat);
//! - `LOAD_W1_PAIRS`, `LOAD_W2_PAIRS`, `LOAD_W3_SECS`, `LOAD_REPEATS`: sizes;
//! - `LOAD_NODES=1` (or `5`): only that node count;
//! - `LOAD_REPORT=path`: where to write the report; `LOAD_NO_WRITE=1`: do not write it.
//!
//! Arguments `w1`, `w2`, `w3` run only those workloads; such a partial run writes its
//! report only to `LOAD_REPORT`, never over `docs/performance.md`.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use common::{
    env_parse, flush_all, fmt_num, median, percentile_us, process_cpu_us, range, redis_cpu_us,
    source_state,
};

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tokio::sync::watch;

#[global_allocator]
static GLOBAL: common::Counting = common::Counting;

// ---------------------------------------------------------------------------------------
// Configuration

const TTL: Duration = Duration::from_secs(10);
const WARMUP_PAIRS: usize = 200;
const W2_TASKS: usize = 64;
const W3_TASKS: usize = 16;
const W3_HOLD: Duration = Duration::from_millis(1);
const W3_ATTEMPTS: u32 = 10;
const W3_JITTER: Duration = Duration::from_millis(20);
const NODE_COUNTS: [usize; 2] = [1, 5];

struct Config {
    w1_pairs: usize,
    w2_pairs: usize,
    w3_secs: f64,
    repeats: usize,
    workloads: Vec<Workload>,
    report: Option<String>,
    /// The node counts to run (`LOAD_NODES=1` or `5`; both by default).
    nodes: Vec<usize>,
}

impl Config {
    fn from_env() -> Self {
        let quick = std::env::var("LOAD_QUICK").is_ok_and(|v| v != "0" && !v.is_empty());
        let (w1, w2, w3, repeats) = if quick {
            (200, 2_000, 2.0, 1)
        } else {
            (2_000, 20_000, 10.0, 3)
        };
        let mut workloads: Vec<Workload> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .map(|a| match a.to_ascii_lowercase().as_str() {
                "w1" => Workload::W1,
                "w2" => Workload::W2,
                "w3" => Workload::W3,
                other => panic!("unknown argument {other:?}: expected w1, w2 or w3"),
            })
            .collect();
        // A partial run does not replace the full report unless LOAD_REPORT names a file.
        let nodes = match env_parse::<usize>("LOAD_NODES") {
            Some(n) => vec![n],
            None => NODE_COUNTS.to_vec(),
        };
        let partial = !workloads.is_empty() || nodes.len() < NODE_COUNTS.len();
        if workloads.is_empty() {
            workloads = vec![Workload::W1, Workload::W2, Workload::W3];
        }
        workloads.sort();
        workloads.dedup();
        let no_write = std::env::var("LOAD_NO_WRITE").is_ok_and(|v| v != "0" && !v.is_empty());
        let report = match std::env::var("LOAD_REPORT") {
            _ if no_write => None,
            Ok(path) => Some(common::repo_path(&path)),
            Err(_) if partial => None,
            Err(_) => Some(common::repo_path("docs/performance.md")),
        };
        let cfg = Self {
            w1_pairs: env_parse("LOAD_W1_PAIRS").unwrap_or(w1),
            w2_pairs: env_parse("LOAD_W2_PAIRS").unwrap_or(w2),
            w3_secs: env_parse("LOAD_W3_SECS").unwrap_or(w3),
            repeats: env_parse("LOAD_REPEATS").unwrap_or(repeats),
            workloads,
            report,
            nodes,
        };
        assert!(cfg.w1_pairs > 0, "LOAD_W1_PAIRS must be positive");
        assert!(cfg.w2_pairs > 0, "LOAD_W2_PAIRS must be positive");
        assert!(cfg.w3_secs > 0.0, "LOAD_W3_SECS must be positive");
        assert!(cfg.repeats > 0, "LOAD_REPEATS must be positive");
        assert!(
            cfg.nodes.iter().all(|n| NODE_COUNTS.contains(n)),
            "LOAD_NODES must be 1 or 5"
        );
        cfg
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Workload {
    W1,
    W2,
    W3,
}

impl Workload {
    fn title(self) -> &'static str {
        match self {
            Workload::W1 => "W1 seq",
            Workload::W2 => "W2 par",
            Workload::W3 => "W3 contend",
        }
    }
}

// ---------------------------------------------------------------------------------------
// The two libraries behind one interface

#[derive(Clone)]
enum Client {
    Tower(tower_redlock::Redlock),
    Rslock(rslock::LockManager),
}

enum Held {
    Tower(tower_redlock::Lock),
    Rslock(rslock::Lock),
}

impl Client {
    async fn lock(&self, name: &str) -> Option<Held> {
        match self {
            Client::Tower(r) => r.lock(name).await.ok().map(Held::Tower),
            Client::Rslock(m) => m.lock(name.as_bytes(), TTL).await.ok().map(Held::Rslock),
        }
    }

    /// Whether the release reached a quorum (rslock does not say: always true).
    async fn unlock(&self, held: Held) -> bool {
        match (self, held) {
            (Client::Tower(r), Held::Tower(lock)) => r.unlock(&lock).await.released() >= r.quorum(),
            (Client::Rslock(m), Held::Rslock(lock)) => {
                m.unlock(&lock).await;
                true
            }
            _ => unreachable!("a lock released through the other library"),
        }
    }

    async fn warm(&self) {
        let held = self.lock("warm-up").await.expect("warm-up lock");
        assert!(self.unlock(held).await, "warm-up release lost its quorum");
    }
}

const LIBRARIES: [&str; 3] = ["tower-redlock", "rslock", "tower-redlock fenced"];
const RSLOCK: usize = 1;

/// The three clients for one node count: `plain` with default retries (W1, W2),
/// `contend` with the W3 retry policy.
struct Clients {
    plain: [Client; 3],
    contend: [Client; 3],
}

async fn clients(urls: &[String]) -> Clients {
    let tower = |fencing: bool, contend: bool| {
        let mut b = support::builder(urls.to_vec()).ttl(TTL).fencing(fencing);
        if contend {
            b = b
                .max_attempts(W3_ATTEMPTS)
                .retry_delay(Duration::ZERO, W3_JITTER);
        }
        Client::Tower(b.build().expect("build tower-redlock"))
    };
    let rs = |contend: bool| {
        let mut m = rslock::LockManager::new(urls.to_vec());
        if contend {
            m.set_retry(W3_ATTEMPTS, W3_JITTER);
        }
        Client::Rslock(m)
    };
    let c = Clients {
        plain: [tower(false, false), rs(false), tower(true, false)],
        contend: [tower(false, true), rs(true), tower(true, true)],
    };
    for client in c.plain.iter().chain(&c.contend) {
        client.warm().await;
    }
    c
}

// ---------------------------------------------------------------------------------------
// Measurements

/// Client CPU, allocations and Redis CPU at one instant.
struct Snapshot {
    at: Instant,
    cpu_us: f64,
    allocs: u64,
    redis_us: f64,
    /// Fenced acquisitions so far: settled in one round trip, and with phase 2.
    fenced: (u64, u64),
}

impl Snapshot {
    /// The share (%) of the fenced acquisitions between `self` and `end` that needed
    /// phase 2; NaN without fenced acquisitions.
    fn phase_two_share(&self, end: &Snapshot) -> f64 {
        let one = end.fenced.0 - self.fenced.0;
        let two = end.fenced.1 - self.fenced.1;
        if one + two == 0 {
            return f64::NAN;
        }
        100.0 * two as f64 / (one + two) as f64
    }
}

/// The start of a timed phase: Redis first, then the process (so that our INFO calls
/// are not counted as client work).
async fn snapshot_start(conns: &mut [MultiplexedConnection]) -> Snapshot {
    let redis_us = redis_cpu_us(conns).await;
    let allocs = common::allocations();
    let cpu_us = process_cpu_us();
    Snapshot {
        at: Instant::now(),
        cpu_us,
        allocs,
        redis_us,
        fenced: tower_redlock::fencing::rounds(),
    }
}

/// The end of a timed phase: the process first, then Redis.
async fn snapshot_end(conns: &mut [MultiplexedConnection]) -> Snapshot {
    let at = Instant::now();
    let cpu_us = process_cpu_us();
    let allocs = common::allocations();
    let fenced = tower_redlock::fencing::rounds();
    Snapshot {
        at,
        cpu_us,
        allocs,
        redis_us: redis_cpu_us(conns).await,
        fenced,
    }
}

/// One run of one workload with one library. Latencies in µs, CPU in µs per operation
/// (a lock + unlock pair, or a critical section in W3).
#[derive(Clone, Copy, Default)]
struct Metrics {
    throughput: f64,
    lock_p50: f64,
    lock_p99: f64,
    unlock_p50: f64,
    unlock_p99: f64,
    hold_mean: f64,
    handoff: f64,
    client_cpu: f64,
    redis_cpu: f64,
    allocs: f64,
    /// W3: the share of critical sections entered by the task that left the one before.
    same_holder: f64,
    /// The share (%) of fenced acquisitions that needed phase 2 (NaN when unfenced).
    phase_two: f64,
    errors: u64,
    overlaps: u64,
}

/// (name, accessor, higher is better) of the metrics that get a median and a ratio.
type Field = (&'static str, fn(&Metrics) -> f64, bool);

const PAIR_FIELDS: [Field; 8] = [
    ("pairs/s", |m| m.throughput, true),
    ("lock p50", |m| m.lock_p50, false),
    ("lock p99", |m| m.lock_p99, false),
    ("unlock p50", |m| m.unlock_p50, false),
    ("unlock p99", |m| m.unlock_p99, false),
    ("client CPU", |m| m.client_cpu, false),
    ("Redis CPU", |m| m.redis_cpu, false),
    ("allocs", |m| m.allocs, false),
];

const CS_FIELDS: [Field; 8] = [
    ("cs/s", |m| m.throughput, true),
    ("mean hold", |m| m.hold_mean, false),
    ("handoff", |m| m.handoff, false),
    ("acquire p50", |m| m.lock_p50, false),
    ("acquire p99", |m| m.lock_p99, false),
    ("client CPU", |m| m.client_cpu, false),
    ("Redis CPU", |m| m.redis_cpu, false),
    ("allocs", |m| m.allocs, false),
];

fn fields(w: Workload) -> &'static [Field; 8] {
    match w {
        Workload::W3 => &CS_FIELDS,
        _ => &PAIR_FIELDS,
    }
}

// ---------------------------------------------------------------------------------------
// W1 and W2: fresh names, pairs of lock + unlock

/// What one task of W1/W2 measured.
struct PairSamples {
    lock_ns: Vec<u64>,
    unlock_ns: Vec<u64>,
    errors: u64,
}

/// Runs `tasks` tasks over fresh names: `warmup` pairs in total (untimed), then `pairs`
/// in total (timed).
async fn run_pairs(
    client: &Client,
    conns: &mut [MultiplexedConnection],
    tag: &str,
    tasks: usize,
    warmup: usize,
    pairs: usize,
) -> Metrics {
    let share = |total: usize, t: usize| total / tasks + usize::from(t < total % tasks);
    let (go_tx, go_rx) = watch::channel(false);
    let ready = Arc::new(tokio::sync::Barrier::new(tasks + 1));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let client = client.clone();
            let warm_names: Vec<String> = (0..share(warmup, t))
                .map(|i| format!("{tag}:w:{t}:{i}"))
                .collect();
            let names: Vec<String> = (0..share(pairs, t))
                .map(|i| format!("{tag}:{t}:{i}"))
                .collect();
            let mut go = go_rx.clone();
            let ready = ready.clone();
            tokio::spawn(async move {
                for name in &warm_names {
                    if let Some(held) = client.lock(name).await {
                        client.unlock(held).await;
                    }
                }
                let mut s = PairSamples {
                    lock_ns: Vec::with_capacity(names.len()),
                    unlock_ns: Vec::with_capacity(names.len()),
                    errors: 0,
                };
                ready.wait().await;
                go.wait_for(|go| *go).await.expect("start signal");
                for name in &names {
                    let t0 = Instant::now();
                    let Some(held) = client.lock(name).await else {
                        s.errors += 1;
                        continue;
                    };
                    let t1 = Instant::now();
                    let released = client.unlock(held).await;
                    let t2 = Instant::now();
                    s.lock_ns.push((t1 - t0).as_nanos() as u64);
                    s.unlock_ns.push((t2 - t1).as_nanos() as u64);
                    s.errors += u64::from(!released);
                }
                s
            })
        })
        .collect();
    ready.wait().await;
    let start = snapshot_start(conns).await;
    go_tx.send(true).expect("tasks are waiting");
    let mut lock_ns = Vec::with_capacity(pairs);
    let mut unlock_ns = Vec::with_capacity(pairs);
    let mut errors = 0;
    let mut results = Vec::with_capacity(tasks);
    for h in handles {
        results.push(h.await.expect("benchmark task panicked"));
    }
    let end = snapshot_end(conns).await;
    for s in results {
        lock_ns.extend(s.lock_ns);
        unlock_ns.extend(s.unlock_ns);
        errors += s.errors;
    }
    lock_ns.sort_unstable();
    unlock_ns.sort_unstable();
    let done = lock_ns.len().max(1) as f64;
    let secs = (end.at - start.at).as_secs_f64();
    Metrics {
        throughput: lock_ns.len() as f64 / secs,
        lock_p50: percentile_us(&lock_ns, 50.0),
        lock_p99: percentile_us(&lock_ns, 99.0),
        unlock_p50: percentile_us(&unlock_ns, 50.0),
        unlock_p99: percentile_us(&unlock_ns, 99.0),
        client_cpu: (end.cpu_us - start.cpu_us) / done,
        redis_cpu: (end.redis_us - start.redis_us) / done,
        allocs: (end.allocs - start.allocs) as f64 / done,
        phase_two: start.phase_two_share(&end),
        errors,
        ..Metrics::default()
    }
}

// ---------------------------------------------------------------------------------------
// W3: contention on one name

struct ContendSamples {
    acquire_ns: Vec<u64>,
    hold_ns: u64,
    sections: u64,
    /// Sections entered by the task that held the one before.
    again: u64,
    errors: u64,
}

async fn run_contend(
    client: &Client,
    conns: &mut [MultiplexedConnection],
    tag: &str,
    duration: Duration,
) -> Metrics {
    let name: Arc<str> = Arc::from(format!("{tag}:one"));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let last_holder = Arc::new(AtomicUsize::new(usize::MAX));
    let (go_tx, go_rx) = watch::channel(None::<Instant>);
    // Room for every acquisition at a generous rate, so that the timed phase never grows it.
    let room = (duration.as_secs_f64() * 2_000.0 / W3_TASKS as f64) as usize + 64;
    let handles: Vec<_> = (0..W3_TASKS)
        .map(|task| {
            let client = client.clone();
            let name = name.clone();
            let inside = inside.clone();
            let overlaps = overlaps.clone();
            let last_holder = last_holder.clone();
            let mut go = go_rx.clone();
            tokio::spawn(async move {
                let mut s = ContendSamples {
                    acquire_ns: Vec::with_capacity(room),
                    hold_ns: 0,
                    sections: 0,
                    again: 0,
                    errors: 0,
                };
                let deadline = go
                    .wait_for(Option::is_some)
                    .await
                    .expect("start signal")
                    .expect("a deadline");
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    let Some(held) = client.lock(&name).await else {
                        if Instant::now() <= deadline {
                            s.errors += 1;
                        }
                        continue;
                    };
                    let entered = Instant::now();
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                        eprintln!("!!! OVERLAP: two holders of {name} at once");
                    }
                    let again = last_holder.swap(task, Ordering::SeqCst) == task;
                    tokio::time::sleep(W3_HOLD).await;
                    let left = Instant::now();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    client.unlock(held).await;
                    if left <= deadline {
                        s.acquire_ns.push((entered - t0).as_nanos() as u64);
                        s.hold_ns += (left - entered).as_nanos() as u64;
                        s.sections += 1;
                        s.again += u64::from(again);
                    }
                }
                s
            })
        })
        .collect();
    let start = snapshot_start(conns).await;
    let deadline = start.at + duration;
    go_tx.send(Some(deadline)).expect("tasks are waiting");
    tokio::time::sleep_until(deadline.into()).await;
    let end = snapshot_end(conns).await;
    let mut acquire_ns = Vec::new();
    let (mut hold_ns, mut sections, mut again, mut errors) = (0u64, 0u64, 0u64, 0u64);
    for h in handles {
        let s = h.await.expect("benchmark task panicked");
        acquire_ns.extend(s.acquire_ns);
        hold_ns += s.hold_ns;
        sections += s.sections;
        again += s.again;
        errors += s.errors;
    }
    acquire_ns.sort_unstable();
    let done = sections.max(1) as f64;
    let cs_per_s = sections as f64 / duration.as_secs_f64();
    let hold_mean = hold_ns as f64 / 1e3 / done;
    Metrics {
        throughput: cs_per_s,
        lock_p50: percentile_us(&acquire_ns, 50.0),
        lock_p99: percentile_us(&acquire_ns, 99.0),
        unlock_p50: f64::NAN,
        unlock_p99: f64::NAN,
        hold_mean,
        handoff: 1e6 / cs_per_s - hold_mean,
        client_cpu: (end.cpu_us - start.cpu_us) / done,
        redis_cpu: (end.redis_us - start.redis_us) / done,
        allocs: (end.allocs - start.allocs) as f64 / done,
        same_holder: 100.0 * again as f64 / done,
        phase_two: start.phase_two_share(&end),
        errors,
        overlaps: overlaps.load(Ordering::SeqCst),
    }
}

// ---------------------------------------------------------------------------------------
// Driving and reporting

/// The runs of one (workload, N): `runs[repeat][library]`.
struct Cell {
    workload: Workload,
    nodes: usize,
    runs: Vec<[Metrics; 3]>,
}

impl Cell {
    fn median(&self, lib: usize, field: fn(&Metrics) -> f64) -> f64 {
        median(&mut self.runs.iter().map(|r| field(&r[lib])).collect::<Vec<_>>())
    }

    fn ratio(&self, lib: usize, field: fn(&Metrics) -> f64) -> f64 {
        self.ratio_to(lib, RSLOCK, field)
    }

    /// `lib` ÷ `base` per repeat, median over the repeats.
    fn ratio_to(&self, lib: usize, base: usize, field: fn(&Metrics) -> f64) -> f64 {
        median(&mut self.ratios_to(lib, base, field))
    }

    /// `lib` ÷ `base`, one per repeat.
    fn ratios_to(&self, lib: usize, base: usize, field: fn(&Metrics) -> f64) -> Vec<f64> {
        self.runs
            .iter()
            .map(|r| field(&r[lib]) / field(&r[base]))
            .collect()
    }

    fn total(&self, lib: usize, field: fn(&Metrics) -> u64) -> u64 {
        self.runs.iter().map(|r| field(&r[lib])).sum()
    }
}

async fn bench(cfg: &Config) -> Vec<Cell> {
    let max_nodes = cfg.nodes.iter().copied().max().expect("node counts");
    let cluster = support::Cluster::start(max_nodes);
    let urls = cluster.urls();
    let mut all_conns = Vec::with_capacity(max_nodes);
    for i in 0..max_nodes {
        all_conns.push(cluster.raw(i).await);
    }
    let mut cells = Vec::new();
    let mut run_id = 0usize;
    for &n in &cfg.nodes {
        let clients = clients(&urls[..n]).await;
        for &workload in &cfg.workloads {
            let mut cell = Cell {
                workload,
                nodes: n,
                runs: Vec::with_capacity(cfg.repeats),
            };
            for rep in 0..cfg.repeats {
                let mut trio = [Metrics::default(); 3];
                for (lib, label) in LIBRARIES.iter().enumerate() {
                    run_id += 1;
                    let tag = format!("r{run_id}");
                    flush_all(&mut all_conns).await;
                    let conns = &mut all_conns[..n];
                    let m = match workload {
                        Workload::W1 => {
                            run_pairs(
                                &clients.plain[lib],
                                conns,
                                &tag,
                                1,
                                WARMUP_PAIRS,
                                cfg.w1_pairs,
                            )
                            .await
                        }
                        Workload::W2 => {
                            run_pairs(
                                &clients.plain[lib],
                                conns,
                                &tag,
                                W2_TASKS,
                                WARMUP_PAIRS,
                                cfg.w2_pairs,
                            )
                            .await
                        }
                        Workload::W3 => {
                            run_contend(
                                &clients.contend[lib],
                                conns,
                                &tag,
                                Duration::from_secs_f64(cfg.w3_secs),
                            )
                            .await
                        }
                    };
                    eprintln!(
                        "{} N={n} repeat {}/{} {label:<21} {:>9.0} {}/s  p50 {:>7.0} µs  p99 {:>7.0} µs  errors {}{}",
                        workload.title(),
                        rep + 1,
                        cfg.repeats,
                        m.throughput,
                        if workload == Workload::W3 {
                            "cs"
                        } else {
                            "pairs"
                        },
                        m.lock_p50,
                        m.lock_p99,
                        m.errors,
                        if m.overlaps > 0 {
                            format!("  !!! {} OVERLAPS !!!", m.overlaps)
                        } else {
                            String::new()
                        },
                    );
                    trio[lib] = m;
                }
                cell.runs.push(trio);
            }
            cells.push(cell);
        }
    }
    flush_all(&mut all_conns).await;
    cells
}

fn report(cfg: &Config, cells: &[Cell], source: &str, elapsed: Duration) -> String {
    let mut env: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("LOAD_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.sort();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut command = env.join(" ");
    if !command.is_empty() {
        command.push(' ');
    }
    command.push_str("cargo bench -p tower-redlock-benches --bench load");
    if !args.is_empty() {
        command.push_str(" -- ");
        command.push_str(&args.join(" "));
    }
    let redis_bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "# Performance: tower-redlock and rslock\n");
    let _ = writeln!(
        w,
        "Generated by `benches/load.rs` on the workloads W1–W3 of `BENCHMARKS.md`. Each \
         workload ran tower-redlock, rslock and tower-redlock with fencing in turn, {} \
         time(s), in one process on the same loopback redis-server nodes (flushed before \
         each run); the tables give the median over the repeats. This machine varies a lot \
         between runs: compare the **ratios to rslock**, not absolute figures from other runs.\n",
        cfg.repeats
    );
    common::context_lines(
        w,
        &format!("`{command}` (or `scripts/bench`)"),
        source,
        "rslock 0.10 (`tokio-comp`)",
        &redis_bin,
    );
    let _ = writeln!(
        w,
        "- setup: bench profile (release), one tokio multi-thread runtime for both libraries \
         (worker threads = cores), the redis-server nodes on the same cores; TTL {} s, \
         restart quarantine off; sizes W1 {} pairs, W2 {} pairs over {W2_TASKS} tasks (both \
         after {WARMUP_PAIRS} warm-up pairs), W3 {} s with {W3_TASKS} tasks, {W3_ATTEMPTS} \
         attempts per acquisition with a random delay in [0, {} ms); run time {:.0} s",
        TTL.as_secs(),
        cfg.w1_pairs,
        cfg.w2_pairs,
        cfg.w3_secs,
        W3_JITTER.as_millis(),
        elapsed.as_secs_f64(),
    );
    let _ = writeln!(
        w,
        "- metrics: latencies in µs, nearest-rank percentiles of per-operation wall times; \
         client CPU = user + system CPU of the benchmark process (`getrusage`) over the \
         timed phase; Redis CPU = sum over the nodes of `used_cpu_user + used_cpu_sys`; \
         allocs = heap allocations of the whole process; all three per pair (W3: per \
         critical section). W3: hold = entering to leaving (unlock excluded; \
         `tokio::time::sleep(1 ms)` sleeps 1-2 ms), handoff = 1e6 / (cs/s) - mean hold, \
         acquire = the `lock` call including its retries, \"same holder again\" = the share \
         of critical sections entered by the task that left the one before (a releaser \
         that re-acquires at once, while the others sleep their retry delay); counted are \
         the critical sections left before the end of the timed phase. W1/W2 errors = \
         failed lock calls plus releases short of a quorum. Errors and overlaps are totals \
         over the repeats.\n"
    );

    for &workload in &cfg.workloads {
        let fs = fields(workload);
        let _ = writeln!(w, "## {}\n", workload.title());
        let _ = match workload {
            Workload::W3 => writeln!(
                w,
                "| N | library | cs/s | mean hold µs | handoff µs | acquire p50 µs | acquire p99 µs | client CPU µs/cs | Redis CPU µs/cs | allocs/cs | same holder again % | lock-call errors | overlaps |\n\
                 |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            ),
            _ => writeln!(
                w,
                "| N | library | pairs/s | lock p50 µs | lock p99 µs | unlock p50 µs | unlock p99 µs | client CPU µs/pair | Redis CPU µs/pair | allocs/pair | errors |\n\
                 |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            ),
        };
        for cell in cells.iter().filter(|c| c.workload == workload) {
            for (lib, label) in LIBRARIES.iter().enumerate() {
                let _ = write!(w, "| {} | {label} |", cell.nodes);
                for (_, field, _) in fs {
                    let _ = write!(w, " {} |", fmt_num(cell.median(lib, *field)));
                }
                if workload == Workload::W3 {
                    let _ = write!(w, " {} |", fmt_num(cell.median(lib, |m| m.same_holder)));
                }
                let _ = write!(w, " {} |", cell.total(lib, |m| m.errors));
                if workload == Workload::W3 {
                    let overlaps = cell.total(lib, |m| m.overlaps);
                    if overlaps == 0 {
                        let _ = write!(w, " 0 |");
                    } else {
                        let _ = write!(w, " **{overlaps} (MUST BE 0)** |");
                    }
                }
                let _ = writeln!(w);
            }
        }
        let _ = writeln!(w);
    }

    let _ = writeln!(w, "## Ratios to rslock\n");
    let _ = writeln!(
        w,
        "tower-redlock ÷ rslock, per repeat from the same run, median over the repeats. \
         **Throughput: above 1 is better; every other column (latency, CPU, allocations): \
         below 1 is better.** W1/W2: throughput = pairs/s, p50/p99 = lock; W3: throughput = \
         critical sections/s, p50/p99 = acquire (including waiting), CPU and allocations per \
         critical section. Throughput gives in brackets the lowest and the highest repeat. \
         Where the time of a W2 pair goes on 5 nodes (round trips, wake-ups, client and Redis \
         CPU): [`w2-profile.md`](w2-profile.md); where a W3 handoff's goes: \
         [`w3-handoff.md`](w3-handoff.md).\n"
    );
    let _ = writeln!(
        w,
        "| workload | N | variant | throughput ↑ | p50 ↓ | p99 ↓ | unlock p50 ↓ | unlock p99 ↓ | handoff ↓ | client CPU ↓ | Redis CPU ↓ | allocs ↓ |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let columns: [fn(&Metrics) -> f64; 9] = [
        |m| m.throughput,
        |m| m.lock_p50,
        |m| m.lock_p99,
        |m| m.unlock_p50,
        |m| m.unlock_p99,
        |m| m.handoff,
        |m| m.client_cpu,
        |m| m.redis_cpu,
        |m| m.allocs,
    ];
    for cell in cells {
        for (lib, label) in LIBRARIES.iter().enumerate() {
            if lib == RSLOCK {
                continue;
            }
            let _ = write!(
                w,
                "| {} | {} | {label} |",
                cell.workload.title(),
                cell.nodes
            );
            for (i, field) in columns.iter().enumerate() {
                let applies = match cell.workload {
                    Workload::W3 => !matches!(i, 3 | 4),
                    _ => i != 5,
                };
                let v = if applies {
                    cell.ratio(lib, *field)
                } else {
                    f64::NAN
                };
                let shown = match i {
                    _ if v.is_nan() => "—".to_owned(),
                    0 => {
                        let (low, high) = range(&cell.ratios_to(lib, RSLOCK, *field));
                        format!("{v:.2} ({low:.2}–{high:.2})")
                    }
                    _ => format!("{v:.2}"),
                };
                let _ = write!(w, " {shown} |");
            }
            let _ = writeln!(w);
        }
    }
    write_fencing(w, cells);
    out
}

/// The cost of fencing: how often phase 2 ran, and fenced against unfenced tower-redlock
/// (per repeat, median over the repeats), with throughput also against rslock.
fn write_fencing(w: &mut String, cells: &[Cell]) {
    const PLAIN: usize = 0;
    const FENCED: usize = 2;
    let _ = writeln!(
        w,
        "\n## Fencing\n\nThe share of fenced acquisitions that needed phase 2 (a second \
         round trip, when a quorum did not accept the proposed number), and fenced ÷ \
         unfenced tower-redlock from the same repeats (below 1 is better, except \
         throughput): the median over the repeats, and in brackets the lowest and the \
         highest repeat, which show how much this machine moves a ratio.\n\n\
         | workload | N | phase 2 % | fenced ÷ rslock throughput ↑ | fenced ÷ unfenced throughput ↑ | lock p50 ↓ | handoff ↓ | Redis CPU ↓ |\n\
         |---|---|---:|---:|---:|---:|---:|---:|"
    );
    let show = |v: f64| {
        if v.is_nan() {
            "—".to_owned()
        } else {
            format!("{v:.2}")
        }
    };
    // The median of per-repeat ratios, with their range.
    let spread = |mut ratios: Vec<f64>| {
        let (low, high) = range(&ratios);
        let mid = median(&mut ratios);
        if mid.is_nan() || ratios.len() < 2 {
            show(mid)
        } else {
            format!("{} ({}–{})", show(mid), show(low), show(high))
        }
    };
    let vs = |cell: &Cell, field: fn(&Metrics) -> f64| spread(cell.ratios_to(FENCED, PLAIN, field));
    for cell in cells {
        let handoff = match cell.workload {
            Workload::W3 => vs(cell, |m| m.handoff),
            _ => show(f64::NAN),
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            cell.workload.title(),
            cell.nodes,
            show(cell.median(FENCED, |m| m.phase_two)),
            spread(cell.ratios_to(FENCED, RSLOCK, |m| m.throughput)),
            vs(cell, |m| m.throughput),
            vs(cell, |m| m.lock_p50),
            handoff,
            vs(cell, |m| m.redis_cpu),
        );
    }
}

fn main() {
    let cfg = Config::from_env();
    let source = source_state();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let started = Instant::now();
    let cells = rt.block_on(bench(&cfg));
    let text = report(&cfg, &cells, &source, started.elapsed());
    println!("{text}");
    let overlaps: u64 = cells
        .iter()
        .flat_map(|c| &c.runs)
        .flatten()
        .map(|m| m.overlaps)
        .sum();
    if overlaps > 0 {
        eprintln!("!!! {overlaps} OVERLAPS in W3: two tasks held the lock at once !!!");
    }
    if let Some(path) = &cfg.report {
        // The layer benchmark's section (`scripts/bench layer`) stays at the end.
        let layer = std::fs::read_to_string(path)
            .ok()
            .and_then(|old| old.find("\n## Layer overhead").map(|i| old[i..].to_owned()))
            .unwrap_or_default();
        let text = format!("{}\n{layer}", text.trim_end());
        std::fs::write(path, &text).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
        eprintln!("report written to {path}");
    }
    assert_eq!(overlaps, 0, "W3 saw overlapping critical sections");
}
