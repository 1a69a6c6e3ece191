//! What the benchmarks share: environment settings, Redis CPU and flushing, percentiles
//! and medians, the counting allocator, and the machine and source description of a report.
#![allow(dead_code)]

use std::process::Command;

mod counting;

// Not every benchmark counts allocations (the layer benchmark's server runs as users run it).
#[allow(unused_imports)]
pub use counting::{Counting, allocations};

use redis::aio::MultiplexedConnection;

pub fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    let raw = std::env::var(name).ok()?;
    Some(
        raw.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={raw:?} is not a valid number")),
    )
}

/// `used_cpu_user + used_cpu_sys` summed over the nodes, in µs.
pub async fn redis_cpu_us(conns: &mut [MultiplexedConnection]) -> f64 {
    let mut total = 0.0;
    for conn in conns.iter_mut() {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(conn)
            .await
            .expect("INFO cpu");
        for line in info.lines() {
            if let Some(v) = line
                .strip_prefix("used_cpu_user:")
                .or_else(|| line.strip_prefix("used_cpu_sys:"))
            {
                total += v.trim().parse::<f64>().expect("INFO cpu field is a number") * 1e6;
            }
        }
    }
    total
}

pub async fn flush_all(conns: &mut [MultiplexedConnection]) {
    for conn in conns.iter_mut() {
        let () = redis::cmd("FLUSHALL")
            .query_async(conn)
            .await
            .expect("FLUSHALL");
    }
}

/// User + system CPU of this process so far (`getrusage(RUSAGE_SELF)`), in µs.
pub fn process_cpu_us() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass; no other memory is touched.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        let rc = libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        assert_eq!(rc, 0, "getrusage failed");
        usage
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Nearest-rank percentile of nanosecond samples, in µs.
pub fn percentile_us(sorted_ns: &[u64], p: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted_ns.len() as f64).ceil() as usize;
    sorted_ns[rank.clamp(1, sorted_ns.len()) - 1] as f64 / 1e3
}

/// The lowest and the highest of `values` (infinities for none).
pub fn range(values: &[f64]) -> (f64, f64) {
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (low, high)
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

pub fn command_output(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| format!("({cmd} unavailable)"))
}

pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_owned();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or("unknown memory".to_owned(), |kb| {
            format!("{:.1} GiB RAM", kb / 1024.0 / 1024.0)
        });
    format!(
        "{} cores (`nproc`), {model}, {mem}",
        command_output("nproc", &[])
    )
}

pub fn fmt_num(v: f64) -> String {
    if v.is_nan() {
        "—".to_owned()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The repository's root: the benches' package sits in its benches/.
pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// `path` as given, or, when relative, under the repository's root (cargo runs a bench
/// in its package's directory, benches/, where a path such as `target/report.md` would
/// land otherwise).
pub fn repo_path(path: &str) -> String {
    if std::path::Path::new(path).is_absolute() {
        path.to_owned()
    } else {
        format!("{REPO}/{path}")
    }
}

/// tower-redlock's version, from its manifest (the benches' package is 0.0.0): the first
/// `version = "..."` line, its `[package]`'s.
fn crate_version() -> &'static str {
    include_str!("../../Cargo.toml")
        .lines()
        .find_map(|line| line.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or("(unknown version)")
}

/// The commit the benchmark was built from, and whether src/ differed from it (at start).
pub fn source_state() -> String {
    let repo = REPO;
    let commit = command_output("git", &["-C", repo, "rev-parse", "--short", "HEAD"]);
    let dirty = Command::new("git")
        .args(["-C", repo, "status", "--porcelain", "--", "src"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| !o.stdout.is_empty());
    if dirty {
        format!("commit {commit} + uncommitted changes in src/")
    } else {
        format!("commit {commit}")
    }
}

/// The command, date, machine and versions lines of a report; `peers` names the other
/// software measured (with its version).
pub fn context_lines(w: &mut String, command: &str, source: &str, peers: &str, redis_bin: &str) {
    use std::fmt::Write as _;
    let _ = writeln!(w, "- command: {command}");
    let _ = writeln!(
        w,
        "- date: {}",
        command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
    );
    let _ = writeln!(w, "- machine: {}", machine());
    let _ = writeln!(
        w,
        "- versions: tower-redlock {} ({source}), {peers}, {}, {}",
        crate_version(),
        command_output(redis_bin, &["--version"]),
        command_output("rustc", &["--version"]),
    );
}
