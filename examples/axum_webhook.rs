//! A webhook receiver that processes each delivery exactly once, even when the sender
//! retries or redelivers while the first attempt is still running, and even across
//! several instances of the receiver sharing the same Redis nodes.
//!
//! `POST /webhook` is locked on its `X-GitHub-Delivery` header (required: a request
//! without it is answered 400) by `RedlockLayer` under `route_layer`. The handler checks
//! whether the delivery was already processed, does slow work (`WORK_MS`, default 200 ms)
//! and records it; the lock makes that check-then-act atomic, so a duplicate that arrives
//! meanwhile gets 409 (with `Retry-After`). The layer's replay is on: a redelivery that
//! arrives after the first finished gets the first response back (marked
//! `idempotent-replayed: true`) without running the handler, for an hour. `GET /stats`
//! lists how often each delivery was processed, one `id count` line per delivery: every
//! count must be 1. `GET /ready` is a readiness probe: 200 while a quorum of nodes is
//! usable, 503 otherwise, with each node's state.
//!
//! Rejections are logged through the `on_rejection` hook: when a quorum of nodes is down
//! the 503's message names every failed node and its cause.
//!
//! ```text
//! cargo run --features axum --example axum_webhook
//! # another shell:
//! curl -i -X POST -H 'X-GitHub-Delivery: 72d3162e' http://127.0.0.1:3000/webhook
//! curl http://127.0.0.1:3000/stats
//! ```
//!
//! Environment: `REDLOCK_NODES` (comma-separated `redis://` URLs; default: start 5 local
//! `redis-server` processes), `LISTEN_ADDR` (default `127.0.0.1:3000`), `WORK_MS`
//! (default 200), `RUST_LOG` (default `info`). `scripts/demo` drives this server with
//! `examples/webhook_demo_client.rs` and kills nodes under it.

mod common;

use common::Error;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use tower_redlock::layer::{Header, Rejection, RejectionKind};
use tower_redlock::{LockToken, Redlock, RedlockLayer};
use tracing_subscriber::EnvFilter;

#[derive(Clone)]
struct App {
    /// Delivery id -> how many times its work ran.
    processed: Arc<Mutex<BTreeMap<String, u64>>>,
    work: Duration,
}

impl App {
    fn count(&self, id: &str) -> u64 {
        let map = self.processed.lock().unwrap_or_else(|e| e.into_inner());
        map.get(id).copied().unwrap_or(0)
    }

    fn record(&self, id: &str) {
        let mut map = self.processed.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry(id.to_owned()).or_default() += 1;
    }
}

/// The header that carries the delivery id.
const DELIVERY: &str = "x-github-delivery";

/// The delivery id of a request (the layer refuses requests without one).
fn delivery_id(headers: &HeaderMap) -> String {
    headers
        .get(DELIVERY)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// Runs with the delivery's lock held: no other request for the same delivery id runs
/// at the same time, on this instance or any other using the same nodes. (The token's
/// name is the lock's: the layer's namespace and the id, `header:x-github-delivery {id}`.)
async fn webhook(
    State(app): State<App>,
    headers: HeaderMap,
    token: LockToken,
) -> (StatusCode, String) {
    let id = delivery_id(&headers);
    if app.count(&id) > 0 {
        return (StatusCode::OK, format!("already processed {id}\n"));
    }
    tokio::time::sleep(app.work).await; // the slow part: call APIs, write to a database...
    if !token.is_held() {
        // The lock was lost during the work (it could not be extended, or expired): another
        // request may be processing this delivery now, so do not commit.
        tracing::warn!(%id, reason = ?token.lost_reason(), "lock lost before the work finished; not recording");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "lost the lock, retry\n".into(),
        );
    }
    app.record(&id);
    tracing::debug!(%id, "processed");
    (StatusCode::OK, format!("processed {id}\n"))
}

/// Readiness: 200 while a quorum of nodes is usable now, 503 otherwise; one line per node.
async fn ready(State(redlock): State<Redlock>) -> (StatusCode, String) {
    let health = redlock.health().await;
    let mut text = format!(
        "{} of {} nodes usable, {} needed\n",
        health.usable(),
        health.nodes().len(),
        health.quorum()
    );
    for node in health.nodes() {
        text.push_str(&format!(
            "{} {:?} rtt={:?}\n",
            node.node(),
            node.status(),
            node.round_trip()
        ));
    }
    let status = if health.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, text)
}

/// One `id count` line per delivery.
async fn stats(State(app): State<App>) -> String {
    let map = app.processed.lock().unwrap_or_else(|e| e.into_inner());
    map.iter().map(|(id, n)| format!("{id} {n}\n")).collect()
}

/// Logs every rejection with its message, then answers with the default response.
fn log_rejection(rejection: Rejection, head: &http::request::Parts) -> Rejection {
    let status = rejection.http_status().as_u16();
    let delivery = delivery_id(&head.headers);
    // The client gets a short message; the log gets the details (each failed node's cause).
    let detail = rejection
        .lock_error()
        .map_or_else(|| rejection.message().to_owned(), ToString::to_string);
    match rejection.kind() {
        // Duplicates arriving while the first delivery runs are expected: not a warning.
        RejectionKind::Busy { .. } => {
            tracing::info!(status, %delivery, "duplicate delivery rejected: {detail}");
        }
        _ => {
            tracing::warn!(status, %delivery, path = head.uri.path(), "request rejected: {detail}")
        }
    }
    // The default answer: text, or problem+json for clients that accept it.
    rejection
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .with_ansi(std::io::stdout().is_terminal())
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();

    let (urls, local) = common::nodes_or_local(5)?;
    if !local.is_empty() {
        tracing::info!("started {} local redis-server nodes", local.len());
    }
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .restart_quarantine(common::restart_quarantine(&local))
        .key_prefix("webhook:")
        // Delivery ids are not secret: show them in the crate's spans and logs.
        .log_lock_names(true)
        .build()?;
    tracing::info!(
        nodes = redlock.node_count(),
        quorum = redlock.quorum(),
        "redlock client ready: {}",
        urls.join(",")
    );

    let work_ms: u64 = match std::env::var("WORK_MS") {
        Ok(v) => v.parse().map_err(|e| format!("WORK_MS={v:?}: {e}"))?,
        Err(_) => 200,
    };
    let app = App {
        processed: Arc::default(),
        work: Duration::from_millis(work_ms),
    };

    let probe = Router::new()
        .route("/ready", get(ready))
        .with_state(redlock.clone());
    let layer = RedlockLayer::new(redlock, Header::new(DELIVERY).required())
        .ttl(Duration::from_secs(30))
        // Delivery ids are unique: there is no later holder to fence, so no counter per id.
        .fencing(false)
        // A redelivery after the first finished gets the stored response back.
        .replay(Duration::from_secs(3600))
        .on_rejection(log_rejection);
    let router = Router::new()
        .route("/webhook", post(webhook))
        .route_layer(layer)
        .route("/stats", get(stats))
        .with_state(app)
        .merge(probe);

    let addr = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    println!("listening on http://{bound} (POST /webhook, GET /stats, GET /ready)");
    tracing::info!(%bound, work_ms, "webhook receiver listening");

    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    tracing::info!("shut down");
    drop(local); // kills the local nodes, if any
    Ok(())
}

/// Ctrl-C or SIGTERM: stop accepting, finish what runs, then drop the local nodes.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
