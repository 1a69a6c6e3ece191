//! Judging a node from one read: its ledger and horizon, read with `INFO` in the same
//! request (the connect's handshake, every check), handed to the judge of [`loss`]; the
//! ledger swapped on the node when the verdict changed it (and judged again over what
//! another client swapped in first); the verdict kept in the node's state.
//!
//! ```text
//! read:   INFO server | INFO replication | ... | GET <prefix>#ledger | EVAL raise <prefix>#horizon ttl
//! judge:  loss::judge(ledger, info, node's clock, horizon, fresh epoch)
//! swap:   EVAL swap <prefix>#ledger <read> <judged>     (only when it changed)
//! keep:   NodeLoss::read -> the quarantine, the same moment on every client
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Every connect and every check judges its node; health() shows the verdict.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! println!("{:?}", redlock.health().await.nodes()[0].status());
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redis::{RedisResult, Value};

use super::loss::ledger::Why;
use super::loss::{self, Horizon, Ledger, LedgerKeys, News, NodeLoss, Role, Seen, ServerInfo};
use super::{Conn, Node, NodeState};
use crate::error::NodeError;

/// What a read of a node's ledger found (before the judge).
#[derive(Debug, Clone)]
pub(crate) struct LedgerRead {
    /// The ledger's value (`None`: no ledger).
    pub(crate) value: Option<Vec<u8>>,
    /// The node's horizon after the raise, in ms.
    pub(crate) horizon_ms: u64,
}

impl LedgerRead {
    /// The replies to [`LedgerKeys::read_into`]'s two commands (`GET`, the raise).
    pub(crate) fn parse(
        get: Option<RedisResult<Value>>,
        raise: Option<RedisResult<Value>>,
    ) -> Result<Self, NodeError> {
        let reply = |r: Option<RedisResult<Value>>| match r {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(ledger_refused(&e.to_string())),
            None => Err(NodeError::Protocol("the ledger read got no reply".into())),
        };
        let value = loss::ledger::read_value(&reply(get)?).map_err(|e| ledger_refused(&e))?;
        let horizon_ms =
            loss::ledger::horizon_value(&reply(raise)?).map_err(|e| ledger_refused(&e))?;
        Ok(Self { value, horizon_ms })
    }
}

/// The error of a node that refused its ledger's commands (`why`).
pub(super) fn ledger_refused(why: &str) -> NodeError {
    NodeError::Redis(
        format!(
            "the restart quarantine keeps a ledger on each node (<key prefix>#ledger and \
             <key prefix>#horizon, read and written by GET, SET and EVAL), which the server \
             refused: grant them to the user, or turn restart_quarantine off ({why})"
        )
        .into(),
    )
}

/// A judged read: the ledger the node holds now, and the node's clock when it was read.
#[derive(Debug, Clone)]
pub(crate) struct Settled {
    pub(crate) ledger: Ledger,
    pub(crate) now_ms: u64,
    pub(crate) read_at: Instant,
    pub(crate) horizon_ms: u64,
}

/// The node's clock in ms from what `INFO` said, or, when it did not tell, this
/// client's wall clock (an estimate: ledgers then carry the client's clock).
pub(super) fn node_time_ms(info: &ServerInfo) -> u64 {
    info.time_ms().unwrap_or_else(crate::clock::wall_ms)
}

/// What the `INFO` replies that open a check's request ([`check_pipe`]) say, taken off
/// `replies`: the server, replication and persistence fields, and `INFO memory`'s text
/// (a reply that failed reads as empty).
pub(crate) fn check_info(
    replies: &mut impl Iterator<Item = RedisResult<Value>>,
) -> (ServerInfo, String) {
    let mut text = || {
        replies
            .next()
            .and_then(Result::ok)
            .and_then(|v| redis::from_redis_value::<String>(v).ok())
            .unwrap_or_default()
    };
    let (server, replication, persistence, memory) = (text(), text(), text(), text());
    let info = ServerInfo::parse([server.as_str(), replication.as_str(), persistence.as_str()]);
    (info, memory)
}

/// Raises the horizon at `keys` to `ttl_ms` over `conn` (node `index`'s, quarantined or
/// not) and keeps the node's answer in `horizon`.
pub(crate) async fn raise_horizon<C: redis::aio::ConnectionLike>(
    (keys, conn): (&LedgerKeys, &mut C),
    ttl_ms: u64,
    horizon: &Horizon,
    index: usize,
) -> Result<(), NodeError> {
    let reply: Value = keys
        .raise(ttl_ms)
        .query_async(conn)
        .await
        .map_err(NodeError::from)?;
    let ms = loss::ledger::horizon_value(&reply).map_err(|e| ledger_refused(&e))?;
    horizon.heard(index, ms, crate::clock::now());
    Ok(())
}

/// Keeps `settled`, a judged read of node `index`, in `loss` (the node's, or a cluster
/// shard's) and the node's horizon in `horizon`: a loss this client did not know of,
/// with the quarantine that follows from it.
pub(crate) fn keep(
    horizon: &Horizon,
    index: usize,
    loss: &mut NodeLoss,
    settled: &Settled,
) -> Option<(Why, Duration)> {
    horizon.heard(index, settled.horizon_ms, settled.read_at);
    match loss.read(&settled.ledger, settled.now_ms, settled.read_at) {
        News::Loss(why) => {
            let left = loss.quarantine(crate::clock::now(), horizon);
            left.map(|(left, _)| (why, left))
        }
        News::None => None,
    }
}

/// A check's request: `INFO server`, `INFO replication`, `INFO persistence`, `INFO
/// memory`, and with `ledger` (its keys, and this client's own horizon) the ledger's
/// read and the horizon's raise.
pub(crate) fn check_pipe(ledger: Option<(&LedgerKeys, u64)>) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for section in ["server", "replication", "persistence", "memory"] {
        pipe.cmd("INFO").arg(section);
    }
    if let Some((keys, own_ms)) = ledger {
        keys.read_into(&mut pipe, own_ms);
    }
    pipe
}

/// How many times a judgement is made again over a ledger another client swapped in
/// first, before giving up.
const SWAPS: usize = 4;

/// Judges `read` (with `info`, and the `run_id` this client knew there, whose reply arrived
/// at `read_at`: the node's clock is at most that old then, the long side for a loss's
/// age; under a horizon of `horizon`) and swaps the node's ledger at `keys` for the judged
/// one through `send` when it changed. A swap refused by the server is the ledger's error;
/// a broken connection is the connection's.
pub(crate) async fn settle<F, Fut>(
    keys: &LedgerKeys,
    (info, known_run): (&ServerInfo, Option<&str>),
    read: LedgerRead,
    (read_at, horizon): (Instant, Duration),
    mut send: F,
) -> Result<Settled, NodeError>
where
    F: FnMut(redis::Cmd) -> Fut,
    Fut: Future<Output = RedisResult<Value>>,
{
    let now_ms = node_time_ms(info);
    let epoch = loss::fresh_epoch()
        .ok_or_else(|| NodeError::Connection("the OS gave no random bytes for an epoch".into()))?;
    let mut value = read.value;
    for _ in 0..SWAPS {
        let judgement = loss::judge(&Seen {
            ledger: value.as_deref(),
            info,
            now_ms,
            horizon: horizon.max(Duration::from_millis(read.horizon_ms)),
            known_run,
            fresh_epoch: &epoch,
        });
        let settled = |ledger| Settled {
            ledger,
            now_ms,
            read_at,
            horizon_ms: read.horizon_ms,
        };
        if !judgement.write {
            return Ok(settled(judgement.ledger));
        }
        let reply = send(keys.swap(value.as_deref(), &judgement.ledger))
            .await
            .map_err(|e| match e.kind() {
                redis::ErrorKind::Server(_) => ledger_refused(&e.to_string()),
                _ => NodeError::from(e),
            })?;
        match loss::ledger::swap_outcome(&reply).map_err(|e| ledger_refused(&e))? {
            None => return Ok(settled(judgement.ledger)),
            Some(current) => value = current,
        }
    }
    Err(NodeError::Redis(
        "the node's ledger changed under every judgement (other clients swapping it at \
         once?): judged again at the next connect"
            .into(),
    ))
}

impl Node {
    /// Judges `read` (with `info`, whose reply arrived at `received`) and swaps the node's
    /// ledger over `conn` when the verdict changed it (see [`settle`]).
    pub(super) async fn settle_over(
        &self,
        conn: &Conn,
        info: &ServerInfo,
        read: LedgerRead,
        received: Instant,
    ) -> Result<Settled, NodeError> {
        self.warn_if_info_hides(info);
        let conn = conn.clone();
        let send = move |cmd: redis::Cmd| {
            let mut conn = conn.clone();
            async move { cmd.query_async::<Value>(&mut conn).await }
        };
        let length = self.settings.horizon.length();
        let known = self.state().run_id.clone();
        let seen = (info, known.as_deref());
        settle(&self.ledger, seen, read, (received, length), send).await
    }

    /// Keeps a judged read in the node's state (locked by the caller), in `loss` (the
    /// node's, or a cluster shard's): logs a loss this client did not know of.
    pub(super) fn keep_judged(&self, loss: &mut NodeLoss, settled: &Settled) {
        if let Some((why, left)) = keep(&self.settings.horizon, self.index, loss, settled) {
            tracing::warn!(
                node = %self.label,
                reason = %why.reason(),
                quarantine = ?left,
                "redlock node may have lost lock keys: kept out of acquisitions until every lock it may have lost has expired"
            );
        }
    }

    /// Warns once when `INFO` tells no `run_id` or no role: restarts that keep the data
    /// are then not seen (a restart without data still is, by the ledger).
    fn warn_if_info_hides(&self, info: &ServerInfo) {
        if (info.run_id.is_empty() || info.role == Role::Unknown)
            && !self.info_warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                node = %self.label,
                run_id = !info.run_id.is_empty(),
                role = info.role != Role::Unknown,
                "redlock node's INFO tells no run_id or no role (a proxy, a managed service?): a \
                 restart that reloads its data and a failover are not seen, only a node that \
                 comes back empty (by its ledger)"
            );
        }
    }

    /// Keeps `settled`, the plain node's ledger, in its state (locked by the caller).
    pub(super) fn judged(&self, st: &mut NodeState, settled: &Settled) {
        self.keep_judged(&mut st.loss, settled);
    }
}
