//! Shared by the webhook receiver examples: a sender played against a receiver, as the
//! sender signs (HMAC-SHA256 through `hmac`), and what the receiver answered.
//!
//! [`play`] sends a forged delivery (401, nothing locked), the real one (the handler
//! runs), the sender's retry of it with new attempt headers (the stored answer, replayed),
//! and prints each answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use base64::Engine;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sha2::Sha256;

use super::Error;

/// A webhook sender, as it signs and names its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    Standard,
    Svix,
    GitHub,
    Shopify,
    Stripe,
}

/// How many times the handler ran.
#[derive(Clone, Default)]
pub struct Runs(Arc<AtomicUsize>);

impl Runs {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// The handler: counts its runs and answers with what it processed.
async fn handle(State(runs): State<Runs>, body: Bytes) -> String {
    let n = runs.0.fetch_add(1, Ordering::SeqCst) + 1;
    format!("processed {} bytes (run {n})", body.len())
}

/// The router of one webhook endpoint, `/hook`, before its receiver layer.
pub fn endpoint(runs: &Runs) -> Router<()> {
    Router::new()
        .route("/hook", post(handle))
        .with_state(runs.clone())
}

/// A client over the nodes in `REDLOCK_NODES` (or 3 local ones, killed when the returned
/// guard drops), and the endpoint's secret from the environment variable `var` (or
/// `demo`).
pub fn setup(
    var: &str,
    demo: &str,
) -> Result<(tower_redlock::Redlock, super::LocalNodes, String), Error> {
    let (urls, local) = super::nodes_or_local(3)?;
    let redlock = tower_redlock::Redlock::builder(urls.iter().map(String::as_str))
        .restart_quarantine(super::restart_quarantine(&local))
        .build()?;
    let secret = std::env::var(var).unwrap_or_else(|_| demo.to_owned());
    Ok((redlock, local, secret))
}

/// Serves `app` on a free loopback port.
pub async fn serve(app: Router) -> Result<SocketAddr, Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

fn mac(key: &[u8], parts: &[&[u8]]) -> Result<Vec<u8>, Error> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key)?;
    for part in parts {
        mac.update(part);
    }
    Ok(mac.finalize().into_bytes().to_vec())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Delivery `attempt` of event `id`, signed with `secret` as `sender` signs: its headers
/// and body.
fn delivery(
    sender: Sender,
    secret: &str,
    (id, attempt): (&str, u32),
) -> Result<(Vec<(String, String)>, String), Error> {
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)?
        .as_secs()
        .to_string();
    let body = match sender {
        Sender::Stripe => format!(r#"{{"id":"{id}","type":"charge.succeeded"}}"#),
        _ => format!(r#"{{"event":"{id}","action":"created"}}"#),
    };
    let h = |k: &str, v: String| (k.to_owned(), v);
    let headers = match sender {
        Sender::Standard | Sender::Svix => {
            let p = if sender == Sender::Svix {
                "svix"
            } else {
                "webhook"
            };
            let key = base64::engine::general_purpose::STANDARD
                .decode(secret.trim_start_matches("whsec_"))?;
            let sig = mac(
                &key,
                &[id.as_bytes(), b".", at.as_bytes(), b".", body.as_bytes()],
            )?;
            vec![
                h(&format!("{p}-id"), id.to_owned()),
                h(&format!("{p}-timestamp"), at),
                h(&format!("{p}-signature"), format!("v1,{}", b64(&sig))),
            ]
        }
        Sender::GitHub => vec![
            h("x-github-delivery", id.to_owned()),
            h("x-github-event", "issues".to_owned()),
            h(
                "x-hub-signature-256",
                format!(
                    "sha256={}",
                    hex(&mac(secret.as_bytes(), &[body.as_bytes()])?)
                ),
            ),
        ],
        Sender::Shopify => vec![
            h("x-shopify-event-id", id.to_owned()),
            // A new one on every attempt: not the id to lock by.
            h("x-shopify-webhook-id", format!("{id}-attempt-{attempt}")),
            h(
                "x-shopify-hmac-sha256",
                b64(&mac(secret.as_bytes(), &[body.as_bytes()])?),
            ),
        ],
        Sender::Stripe => {
            let sig = mac(secret.as_bytes(), &[at.as_bytes(), b".", body.as_bytes()])?;
            vec![h("stripe-signature", format!("t={at},v1={}", hex(&sig)))]
        }
    };
    Ok((headers, body))
}

/// Sends one delivery to `addr`: the answer's status, whether it was replayed, its body.
async fn send(
    addr: SocketAddr,
    (headers, body): (Vec<(String, String)>, String),
) -> Result<String, Error> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = http::Request::post(format!("http://{addr}/hook"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let res = client
        .request(req.body(Full::new(Bytes::from(body)))?)
        .await?;
    let status = res.status();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let text = res.into_body().collect().await?.to_bytes();
    Ok(format!(
        "{status}{} {}",
        if replayed { " (replayed)" } else { "" },
        String::from_utf8_lossy(&text).trim()
    ))
}

/// Plays `sender` against the receiver at `addr` (whose secret is `secret`): a forged
/// delivery, the real one, the sender's retry; prints each answer and how often the
/// handler ran (once).
pub async fn play(
    sender: Sender,
    addr: SocketAddr,
    secret: &str,
    runs: &Runs,
) -> Result<(), Error> {
    let id = format!("evt_{}", addr.port());
    let forged_secret = match sender {
        Sender::Standard | Sender::Svix => "whsec_Zm9yZ2Vk",
        _ => "not the secret",
    };
    println!("{sender:?} receiver on http://{addr}/hook, delivery id {id}");
    println!(
        "  forged:  {}",
        send(addr, delivery(sender, forged_secret, (&id, 1))?).await?
    );
    println!(
        "  real:    {}",
        send(addr, delivery(sender, secret, (&id, 1))?).await?
    );
    println!(
        "  retried: {}",
        send(addr, delivery(sender, secret, (&id, 2))?).await?
    );
    println!("  the handler ran {} time(s)", runs.count());
    if runs.count() != 1 {
        return Err(format!("the handler ran {} times, not once", runs.count()).into());
    }
    Ok(())
}
