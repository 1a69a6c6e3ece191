//! A rejection's protocol and kind: [`Protocol`] (plain HTTP or gRPC) and
//! [`RejectionKind`], with the HTTP status and the gRPC code each kind is answered with
//! (re-exported by [`reject`](crate::layer::reject), which builds the answers).
//!
//! ```
//! use tower_redlock::layer::{Protocol, RejectionKind};
//!
//! let grpc = http::Request::post("/demo.Payments/Charge")
//!     .header("content-type", "application/grpc+proto")
//!     .body(())
//!     .unwrap();
//! assert_eq!(Protocol::of(&grpc), Protocol::Grpc);
//! assert_eq!(RejectionKind::Unavailable.as_str(), "unavailable");
//! ```

use std::time::Duration;

use http::{StatusCode, header};

/// Whether a request is plain HTTP or a gRPC call (`content-type: application/grpc*`):
/// gRPC calls are rejected with trailers-only statuses instead of HTTP status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Plain HTTP.
    Http,
    /// gRPC over HTTP/2.
    Grpc,
}

impl Protocol {
    /// The protocol of `request`, from its `content-type`.
    pub fn of<B>(request: &http::Request<B>) -> Self {
        let grpc = request
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        if grpc { Self::Grpc } else { Self::Http }
    }

    /// What a request of this protocol calls its headers in a rejection's text:
    /// `header`, or `metadata` for a gRPC call.
    pub(crate) fn header_word(self) -> &'static str {
        match self {
            Self::Http => "header",
            Self::Grpc => "metadata",
        }
    }
}

/// Why a request was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectionKind {
    /// Another request holds the lock.
    Busy {
        /// When the holder's lock expires, as far as the nodes said.
        retry_after: Option<Duration>,
    },
    /// The lock service is unavailable: no quorum of nodes, or too slow to leave validity.
    Unavailable,
    /// The request cannot be locked as sent: the extractor refused it or the name is invalid.
    BadRequest,
    /// The layer is misconfigured (for example a TTL the client refuses).
    Internal,
    /// The lock name (an idempotency key) was already used, with replay on, for a
    /// different request (another method or path).
    KeyReused,
    /// With replay: the request with this key completed, but its response was larger
    /// than [`ReplayPolicy::max_body`](crate::layer::ReplayPolicy::max_body), so it was not kept
    /// and cannot be replayed (the handler does not run again either).
    ResponseNotKept,
    /// The request body is larger than the extractor reads to find the lock name in it
    /// ([`BodyKey::limit`](crate::layer::BodyKey::limit)), or than a webhook
    /// `webhook::Signature` (feature `webhook-verify`) layer reads to verify it.
    BodyTooLarge,
    /// A webhook delivery whose signature is missing, malformed, stale or wrong
    /// (`webhook::Signature`, feature `webhook-verify`): refused before the lock.
    Unauthenticated,
}

impl RejectionKind {
    /// The kind as the `kind` member of problem documents: `busy`, `unavailable`,
    /// `bad_request`, `internal`, `key_reused`, `response_not_kept`, `body_too_large` or
    /// `unauthenticated`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectionKind::Busy { .. } => "busy",
            RejectionKind::Unavailable => "unavailable",
            RejectionKind::BadRequest => "bad_request",
            RejectionKind::Internal => "internal",
            RejectionKind::KeyReused => "key_reused",
            RejectionKind::ResponseNotKept => "response_not_kept",
            RejectionKind::BodyTooLarge => "body_too_large",
            RejectionKind::Unauthenticated => "unauthenticated",
        }
    }
}

/// gRPC status codes used here.
mod code {
    pub(super) const INVALID_ARGUMENT: u8 = 3;
    pub(super) const ALREADY_EXISTS: u8 = 6;
    pub(super) const RESOURCE_EXHAUSTED: u8 = 8;
    pub(super) const ABORTED: u8 = 10;
    pub(super) const INTERNAL: u8 = 13;
    pub(super) const UNAVAILABLE: u8 = 14;
    pub(super) const UNAUTHENTICATED: u8 = 16;
}

impl RejectionKind {
    /// The HTTP status a rejection of this kind is answered with.
    pub(super) fn http_status(&self) -> StatusCode {
        match self {
            RejectionKind::Busy { .. } => StatusCode::CONFLICT,
            RejectionKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            RejectionKind::BadRequest => StatusCode::BAD_REQUEST,
            RejectionKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            RejectionKind::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            RejectionKind::ResponseNotKept => StatusCode::GONE,
            RejectionKind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            RejectionKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }

    /// The gRPC status code a rejection of this kind is answered with.
    pub(super) fn grpc_code(&self) -> u8 {
        match self {
            RejectionKind::Busy { .. } => code::ABORTED,
            RejectionKind::Unavailable => code::UNAVAILABLE,
            RejectionKind::BadRequest => code::INVALID_ARGUMENT,
            RejectionKind::Internal => code::INTERNAL,
            RejectionKind::KeyReused => code::INVALID_ARGUMENT,
            RejectionKind::ResponseNotKept => code::ALREADY_EXISTS,
            RejectionKind::BodyTooLarge => code::RESOURCE_EXHAUSTED,
            RejectionKind::Unauthenticated => code::UNAUTHENTICATED,
        }
    }
}
