//! [`BodyFingerprintLayer`]: reads the start of each request body (up to a limit), puts a
//! [`RequestFingerprint`] of method, path, query, caller and that body into the request
//! extensions, and hands the inner service the whole body, unchanged. Put it outside
//! [`RedlockLayer`](crate::RedlockLayer) with replay on, so that the same idempotency key
//! sent with a different body is refused with 422.
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_redlock::{Redlock, RedlockLayer};
//! use tower_redlock::layer::{BodyFingerprintLayer, Header};
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let stack = ServiceBuilder::new()
//!     .layer(BodyFingerprintLayer::new(64 * 1024)) // first: runs before the lock
//!     .layer(
//!         RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
//!             .replay(Duration::from_secs(24 * 3600)),
//!     );
//! # let _ = stack;
//! # Ok(()) }
//! ```

use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use http::Request;
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

#[cfg(doc)]
use super::fingerprint::RequestFingerprint;
use crate::layer::request::body_prefix::{PrefixedBody, read_prefix};

/// Fingerprints each request with up to `limit` bytes of its body (a
/// [`RequestFingerprint`] in its extensions), then calls the inner service with the whole
/// body. Put it outside a [`RedlockLayer`](crate::RedlockLayer) with
/// [`replay`](crate::RedlockLayer::replay) on: the same idempotency key sent with another
/// body is then refused with 422.
///
/// ```no_run
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use tower::ServiceBuilder;
/// use tower_redlock::{Redlock, RedlockLayer};
/// use tower_redlock::layer::{BodyFingerprintLayer, Header};
///
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
/// let app: Router = Router::new()
///     .route("/payments", post(|body: String| async move { body }))
///     .route_layer(
///         ServiceBuilder::new()
///             .layer(BodyFingerprintLayer::new(64 * 1024))
///             .layer(
///                 RedlockLayer::new(redlock, Header::new("Idempotency-Key").required())
///                     .replay(Duration::from_secs(24 * 3600)),
///             ),
///     );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BodyFingerprintLayer {
    limit: usize,
}

/// The default body fingerprint limit of a replay layer
/// ([`RedlockLayer::replay`](crate::RedlockLayer::replay)): 1 MiB, half of axum's default
/// request body limit, so that every request body a typical JSON API accepts counts whole.
/// The cost, per locked request: the frames read are held (not copied) until the handler
/// reads them, at most this much; and the handler starts once they are in (a handler
/// that reads its body waits for them anyway) and hashed (SHA-256: about 0.6 ms per MiB
/// on a CPU with SHA extensions, such as the 2-core test machine, which hashes 1.7 GB/s;
/// a few ms per MiB without). A request without a body costs nothing more.
pub const DEFAULT_BODY_FINGERPRINT_LIMIT: usize = 1 << 20;

/// What a [`RedlockLayer`](crate::RedlockLayer) without replay (or with
/// [`without_body_fingerprint`](crate::RedlockLayer::without_body_fingerprint)) does with
/// request bodies: hands them to the inner service as they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoBodyFingerprint;

impl BodyFingerprintLayer {
    /// Reads (and hashes) up to `limit` bytes of each body before the inner service runs;
    /// the rest streams on unread. Bodies that differ only beyond `limit` bytes have the
    /// same fingerprint. Of a gRPC call, only the first message is read (a streaming
    /// client may wait for the reply before it sends more). A request that already has a
    /// [`RequestFingerprint`] (your own, or an outer layer's) is not read.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::ServiceBuilder;
    /// use tower_redlock::layer::{BodyFingerprintLayer, Header};
    /// use tower_redlock::{Redlock, RedlockLayer};
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let replay = RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
    ///     .replay(Duration::from_secs(3600));
    /// // JSON bodies of a few KiB: 16 KiB covers them whole, and bounds what is buffered.
    /// let stack = ServiceBuilder::new().layer(BodyFingerprintLayer::new(16 * 1024)).layer(replay);
    /// # let _ = stack;
    /// # Ok(()) }
    /// ```
    pub fn new(limit: usize) -> Self {
        Self { limit }
    }

    /// How many bytes of each body are read and hashed.
    ///
    /// ```
    /// use tower_redlock::layer::BodyFingerprintLayer;
    ///
    /// assert_eq!(BodyFingerprintLayer::new(4096).limit(), 4096);
    /// ```
    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl<S> Layer<S> for BodyFingerprintLayer {
    type Service = BodyFingerprint<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyFingerprint {
            inner,
            limit: self.limit,
        }
    }
}

/// The service of [`BodyFingerprintLayer`].
#[derive(Debug, Clone)]
pub struct BodyFingerprint<S> {
    inner: S,
    limit: usize,
}

impl<S, B> Service<Request<B>> for BodyFingerprint<S>
where
    S: Service<Request<PrefixedBody<B>>> + Clone + Send + 'static,
    S::Future: Send,
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Keep the service that was driven to readiness; leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.limit;
        Box::pin(async move { inner.call(read_prefix(req, limit).await).await })
    }
}
