//! # tower-redlock
//!
//! The [Redlock](https://redis.io/docs/latest/develop/use/patterns/distributed-locks/)
//! distributed lock over N independent Redis masters, as a client ([`Redlock`]) and as
//! tower middleware ([`RedlockLayer`]) for axum, tonic and hyper.
//!
//! [`Redlock`] follows the algorithm exactly: `SET key value NX PX ttl` (in a script) with a
//! fresh 20-byte value from the OS CSPRNG, sent to all nodes at once over one shared
//! multiplexed connection per node, each call bounded by a per-node timeout far below the
//! TTL. The lock is held only with a quorum (`N/2 + 1`) and while
//! `ttl - elapsed - drift` is positive; a failed attempt releases on every node; release
//! and extend are atomic compare-and-delete / compare-and-pexpire scripts; retries wait a
//! random jitter.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::builder([
//!     "redis://127.0.0.1:7001",
//!     "redis://127.0.0.1:7002",
//!     "redis://127.0.0.1:7003",
//! ])
//! .ttl(Duration::from_secs(10))
//! .build()?;
//!
//! let lock = redlock.lock("webhook:evt_123").await?;
//! // Only one holder at a time gets here, for at most lock.remaining().
//! redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```
//!
//! ## In axum
//!
//! The layer names a lock per request, holds it while the handler runs and hands the
//! handler a [`LockToken`]; duplicates get 409 with `Retry-After`, and a lost quorum 503.
//!
//! ```no_run
//! # #[cfg(feature = "axum")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{Router, routing::post};
//! use tower_redlock::layer::Header;
//! use tower_redlock::{LockToken, Redlock, RedlockLayer};
//!
//! async fn webhook(token: LockToken) -> &'static str {
//!     // Runs once at a time per X-GitHub-Delivery id.
//!     "done"
//! }
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let app: Router = Router::new()
//!     .route("/webhook", post(webhook))
//!     .route_layer(RedlockLayer::new(redlock, Header::new("x-github-delivery").required()));
//! # Ok(()) }
//! ```
//!
//! ## In tonic
//!
//! gRPC calls are keyed by metadata (which arrives as headers) and rejected with
//! trailers-only `ABORTED`, `UNAVAILABLE` or `INVALID_ARGUMENT` statuses.
//!
//! ```no_run
//! # #[cfg(feature = "tonic")]
//! # async fn demo<S>(svc: S) -> Result<(), Box<dyn std::error::Error>>
//! # where
//! #     S: tower_service::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>, Error = std::convert::Infallible>
//! #         + tonic::server::NamedService + Clone + Send + Sync + 'static,
//! #     S::Future: Send + 'static,
//! # {
//! use tower_redlock::layer::Header;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! tonic::transport::Server::builder()
//!     .layer(RedlockLayer::new(redlock, Header::new("idempotency-key")))
//!     .add_service(svc) // handlers read request.extensions().get::<LockToken>()
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Modules:
//! - [`client`]: [`Redlock`] and its builder;
//! - [`layer`]: [`RedlockLayer`], extractors, rejections;
//! - [`guard`]: [`LockGuard`], auto-extension and the lost signal;
//! - [`token`]: held locks, tokens, names and values;
//! - [`fencing`]: fencing numbers, why they strictly increase, and how a store uses them;
//! - [`quorum`]: the quorum and validity arithmetic;
//! - [`error`]: what can go wrong, per operation and per node.
//!
//! Features: `axum` ([`LockToken`] as an axum extractor), `tonic` (`tonic::Status` from
//! [`LockError`]), `tls-rustls` (`rediss://` URLs; install a rustls crypto provider).
//! The design rules are summarised in `CONTRIBUTING.md` of the repository.
#![deny(missing_docs, unreachable_pub, unsafe_code)]
#![warn(rust_2018_idioms)]

pub mod client;
#[cfg(any(feature = "axum", feature = "tonic"))]
pub mod compat;
pub mod error;
pub mod fencing;
pub mod guard;
pub mod layer;
mod node;
pub mod quorum;
mod scripts;
pub mod token;

pub use client::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR, DEFAULT_EXTEND_FRACTION, DEFAULT_FENCING,
    DEFAULT_KEY_PREFIX, DEFAULT_MAX_ATTEMPTS, DEFAULT_NODE_TIMEOUT,
    DEFAULT_RECONNECT_AFTER_TIMEOUTS, DEFAULT_RESTART_QUARANTINE, DEFAULT_RETRY_DELAY,
    DEFAULT_RETRY_JITTER, DEFAULT_TTL, MAX_TTL, MIN_TTL_TO_TIMEOUT_RATIO, Redlock, RedlockBuilder,
    Released,
};
pub use error::{ConfigError, LockError, NodeError, NodeFailure};
pub use guard::{LockGuard, LostReason};
pub use layer::RedlockLayer;
pub use token::{Lock, LockToken, MAX_NAME_LEN, VALUE_LEN};

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
