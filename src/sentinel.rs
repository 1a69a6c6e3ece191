//! Sentinel-managed masters: a node that is "the master Sentinel names `name`". Every
//! (re)connect asks all the sentinels at once for the master's address and trusts the one
//! a majority of those that answer name, so a stale or misconfigured sentinel is
//! outvoted; a server they name that is not a master is refused, and the next connect asks
//! again. Every background check asks them too: a connected master they no longer name
//! (a split brain: it did not hear of the failover) is left within one check interval. A
//! promoted replica may lack lock keys the old master had (replication is asynchronous),
//! so the restart quarantine keeps it out of acquisitions until the longest TTL has passed
//! since the first client met it as a master (see `crate::node`).
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::{NodeConfig, Redlock};
//!
//! let redlock = Redlock::builder([
//!     NodeConfig::sentinel(["redis://10.0.1.1:26379", "redis://10.0.1.2:26379"], "locks-a"),
//!     NodeConfig::sentinel(["redis://10.0.2.1:26379", "redis://10.0.2.2:26379"], "locks-b"),
//!     NodeConfig::sentinel(["redis://10.0.3.1:26379", "redis://10.0.3.2:26379"], "locks-c"),
//! ])
//! .build()?;
//! # let _ = redlock; Ok(()) }
//! ```

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::{Client, ConnectionAddr, ConnectionInfo};

use crate::error::NodeError;

/// The master that a set of sentinels names, and the client of the last one found.
pub(crate) struct SentinelMaster {
    sentinels: Vec<Client>,
    /// A connection to each sentinel, kept between lookups (`None` until made, or after
    /// it failed).
    links: Vec<tokio::sync::Mutex<Option<MultiplexedConnection>>>,
    name: String,
    /// The master's connection settings (user, password, database, TLS); its address is
    /// replaced by the one the sentinels give.
    template: ConnectionInfo,
    /// The client of the master found last; `None` before the first lookup.
    current: Mutex<Option<Client>>,
}

/// What one sentinel answered when asked for the master.
enum Named {
    At(String, u16),
    Unknown,
    Failed(String),
}

impl SentinelMaster {
    pub(crate) fn new(sentinels: Vec<Client>, name: String, template: ConnectionInfo) -> Self {
        let links = sentinels
            .iter()
            .map(|_| tokio::sync::Mutex::new(None))
            .collect();
        Self {
            sentinels,
            links,
            name,
            template,
            current: Mutex::new(None),
        }
    }

    /// The client of the master found last, if one was.
    pub(crate) fn current(&self) -> Option<Client> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Asks every sentinel at once, each within `timeout`, for the master's address: the
    /// one a majority of the sentinels that answered name. A single stale or
    /// misconfigured sentinel (another master under the name, a failover it missed) is
    /// outvoted; sentinels that disagree without a majority are an error.
    pub(crate) async fn named(&self, timeout: Duration) -> Result<(String, u16), NodeError> {
        let answers = join_all((0..self.sentinels.len()).map(|i| self.ask(i, timeout))).await;
        let mut votes: Vec<((String, u16), usize)> = Vec::new();
        let mut last = NodeError::Connection("no sentinel given".into());
        for answer in answers {
            match answer {
                Named::At(host, port) => {
                    match votes.iter_mut().find(|(a, _)| *a == (host.clone(), port)) {
                        Some((_, n)) => *n += 1,
                        None => votes.push(((host, port), 1)),
                    }
                }
                Named::Unknown => {
                    last = NodeError::Connection(
                        format!("the sentinel knows no master named {:?}", self.name).into(),
                    );
                }
                Named::Failed(why) => {
                    last = NodeError::Connection(format!("sentinel: {why}").into())
                }
            }
        }
        let answered: usize = votes.iter().map(|(_, n)| n).sum();
        votes.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        match votes.first() {
            Some((addr, n)) if *n * 2 > answered => Ok(addr.clone()),
            Some(_) => Err(NodeError::Connection(
                format!(
                    "the sentinels disagree on the master {:?} (no address named by a majority \
                     of the {answered} that answered: {}): a stale or misconfigured sentinel?",
                    self.name,
                    votes
                        .iter()
                        .map(|((h, p), n)| format!("{h}:{p} by {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
                .into(),
            )),
            None => Err(last),
        }
    }

    /// Asks sentinel `i` for the master's address, within `timeout`, over its kept
    /// connection (made first if need be; dropped when it fails).
    async fn ask(&self, i: usize, timeout: Duration) -> Named {
        let (Some(sentinel), Some(link)) = (self.sentinels.get(i), self.links.get(i)) else {
            return Named::Failed("no such sentinel".into());
        };
        let mut link = link.lock().await;
        let asked = tokio::time::timeout(timeout, async {
            let conn = match link.as_mut() {
                Some(conn) => conn,
                None => link.insert(sentinel.get_multiplexed_async_connection().await?),
            };
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.name)
                .query_async::<Option<(String, u16)>>(conn)
                .await
        })
        .await;
        match asked {
            Ok(Ok(Some((host, port)))) => Named::At(host, port),
            Ok(Ok(None)) => Named::Unknown,
            Ok(Err(e)) => {
                *link = None;
                Named::Failed(NodeError::from(e).to_string())
            }
            Err(_) => {
                *link = None;
                Named::Failed("no answer".into())
            }
        }
    }

    /// Asks the sentinels for the master (see [`named`](Self::named)); its client, from now
    /// on the current one.
    pub(crate) async fn resolve(&self, timeout: Duration) -> Result<Client, NodeError> {
        let (host, port) = self.named(timeout).await?;
        let addr = match self.template.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        let client = Client::open(self.template.clone().set_addr(addr))
            .map_err(|e| NodeError::Connection(format!("{e}").into()))?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(client.clone());
        Ok(client)
    }

    /// Whether the sentinels (a majority of those that answer within `timeout`) now name
    /// another master than the current one: the split brain of a failover the old master
    /// did not hear of. `None` when they could not tell.
    pub(crate) async fn moved(&self, timeout: Duration) -> Option<(String, u16)> {
        let named = self.named(timeout).await.ok()?;
        let current = self.current()?;
        let (host, port) = match current.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                (host.clone(), *port)
            }
            _ => return None,
        };
        (named != (host, port)).then_some(named)
    }
}
