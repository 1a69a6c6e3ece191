//! [`NodeConfig`]: one Redis master as the builder takes it: a URL, a
//! `redis::ConnectionInfo` (username, password, database, TLS and TCP settings the way
//! redis-rs sets them) or a ready `redis::Client`.
//!
//! ```
//! use tower_redlock::{NodeConfig, Redlock};
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let info: redis::ConnectionInfo = "redis://locker:secret@10.0.0.2:6379/2".parse()?;
//! let redlock = Redlock::builder([
//!     NodeConfig::from("redis://10.0.0.1:6379"),
//!     NodeConfig::from(info),
//!     NodeConfig::from(redis::Client::open("redis://10.0.0.3:6379")?),
//! ])
//! .build()?;
//! // Debug output and error texts name nodes by address, never with credentials.
//! assert!(!format!("{redlock:?}").contains("secret"));
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::fmt;

use redis::{Client, ConnectionInfo};

use crate::error::ConfigError;

/// One Redis master for [`Redlock::builder`](crate::Redlock::builder): from a URL
/// (`redis://[user:password@]host:port[/db]`, `rediss://...` with the `tls-rustls`
/// feature), a `redis::ConnectionInfo`, or a `redis::Client`. `Debug` shows the address
/// only.
#[derive(Clone)]
pub struct NodeConfig(Spec);

#[derive(Clone)]
enum Spec {
    Url(String),
    Info(Box<ConnectionInfo>),
    Client(Box<Client>),
    Sentinel(Box<Sentinel>),
    /// Built only with the `cluster` feature.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Cluster(Vec<String>),
}

/// A Sentinel-managed master, as given.
#[derive(Clone)]
pub(crate) struct Sentinel {
    pub(crate) sentinels: Vec<String>,
    pub(crate) name: String,
    pub(crate) master: Option<ConnectionInfo>,
}

impl NodeConfig {
    /// A Sentinel-managed master: the master that the sentinels at `sentinels` (URLs,
    /// tried in turn) name `master_name`. Every (re)connect asks them, so the node
    /// follows failovers; a promoted replica is quarantined like a restarted node (see
    /// [`RedlockBuilder::restart_quarantine`](crate::RedlockBuilder::restart_quarantine)),
    /// since it may lack lock keys. The master is reached with default settings; give its
    /// user, password, database or TLS with [`master_settings`](Self::master_settings).
    /// Bad URLs are refused by [`build`](crate::RedlockBuilder::build).
    pub fn sentinel<I, S>(sentinels: I, master_name: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self(Spec::Sentinel(Box::new(Sentinel {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            name: master_name.into(),
            master: None,
        })))
    }

    /// A Redis Cluster as one node (feature `cluster`): `seeds` are URLs of some of its
    /// nodes. Every key of one lock (lock key, fencing counter, completion record) shares
    /// one hash slot, so each operation runs on the shard that owns the name. See the
    /// README's "Deployments" section for what such a node guarantees.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster<I, S>(seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self(Spec::Cluster(seeds.into_iter().map(Into::into).collect()))
    }

    /// The seed URLs, for a Redis Cluster node.
    pub(crate) fn as_cluster(&self) -> Option<&[String]> {
        match &self.0 {
            Spec::Cluster(seeds) => Some(seeds),
            _ => None,
        }
    }

    /// For a [`sentinel`](Self::sentinel) node: how to connect to the master (user,
    /// password, database, TLS); its address is replaced by the one the sentinels give.
    /// No effect on other nodes.
    ///
    /// ```
    /// use tower_redlock::{NodeConfig, Redlock};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let sentinels = ["redis://sentinel-1:26379", "redis://sentinel-2:26379"];
    /// // The masters need a password; their address comes from the sentinels.
    /// let master: redis::ConnectionInfo = "redis://locker:secret@master:6379/0".parse()?;
    /// let redlock = Redlock::builder(["locks-a", "locks-b", "locks-c"].map(|name| {
    ///     NodeConfig::sentinel(sentinels, name).master_settings(master.clone())
    /// }))
    /// .build()?;
    /// assert_eq!(redlock.node_count(), 3);
    /// # Ok(()) }
    /// ```
    #[must_use = "`master_settings` returns the node with the settings"]
    pub fn master_settings(mut self, info: ConnectionInfo) -> Self {
        if let Spec::Sentinel(sentinel) = &mut self.0 {
            sentinel.master = Some(info);
        }
        self
    }

    /// The Sentinel settings, for a Sentinel-managed node.
    pub(crate) fn as_sentinel(&self) -> Option<&Sentinel> {
        match &self.0 {
            Spec::Sentinel(sentinel) => Some(sentinel),
            _ => None,
        }
    }

    /// The connection settings: parsed from the URL, or as given.
    pub(crate) fn connection_info(&self) -> Result<ConnectionInfo, ConfigError> {
        match &self.0 {
            Spec::Url(url) => {
                url.as_str()
                    .parse::<ConnectionInfo>()
                    .map_err(|e| ConfigError::InvalidUrl {
                        url: redact(url),
                        reason: e.to_string(),
                    })
            }
            Spec::Info(info) => Ok((**info).clone()),
            Spec::Client(client) => Ok(client.get_connection_info().clone()),
            Spec::Sentinel(sentinel) => Err(ConfigError::InvalidUrl {
                url: format!("sentinel:{}", sentinel.name),
                reason: "a Sentinel-managed node has no fixed address".to_owned(),
            }),
            Spec::Cluster(seeds) => Err(ConfigError::InvalidUrl {
                url: format!("cluster:{}", seeds.first().map_or("", |s| s.as_str())),
                reason: "a cluster node has no single address".to_owned(),
            }),
        }
    }

    /// The client given by the user, if one was.
    pub(crate) fn client(&self) -> Option<&Client> {
        match &self.0 {
            Spec::Client(client) => Some(client),
            _ => None,
        }
    }

    /// The URL without credentials, or the address.
    fn shown(&self) -> String {
        match &self.0 {
            Spec::Url(url) => redact(url),
            Spec::Info(info) => info.addr().to_string(),
            Spec::Client(client) => client.get_connection_info().addr().to_string(),
            Spec::Sentinel(sentinel) => format!(
                "sentinel:{} via {:?}",
                sentinel.name,
                sentinel
                    .sentinels
                    .iter()
                    .map(|u| redact(u))
                    .collect::<Vec<_>>()
            ),
            Spec::Cluster(seeds) => format!(
                "cluster via {:?}",
                seeds.iter().map(|u| redact(u)).collect::<Vec<_>>()
            ),
        }
    }
}

impl fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("NodeConfig").field(&self.shown()).finish()
    }
}

impl From<&str> for NodeConfig {
    fn from(url: &str) -> Self {
        Self(Spec::Url(url.to_owned()))
    }
}

impl From<String> for NodeConfig {
    fn from(url: String) -> Self {
        Self(Spec::Url(url))
    }
}

impl From<&String> for NodeConfig {
    fn from(url: &String) -> Self {
        Self(Spec::Url(url.clone()))
    }
}

impl From<Cow<'_, str>> for NodeConfig {
    fn from(url: Cow<'_, str>) -> Self {
        Self(Spec::Url(url.into_owned()))
    }
}

impl From<ConnectionInfo> for NodeConfig {
    fn from(info: ConnectionInfo) -> Self {
        Self(Spec::Info(Box::new(info)))
    }
}

/// A node from a ready `redis::Client`, used with its connection settings. For a
/// `rediss://` node, which certificates it uses depends on how the client was made:
///
/// - opened from a URL or `ConnectionInfo` (`Client::open("rediss://…")`), it has no TLS
///   settings of its own and takes the builder's, like a URL node:
///   `RedlockBuilder::tls_root_certificates` and `tls_client_certificate` (feature
///   `tls-rustls`; the system's roots when the builder has none);
/// - built with `Client::build_with_tls(..)`, it keeps the certificates it was built
///   with, and the builder's do not apply to it (they still apply to the other nodes).
///
/// ```no_run
/// # #[cfg(feature = "tls-rustls")]
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_redlock::{NodeConfig, Redlock};
///
/// let ca = std::fs::read("ca.pem")?;
/// // Its own CA, given when it was built: kept.
/// let own = redis::Client::build_with_tls(
///     "rediss://redis-3.internal:6380",
///     redis::TlsCertificates { client_tls: None, root_cert: Some(ca.clone()) },
/// )?;
/// let redlock = Redlock::builder([
///     NodeConfig::from("rediss://redis-1.internal:6380"),
///     // Opened from a URL: it trusts the builder's CA, like the URL node.
///     NodeConfig::from(redis::Client::open("rediss://redis-2.internal:6380")?),
///     NodeConfig::from(own),
/// ])
/// .tls_root_certificates(ca)
/// .build()?;
/// # let _ = redlock;
/// # Ok(()) }
/// ```
impl From<Client> for NodeConfig {
    fn from(client: Client) -> Self {
        Self(Spec::Client(Box::new(client)))
    }
}

/// `url` without the user and password.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credentials() {
        assert_eq!(
            redact("rediss://user:secret@host:6380/0"),
            "rediss://***@host:6380/0"
        );
        assert_eq!(redact("redis://host:1"), "redis://host:1");
        let shown = format!("{:?}", NodeConfig::from("redis://u:pw@h:1"));
        assert!(!shown.contains("pw"), "{shown}");
    }
}
