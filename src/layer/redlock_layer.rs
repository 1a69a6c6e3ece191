//! [`RedlockLayer`]: the tower layer, and every builder method that sets its configuration
//! (the lock's, the namespace's, replay's).
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

use super::config::{BusyPolicy, Config, ReleaseOn, WaitPolicy};
use super::extract::ExtractLockName;
use super::extract::namespace::Namespace;
use super::reject::Rejection;
use super::reject::hook::{self as rejection_hook, IntoRejectionResponse};
use super::request::body_fingerprint::{BodyFingerprintLayer, NoBodyFingerprint};
use super::request::body_mode::BodyMode;
use super::request::caller::Caller;
use super::service::RedlockService;
use crate::backend::{LockBackend, Redlock};

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

// The namespace setters: the names the layer locks.

impl<E, F, L: LockBackend> RedlockLayer<E, F, L> {
    /// Names the layer's namespace: the layer locks `"{namespace} {name}"` for each name
    /// its extractor gives, instead of taking its extractor's
    /// [`namespace`](super::ExtractLockName::namespace) (`header:idempotency-key`,
    /// `path:/accounts/{id}/credit#id`, ...). Spaces and `%` in it are percent-encoded, so
    /// two namespaces never give one lock name.
    ///
    /// - Layers given the same namespace share their names on purpose: a request of one
    ///   is busy while a request of the other holds the same name, and with
    ///   [`replay`](Self::replay) finds its record (its key reused: 422 when the requests
    ///   differ).
    /// - Name the layers whose extractors are closures ([`extract_fn`](super::extract_fn)):
    ///   otherwise they all share the namespace `fn`.
    /// - `namespace("")` is no namespace: the lock name is exactly the extractor's name,
    ///   the name a background job locks with [`Redlock::lock`](crate::Redlock::lock) to
    ///   exclude the layer's requests, and the name layers locked before they had
    ///   namespaces.
    ///
    /// Like the names, a namespace must be the same in every instance of the application.
    /// Applications that share Redis servers are kept apart by the client's
    /// [`key_prefix`](crate::RedlockBuilder::key_prefix), not by namespaces.
    ///
    /// ```
    /// use tower_redlock::layer::{Header, PathParam};
    /// use tower_redlock::{Redlock, RedlockLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Two routes that change accounts, each with its own layer: one lock per account.
    /// let by_id = |route| PathParam::new(route, "id");
    /// let credit = RedlockLayer::new(redlock.clone(), by_id("/accounts/{id}/credit"))
    ///     .namespace("account");
    /// let debit = RedlockLayer::new(redlock.clone(), by_id("/accounts/{id}/debit"))
    ///     .namespace("account");
    /// assert_eq!(credit.lock_name_for::<()>("46"), b"account 46");
    /// assert_eq!(credit.lock_name_for::<()>("46"), debit.lock_name_for::<()>("46"));
    ///
    /// // By default each layer has its own: a delivery id 46 is not account 46.
    /// let hooks = RedlockLayer::new(redlock, Header::new("x-delivery-id"));
    /// assert_eq!(hooks.lock_name_for::<()>("46"), b"header:x-delivery-id 46");
    /// # Ok(()) }
    /// ```
    ///
    /// With no namespace, a job outside the layer locks the names the layer locks:
    ///
    /// ```no_run
    /// use tower_redlock::layer::{ExtractError, RequestHead, extract_fn};
    /// use tower_redlock::{Redlock, RedlockLayer};
    ///
    /// fn account(head: &RequestHead<'_>) -> Result<Option<Vec<u8>>, ExtractError> {
    ///     let id = head.uri.path().split('/').nth(2).unwrap_or_default();
    ///     Ok((!id.is_empty()).then(|| format!("account:{id}").into_bytes()))
    /// }
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let layer = RedlockLayer::new(redlock.clone(), extract_fn(account)).namespace("");
    /// // The nightly interest job: requests for account 42 wait while it holds the lock.
    /// let lock = redlock.lock("account:42").await?;
    /// # let _ = (layer, lock); Ok(()) }
    /// ```
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config().namespace = Namespace::named(&namespace.into());
        self
    }

    /// The lock name this layer takes for a request whose extractor gives `name`: its
    /// namespace (see [`namespace`](Self::namespace)), a space, then `name`. That is the
    /// name the handler's [`LockToken::name`](crate::LockToken::name) shows, and the name
    /// a test looks up in the in-memory lock of the `testing` feature. `B` is the request
    /// body type the layer serves (`()` fits the stock extractors, whatever the body).
    ///
    /// ```
    /// use tower_redlock::layer::{Header, PerRoute};
    /// use tower_redlock::{Redlock, RedlockLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let layer = RedlockLayer::new(redlock.clone(), Header::new("Idempotency-Key"));
    /// assert_eq!(layer.lock_name_for::<()>("k-1"), b"header:idempotency-key k-1");
    /// // A scoped extractor's name keeps its scope, inside the namespace.
    /// let routed = RedlockLayer::new(redlock, PerRoute::new(Header::new("Idempotency-Key")));
    /// assert_eq!(
    ///     routed.lock_name_for::<()>("POST /orders k-1"),
    ///     b"header:idempotency-key POST /orders k-1"
    /// );
    /// # Ok(()) }
    /// ```
    pub fn lock_name_for<B>(&self, name: impl AsRef<[u8]>) -> Vec<u8>
    where
        E: ExtractLockName<B>,
    {
        self.config
            .namespace
            .lock_name(&self.extractor, name.as_ref().to_vec())
    }
}

// The replay setters: an idempotency layer, and how much of each body it fingerprints.

impl<E, F, L: LockBackend> RedlockLayer<E, F, L> {
    /// Makes the layer an idempotency layer: a response the handler finished with is kept
    /// under the lock name for `retention`, and a later request with the same name gets it
    /// back (marked `idempotent-replayed: true`) without running the handler. See
    /// [`ReplayPolicy`](super::ReplayPolicy) for what is kept (2xx and 4xx except
    /// 401/403/407/408/409/425/429, bodies up to 256 KiB byte for byte) and [`replay_policy`](Self::replay_policy) to
    /// change it. With an `Idempotency-Key` [`Header`](super::Header) this is the IETF
    /// Idempotency-Key draft's contract (the README has its table): the key is read as a
    /// structured-field string, and rejections are problem documents unless the client
    /// asks for text.
    ///
    /// The response is recorded as it streams: its body goes out frame by frame while a
    /// copy is kept, and once the body has ended the record is written on the nodes that
    /// hold the lock, while they hold it, and the lock released, before the last frame
    /// (or the end of the stream) goes out. So the lock is held until then (as with
    /// [`release_on_body_end`](Self::release_on_body_end)), and a client that has the
    /// whole response finds the record when it retries. A response over the policy's
    /// [`max_body`](super::ReplayPolicy::max_body) is recorded as "completed, not kept":
    /// its retries get 410 / `ALREADY_EXISTS` (or the hook's answer for
    /// [`RejectionKind::ResponseNotKept`](super::RejectionKind::ResponseNotKept)), never an
    /// empty success. A body that fails, a client that goes away before the body's end, a
    /// handler that panics, or a handler that outlived its lock (lost, or past its
    /// validity, as without [`auto_extend`](Self::auto_extend)) leaves no record: the lock
    /// is only released, and a retry runs the handler again. A failed body reaches the
    /// client as the failure it is.
    ///
    /// The lookup is part of the acquire round trip, fenced or not: the request reads the
    /// key (`GET`, `PTTL`) behind the lock's own commands, so a retry answered from its
    /// record costs one round trip to each node (on a Redis Cluster node, a key found
    /// taken is read in a second one). A record written on a quorum is seen
    /// by every later acquirer (any quorum it can take shares a node with the record's).
    /// Only a record that a quorum of nodes hold, byte for byte, is replayed: a record
    /// found on fewer nodes next to a quorum of grants (nodes that lost it, or a completion
    /// that reached too few) is restored onto the granting nodes first; records that
    /// differ from node to node (two runs) count as the name being held, so the request is
    /// busy (409 / `ABORTED`) until they expire, or, if it takes the lock on a quorum,
    /// runs the handler and records anew. What a key gets when nodes that granted may have
    /// lost its record is the policy's [`after_loss`](super::ReplayPolicy::after_loss).
    ///
    /// **Records live as long as the nodes keep their data.** A node that restarts without
    /// persistence, or is flushed, forgets its records; what it lost is kept on the nodes
    /// (see [`RedlockBuilder::check_interval`](crate::RedlockBuilder::check_interval)), so
    /// every app instance answers alike: a record found on any node next to a quorum of
    /// grants is restored and replayed, and a key with no record anywhere runs once the
    /// restart quarantine ends (or, with
    /// [`AfterLoss::Refuse`](super::AfterLoss::Refuse), gets 503
    /// [`#replay-unverifiable`](super::problems#replay-unverifiable) until a quorum of the
    /// granting nodes have held their data for the retention). Persistent nodes
    /// (`appendonly yes`, `appendfsync always`) lose nothing; the README's replay section
    /// and `docs/reliability.md` give the rule and its limits.
    ///
    /// gRPC: a unary reply (one message, its status kept by
    /// [`ReplayPolicy::keeps_grpc`](super::ReplayPolicy::keeps_grpc)) is replayed with its
    /// message, `content-type`, `grpc-*` headers and trailers; its trailers wait until the
    /// record is stored. Streaming responses (more than one message) are not replayed.
    ///
    /// A later request with the same name but a different fingerprint (method, path,
    /// query, caller, and the first MiB of the body) is refused with 422 /
    /// `INVALID_ARGUMENT`. To count the body, the layer reads the start of each locked
    /// request's body before the lock is taken (see
    /// [`body_fingerprint`](RedlockLayer::body_fingerprint)), so the inner service gets a
    /// [`PrefixedBody`](super::PrefixedBody) (axum routers and tonic servers take it as
    /// they take any body); [`without_body_fingerprint`](RedlockLayer::without_body_fingerprint)
    /// keeps the request's own body type. The caller is the
    /// [`Principal`](super::Principal) your authentication middleware put into the request
    /// extensions, or the one the layer's [`caller`](Self::caller) source names (a session
    /// cookie, an API-key header), or else (a hash of) the `Authorization` header: another caller that
    /// sends the same key never gets the first caller's response. Wrap the extractor in
    /// [`PerPrincipal`](super::PerPrincipal) to scope keys to the caller instead (each
    /// caller then runs its own request).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::Header;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Clients retry a payment with the same key for up to a day: answer them from the record.
    /// let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key").required())
    ///     .replay(Duration::from_secs(24 * 3600));
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn replay(self, retention: Duration) -> RedlockLayer<E, BodyFingerprintLayer, L>
    where
        F: BodyMode,
    {
        self.replay_policy(super::ReplayPolicy::new(retention))
    }

    /// Like [`replay`](Self::replay), with the policy given.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::{Header, ReplayPolicy};
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Larger JSON answers, and only the headers clients read back.
    /// let policy = ReplayPolicy::new(Duration::from_secs(24 * 3600))
    ///     .max_body(64 * 1024)
    ///     .headers([http::header::CONTENT_TYPE, http::header::LOCATION]);
    /// let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
    ///     .replay_policy(policy);
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn replay_policy(
        mut self,
        policy: super::ReplayPolicy,
    ) -> RedlockLayer<E, BodyFingerprintLayer, L>
    where
        F: BodyMode,
    {
        self.config().replay = Some(policy);
        RedlockLayer {
            lock: self.lock,
            extractor: self.extractor,
            config: self.config,
            body: self.body.fingerprinting(),
        }
    }
}

impl<E, L> RedlockLayer<E, BodyFingerprintLayer, L> {
    /// How many bytes of each locked request's body count in its fingerprint (default
    /// [`DEFAULT_BODY_FINGERPRINT_LIMIT`](super::DEFAULT_BODY_FINGERPRINT_LIMIT), 1 MiB):
    /// the same key with a body that differs within them is refused with 422; bodies that
    /// differ only beyond them count as the same request. Up to this much of each body is
    /// held (not copied) until the handler reads it. `0` reads nothing (the body does not
    /// count), and the inner service still gets a [`PrefixedBody`](super::PrefixedBody).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::Header;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Uploads of up to 16 MiB, where any changed byte must count.
    /// let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
    ///     .replay(Duration::from_secs(3600))
    ///     .body_fingerprint(16 << 20);
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn body_fingerprint(mut self, limit: usize) -> Self {
        self.body = BodyFingerprintLayer::new(limit);
        self
    }

    /// Replays without reading request bodies: the inner service gets each request as
    /// it came (`Request<B>`, for services that need their own body type), and the same
    /// key sent with a different body gets the first request's response, unless your
    /// own [`RequestFingerprint`](super::RequestFingerprint) (or an outer
    /// [`BodyFingerprintLayer`]) counts the body.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use http::{Request, Response};
    /// use tower::{ServiceBuilder, service_fn};
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::Header;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // A service of `Request<String>`: its body type stays.
    /// let svc = ServiceBuilder::new()
    ///     .layer(
    ///         RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
    ///             .replay(Duration::from_secs(3600))
    ///             .without_body_fingerprint(),
    ///     )
    ///     .service(service_fn(|req: Request<String>| async move {
    ///         Ok::<_, Infallible>(Response::new(req.into_body()))
    ///     }));
    /// # let _ = svc;
    /// # Ok(()) }
    /// ```
    pub fn without_body_fingerprint(self) -> RedlockLayer<E, NoBodyFingerprint, L> {
        RedlockLayer {
            lock: self.lock,
            extractor: self.extractor,
            config: self.config,
            body: NoBodyFingerprint,
        }
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
