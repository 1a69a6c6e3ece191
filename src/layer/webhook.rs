//! Webhook receivers in one line: the extractor of each common sender's delivery id, so
//! that a delivery retried by its sender runs the handler once.
//!
//! | sender | where the delivery id is | the layer |
//! |---|---|---|
//! | [Standard Webhooks](https://www.standardwebhooks.com/) (Svix, and senders that follow the spec) | `webhook-id` header | `RedlockLayer::new(lock, webhook::standard())` |
//! | Svix | `svix-id` header | `RedlockLayer::new(lock, webhook::svix())` |
//! | GitHub | `X-GitHub-Delivery` header | `RedlockLayer::new(lock, webhook::github())` |
//! | Shopify | `X-Shopify-Webhook-Id` header | `RedlockLayer::new(lock, webhook::shopify())` |
//! | Stripe | the event's `id` in the JSON body | `RedlockLayer::from_body(lock, webhook::stripe())` (feature `json`, on by default) |
//!
//! Every extractor here rejects a delivery without its id (400). Add
//! [`replay`](crate::RedlockLayer::replay) so a redelivery after the handler finished gets
//! the stored response instead of running it again; wrap the extractor in
//! [`PerRoute`](super::PerRoute) when two endpoints receive deliveries with the same ids
//! (the same event sent to two endpoints), so that each endpoint runs it once.
//!
//! Each preset's lock names are in its extractor's namespace (see
//! [`ExtractLockName::namespace`](super::ExtractLockName::namespace)): the header's,
//! such as `header:x-github-delivery`, and `body:/id` for Stripe. So a receiver's delivery
//! ids never meet the names of the application's other layers (an account id that equals
//! a delivery id). Two receivers of one sender on one client share them, as the routes of
//! one layer do: name the layers ([`RedlockLayer::namespace`](crate::RedlockLayer::namespace))
//! or wrap the extractor in `PerRoute` to keep them apart.
//!
//! ```no_run
//! # #[cfg(all(feature = "axum", feature = "json"))]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use axum::{Router, routing::post};
//! use tower_redlock::layer::webhook;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let app: Router = Router::new()
//!     .route("/github", post(|| async { "ok" }))
//!     .layer(RedlockLayer::new(redlock.clone(), webhook::github()).replay(Duration::from_secs(86_400)));
//! let stripe: Router = Router::new()
//!     .route("/stripe", post(|| async { "ok" }))
//!     .layer(RedlockLayer::from_body(redlock, webhook::stripe()).replay(Duration::from_secs(86_400)));
//! # let _ = (app, stripe); Ok(()) }
//! ```

use super::extract::Header;

/// The [Standard Webhooks](https://www.standardwebhooks.com/) delivery id: the
/// `webhook-id` header, required.
///
/// ```
/// use http::Request;
/// use tower_redlock::layer::{ExtractLockName, webhook};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let req = Request::post("/hooks").header("webhook-id", "msg_2KWPB").body(())?;
/// assert_eq!(webhook::standard().extract(&req)?, Some(b"msg_2KWPB".to_vec()));
/// # Ok(()) }
/// ```
pub fn standard() -> Header {
    Header::new("webhook-id").required()
}

/// Svix's delivery id: the `svix-id` header, required.
pub fn svix() -> Header {
    Header::new("svix-id").required()
}

/// GitHub's delivery id: the `X-GitHub-Delivery` header (a GUID per delivery, kept on
/// redelivery), required.
pub fn github() -> Header {
    Header::new("x-github-delivery").required()
}

/// Shopify's delivery id: the `X-Shopify-Webhook-Id` header, required.
pub fn shopify() -> Header {
    Header::new("x-shopify-webhook-id").required()
}

/// Stripe's event id: the `id` field of the JSON body (`evt_...`), read from the first
/// 64 KiB of the body. Use it with [`RedlockLayer::from_body`](crate::RedlockLayer::from_body).
///
/// ```
/// use tower_redlock::layer::webhook;
///
/// let key = webhook::stripe();
/// assert_eq!(key.key_of(br#"{"id":"evt_1","type":"charge.succeeded"}"#), Ok(b"evt_1".to_vec()));
/// ```
#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
pub fn stripe() -> super::BodyKey {
    super::BodyKey::json("id")
}
