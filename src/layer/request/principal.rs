//! Who sent a request, for idempotent replay: a stored response is only ever for the
//! caller that sent the first request. The caller is the [`Principal`] your
//! authentication middleware put into the request extensions, or the one the layer's
//! [`Caller`](crate::layer::Caller) source names (a session cookie, an API-key header, a
//! client certificate), or else the request's `Authorization` header. Only a SHA-256 of it is used (in the request fingerprint, and
//! by [`PerPrincipal`](crate::layer::PerPrincipal) in lock names); the credential itself is never
//! stored or logged.
//!
//! ```
//! use tower_redlock::layer::{Principal, RequestFingerprint};
//!
//! let alice = http::Request::post("/payments").header("authorization", "Bearer a").body(()).unwrap();
//! let bob = http::Request::post("/payments").header("authorization", "Bearer b").body(()).unwrap();
//! // Same method and path, another caller: another fingerprint (a reused key gets 422).
//! assert_ne!(RequestFingerprint::of(&alice, b""), RequestFingerprint::of(&bob, b""));
//!
//! // An account id from the authentication middleware wins over the header, so a client
//! // whose token was refreshed between its retries is still the same caller.
//! let mut refreshed = http::Request::post("/payments").header("authorization", "Bearer a2").body(()).unwrap();
//! let mut first = alice;
//! first.extensions_mut().insert(Principal::new("acct_42"));
//! refreshed.extensions_mut().insert(Principal::new("acct_42"));
//! assert_eq!(RequestFingerprint::of(&first, b""), RequestFingerprint::of(&refreshed, b""));
//! ```

use std::fmt;

use http::header::AUTHORIZATION;
use sha2::{Digest, Sha256};

/// The caller of a request (an account or user id), put into the request extensions by
/// your authentication middleware. With replay on, it identifies the caller in the
/// request fingerprint instead of the `Authorization` header (see
/// [`RequestFingerprint::of`](crate::layer::RequestFingerprint::of)), and
/// [`PerPrincipal`](crate::layer::PerPrincipal) scopes lock names to it.
///
/// `Debug` never shows it.
///
/// ```
/// use tower_redlock::layer::Principal;
///
/// let mut req = http::Request::post("/payments").body(()).unwrap();
/// // In an axum or tower middleware, once the token is checked:
/// req.extensions_mut().insert(Principal::new("acct_42"));
/// assert_eq!(req.extensions().get::<Principal>().map(Principal::as_bytes), Some(&b"acct_42"[..]));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Principal(Vec<u8>);

impl Principal {
    /// The caller `id` (bytes; an account id, not a credential).
    pub fn new(id: impl Into<Vec<u8>>) -> Self {
        Self(id.into())
    }

    /// The id.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Principal(<redacted>)")
    }
}

/// The SHA-256 of the caller of a request with `headers` and `extensions`: its
/// [`Principal`], or else its `Authorization` header (every value); `None` when it has
/// neither.
pub(crate) fn caller_digest(
    headers: &http::HeaderMap,
    extensions: &http::Extensions,
) -> Option<[u8; 32]> {
    let mut h = Sha256::new();
    if let Some(principal) = extensions.get::<Principal>() {
        h.update(b"principal\n");
        h.update(principal.as_bytes());
    } else {
        let mut values = headers.get_all(AUTHORIZATION).iter().peekable();
        values.peek()?;
        h.update(b"authorization");
        for value in values {
            h.update(b"\n");
            h.update(value.as_bytes());
        }
    }
    Some(h.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_principal_wins_over_the_header_and_no_caller_is_none() {
        let mut headers = http::HeaderMap::new();
        let mut extensions = http::Extensions::new();
        assert_eq!(caller_digest(&headers, &extensions), None);
        headers.insert(AUTHORIZATION, http::HeaderValue::from_static("Bearer a"));
        let by_header = caller_digest(&headers, &extensions);
        assert!(by_header.is_some());
        extensions.insert(Principal::new("Bearer a"));
        let by_principal = caller_digest(&headers, &extensions);
        assert!(by_principal.is_some() && by_principal != by_header);
        headers.insert(AUTHORIZATION, http::HeaderValue::from_static("Bearer b"));
        assert_eq!(caller_digest(&headers, &extensions), by_principal);
        assert_eq!(
            format!("{:?}", Principal::new("secret")),
            "Principal(<redacted>)"
        );
    }
}
