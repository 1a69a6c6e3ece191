//! `Idempotency-Key` for a payments API with axum: requests carrying the same key run
//! one after another, never at the same time, and every one after the first replays the
//! stored response instead of charging again.
//!
//! The layer locks the `Idempotency-Key` header's value and, with
//! `.wait(WaitPolicy::up_to(Duration::from_secs(5)).max_waiters(32))`, lets a request whose key is busy wait up to 5 s
//! for it (at most 32 such requests wait at once; beyond that they get 409). With
//! `.replay(..)`, the layer records the first response as it goes out (on the Redis nodes,
//! for 24 h, stored before its last byte and before the lock is released), and answers
//! every later request with that key from the record, marked `idempotent-replayed: true`,
//! without running the handler.
//!
//! The request body counts in the request's fingerprint: the same key sent with a
//! different body gets 422 instead of another request's payment.
//!
//! The example starts the server, fires 5 concurrent requests with one key and 5 with
//! distinct keys, prints when each completed, then reuses a key with another amount, and
//! exits. The shared key's requests complete one after another, the distinct keys' in
//! parallel.
//!
//! ```text
//! cargo run --features axum --example idempotency
//! ```
//!
//! Uses the nodes in `REDLOCK_NODES` (comma-separated `redis://` URLs) or starts 3 local
//! `redis-server` processes for the run.

mod common;

use common::Error;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_redlock::layer::{Header, ReplayPolicy, WaitPolicy};
use tower_redlock::{LockToken, Redlock, RedlockLayer};

/// How long creating a payment takes (calling the card processor, say).
const WORK: Duration = Duration::from_millis(300);

#[derive(Clone)]
struct App {
    /// Time zero of the printed timeline.
    epoch: Instant,
    next_payment: Arc<AtomicU64>,
}

/// Runs with the key's lock held, once per key: later requests get the stored response.
async fn create_payment(
    State(app): State<App>,
    token: LockToken,
) -> (StatusCode, HeaderMap, String) {
    let from = app.epoch.elapsed().as_millis();
    let mut headers = HeaderMap::new();
    let held = |headers: &mut HeaderMap| {
        let until = app.epoch.elapsed().as_millis();
        if let Ok(v) = HeaderValue::from_str(&format!("{from}-{until}")) {
            headers.insert("x-lock-held-ms", v);
        }
    };
    tokio::time::sleep(WORK).await;
    if !token.is_held() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            headers,
            "lost the lock; retry with the same key".into(),
        );
    }
    let id = app.next_payment.fetch_add(1, Ordering::SeqCst) + 1;
    let body = format!("payment pay_{id:04}");
    held(&mut headers);
    (StatusCode::CREATED, headers, body)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (urls, local) = common::nodes_or_local(3)?;
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .restart_quarantine(common::restart_quarantine(&local))
        .key_prefix("idempotency:")
        // Waiting requests poll the lock every 10-30 ms.
        .retry_delay(Duration::from_millis(10), Duration::from_millis(20))
        .build()?;
    common::print_nodes(&redlock, &urls);

    let started = Instant::now();
    let layer = RedlockLayer::new(redlock, Header::new("idempotency-key").required())
        .ttl(Duration::from_secs(10))
        // Idempotency keys are unique per request: no fencing counter per key.
        .fencing(false)
        .wait(WaitPolicy::up_to(Duration::from_secs(5)).max_waiters(32))
        // Keep each key's first response for a day and replay it to every retry.
        .replay_policy(
            ReplayPolicy::new(Duration::from_secs(24 * 60 * 60))
                .headers([CONTENT_TYPE, HeaderName::from_static("x-lock-held-ms")]),
        );
    let router = Router::new()
        .route("/payments", post(create_payment))
        .route_layer(layer)
        .with_state(App {
            epoch: started,
            next_payment: Arc::default(),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("serving on http://{addr}; each new payment takes {WORK:?}");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            eprintln!("server error: {e}");
        }
    });

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let uri: hyper::Uri = format!("http://{addr}/payments").parse()?;
    let keys = std::iter::repeat_n("order-1001".to_owned(), 5)
        .chain((1..=5).map(|i| format!("order-2{i:03}")));
    let tasks: Vec<_> = keys
        .map(|key| {
            let client = client.clone();
            let uri = uri.clone();
            tokio::spawn(async move {
                // The IETF draft's form, a structured-field string: "order-1001".
                let req = hyper::Request::post(uri)
                    .header("idempotency-key", format!("\"{key}\""))
                    .body(Full::from("{\"amount_cents\":1999}"))?;
                let res = client.request(req).await?;
                let status = res.status();
                let replayed = res.headers().contains_key("idempotent-replayed");
                let held = res
                    .headers()
                    .get("x-lock-held-ms")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                let body = res.into_body().collect().await?.to_bytes();
                Ok::<_, Error>((
                    started.elapsed(),
                    key,
                    status,
                    String::from_utf8_lossy(&body).trim().to_owned(),
                    replayed,
                    held,
                ))
            })
        })
        .collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await??);
    }
    results.sort_by_key(|r| r.0);

    println!("\n10 concurrent requests, in order of completion:");
    println!("  done at     key         status       response          lock held (ms)");
    for (at, key, status, body, replayed, held) in &results {
        let how = if *replayed { "replayed" } else { "executed" };
        println!(
            "  {:>5} ms  {key}  {status}  {body:<16}  {held:>9}  {how}",
            at.as_millis()
        );
    }
    let executed = results.iter().filter(|r| !r.4).count();
    println!(
        "\n{executed} payments created for 6 distinct keys; order-1001's first request ran \
         the handler, the 4 others waited and got its stored response"
    );

    let reused = hyper::Request::post(uri)
        .header("idempotency-key", "order-1001") // unquoted: the same key
        .body(Full::from("{\"amount_cents\":99999}"))?;
    let res = client.request(reused).await?;
    let status = res.status();
    let body = res.into_body().collect().await?.to_bytes();
    println!(
        "order-1001 again with another amount: {status} {}",
        String::from_utf8_lossy(&body).trim()
    );

    drop(local); // stops the local redis-server nodes, if any
    Ok(())
}
