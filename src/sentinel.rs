//! Sentinel-managed masters: a node that is "the master Sentinel names `name`". Every
//! (re)connect asks the sentinels for the master's address, so the node follows
//! failovers; a server they name that is not a master (a stale or misconfigured
//! sentinel) is refused, and the next connect asks again. A promoted replica may lack lock
//! keys the old master had (replication is asynchronous), so the restart quarantine keeps
//! it out of acquisitions until the longest TTL has passed since its promotion, for a
//! client that knew the old master (its `run_id` differs) and for one that meets it first
//! (see `crate::node`).
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

use redis::{Client, ConnectionAddr, ConnectionInfo};

use crate::error::NodeError;

/// The master that a set of sentinels names, and the client of the last one found.
pub(crate) struct SentinelMaster {
    sentinels: Vec<Client>,
    name: String,
    /// The master's connection settings (user, password, database, TLS); its address is
    /// replaced by the one the sentinels give.
    template: ConnectionInfo,
    /// The client of the master found last; `None` before the first lookup.
    current: Mutex<Option<Client>>,
}

impl SentinelMaster {
    pub(crate) fn new(sentinels: Vec<Client>, name: String, template: ConnectionInfo) -> Self {
        Self {
            sentinels,
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

    /// Asks the sentinels, in turn, for the master's address; its client.
    pub(crate) async fn resolve(&self, timeout: Duration) -> Result<Client, NodeError> {
        let mut last = NodeError::Connection("no sentinel given".into());
        for sentinel in &self.sentinels {
            let found = tokio::time::timeout(timeout, async {
                let mut conn = sentinel.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.name)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            })
            .await;
            let (host, port) = match found {
                Ok(Ok(Some(addr))) => addr,
                Ok(Ok(None)) => {
                    last = NodeError::Connection(
                        format!("the sentinel knows no master named {:?}", self.name).into(),
                    );
                    continue;
                }
                Ok(Err(e)) => {
                    last =
                        NodeError::Connection(format!("sentinel: {}", NodeError::from(e)).into());
                    continue;
                }
                Err(_) => {
                    last = NodeError::Connection("sentinel: no answer".into());
                    continue;
                }
            };
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
            return Ok(client);
        }
        Err(last)
    }
}
