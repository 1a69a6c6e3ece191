//! Acquire + release round trips on 1, 3 and 5 local redis-server nodes (started by the
//! test harness), one lock at a time and 64 concurrent locks; and the cost of fencing
//! numbers (in the acquire round trip, phase 2 only when a quorum refuses the proposal)
//! on 3 nodes, with fencing on and off.
//!
//! `cargo bench -p tower-redlock-benches --bench acquire` (or `-- fencing` for the fencing group only). Compare
//! ratios within one run, not absolute times.

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use futures_util::future::join_all;

fn acquire_release(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("acquire_release");
    group.measurement_time(Duration::from_secs(5));
    for n in [1usize, 3, 5] {
        let cluster = support::Cluster::start(n);
        let redlock = rt.block_on(async {
            let r = support::builder(cluster.urls()).build().expect("build");
            let l = r.lock("warm").await.expect("warm-up");
            let _ = r.unlock(&l).await;
            r
        });
        group.bench_with_input(BenchmarkId::new("sequential", n), &n, |b, _| {
            b.to_async(&rt).iter(|| async {
                let lock = redlock.try_lock("bench").await.expect("free lock");
                let _ = black_box(redlock.unlock(&lock).await);
            });
        });
        group.bench_with_input(BenchmarkId::new("64_distinct_names", n), &n, |b, _| {
            b.to_async(&rt).iter(|| async {
                join_all((0..64u8).map(|i| {
                    let redlock = redlock.clone();
                    async move {
                        let lock = redlock.try_lock([b'b', i]).await.expect("free lock");
                        let _ = black_box(redlock.unlock(&lock).await);
                    }
                }))
                .await;
            });
        });
    }
    group.finish();
}

fn fencing(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cluster = support::Cluster::start(3);
    let fenced = rt.block_on(async {
        let r = support::builder(cluster.urls()).build().expect("build");
        let l = r.lock("warm").await.expect("warm-up");
        let _ = r.unlock(&l).await;
        r
    });
    let mut group = c.benchmark_group("fencing");
    group.measurement_time(Duration::from_secs(5));
    for on in [true, false] {
        let redlock = fenced.with_fencing(on);
        let label = if on { "on" } else { "off" };
        group.bench_function(BenchmarkId::new("acquire_release_3_nodes", label), |b| {
            b.to_async(&rt).iter(|| async {
                let lock = redlock.try_lock("bench").await.expect("free lock");
                let _ = black_box(redlock.unlock(&lock).await);
            });
        });
    }
    group.finish();
}

criterion_group!(benches, acquire_release, fencing);
criterion_main!(benches);
