//! A Jepsen-style workload and its checks: many clients contend for a few names and, while
//! holding a lock, do a read-modify-write on a shared ledger (lost updates), record when
//! they believed they held it (overlaps), and write through a fenced store (stale writes),
//! while a nemesis injects faults into a minority of the nodes.
//!
//! Every instant is taken on this process's monotonic clock, so the overlap check is exact:
//! two holds overlap when one client got the lock before another's validity had ended.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::fenced::{FencedStore, Write};
use super::{Cluster, FaultProxy, Mode};
use tower_redlock::{LockError, Redlock};

/// A small deterministic generator (xorshift64*).
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

/// The seed of a run: `JEPSEN_SEED`, or a fixed default so runs repeat.
pub fn seed() -> u64 {
    std::env::var("JEPSEN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6a65_7073_656e)
}

/// How long each randomized scenario runs: `JEPSEN_SECS` (default 6).
pub fn duration() -> Duration {
    Duration::from_secs_f64(
        std::env::var("JEPSEN_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(6.0),
    )
}

/// One hold of a lock, as its holder saw it.
#[derive(Debug, Clone, Copy)]
pub struct Hold {
    pub name: usize,
    /// When the successful attempt's call started.
    pub started: Instant,
    /// When the lock was returned.
    pub acquired: Instant,
    /// When the holder stopped believing it held the lock: release or end of validity.
    pub end: Instant,
    pub token: u64,
}

/// What the workload saw.
#[derive(Default)]
pub struct History {
    pub holds: Mutex<Vec<Hold>>,
    /// Every grant's instant, for the liveness check.
    pub grants: Mutex<Vec<Instant>>,
    pub ledger: Mutex<HashMap<usize, u64>>,
    pub increments: AtomicU64,
    pub failed_attempts: AtomicU64,
    pub stale_writes_accepted: AtomicU64,
    pub stale_writes_rejected: AtomicU64,
    pub late_writes: AtomicU64,
    /// Per name: the highest fencing number the store accepted, as seen by the clients.
    pub highest_written: Mutex<HashMap<usize, u64>>,
}

/// The shape of the workload.
#[derive(Clone)]
pub struct Workload {
    /// Independent clients (each with its own connections, as separate processes would).
    pub clients: usize,
    pub tasks_per_client: usize,
    pub names: usize,
    pub ttl: Duration,
    pub node_timeout: Duration,
    /// One hold in this many freezes past its validity, then writes (a paused client).
    pub client_pause_one_in: Option<usize>,
    /// The clients' fencing retention (default: the client default).
    pub fencing_retention: Option<Duration>,
    /// With `Some(period)`, the workload alternates every period between working and
    /// resting (no lock at all), so the fencing counters' set can expire before the names
    /// are locked again.
    pub rest: Option<Duration>,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            clients: 4,
            tasks_per_client: 4,
            names: 3,
            ttl: Duration::from_secs(1),
            node_timeout: Duration::from_millis(100),
            client_pause_one_in: None,
            fencing_retention: None,
            rest: None,
        }
    }
}

/// 5 nodes, each behind a fault proxy, and a separate node for the fenced store.
pub struct Setup {
    pub cluster: Cluster,
    pub proxies: Vec<FaultProxy>,
    pub store_node: super::RedisNode,
}

impl Setup {
    /// Starts the nodes with ledgers made long ago, so that the clients' restart
    /// quarantine (on, as by default) holds back only the nodes the nemesis restarts.
    pub async fn start() -> Self {
        let cluster = Cluster::start(5);
        let mut proxies = Vec::new();
        for node in &cluster.nodes {
            proxies.push(FaultProxy::start(node.addr()).await);
        }
        let store_node = super::RedisNode::start();
        cluster.age_ledgers();
        Self {
            cluster,
            proxies,
            store_node,
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.proxies.iter().map(FaultProxy::url).collect()
    }
}

fn lock_name(name: usize) -> String {
    format!("jepsen:{name}")
}

/// Runs the workload against `urls` until `until`, recording into `history`.
pub async fn run_workload(
    urls: Vec<String>,
    store: FencedStore,
    w: Workload,
    until: Instant,
    seed: u64,
    history: Arc<History>,
) {
    let mut tasks = Vec::new();
    for c in 0..w.clients {
        let mut builder = Redlock::builder(urls.clone())
            .ttl(w.ttl)
            .node_timeout(w.node_timeout)
            .connect_timeout(Duration::from_millis(300))
            .retry_delay(Duration::from_millis(2), Duration::from_millis(8));
        if let Some(retention) = w.fencing_retention {
            builder = builder.fencing_retention(retention);
        }
        let redlock = builder.build().expect("build");
        let from = Instant::now();
        for t in 0..w.tasks_per_client {
            let redlock = redlock.clone();
            let store = store.clone();
            let history = Arc::clone(&history);
            let w = w.clone();
            let mut rng = Rng(seed ^ ((c * 64 + t + 1) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            tasks.push(tokio::spawn(async move {
                while Instant::now() < until {
                    if let Some(period) = w.rest {
                        let phase = from.elapsed().as_nanos() / period.as_nanos().max(1);
                        if phase % 2 == 1 {
                            let next =
                                period.saturating_mul(u32::try_from(phase + 1).unwrap_or(u32::MAX));
                            tokio::time::sleep_until((from + next).min(until).into()).await;
                            continue;
                        }
                    }
                    let name = rng.below(w.names);
                    let pause = w.client_pause_one_in.is_some_and(|n| rng.below(n) == 0);
                    hold_once(&redlock, &store, &w, name, pause, until, &history).await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("workload task");
    }
}

async fn hold_once(
    redlock: &Redlock,
    store: &FencedStore,
    w: &Workload,
    name: usize,
    pause: bool,
    until: Instant,
    history: &History,
) {
    let started = Instant::now();
    let deadline = (started + Duration::from_millis(500)).min(until);
    let lock = match redlock.lock_until(lock_name(name), w.ttl, deadline).await {
        Ok(lock) => lock,
        Err(e) => {
            debug_assert!(!matches!(e, LockError::InvalidName { .. }));
            history.failed_attempts.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let acquired = Instant::now();
    history.grants.lock().expect("grants").push(acquired);
    let token = lock.fencing_token().expect("fencing is on");
    if pause {
        // Frozen past the validity (a GC pause, SIGSTOP), then writes as if still holding.
        tokio::time::sleep_until((lock.valid_until() + w.ttl / 2).into()).await;
        history.late_writes.fetch_add(1, Ordering::Relaxed);
        fenced_write(store, name, token, history).await;
        push_hold(history, name, started, acquired, lock.valid_until(), token);
        let _ = redlock.unlock(&lock).await;
        return;
    }
    // Read-modify-write on the ledger, only while the lock is valid.
    let before = *history
        .ledger
        .lock()
        .expect("ledger")
        .get(&name)
        .unwrap_or(&0);
    tokio::time::sleep(Duration::from_micros(200)).await;
    if lock.is_held() {
        history
            .ledger
            .lock()
            .expect("ledger")
            .insert(name, before + 1);
        history.increments.fetch_add(1, Ordering::Relaxed);
    }
    fenced_write(store, name, token, history).await;
    let end = Instant::now().min(lock.valid_until());
    push_hold(history, name, started, acquired, end, token);
    let _ = redlock.unlock(&lock).await;
}

fn push_hold(
    h: &History,
    name: usize,
    started: Instant,
    acquired: Instant,
    end: Instant,
    token: u64,
) {
    h.holds.lock().expect("holds").push(Hold {
        name,
        started,
        acquired,
        end,
        token,
    });
}

/// A write through the fenced store; counts it as stale if a higher number had already been
/// accepted for the name when it was sent.
async fn fenced_write(store: &FencedStore, name: usize, token: u64, h: &History) {
    let highest_before = *h
        .highest_written
        .lock()
        .expect("highest")
        .get(&name)
        .unwrap_or(&0);
    let Ok(outcome) = store
        .write(&format!("jepsen:record:{name}"), token, &token.to_string())
        .await
    else {
        return; // the store node is never faulted; a failure here is not a lock problem
    };
    match outcome {
        Write::Accepted => {
            if token < highest_before {
                h.stale_writes_accepted.fetch_add(1, Ordering::Relaxed);
            }
            let mut highest = h.highest_written.lock().expect("highest");
            let e = highest.entry(name).or_default();
            *e = (*e).max(token);
        }
        Write::Stale { .. } => {
            h.stale_writes_rejected.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The checks' results.
#[derive(Debug, Default, Clone)]
pub struct Verdict {
    pub acquisitions: usize,
    pub failed_attempts: u64,
    pub overlaps: usize,
    pub lost_updates: u64,
    pub stale_writes_accepted: u64,
    pub stale_writes_rejected: u64,
    pub late_writes: u64,
    /// Acquisitions that started after another of the same name had returned, yet got a
    /// fencing number not above it.
    pub fencing_inversions: usize,
    /// The longest stretch without any grant while the run lasted.
    pub longest_gap: Duration,
}

/// Checks a finished run.
pub fn verdict(h: &History, from: Instant, until: Instant) -> Verdict {
    let holds = h.holds.lock().expect("holds").clone();
    let mut v = Verdict {
        acquisitions: holds.len(),
        failed_attempts: h.failed_attempts.load(Ordering::Relaxed),
        stale_writes_accepted: h.stale_writes_accepted.load(Ordering::Relaxed),
        stale_writes_rejected: h.stale_writes_rejected.load(Ordering::Relaxed),
        late_writes: h.late_writes.load(Ordering::Relaxed),
        ..Verdict::default()
    };
    let ledger_total: u64 = h.ledger.lock().expect("ledger").values().sum();
    v.lost_updates = h.increments.load(Ordering::Relaxed) - ledger_total;
    let names: std::collections::BTreeSet<usize> = holds.iter().map(|x| x.name).collect();
    for name in names {
        let mut mine: Vec<Hold> = holds.iter().copied().filter(|x| x.name == name).collect();
        // Overlaps: a hold that began before an earlier one's end.
        mine.sort_by_key(|x| x.acquired);
        let mut latest_end: Option<Instant> = None;
        for x in &mine {
            if latest_end.is_some_and(|e| x.acquired < e) {
                v.overlaps += 1;
            }
            latest_end = Some(latest_end.map_or(x.end, |e| e.max(x.end)));
        }
        // Fencing in real-time order: every acquisition that started after others had
        // returned must get a higher number than all of them.
        let mut by_return = mine.clone();
        by_return.sort_by_key(|x| x.acquired);
        let mut by_start = mine;
        by_start.sort_by_key(|x| x.started);
        let mut highest_returned = 0u64;
        let mut next = 0;
        for x in &by_start {
            while next < by_return.len() && by_return[next].acquired < x.started {
                highest_returned = highest_returned.max(by_return[next].token);
                next += 1;
            }
            if x.token <= highest_returned {
                v.fencing_inversions += 1;
            }
        }
    }
    let mut grants = h.grants.lock().expect("grants").clone();
    grants.sort();
    let mut last = from;
    for g in grants.iter().chain(std::iter::once(&until)) {
        v.longest_gap = v.longest_gap.max(g.saturating_duration_since(last));
        last = last.max(*g);
    }
    v
}

/// The kinds of faults a nemesis injects into a minority of nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// SIGSTOP, SIGCONT when healed.
    Pause,
    /// SIGKILL, restarted empty when healed (the client quarantines it).
    KillRestart,
    /// The proxy holds all traffic and accepts no connection.
    Partition,
    /// The proxy delays each chunk by 50-200 ms.
    Latency,
    /// The proxy resets every connection.
    Reset,
    /// Requests reach the node, replies are held back.
    LoseReplies,
}

pub const ALL_FAULTS: [Fault; 6] = [
    Fault::Pause,
    Fault::KillRestart,
    Fault::Partition,
    Fault::Latency,
    Fault::Reset,
    Fault::LoseReplies,
];

/// Every `period`, heals the previous faults and injects one of `kinds` into a random
/// minority (1 or 2 nodes), until `until`. Nodes restarted less than `quarantine` ago
/// count as unavailable, so that a majority is always healthy. Returns what it injected.
pub async fn nemesis(
    setup: &mut Setup,
    kinds: &[Fault],
    period: Duration,
    quarantine: Duration,
    until: Instant,
    mut rng: Rng,
) -> HashMap<Fault, usize> {
    let mut injected: HashMap<Fault, usize> = HashMap::new();
    let mut active: Vec<(usize, Fault)> = Vec::new();
    let mut restarted_at: [Option<Instant>; 5] = [None; 5];
    while Instant::now() + period < until {
        tokio::time::sleep(period).await;
        heal(setup, &mut active, &mut restarted_at);
        let young: Vec<usize> = (0..5)
            .filter(|i| restarted_at[*i].is_some_and(|t| t.elapsed() < quarantine))
            .collect();
        let room = 2usize.saturating_sub(young.len());
        if room == 0 {
            continue;
        }
        let kind = kinds[rng.below(kinds.len())];
        let count = 1 + rng.below(room);
        let mut chosen = Vec::new();
        while chosen.len() < count {
            let i = rng.below(5);
            if !chosen.contains(&i) && !young.contains(&i) {
                chosen.push(i);
            }
        }
        for i in chosen {
            *injected.entry(kind).or_default() += 1;
            tokio::task::block_in_place(|| match kind {
                Fault::Pause => setup.cluster.nodes[i].pause(),
                Fault::KillRestart => setup.cluster.nodes[i].kill(),
                Fault::Partition => setup.proxies[i].set(Mode::Blackhole),
                Fault::Latency => setup.proxies[i].set(Mode::random_delay(
                    Duration::from_millis(50),
                    Duration::from_millis(200),
                )),
                Fault::Reset => setup.proxies[i].set(Mode::Reset),
                Fault::LoseReplies => setup.proxies[i].set(Mode::LoseReplies),
            });
            active.push((i, kind));
        }
    }
    heal(setup, &mut active, &mut restarted_at);
    injected
}

fn heal(
    setup: &mut Setup,
    active: &mut Vec<(usize, Fault)>,
    restarted_at: &mut [Option<Instant>; 5],
) {
    tokio::task::block_in_place(|| {
        for (i, kind) in active.drain(..) {
            match kind {
                Fault::Pause => setup.cluster.nodes[i].resume(),
                Fault::KillRestart => {
                    setup.cluster.nodes[i].restart();
                    restarted_at[i] = Some(Instant::now());
                }
                _ => setup.proxies[i].set(Mode::Pass),
            }
        }
    });
}

/// One line of the reliability report, printed and, with `RELIABILITY_REPORT=path`,
/// appended to that file.
pub fn report(scenario: &str, duration: Duration, faults: &str, v: &Verdict) {
    let mut line = String::new();
    let _ = write!(
        line,
        "| {scenario} | {:.0} s | {} | {} | {faults} | {} | {} | {} | {} ({} late) | {} | {:.2} s |",
        duration.as_secs_f64(),
        v.acquisitions,
        v.failed_attempts,
        v.overlaps,
        v.lost_updates,
        v.stale_writes_accepted,
        v.stale_writes_rejected,
        v.late_writes,
        v.fencing_inversions,
        v.longest_gap.as_secs_f64(),
    );
    println!("{line}");
    if let Ok(path) = std::env::var("RELIABILITY_REPORT") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// The faults as `kind × count` items.
pub fn describe(injected: &HashMap<Fault, usize>) -> String {
    let mut items: Vec<_> = injected.iter().collect();
    items.sort();
    let parts: Vec<String> = items.iter().map(|(k, n)| format!("{k:?} ×{n}")).collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}
