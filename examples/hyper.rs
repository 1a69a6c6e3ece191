//! `RedlockLayer` on a plain hyper 1 server, without a framework: the layer goes into a
//! `tower::ServiceBuilder`, and `hyper_util`'s `TowerToHyperService` adapts the result
//! for hyper's connection builder.
//!
//! `GET /jobs/{id}` runs a job under the lock named by the path segment `{id}`
//! (`PathSegment::new(1)`). After the server starts, the example fires concurrent
//! duplicate requests at it, prints how each was answered (one 200 per job id, 409 for
//! the duplicates while it runs; 200 again once it is done), and exits.
//!
//! ```text
//! cargo run --example hyper
//! ```
//!
//! Uses the nodes in `REDLOCK_NODES` (comma-separated `redis://` URLs) or starts 3 local
//! `redis-server` processes for the run.

mod common;

use common::Error;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tower::ServiceBuilder;
use tower_redlock::layer::PathSegment;
use tower_redlock::{LockToken, Redlock, RedlockLayer};

/// How long a job runs while holding its lock.
const JOB_TIME: Duration = Duration::from_millis(300);

/// The handler: runs with the job's lock held (the layer put the token in the
/// extensions); requests the extractor passed through have no token.
async fn job(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let token = req.extensions().get::<LockToken>().cloned();
    let (true, Some(token)) = (req.uri().path().starts_with("/jobs/"), token) else {
        let mut res = Response::new(Full::from("try GET /jobs/{id}\n"));
        *res.status_mut() = StatusCode::NOT_FOUND;
        return Ok(res);
    };
    // The job id is the path's second segment (the token's name is the lock's: the
    // layer's namespace and the id, `path-segment:1 {id}`).
    let id = req
        .uri()
        .path()
        .split('/')
        .nth(2)
        .unwrap_or_default()
        .to_owned();
    tokio::time::sleep(JOB_TIME).await;
    Ok(Response::new(Full::from(format!(
        "job {id} done; lock still valid for {} ms",
        token.remaining().as_millis()
    ))))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (urls, local) = common::nodes_or_local(3)?;
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .restart_quarantine(common::restart_quarantine(&local))
        .ttl(Duration::from_secs(10))
        .key_prefix("jobs:")
        .build()?;
    common::print_nodes(&redlock, &urls);

    // The server: the layer, then the handler, adapted for hyper.
    let service = ServiceBuilder::new()
        .layer(RedlockLayer::new(redlock, PathSegment::new(1)).ttl(Duration::from_secs(5)))
        .service_fn(job);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("serving on http://{addr}");
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    eprintln!("accept failed: {e}");
                    continue;
                }
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let conn = auto::Builder::new(TokioExecutor::new());
                if let Err(e) = conn.serve_connection(TokioIo::new(stream), service).await {
                    eprintln!("connection error: {e}");
                }
            });
        }
    });

    // The client: four duplicates of job 42 and two of job 7, all at once.
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let started = Instant::now();
    let get = |path: &'static str| {
        let client = client.clone();
        async move {
            let res = client.get(format!("http://{addr}{path}").parse()?).await?;
            let status = res.status();
            let retry_after = res
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(|s| format!(" (Retry-After: {s})"))
                .unwrap_or_default();
            let body = res.into_body().collect().await?.to_bytes();
            let body = String::from_utf8_lossy(&body).trim().to_owned();
            Ok::<_, Error>(format!(
                "{:>4} ms  GET {path:<9} -> {status}{retry_after}: {body}",
                started.elapsed().as_millis()
            ))
        }
    };
    let paths = [
        "/jobs/42", "/jobs/42", "/jobs/7", "/jobs/42", "/jobs/7", "/jobs/42",
    ];
    let tasks: Vec<_> = paths.iter().map(|p| tokio::spawn(get(p))).collect();
    common::print_in_completion_order("concurrent requests", tasks).await?;
    println!("\nonce they are done, job 42 can run again:");
    println!("  {}", get("/jobs/42").await?);

    drop(local); // stops the local redis-server nodes, if any
    Ok(())
}
