//! HTTP helpers for the layer tests: serve a router on a free loopback port, and real
//! HTTP/1 and HTTP/2 (h2c) clients.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Serves `app` (HTTP/1 and h2c) on a free loopback port until the test ends.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    addr
}

pub type HttpClient = Client<HttpConnector, Body>;

pub fn http1() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub fn http2() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// Status, headers and body text of a response.
pub struct Reply {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Reply {
    /// Whether the layer answered from a completion record (`idempotent-replayed`).
    #[allow(dead_code)] // not every test binary replays
    pub fn replayed(&self) -> bool {
        self.headers
            .get(tower_redlock::layer::REPLAYED_HEADER)
            .is_some()
    }
}

pub async fn send(client: &HttpClient, req: http::Request<Body>) -> Reply {
    let res = client.request(req).await.expect("request");
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

pub fn post(addr: SocketAddr, path: &str, header: Option<(&str, &str)>) -> http::Request<Body> {
    let mut b = http::Request::post(format!("http://{addr}{path}"));
    if let Some((k, v)) = header {
        b = b.header(k, v);
    }
    b.body(Body::empty()).expect("request")
}

/// Status, headers, body bytes and trailers of a response, as a client saw them.
#[derive(Debug)]
pub struct Seen {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: bytes::Bytes,
    pub trailers: Option<http::HeaderMap>,
}

impl Seen {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Whether the layer answered from a completion record (`idempotent-replayed: true`).
    pub fn replayed(&self) -> bool {
        self.headers
            .get(tower_redlock::layer::REPLAYED_HEADER)
            .is_some_and(|v| v == "true")
    }
}

/// Sends `req` and reads the whole response, trailers included; `Err` when the exchange
/// failed (the request, or the body mid-way).
pub async fn exchange(client: &HttpClient, req: http::Request<Body>) -> Result<Seen, String> {
    let res = client
        .request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let (parts, body) = res.into_parts();
    let collected = body.collect().await.map_err(|e| format!("body: {e}"))?;
    let trailers = collected.trailers().cloned();
    Ok(Seen {
        status: parts.status,
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    })
}
