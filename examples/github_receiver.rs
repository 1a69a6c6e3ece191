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
use common::webhook::{Runs, Sender, endpoint, play, serve};
use tower_redlock::Redlock;
use tower_redlock::layer::webhook::Receiver;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (urls, local) = common::nodes_or_local(3)?;
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .restart_quarantine(common::restart_quarantine(&local))
        .build()?;
    let secret = std::env::var("GITHUB_WEBHOOK_SECRET")
        .unwrap_or_else(|_| "a github webhook secret".to_owned());
    let runs = Runs::default();
    // The one expression: signature, then the lock by delivery id, with replay.
    let app = endpoint(&runs).route_layer(Receiver::github(redlock, &secret)?);
    let addr = serve(app).await?;
    play(Sender::GitHub, addr, &secret, &runs).await
}
