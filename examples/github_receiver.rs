//! A GitHub webhook receiver in one expression, `Receiver::github(redlock, secret)`.
//! GitHub: the `X-GitHub-Delivery` id (kept on redelivery), `X-Hub-Signature-256` checked first, replay for 4 days (GitHub redelivers deliveries of the past 3 days, by hand or API).
//!
//! The example plays the sender against itself: a forged delivery (401, no lock taken),
//! the real one (the handler runs), and the sender's retry of it (the stored answer,
//! `idempotent-replayed`); the handler runs once.
//!
//! ```text
//! cargo run --features axum,webhook-verify --example github_receiver
//! ```
//!
//! Environment: `REDLOCK_NODES` (comma-separated `redis://` URLs; default: start 3 local
//! `redis-server` processes), `GITHUB_WEBHOOK_SECRET` (default: a demo secret).

mod common;

use common::Error;
use common::webhook::{Runs, Sender, endpoint, play, serve, setup};
use tower_redlock::layer::webhook::Receiver;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (redlock, _nodes, secret) = setup("GITHUB_WEBHOOK_SECRET", "a github webhook secret")?;
    let runs = Runs::default();
    // The one expression: signature, then the lock by delivery id, with replay.
    let app = endpoint(&runs).route_layer(Receiver::github(redlock, &secret)?);
    play(Sender::GitHub, serve(app).await?, &secret, &runs).await
}
