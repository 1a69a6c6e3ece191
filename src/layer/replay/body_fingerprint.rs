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

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use futures_util::future::BoxFuture;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::fingerprint::RequestFingerprint;

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

impl BodyFingerprintLayer {
    /// Reads (and hashes) up to `limit` bytes of each body before the inner service runs;
    /// the rest streams on unread. Bodies that differ only beyond `limit` bytes have the
    /// same fingerprint.
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
        Box::pin(async move {
            let (parts, mut body) = req.into_parts();
            let mut read = PrefixedBody {
                frames: VecDeque::new(),
                error: None,
                rest: None,
            };
            let mut seen = Vec::new();
            let mut ended = false;
            while seen.len() < limit {
                match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                    None => {
                        ended = true;
                        break;
                    }
                    Some(Err(e)) => {
                        read.error = Some(e);
                        ended = true;
                        break;
                    }
                    Some(Ok(frame)) => {
                        let frame = frame.map_data(|mut d| d.copy_to_bytes(d.remaining()));
                        if let Some(data) = frame.data_ref() {
                            let take = data.len().min(limit - seen.len());
                            seen.extend_from_slice(&data[..take]);
                        }
                        read.frames.push_back(frame);
                    }
                }
            }
            if !ended {
                read.rest = Some(body);
            }
            let mut req = Request::from_parts(parts, read);
            let fingerprint = RequestFingerprint::of(&req, &seen);
            req.extensions_mut().insert(fingerprint);
            inner.call(req).await
        })
    }
}

pin_project! {
    /// A request body of which the first frames were read (for the fingerprint): they come
    /// first, then the rest of the original body.
    pub struct PrefixedBody<B: Body> {
        frames: VecDeque<Frame<Bytes>>,
        error: Option<B::Error>,
        rest: Option<B>,
    }
}

impl<B: Body> std::fmt::Debug for PrefixedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixedBody")
            .field("read_frames", &self.frames.len())
            .field("more", &self.rest.is_some())
            .finish()
    }
}

impl<B> Body for PrefixedBody<B>
where
    B: Body + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(frame) = this.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(error) = this.error.take() {
            return Poll::Ready(Some(Err(error)));
        }
        match this.rest {
            Some(rest) => Pin::new(rest)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining()))))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
            && self.error.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self
            .frames
            .iter()
            .filter_map(|f| f.data_ref())
            .map(|d| d.len() as u64)
            .sum();
        let rest = self
            .rest
            .as_ref()
            .map_or(SizeHint::with_exact(0), Body::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(read));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint
    }
}
