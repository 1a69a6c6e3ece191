//! Request fingerprints for idempotent replay: what identifies a request beyond its lock
//! name, so that the same idempotency key sent with a different request is refused with
//! 422 (gRPC `INVALID_ARGUMENT`) instead of being answered with another request's
//! response.
//!
//! By default a request's fingerprint is the SHA-256 of its method, path and query, of its
//! caller (the [`Principal`](crate::layer::Principal) in its extensions, put there by
//! your middleware or by the layer's [`Caller`](crate::layer::Caller) source, or else its
//! `Authorization` header: a hash of it; the credential is not stored), and of the start
//! of its body (the first MiB, read by the replay layer before the lock; see
//! [`RedlockLayer::body_fingerprint`](crate::RedlockLayer::body_fingerprint)), each field
//! tagged and length-prefixed so that no two different requests hash alike. So another
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

use crate::layer::request::principal::caller_digest;

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
///
/// Every field is tagged and length-prefixed (the body, last, by its total length at the
/// end), and the caller's field is there even when empty, so two different requests
/// never feed the hash the same bytes.
pub(crate) struct Hasher {
    h: Sha256,
    body_len: u64,
}

/// What a fingerprint's input starts with: its scheme.
const SCHEME: &[u8] = b"tower-redlock fingerprint 2";

impl Hasher {
    /// Starts with `request`'s method, path, query and caller.
    pub(crate) fn new<B>(request: &http::Request<B>) -> Self {
        let mut h = Sha256::new();
        h.update(SCHEME);
        field(&mut h, b'm', request.method().as_str().as_bytes());
        let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
        field(&mut h, b't', target.as_bytes());
        let caller = caller_digest(request.headers(), request.extensions());
        field(&mut h, b'c', caller.as_ref().map_or(&[][..], |c| &c[..]));
        h.update(b"b");
        Self { h, body_len: 0 }
    }

    /// The next bytes of the body.
    pub(crate) fn body(&mut self, chunk: &[u8]) {
        self.h.update(chunk);
        self.body_len = self.body_len.saturating_add(chunk.len() as u64);
    }

    pub(crate) fn finish(mut self) -> RequestFingerprint {
        self.h.update(self.body_len.to_be_bytes());
        RequestFingerprint(self.h.finalize().into())
    }
}

/// Feeds `h` the field `tag` with `value`, its length first.
fn field(h: &mut Sha256, tag: u8, value: &[u8]) {
    h.update([tag]);
    h.update((value.len() as u64).to_be_bytes());
    h.update(value);
}

/// The fingerprint of `request`: its [`RequestFingerprint`] extension, or the hash of its
/// method, path, query and caller.
pub(crate) fn fingerprint<B>(request: &http::Request<B>) -> Fingerprint {
    match request.extensions().get::<RequestFingerprint>() {
        Some(given) => given.0,
        None => RequestFingerprint::of(request, b"").0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(target: &str) -> http::Request<()> {
        http::Request::post(target).body(()).expect("request")
    }

    #[test]
    fn a_caller_never_hashes_like_a_body_that_spells_it() {
        let mut signed = post("/a");
        signed.headers_mut().insert(
            http::header::AUTHORIZATION,
            "Bearer x".parse().expect("value"),
        );
        let digest = caller_digest(signed.headers(), signed.extensions()).expect("a caller");
        // The fields the first scheme joined without lengths: "\ncaller <digest>" after
        // the target, or "\n" and a body spelling the same bytes.
        let mut spelled = b"caller ".to_vec();
        spelled.extend_from_slice(&digest);
        assert_ne!(
            RequestFingerprint::of(&signed, b""),
            RequestFingerprint::of(&post("/a"), &spelled)
        );
    }

    #[test]
    fn each_field_ends_where_its_length_says() {
        // A method, target or body that ends where the next one begins hashes apart.
        let get = http::Request::get("/a").body(()).expect("request");
        assert_ne!(
            RequestFingerprint::of(&get, b""),
            RequestFingerprint::of(&post("/a"), b"")
        );
        assert_ne!(
            RequestFingerprint::of(&post("/a"), b""),
            RequestFingerprint::of(&post("/a?"), b"")
        );
        assert_ne!(
            RequestFingerprint::of(&post("/a"), b"\0"),
            RequestFingerprint::of(&post("/a"), b"")
        );
    }

    #[test]
    fn a_body_in_chunks_hashes_as_the_whole() {
        let req = post("/orders");
        let mut h = Hasher::new(&req);
        for chunk in [&b"{\"amo"[..], b"", b"unt\":10}"] {
            h.body(chunk);
        }
        assert_eq!(h.finish(), RequestFingerprint::of(&req, b"{\"amount\":10}"));
        assert_eq!(
            fingerprint(&req),
            RequestFingerprint::of(&req, b"").0,
            "no body read: the empty body's"
        );
        let mut given = post("/orders");
        given
            .extensions_mut()
            .insert(RequestFingerprint::from_digest([7; 32]));
        assert_eq!(fingerprint(&given), [7; 32]);
    }
}
