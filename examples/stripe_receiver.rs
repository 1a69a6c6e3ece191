//! A Stripe webhook receiver in one expression, `Receiver::stripe(redlock, secret)`.
//! Stripe: the event's `id` in the JSON body, `Stripe-Signature` checked first (its `t` within 5 minutes), replay for 4 days (Stripe retries for up to 3 days).
//!
//! The example plays the sender against itself: a forged delivery (401, no lock taken),
//! the real one (the handler runs), and the sender's retry of it (the stored answer,
//! `idempotent-replayed`); the handler runs once.
//!
//! ```text
//! cargo run --features axum,webhook-verify --example stripe_receiver
//! ```
//!
//! Environment: `REDLOCK_NODES` (comma-separated `redis://` URLs; default: start 3 local
//! `redis-server` processes), `STRIPE_WEBHOOK_SECRET` (default: a demo secret).

mod common;

use common::Error;
use common::webhook::{Runs, Sender, endpoint, play, serve, setup};
use tower_redlock::layer::webhook::Receiver;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (redlock, _nodes, secret) =
        setup("STRIPE_WEBHOOK_SECRET", "whsec_a_stripe_endpoint_secret")?;
    let runs = Runs::default();
    // The one expression: signature, then the lock by delivery id, with replay.
    let app = endpoint(&runs).route_layer(Receiver::stripe(redlock, &secret)?);
    play(Sender::Stripe, serve(app).await?, &secret, &runs).await
}
