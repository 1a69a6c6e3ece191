//! Extractors that scope another extractor's names: [`PerRoute`] (to the method and
//! route) and [`PerPrincipal`] (to the caller).
//!
//! ```
//! use http::Request;
//! use tower_redlock::layer::{ExtractLockName, Header, PerRoute};
//!
//! let req = Request::post("/orders").header("idempotency-key", "k-1").body(()).unwrap();
//! assert_eq!(
//!     PerRoute::new(Header::new("idempotency-key")).extract(&req).unwrap(),
//!     Some(b"POST /orders k-1".to_vec())
//! );
//! ```

use std::borrow::Cow;

use http::Request;

use super::{ExtractError, ExtractLockName, RequestHead};
use crate::layer::request::principal::caller_digest;

/// Prefixes another extractor's name with the route: `"{METHOD} {route} {name}"`, where
/// the route is axum's `MatchedPath` when present (with the `axum` feature, under
/// `route_layer`), otherwise the URI path (for gRPC: `/package.Service/Method`).
#[derive(Debug, Clone)]
pub struct PerRoute<E> {
    inner: E,
}

impl<E> PerRoute<E> {
    /// Scopes `inner`'s names to the route.
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractLockName, Header, PerRoute};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Clients may reuse a key on different endpoints: scope each key to its route.
    /// let key = PerRoute::new(Header::new("idempotency-key"));
    /// let req = Request::post("/refunds").header("idempotency-key", "k-1").body(())?;
    /// assert_eq!(key.extract(&req)?, Some(b"POST /refunds k-1".to_vec()));
    /// # Ok(()) }
    /// ```
    pub fn new(inner: E) -> Self {
        Self { inner }
    }
}

fn route_of<'a>(head: &RequestHead<'a>) -> &'a str {
    #[cfg(feature = "axum")]
    if let Some(matched) = head.extensions.get::<axum::extract::MatchedPath>() {
        return matched.as_str();
    }
    head.uri.path()
}

impl<B, E: ExtractLockName<B>> ExtractLockName<B> for PerRoute<E> {
    fn extract(&self, request: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
        scoped_head(&self.inner, request, routed)
    }

    fn body_limit(&self) -> Option<usize> {
        self.inner.body_limit()
    }

    fn extract_from_body(
        &self,
        head: &RequestHead<'_>,
        body: &[u8],
    ) -> Result<Option<Vec<u8>>, ExtractError> {
        scoped_body(&self.inner, head, body, routed)
    }

    /// The inner extractor's.
    fn namespace(&self) -> Cow<'_, str> {
        self.inner.namespace()
    }
}

/// How a scoping extractor turns its inner extractor's name into its own.
type Scope = fn(&RequestHead<'_>, &[u8]) -> Vec<u8>;

/// `inner`'s name for `request`, scoped by `scope`.
fn scoped_head<B, E: ExtractLockName<B>>(
    inner: &E,
    request: &Request<B>,
    scope: Scope,
) -> Result<Option<Vec<u8>>, ExtractError> {
    let name = inner.extract(request)?;
    Ok(name.map(|name| scope(&RequestHead::of(request), &name)))
}

/// `inner`'s name from a request's `head` and `body`, scoped by `scope`.
fn scoped_body<B, E: ExtractLockName<B>>(
    inner: &E,
    head: &RequestHead<'_>,
    body: &[u8],
    scope: Scope,
) -> Result<Option<Vec<u8>>, ExtractError> {
    let name = inner.extract_from_body(head, body)?;
    Ok(name.map(|name| scope(head, &name)))
}

/// `name` scoped to the route of the request of `head`: `"{METHOD} {route} {name}"`.
fn routed(head: &RequestHead<'_>, name: &[u8]) -> Vec<u8> {
    let method = head.method.as_str();
    let route = route_of(head);
    let mut out = Vec::with_capacity(method.len() + route.len() + name.len() + 2);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(route.as_bytes());
    out.push(b' ');
    out.extend_from_slice(name);
    out
}

/// Prefixes another extractor's name with the caller: `"{caller} {name}"`, where the
/// caller is the hex of the first 16 bytes of a SHA-256 of the request's
/// [`Principal`](crate::layer::Principal) (put into the extensions by your authentication
/// middleware), or else of its `Authorization` header; `anonymous` for a request with
/// neither. The credential itself never becomes part of a name, a key or a log line.
///
/// With [`replay`](crate::RedlockLayer::replay), each caller's idempotency keys are its
/// own: another caller that sends the same key runs its own request and gets its own
/// response (without it, the default fingerprint answers that caller with 422). For locks
/// on shared resources (an order id) do not use it: callers must then exclude each other.
#[derive(Debug, Clone)]
pub struct PerPrincipal<E> {
    inner: E,
}

impl<E> PerPrincipal<E> {
    /// Scopes `inner`'s names to the caller.
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractLockName, Header, PerPrincipal};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Clients number their keys 1, 2, 3...: scope each key to the caller.
    /// let key = PerPrincipal::new(Header::new("idempotency-key").required());
    /// let as_caller = |token: &str| {
    ///     Request::post("/payments")
    ///         .header("idempotency-key", "1")
    ///         .header("authorization", token)
    ///         .body(())
    /// };
    /// let alice = key.extract(&as_caller("Bearer alice")?)?;
    /// let bob = key.extract(&as_caller("Bearer bob")?)?;
    /// assert_ne!(alice, bob);
    /// assert!(alice.is_some_and(|name| name.ends_with(b" 1")));
    /// # Ok(()) }
    /// ```
    pub fn new(inner: E) -> Self {
        Self { inner }
    }
}

impl<B, E: ExtractLockName<B>> ExtractLockName<B> for PerPrincipal<E> {
    fn extract(&self, request: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
        scoped_head(&self.inner, request, by_caller)
    }

    fn body_limit(&self) -> Option<usize> {
        self.inner.body_limit()
    }

    fn extract_from_body(
        &self,
        head: &RequestHead<'_>,
        body: &[u8],
    ) -> Result<Option<Vec<u8>>, ExtractError> {
        scoped_body(&self.inner, head, body, by_caller)
    }

    /// The inner extractor's.
    fn namespace(&self) -> Cow<'_, str> {
        self.inner.namespace()
    }
}

/// `name` scoped to the caller of the request of `head`: `"{caller} {name}"`.
fn by_caller(head: &RequestHead<'_>, name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(33 + name.len());
    match caller_digest(head.headers, head.extensions) {
        Some(digest) => {
            for b in digest.iter().take(16) {
                for nibble in [b >> 4, b & 0xf] {
                    let hex = char::from_digit(u32::from(nibble), 16).unwrap_or('0');
                    out.push(u8::try_from(hex).unwrap_or(b'0'));
                }
            }
        }
        None => out.extend_from_slice(b"anonymous"),
    }
    out.push(b' ');
    out.extend_from_slice(name);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::extract::PathSegment;

    fn req(path: &str) -> Request<()> {
        Request::get(path).body(()).unwrap_or_default()
    }

    #[test]
    fn per_principal_scopes_names_to_the_caller_without_showing_it() {
        let e = PerPrincipal::new(PathSegment::new(1));
        let with = |token: &str| {
            Request::get("/orders/7")
                .header("authorization", token)
                .body(())
                .unwrap_or_default()
        };
        let alice = e
            .extract(&with("Bearer alice"))
            .ok()
            .flatten()
            .unwrap_or_default();
        let bob = e
            .extract(&with("Bearer bob"))
            .ok()
            .flatten()
            .unwrap_or_default();
        assert_ne!(alice, bob);
        assert_eq!(alice.len(), 32 + 2);
        assert!(!alice.windows(5).any(|w| w == b"alice"));
        assert_eq!(
            e.extract(&req("/orders/7")),
            Ok(Some(b"anonymous 7".to_vec()))
        );
        assert_eq!(e.extract(&req("/")), Ok(None));
    }

    #[test]
    fn per_route_prefixes_method_and_path() {
        let e = PerRoute::new(PathSegment::new(1));
        assert_eq!(
            e.extract(&req("/orders/7")),
            Ok(Some(b"GET /orders/7 7".to_vec()))
        );
    }
}
