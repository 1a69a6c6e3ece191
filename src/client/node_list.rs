//! The client's nodes from their configurations: a URL (with the builder's TLS settings
//! for `rediss://`), a redis-rs client, a Sentinel-managed master, or a Redis Cluster.
//! Nothing connects yet.
//!
//! ```
//! use tower_redlock::{ConfigError, Redlock};
//!
//! let err = Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7001", "redis://127.0.0.1:7002"])
//!     .build()
//!     .unwrap_err();
//! assert!(matches!(err, ConfigError::DuplicateNode { .. }));
//! ```

use std::sync::Arc;
use std::time::Duration;

use redis::{Client, ConnectionAddr, ConnectionInfo};

use super::builder::RedlockBuilder;
use super::node_config::{Sentinel, redact};
use crate::error::ConfigError;
use crate::node::{Connector, Node, NodeSettings};
use crate::sentinel::SentinelMaster;

impl RedlockBuilder {
    /// The client of a node given by its connection settings: with the builder's TLS
    /// settings for a `rediss://` node without TLS parameters of its own (see
    /// [`takes_builder_tls`]). A node that skips certificate checks (`#insecure`) needs the
    /// `tls-insecure` feature.
    fn client(&self, info: ConnectionInfo, label: &str) -> Result<Client, ConfigError> {
        let tls = takes_builder_tls(&info);
        if let ConnectionAddr::TcpTls { insecure: true, .. } = info.addr()
            && !cfg!(feature = "tls-insecure")
        {
            return Err(ConfigError::InsecureTls {
                node: label.to_owned(),
            });
        }
        #[cfg(feature = "tls-rustls")]
        if tls {
            return self.tls.client(info, label);
        }
        let _ = tls;
        Client::open(info).map_err(|e| ConfigError::InvalidUrl {
            url: label.to_owned(),
            reason: e.to_string(),
        })
    }

    /// The nodes, each from its configuration (a URL, a client, a sentinel set or a
    /// cluster), sharing `settings`; refuses a node listed twice, and TLS settings without
    /// a `rediss://` node. Nothing connects yet.
    pub(super) fn nodes(&self, settings: &NodeSettings) -> Result<Vec<Arc<Node>>, ConfigError> {
        let mut nodes: Vec<Arc<Node>> = Vec::with_capacity(self.nodes.len());
        let mut tls_nodes = 0;
        for config in &self.nodes {
            let (label, connector) = if let Some(seeds) = config.as_cluster() {
                cluster_node(seeds, self.connect_timeout)?
            } else if let Some(sentinel) = config.as_sentinel() {
                (
                    format!("sentinel:{}", sentinel.name),
                    Connector::Sentinel(Box::new(sentinel_master(sentinel)?)),
                )
            } else {
                let info = config.connection_info()?;
                tls_nodes += usize::from(matches!(info.addr(), ConnectionAddr::TcpTls { .. }));
                let label = info.addr().to_string();
                let client = match config.client() {
                    Some(client) if !takes_builder_tls(&info) => client.clone(),
                    _ => self.client(info, &label)?,
                };
                (label, Connector::Direct(Box::new(client)))
            };
            if nodes.iter().any(|other| other.label() == label) {
                return Err(ConfigError::DuplicateNode { node: label });
            }
            let index = nodes.len();
            let node = Node::new(index, label, connector, settings.clone());
            nodes.push(Arc::new(node));
        }
        #[cfg(feature = "tls-rustls")]
        self.tls.check(tls_nodes)?;
        #[cfg(not(feature = "tls-rustls"))]
        let _ = tls_nodes;
        Ok(nodes)
    }
}

/// Whether a node with these settings takes the builder's TLS settings (its root
/// certificates and client certificate): a `rediss://` node that brings no TLS parameters
/// of its own. A URL, or a `redis::Client` opened from one, trusts the system's roots
/// until the builder says otherwise; a `redis::Client` built with
/// `Client::build_with_tls` (and its `ConnectionInfo`) keeps the certificates it was
/// built with, whatever the builder's.
fn takes_builder_tls(info: &ConnectionInfo) -> bool {
    matches!(
        info.addr(),
        ConnectionAddr::TcpTls {
            tls_params: None,
            ..
        }
    )
}

/// The label and connector of a Redis Cluster node.
#[cfg(feature = "cluster")]
fn cluster_node(
    seeds: &[String],
    connect_timeout: Duration,
) -> Result<(String, Connector), ConfigError> {
    let shown = seeds.first().map(|s| redact(s)).unwrap_or_default();
    let invalid = |reason: String| ConfigError::InvalidUrl {
        url: format!("cluster:{shown}"),
        reason,
    };
    let Some(first) = seeds.first() else {
        return Err(invalid("no seed nodes given".to_owned()));
    };
    let client = redis::cluster::ClusterClient::builder(seeds.iter().map(String::as_str))
        .connection_timeout(connect_timeout)
        .build()
        .map_err(|e| invalid(e.to_string()))?;
    let first = first
        .as_str()
        .parse::<ConnectionInfo>()
        .map_err(|e| invalid(e.to_string()))?;
    Ok((
        format!("cluster:{}", first.addr()),
        Connector::Cluster(Box::new(crate::node::ClusterNode::new(client))),
    ))
}

/// Without the `cluster` feature, no `NodeConfig` is a cluster.
#[cfg(not(feature = "cluster"))]
fn cluster_node(
    seeds: &[String],
    _connect_timeout: Duration,
) -> Result<(String, Connector), ConfigError> {
    Err(ConfigError::InvalidUrl {
        url: format!(
            "cluster:{}",
            seeds.first().map(|s| redact(s)).unwrap_or_default()
        ),
        reason: "a cluster node needs the `cluster` feature".to_owned(),
    })
}

/// The connector of a Sentinel-managed node: clients for its sentinels, and the master's
/// settings.
fn sentinel_master(sentinel: &Sentinel) -> Result<SentinelMaster, ConfigError> {
    if sentinel.sentinels.is_empty() {
        return Err(ConfigError::NoSentinels {
            master: sentinel.name.clone(),
        });
    }
    let clients = sentinel
        .sentinels
        .iter()
        .map(|url| {
            Client::open(url.as_str()).map_err(|e| ConfigError::InvalidUrl {
                url: redact(url),
                reason: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let template = match &sentinel.master {
        Some(info) => info.clone(),
        None => "redis://127.0.0.1:6379"
            .parse::<ConnectionInfo>()
            .map_err(|e| ConfigError::InvalidUrl {
                url: format!("sentinel:{}", sentinel.name),
                reason: e.to_string(),
            })?,
    };
    Ok(SentinelMaster::new(
        clients,
        sentinel.name.clone(),
        template,
    ))
}
