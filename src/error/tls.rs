//! [`TlsProblem`]: which TLS problem a node's connection ran into, and what to do about
//! it. It is read off the `redis` error: the rustls error inside it where there is one,
//! else the error's message.
//!
//! ```
//! use tower_redlock::{NodeError, TlsProblem};
//!
//! let err = NodeError::Tls {
//!     problem: TlsProblem::UnknownIssuer,
//!     detail: "invalid peer certificate: UnknownIssuer".into(),
//! };
//! // What happened, what to do, and the TLS library's own words.
//! assert!(err.to_string().contains("trust its CA with tls_root_certificates"));
//! assert!(err.to_string().ends_with("(invalid peer certificate: UnknownIssuer)"));
//! ```

use std::fmt;

/// Which TLS problem stopped a node's connection: the `problem` of a
/// [`NodeError::Tls`](crate::NodeError::Tls). Each variant's docs say what to do; so does
/// its `Display`.
///
/// ```no_run
/// use tower_redlock::{LockError, NodeError, Redlock, TlsProblem};
///
/// # async fn demo(redlock: Redlock) {
/// if let Err(LockError::NoQuorum { failures, .. }) = redlock.try_lock("job:7").await {
///     for failure in &failures {
///         if let NodeError::Tls { problem: TlsProblem::UnknownIssuer, .. } = failure.error {
///             eprintln!("{}: its CA is not trusted", failure.node);
///         }
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsProblem {
    /// The server and this client share no TLS version: the client offers TLS 1.3 and
    /// 1.2, and the server allows only others (`tls-protocols TLSv1.1`, say). Allow TLS
    /// 1.2 or 1.3 on the server.
    ProtocolVersion,
    /// The server's certificate is not signed by a CA this client trusts: a private CA,
    /// which the system's roots do not hold, or not the CA given. Trust the CA that signed
    /// it with `RedlockBuilder::tls_root_certificates`.
    UnknownIssuer,
    /// The server's certificate is not valid for the host name or address the node is
    /// reached by (its subjectAltName lists others). Reach the node by a name its
    /// certificate lists, or give the server a certificate for this name.
    NameMismatch,
    /// The server's certificate has expired, or is not valid yet. Renew it, or check the
    /// clock of this machine.
    CertificateExpired,
    /// The server asks for a client certificate (`tls-auth-clients yes`) and got none.
    /// Present one with `RedlockBuilder::tls_client_certificate`.
    ClientCertificateRequired,
    /// The server refused the client certificate presented: not signed by a CA it trusts
    /// (its `tls-ca-cert-file`), expired, revoked or not allowed. Present one that a CA
    /// the server trusts signed.
    ClientCertificateRefused,
    /// The server ended the handshake without naming the cause (the `handshake_failure`
    /// alert). Over TLS 1.2 this is how a server that requires a client certificate
    /// refuses a client without one (present one with
    /// `RedlockBuilder::tls_client_certificate`);
    /// otherwise the two share no cipher suite or key exchange (see the server's
    /// `tls-ciphers` and `tls-ciphersuites`).
    HandshakeFailure,
    /// The server did not answer the handshake with TLS: it sent something else, or hung
    /// up without a TLS alert. The port is probably a plain one: use `redis://` for it, or
    /// the server's `tls-port` for `rediss://`. (A plain Redis port sends nothing back to
    /// a handshake: that shows as a connect timeout, whose message says so.)
    NotTls,
    /// Another TLS failure; the detail says which.
    Other,
}

impl fmt::Display for TlsProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ProtocolVersion => {
                "the server only speaks TLS versions this client does not offer (it offers \
                 TLS 1.2 and 1.3): allow TLS 1.2 or 1.3 on the server (tls-protocols)"
            }
            Self::UnknownIssuer => {
                "the server's certificate is not signed by a CA this client trusts: trust its \
                 CA with tls_root_certificates"
            }
            Self::NameMismatch => {
                "the server's certificate is not valid for the node's host name or address: \
                 reach the node by a name its certificate lists, or give the server a \
                 certificate for this name"
            }
            Self::CertificateExpired => {
                "the server's certificate has expired or is not valid yet: renew it, or check \
                 this machine's clock"
            }
            Self::ClientCertificateRequired => {
                "the server requires a client certificate (tls-auth-clients): present one \
                 with tls_client_certificate"
            }
            Self::ClientCertificateRefused => {
                "the server refused the client certificate: present one signed by a CA the \
                 server trusts (its tls-ca-cert-file)"
            }
            Self::HandshakeFailure => {
                "the server ended the handshake without a cause: if it requires a client \
                 certificate, present one with tls_client_certificate; else the two share no \
                 cipher suite"
            }
            Self::NotTls => {
                "the server does not speak TLS on this port: use redis:// for a plain port, \
                 or the server's tls-port"
            }
            Self::Other => "the TLS handshake failed",
        })
    }
}

impl TlsProblem {
    /// The TLS problem behind `error`, if it is a TLS failure: from the rustls error in its
    /// chain where there is one, else from its message. `None` for a Redis error reply.
    pub(crate) fn of(error: &redis::RedisError) -> Option<Self> {
        if matches!(
            error.kind(),
            redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
        ) {
            return None; // a reply of the server, whatever its words
        }
        #[cfg(feature = "tls-rustls")]
        if let Some(tls) = rustls_error(error, 0) {
            return Some(Self::of_rustls(tls));
        }
        Self::of_message(&error.to_string())
    }

    /// The problem a rustls error stands for.
    #[cfg(feature = "tls-rustls")]
    pub(crate) fn of_rustls(error: &rustls::Error) -> Self {
        use rustls::{
            AlertDescription as Alert, CertificateError as Cert, Error, InvalidMessage,
            PeerIncompatible,
        };
        match error {
            Error::AlertReceived(Alert::ProtocolVersion)
            | Error::PeerIncompatible(
                PeerIncompatible::ServerDoesNotSupportTls12Or13
                | PeerIncompatible::ServerTlsVersionIsDisabledByOurConfig,
            ) => Self::ProtocolVersion,
            Error::InvalidCertificate(Cert::UnknownIssuer) => Self::UnknownIssuer,
            Error::InvalidCertificate(
                Cert::NotValidForName | Cert::NotValidForNameContext { .. },
            ) => Self::NameMismatch,
            Error::InvalidCertificate(
                Cert::Expired
                | Cert::ExpiredContext { .. }
                | Cert::NotValidYet
                | Cert::NotValidYetContext { .. },
            ) => Self::CertificateExpired,
            Error::AlertReceived(Alert::CertificateRequired) => Self::ClientCertificateRequired,
            // A server sees no certificate but ours: a certificate alert is about ours.
            Error::AlertReceived(
                Alert::BadCertificate
                | Alert::UnsupportedCertificate
                | Alert::CertificateRevoked
                | Alert::CertificateExpired
                | Alert::CertificateUnknown
                | Alert::UnknownCA
                | Alert::AccessDenied,
            ) => Self::ClientCertificateRefused,
            Error::AlertReceived(Alert::HandshakeFailure) => Self::HandshakeFailure,
            // The first bytes back are no TLS record header.
            Error::InvalidMessage(
                InvalidMessage::InvalidContentType | InvalidMessage::UnknownProtocolVersion,
            ) => Self::NotTls,
            _ => Self::Other,
        }
    }

    /// The problem a TLS error's message names: for an error whose rustls error is not in
    /// its chain (the typed path comes first). `None` when it names no TLS failure.
    pub(crate) fn of_message(message: &str) -> Option<Self> {
        let m = message.to_ascii_lowercase();
        let has = |words: &[&str]| words.iter().any(|w| m.contains(w));
        let problem = if has(&[
            "fatal alert: protocolversion",
            "serverdoesnotsupporttls12or13",
            "servertlsversionisdisabledbyourconfig",
        ]) {
            Self::ProtocolVersion
        } else if has(&["unknownissuer"]) {
            Self::UnknownIssuer
        } else if has(&["certificate not valid for name", "notvalidforname"]) {
            Self::NameMismatch
        } else if has(&[
            "invalid peer certificate: expired",
            "invalid peer certificate: notvalidyet",
            "invalid peer certificate: certificate expired",
            "invalid peer certificate: certificate not valid yet",
        ]) {
            Self::CertificateExpired
        } else if has(&["fatal alert: certificaterequired"]) {
            Self::ClientCertificateRequired
        } else if has(&[
            "fatal alert: badcertificate",
            "fatal alert: unsupportedcertificate",
            "fatal alert: certificaterevoked",
            "fatal alert: certificateexpired",
            "fatal alert: certificateunknown",
            "fatal alert: unknownca",
            "fatal alert: accessdenied",
        ]) {
            Self::ClientCertificateRefused
        } else if has(&["fatal alert: handshakefailure"]) {
            Self::HandshakeFailure
        } else if has(&[
            "corrupt message of type invalidcontenttype",
            "corrupt message of type unknownprotocolversion",
            // tokio-rustls, when the server hangs up during the handshake without an
            // alert (a TLS server sends one).
            "tls handshake eof",
        ]) {
            Self::NotTls
        } else if has(&[
            "fatal alert",
            "invalid peer certificate",
            "received corrupt message",
            "peer is incompatible",
            "peer misbehaved",
        ]) {
            Self::Other
        } else {
            return None;
        };
        Some(problem)
    }
}

/// The rustls error in `error`'s chain, if any. It sits inside an `io::Error` (where
/// `source()` does not lead: an `io::Error` hands on its inner error's source, not the
/// inner error), which redis-rs keeps in an `Arc`; so each link is looked into as well as
/// followed.
#[cfg(feature = "tls-rustls")]
fn rustls_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
    depth: usize,
) -> Option<&'a rustls::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    // Far deeper than any chain redis-rs builds; a bound all the same.
    if depth > 16 {
        return None;
    }
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let inner = match error.downcast_ref::<std::io::Error>() {
        Some(io) => io
            .get_ref()
            .map(|e| e as &(dyn std::error::Error + 'static)),
        None => error
            .downcast_ref::<Shared>()
            .map(|shared| &**shared as &(dyn std::error::Error + 'static)),
    };
    inner
        .and_then(|e| rustls_error(e, depth + 1))
        .or_else(|| error.source().and_then(|e| rustls_error(e, depth + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each problem from the words rustls and tokio-rustls use, as a redis error shows
    /// them.
    #[test]
    fn messages_name_their_problem() {
        for (message, problem) in [
            (
                "received fatal alert: ProtocolVersion",
                TlsProblem::ProtocolVersion,
            ),
            (
                "peer is incompatible: ServerDoesNotSupportTls12Or13",
                TlsProblem::ProtocolVersion,
            ),
            (
                "invalid peer certificate: UnknownIssuer",
                TlsProblem::UnknownIssuer,
            ),
            (
                "invalid peer certificate: certificate not valid for name \"127.0.0.1\"; \
                 certificate is only valid for DnsName(\"elsewhere.example\")",
                TlsProblem::NameMismatch,
            ),
            (
                "invalid peer certificate: certificate expired: verification time 2 (UNIX), \
                 but certificate is not valid after 1 (1 seconds ago)",
                TlsProblem::CertificateExpired,
            ),
            (
                "received fatal alert: CertificateRequired",
                TlsProblem::ClientCertificateRequired,
            ),
            (
                "received fatal alert: UnknownCA",
                TlsProblem::ClientCertificateRefused,
            ),
            (
                "received fatal alert: HandshakeFailure",
                TlsProblem::HandshakeFailure,
            ),
            (
                "received corrupt message of type InvalidContentType",
                TlsProblem::NotTls,
            ),
            ("tls handshake eof", TlsProblem::NotTls),
            ("received fatal alert: DecodeError", TlsProblem::Other),
        ] {
            assert_eq!(TlsProblem::of_message(message), Some(problem), "{message}");
        }
        for not_tls in ["Connection refused (os error 111)", "broken pipe", ""] {
            assert_eq!(TlsProblem::of_message(not_tls), None, "{not_tls}");
        }
    }

    /// A Redis error reply is never a TLS problem, whatever it says.
    #[test]
    fn a_server_reply_is_no_tls_problem() {
        let reply = redis::RedisError::from((
            redis::ErrorKind::Extension,
            "MYERR",
            "received fatal alert: UnknownCA".to_owned(),
        ));
        assert_eq!(TlsProblem::of(&reply), None);
    }

    /// The typed path: rustls errors as redis-rs hands them on (inside an `io::Error`
    /// inside the redis error), including the version mismatch, which the client offering
    /// both TLS 1.2 and 1.3 no longer meets against the test servers.
    #[cfg(feature = "tls-rustls")]
    #[test]
    fn rustls_errors_in_a_redis_error_name_their_problem() {
        use rustls::{AlertDescription, CertificateError, Error, InvalidMessage, PeerIncompatible};
        let cases = [
            (
                Error::AlertReceived(AlertDescription::ProtocolVersion),
                TlsProblem::ProtocolVersion,
            ),
            (
                Error::PeerIncompatible(PeerIncompatible::ServerDoesNotSupportTls12Or13),
                TlsProblem::ProtocolVersion,
            ),
            (
                Error::PeerIncompatible(PeerIncompatible::ServerTlsVersionIsDisabledByOurConfig),
                TlsProblem::ProtocolVersion,
            ),
            (
                Error::InvalidCertificate(CertificateError::UnknownIssuer),
                TlsProblem::UnknownIssuer,
            ),
            (
                Error::InvalidCertificate(CertificateError::NotValidForName),
                TlsProblem::NameMismatch,
            ),
            (
                Error::InvalidCertificate(CertificateError::Expired),
                TlsProblem::CertificateExpired,
            ),
            (
                Error::InvalidCertificate(CertificateError::NotValidYet),
                TlsProblem::CertificateExpired,
            ),
            (
                Error::AlertReceived(AlertDescription::CertificateRequired),
                TlsProblem::ClientCertificateRequired,
            ),
            (
                Error::AlertReceived(AlertDescription::BadCertificate),
                TlsProblem::ClientCertificateRefused,
            ),
            (
                Error::AlertReceived(AlertDescription::UnknownCA),
                TlsProblem::ClientCertificateRefused,
            ),
            (
                Error::AlertReceived(AlertDescription::HandshakeFailure),
                TlsProblem::HandshakeFailure,
            ),
            (
                Error::InvalidMessage(InvalidMessage::InvalidContentType),
                TlsProblem::NotTls,
            ),
            (
                Error::InvalidCertificate(CertificateError::BadSignature),
                TlsProblem::Other,
            ),
        ];
        for (tls, problem) in cases {
            let shown = tls.to_string();
            let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
            let redis = redis::RedisError::from(io);
            assert_eq!(TlsProblem::of(&redis), Some(problem), "{shown}");
            // The message alone names the same problem.
            assert_eq!(TlsProblem::of_message(&shown), Some(problem), "{shown}");
        }
        // The typed path finds the rustls error where its message names nothing.
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, Error::DecryptError);
        let redis = redis::RedisError::from(io);
        assert!(rustls_error(&redis, 0).is_some());
        assert_eq!(TlsProblem::of_message(&redis.to_string()), None);
        assert_eq!(TlsProblem::of(&redis), Some(TlsProblem::Other));
        // As redis-rs wraps a rustls error of its own (building the TLS configuration).
        let direct = redis::RedisError::from(Error::AlertReceived(AlertDescription::UnknownCA));
        assert_eq!(
            TlsProblem::of(&direct),
            Some(TlsProblem::ClientCertificateRefused)
        );
    }
}
