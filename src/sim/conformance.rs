//! Honest nodes: the commands the simulation's clients sent to its servers (the crate's
//! own commands and scripts, recorded while schedules play) are played again, one by one,
//! against a real `redis-server` (`REDIS_SERVER`, or the one on the PATH; `scripts/test`
//! runs it on Valkey too) and against a fresh simulated server; every reply and, after
//! every command, every key's type, value and TTL must agree.
//!
//! ```text
//! schedules (seeds 0..) -> each server's commands -> real: reply, keys == sim: reply, keys
//! ```

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionLike;

use super::server::{self, Server};
use super::world::{Plan, play};

/// A `redis-server` on a free loopback port, killed when dropped.
struct Real {
    child: Child,
    port: u16,
}

impl Real {
    fn start() -> Self {
        let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free port");
            let child = Command::new(&binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "{binary} did not start ({e}): the conformance test needs a real \
                         Redis; install redis-server (scripts/test does) or set REDIS_SERVER"
                    )
                });
            let mut real = Self { child, port };
            for _ in 0..200 {
                if real.ping() {
                    return real;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = real.child.kill();
        }
        panic!("{binary} did not answer on any of 5 ports");
    }

    fn ping(&self) -> bool {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.port))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .is_ok()
    }
}

impl Drop for Real {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A reply as compared: an error by its code only, integers that may be TTLs (3 ms to
/// about four months on both sides; the flags and counts the crate's commands answer are
/// 0, 1 or 2) to within 50 ms (the two servers run a few ms apart at most), the rest
/// exactly.
fn agree(real: &Value, sim: &Value) -> bool {
    match (real, sim) {
        (Value::ServerError(a), Value::ServerError(b)) => a.code() == b.code(),
        (Value::Int(a), Value::Int(b)) if (3..10_000_000_000).contains(a) && *b >= 3 => {
            a.abs_diff(*b) <= 50
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| agree(x, y))
        }
        (Value::SimpleString(a), Value::Okay) | (Value::Okay, Value::SimpleString(a)) => a == "OK",
        _ => real == sim,
    }
}

/// What `cmd` does to compare: not `INFO` nor `TIME` (the process and the clock differ),
/// nor `SCRIPT` (both load what they are sent).
fn compared(cmd: &[Vec<u8>]) -> bool {
    !matches!(
        cmd.first().map(|c| c.to_ascii_uppercase()).as_deref(),
        Some(b"INFO" | b"TIME")
    )
}

fn command(words: &[Vec<u8>]) -> redis::Cmd {
    let mut cmd = redis::Cmd::new();
    for w in words {
        cmd.arg(w.as_slice());
    }
    cmd
}

/// Every key of the real server: name, type, value, TTL.
async fn real_keys(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(Vec<u8>, Value, i64)> {
    let mut names: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query_async(conn)
        .await
        .expect("KEYS");
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let kind: String = redis::cmd("TYPE")
            .arg(&name)
            .query_async(conn)
            .await
            .expect("TYPE");
        let mut read = if kind == "zset" {
            redis::cmd("ZRANGE")
        } else {
            redis::cmd("GET")
        };
        read.arg(&name);
        if kind == "zset" {
            read.arg(0).arg(-1).arg("WITHSCORES");
        }
        let value: Value = read.query_async(conn).await.expect("the key's value");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&name)
            .query_async(conn)
            .await
            .expect("PTTL");
        // Listed, then expired before it was read: gone.
        if ttl != -2 {
            out.push((name, value, ttl));
        }
    }
    out
}

/// Whether two servers' keys agree, read `slack` ms apart: the same names, values and
/// TTLs (within `slack`), but a key about to expire (within `slack`) may be on one side
/// only.
fn same_keys(real: &[(Vec<u8>, Value, i64)], sim: &[(Vec<u8>, Value, i64)], slack: u64) -> bool {
    let expiring = |t: i64| t >= 0 && t.unsigned_abs() <= slack;
    let find = |keys: &[(Vec<u8>, Value, i64)], name: &[u8]| {
        keys.iter().find(|(n, _, _)| n == name).cloned()
    };
    let one_way = |from: &[(Vec<u8>, Value, i64)], to: &[(Vec<u8>, Value, i64)]| {
        from.iter().all(|(name, value, ttl)| match find(to, name) {
            Some((_, other, other_ttl)) => {
                agree(value, &other)
                    && (*ttl == other_ttl || (*ttl >= 0 && ttl.abs_diff(other_ttl) <= slack))
            }
            None => expiring(*ttl),
        })
    };
    one_way(real, sim) && one_way(sim, real)
}

/// Plays `commands` on `real` (flushed first) and on a fresh simulated server: the first
/// disagreement, if any.
async fn replay(
    conn: &mut redis::aio::MultiplexedConnection,
    commands: &[server::Words],
) -> Option<String> {
    let _: () = redis::cmd("FLUSHALL")
        .query_async(conn)
        .await
        .expect("FLUSHALL");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(conn)
        .await
        .expect("SCRIPT FLUSH");
    let mut sim = Server::new(0, Duration::ZERO);
    for (i, words) in commands.iter().enumerate() {
        let sim_reply = sim.exec(words);
        let real_reply = conn
            .req_packed_command(&command(words))
            .await
            .unwrap_or_else(|e| panic!("the real server failed on {words:?}: {e}"));
        let shown = || {
            words
                .iter()
                .map(|w| String::from_utf8_lossy(w))
                .collect::<Vec<_>>()
        };
        if compared(words) && !agree(&real_reply, &sim_reply) {
            return Some(format!(
                "command {i} {:?}: real {real_reply:?}, simulated {sim_reply:?}",
                shown()
            ));
        }
        // The keys are read on the real server first: a key may expire on one side in
        // between (within `slack`), and the TTLs differ by as much.
        let read = std::time::Instant::now();
        let real = real_keys(conn).await;
        let simulated = sim.keys_now();
        let slack = u64::try_from(read.elapsed().as_millis()).unwrap_or(u64::MAX) + 50;
        let same = same_keys(&real, &simulated, slack);
        if !same {
            return Some(format!(
                "after command {i} {:?}: real keys {real:?}, simulated {simulated:?}",
                shown()
            ));
        }
    }
    None
}

/// The commands of schedules 0 to 14 (every kind of fault, fenced and not), played on a
/// real server and a simulated one, agree reply by reply and key by key.
#[test]
fn the_simulated_server_answers_as_a_real_one() {
    let real = Real::start();
    let logs: Vec<Vec<server::Words>> = (0..15)
        .flat_map(|seed| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("a runtime");
            server::record(true);
            rt.block_on(play(&Plan::of(seed)));
            server::recorded()
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", real.port)).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let mut played = 0;
        for log in &logs {
            if let Some(differs) = replay(&mut conn, log).await {
                panic!("{differs}");
            }
            played += log.len();
        }
        assert!(played > 1_000, "only {played} commands recorded");
    });
}
