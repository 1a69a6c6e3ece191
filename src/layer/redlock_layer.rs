//! [`RedlockLayer`]: the tower layer, and the builder methods that set its configuration.
//!
//! ```
//! use tower::ServiceBuilder;
//! use tower_redlock::{Redlock, RedlockLayer};
//! use tower_redlock::layer::PathSegment;
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let stack = ServiceBuilder::new().layer(RedlockLayer::new(redlock, PathSegment::new(1)));
//! # let _ = stack;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use tokio::sync::Semaphore;
use tower_layer::Layer;

use super::body_mode::BodyMode;
use super::caller::Caller;
use super::config::{BusyPolicy, Config, ReleaseOn, WaitPolicy};
use super::extract::namespace::Namespace;
use super::reject::Rejection;
use super::reject::hook::{self as rejection_hook, IntoRejectionResponse};
use super::replay::body_fingerprint::{BodyFingerprintLayer, NoBodyFingerprint};
use super::service::RedlockService;
use crate::backend::LockBackend;
use crate::client::Redlock;

/// Tower layer that holds a quorum lock, named by an extractor, while each request runs.
/// See the [`layer`](crate::layer) module for the whole story.
///
/// ```no_run
/// use std::time::Duration;
/// use axum::{Extension, Router, routing::post};
/// use tower_redlock::{LockToken, Redlock, RedlockLayer};
/// use tower_redlock::layer::Header;
///
/// async fn webhook(Extension(token): Extension<LockToken>) -> String {
///     // The lock name: the layer's namespace and the delivery id,
///     // "header:x-github-delivery 72d3162e".
///     format!("holding {}", String::from_utf8_lossy(token.name()))
/// }
///
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
/// let app: Router = Router::new().route("/webhook", post(webhook)).route_layer(
///     RedlockLayer::new(redlock, Header::new("x-github-delivery").required())
///         .fencing(false) // unique delivery ids: nothing to fence
///         .ttl(Duration::from_secs(30)),
/// );
/// # Ok(()) }
/// ```
///
/// `F` says what the layer does with request bodies: without replay it hands them on as
/// they are ([`NoBodyFingerprint`]); with [`replay`](Self::replay) it reads the start of
/// each locked request's body for the request's fingerprint ([`BodyFingerprintLayer`](super::BodyFingerprintLayer)),
/// and the inner service gets a [`PrefixedBody`](super::PrefixedBody) (axum routers and
/// tonic servers take any body; see [`without_body_fingerprint`](Self::without_body_fingerprint)
/// for services that need the original body type).
#[derive(Debug, Clone)]
#[must_use = "a `RedlockLayer` protects nothing until it wraps a service (`.layer(..)`, `.route_layer(..)`); each setter returns the layer with its setting"]
pub struct RedlockLayer<E, F = NoBodyFingerprint, L = Redlock> {
    pub(super) lock: L,
    pub(super) extractor: E,
    pub(super) config: Arc<Config>,
    pub(super) body: F,
}

impl<E, L: LockBackend> RedlockLayer<E, NoBodyFingerprint, L> {
    /// A layer that locks the names `extractor` gives through `lock` (a [`Redlock`], or
    /// in tests the in-memory lock of the `testing` feature), with its TTL, rejecting
    /// busy requests at once and releasing when the inner future completes.
    pub fn new(lock: L, extractor: E) -> Self {
        Self {
            lock,
            extractor,
            body: NoBodyFingerprint,
            config: Arc::new(Config {
                ttl: None,
                busy: BusyPolicy::Reject,
                release: ReleaseOn::Response,
                auto_extend: true,
                abort_on_loss: false,
                on_rejection: None,
                replay: None,
                retry_after_cap: super::reject::DEFAULT_RETRY_AFTER_CAP,
                namespace: Namespace::from_extractor(),
                caller: None,
                stall_timeout: Some(super::config::DEFAULT_STALL_TIMEOUT),
                deliveries: false,
            }),
        }
    }
}

impl<E, L: LockBackend> RedlockLayer<E, BodyFingerprintLayer, L> {
    /// A layer whose lock names are in the request body: `extractor` is a
    /// [`BodyKey`](super::BodyKey) (a JSON field, or your function over the bytes),
    /// possibly scoped ([`PerRoute`](super::PerRoute)). Each request's body is read up to
    /// the key's limit before the lock is taken, and the inner service gets the same bytes,
    /// unchanged, as a [`PrefixedBody`](super::PrefixedBody) (axum routers and tonic
    /// servers take it). With [`replay`](Self::replay) the body is read once for both the
    /// name and the fingerprint. Otherwise like [`new`](RedlockLayer::new).
    ///
    /// ```
    /// # #[cfg(feature = "json")]
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tower_redlock::layer::BodyKey;
    /// use tower_redlock::{Redlock, RedlockLayer};
    ///
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // A Stripe-style receiver: one run per event id, redeliveries replayed.
    /// let layer = RedlockLayer::from_body(redlock, BodyKey::json("id"))
    ///     .replay(Duration::from_secs(3 * 24 * 3600));
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn from_body(lock: L, extractor: E) -> Self {
        let RedlockLayer {
            lock,
            extractor,
            config,
            body: NoBodyFingerprint,
        } = RedlockLayer::new(lock, extractor);
        RedlockLayer {
            lock,
            extractor,
            config,
            body: BodyFingerprintLayer::new(super::DEFAULT_BODY_FINGERPRINT_LIMIT),
        }
    }
}

impl<E, F, L: LockBackend> RedlockLayer<E, F, L> {
    pub(super) fn config(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// The same layer, its names webhook delivery ids: its rejections speak of deliveries.
    #[cfg(feature = "webhook-verify")]
    pub(crate) fn of_deliveries(mut self) -> Self {
        self.config().deliveries = true;
        self
    }

    /// The TTL of the locks this layer takes (default: the client's TTL).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::PathParam;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // A crashed instance blocks the job for 5 s at most; auto-extension covers longer runs.
    /// let layer = RedlockLayer::new(redlock, PathParam::new("/jobs/{id}/run", "id"))
    ///     .ttl(Duration::from_secs(5));
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config().ttl = Some(ttl);
        self
    }

    /// Rejects a request whose lock is busy at once, with 409 / `ABORTED` (the default).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::{Header, WaitPolicy};
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let waiting = RedlockLayer::new(redlock, Header::new("idempotency-key"))
    ///     .wait(WaitPolicy::up_to(Duration::from_secs(5)));
    /// // A route whose clients retry on 409 themselves: answer at once instead.
    /// let layer = waiting.clone().reject_when_busy();
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn reject_when_busy(mut self) -> Self {
        self.config().busy = BusyPolicy::Reject;
        self
    }

    /// Lets a request whose lock is busy wait for it, per `policy`: up to its timeout, in
    /// arrival order, woken when the holder releases. At most the policy's number of
    /// requests of this layer wait at once; beyond that they are rejected at once as busy.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::{Header, WaitPolicy};
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
    ///     .wait(WaitPolicy::up_to(Duration::from_secs(5)).max_waiters(32));
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn wait(mut self, policy: WaitPolicy) -> Self {
        let permits = policy.waiters().min(Semaphore::MAX_PERMITS);
        self.config().busy = BusyPolicy::Wait {
            timeout: policy.timeout(),
            waiters: Arc::new(Semaphore::new(permits)),
        };
        self
    }

    /// Holds the lock until the response body ends (end of stream, error, trailers) or
    /// is dropped, instead of until the inner future completes: for streaming responses.
    ///
    /// ```
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::PathSegment;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // A streamed export: keep the lock until its last byte is sent, not just the headers.
    /// let layer = RedlockLayer::new(redlock, PathSegment::new(1)).release_on_body_end();
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn release_on_body_end(mut self) -> Self {
        self.config().release = ReleaseOn::BodyEnd;
        self
    }

    /// Whether the lock is extended in the background while the inner service runs (and,
    /// in body-end mode, while the body streams), per the client's
    /// [`extend_fraction`](crate::RedlockBuilder::extend_fraction) and maximums. On by
    /// default.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::Header;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Handlers that always finish within 30 s: no extension round trips while they run.
    /// let layer = RedlockLayer::new(redlock, Header::new("idempotency-key"))
    ///     .ttl(Duration::from_secs(30))
    ///     .auto_extend(false);
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn auto_extend(mut self, on: bool) -> Self {
        self.config().auto_extend = on;
        self
    }

    /// Drops the inner future and answers 503 / `UNAVAILABLE` (or the rejection hook's
    /// response) as soon as the lock is lost while the inner service runs. Off by default:
    /// the handler then learns of the loss through its [`LockToken`](crate::LockToken).
    ///
    /// ```
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::PathParam;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // The handler writes without checking its token: stop it as soon as the lock is lost.
    /// let layer = RedlockLayer::new(redlock, PathParam::new("/orders/{id}/ship", "id"))
    ///     .abort_on_loss(true);
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn abort_on_loss(mut self, on: bool) -> Self {
        self.config().abort_on_loss = on;
        self
    }

    /// Whether this layer's locks get a fencing number ([`LockToken::fencing_token`](crate::LockToken::fencing_token)).
    /// The default follows the client's [`fencing`](crate::RedlockBuilder::fencing) setting
    /// (on), which fits locks on shared resources (a path parameter such as an order id).
    /// Turn it off for names that are unique per request, such as idempotency keys and
    /// webhook delivery ids: there is no later holder to fence. Fencing adds no round trip
    /// in the common case (the proposal rides in the acquire round), but it costs each
    /// node a `ZADD`, and two more round trips (a read of the counters and phase 2) when
    /// too few nodes accept the proposal (see [`crate::fencing`]).
    ///
    /// ```
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::Header;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Idempotency keys are unique per request: nothing to fence.
    /// let layer = RedlockLayer::new(redlock, Header::new("idempotency-key")).fencing(false);
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn fencing(mut self, on: bool) -> Self {
        self.lock = self.lock.fenced(on);
        self
    }

    /// The longest `Retry-After` the layer advises (default 1 s): a busy answer advises the
    /// holder's remaining TTL up to this, since a holder usually releases long before its
    /// TTL (which auto-extension keeps renewing) runs out; a 503 advises this, or the time
    /// until nodes in the restart quarantine return, up to this; when the quarantine alone
    /// is the cause, up to 30 s if this is lower
    /// ([`QUARANTINE_RETRY_AFTER_CAP`](crate::layer::reject::QUARANTINE_RETRY_AFTER_CAP)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::PathSegment;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Holders run for minutes: let busy answers advise waits of up to 30 s, not 1 s.
    /// let layer = RedlockLayer::new(redlock, PathSegment::new(1))
    ///     .retry_after_cap(Duration::from_secs(30));
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.config().retry_after_cap = cap;
        self
    }

    /// How long a response body that holds its lock (with
    /// [`release_on_body_end`](Self::release_on_body_end), or a response being recorded
    /// for [`replay`](Self::replay)) may go without the server taking a frame before the
    /// lock is released (default [`DEFAULT_STALL_TIMEOUT`](super::DEFAULT_STALL_TIMEOUT),
    /// 30 s; `None`: never). A client that stops reading mid-body fills its socket and the
    /// server stops polling the body: without a timeout its lock would be extended for as
    /// long as the kernel keeps the connection. The lock is released at the first
    /// extension due after the timeout (within a third of the TTL, by default), counted as
    /// lost ([`LostReason::BodyStalled`](crate::LostReason::BodyStalled)), and the body
    /// ends with the [`Stalled`](super::Stalled) error if it is polled again; nothing is
    /// recorded, so a retry runs the handler again. A body that waits on its own source
    /// (a stream that has nothing yet) is not stalled. Needs
    /// [`auto_extend`](Self::auto_extend) (without it the lock runs out at its TTL
    /// anyway); the in-memory lock of the `testing` feature extends nothing, so it never
    /// releases for a stall.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::Header;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key").required())
    ///     .replay(Duration::from_secs(24 * 3600))
    ///     .stall_timeout(Some(Duration::from_secs(10)));
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn stall_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config().stall_timeout = timeout;
        self
    }

    /// Where the caller of a request comes from when no [`Principal`](super::Principal)
    /// is in its extensions (default: the `Authorization` header): a header, a cookie, or
    /// a function of the request's head (see [`Caller`]). The caller counts in the replay
    /// fingerprint (another caller's request with the same key gets 422) and scopes names
    /// wrapped in [`PerPrincipal`](super::PerPrincipal). Apps that authenticate by session
    /// cookie, API-key header or client certificate set it, or the layer tells their
    /// callers apart only by `Authorization`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::{Caller, Header};
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key").required())
    ///     .replay(Duration::from_secs(24 * 3600))
    ///     .caller(Caller::cookie("session"));
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn caller(mut self, source: Caller) -> Self {
        self.config().caller = Some(source);
        self
    }

    /// Answers rejected requests with `hook` instead of the default responses (see
    /// [`reject`](super::reject)). The hook gets the [`Rejection`] (its kind, message,
    /// lock error and `Retry-After` advice, already negotiated to the request's `Accept`)
    /// and the request's head, and returns any [`IntoRejectionResponse`]: with the `axum`
    /// feature anything `IntoResponse`, otherwise an `http::Response` with a `Bytes` body
    /// (`String`, tonic's body, ...) or the rejection itself for the default answer.
    ///
    /// The hook runs for every rejection, also gRPC ones ([`Rejection::protocol`]). It
    /// should be quick: it runs inside the response future. A hook's body that fails
    /// while it streams ends the response there (logged at `warn`).
    ///
    /// ```
    /// use http::{Response, StatusCode};
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::{Header, RejectionKind};
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let layer = RedlockLayer::new(redlock, Header::new("idempotency-key")).on_rejection(
    ///     |rejection, head| {
    ///         let request_id = head.headers.get("x-request-id").cloned();
    ///         if let Some(error) = rejection.lock_error() {
    ///             eprintln!("{request_id:?}: {error}"); // details for the logs
    ///         }
    ///         match rejection.kind() {
    ///             // Tell clients to poll instead of retrying the request.
    ///             RejectionKind::Busy { .. } => Response::builder()
    ///                 .status(StatusCode::ACCEPTED)
    ///                 .header("location", format!("/status{}", head.uri.path()))
    ///                 .body(String::new())
    ///                 .unwrap_or_default(),
    ///             _ => rejection.into_response(),
    ///         }
    ///     },
    /// );
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    ///
    /// With axum, return anything `IntoResponse`; `Err(rejection)` gives the default:
    ///
    /// ```
    /// # #[cfg(feature = "axum")]
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use axum::Json;
    /// use http::StatusCode;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::{Header, RejectionKind};
    ///
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let layer = RedlockLayer::new(redlock, Header::new("idempotency-key")).on_rejection(
    ///     |rejection, _head| match rejection.kind() {
    ///         RejectionKind::Busy { .. } => {
    ///             Ok((StatusCode::CONFLICT, Json(vec!["in progress"])))
    ///         }
    ///         _ => Err(rejection),
    ///     },
    /// );
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn on_rejection<H, R>(mut self, hook: H) -> Self
    where
        H: Fn(Rejection, &Parts) -> R + Send + Sync + 'static,
        R: IntoRejectionResponse,
    {
        self.config().on_rejection = Some(rejection_hook::hook(hook));
        self
    }
}

impl<S, E: Clone, F: BodyMode, L: LockBackend> Layer<S> for RedlockLayer<E, F, L> {
    type Service = RedlockService<S, E, F, L>;

    fn layer(&self, inner: S) -> Self::Service {
        RedlockService::new(
            inner,
            self.lock.clone(),
            self.extractor.clone(),
            Arc::clone(&self.config),
            self.body.clone(),
        )
    }
}
