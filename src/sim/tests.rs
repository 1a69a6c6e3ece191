//! The simulation's runs: the default one (many schedules from a random or given base
//! seed), a replay of one seed, and the long mode.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::checkers::check;
use super::world::{Plan, play};

/// What the schedules played: acquisitions, grants, faults by kind.
#[derive(Debug, Default)]
struct Played {
    schedules: u64,
    acquisitions: usize,
    grants: usize,
    /// Replay keys run, and stored on a quorum.
    runs: usize,
    completed: usize,
    faults: std::collections::BTreeMap<&'static str, usize>,
}

/// Plays the schedule of `seed`, counted in `played`: what it broke.
fn run(
    rt: &tokio::runtime::Runtime,
    seed: u64,
    played: &mut Played,
) -> Vec<super::checkers::Violation> {
    let plan = Plan::of(seed);
    let history = rt.block_on(play(&plan));
    played.schedules += 1;
    played.acquisitions += history.acquisitions;
    played.grants += history.grants.len();
    played.runs += history.runs.len();
    played.completed += history.completed.len();
    for (_, fault) in &history.faults {
        *played.faults.entry(fault.kind()).or_default() += 1;
    }
    check(&plan, &history)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The default run: `SIM_SCHEDULES` schedules (100,000 unless set; or for `SIM_SECS`),
/// from `SIM_BASE` (or a random base), on every core (or `SIM_THREADS`); a schedule that breaks a rule
/// fails the test with its seed. `SIM_SEED` replays one schedule.
#[test]
fn simulation() {
    if let Some(seed) = env("SIM_SEED") {
        let plan = Plan::of(seed);
        let found = run(&runtime(), seed, &mut Played::default());
        assert!(found.is_empty(), "seed {seed}: {found:#?}\n{plan:#?}");
        return;
    }
    let base = env("SIM_BASE").unwrap_or_else(|| getrandom::u64().unwrap_or(1));
    let schedules = env("SIM_SCHEDULES").unwrap_or(100_000);
    let until = env("SIM_SECS").map(|s| Instant::now() + Duration::from_secs(s));
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let failed = Mutex::new(None);
    let threads = env("SIM_THREADS").map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        |t| usize::try_from(t).unwrap_or(1).max(1),
    );
    let played: Vec<Played> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let rt = runtime();
                    let mut played = Played::default();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let more = match until {
                            Some(until) => Instant::now() < until,
                            None => i < schedules,
                        };
                        if !more || lock(&failed).is_some() {
                            return played;
                        }
                        let seed = base.wrapping_add(i);
                        let found = run(&rt, seed, &mut played);
                        if !found.is_empty() {
                            lock(&failed).get_or_insert((seed, found));
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    if let Some((seed, found)) = lock(&failed).take() {
        panic!(
            "seed {seed} (replay: SIM_SEED={seed} cargo test --lib sim::): {found:#?}\n{:#?}",
            Plan::of(seed)
        );
    }
    let mut total = Played::default();
    for p in played {
        total.schedules += p.schedules;
        total.acquisitions += p.acquisitions;
        total.grants += p.grants;
        total.runs += p.runs;
        total.completed += p.completed;
        for (kind, n) in p.faults {
            *total.faults.entry(kind).or_default() += n;
        }
    }
    println!(
        "simulation: base {base}, {threads} threads, {:?}: {total:?}",
        started.elapsed()
    );
    assert!(total.schedules >= schedules.min(1), "no schedule played");
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
