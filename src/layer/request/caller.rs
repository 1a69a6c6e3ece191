//! Where a layer takes the caller of a request from when no [`Principal`] is in its
//! extensions: a header (an API key), a cookie (a session), or any function of the
//! request's head (a client certificate your TLS acceptor put into the extensions). The
//! caller counts in the replay fingerprint (another caller's request with the same key
//! gets 422, never the first caller's response) and scopes lock names with
//! [`PerPrincipal`](crate::layer::PerPrincipal). Only a SHA-256 of it is used; the value itself is
//! never stored or logged.
//!
//! Without a source, the caller is the `Principal` your authentication middleware puts
//! into the extensions, or else the `Authorization` header: apps that authenticate by
//! cookie, API-key header or mTLS tell no callers apart unless they set one.
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::layer::{Caller, Header};
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! // Clients authenticate with an API key: a reused idempotency key from another key's
//! // holder gets 422, never the first caller's response.
//! let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
//!     .replay(Duration::from_secs(24 * 3600))
//!     .caller(Caller::header(http::HeaderName::from_static("x-api-key")));
//! # let _ = layer; Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use http::header::COOKIE;

use super::principal::Principal;
use crate::layer::extract::RequestHead;

/// A function from a request's head to its caller.
type Source = dyn Fn(&RequestHead<'_>) -> Option<Principal> + Send + Sync;

/// Where a layer takes a request's caller from when no [`Principal`] is in its extensions
/// (see the module docs): [`RedlockLayer::caller`](crate::RedlockLayer::caller).
#[derive(Clone)]
pub struct Caller(Arc<Source>);

impl Caller {
    /// The value of header `name` (an API key, a client id): every value, in order.
    ///
    /// ```
    /// use tower_redlock::layer::Caller;
    ///
    /// let caller = Caller::header(http::HeaderName::from_static("x-api-key"));
    /// # let _ = caller;
    /// ```
    pub fn header(name: HeaderName) -> Self {
        Self::from_fn(move |head| {
            let mut values = head.headers.get_all(&name).iter().peekable();
            values.peek()?;
            let mut id = Vec::new();
            for value in values {
                id.extend_from_slice(&(value.len() as u64).to_be_bytes());
                id.extend_from_slice(value.as_bytes());
            }
            Some(Principal::new(id))
        })
    }

    /// The value of cookie `name` (a session id), from the request's `Cookie` headers.
    ///
    /// ```
    /// use tower_redlock::layer::Caller;
    ///
    /// let caller = Caller::cookie("session");
    /// # let _ = caller;
    /// ```
    pub fn cookie(name: impl Into<String>) -> Self {
        let name = name.into();
        Self::from_fn(move |head| {
            cookie(head, &name).map(|value| Principal::new(value.as_bytes().to_vec()))
        })
    }

    /// Any function of the request's head: for example the subject of the client
    /// certificate your TLS acceptor put into the extensions.
    ///
    /// ```
    /// use tower_redlock::layer::{Caller, Principal};
    ///
    /// /// What the TLS acceptor inserts for each connection (your own type).
    /// #[derive(Clone)]
    /// struct PeerSubject(String);
    ///
    /// let caller = Caller::from_fn(|head| {
    ///     head.extensions
    ///         .get::<PeerSubject>()
    ///         .map(|subject| Principal::new(subject.0.as_bytes().to_vec()))
    /// });
    /// # let _ = caller;
    /// ```
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Option<Principal> + Send + Sync + 'static,
    {
        Self(Arc::new(f))
    }

    /// The caller of the request with `head`, if this source names one.
    pub(crate) fn principal(&self, head: &RequestHead<'_>) -> Option<Principal> {
        (self.0)(head)
    }
}

impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Caller(..)")
    }
}

/// The value of cookie `name` in `head`'s `Cookie` headers (`a=1; b=2`), if any.
fn cookie<'a>(head: &RequestHead<'a>, name: &str) -> Option<&'a str> {
    head.headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == name).then(|| v.trim_matches('"'))
        })
}

/// Puts the caller `source` names into `request`'s extensions, if it names one and none
/// is there yet.
pub(crate) fn insert_caller<B>(source: Option<&Caller>, request: &mut http::Request<B>) {
    let Some(source) = source else {
        return;
    };
    if request.extensions().get::<Principal>().is_some() {
        return;
    }
    if let Some(principal) = source.principal(&RequestHead::of(request)) {
        request.extensions_mut().insert(principal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal_of(caller: &Caller, req: &http::Request<()>) -> Option<Vec<u8>> {
        caller
            .principal(&RequestHead::of(req))
            .map(|p| p.as_bytes().to_vec())
    }

    #[test]
    fn a_cookie_is_found_among_others_and_headers() {
        let req = http::Request::post("/")
            .header(COOKIE, "theme=dark; session=abc")
            .header(COOKIE, "other=1")
            .body(())
            .expect("request");
        let session = Caller::cookie("session");
        assert_eq!(principal_of(&session, &req), Some(b"abc".to_vec()));
        assert_eq!(principal_of(&Caller::cookie("missing"), &req), None);
        assert_eq!(
            principal_of(&Caller::cookie("ses"), &req),
            None,
            "a whole name"
        );
    }

    #[test]
    fn a_header_counts_every_value_unambiguously() {
        let key = HeaderName::from_static("x-api-key");
        let caller = Caller::header(key.clone());
        let one = http::Request::post("/")
            .header(&key, "ab")
            .body(())
            .expect("request");
        let two = http::Request::post("/")
            .header(&key, "a")
            .header(&key, "b")
            .body(())
            .expect("request");
        assert!(principal_of(&caller, &one).is_some());
        assert_ne!(principal_of(&caller, &one), principal_of(&caller, &two));
        let none = http::Request::post("/").body(()).expect("request");
        assert_eq!(principal_of(&caller, &none), None);
    }

    #[test]
    fn a_principal_already_there_wins() {
        let caller = Caller::cookie("session");
        let mut req = http::Request::post("/")
            .header(COOKIE, "session=abc")
            .body(())
            .expect("request");
        req.extensions_mut().insert(Principal::new("acct_1"));
        insert_caller(Some(&caller), &mut req);
        assert_eq!(
            req.extensions().get::<Principal>().map(Principal::as_bytes),
            Some(&b"acct_1"[..])
        );
        let mut bare = http::Request::post("/")
            .header(COOKIE, "session=abc")
            .body(())
            .expect("request");
        insert_caller(Some(&caller), &mut bare);
        assert_eq!(
            bare.extensions()
                .get::<Principal>()
                .map(Principal::as_bytes),
            Some(&b"abc"[..])
        );
        assert_eq!(format!("{caller:?}"), "Caller(..)");
    }
}
