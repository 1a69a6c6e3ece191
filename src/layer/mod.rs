//! [`RedlockLayer`](crate::RedlockLayer): tower middleware that holds a quorum lock while a request runs.
//!
//! An extractor ([`ExtractLockName`]) names the lock for each request (or lets the request
//! pass through). The layer acquires the lock before calling the inner service, puts a
//! [`LockToken`](crate::LockToken) into the request extensions, and releases the lock
//! afterwards: when the inner future completes (the default) or when the response body
//! ends ([`release_on_body_end`](crate::RedlockLayer::release_on_body_end)), and in the background
//! if the client goes away and the future or body is dropped. A request that cannot get
//! the lock is answered by a [`Rejection`]: 409 / `ABORTED` when busy, 503 / `UNAVAILABLE`
//! without quorum, 400 / `INVALID_ARGUMENT` on bad input; never a service error, so the
//! layer fits axum's `Infallible` services.
//!
//! Each layer locks names in a namespace of its own: `"{namespace} {name}"`, the namespace
//! its extractor's ([`ExtractLockName::namespace`]: `header:idempotency-key`,
//! `path:/accounts/{id}/credit#id`, ...) unless named with
//! [`namespace`](crate::RedlockLayer::namespace). So two layers on one client never lock
//! the same names (a webhook's delivery id `46` and account `46`) unless they are given the
//! same namespace; `namespace("")` locks the extractor's names as they are, the names a
//! job outside the layer locks with [`Redlock::lock`](crate::Redlock::lock).
//! [`lock_name_for`](crate::RedlockLayer::lock_name_for) says which name a layer locks.
//! Within one layer a name is one lock on every route the layer covers; [`PerRoute`]
//! scopes names to routes.
//!
//! With [`replay`](crate::RedlockLayer::replay) the layer is an idempotency layer: a finished
//! response is kept under the name and a retry gets it back. A stored response only ever
//! goes to the caller that sent the first request: the request fingerprint includes the
//! caller (its [`Principal`], or else a hash of its `Authorization` header), so another
//! caller with the same key gets 422; with [`PerPrincipal`] each caller's keys are its own.
//! Only a record that a quorum of nodes agrees on is replayed, and a handler that
//! outlived its lock leaves none.
//!
//! ```no_run
//! use std::time::Duration;
//! use axum::{Extension, Router, routing::post};
//! use tower_redlock::layer::{Header, WaitPolicy};
//! use tower_redlock::RedlockLayer;
//! use tower_redlock::{LockToken, Redlock};
//!
//! async fn webhook(Extension(token): Extension<LockToken>) -> &'static str {
//!     // Runs once at a time per delivery id; check token.is_held() right before
//!     // each write (it turns false as soon as the lock is lost).
//!     "processed"
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let app: Router = Router::new()
//!     .route("/webhook", post(webhook))
//!     .route_layer(
//!         RedlockLayer::new(redlock, Header::new("x-github-delivery").required())
//!             .fencing(false) // unique delivery ids: nothing to fence
//!             .ttl(Duration::from_secs(30))
//!             .wait(WaitPolicy::up_to(Duration::from_secs(2)).max_waiters(64)),
//!     );
//! # Ok(()) }
//! ```

mod acquire;
mod body;
mod config;
pub mod extract;
pub(crate) mod framework;
mod future;
#[path = "reject/problems.rs"]
pub mod problems;
pub(crate) mod redlock_layer;
pub mod reject;
pub(crate) mod replay;
mod request;
mod service;
pub mod webhook;

pub use body::{ResponseBody, Stalled};
pub use config::{DEFAULT_STALL_TIMEOUT, WaitPolicy};
pub use extract::body_key::{BodyKey, DEFAULT_BODY_KEY_LIMIT};
pub use extract::grpc_methods::GrpcMethods;
pub use extract::{
    ExtractError, ExtractFn, ExtractLockName, Header, PathParam, PathSegment, RequestHead,
    extract_fn,
};
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub use framework::tonic::LockTokenExt;
pub use future::ResponseFuture;
pub use reject::hook::{BoxError, IntoRejectionResponse};
pub use reject::{Protocol, Rejection, RejectionKind};
pub use replay::completion::NotRecorded;
pub use replay::record::{AfterLoss, DEFAULT_REPLAY_MAX_BODY, REPLAYED_HEADER, ReplayPolicy};
pub use request::body_fingerprint::{
    BodyFingerprint, BodyFingerprintLayer, DEFAULT_BODY_FINGERPRINT_LIMIT, NoBodyFingerprint,
};
pub use request::body_mode::BodyMode;
pub use request::body_prefix::PrefixedBody;
pub use request::caller::Caller;
pub use request::fingerprint::RequestFingerprint;
pub use request::principal::Principal;

pub use extract::scoped::{PerPrincipal, PerRoute};
pub use service::RedlockService;
