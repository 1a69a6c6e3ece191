//! A property test over every builder setting, with real Redis: extreme values (0, 1 ns,
//! `Duration::MAX`, NaN and negative factors, huge counts, odd prefixes and names) either
//! make `build()` return a typed error or give a client whose operations never panic (in
//! the caller or in a background task) and return within a bound.

mod support;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::Cluster;
use tower_redlock::{Redlock, RedlockBuilder};

/// Panics anywhere in the process (spawned tasks included) since the hook was set.
static PANICS: AtomicUsize = AtomicUsize::new(0);
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

fn count_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = info.to_string();
        }
        default(info);
    }));
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        1 => Just(Duration::ZERO),
        1 => Just(Duration::from_nanos(1)),
        1 => Just(Duration::MAX),
        1 => Just(Duration::from_secs(u64::MAX / 2)),
        4 => (1u64..5_000).prop_map(Duration::from_millis),
        2 => (1u64..100_000).prop_map(Duration::from_secs),
    ]
}

fn factor() -> impl Strategy<Value = f64> {
    prop_oneof![
        1 => Just(f64::NAN),
        1 => Just(-1.0),
        1 => Just(0.0),
        1 => Just(1.0),
        1 => Just(f64::INFINITY),
        1 => Just(f64::MIN_POSITIVE),
        4 => 0.0f64..1.5,
    ]
}

fn count() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0), Just(1), Just(u32::MAX), 2u32..50]
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        Just(b"{}".to_vec()),
        Just(b"a{b}c".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..max),
    ]
}

/// Each setting left at its default (mostly) or set (to an extreme value, often).
fn maybe<T: std::fmt::Debug>(s: impl Strategy<Value = T>) -> impl Strategy<Value = Option<T>> {
    proptest::option::weighted(0.2, s)
}

/// Every setting, each one left at its default or set.
#[derive(Debug, Clone)]
struct Settings {
    ttl: Option<Duration>,
    node_timeout: Option<Duration>,
    drift_factor: Option<f64>,
    max_attempts: Option<u32>,
    retry_delay: Option<(Duration, Duration)>,
    retry_deadline: Option<Option<Duration>>,
    key_prefix: Option<Vec<u8>>,
    min_validity: Option<Duration>,
    connect_timeout: Option<Duration>,
    reconnect_after_timeouts: Option<u32>,
    extend_fraction: Option<f64>,
    max_hold: Option<Option<Duration>>,
    max_extensions: Option<Option<u32>>,
    fencing: Option<bool>,
    fencing_retention: Option<Duration>,
    restart_quarantine: Option<bool>,
    name: Vec<u8>,
    call_ttl: Duration,
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        (
            maybe(duration()),
            maybe(duration()),
            maybe(factor()),
            maybe(count()),
            maybe((duration(), duration())),
            maybe(maybe(duration())),
            maybe(bytes(40)),
            maybe(duration()),
        ),
        (
            maybe(duration()),
            maybe(count()),
            maybe(factor()),
            maybe(maybe(duration())),
            maybe(maybe(count())),
            maybe(any::<bool>()),
            maybe(duration()),
            maybe(any::<bool>()),
            bytes(400),
            duration(),
        ),
    )
        .prop_map(|(a, b)| Settings {
            ttl: a.0,
            node_timeout: a.1,
            drift_factor: a.2,
            max_attempts: a.3,
            retry_delay: a.4,
            retry_deadline: a.5,
            key_prefix: a.6,
            min_validity: a.7,
            connect_timeout: b.0,
            reconnect_after_timeouts: b.1,
            extend_fraction: b.2,
            max_hold: b.3,
            max_extensions: b.4,
            fencing: b.5,
            fencing_retention: b.6,
            restart_quarantine: b.7,
            name: b.8,
            call_ttl: b.9,
        })
}

fn configure(mut b: RedlockBuilder, s: &Settings) -> RedlockBuilder {
    if let Some(v) = s.ttl {
        b = b.ttl(v);
    }
    if let Some(v) = s.node_timeout {
        b = b.node_timeout(v);
    }
    if let Some(v) = s.drift_factor {
        b = b.drift_factor(v);
    }
    if let Some(v) = s.max_attempts {
        b = b.max_attempts(v);
    }
    if let Some((base, jitter)) = s.retry_delay {
        b = b.retry_delay(base, jitter);
    }
    if let Some(v) = s.retry_deadline {
        b = b.retry_deadline(v);
    }
    if let Some(v) = &s.key_prefix {
        b = b.key_prefix(v);
    }
    if let Some(v) = s.min_validity {
        b = b.min_validity(v);
    }
    if let Some(v) = s.connect_timeout {
        b = b.connect_timeout(v);
    }
    if let Some(v) = s.reconnect_after_timeouts {
        b = b.reconnect_after_timeouts(v);
    }
    if let Some(v) = s.extend_fraction {
        b = b.extend_fraction(v);
    }
    if let Some(v) = s.max_hold {
        b = b.max_hold(v);
    }
    if let Some(v) = s.max_extensions {
        b = b.max_extensions(v);
    }
    if let Some(v) = s.fencing {
        b = b.fencing(v);
    }
    if let Some(v) = s.fencing_retention {
        b = b.fencing_retention(v);
    }
    if let Some(v) = s.restart_quarantine {
        b = b.restart_quarantine(v);
    }
    b
}

/// The bound on each operation that does not wait for a busy lock.
const BOUND: Duration = Duration::from_secs(3);

/// Runs `op` within [`BOUND`]; a failure names the operation.
async fn bounded<T>(what: &str, op: impl Future<Output = T>) -> Result<T, TestCaseError> {
    tokio::time::timeout(BOUND, op)
        .await
        .map_err(|_| TestCaseError::fail(format!("{what} did not return within {BOUND:?}")))
}

/// Every operation on a client built from `s`: none panics, each returns within the bound
/// (`lock` on a busy name is cut short by an outer timeout, which must drop it cleanly).
async fn exercise(
    redlock: &Redlock,
    holder: &Redlock,
    s: &Settings,
    case: usize,
) -> Result<(), TestCaseError> {
    let name = if s.name.is_empty() {
        format!("prop-{case}").into_bytes()
    } else {
        s.name.clone()
    };
    let _ = bounded(
        "try_lock_with_ttl",
        redlock.try_lock_with_ttl(&name, s.call_ttl),
    )
    .await?;
    if let Ok(mut lock) = bounded("try_lock", redlock.try_lock(&name)).await? {
        let _ = bounded("extend", redlock.extend(&mut lock, s.call_ttl)).await?;
        let _ = bounded("unlock", redlock.unlock(&lock)).await?;
    }
    // A busy name: `lock` waits; an outer timeout cuts it short.
    let busy = format!("busy-{case}");
    let held = bounded("holder lock", holder.try_lock(&busy)).await?;
    let _ = tokio::time::timeout(Duration::from_millis(150), redlock.lock(&busy)).await;
    if let Ok(held) = held {
        let _ = holder.unlock(&held).await;
    }
    // A guard: extends in the background, releases within the bound.
    if let Ok(lock) = bounded("guarded lock", redlock.try_lock(&name)).await? {
        let guard = redlock.guard(lock);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = guard.token().is_held();
        let _ = bounded("guard release", guard.release()).await?;
    }
    Ok(())
}

#[test]
fn no_setting_panics_or_hangs() {
    count_panics();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let cluster = Cluster::start(3);
    let holder = runtime.block_on(cluster.client(|b| b.ttl(Duration::from_secs(2))));
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let case = AtomicUsize::new(0);
    let (built, refused) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let result = runner.run(&settings(), |s| {
        let n = case.fetch_add(1, Ordering::SeqCst);
        let builder = configure(support::builder(cluster.urls()), &s);
        match builder.build() {
            Err(e) => {
                // A typed error that names what is wrong.
                prop_assert!(!e.to_string().is_empty());
                refused.fetch_add(1, Ordering::SeqCst);
            }
            Ok(redlock) => {
                built.fetch_add(1, Ordering::SeqCst);
                runtime.block_on(exercise(&redlock, &holder, &s, n))?;
                drop(redlock);
            }
        }
        let panics = PANICS.load(Ordering::SeqCst);
        prop_assert_eq!(
            panics,
            0,
            "a panic: {}",
            LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default()
        );
        Ok(())
    });
    println!(
        "{} configurations built and exercised, {} refused by build()",
        built.load(Ordering::SeqCst),
        refused.load(Ordering::SeqCst)
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(built.load(Ordering::SeqCst) > 0, "no configuration built");
}
