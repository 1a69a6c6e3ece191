//! [`Receiver`]: one webhook endpoint in one expression (the sender's signature, then
//! the lock by its delivery id, with replay).
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::Redlock;
//! use tower_redlock::layer::webhook::Receiver;
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let receiver = Receiver::shopify(redlock, "the app's client secret")?;
//! let app: axum::Router = axum::Router::new()
//!     .route("/hooks/shopify", axum::routing::post(|| async { "ok" }))
//!     .route_layer(receiver);
//! # let _ = app; Ok(()) }
//! # #[cfg(not(feature = "axum"))]
//! # fn main() {}
//! ```

use std::time::Duration;

use tower_layer::Layer;

use super::signature::{SecretError, Signature};
use super::verify::Verified;
use crate::backend::{LockBackend, Redlock};
use crate::layer::extract::Header;
use crate::layer::redlock_layer::RedlockLayer;
use crate::layer::request::body_fingerprint::BodyFingerprintLayer;
use crate::layer::request::body_mode::BodyMode;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// One webhook endpoint in one expression. The sender's signature is verified
/// first ([`Signature`]), then the delivery is locked by the id the sender keeps across its
/// retries, with [`replay`](crate::RedlockLayer::replay) for the sender's retry window, and
/// fencing off (each delivery id is locked once; see [`crate::fencing`]).
///
/// | sender | constructor | locks by | replay retention |
/// |---|---|---|---|
/// | Standard Webhooks | [`Receiver::standard`] | `webhook-id` | 2 days |
/// | Svix | [`Receiver::svix`] | `svix-id` | 2 days |
/// | GitHub | [`Receiver::github`] | `X-GitHub-Delivery` | 4 days |
/// | Shopify | [`Receiver::shopify`] | `X-Shopify-Event-Id` | 1 day |
/// | Stripe | [`Receiver::stripe`] (feature `json`) | the event's `id` in the body | 4 days |
///
/// The [`webhook`](super) module's table says where each retention comes from.
///
/// ```no_run
/// # #[cfg(feature = "axum")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use axum::{Router, routing::post};
/// use tower_redlock::Redlock;
/// use tower_redlock::layer::webhook::Receiver;
///
/// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
/// let secret = std::env::var("GITHUB_WEBHOOK_SECRET")?;
/// let app: Router = Router::new()
///     .route("/hooks/github", post(|| async { "ok" }))
///     .layer(Receiver::github(redlock, secret)?);
/// # let _ = app;
/// # Ok(()) }
/// # #[cfg(not(feature = "axum"))]
/// # fn main() {}
/// ```
///
/// The layers: the sender's [`Signature`] in front, then a [`RedlockLayer`] that locks by
/// the sender's delivery id and replays.
#[derive(Debug, Clone)]
#[must_use = "a `Receiver` protects nothing until it wraps a service (`.layer(..)`)"]
pub struct Receiver<E, L = Redlock> {
    signature: Signature,
    lock: RedlockLayer<E, BodyFingerprintLayer, L>,
}

impl<E, L: LockBackend> Receiver<E, L> {
    fn of<F: BodyMode>(signature: Signature, lock: RedlockLayer<E, F, L>, keep: Duration) -> Self {
        Self {
            signature,
            lock: lock.replay(keep).fencing(false).of_deliveries(),
        }
    }

    /// The same receiver, its signature check changed by `f` (for instance its
    /// [`tolerance`](Signature::tolerance) or [`max_body`](Signature::max_body)).
    pub fn map_signature(mut self, f: impl FnOnce(Signature) -> Signature) -> Self {
        self.signature = f(self.signature);
        self
    }

    /// The same receiver, its lock layer changed by `f` (its TTL, a wait policy, the replay
    /// retention, a namespace, ...).
    pub fn map_lock(
        mut self,
        f: impl FnOnce(
            RedlockLayer<E, BodyFingerprintLayer, L>,
        ) -> RedlockLayer<E, BodyFingerprintLayer, L>,
    ) -> Self {
        self.lock = f(self.lock);
        self
    }
}

impl<L: LockBackend> Receiver<Header, L> {
    /// A [Standard Webhooks](https://www.standardwebhooks.com/) endpoint: `secret` as the
    /// sender shows it (`whsec_` and base64).
    pub fn standard(lock: L, secret: &str) -> Result<Self, SecretError> {
        let lock = RedlockLayer::new(lock, super::standard());
        Ok(Self::of(Signature::standard(secret)?, lock, 2 * DAY))
    }

    /// A Svix endpoint: `secret` as Svix shows it (`whsec_...`).
    pub fn svix(lock: L, secret: &str) -> Result<Self, SecretError> {
        let lock = RedlockLayer::new(lock, super::svix());
        Ok(Self::of(Signature::svix(secret)?, lock, 2 * DAY))
    }

    /// A GitHub webhook endpoint, with the webhook's secret.
    pub fn github(lock: L, secret: impl AsRef<[u8]>) -> Result<Self, SecretError> {
        let lock = RedlockLayer::new(lock, super::github());
        Ok(Self::of(Signature::github(secret)?, lock, 4 * DAY))
    }

    /// A Shopify webhook endpoint, with the app's client secret.
    pub fn shopify(lock: L, secret: impl AsRef<[u8]>) -> Result<Self, SecretError> {
        let lock = RedlockLayer::new(lock, super::shopify());
        Ok(Self::of(Signature::shopify(secret)?, lock, DAY))
    }
}

#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
impl<L: LockBackend> Receiver<crate::layer::BodyKey, L> {
    /// A Stripe webhook endpoint, with the endpoint's signing secret (`whsec_...`).
    pub fn stripe(lock: L, secret: impl AsRef<[u8]>) -> Result<Self, SecretError> {
        let lock = RedlockLayer::from_body(lock, super::stripe());
        Ok(Self::of(Signature::stripe(secret)?, lock, 4 * DAY))
    }
}

impl<S, E, L> Layer<S> for Receiver<E, L>
where
    RedlockLayer<E, BodyFingerprintLayer, L>: Layer<S>,
{
    type Service = Verified<<RedlockLayer<E, BodyFingerprintLayer, L> as Layer<S>>::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        self.signature.layer(self.lock.layer(inner))
    }
}
