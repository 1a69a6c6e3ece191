//! Connecting a node: the background task that (re)connects, with backoff, the
//! handshake (`INFO server`, `INFO memory` and the scripts in one round trip), the
//! restart quarantine and the one-vote-per-server check, and [`Node::connection`], which
//! every call goes through when the connection is not ready at once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // `build` starts each node's connect task; a lock taken at once waits for it.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("job:1").await?;
//! redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use redis::{AsyncConnectionConfig, Client, Value};
use tokio::time::timeout_at;

use super::{BACKOFF_MAX, BACKOFF_MIN, Conn, Connector, Link, Node, NodeState, Owner, wire};
use crate::error::NodeError;
use crate::scripts;

/// Why a node is kept out of acquisitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuarantineCause {
    /// Its `run_id` changed: it restarted and may have lost its keys.
    Restarted,
    /// First contact, and it has been up for less than the longest TTL.
    Young { uptime: Duration },
}

/// How long to quarantine a node that just (re)connected, given the `run_id` seen before
/// (if any), what it says about itself now, and the longest TTL in use.
pub(crate) fn quarantine_for(
    previous_run_id: Option<&str>,
    info: &ServerInfo,
    max_ttl: Duration,
) -> Option<(Duration, QuarantineCause)> {
    match previous_run_id {
        Some(previous) if previous != info.run_id => Some((max_ttl, QuarantineCause::Restarted)),
        Some(_) => None,
        // `uptime_in_seconds` is rounded down, so this errs on the long side.
        None => max_ttl
            .checked_sub(info.uptime)
            .filter(|d| !d.is_zero())
            .map(|d| {
                (
                    d,
                    QuarantineCause::Young {
                        uptime: info.uptime,
                    },
                )
            }),
    }
}

/// What `INFO server` said on the last connect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    pub(crate) run_id: String,
    pub(crate) uptime: Duration,
    pub(crate) version: String,
}

impl ServerInfo {
    fn parse(info: &str) -> Self {
        let mut out = Self::default();
        for line in info.lines() {
            let Some((k, v)) = line.trim_end().split_once(':') else {
                continue;
            };
            match k {
                "run_id" => out.run_id = v.to_owned(),
                "redis_version" => out.version = v.to_owned(),
                "uptime_in_seconds" => {
                    out.uptime = Duration::from_secs(v.parse().unwrap_or(0));
                }
                _ => {}
            }
        }
        out
    }
}

impl Node {
    /// Starts connecting in the background if the node is not connected or connecting.
    /// Must be called within a tokio runtime.
    pub(crate) fn kick(self: &Arc<Self>) {
        let mut st = self.state();
        if matches!(st.slot, Link::Idle | Link::Down { .. }) {
            self.start_connect(&mut st);
        }
    }

    fn start_connect(self: &Arc<Self>, st: &mut NodeState) {
        st.slot = Link::Connecting;
        let node = Arc::clone(self);
        tokio::spawn(async move {
            // Dropped unfinished (the runtime shut down): the node can connect again.
            let mut unfinished = Unfinished(Some(&node));
            let outcome = AssertUnwindSafe(node.open())
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Err(NodeError::Connection(
                        format!(
                            "the connect task panicked: {}",
                            panic_message(&*panic).trim()
                        )
                        .into(),
                    ))
                });
            node.connected(outcome);
            unfinished.0 = None;
        });
    }

    /// Opens a connection: connects, reads `INFO server` and loads the scripts in one
    /// round trip, within the connect timeout.
    async fn open(&self) -> Result<(Conn, ServerInfo), NodeError> {
        let deadline = tokio::time::Instant::from_std(crate::quorum::later(
            Instant::now(),
            self.settings.connect_timeout,
        ));
        let client = match &self.connector {
            #[cfg(feature = "cluster")]
            Connector::Cluster(cluster) => {
                // No INFO (there is one server per shard) and no SCRIPT LOAD (a shard that
                // lacks a script gets it by EVAL on first use).
                return match timeout_at(deadline, cluster.get_async_connection()).await {
                    Ok(Ok(conn)) => Ok((Conn::Cluster(conn), ServerInfo::default())),
                    Ok(Err(e)) if !e.is_timeout() => Err(NodeError::from(e)),
                    Ok(Err(_)) | Err(_) => Err(self.connect_timed_out(false)),
                };
            }
            Connector::Direct(client) => (**client).clone(),
            Connector::Sentinel(master) => {
                match timeout_at(deadline, master.resolve(self.settings.connect_timeout)).await {
                    Ok(found) => found?,
                    Err(_) => {
                        return Err(NodeError::Connection(
                            "no sentinel answered within the connect timeout".into(),
                        ));
                    }
                }
            }
        };
        let tls = matches!(
            client.get_connection_info().addr(),
            redis::ConnectionAddr::TcpTls { .. }
        );
        match timeout_at(deadline, self.handshake(&client)).await {
            Ok(Ok(ok)) => Ok(ok),
            Ok(Err(e)) => Err(self.connect_failed(e, tls)),
            Err(_) => Err(self.connect_timed_out(tls)),
        }
    }

    /// Connects through `client` and, in one round trip, reads `INFO server` and
    /// `INFO memory` and loads the scripts.
    async fn handshake(&self, client: &Client) -> redis::RedisResult<(Conn, ServerInfo)> {
        let mut conn = match wire::plain_tcp(client) {
            Some((host, port, tcp)) => {
                let wire = wire::Wire::connect(host, port, tcp).await?;
                wire::handshake(&wire, client.get_connection_info().redis_settings()).await?;
                Conn::Own(wire)
            }
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.settings.connect_timeout))
                    .set_response_timeout(None);
                Conn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                )
            }
        };
        // `INFO server` feeds the restart quarantine and the same-server check; a user that
        // may not run it can still lock with the quarantine off. `INFO memory` tells the
        // eviction policy (see `warn_if_evicting`); a server that refuses it is simply not
        // checked.
        let mut pipe = redis::pipe();
        pipe.ignore_errors().cmd("INFO").arg("server");
        pipe.cmd("INFO").arg("memory");
        for s in scripts::all() {
            pipe.cmd("SCRIPT").arg("LOAD").arg(s.code);
        }
        let replies: Vec<redis::RedisResult<Value>> = pipe.query_async(&mut conn).await?;
        let mut replies = replies.into_iter();
        let info = replies.next().unwrap_or(Ok(Value::Nil));
        let memory = replies.next().and_then(Result::ok);
        if let Some(failed) = replies.find_map(Result::err) {
            return Err(failed); // a script could not be loaded
        }
        if let Some(memory) = memory.and_then(|v| redis::from_redis_value::<String>(v).ok()) {
            self.warn_if_evicting(&memory);
        }
        let info = match info {
            Ok(v) => redis::from_redis_value_ref::<String>(&v)?,
            Err(e) if self.settings.quarantine => return Err(e),
            Err(e) => {
                tracing::debug!(node = %self.label, error = %e, "redlock node: INFO not allowed; no same-server check");
                String::new()
            }
        };
        Ok((conn, ServerInfo::parse(&info)))
    }

    /// The error of a handshake that failed with `e` (over TLS if `tls`).
    fn connect_failed(&self, e: redis::RedisError, tls: bool) -> NodeError {
        let no_info = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
            && e.to_string().to_ascii_lowercase().contains("info");
        if self.settings.quarantine && no_info {
            return NodeError::Redis(
                format!(
                    "the user may not run INFO, which the restart quarantine needs: grant it \
                     +info, or turn restart_quarantine off ({e})"
                )
                .into(),
            );
        }
        if e.is_timeout() {
            return self.connect_timed_out(tls);
        }
        NodeError::from(e)
    }

    /// Warns, once per node, when `INFO memory` shows a policy that evicts keys: lock keys
    /// and fencing counters must stay until they expire. An evicted lock key lets a second
    /// client take a lock that is still held; an evicted counter leaves the next fencing
    /// number to a client's clock alone, which may be behind the lost one. Only
    /// `noeviction` is safe: the `volatile-*` policies evict keys with a TTL, which is
    /// every key of ours.
    fn warn_if_evicting(&self, memory: &str) {
        let policy = memory
            .lines()
            .find_map(|l| l.trim_end().strip_prefix("maxmemory_policy:"));
        let Some(policy) = policy.filter(|p| *p != "noeviction") else {
            return;
        };
        if self.eviction_warned.swap(true, Ordering::Relaxed) {
            return;
        }
        let maxmemory = memory
            .lines()
            .find_map(|l| l.trim_end().strip_prefix("maxmemory:"))
            .unwrap_or("?");
        tracing::warn!(
            node = %self.label,
            policy,
            maxmemory,
            "redlock node may evict keys (maxmemory-policy is not noeviction): an evicted lock \
             key lets another client take a held lock, and an evicted fencing counter lets \
             fencing numbers go back; set maxmemory-policy noeviction on lock nodes"
        );
    }

    /// The error of a connect that got no answer in time (over TLS if `tls`). A plain
    /// Redis port answers a TLS handshake with nothing at all, so over TLS the message
    /// asks whether the port is the TLS one.
    fn connect_timed_out(&self, tls: bool) -> NodeError {
        let hint = if tls {
            " (a rediss:// node: is the port the server's tls-port? A plain port does not \
             answer a TLS handshake)"
        } else {
            ""
        };
        NodeError::Connection(
            format!(
                "no answer within the connect timeout of {:?}{hint}",
                self.settings.connect_timeout
            )
            .into(),
        )
    }

    /// Whether the server behind `info` already counts for another node of the client;
    /// if not, it counts for this one from now on.
    fn same_server(&self, info: &ServerInfo) -> Option<String> {
        if info.run_id.is_empty() {
            return None;
        }
        let mut servers = self
            .settings
            .servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        servers.retain(|_, owner| owner.index != self.index);
        match servers.get(&info.run_id) {
            Some(owner) => Some(owner.label.clone()),
            None => {
                let owner = Owner {
                    index: self.index,
                    label: self.label.clone(),
                };
                servers.insert(info.run_id.clone(), owner);
                None
            }
        }
    }

    /// A connect finished with `outcome`: the node is ready, or down until its backoff
    /// runs out.
    fn connected(&self, outcome: Result<(Conn, ServerInfo), NodeError>) {
        let outcome = outcome.and_then(|(conn, info)| match self.same_server(&info) {
            Some(other) => Err(NodeError::SameServer { node: other }),
            None => Ok((conn, info)),
        });
        {
            let mut st = self.state();
            match outcome {
                Ok((conn, info)) => {
                    tracing::debug!(
                        node = %self.label,
                        version = %info.version,
                        uptime_s = info.uptime.as_secs(),
                        "redlock node connected"
                    );
                    // A node without a run id (a cluster, or INFO not allowed) is never
                    // quarantined: nothing tells its restarts.
                    if self.settings.quarantine && !info.run_id.is_empty() {
                        self.quarantine_after_connect(&mut st, &info);
                    }
                    if !info.version.is_empty() {
                        st.version = Some(info.version.clone());
                    }
                    st.known_run_id = Some(info.run_id);
                    st.same_server_as = None;
                    st.generation += 1;
                    self.settings.rejoins.fetch_add(1, Ordering::Relaxed);
                    st.connected_at = Some(Instant::now());
                    st.slot = Link::Ready(conn);
                    st.backoff = BACKOFF_MIN;
                    self.consecutive_timeouts.store(0, Ordering::Relaxed);
                }
                Err(NodeError::SameServer { node }) => {
                    if st.same_server_as.as_deref() != Some(node.as_str()) {
                        tracing::error!(
                            node = %self.label,
                            same_as = %node,
                            "redlock node is the same Redis server as another node of this client (equal run_id): it is left out, so the server counts once toward the quorum; list each server once"
                        );
                    }
                    st.same_server_as = Some(node.clone());
                    st.slot = Link::Down {
                        error: NodeError::SameServer { node },
                        retry_at: crate::quorum::later(Instant::now(), BACKOFF_MAX),
                    };
                    st.backoff = BACKOFF_MAX;
                }
                Err(error) => {
                    tracing::warn!(node = %self.label, %error, retry_in = ?st.backoff, "redlock node connect failed");
                    st.slot = Link::Down {
                        error,
                        retry_at: crate::quorum::later(Instant::now(), st.backoff),
                    };
                    st.backoff = (st.backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Starts a quarantine if the node restarted or is young (see the module docs).
    fn quarantine_after_connect(&self, st: &mut NodeState, info: &ServerInfo) {
        let max_ttl = Duration::from_millis(self.settings.max_ttl_ms.load(Ordering::Relaxed));
        let Some((length, cause)) = quarantine_for(st.known_run_id.as_deref(), info, max_ttl)
        else {
            return;
        };
        let until = crate::quorum::later(Instant::now(), length);
        if st.quarantined_until.is_none() {
            crate::metrics::gauge(
                crate::metrics::Gauge::QuarantinedNodes,
                crate::metrics::Move::Up,
            );
        }
        st.quarantined_until = Some(st.quarantined_until.map_or(until, |u| u.max(until)));
        match cause {
            QuarantineCause::Restarted => tracing::warn!(
                node = %self.label,
                quarantine = ?length,
                "redlock node restarted (new run id) and may have lost lock keys: kept out of acquisitions for the longest TTL"
            ),
            QuarantineCause::Young { uptime } => tracing::warn!(
                node = %self.label,
                ?uptime,
                quarantine = ?length,
                "redlock node started less than the longest TTL ago and may have lost lock keys: kept out of acquisitions until then"
            ),
        }
    }

    /// A connect task dropped before it finished: the node is down, ready to reconnect.
    fn connect_abandoned(&self) {
        {
            let mut st = self.state();
            if matches!(st.slot, Link::Connecting) {
                st.slot = Link::Down {
                    error: NodeError::Connection(
                        "the connect task was dropped before it finished (its tokio runtime shut down?)"
                            .into(),
                    ),
                    retry_at: Instant::now(),
                };
            }
        }
        self.changed.notify_waiters();
    }

    /// The current connection, waiting for a connect in progress. Fails at once while the
    /// node is down and its backoff has not run out, and, when `acquiring`, while it is
    /// quarantined.
    pub(super) async fn connection(
        self: &Arc<Self>,
        acquiring: bool,
    ) -> Result<(Conn, u64), NodeError> {
        loop {
            let notified = self.changed.notified();
            {
                let mut st = self.state();
                match &st.slot {
                    Link::Ready(conn) => {
                        let ready = (conn.clone(), st.generation);
                        if acquiring && let Some(remaining) = self.quarantine_left(&mut st) {
                            return Err(NodeError::Quarantined { remaining });
                        }
                        return Ok(ready);
                    }
                    Link::Connecting => {}
                    Link::Idle => self.start_connect(&mut st),
                    Link::Down { error, retry_at } => {
                        if Instant::now() < *retry_at {
                            return Err(error.clone());
                        }
                        self.start_connect(&mut st);
                    }
                }
            }
            notified.await;
        }
    }
}

/// Resets the node when a connect task is dropped before it finished.
struct Unfinished<'a>(Option<&'a Arc<Node>>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(node) = self.0 {
            node.connect_abandoned();
        }
    }
}

/// The message of a panic payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_rules() {
        let info = |run_id: &str, uptime: u64| ServerInfo {
            run_id: run_id.into(),
            uptime: Duration::from_secs(uptime),
            version: "7.0.0".into(),
        };
        let ttl = Duration::from_secs(30);
        // First contact: young nodes wait out the rest of the TTL, old ones are trusted.
        assert_eq!(
            quarantine_for(None, &info("a", 10), ttl),
            Some((
                Duration::from_secs(20),
                QuarantineCause::Young {
                    uptime: Duration::from_secs(10)
                }
            ))
        );
        assert_eq!(quarantine_for(None, &info("a", 30), ttl), None);
        assert_eq!(quarantine_for(None, &info("a", 3600), ttl), None);
        // Reconnects: the same process is trusted, a new one waits a whole TTL whatever
        // its uptime says.
        assert_eq!(quarantine_for(Some("a"), &info("a", 1), ttl), None);
        assert_eq!(
            quarantine_for(Some("a"), &info("b", 3600), ttl),
            Some((ttl, QuarantineCause::Restarted))
        );
    }

    #[test]
    fn parses_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n";
        let s = ServerInfo::parse(info);
        assert_eq!(s.version, "7.0.15");
        assert_eq!(s.run_id, "abc123");
        assert_eq!(s.uptime, Duration::from_secs(42));
    }
}
