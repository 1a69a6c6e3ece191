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
use common::webhook::{Runs, Sender, endpoint, play, serve};
use tower_redlock::Redlock;
use tower_redlock::layer::webhook::Receiver;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (urls, local) = common::nodes_or_local(3)?;
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .restart_quarantine(common::restart_quarantine(&local))
        .build()?;
    let secret = std::env::var("WEBHOOK_SECRET")
        .unwrap_or_else(|_| "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned());
    let runs = Runs::default();
    // The one expression: signature, then the lock by delivery id, with replay.
    let app = endpoint(&runs).route_layer(Receiver::standard(redlock, &secret)?);
    let addr = serve(app).await?;
    play(Sender::Standard, addr, &secret, &runs).await
}
