//! Jepsen-style runs: 5 real nodes behind fault proxies, 16 tasks in 4 independent
//! clients contending for 3 names, and a nemesis that injects one kind of fault (or all
//! kinds in turn) into a random minority of nodes every 700 ms. Each run checks: no two
//! holds overlap, no update to the ledger is lost, no stale write is accepted by the fenced
//! store, fencing numbers grow in real-time order, and locks keep being granted (no gap
//! longer than 2.5 s, with a 1 s TTL) since a majority is always healthy.
//!
//! `JEPSEN_SECS` sets the length of each run (default 6), `JEPSEN_SEED` the seed; the
//! ignored `soak` test runs every fault kind for `JEPSEN_SOAK_SECS` (default 600).
//! With `RELIABILITY_REPORT=path`, each run appends its line of `docs/reliability.md`.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::fenced::FencedStore;
use support::jepsen::{
    self, ALL_FAULTS, Fault, History, Rng, Setup, Workload, describe, nemesis, report, verdict,
};

const PERIOD: Duration = Duration::from_millis(700);
/// The longest a run may go without a grant while a majority of nodes is healthy: a
/// release that failed on a faulty node leaves the key there until its TTL (1 s) ends,
/// and when that node heals while others fail, the name is busy until then.
const MAX_GAP: Duration = Duration::from_millis(2500);

async fn run(scenario: &str, kinds: &[Fault], w: Workload, length: Duration) {
    let mut setup = Setup::start().await;
    let store = FencedStore::connect(&setup.store_node.url())
        .await
        .expect("store");
    let seed = jepsen::seed();
    let history = Arc::new(History::default());
    let from = Instant::now();
    let until = from + length;
    let workload = tokio::spawn(jepsen::run_workload(
        setup.urls(),
        store,
        w.clone(),
        until,
        seed,
        Arc::clone(&history),
    ));
    let injected = if kinds.is_empty() {
        tokio::time::sleep_until(until.into()).await;
        Default::default()
    } else {
        nemesis(&mut setup, kinds, PERIOD, w.ttl, until, Rng(seed)).await
    };
    workload.await.expect("workload");
    let v = verdict(&history, from, until);
    let mut faults = describe(&injected);
    if let Some(n) = w.client_pause_one_in {
        faults.push_str(&format!(", client pauses (1 hold in {n})"));
    }
    report(scenario, length, &faults, &v);
    assert!(v.acquisitions > 0, "{scenario}: no lock was ever granted");
    assert_eq!(
        v.overlaps, 0,
        "{scenario}: overlapping holds ({v:?}, seed {seed})"
    );
    assert_eq!(
        v.lost_updates, 0,
        "{scenario}: lost updates ({v:?}, seed {seed})"
    );
    assert_eq!(
        v.stale_writes_accepted, 0,
        "{scenario}: stale writes accepted ({v:?}, seed {seed})"
    );
    assert_eq!(
        v.fencing_inversions, 0,
        "{scenario}: fencing numbers out of order ({v:?}, seed {seed})"
    );
    // A workload that rests has a gap of its own making.
    let max_gap = MAX_GAP + w.rest.unwrap_or_default();
    assert!(
        v.longest_gap <= max_gap,
        "{scenario}: no grant for {:?} although a majority was healthy ({v:?}, seed {seed})",
        v.longest_gap
    );
    if w.client_pause_one_in.is_some() {
        assert!(v.late_writes > 0, "{scenario}: no client pause happened");
    }
}

async fn run_one(scenario: &str, kinds: &[Fault]) {
    run(scenario, kinds, Workload::default(), jepsen::duration()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_a_minority() {
    run_one("pause (SIGSTOP) a minority", &[Fault::Pause]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_and_restart_a_minority_with_data_loss() {
    run_one(
        "kill and restart a minority, data lost",
        &[Fault::KillRestart],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_a_minority() {
    run_one("partition a minority", &[Fault::Partition]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_down_a_minority() {
    run_one("50-200 ms latency on a minority", &[Fault::Latency]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_connections() {
    run_one("reset a minority's connections", &[Fault::Reset]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lose_replies_one_way() {
    run_one(
        "one-way loss (replies) on a minority",
        &[Fault::LoseReplies],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_clients_and_every_fault_in_turn() {
    let w = Workload {
        client_pause_one_in: Some(25),
        ..Workload::default()
    };
    run(
        "every fault in turn, and paused clients",
        &ALL_FAULTS,
        w,
        jepsen::duration(),
    )
    .await;
}

/// Fencing counters expire mid-run: the workload rests (locks nothing) every other
/// 3.5 s, and the counters' set lives 3 s (a 2 s retention and a half) after its last
/// renewal, so every name comes back to an expired counter (numbers continue from the
/// clients' clocks); numbers must still grow in lock order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_counters_expire_mid_run() {
    let w = Workload {
        ttl: Duration::from_millis(200),
        node_timeout: Duration::from_millis(20),
        fencing_retention: Some(Duration::from_secs(2)),
        rest: Some(Duration::from_millis(3_500)),
        ..Workload::default()
    };
    let length = jepsen::duration().max(Duration::from_secs(9));
    run(
        "fencing counters expire mid-run (2 s retention)",
        &[],
        w,
        length,
    )
    .await;
}

/// The long run: `JEPSEN_SOAK_SECS=600 cargo test --release --all-features --test suite
/// -- --ignored --nocapture jepsen::soak`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long soak; run it on purpose (see README)"]
async fn soak() {
    let secs = std::env::var("JEPSEN_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600.0);
    let w = Workload {
        client_pause_one_in: Some(50),
        ..Workload::default()
    };
    run(
        "soak: every fault in turn, and paused clients",
        &ALL_FAULTS,
        w,
        Duration::from_secs_f64(secs),
    )
    .await;
}
