//! Webhook receivers whose delivery id is in the body (Stripe-style), over real HTTP/1 and
//! HTTP/2 connections and real Redis nodes: one run per event, redeliveries replayed, the
//! handler given exactly the bytes sent, and the edges (too large, no id, not JSON, empty,
//! chunked).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::post;
use futures_util::stream;
use http::StatusCode;
use support::Cluster;
use support::http::{HttpClient, Seen, exchange, http1, http2, serve};
use tower_redlock::layer::{BodyKey, Header, PerRoute, WaitPolicy, webhook};
use tower_redlock::{LockToken, RedlockLayer};

const EVENT: &str = r#"{"id":"evt_1NG8Du2eZvKYlo2C","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_3","amount":2000}}}"#;

#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

/// Counts its runs and answers with the body it got, which it must find whole; it holds
/// the lock while it runs.
async fn receive(State(runs): State<Runs>, token: LockToken, body: Bytes) -> (StatusCode, Bytes) {
    runs.0.fetch_add(1, Ordering::SeqCst);
    assert!(token.is_held());
    tokio::time::sleep(Duration::from_millis(50)).await;
    (StatusCode::OK, body)
}

fn app<L>(layer: L, runs: &Runs) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<http::Request<Body>> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<http::Request<Body>>>::Response:
        axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<http::Request<Body>>>::Error:
        Into<std::convert::Infallible> + 'static,
    <L::Service as tower::Service<http::Request<Body>>>::Future: Send + 'static,
{
    Router::new()
        .route("/stripe", post(receive))
        .route("/other", post(receive))
        .with_state(runs.clone())
        .layer(layer)
}

fn delivery(addr: std::net::SocketAddr, path: &str, body: Body) -> http::Request<Body> {
    http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .expect("request")
}

async fn deliver(client: &HttpClient, addr: std::net::SocketAddr, body: &'static str) -> Seen {
    exchange(client, delivery(addr, "/stripe", Body::from(body)))
        .await
        .expect("exchange")
}

#[tokio::test]
async fn ten_concurrent_deliveries_of_one_event_run_once_with_the_body_intact() {
    let cluster = Cluster::start(3);
    let redlock = cluster.replay_client().await;
    for client in [http1(), http2()] {
        let runs = Runs::default();
        let layer = RedlockLayer::from_body(redlock.clone(), webhook::stripe())
            .wait(WaitPolicy::up_to(Duration::from_secs(10)))
            .replay(Duration::from_secs(60));
        let addr = serve(app(layer, &runs)).await;
        let event = Box::leak(
            EVENT
                .replace("evt_1", &format!("evt_{}", addr.port()))
                .into_boxed_str(),
        );
        let answers =
            futures_util::future::join_all((0..10).map(|_| deliver(&client, addr, event))).await;
        assert_eq!(
            runs.0.load(Ordering::SeqCst),
            1,
            "one run for ten deliveries"
        );
        for answer in &answers {
            assert_eq!(answer.status, StatusCode::OK);
            assert_eq!(
                answer.body,
                event.as_bytes(),
                "the handler got the bytes sent"
            );
        }
        assert_eq!(answers.iter().filter(|a| a.replayed()).count(), 9);
        // A redelivery after the run is replayed.
        let again = deliver(&client, addr, event).await;
        assert!(again.replayed() && again.body == event.as_bytes());
        assert_eq!(runs.0.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn bodies_that_name_no_lock_are_refused_and_never_run() {
    let cluster = Cluster::start(3);
    let redlock = cluster.replay_client().await;
    let runs = Runs::default();
    let key = BodyKey::json("data.object.id").limit(256);
    let addr = serve(app(RedlockLayer::from_body(redlock, key), &runs)).await;
    for client in [http1(), http2()] {
        let too_large = format!(
            r#"{{"data":{{"object":{{"id":"pi_3"}}}},"pad":"{}"}}"#,
            "x".repeat(300)
        );
        let too_large: &'static str = Box::leak(too_large.into_boxed_str());
        for (body, status, says) in [
            (
                too_large,
                StatusCode::PAYLOAD_TOO_LARGE,
                "over the 256 bytes",
            ),
            (
                r#"{"data":{}}"#,
                StatusCode::BAD_REQUEST,
                "no `/data/object/id` field",
            ),
            ("id=evt_1", StatusCode::BAD_REQUEST, "not JSON"),
            ("", StatusCode::BAD_REQUEST, "not JSON"),
            (
                r#"{"data":{"object":{"id":{}}}}"#,
                StatusCode::BAD_REQUEST,
                "not a non-empty string",
            ),
        ] {
            let seen = deliver(&client, addr, body).await;
            assert_eq!(seen.status, status, "{body:.40}");
            assert!(seen.text().contains(says), "{}", seen.text());
        }
    }
    assert_eq!(runs.0.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_chunked_body_is_read_across_its_frames_and_handed_on_whole() {
    let cluster = Cluster::start(3);
    let redlock = cluster.replay_client().await;
    let runs = Runs::default();
    let layer = RedlockLayer::from_body(redlock, webhook::stripe().limit(4096));
    let addr = serve(app(layer, &runs)).await;
    for client in [http1(), http2()] {
        // Frames split mid-token, and a tail past what is read for the key.
        let tail = "y".repeat(8192);
        let whole = format!(r#"{{"id":"evt_chunked","pad":"{tail}"}}"#);
        let chunks: Vec<Result<Bytes, std::io::Error>> = whole
            .as_bytes()
            .chunks(7)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let req = delivery(addr, "/stripe", Body::from_stream(stream::iter(chunks)));
        let seen = exchange(&client, req).await.expect("exchange");
        // 8 KiB of padding is over the 4 KiB read for the key.
        assert_eq!(seen.status, StatusCode::PAYLOAD_TOO_LARGE);
        let small = r#"{"id":"evt_chunked","pad":"yy"}"#;
        let chunks: Vec<Result<Bytes, std::io::Error>> = small
            .as_bytes()
            .chunks(3)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let req = delivery(addr, "/stripe", Body::from_stream(stream::iter(chunks)));
        let seen = exchange(&client, req).await.expect("exchange");
        assert_eq!(
            (seen.status, seen.body.as_ref()),
            (StatusCode::OK, small.as_bytes())
        );
    }
}

#[tokio::test]
async fn routes_scope_the_ids_they_share_and_a_head_layer_says_it_cannot_read_bodies() {
    let cluster = Cluster::start(3);
    let redlock = cluster.replay_client().await;
    let runs = Runs::default();
    let layer = RedlockLayer::from_body(redlock.clone(), PerRoute::new(webhook::stripe()))
        .replay(Duration::from_secs(60));
    let addr = serve(app(layer, &runs)).await;
    let client = http1();
    for path in ["/stripe", "/other"] {
        let seen = exchange(&client, delivery(addr, path, Body::from(EVENT)))
            .await
            .expect("exchange");
        assert_eq!(seen.status, StatusCode::OK);
        assert!(!seen.replayed(), "{path}: its own run");
    }
    assert_eq!(runs.0.load(Ordering::SeqCst), 2);
    // A body key in a layer that does not read bodies: 500, never a run without a lock.
    let wrong = RedlockLayer::new(redlock, webhook::stripe());
    let addr = serve(app(wrong, &runs)).await;
    let seen = deliver(&client, addr, EVENT).await;
    assert_eq!(seen.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.0.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn header_senders_are_one_line_each() {
    let cluster = Cluster::start(3);
    let redlock = cluster.replay_client().await;
    for (extractor, header) in [
        (webhook::github(), "x-github-delivery"),
        (webhook::shopify(), "x-shopify-event-id"),
        (webhook::standard(), "webhook-id"),
        (webhook::svix(), "svix-id"),
    ] {
        let runs = Runs::default();
        let layer: RedlockLayer<Header, _> =
            RedlockLayer::new(redlock.clone(), extractor).replay(Duration::from_secs(60));
        let addr = serve(app(layer, &runs)).await;
        let client = http1();
        let send = |id: Option<&str>| {
            let mut req = http::Request::post(format!("http://{addr}/stripe"));
            if let Some(id) = id {
                req = req.header(header, id);
            }
            req.body(Body::from("{}")).expect("request")
        };
        // Each layer locks in its header's namespace; ids of their own all the same.
        let id = format!("d-{header}");
        let first = exchange(&client, send(Some(&id))).await.expect("exchange");
        let again = exchange(&client, send(Some(&id))).await.expect("exchange");
        assert_eq!(
            (first.status, again.replayed()),
            (StatusCode::OK, true),
            "{header}"
        );
        let missing = exchange(&client, send(None)).await.expect("exchange");
        assert_eq!(missing.status, StatusCode::BAD_REQUEST, "{header}");
        assert_eq!(runs.0.load(Ordering::SeqCst), 1, "{header}");
    }
}
