//! RedlockLayer in a tonic server, called by a tonic client over HTTP/2, with real Redis.

use crate::support;

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
use support::{Cluster, header_lock, key_of, wait_for};
use tokio::sync::Semaphore;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;
use tower_redlock::LockError;
use tower_redlock::RedlockLayer;
use tower_redlock::layer::{GrpcMethods, Header, LockTokenExt};

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
            let token = request.lock_token()?;
            assert!(token.is_held());
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
    let (addr, incoming) = bind().await;
    let server = Server::builder()
        .layer(RedlockLayer::new(redlock, extractor))
        .add_service(svc.clone());
    tokio::spawn(async move { server.serve_with_incoming(incoming).await.expect("serve") });
    (addr, svc)
}

/// A listener on a free loopback port, for a tonic server.
async fn bind() -> (SocketAddr, tonic::transport::server::TcpIncoming) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    (addr, tonic::transport::server::TcpIncoming::from(listener))
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
        // The holder's 30 s TTL, capped at the default 1 s.
        assert_pushes_back_1s(&status);
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
    assert_pushes_back_1s(&status);
    assert_eq!(svc.runs.load(Ordering::SeqCst), 0);
}

/// A gRPC rejection advises a retry in 1 s the way gRPC clients' retry policies read it
/// (`grpc-retry-pushback-ms`), with no HTTP `Retry-After`.
fn assert_pushes_back_1s(status: &Status) {
    assert_eq!(
        status
            .metadata()
            .get("grpc-retry-pushback-ms")
            .and_then(|v| v.to_str().ok()),
        Some("1000"),
        "{status:?}"
    );
    assert!(status.metadata().get("retry-after").is_none(), "{status:?}");
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

/// A service with a unary method that answers `run N` (or fails with the code in the
/// `x-code` metadata) and a server-streaming one that sends two messages.
#[derive(Clone, Default)]
struct Replying {
    runs: Arc<AtomicUsize>,
}

impl NamedService for Replying {
    const NAME: &'static str = "test.Replying";
}

struct Unary(Arc<AtomicUsize>);

impl UnaryService<()> for Unary {
    type Response = String;
    type Future = BoxFuture<'static, Result<Response<String>, Status>>;

    fn call(&mut self, request: Request<()>) -> Self::Future {
        let run = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        let code = request
            .metadata()
            .get("x-code")
            .and_then(|v| v.to_str().ok()?.parse::<i32>().ok());
        Box::pin(async move {
            match code {
                Some(code) => Err(Status::new(Code::from(code), format!("failed run {run}"))),
                None => Ok(Response::new(format!("run {run}"))),
            }
        })
    }
}

struct Streaming(Arc<AtomicUsize>);

impl tonic::server::ServerStreamingService<()> for Streaming {
    type Response = String;
    type ResponseStream = futures_util::stream::BoxStream<'static, Result<String, Status>>;
    type Future = BoxFuture<'static, Result<Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let run = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        let items = vec![Ok(format!("run {run} a")), Ok(format!("run {run} b"))];
        Box::pin(async move {
            let stream: Self::ResponseStream = futures_util::stream::iter(items).boxed();
            Ok(Response::new(stream))
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Replying {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let runs = Arc::clone(&self.runs);
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<String, ()>::default());
            Ok(if req.uri().path().ends_with("/Stream") {
                grpc.server_streaming(Streaming(runs), req).await
            } else {
                grpc.unary(Unary(runs), req).await
            })
        })
    }
}

async fn replaying_server(cluster: &Cluster) -> (Channel, Arc<AtomicUsize>) {
    let redlock = cluster.client(|b| b.ttl(Duration::from_secs(30))).await;
    let svc = Replying::default();
    let runs = Arc::clone(&svc.runs);
    let (addr, incoming) = bind().await;
    let layer = RedlockLayer::new(redlock, Header::new("idempotency-key"))
        .fencing(false)
        .replay(Duration::from_secs(60));
    let server = Server::builder().layer(layer).add_service(svc);
    tokio::spawn(async move { server.serve_with_incoming(incoming).await.expect("serve") });
    (channel(addr).await, runs)
}

fn keyed(key: &str, code: Option<Code>) -> Request<()> {
    let mut request = Request::new(());
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().expect("metadata"));
    if let Some(code) = code {
        let code = (code as i32).to_string();
        request
            .metadata_mut()
            .insert("x-code", code.parse().expect("metadata"));
    }
    request
}

/// The reply and whether it was replayed.
async fn unary(channel: &Channel, request: Request<()>) -> Result<(String, bool), Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(e.to_string()))?;
    let path = PathAndQuery::from_static("/test.Replying/Call");
    let reply = grpc
        .unary(request, path, ProstCodec::<(), String>::default())
        .await?;
    let replayed = reply.metadata().get("idempotent-replayed").is_some();
    Ok((reply.into_inner(), replayed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_a_unary_reply_is_replayed_with_its_status() {
    let cluster = Cluster::start(3);
    let (channel, runs) = replaying_server(&cluster).await;
    let first = unary(&channel, keyed("g-1", None)).await.expect("first");
    assert_eq!(first, ("run 1".to_owned(), false));
    for _ in 0..10 {
        let again = unary(&channel, keyed("g-1", None)).await.expect("replay");
        assert_eq!(again, ("run 1".to_owned(), true));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A status a retry would only repeat is kept, with its message.
    let failed = unary(&channel, keyed("g-2", Some(Code::NotFound))).await;
    let again = unary(&channel, keyed("g-2", None)).await;
    let (failed, again) = (failed.expect_err("fails"), again.expect_err("replayed"));
    assert_eq!(
        (again.code(), again.message()),
        (Code::NotFound, "failed run 2")
    );
    assert_eq!(failed.message(), again.message());
    assert!(again.metadata().get("idempotent-replayed").is_some());

    // UNAVAILABLE is worth a retry: not kept.
    let unavailable = unary(&channel, keyed("g-3", Some(Code::Unavailable))).await;
    assert_eq!(unavailable.expect_err("fails").code(), Code::Unavailable);
    let retried = unary(&channel, keyed("g-3", None))
        .await
        .expect("runs again");
    assert_eq!(retried, ("run 4".to_owned(), false));
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replay_streaming_replies_are_not_replayed() {
    let cluster = Cluster::start(3);
    let (channel, runs) = replaying_server(&cluster).await;
    for run in 1..=2 {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.expect("ready");
        let path = PathAndQuery::from_static("/test.Replying/Stream");
        let reply = grpc
            .server_streaming(
                keyed("s-1", None),
                path,
                ProstCodec::<(), String>::default(),
            )
            .await
            .expect("stream");
        assert!(reply.metadata().get("idempotent-replayed").is_none());
        let items: Vec<String> = reply
            .into_inner()
            .map(|item| item.expect("item"))
            .collect()
            .await;
        assert_eq!(items, [format!("run {run} a"), format!("run {run} b")]);
        // The lock is released once the stream ended.
        wait_for("the release", Duration::from_secs(5), || async {
            cluster
                .nodes_holding(key_of(&header_lock("idempotency-key", "s-1")))
                .await
                == 0
        })
        .await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A per-method filter: the listed method is locked (and needs its key); the other
/// service's calls pass through without a lock and without the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_listed_methods_are_locked() {
    let cluster = Cluster::start(3);
    let redlock = cluster.client(|b| b.ttl(Duration::from_secs(30))).await;
    let locked = Locked {
        runs: Arc::default(),
        gate: Arc::new(Semaphore::new(100)),
        started: Arc::new(Semaphore::new(0)),
    };
    let (addr, incoming) = bind().await;
    let extractor = GrpcMethods::new(Header::new("idempotency-key").required()).method(METHOD);
    let server = Server::builder()
        .layer(RedlockLayer::new(redlock, extractor))
        .add_service(locked.clone())
        .add_service(Replying::default());
    tokio::spawn(async move { server.serve_with_incoming(incoming).await.expect("serve") });
    let channel = channel(addr).await;
    // The listed method: its key is required, and the handler gets the token.
    let status = call(channel.clone(), None).await.expect_err("no key");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    call(channel.clone(), Some("listed"))
        .await
        .expect("locked call");
    assert_eq!(locked.runs.load(Ordering::SeqCst), 1);
    // Another service: passes through, without a key.
    let reply = unary(&channel, Request::new(()))
        .await
        .expect("passed through");
    assert_eq!(reply, ("run 1".to_owned(), false));
}
