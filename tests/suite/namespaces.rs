//! Each layer its own namespace (issue 43, item 3), over real Redis nodes: two layers on
//! one client whose ids coincide never meet unless they are given one namespace; within
//! one layer a key is one name on every route unless `PerRoute` scopes it; a layer with no
//! namespace locks exactly the names a job locks with `Redlock::lock`.

use crate::support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::response::IntoResponse;
use axum::routing::{Route, post};
use support::http::{http1, post as post_req, send, serve};
use support::{Cluster, in_namespace, key_of};
use tower_redlock::layer::{ExtractError, Header, PathParam, PerRoute, RequestHead, extract_fn};
use tower_redlock::{LockToken, Redlock, RedlockLayer};

const DELIVERY: &str = "x-delivery-id";
const ACCOUNT_ROUTE: &str = "/accounts/{id}/credit";
const DAY: Duration = Duration::from_secs(24 * 3600);

async fn redlock(cluster: &Cluster) -> Redlock {
    cluster.client(|b| b.ttl(Duration::from_secs(30))).await
}

/// A handler that counts its runs and answers with its lock's name.
fn counted(runs: &Arc<AtomicUsize>) -> axum::routing::MethodRouter {
    let runs = Arc::clone(runs);
    post(move |token: LockToken| {
        let runs = Arc::clone(&runs);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            String::from_utf8_lossy(token.name()).into_owned()
        }
    })
}

/// The user's application: a webhook receiver keyed by the delivery id, with replay, and
/// an account route keyed by the path's account id, both on one client; `shared` gives
/// both layers that one namespace. The runs of each handler.
fn webhook_and_accounts(
    redlock: &Redlock,
    shared: Option<&str>,
) -> (Router, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (hooks, credits) = (Arc::default(), Arc::default());
    let mut webhook =
        RedlockLayer::new(redlock.clone(), Header::new(DELIVERY).required()).replay(DAY);
    let mut account = RedlockLayer::new(redlock.clone(), PathParam::new(ACCOUNT_ROUTE, "id"));
    if let Some(ns) = shared {
        webhook = webhook.namespace(ns);
        account = account.namespace(ns);
    }
    let app = Router::new()
        .route("/webhook", counted(&hooks))
        .route_layer(webhook)
        .merge(
            Router::new()
                .route(ACCOUNT_ROUTE, counted(&credits))
                .route_layer(account),
        );
    (app, hooks, credits)
}

/// The case: delivery 46 finished (its response kept for a day under its name),
/// then account 46 is credited: its own namespace, so it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_delivery_does_not_lock_the_account_with_the_same_id() {
    let cluster = Cluster::start(3);
    let (app, hooks, credits) = webhook_and_accounts(&redlock(&cluster).await, None);
    let addr = serve(app).await;
    let client = http1();

    let delivered = send(&client, post_req(addr, "/webhook", Some((DELIVERY, "46")))).await;
    let delivery_name = in_namespace("header:x-delivery-id", "46");
    assert_eq!(
        (delivered.status.as_u16(), &delivered.body),
        (200, &delivery_name)
    );
    assert_eq!(
        cluster.nodes_holding(key_of(&delivery_name)).await,
        3,
        "the delivery's record is kept"
    );

    let credited = send(&client, post_req(addr, "/accounts/46/credit", None)).await;
    assert_eq!(
        (credited.status.as_u16(), credited.body.as_str()),
        (200, "path:/accounts/{id}/credit#id 46"),
        "the account's request runs under a name of its own"
    );
    assert_eq!(credits.load(Ordering::SeqCst), 1);
    // The delivery is still answered from its record.
    let again = send(&client, post_req(addr, "/webhook", Some((DELIVERY, "46")))).await;
    assert!(again.replayed(), "{}", again.body);
    assert_eq!(hooks.load(Ordering::SeqCst), 1);
}

/// Sharing is opt-in: the same two layers given one namespace lock one name for id 46,
/// and the account's request finds the delivery's record there: busy (409), not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_given_one_namespace_share_their_names() {
    let cluster = Cluster::start(3);
    let (app, hooks, credits) = webhook_and_accounts(&redlock(&cluster).await, Some("shared"));
    let addr = serve(app).await;
    let client = http1();

    let delivered = send(&client, post_req(addr, "/webhook", Some((DELIVERY, "46")))).await;
    assert_eq!(
        (delivered.status.as_u16(), delivered.body.as_str()),
        (200, "shared 46")
    );
    let credited = send(&client, post_req(addr, "/accounts/46/credit", None)).await;
    assert_eq!(credited.status, 409, "{}", credited.body);
    assert!(
        credited.body.contains("locked by another request"),
        "{}",
        credited.body
    );
    assert_eq!(credits.load(Ordering::SeqCst), 0);
    // Another id is another name.
    let other = send(&client, post_req(addr, "/accounts/47/credit", None)).await;
    assert_eq!(
        (other.status.as_u16(), other.body.as_str()),
        (200, "shared 47")
    );
    assert_eq!(
        (hooks.load(Ordering::SeqCst), credits.load(Ordering::SeqCst)),
        (1, 1)
    );
}

/// Two routes, `/a` and `/b`, behind one `layer`, their handler's runs counted together.
fn two_routes<L>(layer: L) -> (Router, Arc<AtomicUsize>)
where
    L: tower::Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request<Body>> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<Request<Body>>>::Response: IntoResponse + 'static,
    <L::Service as tower::Service<Request<Body>>>::Error: Into<Infallible> + 'static,
    <L::Service as tower::Service<Request<Body>>>::Future: Send + 'static,
{
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/a", counted(&runs))
        .route("/b", counted(&runs))
        .route_layer(layer);
    (app, runs)
}

/// Within one layer a key is one name on all its routes, as before: with replay, the
/// same key on another route is a reused key (422). `PerRoute` scopes keys to routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn within_one_layer_a_key_on_another_route_is_reused_unless_scoped_by_route() {
    let cluster = Cluster::start(3);
    let redlock = redlock(&cluster).await;
    let client = http1();
    let key = ("idempotency-key", "k-1");
    let one = RedlockLayer::new(redlock.clone(), Header::new("Idempotency-Key")).replay(DAY);
    let (app, runs) = two_routes(one);
    let addr = serve(app).await;
    let first = send(&client, post_req(addr, "/a", Some(key))).await;
    assert_eq!(
        (first.status.as_u16(), first.body.as_str()),
        (200, "header:idempotency-key k-1")
    );
    let other = send(&client, post_req(addr, "/b", Some(key))).await;
    assert_eq!(other.status, 422, "{}", other.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let scoped =
        RedlockLayer::new(redlock, PerRoute::new(Header::new("Idempotency-Key"))).replay(DAY);
    let (app, runs) = two_routes(scoped);
    let addr = serve(app).await;
    for path in ["/a", "/b"] {
        let reply = send(&client, post_req(addr, path, Some(key))).await;
        assert_eq!(
            (reply.status.as_u16(), reply.body),
            (200, format!("header:idempotency-key POST {path} k-1")),
            "the route's scope inside the namespace"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// `account:{id}`, from the path `/accounts/{id}/...`.
fn account(head: &RequestHead<'_>) -> Result<Option<Vec<u8>>, ExtractError> {
    let id = head.uri.path().split('/').nth(2).unwrap_or_default();
    Ok((!id.is_empty()).then(|| format!("account:{id}").into_bytes()))
}

/// With no namespace the layer locks the extractor's names as they are, the names a job
/// locks directly; by default (a closure's namespace, `fn`) it does not meet the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_namespace_the_layer_locks_what_a_job_locks_directly() {
    let cluster = Cluster::start(3);
    let redlock = redlock(&cluster).await;
    let client = http1();
    let runs = Arc::new(AtomicUsize::new(0));
    let bare = Router::new()
        .route(ACCOUNT_ROUTE, counted(&runs))
        .route_layer(RedlockLayer::new(redlock.clone(), extract_fn(account)).namespace(""));
    let bare = serve(bare).await;
    let named = Router::new()
        .route(ACCOUNT_ROUTE, counted(&runs))
        .route_layer(RedlockLayer::new(redlock.clone(), extract_fn(account)));
    let named = serve(named).await;

    let job = redlock.lock("account:7").await.expect("the job's lock");
    let busy = send(&client, post_req(bare, "/accounts/7/credit", None)).await;
    assert_eq!(busy.status, 409, "{}", busy.body);
    let apart = send(&client, post_req(named, "/accounts/7/credit", None)).await;
    assert_eq!(
        (apart.status.as_u16(), apart.body.as_str()),
        (200, "fn account:7")
    );
    assert!(redlock.unlock(&job).await.released() >= 2);
    let free = send(&client, post_req(bare, "/accounts/7/credit", None)).await;
    assert_eq!(
        (free.status.as_u16(), free.body.as_str()),
        (200, "account:7")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
