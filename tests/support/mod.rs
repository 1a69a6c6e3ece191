//! Test harness: real `redis-server` processes on free loopback ports, and small TCP
//! helpers (a fault proxy, a server that speaks garbage).
//!
//! Nodes start with `--save "" --appendonly no`, are waited for until they answer `PING`,
//! can be paused (SIGSTOP), resumed, killed and restarted on the same port (with their data
//! gone), and are killed when the [`Cluster`] is dropped, on panics too. They also die with
//! the test process (`PR_SET_PDEATHSIG`).
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod cluster;
#[path = "../../examples/common/fenced.rs"]
pub mod fenced;
#[cfg(feature = "axum")]
pub mod http;
pub mod jepsen;
pub mod proxy;
pub mod sentinel;
pub mod tls;

pub use proxy::{FaultProxy, Mode};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A client builder for nodes the harness started a moment ago, empty: with the restart
/// quarantine off, since it would keep such young nodes out of acquisitions for a TTL.
/// The quarantine's own tests use `Redlock::builder`.
pub fn builder<I, S>(nodes: I) -> tower_redlock::RedlockBuilder
where
    I: IntoIterator<Item = S>,
    S: Into<tower_redlock::NodeConfig>,
{
    tower_redlock::Redlock::builder(nodes).restart_quarantine(false)
}

/// The lock name a layer in namespace `namespace` takes for its extractor's `name`: the
/// namespace, a space, the name (`RedlockLayer::namespace`; the namespace as given, with
/// no space or `%` to escape).
pub fn in_namespace(namespace: &str, name: &str) -> String {
    format!("{namespace} {name}")
}

/// The lock name a layer keyed by the header `header` takes for the key `key`: in the
/// header's namespace, `header:{lower-case name}`.
pub fn header_lock(header: &str, key: &str) -> String {
    in_namespace(&format!("header:{}", header.to_ascii_lowercase()), key)
}

/// The Redis key of lock name `name` under the default key prefix, `redlock:{name}` (for
/// names the key does not hash: up to 256 bytes, not starting with `}`).
pub fn key_of(name: &str) -> String {
    format!("redlock:{{{name}}}")
}

fn redis_server_binary() -> PathBuf {
    if let Ok(p) = std::env::var("REDIS_SERVER") {
        return PathBuf::from(p);
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = PathBuf::from(dir).join("redis-server");
        if p.is_file() {
            return p;
        }
    }
    for p in [
        "/usr/bin/redis-server",
        "/usr/local/bin/redis-server",
        "/usr/sbin/redis-server",
    ] {
        if std::path::Path::new(p).is_file() {
            return PathBuf::from(p);
        }
    }
    panic!(
        "redis-server not found: the tests need real Redis nodes. Install it with \
         `apt-get install -y redis-server` (or run scripts/test, which does), or set \
         REDIS_SERVER=/path/to/redis-server"
    );
}

/// Runs `cmd` on the server at `port` over a fresh blocking connection; `None` on any
/// failure (for polling a server's state).
pub fn query_port<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    cmd.query(&mut con).ok()
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// One `redis-server` process.
pub struct RedisNode {
    port: u16,
    child: Option<Child>,
    paused: bool,
    /// With a fake clock: the libfaketime timestamp file it reads on every clock call.
    clock_file: Option<PathBuf>,
    /// More `redis-server` arguments (TLS, for example), kept for restarts.
    extra: Vec<String>,
}

impl RedisNode {
    /// Starts a node on a free port (retrying on a port race).
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts a replica of the node on `master_port` (on a free port), in sync when this
    /// returns.
    pub fn start_replica_of(master_port: u16) -> Self {
        let replica = Self::start_with_args(
            None,
            vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                master_port.to_string(),
            ],
        );
        // In sync before it is used: a replica promoted or read before its first sync
        // holds none of the master's keys (not even the ledger).
        wait_blocking("the replica in sync", Duration::from_secs(20), || {
            query_port::<String>(replica.port(), redis::cmd("INFO").arg("replication"))
                .is_some_and(|i| i.contains("master_link_status:up"))
        });
        replica
    }

    /// Starts a node whose wall clock can be moved with [`set_clock_offset`]
    /// (libfaketime, from Debian's `faketime` package).
    ///
    /// [`set_clock_offset`]: Self::set_clock_offset
    pub fn start_with_fake_clock() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let file = std::env::temp_dir().join(format!(
            "redlock-test-clock-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&file, "+0\n").expect("write the clock file");
        Self::start_with(Some(file))
    }

    fn start_with(clock_file: Option<PathBuf>) -> Self {
        Self::start_with_args(clock_file, Vec::new())
    }

    /// Starts a node with more `redis-server` arguments; `{port}` in them is replaced by
    /// a second free port (for `--tls-port`). The plain port stays open for the harness.
    pub fn start_with_args(clock_file: Option<PathBuf>, extra: Vec<String>) -> Self {
        for _ in 0..5 {
            let port = free_port();
            let second = free_port().to_string();
            let extra: Vec<String> = extra.iter().map(|a| a.replace("{port}", &second)).collect();
            if let Some(child) = spawn_on(port, clock_file.as_deref(), &extra) {
                return Self {
                    port,
                    child: Some(child),
                    paused: false,
                    clock_file,
                    extra,
                };
            }
        }
        panic!("could not start redis-server on a free port after 5 tries");
    }

    /// The value of an extra argument, such as `--tls-port`.
    pub fn arg(&self, name: &str) -> Option<&str> {
        let i = self.extra.iter().position(|a| a == name)?;
        self.extra.get(i + 1).map(String::as_str)
    }

    /// Moves the node's wall clock to `offset` seconds from the real time (at once: the
    /// node reads the offset on every clock call). Only for nodes from
    /// [`start_with_fake_clock`](Self::start_with_fake_clock).
    pub fn set_clock_offset(&self, offset_secs: i64) {
        let file = self.clock_file.as_ref().expect("a node with a fake clock");
        std::fs::write(file, format!("{offset_secs:+}\n")).expect("write the clock file");
    }

    /// The node's `uptime_in_seconds`.
    pub fn uptime_secs(&self) -> Option<u64> {
        info_field(self.port, "uptime_in_seconds")?.parse().ok()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> i32 {
        self.child
            .as_ref()
            .map(|c| c.id() as i32)
            .expect("node is running")
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({sig}) failed");
    }

    /// SIGSTOP: the node keeps its connections but answers nothing.
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.paused = true;
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.paused = false;
    }

    /// SIGKILL and reap: connections are reset, the port refuses.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.paused = false;
    }

    /// Kills (if running) and starts again on the same port, with no data.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = spawn_on(self.port, self.clock_file.as_deref(), &self.extra) {
                self.child = Some(child);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "could not restart redis on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Gives the node the ledger a client would have made long ago (see [`age_ledger`]).
    pub fn age_ledger(&self) {
        assert!(
            age_ledger(self.port).is_some(),
            "the ledger on {}",
            self.port
        );
    }
}

/// Writes on the node at `port` the ledger (under the default key prefix) that the
/// restart quarantine's first client would have made long ago: its last loss at the Unix
/// epoch, naming the server that runs there now. A node in service since long before the
/// test, as far as the quarantine can tell; `None` if the node did not answer.
pub fn age_ledger(port: u16) -> Option<()> {
    age_ledger_at(port, b"redlock:#ledger")
}

/// [`age_ledger`] at `key` (a Redis Cluster shard's ledger is in its lowest slot); the
/// node's replicas, if any, have it when this returns.
pub fn age_ledger_at(port: u16, key: &[u8]) -> Option<()> {
    let server: String = query_port(port, redis::cmd("INFO").arg("server"))?;
    let replication: String = query_port(port, redis::cmd("INFO").arg("replication"))?;
    let field = |info: &str, name: &str| {
        info.lines()
            .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
            .map(str::to_owned)
    };
    let run = field(&server, "run_id")?;
    let repl = field(&replication, "master_replid")?;
    let replicas: u32 = field(&replication, "connected_slaves")?.parse().ok()?;
    let value = format!("1 aged{port} 0 empty {run} {repl}");
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    // WAIT on the connection that wrote: until the replicas have the ledger.
    let (_, acked): ((), u32) = redis::pipe()
        .cmd("SET")
        .arg(key)
        .arg(value)
        .cmd("WAIT")
        .arg(replicas)
        .arg(15_000)
        .query(&mut con)
        .ok()?;
    (acked >= replicas).then_some(())
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        if self.paused
            && let Some(c) = &self.child
        {
            // SAFETY: as in `signal`.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
        }
        self.kill();
        if let Some(file) = &self.clock_file {
            let _ = std::fs::remove_file(file);
        }
        let dump = format!("redlock-test-{}-{}.rdb", std::process::id(), self.port);
        let _ = std::fs::remove_file(std::env::temp_dir().join(dump));
    }
}

/// The paths to preload for a fake clock: our glibc-malloc shim (built once with `cc`),
/// then libfaketime.
fn faketime_preload() -> String {
    static PRELOAD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PRELOAD
        .get_or_init(|| {
            let lib = std::env::var("LIBFAKETIME")
                .map(PathBuf::from)
                .ok()
                .or_else(|| {
                    [
                        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                        "/usr/lib/faketime/libfaketime.so.1",
                        "/usr/lib64/faketime/libfaketime.so.1",
                    ]
                    .iter()
                    .map(PathBuf::from)
                    .find(|p| p.is_file())
                });
            let lib = lib.unwrap_or_else(|| {
                panic!(
                    "libfaketime not found: install it with `apt-get install -y faketime` (or \
                     run scripts/test, which does), or set LIBFAKETIME=/path/to/libfaketime.so.1"
                )
            });
            let dir = option_env!("CARGO_TARGET_TMPDIR")
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir);
            let shim = dir.join(format!("libc_malloc-{}.so", std::process::id()));
            let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/libc_malloc.c");
            let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .arg(&shim)
                .arg(src)
                .arg("-ldl")
                .status()
                .unwrap_or_else(|e| panic!("cannot run cc to build the malloc shim: {e}"));
            assert!(status.success(), "cc failed to build {src}");
            format!("{} {}", shim.display(), lib.display())
        })
        .clone()
}

/// Runs test `test` of module `module` (its `module_path!()`) of this test binary in a
/// child process whose wall clock libfaketime shifts by `offset` (libfaketime's `FAKETIME`
/// format: `-9.9` is 9.9 s behind), with `env` set: a second client process with a skewed
/// clock. Its standard output, once it passed (it panics with the child's output if the
/// child failed).
pub fn run_skewed_child(module: &str, test: &str, offset: &str, env: &[(&str, String)]) -> String {
    // libtest names a test by its path without the binary's own name.
    let test = match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_owned(),
    };
    let test = test.as_str();
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            test,
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("LD_PRELOAD", faketime_preload())
        .env("FAKETIME", offset)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run the test binary as a child process");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the child {test} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Starts redis-server on `port` and waits until it answers PING; `None` if it exited
/// (port taken).
fn spawn_on(port: u16, clock_file: Option<&std::path::Path>, extra: &[String]) -> Option<Child> {
    let bin = redis_server_binary();
    let mut cmd = Command::new(&bin);
    if let Some(file) = clock_file {
        cmd.env("LD_PRELOAD", faketime_preload())
            .env("FAKETIME_TIMESTAMP_FILE", file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
    // Each node has its own dump file, removed first: a replica's full sync writes one,
    // and a node must never start with another's data.
    let dump = format!("redlock-test-{}-{port}.rdb", std::process::id());
    let _ = std::fs::remove_file(std::env::temp_dir().join(&dump));
    cmd.args([
        "--dbfilename",
        &dump,
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
        // A replica's full sync starts at once (Redis 7 waits 5 s for more replicas).
        "--repl-diskless-sync-delay",
        "0",
        "--dir",
        &std::env::temp_dir().to_string_lossy(),
    ])
    .args(extra)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    // SAFETY: prctl in the child before exec; async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        match server_pid(port) {
            Some(pid) if pid == child.id() => return Some(child),
            // Another test's server answers on this port: ours will exit.
            Some(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            None => {}
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redis-server on port {port} did not answer PING within {START_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The `process_id` of the server answering on `port`, if one answers.
fn server_pid(port: u16) -> Option<u32> {
    info_field(port, "process_id")?.parse().ok()
}

/// One field of `INFO server` from the server answering on `port`.
fn info_field(port: u16, field: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(b"INFO server\r\n").ok()?;
    let key = format!("\n{field}:");
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    while !text
        .find(&key)
        .is_some_and(|at| text[at + 1..].contains('\n'))
    {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let rest = &text[text.find(&key)? + key.len()..];
    Some(rest[..rest.find('\r')?].trim().to_owned())
}

/// N nodes, killed on drop.
pub struct Cluster {
    pub nodes: Vec<RedisNode>,
}

impl Cluster {
    pub fn start(n: usize) -> Self {
        Self {
            nodes: (0..n).map(|_| RedisNode::start()).collect(),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::url).collect()
    }

    /// Gives every node the ledger a client would have made long ago (see
    /// [`age_ledger`]): nodes in service since long before the test, so that only a
    /// failover, a restart or a flush can keep one out.
    pub fn age_ledgers(&self) {
        for node in &self.nodes {
            node.age_ledger();
        }
    }

    /// A client over these nodes, built by `configure` from [`builder`] and warmed up
    /// (see [`warm`]).
    pub async fn client(
        &self,
        configure: impl FnOnce(tower_redlock::RedlockBuilder) -> tower_redlock::RedlockBuilder,
    ) -> tower_redlock::Redlock {
        self.client_over("", configure).await
    }

    /// [`client`](Self::client) with `tail` after each node's URL: `/?protocol=resp3` for
    /// redis-rs's connections instead of the client's own.
    pub async fn client_over(
        &self,
        tail: &str,
        configure: impl FnOnce(tower_redlock::RedlockBuilder) -> tower_redlock::RedlockBuilder,
    ) -> tower_redlock::Redlock {
        let urls = self.urls().into_iter().map(|u| format!("{u}{tail}"));
        let redlock = configure(builder(urls)).build().expect("build");
        warm(&redlock).await;
        redlock
    }

    /// A client for the layer's replay tests, warmed up: a 30 s TTL (no lock runs out
    /// mid-test) and a 200 ms node timeout (slow test machines).
    pub async fn replay_client(&self) -> tower_redlock::Redlock {
        self.client(|b| {
            b.ttl(Duration::from_secs(30))
                .node_timeout(Duration::from_millis(200))
        })
        .await
    }

    /// How many of the running nodes hold `key`.
    pub async fn nodes_holding(&self, key: impl AsRef<[u8]>) -> usize {
        let mut n = 0;
        for i in 0..self.nodes.len() {
            if !self.nodes[i].is_running() {
                continue;
            }
            let exists: bool = redis::AsyncCommands::exists(&mut self.raw(i).await, key.as_ref())
                .await
                .expect("EXISTS");
            n += usize::from(exists);
        }
        n
    }

    /// The string stored at `key` on node `i`.
    pub async fn get(&self, i: usize, key: impl AsRef<[u8]>) -> Option<String> {
        redis::AsyncCommands::get(&mut self.raw(i).await, key.as_ref())
            .await
            .expect("GET")
    }

    /// Resets the command statistics of every node (`CONFIG RESETSTAT`).
    pub async fn reset_stats(&self) {
        for i in 0..self.nodes.len() {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut self.raw(i).await)
                .await
                .expect("CONFIG RESETSTAT");
        }
    }

    /// How many times node `i` ran `command` (lower case) since the last reset, from
    /// `INFO commandstats`.
    pub async fn command_calls(&self, i: usize, command: &str) -> u64 {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.raw(i).await)
            .await
            .expect("INFO commandstats");
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// A plain redis client connection to node `i`, for checks behind the library's back.
    pub async fn raw(&self, i: usize) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.nodes[i].url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection")
    }
}

/// Log lines captured on the current thread (for tests on a current-thread runtime, whose
/// tasks all run there), until dropped.
pub struct CapturedLogs {
    buf: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

impl CapturedLogs {
    pub fn start() -> Self {
        Self::start_with(tracing_subscriber::fmt::format::FmtSpan::NONE)
    }

    /// Also logs span events (such as `FmtSpan::CLOSE`, with every recorded field).
    pub fn start_with(span_events: tracing_subscriber::fmt::format::FmtSpan) -> Self {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer = {
            let buf = std::sync::Arc::clone(&buf);
            move || LogWriter(std::sync::Arc::clone(&buf))
        };
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .with_span_events(span_events)
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        // Tests on other threads may have registered a callsite (as "never") while this
        // subscriber was being set up; recompute every callsite's interest with it.
        tracing::callsite::rebuild_interest_cache();
        Self { buf, _guard: guard }
    }

    pub fn contains(&self, needle: &str) -> bool {
        self.text().contains(needle)
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        let buf = self.buf.lock().expect("log buffer");
        String::from_utf8_lossy(&buf).into_owned()
    }
}

struct LogWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Acquires and releases once, so that every node is connected before anything is timed
/// or counted.
pub async fn warm(redlock: &tower_redlock::Redlock) {
    let lock = redlock.lock("warm-up").await.expect("warm-up lock");
    let report = redlock.unlock(&lock).await;
    assert!(
        report.released() >= redlock.quorum(),
        "warm-up released on {} nodes only",
        report.released()
    );
}

/// Waits until `cond` holds, polling every few ms, or panics with `what` at the deadline.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls `cond` from a blocking context until it holds, or panics after `timeout` naming
/// `what`.
pub fn wait_blocking(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A TCP server that answers every request with bytes that are not Redis (an HTTP
/// response unless told otherwise).
pub struct GarbageServer {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl GarbageServer {
    /// Answers every request with an HTTP response.
    pub async fn start() -> Self {
        Self::start_with(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await
    }

    /// Answers every request with `reply`.
    pub async fn start_with(reply: &'static [u8]) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {
                                if s.write_all(reply).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        Self { port, task }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for GarbageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
