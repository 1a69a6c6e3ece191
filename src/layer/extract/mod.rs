//! Turning a request into a lock name.
//!
//! An extractor ([`ExtractLockName`]) looks at a request and answers `Ok(Some(name))`
//! (lock that name), `Ok(None)` (pass the request through without a lock) or `Err(_)`
//! (reject it as bad input: HTTP 400 / gRPC `INVALID_ARGUMENT`). The stock extractors:
//!
//! - [`Header`]: a header's value, e.g. `X-GitHub-Delivery`, or `Idempotency-Key` read as
//!   the structured-field string the IETF draft defines (`"k-1"`, or unquoted `k-1`);
//! - [`PathSegment`] and [`PathParam`]: a segment of the URI path, by position or by a
//!   route template such as `/webhooks/{provider}/{id}`;
//! - [`extract_fn`]: a closure over the [`RequestHead`];
//! - [`PerRoute`](crate::layer::PerRoute): prefixes another extractor's name with the route (method and matched
//!   path, or gRPC method), for per-route locks;
//! - [`PerPrincipal`](crate::layer::PerPrincipal): prefixes another extractor's name with (a hash of) the caller, for
//!   idempotency keys scoped to the caller, as Stripe scopes them to the account.
//!
//! ```
//! use http::Request;
//! use tower_redlock::layer::{ExtractLockName, Header, PerRoute, extract_fn};
//!
//! let req = Request::post("/orders").header("idempotency-key", r#""k-1""#).body(()).unwrap();
//! assert_eq!(Header::new("idempotency-key").extract(&req).unwrap(), Some(b"k-1".to_vec()));
//! assert_eq!(
//!     PerRoute::new(Header::new("idempotency-key")).extract(&req).unwrap(),
//!     Some(b"POST /orders k-1".to_vec())
//! );
//! let by_query = extract_fn(|head| Ok(head.uri.query().map(|q| q.as_bytes().to_vec())));
//! assert_eq!(by_query.extract(&req).unwrap(), None); // no query: no lock
//! ```

use std::borrow::Cow;
use std::fmt;

use http::header::HeaderName;
use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

use crate::layer::reject::Protocol;
use structured_field::KeyError;

/// An extractor's refusal: the request is malformed for locking (answered with HTTP 400 /
/// gRPC `INVALID_ARGUMENT` and the message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractError {
    message: Cow<'static, str>,
}

impl ExtractError {
    /// An error with a message for the client.
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractError, ExtractLockName, extract_fn};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Names the handler cannot use are the client's mistake: answered with 400 and this text.
    /// let tenant = extract_fn(|head| match head.headers.get("x-tenant") {
    ///     Some(v) if v.len() > 64 => Err(ExtractError::new("x-tenant is over 64 bytes")),
    ///     v => Ok(v.map(|v| v.as_bytes().to_vec())),
    /// });
    /// let req = Request::get("/").header("x-tenant", "a".repeat(65)).body(())?;
    /// assert_eq!(tenant.extract(&req), Err(ExtractError::new("x-tenant is over 64 bytes")));
    /// # Ok(()) }
    /// ```
    pub fn new(message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ExtractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ExtractError {}

/// Derives a lock name from a request. See the [module docs](self).
pub trait ExtractLockName<B> {
    /// `Ok(Some(name))` locks `name`, `Ok(None)` passes the request through without a
    /// lock, `Err(_)` rejects it as bad input.
    fn extract(&self, request: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError>;

    /// How many bytes of the request body this extractor reads to name the lock (a
    /// [`BodyKey`](crate::layer::BodyKey)); `None`, the default, when the head is enough. A layer
    /// built with [`RedlockLayer::from_body`](crate::RedlockLayer::from_body) reads them
    /// before it locks, and names the lock with
    /// [`extract_from_body`](Self::extract_from_body).
    fn body_limit(&self) -> Option<usize> {
        None
    }

    /// The name, from the request's head and the start of its body: all of it, when it is
    /// at most [`body_limit`](Self::body_limit) bytes long. Only called when `body_limit`
    /// is `Some`; the default names the lock from the head alone.
    fn extract_from_body(
        &self,
        head: &RequestHead<'_>,
        body: &[u8],
    ) -> Result<Option<Vec<u8>>, ExtractError> {
        let _ = (head, body);
        Err(ExtractError::new(
            "this extractor names locks from the request head",
        ))
    }

    /// The namespace of this extractor's names: a [`RedlockLayer`](crate::RedlockLayer)
    /// locks `"{namespace} {name}"`, so that two layers on one client lock different names
    /// even when their extractors give the same ones (a delivery id `46` and an account id
    /// `46`), unless the layer is given a namespace with
    /// [`RedlockLayer::namespace`](crate::RedlockLayer::namespace) (the same one to share
    /// names on purpose, `""` for the extractor's names as they are).
    ///
    /// The stock extractors say where they read the name: [`Header`] `header:{name}` (in
    /// lower case), [`PathSegment`] `path-segment:{index}`,
    /// [`PathParam`] `path:{template}#{param}`,
    /// [`BodyKey`](crate::layer::BodyKey) `body:{JSON pointer}` (`body:fn` for a function), and
    /// [`PerRoute`](crate::layer::PerRoute), [`PerPrincipal`](crate::layer::PerPrincipal) and
    /// [`GrpcMethods`](crate::layer::GrpcMethods) their inner extractor's. So two layers with the
    /// same extractor (the `Idempotency-Key` header on two routers) share names, as one
    /// layer's routes do; name the layers to keep them apart.
    ///
    /// The default, `fn`, is the namespace of every [`extract_fn`] closure and of every
    /// extractor that does not override it: **two layers with closure extractors share a
    /// namespace** unless you name them with
    /// [`RedlockLayer::namespace`](crate::RedlockLayer::namespace) (or override this in
    /// your extractor).
    ///
    /// A namespace must be the same in every process and every build of the application
    /// (two instances, or two versions during a rolling deploy, must lock the same names):
    /// derive it from the extractor's settings, never from randomness, addresses or
    /// [`std::any::type_name`]. A layer asks for it once, at its first request.
    ///
    /// ```
    /// use std::borrow::Cow;
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractError, ExtractLockName, Header, PathParam};
    ///
    /// let delivery = Header::new("X-Delivery-Id");
    /// assert_eq!(ExtractLockName::<()>::namespace(&delivery), "header:x-delivery-id");
    /// let accounts = PathParam::new("/accounts/{id}/credit", "id");
    /// assert_eq!(ExtractLockName::<()>::namespace(&accounts), "path:/accounts/{id}/credit#id");
    ///
    /// // Your own extractor says where its names come from.
    /// struct Tenant;
    /// impl<B> ExtractLockName<B> for Tenant {
    ///     fn extract(&self, req: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
    ///         Ok(req.headers().get("x-tenant").map(|v| v.as_bytes().to_vec()))
    ///     }
    ///     fn namespace(&self) -> Cow<'_, str> {
    ///         Cow::Borrowed("tenant")
    ///     }
    /// }
    /// ```
    fn namespace(&self) -> Cow<'_, str> {
        Cow::Borrowed("fn")
    }
}

/// The parts of a request an extractor closure sees.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URI.
    pub uri: &'a Uri,
    /// The HTTP version.
    pub version: Version,
    /// The headers (gRPC metadata arrives here).
    pub headers: &'a HeaderMap,
    /// The extensions (axum's `MatchedPath`, for example).
    pub extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `request`.
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractError, RequestHead, extract_fn};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// fn tenant(head: &RequestHead<'_>) -> Result<Option<Vec<u8>>, ExtractError> {
    ///     Ok(head.headers.get("x-tenant").map(|v| v.as_bytes().to_vec()))
    /// }
    /// // Test a name function for `extract_fn` on a plain request.
    /// let req = Request::get("/").header("x-tenant", "acme").body(())?;
    /// assert_eq!(tenant(&RequestHead::of(&req))?, Some(b"acme".to_vec()));
    /// let extractor = extract_fn(tenant);
    /// # let _ = extractor;
    /// # Ok(()) }
    /// ```
    pub fn of<B>(request: &'a Request<B>) -> Self {
        Self {
            method: request.method(),
            uri: request.uri(),
            version: request.version(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }
}

/// The lock name is a header's value (such as `Idempotency-Key`, `X-GitHub-Delivery` or
/// gRPC metadata). A missing header passes the request through, or is rejected when
/// [`required`](Self::required); an empty value, and a header sent more than once, are
/// always rejected.
///
/// The `Idempotency-Key` header is read as the IETF draft sends it, a structured-field
/// string (`Idempotency-Key: "8e03978e-40d5"`, see [`structured`](Self::structured)):
/// the name is the string, so `"k"` and an unquoted `k` name the same lock. Other headers'
/// values are the name as they are, unless [`structured`](Self::structured) says otherwise.
#[derive(Debug, Clone)]
pub struct Header {
    /// The header, or the text that is not a valid header name.
    name: Result<HeaderName, &'static str>,
    required: bool,
    /// Whether the value is parsed as a structured-field string.
    structured: bool,
}

/// The header whose values are structured-field strings unless told otherwise.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

impl Header {
    /// Uses the header `name`, in any case (`Idempotency-Key` and `idempotency-key` are
    /// the same header).
    ///
    /// A `name` that is not a valid header name never panics: every request is then
    /// rejected as bad input, with a message that names the setting.
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractLockName, Header};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Idempotency keys sent by clients; without the header a request runs unlocked.
    /// let key = Header::new("Idempotency-Key");
    /// let req = Request::post("/payments").header("idempotency-key", "k-1").body(())?;
    /// assert_eq!(key.extract(&req)?, Some(b"k-1".to_vec()));
    /// assert_eq!(key.extract(&Request::post("/payments").body(())?)?, None);
    /// # Ok(()) }
    /// ```
    pub fn new(name: &'static str) -> Self {
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(name) => Self::from_name(name),
            Err(_) => Self {
                name: Err(name),
                required: false,
                structured: false,
            },
        }
    }

    /// Uses the header `name`.
    ///
    /// ```
    /// use http::Request;
    /// use http::header::HeaderName;
    /// use tower_redlock::layer::{ExtractLockName, Header};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // A header name the service already has as a `HeaderName`.
    /// let delivery = HeaderName::from_static("x-github-delivery");
    /// let extractor = Header::from_name(delivery.clone());
    /// let req = Request::post("/webhook").header(delivery, "72d3162e").body(())?;
    /// assert_eq!(extractor.extract(&req)?, Some(b"72d3162e".to_vec()));
    /// # Ok(()) }
    /// ```
    pub fn from_name(name: HeaderName) -> Self {
        Self {
            structured: name.as_str() == IDEMPOTENCY_KEY,
            name: Ok(name),
            required: false,
        }
    }

    /// Rejects requests without the header instead of passing them through.
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractLockName, Header};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Every real delivery carries the header: a request without it is refused with 400.
    /// let delivery = Header::new("x-github-delivery").required();
    /// let req = Request::post("/webhook").body(())?;
    /// assert!(delivery.extract(&req).is_err());
    /// # Ok(()) }
    /// ```
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// Reads the value as an RFC 8941 structured-field string (`on`), or takes it as it is
    /// (`!on`). On by default for `Idempotency-Key` only, as the IETF draft
    /// (draft-ietf-httpapi-idempotency-key-header) defines it.
    ///
    /// A structured value is an Item whose bare item is a String: `"..."` of printable
    /// ASCII (0x20 to 0x7E) with `\"` and `\\` the only escapes; the name is the string,
    /// unescaped. Parameters after it (`"k";a=1`) must be well formed and are ignored;
    /// spaces and tabs around the value are trimmed. For clients that send keys unquoted, a
    /// value that does not start with `"` is the name as it is when it is visible ASCII
    /// without `"`, `,`, `;` or spaces (any sf-token, such as a UUID), so `"k"` and `k`
    /// name the same lock. Anything else is rejected with 400 / `INVALID_ARGUMENT` and a
    /// message saying what is wrong: an empty string `""`, a missing closing quote, another
    /// escape, a byte outside printable ASCII, something after the string, or a list
    /// (`"a", "b"`).
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractLockName, Header};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let req = |key: &str| Request::post("/payments").header("idempotency-key", key).body(());
    /// // The draft's form, and the unquoted one, name the same lock.
    /// let key = Header::new("Idempotency-Key");
    /// assert_eq!(key.extract(&req(r#""8e03978e-40d5""#)?)?, Some(b"8e03978e-40d5".to_vec()));
    /// assert_eq!(key.extract(&req("8e03978e-40d5")?)?, Some(b"8e03978e-40d5".to_vec()));
    /// assert_eq!(key.extract(&req(r#""a \"quoted\" key";v=1"#)?)?, Some(br#"a "quoted" key"#.to_vec()));
    /// assert!(key.extract(&req(r#""a", "b""#)?).is_err()); // two keys
    /// assert!(key.extract(&req(r#""unterminated"#)?).is_err());
    ///
    /// // Keys taken byte for byte, quotes included, as before the draft.
    /// let raw = Header::new("Idempotency-Key").structured(false);
    /// assert_eq!(raw.extract(&req(r#""k""#)?)?, Some(br#""k""#.to_vec()));
    ///
    /// // Another header with structured-field strings.
    /// let other = Header::new("x-request-key").structured(true);
    /// let req = Request::post("/").header("x-request-key", r#""k""#).body(())?;
    /// assert_eq!(other.extract(&req)?, Some(b"k".to_vec()));
    /// # Ok(()) }
    /// ```
    pub fn structured(mut self, on: bool) -> Self {
        self.structured = on;
        self
    }
}

impl<B> ExtractLockName<B> for Header {
    fn extract(&self, request: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
        let name = self.name.as_ref().map_err(|bad| {
            ExtractError::new(format!(
                "the lock layer is configured with {bad:?}, which is not a valid header name"
            ))
        })?;
        let header = Protocol::of(request).header_word();
        let mut values = request.headers().get_all(name).iter();
        let Some(value) = values.next() else {
            return if self.required {
                Err(ExtractError::new(format!(
                    "the {name} {header} is required"
                )))
            } else {
                Ok(None)
            };
        };
        if values.next().is_some() {
            return Err(ExtractError::new(format!(
                "the {name} {header} is sent more than once"
            )));
        }
        let empty = || ExtractError::new(format!("the {name} {header} is empty"));
        if !self.structured {
            return if value.is_empty() {
                Err(empty())
            } else {
                Ok(Some(value.as_bytes().to_vec()))
            };
        }
        match structured_field::string_item(value.as_bytes()) {
            Ok(key) => Ok(Some(key)),
            Err(KeyError::Empty) => Err(empty()),
            Err(KeyError::Malformed { problem, at }) => Err(ExtractError::new(format!(
                "the {name} {header} is not a structured-field string such as \"k-1\" \
                 (RFC 8941): {problem} (at byte {at})"
            ))),
        }
    }

    /// `header:{name}`, the header's name in lower case.
    fn namespace(&self) -> Cow<'_, str> {
        match &self.name {
            Ok(name) => Cow::Owned(format!("header:{name}")),
            Err(bad) => Cow::Owned(format!("header:{}", bad.to_ascii_lowercase())),
        }
    }
}

pub(crate) mod body_key;
mod closure;
pub(crate) mod grpc_methods;
pub(crate) mod namespace;
mod path;
pub(crate) mod scoped;
mod structured_field;

pub use closure::{ExtractFn, extract_fn};
pub use path::{PathParam, PathSegment};

#[cfg(test)]
mod tests;
