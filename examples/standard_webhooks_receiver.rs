//! A Standard Webhooks webhook receiver in one expression, `Receiver::standard(redlock, secret)`.
//! Standard Webhooks: the `webhook-id`, `webhook-signature` checked first (its `webhook-timestamp` within 5 minutes), replay for 2 days.
//!
//! The example plays the sender against itself: a forged delivery (401, no lock taken),
//! the real one (the handler runs), and the sender's retry of it (the stored answer,
//! `idempotent-replayed`); the handler runs once.
//!
//! ```text
//! cargo run --features axum,webhook-verify --example standard_webhooks_receiver
//! ```
//!
//! Environment: `REDLOCK_NODES` (comma-separated `redis://` URLs; default: start 3 local
//! `redis-server` processes), `WEBHOOK_SECRET` (default: a demo secret).

mod common;

use common::Error;
use common::webhook::{Runs, Sender, endpoint, play, serve, setup};
use tower_redlock::layer::webhook::Receiver;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (redlock, _nodes, secret) =
        setup("WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
    let runs = Runs::default();
    // The one expression: signature, then the lock by delivery id, with replay.
    let app = endpoint(&runs).route_layer(Receiver::standard(redlock, &secret)?);
    play(Sender::Standard, serve(app).await?, &secret, &runs).await
}
