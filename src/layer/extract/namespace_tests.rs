//! Unit tests of `namespace.rs`: how a layer's lock names are made of its namespace and
//! its extractor's names.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::Request;

use super::*;
use crate::RedlockLayer;
use crate::layer::{
    ExtractError, GrpcMethods, Header, PathParam, PathSegment, PerPrincipal, PerRoute, RequestHead,
    extract_fn,
};
use crate::testing::InMemoryLock;

/// The lock name a layer over `extractor` with namespace `ns` takes for `name`.
fn named<E: ExtractLockName<()>>(ns: &Namespace, extractor: &E, name: &[u8]) -> Vec<u8> {
    ns.lock_name::<(), E>(extractor, name.to_vec())
}

fn namespace_of<E: ExtractLockName<()>>(extractor: &E) -> String {
    extractor.namespace().into_owned()
}

#[test]
fn a_lock_name_is_the_namespace_a_space_and_the_name() {
    let header = Header::new("x-id");
    assert_eq!(
        named(&Namespace::named("hooks"), &header, b"46"),
        b"hooks 46"
    );
    assert_eq!(
        named(&Namespace::from_extractor(), &header, b"46"),
        b"header:x-id 46"
    );
    assert_eq!(
        named(&Namespace::named("hooks"), &header, b"a b"),
        b"hooks a b",
        "the name is taken as it is"
    );
}

#[test]
fn spaces_and_percent_signs_in_a_namespace_are_escaped() {
    let header = Header::new("x-id");
    assert_eq!(named(&Namespace::named("a b"), &header, b"c"), b"a%20b c");
    assert_eq!(named(&Namespace::named("100%"), &header, b"c"), b"100%25 c");
    assert_eq!(
        named(&Namespace::named("a%20b"), &header, b"c"),
        b"a%2520b c"
    );
    // Every split of "a b c" into a namespace and a name gives its own lock name.
    let splits = [("a", "b c"), ("a b", "c"), ("a%20b", "c"), ("a", "b%20c")];
    let mut names: Vec<Vec<u8>> = splits
        .iter()
        .map(|(ns, name)| named(&Namespace::named(ns), &header, name.as_bytes()))
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), splits.len(), "{names:?}");
}

#[test]
fn the_empty_namespace_is_the_extractors_name_as_it_is() {
    let header = Header::new("x-id");
    assert_eq!(named(&Namespace::named(""), &header, b"46"), b"46");
    assert_eq!(named(&Namespace::named(""), &header, b"a b"), b"a b");
    // An extractor whose own namespace is empty: no namespace either.
    let bare = Custom::new("");
    assert_eq!(named(&Namespace::from_extractor(), &bare, b"46"), b"46");
}

#[test]
fn an_empty_name_stays_empty_so_the_lock_refuses_it() {
    let header = Header::new("x-id");
    assert_eq!(named(&Namespace::named("hooks"), &header, b""), b"");
    assert_eq!(named(&Namespace::from_extractor(), &header, b""), b"");
}

#[test]
fn each_stock_extractor_names_its_namespace() {
    assert_eq!(
        namespace_of(&Header::new("X-Delivery-Id")),
        "header:x-delivery-id"
    );
    assert_eq!(
        namespace_of(&Header::new("Idempotency-Key").required()),
        "header:idempotency-key"
    );
    assert_eq!(
        namespace_of(&Header::new("not a header")),
        "header:not a header"
    );
    assert_eq!(namespace_of(&PathSegment::new(1)), "path-segment:1");
    assert_eq!(
        namespace_of(&PathParam::new("/accounts/{id}/credit", "id")),
        "path:/accounts/{id}/credit#id"
    );
    assert_eq!(
        namespace_of(&PathParam::new("/webhooks/{provider}/{id}", "provider")),
        "path:/webhooks/{provider}/{id}#provider"
    );
    assert_eq!(
        namespace_of(&PathParam::new("/accounts/{id}", "missing")),
        "path:/accounts/{id}#missing"
    );
    assert_eq!(namespace_of(&PathParam::new("/", "id")), "path:/#id");
    let by_query =
        extract_fn(|head: &RequestHead<'_>| Ok(head.uri.query().map(|q| q.as_bytes().to_vec())));
    assert_eq!(namespace_of(&by_query), "fn");
    assert_eq!(namespace_of(&Custom::new("tenant")), "tenant");
    assert_eq!(namespace_of(&Unnamed), "fn", "the trait's default");
}

#[cfg(feature = "json")]
#[test]
fn body_keys_and_webhook_presets_name_their_namespace() {
    use crate::layer::{BodyKey, webhook};
    assert_eq!(namespace_of(&BodyKey::json("id")), "body:/id");
    assert_eq!(
        namespace_of(&BodyKey::json("data.object.id")),
        "body:/data/object/id"
    );
    assert_eq!(namespace_of(&BodyKey::from_fn(|_| Ok(None))), "body:fn");
    assert_eq!(namespace_of(&webhook::stripe()), "body:/id");
    assert_eq!(namespace_of(&webhook::github()), "header:x-github-delivery");
    assert_eq!(
        namespace_of(&webhook::shopify()),
        "header:x-shopify-event-id"
    );
    assert_eq!(namespace_of(&webhook::standard()), "header:webhook-id");
    assert_eq!(namespace_of(&webhook::svix()), "header:svix-id");
}

#[test]
fn wrappers_keep_their_inner_extractors_namespace() {
    let key = || Header::new("idempotency-key");
    assert_eq!(
        namespace_of(&PerRoute::new(key())),
        "header:idempotency-key"
    );
    assert_eq!(
        namespace_of(&PerPrincipal::new(key())),
        "header:idempotency-key"
    );
    assert_eq!(
        namespace_of(&GrpcMethods::new(key()).service("pay.Payments")),
        "header:idempotency-key"
    );
}

#[test]
fn per_route_keeps_its_route_scoping_inside_the_namespace() {
    let lock = InMemoryLock::new();
    let routed = RedlockLayer::new(lock.clone(), PerRoute::new(Header::new("idempotency-key")));
    let req = Request::post("/orders")
        .header("idempotency-key", "k-1")
        .body(())
        .unwrap_or_default();
    let name = routed
        .extractor
        .extract(&req)
        .ok()
        .flatten()
        .unwrap_or_default();
    assert_eq!(name, b"POST /orders k-1");
    assert_eq!(
        routed.lock_name_for::<()>(&name),
        b"header:idempotency-key POST /orders k-1"
    );
    let named = routed.namespace("orders");
    assert_eq!(named.lock_name_for::<()>(&name), b"orders POST /orders k-1");
}

#[test]
fn the_extractors_namespace_is_asked_once_per_layer() {
    let lock = InMemoryLock::new();
    let extractor = Custom::new("tenant");
    let layer = RedlockLayer::new(lock, extractor);
    let clone = layer.clone();
    for _ in 0..3 {
        assert_eq!(layer.lock_name_for::<()>("a"), b"tenant a");
        assert_eq!(clone.lock_name_for::<()>("a"), b"tenant a");
    }
    assert_eq!(layer.extractor.asked.load(Ordering::SeqCst), 1);
    // A namespace given to the layer is not asked for.
    let named = RedlockLayer::new(InMemoryLock::new(), Custom::new("tenant")).namespace("t");
    assert_eq!(named.lock_name_for::<()>("a"), b"t a");
    assert_eq!(named.extractor.asked.load(Ordering::SeqCst), 0);
}

#[test]
fn the_debug_output_shows_the_namespace() {
    let named = Namespace::named("a b");
    assert_eq!(format!("{named:?}"), r#""a%20b""#);
    let derived = Namespace::from_extractor();
    assert_eq!(format!("{derived:?}"), "the extractor's");
    let _ = named_from(&derived);
    assert_eq!(format!("{derived:?}"), r#""header:x-id" (the extractor's)"#);
}

fn named_from(ns: &Namespace) -> Vec<u8> {
    named(ns, &Header::new("x-id"), b"1")
}

/// An extractor that keeps the trait's default namespace.
struct Unnamed;

impl<B> ExtractLockName<B> for Unnamed {
    fn extract(&self, _: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
        Ok(None)
    }
}

/// An extractor with its own namespace, counting how often it is asked for it.
#[derive(Clone)]
struct Custom {
    namespace: &'static str,
    asked: std::sync::Arc<AtomicUsize>,
}

impl Custom {
    fn new(namespace: &'static str) -> Self {
        Self {
            namespace,
            asked: std::sync::Arc::default(),
        }
    }
}

impl<B> ExtractLockName<B> for Custom {
    fn extract(&self, _: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
        Ok(None)
    }

    fn namespace(&self) -> Cow<'_, str> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Cow::Borrowed(self.namespace)
    }
}
