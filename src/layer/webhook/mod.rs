//! Webhook receivers: each common sender's delivery id (the extractors here), its
//! signature checked before the lock ([`Signature`], feature `webhook-verify`), and both
//! with replay in one expression per sender ([`Receiver`]), so that a delivery retried or
//! redelivered by its sender runs the handler once, and a forged one never runs it.
//!
//! | sender | the id that stays the same across retries and redeliveries | the sender's retries | `Receiver`'s retention | signature |
//! |---|---|---|---|---|
//! | [Standard Webhooks](https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md) | `webhook-id` header ("the same when a message is retried", the spec's *Webhook metadata*) | the spec suggests a schedule; senders choose | 2 days | `webhook-signature` over `{id}.{timestamp}.{body}`, timestamp within 5 min |
//! | [Svix](https://docs.svix.com/receiving/verifying-payloads/how-manual) | `svix-id` header ([retries](https://docs.svix.com/retries): "the same `svix-id`" on each attempt) | immediately, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h: about 27.6 h ([docs.svix.com/retries](https://docs.svix.com/retries)); manual resends at any time | 2 days | `svix-signature`, as Standard Webhooks |
//! | GitHub | `X-GitHub-Delivery` header ("If you request a redelivery, the `X-GitHub-Delivery` header will be the same as in the original delivery", [best practices](https://docs.github.com/en/webhooks/using-webhooks/best-practices-for-using-webhooks#use-the-x-github-delivery-header)) | none automatic ([handling failed deliveries](https://docs.github.com/en/webhooks/using-webhooks/handling-failed-webhook-deliveries)); redelivery by hand or API of deliveries from the past 3 days ([redelivering](https://docs.github.com/en/webhooks/testing-and-troubleshooting-webhooks/redelivering-webhooks)) | 4 days | `X-Hub-Signature-256` over the body ([validating deliveries](https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries)) |
//! | Shopify | `X-Shopify-Event-Id` header ("the same value across more than one webhook indicates a duplicate", [ignore duplicates](https://shopify.dev/docs/apps/build/webhooks/ignore-duplicates)) | 8 times over 4 hours ([changelog, September 2024](https://shopify.dev/changelog/updates-to-webhook-retry-mechanism)) | 1 day | `X-Shopify-Hmac-Sha256` over the body, base64 |
//! | Stripe | the event's `id` in the JSON body (`evt_...`; "log the event IDs you've processed", [webhooks: duplicate events](https://docs.stripe.com/webhooks#handle-duplicate-events)) | live mode: up to 3 days with exponential backoff; test mode: 3 times over a few hours ([webhooks: retries](https://docs.stripe.com/webhooks#retries)) | 4 days | `Stripe-Signature` over `{t}.{body}`, `t` within 5 min ([signatures](https://docs.stripe.com/webhooks#verify-manually)) |
//!
//! Shopify's `X-Shopify-Webhook-Id` is not the id to lock by: Shopify documents
//! `X-Shopify-Event-Id` as the one whose equal values mark a duplicate. A retention covers
//! the sender's automatic retries and its redelivery window with a margin; a resend by
//! hand after it runs the handler again.
//!
//! Every extractor here rejects a delivery without its id (400). With the extractors alone,
//! add [`replay`](crate::RedlockLayer::replay) so a redelivery after the handler finished
//! gets the stored response instead of running it again, and put the sender's signature
//! check in front of the lock (not in the handler: a forged delivery that reached the
//! lock would take the delivery id's lock, and its answer could be kept for the real
//! delivery). [`Receiver`] does both, with fencing off, as [`crate::fencing`] recommends
//! for unique ids. Wrap the extractor in [`PerRoute`](super::PerRoute) when two endpoints
//! receive deliveries with the same ids (the same event sent to two endpoints), so that
//! each endpoint runs it once.
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
//! // The extractors alone: the handler checks nothing before the lock, so put a
//! // signature check in front (`webhook::Receiver` does, with the `webhook-verify` feature).
//! let app: Router = Router::new()
//!     .route("/github", post(|| async { "ok" }))
//!     .layer(
//!         RedlockLayer::new(redlock.clone(), webhook::github())
//!             .fencing(false)
//!             .replay(Duration::from_secs(4 * 86_400)),
//!     );
//! let stripe: Router = Router::new()
//!     .route("/stripe", post(|| async { "ok" }))
//!     .layer(
//!         RedlockLayer::from_body(redlock, webhook::stripe())
//!             .fencing(false)
//!             .replay(Duration::from_secs(4 * 86_400)),
//!     );
//! # let _ = (app, stripe); Ok(()) }
//! ```

#[cfg(feature = "webhook-verify")]
mod receiver;
#[cfg(feature = "webhook-verify")]
mod signature;
#[cfg(feature = "webhook-verify")]
mod verify;

#[cfg(feature = "webhook-verify")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook-verify")))]
pub use receiver::Receiver;
#[cfg(feature = "webhook-verify")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook-verify")))]
pub use signature::{
    DEFAULT_SIGNATURE_TOLERANCE, DEFAULT_WEBHOOK_MAX_BODY, SecretError, Signature, SignatureError,
};
#[cfg(feature = "webhook-verify")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook-verify")))]
pub use verify::{Verified, VerifiedFuture};

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

/// Svix's message id: the `svix-id` header (the same on every attempt), required.
pub fn svix() -> Header {
    Header::new("svix-id").required()
}

/// GitHub's delivery id: the `X-GitHub-Delivery` header (a GUID per delivery, kept on
/// redelivery), required.
pub fn github() -> Header {
    Header::new("x-github-delivery").required()
}

/// Shopify's event id: the `X-Shopify-Event-Id` header, required. Shopify documents it
/// as the header whose equal values mark a duplicate delivery (`X-Shopify-Webhook-Id` is
/// not documented for that).
pub fn shopify() -> Header {
    Header::new("x-shopify-event-id").required()
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
