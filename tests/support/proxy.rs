//! A TCP fault proxy in front of one node: pass, delay (fixed or random, per direction),
//! blackhole (a partition), one-way loss, and reset, switchable while the test runs.
//!
//! Held bytes are not dropped: a partition or a one-way loss holds them (and stops reading
//! more) until the mode changes, as TCP would retransmit them after a partition heals.
//! Dropping bytes from the middle of a stream would turn a network fault into a protocol
//! error, which real networks do not produce.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything at once.
    Pass,
    /// Delay every chunk by a time drawn uniformly from `[min, max]`, per direction.
    Delay {
        to_node: (Duration, Duration),
        to_client: (Duration, Duration),
    },
    /// A partition: new connections are not accepted and nothing is forwarded, either way.
    Blackhole,
    /// Requests reach the node; its replies are held back.
    LoseReplies,
    /// Requests are held back; replies to earlier requests still arrive.
    LoseRequests,
    /// Every connection is reset (RST), new ones as soon as they are accepted.
    Reset,
    /// Forward everything, but hide the node's `run_id` in its `INFO` replies (as some
    /// proxies and managed services do): `run_id:` becomes `run_xx:`, the same length.
    HideRunId,
}

impl Mode {
    /// The same fixed delay in both directions.
    pub fn delay(d: Duration) -> Self {
        Self::Delay {
            to_node: (d, d),
            to_client: (d, d),
        }
    }

    /// A random delay in `[min, max]` in both directions.
    pub fn random_delay(min: Duration, max: Duration) -> Self {
        Self::Delay {
            to_node: (min, max),
            to_client: (min, max),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToNode,
    ToClient,
}

/// A proxy on a free loopback port in front of `upstream`.
pub struct FaultProxy {
    pub port: u16,
    mode: Arc<watch::Sender<Mode>>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let mode = Arc::new(watch::Sender::new(Mode::Pass));
        let task = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&mode)));
        Self { port, mode, task }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> Mode {
        self.mode.borrow().clone()
    }

    /// The same fixed delay in both directions (zero: pass).
    pub fn set_delay(&self, d: Duration) {
        self.set(if d.is_zero() {
            Mode::Pass
        } else {
            Mode::delay(d)
        });
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        // Connections see the sender go and stop.
    }
}

async fn accept_loop(listener: TcpListener, upstream: String, mode: Arc<watch::Sender<Mode>>) {
    let mut rx = mode.subscribe();
    loop {
        // A partition accepts nothing: wait until it heals.
        while *rx.borrow_and_update() == Mode::Blackhole {
            if rx.changed().await.is_err() {
                return;
            }
        }
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = rx.changed() => continue,
        };
        let Ok((down, _)) = accepted else { continue };
        if *rx.borrow() == Mode::Reset {
            reset(&down);
            continue;
        }
        let Ok(up) = TcpStream::connect(&upstream).await else {
            reset(&down);
            continue;
        };
        let _ = down.set_nodelay(true);
        let _ = up.set_nodelay(true);
        let (dr, dw) = down.into_split();
        let (ur, uw) = up.into_split();
        tokio::spawn(pump(dr, uw, Dir::ToNode, mode.subscribe()));
        tokio::spawn(pump(ur, dw, Dir::ToClient, mode.subscribe()));
    }
}

/// Closes with RST rather than FIN once the socket is dropped.
fn reset(s: &TcpStream) {
    #[allow(deprecated)] // a zero linger never blocks on drop
    let _ = s.set_linger(Some(Duration::ZERO));
}

/// Resolves when the mode is `Reset` (or the proxy is gone).
async fn reset_ordered(mode: &mut watch::Receiver<Mode>) {
    loop {
        if *mode.borrow_and_update() == Mode::Reset {
            return;
        }
        if mode.changed().await.is_err() {
            return;
        }
    }
}

fn draw((min, max): (Duration, Duration)) -> Duration {
    if max <= min {
        return min;
    }
    let span = (max - min).as_micros() as u64 + 1;
    min + Duration::from_micros(getrandom::u64().unwrap_or(0) % span)
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    dir: Dir,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = reset_ordered(&mut mode) => {
                reset(from.as_ref());
                reset(to.as_ref());
                return;
            }
        };
        // Hold the chunk as long as the mode says so.
        loop {
            let current = mode.borrow_and_update().clone();
            let held = match current {
                Mode::Pass => false,
                Mode::HideRunId => {
                    if dir == Dir::ToClient {
                        hide_run_id(&mut buf[..n]);
                    }
                    false
                }
                Mode::Delay { to_node, to_client } => {
                    let range = if dir == Dir::ToNode {
                        to_node
                    } else {
                        to_client
                    };
                    tokio::time::sleep(draw(range)).await;
                    false
                }
                Mode::Blackhole => true,
                Mode::LoseReplies => dir == Dir::ToClient,
                Mode::LoseRequests => dir == Dir::ToNode,
                Mode::Reset => {
                    reset(from.as_ref());
                    reset(to.as_ref());
                    return;
                }
            };
            if !held {
                break;
            }
            if mode.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Replaces every `run_id:` in `chunk` by `run_xx:` (an `INFO` reply keeps its length).
fn hide_run_id(chunk: &mut [u8]) {
    const FIELD: &[u8] = b"run_id:";
    let mut at = 0;
    while let Some(i) = chunk[at..].windows(FIELD.len()).position(|w| w == FIELD) {
        chunk[at + i + 4..at + i + 6].copy_from_slice(b"xx");
        at += i + FIELD.len();
    }
}
