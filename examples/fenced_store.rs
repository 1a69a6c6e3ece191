//! Fencing numbers stop a stale lock holder's write at the store.
//!
//! An axum service credits accounts (`POST /accounts/{id}/credit`). A [`RedlockLayer`]
//! locks `account:{id}` around each request; the handler reads the balance, adds to it
//! and writes it back through a fenced store that refuses numbers lower than the highest
//! it has seen (`common/fenced.rs`; a Redis hash here, a `WHERE fence <= $n` in SQL).
//!
//! The layer has no namespace (`.namespace("")`), so its lock names are the names a job
//! outside the layer locks with `Redlock::lock`. The example then plays the classic
//! failure: a worker A takes the same lock directly, reads the balance, and is paused
//! (think GC or VM migration) until its lock has expired. Meanwhile a request credits the
//! account under a new lock. When A wakes up and writes its stale balance, the store
//! refuses it, because A's fencing number is lower than the request's. Without fencing A
//! would have silently overwritten the credit.
//!
//! ```text
//! cargo run --features axum --example fenced_store
//! ```
//!
//! Uses the nodes in `REDLOCK_NODES` (comma-separated `redis://` URLs) or starts 3 local
//! `redis-server` processes; the store lives on the first node, standing in for your
//! database. Exits non-zero if the stale write was accepted.

mod common;

use common::Error;
use common::fenced::{FencedStore, Write};

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_redlock::layer::{RequestHead, WaitPolicy, extract_fn};
use tower_redlock::{LockToken, Redlock, RedlockLayer};

/// The lock of account `id`.
fn lock_name(id: &str) -> String {
    format!("account:{id}")
}

/// The store record of account `id`.
fn record(id: &str) -> String {
    format!("example:balance:{id}")
}

/// Credits 100 to the account, under its lock, writing with the lock's fencing number.
async fn credit(
    State(store): State<FencedStore>,
    Path(id): Path<String>,
    token: LockToken,
) -> (StatusCode, String) {
    let Some(fence) = token.fencing_token() else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "fencing is off\n".into());
    };
    let balance = match store.read(&record(&id)).await {
        Ok(found) => found.map_or(0, |(_, v)| v.parse::<i64>().unwrap_or(0)),
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}\n")),
    };
    match store
        .write(&record(&id), fence, &(balance + 100).to_string())
        .await
    {
        Ok(Write::Accepted) => (
            StatusCode::OK,
            format!(
                "balance {} (written with fencing number {fence})\n",
                balance + 100
            ),
        ),
        Ok(Write::Stale { highest }) => (
            StatusCode::CONFLICT,
            format!("refused: fencing number {fence} < {highest}\n"),
        ),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}\n")),
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (urls, local) = common::nodes_or_local(3)?;
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .restart_quarantine(common::restart_quarantine(&local))
        .key_prefix("example:lock:")
        .ttl(Duration::from_millis(500))
        .build()?;
    common::print_nodes(&redlock, &urls);
    let store = FencedStore::connect(&urls[0]).await?;
    let id = "42";
    store.write(&record(id), 0, "1000").await?;

    let layer = RedlockLayer::new(
        redlock.clone(),
        extract_fn(|head: &RequestHead<'_>| {
            let id = head.uri.path().split('/').nth(2).unwrap_or_default();
            Ok((!id.is_empty()).then(|| lock_name(id).into_bytes()))
        }),
    )
    .wait(WaitPolicy::up_to(Duration::from_secs(2)).max_waiters(16))
    // No namespace: the layer locks `account:{id}` as it is, the name worker A locks
    // directly below (by default it would lock `fn account:{id}`, in its extractor's).
    .namespace("");
    let router = Router::new()
        .route("/accounts/{id}/credit", post(credit))
        .route_layer(layer)
        .with_state(store.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            eprintln!("server error: {e}");
        }
    });

    // Worker A takes the lock, reads the balance, and is paused past its validity.
    let a = redlock.lock(lock_name(id)).await?;
    let a_fence = a.fencing_token().ok_or("fencing is on by default")?;
    let a_balance: i64 = store
        .read(&record(id))
        .await?
        .map_or(0, |(_, v)| v.parse().unwrap_or(0));
    println!("A holds account:{id} with fencing number {a_fence}, reads balance {a_balance}");
    println!(
        "A is paused for 800 ms (its lock is valid for {:?})",
        a.remaining()
    );
    tokio::time::sleep(Duration::from_millis(800)).await;

    // Meanwhile the lock expired and a request credited the account under a new lock.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req =
        hyper::Request::post(format!("http://{addr}/accounts/{id}/credit")).body(Full::default())?;
    let res = client.request(req).await?;
    let status = res.status();
    let body = res.into_body().collect().await?.to_bytes();
    print!("request: {status}, {}", String::from_utf8_lossy(&body));

    // A wakes up, does not notice it lost the lock, and writes what it computed.
    let stale = store
        .write(&record(id), a_fence, &(a_balance + 5).to_string())
        .await?;
    let (_, balance) = store.read(&record(id)).await?.ok_or("the record is gone")?;
    match stale {
        Write::Stale { highest } => println!(
            "A writes balance {} with number {a_fence}: refused, the store has seen {highest}; \
             the balance stays {balance}",
            a_balance + 5
        ),
        Write::Accepted => {
            println!("A's stale write was accepted: the credit is lost (balance {balance})");
            return Err("the stale write was accepted".into());
        }
    }
    let _ = redlock.unlock(&a).await; // a no-op: A's keys expired or were replaced

    drop(local); // stops the local redis-server nodes, if any
    Ok(())
}
