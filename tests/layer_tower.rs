//! RedlockLayer around plain tower services (no framework), with real Redis nodes.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use redis::AsyncCommands;
use support::{Cluster, header_lock, in_namespace, key_of, wait_for};
use tower::{Layer, ServiceExt, service_fn};
use tower_redlock::RedlockLayer;
use tower_redlock::layer::{Header, PathSegment};
use tower_redlock::{LockToken, Redlock};

async fn redlock(cluster: &Cluster) -> Redlock {
    cluster.client(|b| b).await
}

async fn body_text(res: Response<tower_redlock::layer::ResponseBody<Full<Bytes>>>) -> Bytes {
    http_body_util::BodyExt::collect(res.into_body())
        .await
        .expect("body")
        .to_bytes()
}

/// The Redis key of a layer keyed by path segment `index` for the segment `segment`.
fn segment_key(index: usize, segment: &str) -> String {
    key_of(&in_namespace(&format!("path-segment:{index}"), segment))
}

async fn exists(cluster: &Cluster, key: &str) -> bool {
    let mut conn = cluster.raw(0).await;
    conn.exists(key).await.expect("EXISTS")
}

#[tokio::test]
async fn an_inner_error_releases_the_lock_and_is_passed_on() {
    let cluster = Cluster::start(1);
    let svc = RedlockLayer::new(redlock(&cluster).await, PathSegment::new(0)).layer(service_fn(
        |req: Request<Full<Bytes>>| async move {
            assert!(req.extensions().get::<LockToken>().is_some());
            Err::<Response<Full<Bytes>>, _>("inner failure")
        },
    ));
    let err = svc
        .clone()
        .oneshot(
            Request::get("/job-1")
                .body(Full::default())
                .expect("request"),
        )
        .await
        .expect_err("the inner error");
    assert_eq!(err, "inner failure");
    // Released before the error was returned.
    assert!(!exists(&cluster, &segment_key(0, "job-1")).await);
}

#[tokio::test]
async fn the_token_is_in_the_extensions_and_released_after_the_response() {
    let cluster = Cluster::start(1);
    let r = redlock(&cluster).await;
    let probe = r.clone();
    let svc = RedlockLayer::new(r, Header::new("x-key")).layer(service_fn(
        move |req: Request<Full<Bytes>>| {
            let probe = probe.clone();
            async move {
                let token = req.extensions().get::<LockToken>().cloned();
                // While the handler runs, the lock is held.
                let held = match &token {
                    Some(t) => probe.try_lock(t.name()).await.is_err(),
                    None => false,
                };
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                    "{} {held}",
                    token.map(|t| t.value().len()).unwrap_or(0)
                )))))
            }
        },
    ));
    let res = svc
        .clone()
        .oneshot(
            Request::get("/")
                .header("x-key", "k")
                .body(Full::default())
                .expect("request"),
        )
        .await
        .expect("response");
    let body = body_text(res).await;
    assert_eq!(&body[..], b"56 true");
    assert!(
        !exists(&cluster, &key_of(&header_lock("x-key", "k"))).await,
        "released before the response"
    );
    // Without the header: passed through, no token.
    let res = svc
        .oneshot(Request::get("/").body(Full::default()).expect("request"))
        .await
        .expect("response");
    let body = body_text(res).await;
    assert_eq!(&body[..], b"0 false");
}

#[tokio::test]
async fn a_dropped_response_future_releases_in_the_background() {
    let cluster = Cluster::start(1);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = std::sync::Arc::new(std::sync::Mutex::new(Some(started_tx)));
    let svc = RedlockLayer::new(redlock(&cluster).await, PathSegment::new(0)).layer(service_fn(
        move |_req: Request<Full<Bytes>>| {
            if let Some(tx) = started_tx.lock().expect("tx").take() {
                let _ = tx.send(());
            }
            std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>()
        },
    ));
    let call = tokio::spawn(
        svc.oneshot(
            Request::get("/stuck")
                .body(Full::default())
                .expect("request"),
        ),
    );
    started_rx.await.expect("the inner service was called");
    assert!(exists(&cluster, &segment_key(0, "stuck")).await);
    call.abort();
    wait_for("the background release", Duration::from_secs(5), || async {
        !exists(&cluster, &segment_key(0, "stuck")).await
    })
    .await;
}

/// A percent-encoded duplicate names the same lock: `/jobs/4%32` waits on `/jobs/42`.
#[tokio::test]
async fn percent_encoded_paths_contend_with_their_decoded_form() {
    let cluster = Cluster::start(1);
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let inner = {
        let gate = gate.clone();
        service_fn(move |_req: Request<Full<Bytes>>| {
            let gate = gate.clone();
            async move {
                gate.acquire().await.expect("gate").forget();
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("ran"))))
            }
        })
    };
    let svc = RedlockLayer::new(redlock(&cluster).await, PathSegment::new(1)).layer(inner);
    let first = tokio::spawn(
        svc.clone().oneshot(
            Request::get("/jobs/42")
                .body(Full::default())
                .expect("request"),
        ),
    );
    wait_for(
        "the first to hold the lock",
        Duration::from_secs(5),
        || async { exists(&cluster, &segment_key(1, "42")).await },
    )
    .await;
    let encoded = svc
        .clone()
        .oneshot(
            Request::get("/jobs/4%32")
                .body(Full::default())
                .expect("request"),
        )
        .await
        .expect("response");
    assert_eq!(encoded.status(), 409, "the encoded duplicate must not run");
    gate.add_permits(1);
    let first = first.await.expect("task").expect("response");
    assert_eq!(first.status(), 200);
}

/// Without the axum feature, a rejection hook answers with a plain `http::Response` and
/// sees the request's head, also when the lock is lost while the service runs (abort on
/// loss), after the service took the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_hook_sees_the_request_head_and_answers_with_an_http_response() {
    use tower_redlock::layer::RejectionKind;

    let cluster = Cluster::start(1);
    let r = cluster.client(|b| b.ttl(Duration::from_millis(600))).await;
    let started = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let inner = {
        let started = started.clone();
        service_fn(move |_req: Request<Full<Bytes>>| {
            started.add_permits(1);
            std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>()
        })
    };
    let svc = RedlockLayer::new(r.clone(), PathSegment::new(0))
        .abort_on_loss(true)
        .on_rejection(|rejection, head| {
            let id = head
                .headers
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none");
            let status = match rejection.kind() {
                RejectionKind::Busy { .. } => http::StatusCode::ACCEPTED,
                _ => rejection.http_status(),
            };
            let mut res = Response::new(format!(
                "{id} {} {}",
                head.uri.path(),
                rejection.kind().as_str()
            ));
            *res.status_mut() = status;
            res
        })
        .layer(inner);
    let request = |path: &str, id: &'static str| {
        Request::get(path)
            .header("x-request-id", id)
            .body(Full::default())
            .expect("request")
    };

    let held = r
        .try_lock(in_namespace("path-segment:0", "busy-job"))
        .await
        .expect("lock");
    let res = svc
        .clone()
        .oneshot(request("/busy-job", "r-1"))
        .await
        .expect("response");
    assert_eq!(res.status(), 202);
    assert_eq!(body_text(res).await, "r-1 /busy-job busy");
    assert_eq!(r.unlock(&held).await.released(), 1);

    let doomed = tokio::spawn(svc.clone().oneshot(request("/doomed-job", "r-2")));
    started.acquire().await.expect("started").forget();
    let mut conn = cluster.raw(0).await;
    let _: () = conn.del(segment_key(0, "doomed-job")).await.expect("DEL");
    let res = tokio::time::timeout(Duration::from_secs(5), doomed)
        .await
        .expect("answered once the loss is seen")
        .expect("task")
        .expect("response");
    assert_eq!(res.status(), 503);
    assert_eq!(body_text(res).await, "r-2 /doomed-job unavailable");
}
