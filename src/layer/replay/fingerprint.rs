//! Request fingerprints for idempotent replay: what identifies a request beyond its lock
//! name, so that the same idempotency key sent with a different request is refused with
//! 422 (gRPC `INVALID_ARGUMENT`) instead of being answered with another request's
//! response.
//!
//! By default a request's fingerprint is the SHA-256 of its method, path and query, of its
//! caller (the [`Principal`](crate::layer::Principal) in its extensions, or else its
//! `Authorization` header: a hash of it; the credential is not stored), and of the start
//! of its body (the first MiB, read by the replay layer before the lock; see
//! [`RedlockLayer::body_fingerprint`](crate::RedlockLayer::body_fingerprint)). So another
//! caller that sends the same key (clients numbering their keys 1, 2, 3, or one that
//! learned another's key) gets 422, never the first caller's response, and so does the
//! same key with another body. A [`RequestFingerprint`] in the request extensions replaces
//! the default (the body is then not read): put one there yourself, for example a hash of
//! the parsed JSON and the account.
//!
//! ```
//! use tower_redlock::layer::RequestFingerprint;
//!
//! let req = http::Request::post("/orders?x=1").body(()).unwrap();
//! let plain = RequestFingerprint::of(&req, b"");
//! assert_eq!(plain, RequestFingerprint::of(&req, b""));
//! assert_ne!(plain, RequestFingerprint::of(&req, b"{\"amount\":10}"));
//! ```

use std::fmt;

use sha2::{Digest, Sha256};

use super::principal::caller_digest;

/// The fingerprint bytes stored in a completion record.
pub(crate) type Fingerprint = [u8; 32];

/// A request's fingerprint, read from the request extensions when replay is on.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestFingerprint(Fingerprint);

impl RequestFingerprint {
    /// A fingerprint from a digest you computed (32 bytes, e.g. a SHA-256).
    pub fn from_digest(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// The SHA-256 of `request`'s method, path and query, its caller (its
    /// [`Principal`](crate::layer::Principal), or else a hash of its `Authorization` header), and
    /// `body` (the whole body, or the part of it you want to count).
    pub fn of<B>(request: &http::Request<B>, body: &[u8]) -> Self {
        let mut h = Hasher::new(request);
        h.body(body);
        h.finish()
    }

    /// The digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for RequestFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex: String = self.0[..8].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "RequestFingerprint({hex}..)")
    }
}

/// A [`RequestFingerprint`] computed as the body comes, chunk by chunk (the same digest
/// as [`RequestFingerprint::of`] with the chunks joined).
pub(crate) struct Hasher {
    h: Sha256,
    body_started: bool,
}

impl Hasher {
    /// Starts with `request`'s method, path, query and caller.
    pub(crate) fn new<B>(request: &http::Request<B>) -> Self {
        let mut h = Sha256::new();
        h.update(request.method().as_str().as_bytes());
        h.update(b" ");
        let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
        h.update(target.as_bytes());
        if let Some(caller) = caller_digest(request.headers(), request.extensions()) {
            h.update(b"\ncaller ");
            h.update(caller);
        }
        Self {
            h,
            body_started: false,
        }
    }

    /// The next bytes of the body.
    pub(crate) fn body(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        if !self.body_started {
            self.h.update(b"\n");
            self.body_started = true;
        }
        self.h.update(chunk);
    }

    pub(crate) fn finish(self) -> RequestFingerprint {
        RequestFingerprint(self.h.finalize().into())
    }
}

/// The fingerprint of `request`: its [`RequestFingerprint`] extension, or the hash of its
/// method, path, query and caller.
pub(crate) fn fingerprint<B>(request: &http::Request<B>) -> Fingerprint {
    match request.extensions().get::<RequestFingerprint>() {
        Some(given) => given.0,
        None => RequestFingerprint::of(request, b"").0,
    }
}
