//! [`GrpcMethods`]: locks only the gRPC methods listed (by method path, or all methods of
//! a service) and passes every other call through without a lock, so that health checks,
//! reflection and unlisted methods on the same server are not keyed.
//!
//! ```
//! use http::Request;
//! use tower_redlock::layer::{ExtractLockName, GrpcMethods, Header};
//!
//! let extractor = GrpcMethods::new(Header::new("idempotency-key").required())
//!     .method("/payments.Payments/Charge")
//!     .service("payments.Refunds");
//! let call = |path: &str| Request::post(path).header("idempotency-key", "k-1").body(()).unwrap();
//! assert_eq!(extractor.extract(&call("/payments.Payments/Charge")).unwrap(), Some(b"k-1".to_vec()));
//! assert_eq!(extractor.extract(&call("/payments.Refunds/Create")).unwrap(), Some(b"k-1".to_vec()));
//! // Not listed: passes through, even without the required key.
//! let health = Request::post("/grpc.health.v1.Health/Check").body(()).unwrap();
//! assert_eq!(extractor.extract(&health).unwrap(), None);
//! ```

use std::borrow::Cow;

use http::Request;

use super::{ExtractError, ExtractLockName};

/// Applies an extractor to the listed gRPC methods only: calls of other methods (health
/// checks, reflection, unlisted services) pass through without a lock.
///
/// ```no_run
/// # #[cfg(feature = "tonic")]
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_redlock::layer::{GrpcMethods, Header};
/// use tower_redlock::{Redlock, RedlockLayer};
///
/// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
/// let only_charge = GrpcMethods::new(Header::new("idempotency-key").required())
///     .method("/payments.Payments/Charge");
/// let server = tonic::transport::Server::builder().layer(RedlockLayer::new(redlock, only_charge));
/// # let _ = server;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct GrpcMethods<E> {
    inner: E,
    /// Full method paths, such as `/pkg.Service/Method`.
    methods: Vec<String>,
    /// Service names, such as `pkg.Service`: all of their methods.
    services: Vec<String>,
}

impl<E> GrpcMethods<E> {
    /// Lists no method yet: add them with [`method`](Self::method) and
    /// [`service`](Self::service).
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractLockName, GrpcMethods, Header};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Only calls that carry idempotency keys are locked; health checks pass without one.
    /// let extractor = GrpcMethods::new(Header::new("idempotency-key").required())
    ///     .service("payments.Payments");
    /// let health = Request::post("/grpc.health.v1.Health/Check").body(())?;
    /// assert_eq!(extractor.extract(&health)?, None);
    /// # Ok(()) }
    /// ```
    pub fn new(inner: E) -> Self {
        Self {
            inner,
            methods: Vec::new(),
            services: Vec::new(),
        }
    }

    /// Locks the method at `path` (`/package.Service/Method`; the leading `/` may be left
    /// out).
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractLockName, GrpcMethods, Header};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Lock the one method with side effects; reads on the same service pass through.
    /// let charge =
    ///     GrpcMethods::new(Header::new("idempotency-key")).method("payments.Payments/Charge");
    /// let call = |path| Request::post(path).header("idempotency-key", "k-1").body(());
    /// assert_eq!(charge.extract(&call("/payments.Payments/Charge")?)?, Some(b"k-1".to_vec()));
    /// assert_eq!(charge.extract(&call("/payments.Payments/Get")?)?, None);
    /// # Ok(()) }
    /// ```
    #[must_use = "`method` returns the extractor with the method added"]
    pub fn method(mut self, path: impl AsRef<str>) -> Self {
        let path = path.as_ref();
        self.methods
            .push(format!("/{}", path.trim_start_matches('/')));
        self
    }

    /// Locks every method of the service `name` (`package.Service`).
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractLockName, GrpcMethods, Header};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Every method of the refunds service changes state: lock them all.
    /// let refunds = GrpcMethods::new(Header::new("idempotency-key")).service("payments.Refunds");
    /// let req = Request::post("/payments.Refunds/Create").header("idempotency-key", "k-2");
    /// assert_eq!(refunds.extract(&req.body(())?)?, Some(b"k-2".to_vec()));
    /// # Ok(()) }
    /// ```
    #[must_use = "`service` returns the extractor with the service added"]
    pub fn service(mut self, name: impl AsRef<str>) -> Self {
        self.services
            .push(name.as_ref().trim_matches('/').to_owned());
        self
    }

    fn listed(&self, path: &str) -> bool {
        self.methods.iter().any(|m| m == path)
            || path
                .strip_prefix('/')
                .and_then(|p| p.split_once('/'))
                .is_some_and(|(service, _)| self.services.iter().any(|s| s == service))
    }
}

impl<E, B> ExtractLockName<B> for GrpcMethods<E>
where
    E: ExtractLockName<B>,
{
    fn extract(&self, request: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
        if self.listed(request.uri().path()) {
            self.inner.extract(request)
        } else {
            Ok(None)
        }
    }

    /// The inner extractor's.
    fn namespace(&self) -> Cow<'_, str> {
        self.inner.namespace()
    }
}
