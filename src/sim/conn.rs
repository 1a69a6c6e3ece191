//! A client's connection to a simulated server, as redis-rs's `ConnectionLike`, so that
//! the crate's own calls (`Call::run`, the ledger's reads and swaps) run on it unchanged;
//! the network between them ([`Link`]): latency each way, a partition, lost replies.
//! A connection to a process that has since restarted is broken.
//!
//! ```text
//! request --(latency)--> partitioned? never arrives : server.exec --(latency)--> reply lost? never answers
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::server::Server;

/// The network between one client and one server.
#[derive(Debug, Default)]
pub(crate) struct Link {
    /// Nothing gets through, either way.
    pub(crate) partitioned: AtomicBool,
    /// Replies are lost (requests still arrive and run).
    pub(crate) loses_replies: AtomicBool,
    /// One way's latency, in µs.
    pub(crate) latency_us: AtomicU64,
    /// The slow spells under way, and the latency to come back to after the last.
    pub(crate) slow: Mutex<(usize, u64)>,
    /// When the last request arrives, and the last reply: each way is in order, as TCP.
    last: Mutex<(Option<Instant>, Option<Instant>)>,
}

impl Link {
    /// When something sent now arrives (`back`: a reply), never before what was sent
    /// earlier the same way.
    fn arrival(&self, back: bool) -> Instant {
        let latency = Duration::from_micros(self.latency_us.load(Ordering::Relaxed));
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = if back { &mut last.1 } else { &mut last.0 };
        let at = (Instant::now() + latency).max(slot.unwrap_or_else(Instant::now));
        *slot = Some(at);
        at
    }
}

/// A connection to `server` over `link`, opened to the process of `generation`.
#[derive(Clone)]
pub(crate) struct SimConn {
    pub(crate) server: Arc<Mutex<Server>>,
    pub(crate) link: Arc<Link>,
    pub(crate) generation: u64,
}

/// The words of `cmd`.
fn words(cmd: &Cmd) -> Vec<Vec<u8>> {
    cmd.args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
            _ => None,
        })
        .collect()
}

impl SimConn {
    /// Runs `cmds` on the server as one request: their replies, once back.
    async fn request(&self, cmds: Vec<Vec<Vec<u8>>>) -> redis::RedisResult<Vec<Value>> {
        tokio::time::sleep_until(self.link.arrival(false)).await;
        if self.link.partitioned.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        let replies = {
            let mut server = self.server.lock().unwrap_or_else(PoisonError::into_inner);
            if server.generation() != self.generation {
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into());
            }
            cmds.iter().map(|c| server.exec(c)).collect()
        };
        tokio::time::sleep_until(self.link.arrival(true)).await;
        if self.link.partitioned.load(Ordering::Relaxed)
            || self.link.loses_replies.load(Ordering::Relaxed)
        {
            std::future::pending::<()>().await;
        }
        Ok(replies)
    }
}

impl ConnectionLike for SimConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut replies = self.request(vec![words(cmd)]).await?;
            Ok(replies.pop().unwrap_or(Value::Nil))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let cmds = pipeline.cmd_iter().map(words).collect();
            let replies = self.request(cmds).await?;
            Ok(replies.into_iter().skip(offset).take(count).collect())
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
