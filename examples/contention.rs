//! Many tasks contend for one lock; each holder does a read-modify-write on a shared
//! counter that would lose updates without mutual exclusion. Prints a summary.
//!
//! ```text
//! REDLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example contention
//! ```
//!
//! Without `REDLOCK_NODES` it starts 5 local `redis-server` nodes for the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tower_redlock::{LockError, Redlock};

mod common;

const TASKS: usize = 50;
const ROUNDS: usize = 20;

#[derive(Default)]
struct Stats {
    holds: Vec<(Instant, Instant)>,
    waits: Vec<Duration>,
    retries: u64,
    gave_up: u64,
}

#[tokio::main]
async fn main() -> Result<(), common::Error> {
    let (urls, _local) = common::nodes_or_local(5)?;
    let redlock = Redlock::builder(urls)
        .restart_quarantine(common::restart_quarantine(&_local))
        .ttl(Duration::from_secs(2))
        .node_timeout(Duration::from_millis(50))
        .max_attempts(1_000)
        .retry_delay(Duration::from_millis(1), Duration::from_millis(4))
        .key_prefix("demo:")
        .build()?;
    println!(
        "{} nodes, quorum {}: {TASKS} tasks x {ROUNDS} rounds contend for one lock",
        redlock.node_count(),
        redlock.quorum()
    );

    // The shared resource: a counter updated by read, pause, write. Without the lock,
    // concurrent holders would overwrite each other's increments.
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let redlock = redlock.clone();
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            for _ in 0..ROUNDS {
                let asked = Instant::now();
                match redlock.lock("report").await {
                    Ok(lock) => {
                        let got = Instant::now();
                        stats.waits.push(got - asked);
                        stats.retries += u64::from(lock.attempts() - 1);
                        let seen = counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        counter.store(seen + 1, Ordering::SeqCst);
                        let end = Instant::now().min(lock.valid_until());
                        stats.holds.push((got, end));
                        let _ = redlock.unlock(&lock).await;
                    }
                    Err(LockError::Busy { .. }) => stats.gave_up += 1,
                    Err(e) => return Err(e),
                }
            }
            Ok(stats)
        }));
    }
    let mut all = Stats::default();
    for t in tasks {
        let s = t.await??;
        all.holds.extend(s.holds);
        all.waits.extend(s.waits);
        all.retries += s.retries;
        all.gave_up += s.gave_up;
    }
    let wall = started.elapsed();

    all.holds.sort();
    let overlaps = all.holds.windows(2).filter(|w| w[1].0 < w[0].1).count();
    all.waits.sort();
    let pct = |p: f64| {
        let i = ((all.waits.len() as f64 - 1.0) * p).round() as usize;
        all.waits.get(i).copied().unwrap_or_default()
    };
    let holds = all.holds.len() as u64;
    let lost = holds - counter.load(Ordering::SeqCst);

    println!();
    println!("  holds granted         {holds:>8}");
    println!("  retries (busy waits)  {:>8}", all.retries);
    println!("  gave up               {:>8}", all.gave_up);
    println!("  overlapping holds     {overlaps:>8}");
    println!("  lost counter updates  {lost:>8}");
    println!(
        "  wait p50 / p99 / max  {:?} / {:?} / {:?}",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    println!("  wall time             {wall:?}");
    println!();
    if overlaps == 0 && lost == 0 {
        println!("mutual exclusion held: no two holders overlapped, no update was lost");
        Ok(())
    } else {
        Err("mutual exclusion violated".into())
    }
}
