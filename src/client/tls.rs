//! TLS settings of the builder (feature `tls-rustls`): a private CA to trust, a client
//! certificate to present (mTLS), and the rustls crypto provider, chosen by the crate so
//! that enabling the feature is enough.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let ca = std::fs::read("ca.pem")?;
//! let (cert, key) = (std::fs::read("client.pem")?, std::fs::read("client.key")?);
//! let redlock = tower_redlock::Redlock::builder([
//!     "rediss://redis-1.internal:6380",
//!     "rediss://redis-2.internal:6380",
//!     "rediss://redis-3.internal:6380",
//! ])
//! .tls_root_certificates(ca) // trust the private CA (instead of the system's roots)
//! .tls_client_certificate(cert, key) // present a client certificate (mTLS)
//! .build()?;
//! # let _ = redlock;
//! # Ok(()) }
//! ```

use std::fmt;

use redis::{Client, ClientTlsConfig, ConnectionInfo, TlsCertificates};

use super::RedlockBuilder;
use crate::error::ConfigError;

/// The builder's TLS settings. `Debug` shows what is set, never the certificates or key.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    root: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("root_certificates", &self.root.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl TlsSettings {
    /// The client of a `rediss://` node, with these settings.
    pub(crate) fn client(&self, info: ConnectionInfo, label: &str) -> Result<Client, ConfigError> {
        install_provider();
        let tls_error = |e: redis::RedisError| ConfigError::Tls {
            node: label.to_owned(),
            reason: e.to_string(),
        };
        if self.root.is_none() && self.client.is_none() {
            return Client::open(info).map_err(tls_error);
        }
        self.readable().map_err(|reason| ConfigError::Tls {
            node: label.to_owned(),
            reason,
        })?;
        let certificates = TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.root.clone(),
        };
        Client::build_with_tls(info, certificates).map_err(tls_error)
    }

    /// Whether the certificates and key parse: at least one certificate in each PEM, and
    /// a private key for the client certificate.
    fn readable(&self) -> Result<(), String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certificates = |pem: &[u8], what: &str| {
            let mut n = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                cert.map_err(|e| format!("{what}: {e}"))?;
                n += 1;
            }
            if n == 0 {
                return Err(format!("{what}: no PEM certificate found"));
            }
            Ok(())
        };
        if let Some(root) = &self.root {
            certificates(root, "the root certificates")?;
        }
        if let Some((cert, key)) = &self.client {
            certificates(cert, "the client certificate")?;
            PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("the client key: {e} (a PEM private key is needed)"))?;
        }
        Ok(())
    }

    /// Refuses certificates given for a client without any `rediss://` node: they would
    /// silently do nothing.
    pub(crate) fn check(&self, tls_nodes: usize) -> Result<(), ConfigError> {
        if tls_nodes == 0 && (self.root.is_some() || self.client.is_some()) {
            return Err(ConfigError::TlsWithoutTlsNodes);
        }
        Ok(())
    }
}

/// Makes rustls usable without the application choosing a crypto provider: installs
/// *ring* as the process default unless one is installed already (the application's
/// choice wins).
fn install_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one meanwhile: either way one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
impl RedlockBuilder {
    /// Trusts the CA certificates in `pem` (one or more PEM certificates) for `rediss://`
    /// nodes, instead of the system's roots: for servers with certificates from a private
    /// CA. Unreadable certificates are refused by [`build`](Self::build)
    /// ([`ConfigError::Tls`]), as are certificates for a client without `rediss://`
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
        self.tls.root = Some(pem.into());
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
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }
}
