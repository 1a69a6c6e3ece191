//! The in-memory lock of the `testing` feature, used the way a user tests an axum handler
//! behind `RedlockLayer`: no Redis server anywhere, `tower::ServiceExt::oneshot` on the
//! router, and failure injection for the 409, 503 and lost-lock paths.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, Response, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use http_body_util::BodyExt;
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_redlock::layer::{Header, WaitPolicy};
use tower_redlock::testing::{Failure, InMemoryLock};
use tower_redlock::{LockToken, LostReason, RedlockLayer};

const KEY: &str = "idempotency-key";

/// What the handler saw: how often it ran, and a gate it waits on when asked to.
#[derive(Clone, Default)]
struct Seen {
    runs: Arc<AtomicUsize>,
    gate: Arc<Notify>,
    entered: Arc<Notify>,
    lost: Arc<std::sync::Mutex<Option<LostReason>>>,
    token: Arc<std::sync::Mutex<Option<LockToken>>>,
}

impl Seen {
    /// Whether the token of the handler waiting on the gate is held now.
    async fn token_held_at_end(&self) -> bool {
        let token = self.token.lock().unwrap().clone();
        token.expect("a handler is waiting").is_held()
    }
}

/// Answers with its fencing number; a body of "wait" makes it wait on the gate first
/// (noting a loss it sees meanwhile).
async fn handler(State(seen): State<Seen>, token: LockToken, body: String) -> String {
    seen.runs.fetch_add(1, Ordering::SeqCst);
    if body == "wait" {
        *seen.token.lock().unwrap() = Some(token.clone());
        seen.entered.notify_one();
        tokio::select! {
            reason = token.lost() => *seen.lost.lock().unwrap() = Some(reason),
            () = seen.gate.notified() => {}
        }
    }
    format!("fenced {:?} body {body}", token.fencing_token())
}

fn app<L>(layer: L, seen: &Seen) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request<Body>> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<Request<Body>>>::Response: axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<Request<Body>>>::Error: Into<std::convert::Infallible> + 'static,
    <L::Service as tower::Service<Request<Body>>>::Future: Send + 'static,
{
    Router::new()
        .route("/charge", post(handler))
        .with_state(seen.clone())
        .layer(layer)
}

/// The lock name the layers here take for the key `key`: their namespace (the header's),
/// a space, the key; computed as a user's test would.
fn name_of(key: &str) -> Vec<u8> {
    RedlockLayer::new(InMemoryLock::new(), Header::new(KEY)).lock_name_for::<Body>(key)
}

fn request(key: &str, body: &str) -> Request<Body> {
    Request::post("/charge")
        .header(KEY, key)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

async fn text(response: Response<Body>) -> (StatusCode, String) {
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn a_handler_gets_its_lock_and_increasing_fencing_numbers() {
    let lock = InMemoryLock::new();
    let seen = Seen::default();
    let app = app(RedlockLayer::new(lock.clone(), Header::new(KEY)), &seen);
    for n in 1..=3u64 {
        let (status, body) =
            text(app.clone().oneshot(request("order-1", "x")).await.unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, format!("fenced Some({n}) body x"));
    }
    assert!(
        !lock.is_locked(name_of("order-1")),
        "released after each response"
    );
    let plain = app_without_fencing(&lock, &seen);
    let (_, body) = text(plain.oneshot(request("order-1", "x")).await.unwrap()).await;
    assert_eq!(body, "fenced None body x");
}

fn app_without_fencing(lock: &InMemoryLock, seen: &Seen) -> Router {
    app(
        RedlockLayer::new(lock.clone(), Header::new(KEY)).fencing(false),
        seen,
    )
}

#[tokio::test]
async fn busy_and_unavailable_answers_come_from_injected_failures() {
    let lock = InMemoryLock::new();
    let seen = Seen::default();
    let app = app(RedlockLayer::new(lock.clone(), Header::new(KEY)), &seen);

    lock.fail_next_acquire(name_of("order-1"), Failure::Busy);
    lock.fail_next_acquire(name_of("order-1"), Failure::Unavailable);
    let busy = app.clone().oneshot(request("order-1", "x")).await.unwrap();
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    let down = app.clone().oneshot(request("order-1", "x")).await.unwrap();
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Other names, and the next request, are not affected.
    let ok = app.clone().oneshot(request("order-1", "x")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);

    lock.set_unavailable(true);
    let down = app.clone().oneshot(request("order-2", "x")).await.unwrap();
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    lock.set_unavailable(false);
    let ok = app.oneshot(request("order-2", "x")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(
        seen.runs.load(Ordering::SeqCst),
        2,
        "rejected requests never ran"
    );
}

#[tokio::test]
async fn another_holder_makes_requests_busy_until_it_releases() {
    let lock = InMemoryLock::new();
    let seen = Seen::default();
    let app = app(RedlockLayer::new(lock.clone(), Header::new(KEY)), &seen);
    let other = lock.acquire(name_of("order-1")).await.unwrap();
    let busy = app.clone().oneshot(request("order-1", "x")).await.unwrap();
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    let _ = other.release().await;
    let ok = app.oneshot(request("order-1", "x")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_waiting_request_gets_the_lock_when_the_holder_releases() {
    let lock = InMemoryLock::new();
    let seen = Seen::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY))
        .wait(WaitPolicy::up_to(Duration::from_secs(30)));
    let app = app(layer, &seen);
    let other = lock.acquire(name_of("order-1")).await.unwrap();
    let waiting = tokio::spawn(app.oneshot(request("order-1", "x")));
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    let _ = other.release().await;
    let response = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_lost_lock_aborts_the_request_with_503() {
    let lock = InMemoryLock::new();
    let seen = Seen::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY)).abort_on_loss(true);
    let app = app(layer, &seen);
    let call = tokio::spawn(app.oneshot(request("order-1", "wait")));
    seen.entered.notified().await;
    assert!(lock.is_locked(name_of("order-1")));
    assert!(lock.lose(name_of("order-1")));
    let response = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("answered once the lock is lost")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!lock.lose(name_of("order-1")), "the name was freed");
}

#[tokio::test]
async fn a_handler_is_told_its_lock_is_lost() {
    let lock = InMemoryLock::new();
    let seen = Seen::default();
    let app = app(RedlockLayer::new(lock.clone(), Header::new(KEY)), &seen);
    let call = tokio::spawn(app.oneshot(request("order-1", "wait")));
    seen.entered.notified().await;
    lock.lose(name_of("order-1"));
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(matches!(
        seen.lost.lock().unwrap().clone(),
        Some(LostReason::ExtendFailed(_))
    ));
}

#[tokio::test]
async fn replay_answers_a_retry_with_the_stored_response() {
    let lock = InMemoryLock::new();
    let seen = Seen::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY)).replay(Duration::from_secs(60));
    let app = app(layer, &seen);
    let (status, first) = text(app.clone().oneshot(request("order-1", "a")).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(lock.record(name_of("order-1")).is_some());
    let (status, again) = text(app.clone().oneshot(request("order-1", "a")).await.unwrap()).await;
    assert_eq!((status, again.as_str()), (StatusCode::OK, first.as_str()));
    assert_eq!(
        seen.runs.load(Ordering::SeqCst),
        1,
        "the retry was replayed"
    );
    // The same key with another body is refused.
    let other = app.clone().oneshot(request("order-1", "b")).await.unwrap();
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // Without its record, the handler runs again.
    assert!(lock.forget_record(name_of("order-1")));
    let ok = app.oneshot(request("order-1", "a")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(seen.runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn bad_names_get_400_and_settle_nothing() {
    let lock = InMemoryLock::new();
    let seen = Seen::default();
    let app = app(RedlockLayer::new(lock.clone(), Header::new(KEY)), &seen);
    let empty = Request::post("/charge")
        .header(KEY, "")
        .body(Body::empty())
        .unwrap();
    let response = app.oneshot(empty).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(seen.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_lock_without_extension_runs_out_at_its_ttl() {
    let lock = InMemoryLock::new().with_ttl(Duration::from_millis(50));
    let other = lock.acquire("job").await.unwrap();
    // Guards from `acquire` are kept alive: still held after the TTL.
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(lock.is_locked("job") && other.is_held());
    drop(other);
    assert!(!lock.is_locked("job"), "dropping the guard releases");
    // Behind the layer without auto-extension the TTL applies: a handler outliving it
    // sees its token no longer held.
    let seen = Seen::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY)).auto_extend(false);
    let app = app(layer, &seen);
    let call = tokio::spawn(app.oneshot(request("job", "wait")));
    seen.entered.notified().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lock.is_locked(name_of("job")) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock never ran out"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !seen.token_held_at_end().await,
        "the handler's token is no longer held past the TTL"
    );
    seen.gate.notify_one();
    assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn releases_report_whether_the_lock_was_still_held() {
    let lock = InMemoryLock::new();
    let guard = lock.acquire("job").await.unwrap();
    let released = guard.release().await;
    assert_eq!((released.released(), released.not_held()), (1, 0));
    let guard = lock.acquire("job").await.unwrap();
    assert!(lock.lose("job"));
    let released = guard.release().await;
    assert_eq!((released.released(), released.not_held()), (0, 1));
}

#[tokio::test]
async fn ttls_are_checked_like_the_client_checks_them() {
    use tower_redlock::defaults::MAX_TTL;
    use tower_redlock::{ConfigError, LockError};
    let at_most = InMemoryLock::new().with_ttl(MAX_TTL);
    assert!(at_most.acquire("a").await.is_ok());
    let over = InMemoryLock::new().with_ttl(MAX_TTL + Duration::from_millis(1));
    assert!(matches!(
        over.acquire("a").await,
        Err(LockError::Config(ConfigError::TtlTooLong { .. }))
    ));
    let zero = InMemoryLock::new().with_ttl(Duration::ZERO);
    assert!(matches!(
        zero.acquire("a").await,
        Err(LockError::Config(ConfigError::ZeroTtl))
    ));
    // Names are checked as the client checks them.
    assert!(matches!(
        InMemoryLock::new().acquire("").await,
        Err(LockError::InvalidName { .. })
    ));
}

#[test]
fn a_record_or_a_name_is_private_to_its_lock() {
    let a = InMemoryLock::new();
    let b = InMemoryLock::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let _held = a.acquire("shared-name").await.unwrap();
        assert!(
            b.acquire("shared-name").await.is_ok(),
            "separate locks share nothing"
        );
        assert!(a.with_fencing(false).acquire("shared-name").await.is_err());
    });
}

#[tokio::test]
async fn extension_handlers_see_the_token() {
    // `Extension<LockToken>` works as well as the `LockToken` extractor.
    async fn ext(Extension(token): Extension<LockToken>) -> String {
        format!("{}", token.is_held())
    }
    let lock = InMemoryLock::new();
    let app = Router::new()
        .route("/charge", post(ext))
        .layer(RedlockLayer::new(lock, Header::new(KEY)));
    let (status, body) = text(app.oneshot(request("k", "")).await.unwrap()).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "true"));
}

/// The in-memory lock behaves as Redis does: without auto-extension a token past its TTL
/// is lost (`Expired`), and `abort_on_loss` answers 503.
#[tokio::test]
async fn a_token_past_its_ttl_without_extension_is_lost_as_expired() {
    let lock = InMemoryLock::new().with_ttl(Duration::from_millis(50));
    let seen = Seen::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY)).auto_extend(false);
    let quiet = app(layer, &seen);
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        quiet.oneshot(request("job", "wait")),
    )
    .await
    .expect("the handler saw the loss")
    .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(seen.lost.lock().unwrap().clone(), Some(LostReason::Expired));

    let seen = Seen::default();
    let layer = RedlockLayer::new(lock.clone(), Header::new(KEY))
        .auto_extend(false)
        .abort_on_loss(true);
    let aborting = app(layer, &seen);
    let call = tokio::spawn(aborting.oneshot(request("job-2", "wait")));
    let response = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("answered once the lock ran out")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}
