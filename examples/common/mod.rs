//! Shared by the examples: the Redis nodes to lock on.
//!
//! `REDLOCK_NODES` (comma-separated `redis://` URLs) names existing nodes; without it,
//! [`nodes_or_local`] starts throwaway `redis-server` processes on free loopback ports and
//! returns a guard that kills them when dropped.
#![allow(dead_code)]

pub mod fenced;
#[cfg(all(feature = "axum", feature = "webhook-verify"))]
pub mod webhook;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Any error, for `?` in the examples' `main`.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long a local node may take to answer `PING` after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Local `redis-server` processes, killed on drop (none when `REDLOCK_NODES` was used).
#[derive(Debug, Default)]
pub struct LocalNodes {
    children: Vec<Child>,
}

impl LocalNodes {
    /// How many local nodes were started.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether no local node was started (`REDLOCK_NODES` named the nodes).
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }
}

impl Drop for LocalNodes {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The node URLs from `REDLOCK_NODES`, or `n` freshly started local nodes.
pub fn nodes_or_local(n: usize) -> Result<(Vec<String>, LocalNodes), Error> {
    if let Ok(list) = std::env::var("REDLOCK_NODES") {
        let urls: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if urls.is_empty() {
            return Err(
                "REDLOCK_NODES is set but empty: give comma-separated redis:// URLs".into(),
            );
        }
        return Ok((urls, LocalNodes::default()));
    }
    let mut nodes = LocalNodes::default();
    let mut urls = Vec::with_capacity(n);
    for _ in 0..n {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| -> Error {
                if e.kind() == std::io::ErrorKind::NotFound {
                    "redis-server is not installed: run `apt-get install -y redis-server`, \
                     or set REDLOCK_NODES to comma-separated redis:// URLs"
                        .into()
                } else {
                    format!("could not start redis-server: {e}").into()
                }
            })?;
        nodes.children.push(child);
        wait_for_pong(port)?;
        urls.push(format!("redis://127.0.0.1:{port}"));
    }
    Ok((urls, nodes))
}

/// Waits until the node on `port` answers `PING`, up to [`START_TIMEOUT`].
fn wait_for_pong(port: u16) -> Result<(), Error> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if ping(port).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("redis-server on port {port} did not answer PING").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ping(port: u16) -> std::io::Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    s.write_all(b"PING\r\n")?;
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf)?;
    if &buf == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(std::io::Error::other("unexpected reply to PING"))
    }
}

/// Whether the client should quarantine restarted and recently started nodes: not for
/// nodes this program started itself a moment ago (empty, nothing to protect); otherwise
/// on, unless `REDLOCK_RESTART_QUARANTINE=off` (as `scripts/demo` sets for the nodes it
/// has just started).
pub fn restart_quarantine(local: &LocalNodes) -> bool {
    local.is_empty()
        && !matches!(
            std::env::var("REDLOCK_RESTART_QUARANTINE").as_deref(),
            Ok("off" | "0" | "false")
        )
}

/// Prints which nodes an example locks on.
pub fn print_nodes(redlock: &tower_redlock::Redlock, urls: &[String]) {
    println!(
        "{} redis nodes (quorum {}): {}",
        redlock.node_count(),
        redlock.quorum(),
        urls.join(", ")
    );
}

/// Awaits tasks that each return a line starting with its completion time, and prints
/// the lines in order of completion under `title`. Returns them.
pub async fn print_in_completion_order(
    title: &str,
    tasks: Vec<tokio::task::JoinHandle<Result<String, Error>>>,
) -> Result<Vec<String>, Error> {
    let mut lines = Vec::with_capacity(tasks.len());
    for task in tasks {
        lines.push(task.await??);
    }
    lines.sort(); // each line starts with its completion time, padded
    println!("\n{} {title}, in order of completion:", lines.len());
    for line in &lines {
        println!("  {line}");
    }
    Ok(lines)
}
