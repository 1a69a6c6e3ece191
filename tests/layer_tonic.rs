//! RedlockLayer in a tonic server, called by a tonic client over HTTP/2, with real Redis.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use http::uri::PathAndQuery;
use support::Cluster;
use tokio::sync::Semaphore;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;
use tower_redlock::RedlockLayer;
use tower_redlock::layer::Header;
use tower_redlock::{LockError, LockToken};

const METHOD: &str = "/test.Locked/Call";

/// A unary method `test.Locked/Call` (empty messages) that waits at a gate.
#[derive(Clone)]
struct Locked {
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    started: Arc<Semaphore>,
}

impl NamedService for Locked {
    const NAME: &'static str = "test.Locked";
}

struct Call(Locked);

impl UnaryService<()> for Call {
    type Response = ();
    type Future = BoxFuture<'static, Result<Response<()>, Status>>;

    fn call(&mut self, request: Request<()>) -> Self::Future {
        let svc = self.0.clone();
        Box::pin(async move {
            let token = request
                .extensions()
                .get::<LockToken>()
                .cloned()
                .ok_or_else(|| Status::internal("no LockToken"))?;
            assert!(token.is_valid());
            svc.runs.fetch_add(1, Ordering::SeqCst);
            svc.started.add_permits(1);
            svc.gate.acquire().await.expect("gate").forget();
            Ok(Response::new(()))
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Locked {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let svc = self.clone();
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<(), ()>::default());
            Ok(grpc.unary(Call(svc), req).await)
        })
    }
}

async fn start(cluster: &Cluster, extractor: Header) -> (SocketAddr, Locked) {
    let redlock = cluster.client(|b| b.ttl(Duration::from_secs(30))).await;
    let svc = Locked {
        runs: Arc::default(),
        gate: Arc::new(Semaphore::new(0)),
        started: Arc::new(Semaphore::new(0)),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let server = Server::builder()
        .layer(RedlockLayer::new(redlock, extractor))
        .add_service(svc.clone());
    tokio::spawn(async move { server.serve_with_incoming(incoming).await.expect("serve") });
    (addr, svc)
}

async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

async fn call(channel: Channel, key: Option<&str>) -> Result<(), Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(e.to_string()))?;
    let mut request = Request::new(());
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("idempotency-key", key.parse().expect("metadata"));
    }
    grpc.unary(
        request,
        PathAndQuery::from_static(METHOD),
        ProstCodec::<(), ()>::default(),
    )
    .await
    .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_with_one_key_one_ok_the_others_aborted() {
    let cluster = Cluster::start(3);
    let (addr, svc) = start(&cluster, Header::new("idempotency-key")).await;
    let channel = channel(addr).await;
    let mut calls: FuturesUnordered<_> = (0..20)
        .map(|_| call(channel.clone(), Some("pay-1")))
        .collect();
    for _ in 0..19 {
        let status = calls.next().await.expect("reply").expect_err("aborted");
        assert_eq!(status.code(), Code::Aborted, "{status:?}");
    }
    svc.gate.add_permits(1);
    calls
        .next()
        .await
        .expect("reply")
        .expect("the one holder succeeds");
    assert_eq!(svc.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn no_quorum_is_unavailable_and_bad_input_invalid_argument() {
    let mut cluster = Cluster::start(3);
    let (addr, svc) = start(&cluster, Header::new("idempotency-key").required()).await;
    let channel = channel(addr).await;
    let status = call(channel.clone(), None).await.expect_err("no key");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("idempotency-key"));
    cluster.nodes[0].kill();
    cluster.nodes[2].kill();
    let status = call(channel.clone(), Some("pay-2"))
        .await
        .expect_err("no quorum");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        !status.message().contains("127.0.0.1"),
        "internal addresses leak: {status:?}"
    );
    assert_eq!(svc.runs.load(Ordering::SeqCst), 0);
}

#[test]
fn lock_errors_convert_into_statuses() {
    let busy = LockError::Busy {
        held_elsewhere: 2,
        nodes: 3,
        retry_after: None,
        attempts: 1,
    };
    assert_eq!(Status::from(busy).code(), Code::Aborted);
    let no_quorum = LockError::NoQuorum {
        needed: 2,
        reached: 0,
        held_elsewhere: 0,
        failures: vec![],
        attempts: 1,
    };
    assert_eq!(Status::from(no_quorum).code(), Code::Unavailable);
    let bad = LockError::InvalidName {
        reason: "the name is empty",
    };
    assert_eq!(Status::from(bad).code(), Code::InvalidArgument);
}
