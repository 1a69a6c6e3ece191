//! [`BodyKey`]: a lock name from the request body, for senders that put the delivery or
//! event id only there (Stripe's event `id`). The layer reads the start of the body (up to
//! the key's limit) before it locks, names the lock from it, and hands the inner service
//! the same bytes, unchanged, followed by the rest.
//!
//! ```text
//! body --read up to limit--> over the limit? --yes--> 413
//!                                            --no---> JSON field (or your function) --missing / not JSON--> 400
//!                                                                                  --found--> lock "{id}" --> handler (same bytes)
//! ```
//!
//! ```no_run
//! # #[cfg(feature = "json")]
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_redlock::layer::BodyKey;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! // Stripe-style: the event id is the body's `id`; one run per event, retries replayed.
//! let layer = RedlockLayer::from_body(redlock, BodyKey::json("id"))
//!     .replay(Duration::from_secs(7 * 24 * 3600));
//! # let _ = layer; Ok(()) }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::Request;

use super::{ExtractError, ExtractLockName, RequestHead};

/// The default number of body bytes a [`BodyKey`] reads: 64 KiB, more than a webhook
/// event usually is (Stripe's are a few KiB).
pub const DEFAULT_BODY_KEY_LIMIT: usize = 64 * 1024;

/// A function that names the lock from the body's bytes.
type KeyFn = dyn Fn(&[u8]) -> Result<Option<Vec<u8>>, ExtractError> + Send + Sync;

/// The lock name is in the request body: a JSON field ([`json`](Self::json), feature
/// `json`) or what your function finds ([`from_fn`](Self::from_fn)). Use it with
/// [`RedlockLayer::from_body`](crate::RedlockLayer::from_body), which reads the body's
/// start before it locks. A body over the
/// [`limit`](Self::limit) is answered 413; a body without the field, or not JSON, 400.
#[derive(Clone)]
pub struct BodyKey {
    source: Source,
    limit: usize,
}

#[derive(Clone)]
enum Source {
    /// The JSON value at this pointer (RFC 6901, such as `/data/object/id`).
    #[cfg(feature = "json")]
    Json(String),
    Fn(Arc<KeyFn>),
}

impl fmt::Debug for BodyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            #[cfg(feature = "json")]
            Source::Json(pointer) => pointer.as_str(),
            Source::Fn(_) => "<function>",
        };
        f.debug_struct("BodyKey")
            .field("source", &source)
            .field("limit", &self.limit)
            .finish()
    }
}

impl BodyKey {
    /// The lock name is the JSON field at `path`: dot-separated member names (`id`,
    /// `data.object.id`) or a JSON pointer (`/data/object/id`). A string names the lock
    /// by its text, a number by its digits; anything else, a missing field, or a body
    /// that is not JSON is answered 400.
    ///
    /// ```
    /// use tower_redlock::layer::BodyKey;
    ///
    /// let key = BodyKey::json("data.object.id");
    /// assert_eq!(key.key_of(br#"{"data":{"object":{"id":"pi_3"}}}"#), Ok(b"pi_3".to_vec()));
    /// assert!(key.key_of(br#"{"data":{}}"#).is_err());
    /// ```
    #[cfg(feature = "json")]
    #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
    pub fn json(path: &str) -> Self {
        let pointer = if path.starts_with('/') || path.is_empty() {
            path.to_owned()
        } else {
            path.split('.')
                .map(|member| format!("/{}", member.replace('~', "~0").replace('/', "~1")))
                .collect()
        };
        Self {
            source: Source::Json(pointer),
            limit: DEFAULT_BODY_KEY_LIMIT,
        }
    }

    /// The lock name is what `f` finds in the body's bytes (all of them, up to the
    /// [`limit`](Self::limit)): `Ok(Some(name))` locks it, `Ok(None)` passes the request
    /// through without a lock, `Err(_)` answers 400 with the error's message.
    ///
    /// ```
    /// use tower_redlock::layer::{BodyKey, ExtractError};
    ///
    /// // A form post: `event=evt_1&...`.
    /// let key = BodyKey::from_fn(|body| {
    ///     let body = std::str::from_utf8(body).map_err(|_| ExtractError::new("not UTF-8"))?;
    ///     Ok(body
    ///         .split('&')
    ///         .find_map(|pair| pair.strip_prefix("event="))
    ///         .map(|id| id.as_bytes().to_vec()))
    /// });
    /// assert_eq!(key.key_of(b"event=evt_1&x=2"), Ok(b"evt_1".to_vec()));
    /// ```
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&[u8]) -> Result<Option<Vec<u8>>, ExtractError> + Send + Sync + 'static,
    {
        Self {
            source: Source::Fn(Arc::new(f)),
            limit: DEFAULT_BODY_KEY_LIMIT,
        }
    }

    /// Reads at most `bytes` of the body for the name (default
    /// [`DEFAULT_BODY_KEY_LIMIT`], 64 KiB); a longer body is answered 413. What is read is
    /// held (not copied) until the handler reads it.
    #[must_use = "a BodyKey does nothing until a layer uses it"]
    pub fn limit(mut self, bytes: usize) -> Self {
        self.limit = bytes;
        self
    }

    /// The name this key finds in `body`, or why there is none (a function's `Ok(None)`
    /// included): for tests of a key.
    pub fn key_of(&self, body: &[u8]) -> Result<Vec<u8>, ExtractError> {
        self.find(body)?
            .ok_or_else(|| ExtractError::new("the request body has no lock name"))
    }

    /// The name in `body`: `None` passes the request through.
    fn find(&self, body: &[u8]) -> Result<Option<Vec<u8>>, ExtractError> {
        match &self.source {
            #[cfg(feature = "json")]
            Source::Json(pointer) => json_key(body, pointer).map(Some),
            Source::Fn(f) => f(body),
        }
    }
}

/// The string or number at `pointer` in the JSON document `body`.
#[cfg(feature = "json")]
fn json_key(body: &[u8], pointer: &str) -> Result<Vec<u8>, ExtractError> {
    let document: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| ExtractError::new("the request body is not JSON"))?;
    let missing = || ExtractError::new(format!("the request body has no `{pointer}` field"));
    match document.pointer(pointer).ok_or_else(missing)? {
        serde_json::Value::String(s) if !s.is_empty() => Ok(s.as_bytes().to_vec()),
        serde_json::Value::Number(n) => Ok(n.to_string().into_bytes()),
        _ => Err(ExtractError::new(format!(
            "the request body's `{pointer}` field is not a non-empty string or a number"
        ))),
    }
}

impl<B> ExtractLockName<B> for BodyKey {
    /// A body key cannot name a lock from the head: a layer built with
    /// [`RedlockLayer::new`](crate::RedlockLayer::new) instead of
    /// [`from_body`](crate::RedlockLayer::from_body) answers 500 (and logs why).
    fn extract(&self, _request: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
        Err(ExtractError::new(
            "the lock name is in the request body: build the layer with RedlockLayer::from_body",
        ))
    }

    fn body_limit(&self) -> Option<usize> {
        Some(self.limit)
    }

    fn extract_from_body(
        &self,
        _head: &RequestHead<'_>,
        body: &[u8],
    ) -> Result<Option<Vec<u8>>, ExtractError> {
        self.find(body)
    }

    /// `body:{JSON pointer}` (`body:/data/object/id`), or `body:fn` for a function.
    fn namespace(&self) -> Cow<'_, str> {
        match &self.source {
            #[cfg(feature = "json")]
            Source::Json(pointer) => Cow::Owned(format!("body:{pointer}")),
            Source::Fn(_) => Cow::Borrowed("body:fn"),
        }
    }
}

#[cfg(all(test, feature = "json"))]
mod tests {
    use super::*;
    use crate::layer::{PerPrincipal, PerRoute};

    fn head_of(req: &Request<()>) -> RequestHead<'_> {
        RequestHead::of(req)
    }

    #[test]
    fn scoped_body_keys_keep_their_scope() {
        let req = Request::post("/hooks/stripe")
            .header("authorization", "Bearer a")
            .body(())
            .unwrap_or_else(|_| unreachable!("a valid request"));
        let body = br#"{"id":"evt_1"}"#;
        let routed = PerRoute::new(BodyKey::json("id"));
        assert_eq!(
            ExtractLockName::<()>::body_limit(&routed),
            Some(DEFAULT_BODY_KEY_LIMIT)
        );
        assert_eq!(
            ExtractLockName::<()>::extract_from_body(&routed, &head_of(&req), body),
            Ok(Some(b"POST /hooks/stripe evt_1".to_vec()))
        );
        let by_caller = PerPrincipal::new(BodyKey::json("id").limit(10));
        assert_eq!(ExtractLockName::<()>::body_limit(&by_caller), Some(10));
        let name = ExtractLockName::<()>::extract_from_body(&by_caller, &head_of(&req), body);
        let name = name.ok().flatten().unwrap_or_default();
        assert!(
            name.ends_with(b" evt_1") && name.len() == 32 + 6,
            "{name:?}"
        );
        // From the head alone, a body key is an error, never a name.
        assert!(routed.extract(&req).is_err());
    }

    #[test]
    fn json_paths_and_values() {
        let body = br#"{"a.b":{"c/d":7},"n":12.5,"s":"","t":true,"data":{"object":{"id":"pi"}}}"#;
        assert_eq!(BodyKey::json("/a.b/c~1d").key_of(body), Ok(b"7".to_vec()));
        assert_eq!(BodyKey::json("n").key_of(body), Ok(b"12.5".to_vec()));
        assert_eq!(
            BodyKey::json("data.object.id").key_of(body),
            Ok(b"pi".to_vec())
        );
        for refused in ["s", "t", "data", "missing", ""] {
            assert!(BodyKey::json(refused).key_of(body).is_err(), "{refused}");
        }
        assert!(BodyKey::json("id").key_of(b"not json").is_err());
        let none = BodyKey::from_fn(|_| Ok(None));
        assert!(none.key_of(b"x").is_err(), "no name is not a key");
    }
}
