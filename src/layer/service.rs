//! The service [`RedlockLayer`](crate::RedlockLayer) wraps around an inner service.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, service_fn};
//! use tower_redlock::{Redlock, RedlockLayer};
//! use tower_redlock::layer::Header;
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(RedlockLayer::new(redlock, Header::new("idempotency-key")))
//!     .service(service_fn(|_req: Request<String>| async {
//!         Ok::<_, Infallible>(Response::new(String::from("done")))
//!     }));
//! let inner = svc.get_ref(); // the wrapped service_fn
//! # let _ = inner;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use tower_service::Service;

use super::acquire::{AcquireFuture, BodyNamed, CallFn, Pending, Read, acquire};
use super::config::Config;
use super::extract::ExtractLockName;
use super::extract::RequestHead;
use super::future::{Ctx, ResponseFuture};
use super::reject::{Protocol, Rejection};
use super::request::body_fingerprint::{BodyFingerprintLayer, NoBodyFingerprint};
use super::request::body_prefix::{PrefixedBody, read_for_key, read_prefix};
use super::request::fingerprint::{self, Fingerprint, RequestFingerprint};
use crate::backend::{LockBackend, Redlock};

/// Holds a quorum lock, named by the extractor, while the inner service runs. Created by
/// [`RedlockLayer`](crate::RedlockLayer). `F` is what it does with request bodies: hands
/// them on as they are ([`NoBodyFingerprint`]: the inner service gets `Request<B>`), or,
/// with replay, reads the start of each locked request's body for its fingerprint
/// ([`BodyFingerprintLayer`]: the inner service gets `Request<PrefixedBody<B>>`).
#[derive(Debug, Clone)]
pub struct RedlockService<S, E, F = NoBodyFingerprint, L = Redlock> {
    inner: S,
    lock: L,
    extractor: E,
    config: Arc<Config>,
    body: F,
}

impl<S, E, F, L> RedlockService<S, E, F, L> {
    pub(crate) fn new(inner: S, lock: L, extractor: E, config: Arc<Config>, body: F) -> Self {
        Self {
            inner,
            lock,
            extractor,
            config,
            body,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, E, L, ReqBody, ResBody> Service<Request<ReqBody>>
    for RedlockService<S, E, NoBodyFingerprint, L>
where
    L: LockBackend,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    E: ExtractLockName<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: http_body::Body,
    ResBody::Data: From<bytes::Bytes>,
{
    type Response = Response<super::ResponseBody<ResBody, L>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error, L>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        super::request::caller::insert_caller(self.config.caller.as_ref(), &mut req);
        let protocol = Protocol::of(&req);
        if self.extractor.body_limit().is_some() {
            return self.cannot_read_body(&req, protocol);
        }
        let to_lock = match self.name(&req, protocol) {
            Named::Lock(to_lock) => to_lock,
            Named::Rejected(rejected) => return rejected,
            Named::PassThrough => return ResponseFuture::passthrough(self.inner.call(req)),
        };
        let fingerprint = if self.config.replay.is_some() {
            fingerprint::fingerprint(&req)
        } else {
            [0; 32]
        };
        self.acquire_then_call(req, to_lock, protocol, fingerprint)
    }
}

/// With replay (by default): the start of each locked request's body counts in its
/// fingerprint, so the same key sent with another body is refused with 422.
impl<S, E, L, ReqBody, ResBody> Service<Request<ReqBody>>
    for RedlockService<S, E, BodyFingerprintLayer, L>
where
    L: LockBackend,
    S: Service<Request<PrefixedBody<ReqBody>>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    E: ExtractLockName<ReqBody> + Clone + Send + 'static,
    ReqBody: http_body::Body + Send + Unpin + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Send,
    ResBody: http_body::Body,
    ResBody::Data: From<bytes::Bytes>,
{
    type Response = Response<super::ResponseBody<ResBody, L>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error, L>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        super::request::caller::insert_caller(self.config.caller.as_ref(), &mut req);
        let protocol = Protocol::of(&req);
        if let Some(limit) = self.extractor.body_limit() {
            return self.named_by_body(req, protocol, limit);
        }
        let to_lock = match self.name(&req, protocol) {
            Named::Lock(to_lock) => to_lock,
            Named::Rejected(rejected) => return rejected,
            Named::PassThrough => {
                return ResponseFuture::passthrough(
                    self.inner.call(req.map(PrefixedBody::untouched)),
                );
            }
        };
        // Nothing to read (no body, or a fingerprint given): on at once, as without.
        if req.body().is_end_stream() || req.extensions().get::<RequestFingerprint>().is_some() {
            let fingerprint = fingerprint::fingerprint(&req);
            let req = req.map(PrefixedBody::untouched);
            return self.acquire_then_call(req, to_lock, protocol, fingerprint);
        }
        // The fingerprint comes once the start of the body is read.
        let ToLock { name, span } = to_lock;
        let (acquire, ctx) = self.start(&req, name, protocol, [0; 32]);
        let inner = self.take_ready();
        let limit = self.body.limit();
        let read = Box::pin(async move {
            let req = read_prefix(req, limit).await;
            let fingerprint = fingerprint::fingerprint(&req);
            let call: CallFn<S::Future> = Box::new(Pending { inner, req });
            let named = BodyNamed::Head;
            Read {
                call,
                fingerprint,
                named,
            }
        });
        ResponseFuture::reading(read, Some(acquire), ctx, span)
    }
}

impl<S, E, L> RedlockService<S, E, BodyFingerprintLayer, L>
where
    L: LockBackend,
{
    /// The future of a request whose lock name is in its body (`limit`: how much of it
    /// the extractor reads): the body's start is read, then the lock named and acquired.
    fn named_by_body<ReqBody, ResBody>(
        &mut self,
        req: Request<ReqBody>,
        protocol: Protocol,
        limit: usize,
    ) -> ResponseFuture<S::Future, ResBody, S::Error, L>
    where
        S: Service<Request<PrefixedBody<ReqBody>>, Response = Response<ResBody>>
            + Clone
            + Send
            + 'static,
        E: ExtractLockName<ReqBody> + Clone + Send + 'static,
        ReqBody: http_body::Body + Send + Unpin + 'static,
        ReqBody::Data: Send,
        ReqBody::Error: Send,
    {
        let span = self.span(None);
        let ctx = self.ctx(&req, protocol, [0; 32]);
        let inner = self.take_ready();
        // The fingerprint counts what replay counts; without replay, nothing is hashed.
        let hash = self.config.replay.as_ref().map_or(0, |_| self.body.limit());
        let (extractor, lock) = (self.extractor.clone(), self.lock.clone());
        let (config, request_span) = (Arc::clone(&self.config), span.clone());
        let read = Box::pin(async move {
            // One byte over the limit tells a body that is too large.
            let req = read_for_key(req, hash, limit.saturating_add(1)).await;
            let fingerprint = fingerprint::fingerprint(&req);
            let named = match name_in_body(&extractor, &req, limit, protocol) {
                Ok(Some(name)) => {
                    let name = config.namespace.lock_name::<ReqBody, E>(&extractor, name);
                    record_lock(&request_span, &lock, &name);
                    BodyNamed::Lock(Box::pin(acquire(lock, name, config)))
                }
                Ok(None) => BodyNamed::Pass,
                Err(rejection) => BodyNamed::Reject(rejection),
            };
            let call: CallFn<S::Future> = Box::new(Pending { inner, req });
            Read {
                call,
                fingerprint,
                named,
            }
        });
        ResponseFuture::reading(read, None, ctx, span)
    }
}

/// The name `extractor` finds in the start of `req`'s body (at most `limit` bytes, or the
/// request is too large), before the layer's namespace is put in front of it.
fn name_in_body<B, E>(
    extractor: &E,
    req: &Request<PrefixedBody<B>>,
    limit: usize,
    protocol: Protocol,
) -> Result<Option<Vec<u8>>, Rejection>
where
    B: http_body::Body,
    E: ExtractLockName<B>,
{
    let (bytes, _whole) = req.body().read_bytes();
    if bytes.len() > limit {
        return Err(Rejection::body_too_large(limit, protocol));
    }
    extractor
        .extract_from_body(&RequestHead::of(req), &bytes)
        .map_err(|e| Rejection::bad_request(e.message(), protocol))
}

impl<S, E, F, L: LockBackend> RedlockService<S, E, F, L> {
    /// Names `req`'s lock (in the layer's namespace), with the request's span.
    fn name<R, Fut, B, Er>(&self, req: &Request<R>, protocol: Protocol) -> Named<Fut, B, Er, L>
    where
        E: ExtractLockName<R>,
    {
        match self.extractor.extract(req) {
            Ok(Some(name)) => {
                let name = self
                    .config
                    .namespace
                    .lock_name::<R, E>(&self.extractor, name);
                let span = self.span(Some(&name));
                Named::Lock(ToLock { name, span })
            }
            Ok(None) => Named::PassThrough,
            Err(e) => {
                let rejection = Rejection::bad_request(e.message(), protocol);
                Named::Rejected(self.rejected_now(req, rejection, "bad_request"))
            }
        }
    }

    /// The answer of a layer that hands bodies on unread to a request whose lock name is
    /// in its body: 500, and an error in the log saying how to build the layer.
    fn cannot_read_body<R, Fut, B, Er>(
        &self,
        req: &Request<R>,
        protocol: Protocol,
    ) -> ResponseFuture<Fut, B, Er, L> {
        tracing::error!(
            "redlock layer: the lock name is in the request body, but this layer does not read \
             bodies; build it with RedlockLayer::from_body (and not without_body_fingerprint)"
        );
        let rejection =
            Rejection::misconfigured("the lock layer cannot read this request's body", protocol);
        self.rejected_now(req, rejection, "internal")
    }

    /// The future of `req`, rejected before any lock (`kind`: the span's `rejection`).
    fn rejected_now<R, Fut, B, Er>(
        &self,
        req: &Request<R>,
        rejection: Rejection,
        kind: &'static str,
    ) -> ResponseFuture<Fut, B, Er, L> {
        let span = self.span(None);
        span.record("outcome", "rejected");
        span.record("rejection", kind);
        let response = span.in_scope(|| self.config.respond(rejection, &head_of(req)));
        ResponseFuture::rejected(response, span)
    }

    /// The service that was driven to readiness; a fresh clone is left behind.
    fn take_ready(&mut self) -> S
    where
        S: Clone,
    {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }

    /// The future of a request whose lock (`name`, and the request's span) is acquired,
    /// then the inner service called with `req`.
    fn acquire_then_call<R, Body>(
        &mut self,
        req: Request<R>,
        to_lock: ToLock,
        protocol: Protocol,
        fingerprint: Fingerprint,
    ) -> ResponseFuture<S::Future, Body, S::Error, L>
    where
        S: Service<Request<R>, Response = Response<Body>> + Clone + Send + 'static,
        R: Send + 'static,
    {
        let ToLock { name, span } = to_lock;
        let (acquire, ctx) = self.start(&req, name, protocol, fingerprint);
        let inner = self.take_ready();
        ResponseFuture::acquiring(acquire, Box::new(Pending { inner, req }), ctx, span)
    }

    /// The acquisition of `name`, and what the future needs once it holds the lock.
    fn start<R>(
        &self,
        req: &Request<R>,
        name: Vec<u8>,
        protocol: Protocol,
        fingerprint: Fingerprint,
    ) -> (AcquireFuture, Ctx<L>) {
        let acquire = Box::pin(acquire(self.lock.clone(), name, Arc::clone(&self.config)));
        (acquire, self.ctx(req, protocol, fingerprint))
    }

    /// What the future of `req` needs once it holds the lock.
    fn ctx<R>(&self, req: &Request<R>, protocol: Protocol, fingerprint: Fingerprint) -> Ctx<L> {
        Ctx {
            lock: self.lock.clone(),
            config: Arc::clone(&self.config),
            protocol,
            fingerprint,
            head: self.config.abort_on_loss.then(|| Box::new(head_of(req))),
            head_request: req.method() == http::Method::HEAD,
        }
    }

    /// The `redlock.layer` span of a request for lock `name` (shown as the client shows
    /// lock names: a hash unless names are logged), its `outcome` to be recorded.
    fn span(&self, name: Option<&[u8]>) -> tracing::Span {
        let span = tracing::debug_span!(
            "redlock.layer",
            lock = tracing::field::Empty,
            outcome = tracing::field::Empty,
            rejection = tracing::field::Empty,
        );
        if let Some(name) = name {
            record_lock(&span, &self.lock, name);
        }
        span
    }
}

/// Records lock `name` in `span` as `lock` shows names (a hash unless names are logged),
/// if the span is on.
fn record_lock<L: LockBackend>(span: &tracing::Span, lock: &L, name: &[u8]) {
    if !span.is_disabled() {
        span.record("lock", tracing::field::display(lock.shown_name(name)));
    }
}

/// What a request's extraction came to (returned, never stored: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Named<Fut, B, E, L: LockBackend> {
    /// Its lock name, and the request's span.
    Lock(ToLock),
    /// No name: the request passes through.
    PassThrough,
    /// A bad request, rejected.
    Rejected(ResponseFuture<Fut, B, E, L>),
}

/// A request's lock name, and its span.
struct ToLock {
    name: Vec<u8>,
    span: tracing::Span,
}

/// A copy of `req`'s head.
fn head_of<B>(req: &Request<B>) -> Parts {
    let (mut head, ()) = Request::new(()).into_parts();
    head.method = req.method().clone();
    head.uri = req.uri().clone();
    head.version = req.version();
    head.headers = req.headers().clone();
    head.extensions = req.extensions().clone();
    head
}
