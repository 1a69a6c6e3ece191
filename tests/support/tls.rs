//! TLS for the tests: a private CA, server and client certificates made with the
//! `openssl` command at test time, and `redis-server` nodes with `--tls-port`.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use super::RedisNode;

/// Certificates in a fresh directory: `ca`, `server` (for 127.0.0.1 and localhost, signed
/// by `ca`), `elsewhere` (signed by `ca` for `elsewhere.example` only: a name mismatch on
/// 127.0.0.1), `client` (signed by `ca`), `other_ca`, and `other_client` (signed by
/// `other_ca`, which the servers do not trust).
pub struct Certs {
    pub dir: PathBuf,
}

impl Certs {
    pub fn generate() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "redlock-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the certificates directory");
        let certs = Self { dir };
        certs.ca("ca");
        certs.ca("other_ca");
        certs.signed(
            "server",
            "ca",
            Some("subjectAltName=IP:127.0.0.1,DNS:localhost"),
        );
        certs.signed(
            "elsewhere",
            "ca",
            Some("subjectAltName=DNS:elsewhere.example"),
        );
        certs.signed("client", "ca", None);
        certs.signed("other_client", "other_ca", None);
        certs
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    pub fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.path(file)).expect("read a certificate")
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run openssl ({e}): install it with `apt-get install -y openssl`")
            });
        assert!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn ca(&self, name: &str) {
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=tower-redlock test {name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    fn signed(&self, name: &str, ca: &str, ext: Option<&str>) {
        self.openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ]);
        let ext_file = format!("{name}.ext");
        std::fs::write(
            self.path(&ext_file),
            ext.unwrap_or("basicConstraints=CA:FALSE"),
        )
        .expect("write the extensions file");
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-days",
            "2",
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-extfile",
            &ext_file,
            "-out",
            &format!("{name}.pem"),
        ]);
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `redis-server` with TLS on a second port (its plain port stays open for checks);
/// with `mtls`, clients must present a certificate signed by the CA.
pub fn node(certs: &Certs, mtls: bool) -> RedisNode {
    node_with(certs, mtls, "server", &[])
}

/// A TLS node as [`node`] does, presenting the certificate `cert` (`server`, or
/// `elsewhere` for one that is not valid for 127.0.0.1), with more `redis-server`
/// arguments such as `["--tls-protocols", "TLSv1.2"]`.
pub fn node_with(certs: &Certs, mtls: bool, cert: &str, extra: &[&str]) -> RedisNode {
    let file = |f: &str| certs.path(f).to_string_lossy().into_owned();
    let mut args = vec![
        "--tls-port".into(),
        "{port}".into(),
        "--tls-cert-file".into(),
        file(&format!("{cert}.pem")),
        "--tls-key-file".into(),
        file(&format!("{cert}.key")),
        "--tls-ca-cert-file".into(),
        file("ca.pem"),
        "--tls-auth-clients".into(),
        if mtls { "yes" } else { "no" }.into(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    RedisNode::start_with_args(None, args)
}

/// The `rediss://` URL of a node from [`node`].
pub fn url(node: &RedisNode) -> String {
    format!(
        "rediss://127.0.0.1:{}",
        node.arg("--tls-port").expect("a TLS node")
    )
}
