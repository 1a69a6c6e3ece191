//! Every state and transition of the layer's response future (see the diagram in
//! `future.rs`), over the in-memory lock: no server, each step polled by hand where the
//! state in between matters.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tokio::sync::{Notify, mpsc};
use tower::{Layer, Service, ServiceExt, service_fn};

use crate::RedlockLayer;
use crate::layer::{Header, ResponseBody, WaitPolicy};
use crate::testing::{Failure, InMemoryLock};
use crate::token::LockToken;

const KEY: &str = "key";

/// The lock name the layers of these tests take for the key `a`: their namespace (the
/// header's), a space, the key.
const A: &str = "header:key a";

/// Polls `fut` once, with a waker that does nothing.
fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

/// The state a response future is in, as its `Debug` output names it.
fn state_of<T: std::fmt::Debug>(fut: &T) -> String {
    format!("{fut:?}")
}

fn request(key: Option<&str>, body: &'static str) -> Request<Full<Bytes>> {
    let mut req = Request::post("/work");
    if let Some(key) = key {
        req = req.header(KEY, key);
    }
    req.body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap_or_else(|_| unreachable!("a valid request"))
}

async fn bytes_of<B: Body<Data = Bytes>>(body: B) -> Bytes
where
    B::Error: std::fmt::Debug,
{
    match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => panic!("body failed: {e:?}"),
    }
}

/// A handler that counts its runs and, for a body of "wait", waits on `gate`.
#[derive(Clone, Default)]
struct Handler {
    runs: Arc<AtomicUsize>,
    gate: Arc<Notify>,
}

impl Handler {
    fn service<B>(
        &self,
        status: StatusCode,
    ) -> impl Service<
        Request<B>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
    > + Clone
    + Send
    + 'static
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: std::fmt::Debug,
    {
        let this = self.clone();
        service_fn(move |req: Request<B>| {
            let this = this.clone();
            async move {
                this.runs.fetch_add(1, Ordering::SeqCst);
                let token = req.extensions().get::<LockToken>().cloned();
                let body = bytes_of(req.into_body()).await;
                if body.as_ref() == b"wait" {
                    this.gate.notified().await;
                }
                let fence = token.and_then(|t| t.fencing_token());
                let mut res = Response::new(Full::new(Bytes::from(format!("{fence:?}"))));
                *res.status_mut() = status;
                Ok::<_, Infallible>(res)
            }
        })
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn passthrough_without_a_name_takes_no_lock() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let svc =
        RedlockLayer::new(lock.clone(), Header::new(KEY)).layer(handler.service(StatusCode::OK));
    let fut = svc.oneshot(request(None, ""));
    let res = fut.await.unwrap_or_else(|e| match e {});
    assert!(!res.body().holds_lock());
    assert_eq!(bytes_of(res.into_body()).await, "None");
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn a_bad_name_is_rejected_before_acquiring() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let mut svc =
        RedlockLayer::new(lock.clone(), Header::new(KEY)).layer(handler.service(StatusCode::OK));
    let mut fut = Box::pin(svc.call(request(Some(""), "")));
    assert_eq!(state_of(&fut), r#"ResponseFuture { state: "rejected" }"#);
    let Poll::Ready(Ok(res)) = poll_once(&mut fut) else {
        panic!("a rejection is ready at once");
    };
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(handler.runs(), 0);
}

#[tokio::test]
async fn acquiring_then_calling_then_releasing() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let mut svc =
        RedlockLayer::new(lock.clone(), Header::new(KEY)).layer(handler.service(StatusCode::OK));
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY));
    assert_eq!(layer.lock_name_for::<()>("a"), A.as_bytes());
    let mut fut = Box::pin(svc.call(request(Some("a"), "wait")));
    assert_eq!(state_of(&fut), r#"ResponseFuture { state: "acquiring" }"#);
    assert!(poll_once(&mut fut).is_pending());
    assert_eq!(state_of(&fut), r#"ResponseFuture { state: "calling" }"#);
    assert!(lock.is_locked(A), "held while the handler runs");
    handler.gate.notify_one();
    let res = fut.await.unwrap_or_else(|e| match e {});
    assert!(!lock.is_locked(A), "released before the response");
    assert!(!res.body().holds_lock());
    assert_eq!(bytes_of(res.into_body()).await, "Some(1)");
}

#[tokio::test]
async fn acquiring_then_rejected_for_busy_and_unavailable() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY));
    let svc = layer.layer(handler.service(StatusCode::OK));
    lock.fail_next_acquire(A, Failure::Busy);
    let res = svc
        .clone()
        .oneshot(request(Some("a"), ""))
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(res.status(), StatusCode::CONFLICT);
    lock.fail_next_acquire(A, Failure::Unavailable);
    let res = svc
        .clone()
        .oneshot(request(Some("a"), ""))
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let held = lock.acquire(A).await.unwrap_or_else(|e| panic!("{e}"));
    let res = svc
        .oneshot(request(Some("a"), ""))
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(handler.runs(), 0);
    let _ = held.release().await;
}

#[tokio::test]
async fn a_waiting_acquisition_dropped_leaves_nothing_held() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY))
        .wait(WaitPolicy::up_to(Duration::from_secs(60)));
    let mut svc = layer.layer(handler.service(StatusCode::OK));
    let held = lock.acquire(A).await.unwrap_or_else(|e| panic!("{e}"));
    let mut fut = Box::pin(svc.call(request(Some("a"), "")));
    assert!(poll_once(&mut fut).is_pending());
    assert_eq!(state_of(&fut), r#"ResponseFuture { state: "acquiring" }"#);
    drop(fut);
    let _ = held.release().await;
    assert!(!lock.is_locked(A));
    assert_eq!(handler.runs(), 0);
}

#[tokio::test]
async fn a_future_dropped_while_calling_releases() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let mut svc =
        RedlockLayer::new(lock.clone(), Header::new(KEY)).layer(handler.service(StatusCode::OK));
    let mut fut = Box::pin(svc.call(request(Some("a"), "wait")));
    assert!(poll_once(&mut fut).is_pending());
    assert!(lock.is_locked(A));
    drop(fut);
    assert!(!lock.is_locked(A), "the guard released on drop");
}

#[tokio::test]
async fn calling_then_lost_aborts_with_503() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY)).abort_on_loss(true);
    let mut svc = layer.layer(handler.service(StatusCode::OK));
    let mut fut = Box::pin(svc.call(request(Some("a"), "wait")));
    assert!(poll_once(&mut fut).is_pending());
    assert_eq!(state_of(&fut), r#"ResponseFuture { state: "calling" }"#);
    assert!(lock.lose(A));
    let Poll::Ready(Ok(res)) = poll_once(&mut fut) else {
        panic!("the loss answers at once");
    };
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Without abort on loss, the handler finishes.
    let mut svc =
        RedlockLayer::new(lock.clone(), Header::new(KEY)).layer(handler.service(StatusCode::OK));
    let mut fut = Box::pin(svc.call(request(Some("b"), "wait")));
    assert!(poll_once(&mut fut).is_pending());
    assert!(lock.lose("header:key b"));
    assert!(poll_once(&mut fut).is_pending(), "still calling");
    handler.gate.notify_one();
    assert_eq!(
        fut.await.unwrap_or_else(|e| match e {}).status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn an_inner_error_is_returned_after_the_release() {
    let lock = InMemoryLock::new();
    let inner = service_fn(|_req: Request<Full<Bytes>>| async {
        Err::<Response<Full<Bytes>>, &'static str>("inner failed")
    });
    let svc = RedlockLayer::new(lock.clone(), Header::new(KEY)).layer(inner);
    let out = svc.oneshot(request(Some("a"), "")).await;
    assert_eq!(out.err(), Some("inner failed"));
    assert!(!lock.is_locked(A));
}

#[tokio::test]
async fn body_end_release_holds_the_lock_in_the_body() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY)).release_on_body_end();
    let svc = layer.layer(handler.service(StatusCode::OK));
    let res = svc
        .clone()
        .oneshot(request(Some("a"), ""))
        .await
        .unwrap_or_else(|e| match e {});
    assert!(res.body().holds_lock() && lock.is_locked(A));
    assert_eq!(bytes_of(res.into_body()).await, "Some(1)");
    assert!(!lock.is_locked(A), "released at the body's end");
    // A body dropped unread releases too.
    let res = svc
        .oneshot(request(Some("a"), ""))
        .await
        .unwrap_or_else(|e| match e {});
    assert!(lock.is_locked(A));
    drop(res);
    assert!(!lock.is_locked(A));
}

#[tokio::test]
async fn a_kept_response_streams_its_record_then_a_retry_is_replayed() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY)).replay(Duration::from_secs(60));
    let svc = layer.layer(handler.service(StatusCode::CREATED));
    let res = svc
        .clone()
        .oneshot(request(Some("a"), "x"))
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(res.status(), StatusCode::CREATED);
    assert!(
        res.body().holds_lock(),
        "recording: held until the record is stored"
    );
    assert!(lock.record(A).is_none());
    assert_eq!(bytes_of(res.into_body()).await, "Some(1)");
    assert!(lock.record(A).is_some() && !lock.is_locked(A));
    // Acquiring finds the record: replayed, the handler not called.
    let mut fut = Box::pin(svc.clone().call(request(Some("a"), "x")));
    let res = loop {
        if let Poll::Ready(res) = poll_once(&mut fut) {
            break res.unwrap_or_else(|e| match e {});
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(bytes_of(res.into_body()).await, "Some(1)");
    assert_eq!(handler.runs(), 1);
    // Another body under the same key: 422.
    let res = svc
        .oneshot(request(Some("a"), "y"))
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn a_response_without_a_body_is_stored_before_it_goes_out() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY)).replay(Duration::from_secs(60));
    let svc = layer.layer(handler.service(StatusCode::NO_CONTENT));
    let res = svc
        .oneshot(request(Some("a"), "x"))
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert!(
        lock.record(A).is_some(),
        "stored before the response was handed out"
    );
    assert!(!res.body().holds_lock() && !lock.is_locked(A));
}

#[tokio::test]
async fn a_response_not_kept_is_released_as_usual() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY)).replay(Duration::from_secs(60));
    let svc = layer.layer(handler.service(StatusCode::INTERNAL_SERVER_ERROR));
    let res = svc
        .oneshot(request(Some("a"), "x"))
        .await
        .unwrap_or_else(|e| match e {});
    assert!(!res.body().holds_lock() && !lock.is_locked(A));
    assert!(lock.record(A).is_none(), "a 500 is not kept");
}

/// A request body fed by the test, frame by frame.
struct Fed(mpsc::UnboundedReceiver<Bytes>);

impl Body for Fed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

#[tokio::test]
async fn reading_the_body_comes_before_acquiring() {
    let lock = InMemoryLock::new();
    let handler = Handler::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY)).replay(Duration::from_secs(60));
    let mut svc = layer.layer(handler.service::<crate::layer::PrefixedBody<Fed>>(StatusCode::OK));
    let (tx, rx) = mpsc::unbounded_channel();
    let req = Request::post("/work")
        .header(KEY, "a")
        .body(Fed(rx))
        .unwrap_or_else(|_| unreachable!("a valid request"));
    let mut fut = Box::pin(svc.call(req));
    assert!(poll_once(&mut fut).is_pending());
    assert_eq!(
        state_of(&fut),
        r#"ResponseFuture { state: "reading the request body" }"#
    );
    assert!(!lock.is_locked(A), "nothing held while the body is read");
    let _ = tx.send(Bytes::from_static(b"x"));
    drop(tx);
    let res = fut.await.unwrap_or_else(|e| match e {});
    assert_eq!(res.status(), StatusCode::OK);
    let _: &ResponseBody<Full<Bytes>, InMemoryLock> = res.body();
    assert_eq!(bytes_of(res.into_body()).await, "Some(1)");
    assert!(lock.record(A).is_some());
}
