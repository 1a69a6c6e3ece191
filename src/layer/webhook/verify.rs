//! [`Signature`] as a tower layer, and its service [`Verified`]: a delivery goes on to
//! the lock only once its signature verifies.
//!
//! ```
//! use tower_redlock::layer::webhook::Signature;
//!
//! let layer = tower::ServiceBuilder::new().layer(Signature::github("secret").unwrap());
//! # let _ = layer;
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::{Request, Response};
use http_body::{Body, Frame};
use tower_layer::Layer;
use tower_service::Service;

use super::signature::Signature;
use crate::layer::body::ResponseBody;
use crate::layer::reject::{Protocol, Rejection};
use crate::layer::request::body_prefix::PrefixedBody;

impl<S> Layer<S> for Signature {
    type Service = Verified<S>;

    fn layer(&self, inner: S) -> Verified<S> {
        Verified {
            inner,
            signature: Arc::new(self.clone()),
        }
    }
}

/// The service of a [`Signature`] layer: verifies each delivery, then calls `S` with it.
///
/// Each delivery's whole body is read (up to
/// [`Signature::max_body`]), its signature checked, and only a delivery that verifies goes
/// on to the inner service (the lock layer, then the handler), with its body as read. A
/// delivery that does not verify is answered 401 (`UNAUTHENTICATED`), one over the limit
/// 413, one whose body fails 400: no lock, no record, no handler run.
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_redlock::layer::webhook::{self, Signature};
/// use tower_redlock::{Redlock, RedlockLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
/// // The signature first, then the lock: a forged delivery never reaches the lock.
/// let stack = ServiceBuilder::new()
///     .layer(Signature::github("the webhook's secret")?)
///     .layer(RedlockLayer::new(redlock, webhook::github()));
/// # let _ = stack;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Verified<S> {
    inner: S,
    signature: Arc<Signature>,
}

/// The future of a [`Verified`] service.
pub type VerifiedFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B, ResBody> Service<Request<B>> for Verified<S>
where
    S: Service<Request<PrefixedBody<B>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    B: Body + Unpin + Send + 'static,
    B::Error: Send,
    ResBody: Body + Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = VerifiedFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The service polled ready goes with this request; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let signature = Arc::clone(&self.signature);
        Box::pin(async move {
            let protocol = Protocol::of(&req);
            let (parts, body) = req.into_parts();
            // Unsigned: refused before its body is read.
            let whole = match signature.has_headers(&parts.headers) {
                Ok(()) => read_whole(body, signature.body_limit()).await,
                Err(missing) => Whole::Refused(missing),
            };
            let refused = match whole {
                Whole::Read { frames, bytes } => match signature.verify(&parts.headers, &bytes) {
                    Ok(()) => {
                        let req = Request::from_parts(parts, PrefixedBody::whole(frames));
                        let res = inner.call(req).await?;
                        return Ok(res.map(|body| ResponseBody::inner(body, None)));
                    }
                    Err(why) => {
                        tracing::debug!(%why, "webhook delivery refused before the lock");
                        Rejection::unauthenticated(why, protocol)
                    }
                },
                Whole::Refused(why) => Rejection::unauthenticated(why, protocol),
                Whole::TooLarge => Rejection::too_large_to_verify(signature.body_limit(), protocol),
                Whole::Failed => {
                    Rejection::bad_request("the request body could not be read", protocol)
                }
            };
            let res = refused.negotiate(&parts.headers).into_response();
            Ok(res.map(|text| ResponseBody::fixed(Bytes::from(text), None)))
        })
    }
}

/// What reading a whole body found.
enum Whole {
    /// Its frames (data and trailers, to hand on) and its bytes (to verify).
    Read {
        frames: VecDeque<Frame<Bytes>>,
        bytes: Vec<u8>,
    },
    /// Longer than the limit (the rest is not read).
    TooLarge,
    /// The body failed.
    Failed,
    /// Not read: the delivery lacks a signature header.
    Refused(super::signature::SignatureError),
}

/// Reads `body` to its end, if it is at most `limit` bytes long.
async fn read_whole<B: Body + Unpin>(mut body: B, limit: usize) -> Whole {
    let mut frames = VecDeque::new();
    let mut bytes = Vec::new();
    loop {
        match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            None => return Whole::Read { frames, bytes },
            Some(Err(_)) => return Whole::Failed,
            Some(Ok(frame)) => {
                let frame = frame.map_data(|mut d| d.copy_to_bytes(d.remaining()));
                if let Some(data) = frame.data_ref() {
                    if bytes.len().saturating_add(data.len()) > limit {
                        return Whole::TooLarge;
                    }
                    bytes.extend_from_slice(data);
                }
                frames.push_back(frame);
            }
        }
    }
}
