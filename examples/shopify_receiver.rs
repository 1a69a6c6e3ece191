//! A Shopify webhook receiver in one expression, `Receiver::shopify(redlock, secret)`.
//! Shopify: the `X-Shopify-Event-Id` (the same on every retry; `X-Shopify-Webhook-Id` is new on each), `X-Shopify-Hmac-Sha256` checked first, replay for 1 day (Shopify retries 8 times over 4 hours).
//!
//! The example plays the sender against itself: a forged delivery (401, no lock taken),
//! the real one (the handler runs), and the sender's retry of it (the stored answer,
//! `idempotent-replayed`); the handler runs once.
//!
//! ```text
//! cargo run --features axum,webhook-verify --example shopify_receiver
//! ```
//!
//! Environment: `REDLOCK_NODES` (comma-separated `redis://` URLs; default: start 3 local
//! `redis-server` processes), `SHOPIFY_CLIENT_SECRET` (default: a demo secret).

mod common;

use common::Error;
use common::webhook::{Runs, Sender, endpoint, play, serve, setup};
use tower_redlock::layer::webhook::Receiver;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (redlock, _nodes, secret) =
        setup("SHOPIFY_CLIENT_SECRET", "shpss_a_shopify_client_secret")?;
    let runs = Runs::default();
    // The one expression: signature, then the lock by delivery id, with replay.
    let app = endpoint(&runs).route_layer(Receiver::shopify(redlock, &secret)?);
    play(Sender::Shopify, serve(app).await?, &secret, &runs).await
}
