//! TLS for real: `redis-server` with `--tls-port`, certificates from a private CA made at
//! test time, and the crate's `tls-rustls` feature alone (no crypto provider installed by
//! the test).
#![cfg(feature = "tls-rustls")]

use crate::support;

use std::time::Duration;

use support::tls::{self, Certs};
use tower_redlock::{
    ConfigError, LockError, NodeConfig, NodeError, NodeFailure, Redlock, RedlockBuilder, TlsProblem,
};

fn builder<I, S>(nodes: I) -> RedlockBuilder
where
    I: IntoIterator<Item = S>,
    S: Into<NodeConfig>,
{
    support::builder(nodes)
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_millis(500))
}

#[tokio::test]
async fn locks_over_tls_with_a_private_ca() {
    let certs = Certs::generate();
    let nodes: Vec<_> = (0..3).map(|_| tls::node(&certs, false)).collect();
    let redlock = builder(nodes.iter().map(tls::url))
        .tls_root_certificates(certs.read("ca.pem"))
        .build()
        .expect("build");
    lock_extend_unlock(&redlock, "tls-1").await;
}

/// Locks, extends and unlocks `name` on every node of `redlock` (3).
async fn lock_extend_unlock(redlock: &Redlock, name: &str) {
    let mut lock = redlock.lock(name).await.expect("lock over TLS");
    redlock
        .extend(&mut lock, Duration::from_secs(10))
        .await
        .expect("extend over TLS");
    assert_eq!(redlock.unlock(&lock).await.released(), 3);
}

/// Hardened configurations and managed services often allow TLS 1.2 only: the client
/// offers TLS 1.2 as well as 1.3 (rustls's `tls12` feature), so such nodes lock too.
#[tokio::test]
async fn locks_on_servers_that_speak_tls_1_2_only() {
    let certs = Certs::generate();
    let nodes: Vec<_> = (0..3)
        .map(|_| tls::node_with(&certs, false, "server", &["--tls-protocols", "TLSv1.2"]))
        .collect();
    let redlock = builder(nodes.iter().map(tls::url))
        .tls_root_certificates(certs.read("ca.pem"))
        .build()
        .expect("build");
    lock_extend_unlock(&redlock, "tls-1.2").await;
}

/// A `redis::Client` opened from a `rediss://` URL brings no certificates of its own: it
/// takes the builder's, like the URL nodes next to it (it was left on the system's roots,
/// and stayed down with "UnknownIssuer" while `build()` accepted the configuration).
#[tokio::test]
async fn a_client_opened_from_a_url_takes_the_builders_certificates() {
    let certs = Certs::generate();
    let nodes: Vec<_> = (0..3).map(|_| tls::node(&certs, true)).collect();
    let client = redis::Client::open(tls::url(&nodes[2])).expect("client");
    let redlock = builder([
        NodeConfig::from(tls::url(&nodes[0])),
        NodeConfig::from(tls::url(&nodes[1])),
        NodeConfig::from(client),
    ])
    .tls_root_certificates(certs.read("ca.pem"))
    .tls_client_certificate(certs.read("client.pem"), certs.read("client.key"))
    .build()
    .expect("build");
    let lock = redlock.lock("client-url").await.expect("lock");
    assert_eq!(
        redlock.unlock(&lock).await.released(),
        3,
        "the client node took part"
    );

    // Alone, too: it counts as a `rediss://` node for the certificates.
    let client = redis::Client::open(tls::url(&nodes[0])).expect("client");
    let alone = builder([client])
        .tls_root_certificates(certs.read("ca.pem"))
        .tls_client_certificate(certs.read("client.pem"), certs.read("client.key"))
        .build()
        .expect("build");
    let lock = alone.lock("client-alone").await.expect("lock");
    assert_eq!(alone.unlock(&lock).await.released(), 1);
}

/// A `redis::Client` built with its own certificates (`Client::build_with_tls`) keeps
/// them: with no builder certificates, and when the builder's would not do for it.
#[tokio::test]
async fn a_client_built_with_its_own_certificates_keeps_them() {
    let certs = Certs::generate();
    let node = tls::node(&certs, false);
    let own = || {
        redis::Client::build_with_tls(
            tls::url(&node),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(certs.read("ca.pem")),
            },
        )
        .expect("client with its own CA")
    };
    let redlock = builder([own()]).build().expect("build");
    let lock = redlock.lock("own-ca").await.expect("lock");
    assert_eq!(redlock.unlock(&lock).await.released(), 1);

    // The builder trusts another CA (for other nodes), which did not sign this server's
    // certificate: the client's own CA still wins.
    let redlock = builder([own()])
        .tls_root_certificates(certs.read("other_ca.pem"))
        .build()
        .expect("build");
    let lock = redlock
        .lock("own-ca-2")
        .await
        .expect("lock with the client's own CA");
    assert_eq!(redlock.unlock(&lock).await.released(), 1);
}

/// The TLS problem of the one node of `redlock`, and the error's text, from a `try_lock`
/// that must fail with it.
async fn tls_problem(redlock: &Redlock) -> (TlsProblem, String) {
    let err = redlock
        .try_lock("tls-problem")
        .await
        .expect_err("a TLS failure");
    let text = err.to_string();
    println!("{text}");
    let LockError::NoQuorum { failures, .. } = &err else {
        panic!("expected NoQuorum, got {err:?}");
    };
    match &failures[..] {
        [
            NodeFailure {
                error: NodeError::Tls { problem, .. },
                ..
            },
        ] => (*problem, text),
        _ => panic!("expected one NodeError::Tls, got {err:?}"),
    }
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = Certs::generate();
    let node = tls::node(&certs, true);
    let with_cert = builder(vec![tls::url(&node)])
        .tls_root_certificates(certs.read("ca.pem"))
        .tls_client_certificate(certs.read("client.pem"), certs.read("client.key"))
        .build()
        .expect("build");
    let lock = with_cert.lock("mtls").await.expect("lock with mTLS");
    let _ = with_cert.unlock(&lock).await;

    let without = builder(vec![tls::url(&node)])
        .tls_root_certificates(certs.read("ca.pem"))
        .build()
        .expect("build");
    let (problem, text) = tls_problem(&without).await;
    assert_eq!(problem, TlsProblem::ClientCertificateRequired, "{text}");
    assert!(
        text.contains("tls_client_certificate"),
        "what to do: {text}"
    );

    // A client certificate from a CA the server does not trust.
    let untrusted = builder(vec![tls::url(&node)])
        .tls_root_certificates(certs.read("ca.pem"))
        .tls_client_certificate(
            certs.read("other_client.pem"),
            certs.read("other_client.key"),
        )
        .build()
        .expect("build");
    let (problem, text) = tls_problem(&untrusted).await;
    assert_eq!(problem, TlsProblem::ClientCertificateRefused, "{text}");

    // Over TLS 1.2 the server refuses a client without a certificate with a bare
    // handshake_failure, whose message names the client certificate among the causes.
    let tls12 = tls::node_with(&certs, true, "server", &["--tls-protocols", "TLSv1.2"]);
    let without = builder(vec![tls::url(&tls12)])
        .tls_root_certificates(certs.read("ca.pem"))
        .build()
        .expect("build");
    let (problem, text) = tls_problem(&without).await;
    assert_eq!(problem, TlsProblem::HandshakeFailure, "{text}");
    assert!(text.contains("tls_client_certificate"), "{text}");
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_a_clear_per_node_error() {
    let certs = Certs::generate();
    let node = tls::node(&certs, false);
    let redlock = builder(vec![tls::url(&node)])
        .tls_root_certificates(certs.read("other_ca.pem"))
        .build()
        .expect("build");
    let (problem, text) = tls_problem(&redlock).await;
    assert_eq!(problem, TlsProblem::UnknownIssuer, "{text}");
    assert!(
        text.contains(&format!(
            "127.0.0.1:{}",
            node.arg("--tls-port").unwrap_or_default()
        )),
        "{text}"
    );
    assert!(
        text.contains("trust its CA with tls_root_certificates"),
        "what to do: {text}"
    );
    // The system's roots do not know the private CA either.
    let system_roots = builder(vec![tls::url(&node)]).build().expect("build");
    let (problem, text) = tls_problem(&system_roots).await;
    assert_eq!(problem, TlsProblem::UnknownIssuer, "{text}");
}

/// A certificate from the trusted CA, but for another name than the one the node is
/// reached by.
#[tokio::test]
async fn a_server_certificate_for_another_name_is_a_name_mismatch() {
    let certs = Certs::generate();
    let node = tls::node_with(&certs, false, "elsewhere", &[]);
    let redlock = builder(vec![tls::url(&node)])
        .tls_root_certificates(certs.read("ca.pem"))
        .build()
        .expect("build");
    let (problem, text) = tls_problem(&redlock).await;
    assert_eq!(problem, TlsProblem::NameMismatch, "{text}");
    assert!(
        text.contains("elsewhere.example"),
        "the names it is for: {text}"
    );
}

/// A server that allows only TLS 1.1, which the client does not offer.
#[tokio::test]
async fn a_server_without_tls_1_2_or_1_3_is_a_version_mismatch() {
    let certs = Certs::generate();
    let node = tls::node_with(&certs, false, "server", &["--tls-protocols", "TLSv1.1"]);
    let redlock = builder(vec![tls::url(&node)])
        .tls_root_certificates(certs.read("ca.pem"))
        .build()
        .expect("build");
    let (problem, text) = tls_problem(&redlock).await;
    assert_eq!(problem, TlsProblem::ProtocolVersion, "{text}");
    assert!(
        text.contains("the server only speaks TLS versions this client does not offer"),
        "{text}"
    );
}

/// A server that answers the handshake with something other than TLS (HTTP here). A plain
/// Redis port answers it with nothing at all: see `a_failed_tls_connect_reports_its_cause`
/// in `tests/suite/faults.rs`.
#[tokio::test]
async fn a_server_that_does_not_speak_tls_is_named_so() {
    let certs = Certs::generate();
    let http = support::GarbageServer::start().await;
    let redlock = builder(vec![format!("rediss://127.0.0.1:{}", http.port)])
        .tls_root_certificates(certs.read("ca.pem"))
        .build()
        .expect("build");
    let (problem, text) = tls_problem(&redlock).await;
    assert_eq!(problem, TlsProblem::NotTls, "{text}");
    assert!(text.contains("does not speak TLS on this port"), "{text}");
}

#[test]
fn settings_that_cannot_work_are_refused_by_build() {
    let certs = Certs::generate();
    let err = builder(["rediss://127.0.0.1:6380"])
        .tls_root_certificates(b"not a certificate".to_vec())
        .build()
        .expect_err("bad PEM");
    assert!(matches!(err, ConfigError::Tls { .. }), "{err:?}");
    let err = builder(["rediss://127.0.0.1:6380"])
        .tls_client_certificate(certs.read("client.pem"), b"no key here".to_vec())
        .build()
        .expect_err("bad key");
    assert!(err.to_string().contains("client key"), "{err}");
    let err = builder(["redis://127.0.0.1:6379"])
        .tls_root_certificates(certs.read("ca.pem"))
        .build()
        .expect_err("no TLS node");
    assert!(matches!(err, ConfigError::TlsWithoutTlsNodes), "{err:?}");
    let insecure = builder(["rediss://127.0.0.1:6380/#insecure"]).build();
    if cfg!(feature = "tls-insecure") {
        assert!(insecure.is_ok(), "{insecure:?}");
    } else {
        let err = insecure.expect_err("insecure without the feature");
        assert!(matches!(err, ConfigError::InsecureTls { .. }), "{err:?}");
    }
}

/// Credentials given in a URL or a `redis::ConnectionInfo` appear in no error text and no
/// `Debug` output.
#[tokio::test]
async fn credentials_never_show() {
    let certs = Certs::generate();
    let node = tls::node(&certs, false);
    let port = node.arg("--tls-port").unwrap_or_default().to_owned();
    let url = format!("rediss://locker:hunter2-secret@127.0.0.1:{port}");
    let info: redis::ConnectionInfo = format!("rediss://other:s3cret-two@localhost:{port}")
        .parse()
        .expect("connection info");
    let builder = Redlock::builder([
        tower_redlock::NodeConfig::from(url),
        tower_redlock::NodeConfig::from(info),
        tower_redlock::NodeConfig::from(format!("rediss://:third-secret@[::1]:{port}")),
    ])
    .ttl(Duration::from_secs(10))
    .node_timeout(Duration::from_millis(500))
    .restart_quarantine(false)
    .tls_root_certificates(certs.read("ca.pem"));
    let shown = format!("{builder:?}");
    let redlock = builder.build().expect("build");
    let err = redlock.try_lock("auth").await.expect_err("no such user");
    for text in [
        shown,
        format!("{redlock:?}"),
        err.to_string(),
        format!("{err:?}"),
    ] {
        for secret in ["hunter2", "s3cret", "third-secret"] {
            assert!(!text.contains(secret), "a credential shows: {text}");
        }
    }
}
