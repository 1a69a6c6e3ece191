//! # tower-redlock
//!
//! The [Redlock](https://redis.io/docs/latest/develop/use/patterns/distributed-locks/)
//! distributed lock over N independent Redis masters, as a client ([`Redlock`]) and as
//! tower middleware ([`RedlockLayer`]) for axum, tonic and hyper.
//!
//! [`Redlock`] follows the algorithm exactly: `SET key value NX PX ttl` (with fencing,
//! followed in the same request by the `ZADD GT CH` of a proposed fencing number; a script
//! only with the layer's replay) with a fresh 20-byte value from the OS CSPRNG, sent to
//! all nodes at once over one shared pipelined connection per node, each call bounded by a
//! per-node timeout far below the TTL. The lock is held only with a quorum (`N/2 + 1`) and while
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
//! let _ = redlock.unlock(&lock).await;
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
//!     // Delivery ids are unique: nothing to fence (see the fencing module).
//!     .route_layer(
//!         RedlockLayer::new(redlock, Header::new("x-github-delivery").required())
//!             .fencing(false),
//!     );
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
//!     .add_service(svc) // handlers call request.lock_token() (layer::LockTokenExt)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! The types are at the crate root; the modules hold what goes with them:
//! - [`layer`]: extractors, rejections and the service behind [`RedlockLayer`];
//! - [`fencing`]: fencing numbers, why they strictly increase, and how a store uses them;
//! - [`quorum`]: the quorum and validity arithmetic;
//! - [`defaults`]: the default of every setting and the limits.
//!
//! Features:
//!
//! | feature | what it adds |
//! |---|---|
//! | `axum` | [`LockToken`] as an axum extractor (`async fn h(token: LockToken)`), `MissingLockToken`, and `MatchedPath` in [`layer::PerRoute`] |
//! | `tonic` | `tonic::Status::from(LockError)`, with the layer's gRPC mapping, and `request.lock_token()` (`layer::LockTokenExt`) |
//! | `tls-rustls` | `rediss://` nodes (TLS 1.3 and 1.2), with the *ring* crypto provider chosen by the crate; `RedlockBuilder::tls_root_certificates` and `tls_client_certificate` |
//! | `tls-insecure` | `rediss://...#insecure` nodes, which skip certificate checks (tests only) |
//! | `cluster` | a Redis Cluster as one node: `NodeConfig::cluster` |
//! | `metrics` | counters, histograms and gauges through the `metrics` facade: see [`metrics`] |
//! | `json` (default) | [`layer::BodyKey::json`] and [`layer::webhook::stripe`]: a lock name from a JSON field of the request body, through serde_json |
//! | `webhook-verify` | `layer::webhook::Signature` and `layer::webhook::Receiver`: each webhook sender's signature (Standard Webhooks, Svix, GitHub, Stripe, Shopify) checked before the lock, and a receiver per sender in one expression |
//! | `testing` | `testing::InMemoryLock`: an in-process lock with failure injection, for tests of handlers behind [`RedlockLayer`] (for dev-dependencies) |
//!
//! **Freshly started or promoted nodes.** A node up for less than the longest TTL, one
//! whose `run_id` changed, one promoted from replica by a failover within the longest TTL
//! (and a Redis Cluster shard whose master changed or restarted) may have lost lock keys,
//! so by default it is kept out of acquisitions until the locks it may have lost have
//! expired (the restart quarantine), whenever the client started; [`NodeStatus`] says
//! why.
//! Keep it on for nodes without `appendfsync always`; turn it off only for nodes started
//! empty by the same program, such as tests
//! ([`RedlockBuilder::restart_quarantine`]).
//!
//! The design rules and the map of the source files are in `CONTRIBUTING.md` of the
//! repository.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(
    missing_docs,
    unreachable_pub,
    unsafe_code,
    missing_debug_implementations
)]
#![warn(rust_2018_idioms)]

mod backend;
mod client;
mod clock;
mod core;
pub mod defaults;
mod error;
pub mod fencing;
mod guard;
mod keepalive;
mod landing;
pub mod layer;
pub mod metrics;
mod name;
mod node;
mod op;
pub mod quorum;
mod round;
mod scripts;
mod sentinel;
#[cfg(test)]
mod sim;
mod stall;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod token;
mod votes;
mod waiters;

#[cfg(feature = "tonic")]
mod tonic_status;

pub use backend::LockBackend;
pub use client::{
    Health, Inspection, NodeConfig, NodeHealth, NodeStatus, Redlock, RedlockBuilder, Released,
    Shutdown,
};
pub use error::{
    ConfigError, ErrorDetail, LockError, NodeError, NodeFailure, QuarantineReason, TlsProblem,
};
pub use guard::LockGuard;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use layer::framework::axum::MissingLockToken;
pub use layer::redlock_layer::RedlockLayer;
pub use token::{Lock, LockToken, LostReason};

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
