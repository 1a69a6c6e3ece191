//! TLS settings of the builder (feature `tls-rustls`): a private CA to trust, a client
//! certificate to present (mTLS), and the rustls crypto provider, chosen by the crate so
//! that enabling the feature is enough. The builder's methods that set them are in
//! `builder_tls.rs`.
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
    /// Trusts the CA certificates in `pem`.
    pub(crate) fn set_root(&mut self, pem: Vec<u8>) {
        self.root = Some(pem);
    }

    /// Presents the client certificate `cert` with its private key `key`.
    pub(crate) fn set_client(&mut self, cert: Vec<u8>, key: Vec<u8>) {
        self.client = Some((cert, key));
    }

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
        // rustls 0.23.48 deprecates *ring*'s provider for its lack of post-quantum key
        // exchange; it stays this feature's documented provider (an application that wants
        // post-quantum key exchange installs aws-lc-rs's before its first client).
        #[allow(deprecated, reason = "ring is the documented provider of `tls-rustls`")]
        let provider = rustls::crypto::ring::default_provider();
        let _ = provider.install_default();
    }
}
