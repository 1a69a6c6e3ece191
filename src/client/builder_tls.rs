//! The builder's TLS methods (feature `tls-rustls`): a private CA to trust and a client
//! certificate to present; they fill the builder's `TlsSettings` (`tls.rs`).
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["rediss://redis-1.internal:6380"])
//!     .tls_root_certificates(std::fs::read("ca.pem")?)
//!     .build()?;
//! # let _ = redlock;
//! # Ok(()) }
//! ```

use super::RedlockBuilder;

#[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
impl RedlockBuilder {
    /// Trusts the CA certificates in `pem` (one or more PEM certificates) for `rediss://`
    /// nodes, instead of the system's roots: for servers with certificates from a private
    /// CA. Unreadable certificates are refused by [`build`](Self::build)
    /// ([`ConfigError::Tls`](crate::ConfigError::Tls)), as are certificates for a client without `rediss://`
    /// nodes. Needs the `tls-rustls` feature.
    ///
    /// This and [`tls_client_certificate`](Self::tls_client_certificate) apply to every
    /// `rediss://` node without TLS settings of its own: URLs, `redis::ConnectionInfo`s,
    /// and `redis::Client`s opened from a URL. A `redis::Client` built with
    /// `Client::build_with_tls(..)` keeps the certificates it was built with (see
    /// [`NodeConfig`](crate::NodeConfig)'s `From<redis::Client>`).
    ///
    /// ```no_run
    /// use tower_redlock::Redlock;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["rediss://redis-1:6380", "rediss://redis-2:6380", "rediss://redis-3:6380"];
    /// // The servers' certificates come from the company's CA, which the system does not trust.
    /// let ca = std::fs::read("/etc/redis/tls/ca.pem")?;
    /// let redlock = Redlock::builder(nodes).tls_root_certificates(ca).build()?;
    /// # let _ = redlock;
    /// # Ok(()) }
    /// ```
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.set_root(pem.into());
        self
    }

    /// Presents the client certificate `cert_pem` with its private key `key_pem` (PEM) to
    /// `rediss://` nodes that ask for one (`tls-auth-clients yes`): mutual TLS. Needs the
    /// `tls-rustls` feature.
    ///
    /// ```no_run
    /// use tower_redlock::Redlock;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["rediss://redis-1:6380", "rediss://redis-2:6380", "rediss://redis-3:6380"];
    /// // The servers run with `tls-auth-clients yes`: present this service's certificate.
    /// let cert = std::fs::read("/etc/redis/tls/client.pem")?;
    /// let key = std::fs::read("/etc/redis/tls/client.key")?;
    /// let redlock = Redlock::builder(nodes)
    ///     .tls_root_certificates(std::fs::read("/etc/redis/tls/ca.pem")?)
    ///     .tls_client_certificate(cert, key)
    ///     .build()?;
    /// # let _ = redlock;
    /// # Ok(()) }
    /// ```
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.set_client(cert_pem.into(), key_pem.into());
        self
    }
}
