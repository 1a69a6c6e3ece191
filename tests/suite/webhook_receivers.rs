//! Each sender's `webhook::Receiver` over real HTTP and real Redis nodes: the sender's
//! retry as it documents it (the same id, new attempt headers: a new timestamp and
//! signature, Shopify's new `X-Shopify-Webhook-Id`) runs the handler once; a forged, stale
//! or unsigned delivery is answered 401 before the lock, leaves nothing in Redis, and the
//! real delivery with the same id then runs.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::post;
use base64::Engine;
use hmac::{Hmac, Mac};
use http::StatusCode;
use sha2::Sha256;
use support::Cluster;
use support::http::{Seen, exchange, http1, serve};
use support::{header_lock, in_namespace, key_of};
use tower_redlock::Redlock;
use tower_redlock::layer::webhook::Receiver;

#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

async fn handle(State(runs): State<Runs>, body: Bytes) -> (StatusCode, Bytes) {
    runs.0.fetch_add(1, Ordering::SeqCst);
    (StatusCode::OK, body)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Sender {
    Standard,
    Svix,
    GitHub,
    Shopify,
    Stripe,
}

const ALL: [Sender; 5] = [
    Sender::Standard,
    Sender::Svix,
    Sender::GitHub,
    Sender::Shopify,
    Sender::Stripe,
];

/// The endpoint's secret, as each sender shows it.
fn secret(sender: Sender) -> &'static str {
    match sender {
        Sender::Standard | Sender::Svix => "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        Sender::GitHub => "a github webhook secret",
        Sender::Shopify => "shpss_a_shopify_client_secret",
        Sender::Stripe => "whsec_a_stripe_endpoint_secret",
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("key");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// How a delivery is signed.
#[derive(Clone, Copy, PartialEq)]
enum Signing {
    /// As the sender does, at this time.
    Real { at: u64 },
    /// With another secret.
    Forged,
    /// Without the signature header.
    Unsigned,
}

/// The body of event `id` for `sender` (Stripe's id is in it).
fn body(sender: Sender, id: &str) -> String {
    match sender {
        Sender::Stripe => format!(r#"{{"id":"{id}","object":"event","type":"charge.succeeded"}}"#),
        _ => format!(r#"{{"event":"{id}","action":"created"}}"#),
    }
}

/// Delivery `attempt` of event `id` by `sender`: the headers the sender sends on that
/// attempt (Standard Webhooks, Svix and Stripe sign each attempt at its own time; Shopify
/// gives each attempt its own `X-Shopify-Webhook-Id`; GitHub's redelivery is the same).
fn delivery(
    sender: Sender,
    addr: std::net::SocketAddr,
    (id, attempt): (&str, u32),
    signing: Signing,
) -> http::Request<Body> {
    let body = body(sender, id);
    let key = match signing {
        Signing::Forged => "whsec_Zm9yZ2VkIGtleQ==".to_owned(),
        _ => secret(sender).to_owned(),
    };
    let at = match signing {
        Signing::Real { at } => at,
        _ => now(),
    };
    let mut req = http::Request::post(format!("http://{addr}/hook"))
        .header("content-type", "application/json");
    let sig: Option<(String, String)>;
    match sender {
        Sender::Standard | Sender::Svix => {
            let prefix = if sender == Sender::Svix {
                "svix"
            } else {
                "webhook"
            };
            let raw = base64::engine::general_purpose::STANDARD
                .decode(key.trim_start_matches("whsec_"))
                .expect("base64 key");
            let mac = hmac(
                &raw,
                &[
                    id.as_bytes(),
                    b".",
                    at.to_string().as_bytes(),
                    b".",
                    body.as_bytes(),
                ],
            );
            req = req
                .header(format!("{prefix}-id"), id)
                .header(format!("{prefix}-timestamp"), at.to_string());
            sig = Some((format!("{prefix}-signature"), format!("v1,{}", b64(&mac))));
        }
        Sender::GitHub => {
            req = req
                .header("x-github-delivery", id)
                .header("x-github-event", "issues");
            let mac = hmac(key.as_bytes(), &[body.as_bytes()]);
            sig = Some((
                "x-hub-signature-256".to_owned(),
                format!("sha256={}", hex(&mac)),
            ));
        }
        Sender::Shopify => {
            req = req
                .header("x-shopify-event-id", id)
                .header("x-shopify-webhook-id", format!("{id}-attempt-{attempt}"))
                .header("x-shopify-triggered-at", "2026-12-06T06:00:00Z")
                .header("x-shopify-topic", "orders/create");
            let mac = hmac(key.as_bytes(), &[body.as_bytes()]);
            sig = Some(("x-shopify-hmac-sha256".to_owned(), b64(&mac)));
        }
        Sender::Stripe => {
            let mac = hmac(
                key.as_bytes(),
                &[at.to_string().as_bytes(), b".", body.as_bytes()],
            );
            sig = Some((
                "stripe-signature".to_owned(),
                format!("t={at},v1={}", hex(&mac)),
            ));
        }
    }
    if signing != Signing::Unsigned
        && let Some((name, value)) = sig
    {
        req = req.header(name, value);
    }
    req.body(Body::from(body)).expect("request")
}

/// The lock (and record) key of event `id` for `sender`'s receiver.
fn key(sender: Sender, id: &str) -> String {
    key_of(&match sender {
        Sender::Standard => header_lock("webhook-id", id),
        Sender::Svix => header_lock("svix-id", id),
        Sender::GitHub => header_lock("x-github-delivery", id),
        Sender::Shopify => header_lock("x-shopify-event-id", id),
        Sender::Stripe => in_namespace("body:/id", id),
    })
}

/// `sender`'s receiver in front of the counting handler, served.
async fn receiver(sender: Sender, redlock: &Redlock, runs: &Runs) -> std::net::SocketAddr {
    let router = Router::new()
        .route("/hook", post(handle))
        .with_state(runs.clone());
    let lock = redlock.clone();
    let s = secret(sender);
    let app = match sender {
        Sender::Standard => router.layer(Receiver::standard(lock, s).expect("secret")),
        Sender::Svix => router.layer(Receiver::svix(lock, s).expect("secret")),
        Sender::GitHub => router.layer(Receiver::github(lock, s).expect("secret")),
        Sender::Shopify => router.layer(Receiver::shopify(lock, s).expect("secret")),
        Sender::Stripe => router.layer(Receiver::stripe(lock, s).expect("secret")),
    };
    serve(app).await
}

async fn send(req: http::Request<Body>) -> Seen {
    exchange(&http1(), req).await.expect("exchange")
}

#[tokio::test]
async fn each_senders_documented_retry_runs_the_handler_once() {
    let cluster = Cluster::start(3);
    let redlock = cluster.replay_client().await;
    for sender in ALL {
        let runs = Runs::default();
        let addr = receiver(sender, &redlock, &runs).await;
        let id = format!("evt_retry_{sender:?}_{}", addr.port());
        let first = send(delivery(
            sender,
            addr,
            (&id, 1),
            Signing::Real { at: now() },
        ))
        .await;
        assert_eq!(first.status, StatusCode::OK, "{sender:?}: {}", first.text());
        for attempt in 2..=3 {
            let retry = delivery(
                sender,
                addr,
                (&id, attempt),
                Signing::Real {
                    at: now() + u64::from(attempt),
                },
            );
            let again = send(retry).await;
            assert_eq!(again.status, StatusCode::OK, "{sender:?}: {}", again.text());
            assert!(
                again.replayed(),
                "{sender:?}: attempt {attempt} not replayed"
            );
            assert_eq!(again.body, first.body, "{sender:?}");
        }
        assert_eq!(runs.0.load(Ordering::SeqCst), 1, "{sender:?}: handler runs");
        assert_eq!(
            cluster.nodes_holding(key(sender, &id)).await,
            3,
            "{sender:?}: record"
        );
    }
}

#[tokio::test]
async fn shopify_deliveries_of_one_event_with_new_webhook_ids_run_once() {
    // Keyed on X-Shopify-Webhook-Id (before), each attempt ran the handler again.
    let cluster = Cluster::start(3);
    let redlock = cluster.replay_client().await;
    let runs = Runs::default();
    let addr = receiver(Sender::Shopify, &redlock, &runs).await;
    for attempt in 1..=4 {
        let req = delivery(
            Sender::Shopify,
            addr,
            ("evt_shop_1", attempt),
            Signing::Real { at: now() },
        );
        assert_eq!(send(req).await.status, StatusCode::OK);
    }
    assert_eq!(runs.0.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_forged_stale_or_unsigned_delivery_takes_nothing_and_the_real_one_then_runs() {
    let cluster = Cluster::start(3);
    let redlock = cluster.replay_client().await;
    for sender in ALL {
        let runs = Runs::default();
        let addr = receiver(sender, &redlock, &runs).await;
        let id = format!("evt_forged_{sender:?}_{}", addr.port());
        let mut bad = vec![Signing::Forged, Signing::Unsigned];
        if matches!(sender, Sender::Standard | Sender::Svix | Sender::Stripe) {
            bad.push(Signing::Real { at: now() - 3_600 });
        }
        for signing in bad {
            let refused = send(delivery(sender, addr, (&id, 1), signing)).await;
            assert_eq!(
                refused.status,
                StatusCode::UNAUTHORIZED,
                "{sender:?}: {}",
                refused.text()
            );
            assert!(!refused.replayed(), "{sender:?}");
            assert_eq!(
                cluster.nodes_holding(key(sender, &id)).await,
                0,
                "{sender:?}: a key was left"
            );
        }
        assert_eq!(
            runs.0.load(Ordering::SeqCst),
            0,
            "{sender:?}: a forged delivery ran"
        );
        let real = send(delivery(
            sender,
            addr,
            (&id, 2),
            Signing::Real { at: now() },
        ))
        .await;
        assert_eq!(real.status, StatusCode::OK, "{sender:?}: {}", real.text());
        assert!(
            !real.replayed(),
            "{sender:?}: the real delivery got a stored answer"
        );
        assert_eq!(runs.0.load(Ordering::SeqCst), 1, "{sender:?}");
    }
}

#[tokio::test]
async fn a_delivery_over_the_signature_limit_is_413_before_the_lock() {
    let cluster = Cluster::start(3);
    let redlock = cluster.replay_client().await;
    let runs = Runs::default();
    let app = Router::new()
        .route("/hook", post(handle))
        .with_state(runs.clone())
        .layer(
            Receiver::github(redlock, secret(Sender::GitHub))
                .expect("secret")
                .map_signature(|s| s.max_body(16)),
        );
    let addr = serve(app).await;
    let res = send(delivery(
        Sender::GitHub,
        addr,
        ("evt_large", 1),
        Signing::Real { at: now() },
    ))
    .await;
    assert_eq!(res.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", res.text());
    assert_eq!(runs.0.load(Ordering::SeqCst), 0);
    assert_eq!(
        cluster
            .nodes_holding(key(Sender::GitHub, "evt_large"))
            .await,
        0
    );
}
