//! `RedlockLayer` on a tonic gRPC server: `demo.Payments/Charge` is locked on the
//! `idempotency-key` metadata entry, so concurrent duplicate calls cannot charge twice.
//!
//! gRPC metadata travels as HTTP/2 headers, so the stock `Header` extractor reads it; the
//! layer goes on the whole server with `Server::builder().layer(..)`, and `GrpcMethods`
//! limits it to `Charge`, so health checks, reflection and other methods on the server
//! pass through without a key. Busy calls fail with `ABORTED`, calls without the key with
//! `INVALID_ARGUMENT` (the extractor is `required`), and calls without a quorum of nodes
//! with `UNAVAILABLE`. The handler gets the `LockToken` with `request.lock_token()`.
//!
//! The example starts the server and a client, sends four concurrent calls with one key,
//! one with another key and one without a key, prints how each ended, retries the first
//! key once they are done (it gets the stored charge back), and exits.
//!
//! ```text
//! cargo run --features tonic --example tonic_grpc
//! ```
//!
//! Uses the nodes in `REDLOCK_NODES` (comma-separated `redis://` URLs) or starts 3 local
//! `redis-server` processes for the run.
//!
//! No `protoc` is needed: the messages, the service and the client below are what
//! `tonic-prost-build` would generate from
//!
//! ```proto
//! syntax = "proto3";
//! package demo;
//! service Payments { rpc Charge(ChargeRequest) returns (ChargeReply); }
//! message ChargeRequest { string order_id = 1; uint64 amount_cents = 2; }
//! message ChargeReply { string charge_id = 1; bool replayed = 2; }
//! ```
//!
//! written by hand and trimmed.

mod common;

use common::Error;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tonic::{Code, Request, Response, Status};
use tower_redlock::layer::{GrpcMethods, Header, LockTokenExt};
use tower_redlock::{Redlock, RedlockLayer};

/// The messages, as prost would generate them.
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ChargeRequest {
        #[prost(string, tag = "1")]
        pub order_id: String,
        #[prost(uint64, tag = "2")]
        pub amount_cents: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ChargeReply {
        #[prost(string, tag = "1")]
        pub charge_id: String,
        #[prost(bool, tag = "2")]
        pub replayed: bool,
    }
}

/// The server side, shaped like tonic's generated `payments_server` module.
mod server {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use tonic::codegen::{BoxFuture, Service, http};
    use tonic::server::{Grpc, NamedService, UnaryService};
    use tonic::{Request, Response, Status};

    use super::pb::{ChargeReply, ChargeRequest};

    /// The service's methods.
    pub trait Payments: Send + Sync + 'static {
        fn charge(
            &self,
            request: Request<ChargeRequest>,
        ) -> impl Future<Output = Result<Response<ChargeReply>, Status>> + Send;
    }

    /// Routes `/demo.Payments/*` calls to a [`Payments`] implementation.
    #[derive(Debug)]
    pub struct PaymentsServer<T> {
        inner: Arc<T>,
    }

    impl<T> PaymentsServer<T> {
        pub fn new(inner: T) -> Self {
            Self {
                inner: Arc::new(inner),
            }
        }
    }

    impl<T> Clone for PaymentsServer<T> {
        fn clone(&self) -> Self {
            Self {
                inner: Arc::clone(&self.inner),
            }
        }
    }

    impl<T> NamedService for PaymentsServer<T> {
        const NAME: &'static str = "demo.Payments";
    }

    impl<T: Payments> Service<http::Request<tonic::body::Body>> for PaymentsServer<T> {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = BoxFuture<Self::Response, Self::Error>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            match req.uri().path() {
                "/demo.Payments/Charge" => {
                    struct ChargeSvc<T>(Arc<T>);
                    impl<T: Payments> UnaryService<ChargeRequest> for ChargeSvc<T> {
                        type Response = ChargeReply;
                        type Future = BoxFuture<Response<ChargeReply>, Status>;
                        fn call(&mut self, request: Request<ChargeRequest>) -> Self::Future {
                            let inner = Arc::clone(&self.0);
                            Box::pin(async move { inner.charge(request).await })
                        }
                    }
                    let inner = Arc::clone(&self.inner);
                    Box::pin(async move {
                        let mut grpc = Grpc::new(tonic_prost::ProstCodec::default());
                        Ok(grpc.unary(ChargeSvc(inner), req).await)
                    })
                }
                _ => {
                    Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) })
                }
            }
        }
    }
}

/// The client side, shaped like tonic's generated `payments_client` module.
mod client {
    use tonic::codegen::http::uri::PathAndQuery;
    use tonic::codegen::{GrpcMethod, StdError};
    use tonic::transport::Channel;
    use tonic::{IntoRequest, Response, Status};

    use super::pb::{ChargeReply, ChargeRequest};

    #[derive(Debug, Clone)]
    pub struct PaymentsClient {
        inner: tonic::client::Grpc<Channel>,
    }

    impl PaymentsClient {
        pub async fn connect(dst: String) -> Result<Self, StdError> {
            let channel = Channel::from_shared(dst)?.connect().await?;
            Ok(Self {
                inner: tonic::client::Grpc::new(channel),
            })
        }

        pub async fn charge(
            &mut self,
            request: impl IntoRequest<ChargeRequest>,
        ) -> Result<Response<ChargeReply>, Status> {
            self.inner
                .ready()
                .await
                .map_err(|e| Status::unknown(format!("service was not ready: {e}")))?;
            let codec = tonic_prost::ProstCodec::default();
            let path = PathAndQuery::from_static("/demo.Payments/Charge");
            let mut req = request.into_request();
            req.extensions_mut()
                .insert(GrpcMethod::new("demo.Payments", "Charge"));
            self.inner.unary(req, path, codec).await
        }
    }
}

/// The implementation: charges once per idempotency key.
#[derive(Default)]
struct Payments {
    /// Idempotency key -> charge id.
    charges: Mutex<HashMap<String, String>>,
    next_charge: AtomicU64,
}

impl server::Payments for Payments {
    async fn charge(
        &self,
        request: Request<pb::ChargeRequest>,
    ) -> Result<Response<pb::ChargeReply>, Status> {
        // Put there by the layer, which holds the lock while this runs.
        let token = request.lock_token()?;
        let key = String::from_utf8_lossy(token.name()).into_owned();
        let stored = {
            let charges = self.charges.lock().unwrap_or_else(|e| e.into_inner());
            charges.get(&key).cloned()
        };
        if let Some(charge_id) = stored {
            return Ok(Response::new(pb::ChargeReply {
                charge_id,
                replayed: true,
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await; // the card processor
        if !token.is_held() {
            return Err(Status::unavailable(
                "lost the lock; retry with the same key",
            ));
        }
        let n = self.next_charge.fetch_add(1, Ordering::SeqCst) + 1;
        let order = &request.get_ref().order_id;
        let charge_id = format!("ch_{n:04} for {order}");
        let mut charges = self.charges.lock().unwrap_or_else(|e| e.into_inner());
        charges.insert(key, charge_id.clone());
        Ok(Response::new(pb::ChargeReply {
            charge_id,
            replayed: false,
        }))
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (urls, local) = common::nodes_or_local(3)?;
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .restart_quarantine(common::restart_quarantine(&local))
        .key_prefix("grpc:")
        .build()?;
    common::print_nodes(&redlock, &urls);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    // Only Charge is locked; every other method of the server passes through.
    let charge =
        GrpcMethods::new(Header::new("idempotency-key").required()).method("/demo.Payments/Charge");
    let layer = RedlockLayer::new(redlock, charge).ttl(Duration::from_secs(10));
    let server = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(server::PaymentsServer::new(Payments::default()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(async move {
        if let Err(e) = server.await {
            eprintln!("server error: {e}");
        }
    });
    println!("serving demo.Payments on http://{addr}");

    let client = client::PaymentsClient::connect(format!("http://{addr}")).await?;
    let started = Instant::now();
    let call = |key: Option<&'static str>, order: &'static str| {
        let mut client = client.clone();
        async move {
            let mut req = Request::new(pb::ChargeRequest {
                order_id: order.into(),
                amount_cents: 1999,
            });
            if let Some(key) = key {
                req.metadata_mut().insert("idempotency-key", key.parse()?);
            }
            let outcome = match client.charge(req).await {
                Ok(res) => {
                    let reply = res.into_inner();
                    let how = if reply.replayed {
                        "replayed"
                    } else {
                        "charged"
                    };
                    format!("OK {}: {}", how, reply.charge_id)
                }
                Err(status) => format!("{:?}: {}", status.code(), status.message()),
            };
            Ok::<_, Error>(format!(
                "{:>4} ms  key {:<9} -> {outcome}",
                started.elapsed().as_millis(),
                key.unwrap_or("(none)")
            ))
        }
    };

    let calls = [
        (Some("pay-7f3a"), "order-1"),
        (Some("pay-7f3a"), "order-1"),
        (Some("pay-7f3a"), "order-1"),
        (Some("pay-7f3a"), "order-1"),
        (Some("pay-9c21"), "order-2"),
        (None, "order-3"),
    ];
    let tasks: Vec<_> = calls
        .iter()
        .map(|&(key, order)| tokio::spawn(call(key, order)))
        .collect();
    let lines = common::print_in_completion_order("concurrent calls", tasks).await?;
    let aborted = lines
        .iter()
        .filter(|l| l.contains(&format!("{:?}", Code::Aborted)))
        .count();
    println!("\nthe client retries pay-7f3a after the first call finished:");
    println!("  {}", call(Some("pay-7f3a"), "order-1").await?);
    println!("\n{aborted} duplicate call(s) were ABORTED while the first one held the lock");

    drop(local); // stops the local redis-server nodes, if any
    Ok(())
}
