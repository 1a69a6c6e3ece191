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

use super::fingerprint::{Hasher, RequestFingerprint};

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

/// Reads up to `limit` bytes of `req`'s body (for a gRPC call: its first message, at most
/// `limit` bytes; a streaming call's later messages may wait for the reply) and puts a
/// [`RequestFingerprint`] of the request and those bytes into its extensions, unless it
/// has one already (then nothing is read); the request with the whole body, the bytes
/// read first. The bytes are hashed as they come: what is held is the frames themselves.
pub(crate) async fn read_prefix<B>(req: Request<B>, limit: usize) -> Request<PrefixedBody<B>>
where
    B: Body + Unpin,
{
    if req.extensions().get::<RequestFingerprint>().is_some() {
        return req.map(PrefixedBody::untouched);
    }
    read_start(req, limit, limit).await
}

/// Reads the start of `req`'s body for a lock name in it (up to `read` bytes: a longer
/// body names no lock, so nothing past them is read) and for its fingerprint (at most the
/// first `hash` of those bytes; a fingerprint the request already has is kept).
pub(crate) async fn read_for_key<B>(
    req: Request<B>,
    hash: usize,
    read: usize,
) -> Request<PrefixedBody<B>>
where
    B: Body + Unpin,
{
    let given = req.extensions().get::<RequestFingerprint>().copied();
    let hash = if given.is_some() { 0 } else { hash.min(read) };
    let mut req = read_start(req, hash, read).await;
    if let Some(given) = given {
        req.extensions_mut().insert(given);
    }
    req
}

/// Reads the start of `req`'s body: up to `read` bytes (a gRPC call's first message), the
/// first `hash` of them hashed into its fingerprint.
async fn read_start<B>(req: Request<B>, hash: usize, read: usize) -> Request<PrefixedBody<B>>
where
    B: Body + Unpin,
{
    let limit = read;
    let grpc = crate::layer::Protocol::of(&req) == crate::layer::Protocol::Grpc;
    let mut hasher = Hasher::new(&req);
    let (parts, mut body) = req.into_parts();
    let mut read = PrefixedBody {
        frames: VecDeque::new(),
        error: None,
        rest: None,
    };
    let mut seen = 0usize;
    // A gRPC call: the length of its first message, once its prefix is in.
    let mut prefix = Vec::new();
    let mut wanted = limit;
    let mut ended = false;
    while seen < wanted {
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
                    let take = data.len().min(wanted - seen);
                    let counted = data.get(..take).unwrap_or_default();
                    let hashed = take.min(hash.saturating_sub(seen));
                    hasher.body(counted.get(..hashed).unwrap_or_default());
                    seen += take;
                    if grpc && prefix.len() < 5 {
                        prefix.extend(counted.iter().take(5 - prefix.len()));
                        if let [_, a, b, c, d] = prefix[..] {
                            let message = u32::from_be_bytes([a, b, c, d]);
                            let message = usize::try_from(message).unwrap_or(usize::MAX);
                            wanted = limit.min(message.saturating_add(5));
                        }
                    }
                }
                read.frames.push_back(frame);
            }
        }
    }
    if !ended {
        read.rest = Some(body);
    }
    let mut req = Request::from_parts(parts, read);
    req.extensions_mut().insert(hasher.finish());
    req
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

impl<B: Body> PrefixedBody<B> {
    /// `body`, none of it read.
    pub(crate) fn untouched(body: B) -> Self {
        Self {
            frames: VecDeque::new(),
            error: None,
            rest: Some(body),
        }
    }

    /// A body read to its end: its `frames`, then nothing.
    #[cfg(feature = "webhook-verify")]
    pub(crate) fn whole(frames: VecDeque<Frame<Bytes>>) -> Self {
        Self {
            frames,
            error: None,
            rest: None,
        }
    }

    /// The bytes read so far, and whether they are the whole body (it ended, without an
    /// error).
    pub(crate) fn read_bytes(&self) -> (Vec<u8>, bool) {
        let data = self.frames.iter().filter_map(Frame::data_ref);
        let mut out = Vec::with_capacity(data.clone().map(Bytes::len).sum());
        for bytes in data {
            out.extend_from_slice(bytes);
        }
        (out, self.rest.is_none() && self.error.is_none())
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
