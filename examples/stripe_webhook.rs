//! A Stripe-style webhook receiver: the event id is only in the JSON body (`{"id":
//! "evt_...", ...}`), so the lock name comes from the body. Each event runs its handler
//! once, whatever the sender retries: deliveries that arrive while the first runs wait
//! for it and get its response, and redeliveries afterwards get the stored response
//! (`idempotent-replayed: true`) for three days, Stripe's retry window. The handler gets
//! the body exactly as sent. A real receiver checks Stripe's signature before the lock:
//! `Receiver::stripe` (feature `webhook-verify`, the `stripe_receiver` example) does both.
//!
//! A body over 64 KiB is answered 413, a body without an `id` (or not JSON) 400.
//!
//! ```text
//! cargo run --features axum --example stripe_webhook
//! # another shell:
//! curl -i -X POST -H 'content-type: application/json' \
//!      -d '{"id":"evt_1","type":"payment_intent.succeeded"}' http://127.0.0.1:3000/stripe
//! curl http://127.0.0.1:3000/events
//! ```
//!
//! Environment: `REDLOCK_NODES` (comma-separated `redis://` URLs; default: start 3 local
//! `redis-server` processes), `LISTEN_ADDR` (default `127.0.0.1:3000`).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::{get, post};
use common::Error;
use tower_redlock::layer::{WaitPolicy, webhook};
use tower_redlock::{Redlock, RedlockLayer};

/// How often each event ran: every count must be 1.
type Events = Arc<Mutex<BTreeMap<String, u32>>>;

/// The handler: runs once per event id (the layer holds the event's lock around it).
async fn stripe(State(events): State<Events>, body: Bytes) -> String {
    let id = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|event| event.get("id")?.as_str().map(str::to_owned))
        .unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(100)).await; // the work
    let mut events = events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *events.entry(id.clone()).or_default() += 1;
    format!("processed {id} ({} bytes)\n", body.len())
}

async fn list(State(events): State<Events>) -> String {
    let events = events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    events.iter().map(|(id, n)| format!("{id} {n}\n")).collect()
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (urls, local) = common::nodes_or_local(3)?;
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .restart_quarantine(common::restart_quarantine(&local))
        .key_prefix("stripe:")
        .build()?;
    let events = Events::default();
    let app = Router::new()
        .route("/stripe", post(stripe))
        // The one line: the event id from the body, one run per event.
        .route_layer(
            RedlockLayer::from_body(redlock, webhook::stripe())
                .fencing(false) // unique event ids: nothing to fence
                .wait(WaitPolicy::up_to(Duration::from_secs(10)))
                .replay(Duration::from_secs(3 * 24 * 3600)),
        )
        .route("/events", get(list))
        .with_state(events);
    let addr = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "listening on http://{} (POST /stripe, GET /events)",
        listener.local_addr()?
    );
    axum::serve(listener, app).await?;
    Ok(())
}
