//! The README's least-privilege ACL lines, exactly as written, one deployment at a time
//! (plain masters, Sentinel-managed masters, a Redis Cluster): a user with nothing more
//! than its line locks, extends, releases, gets fencing numbers, has a finished request
//! replayed, wakes a waiter of another client, passes a health check, and leaves the
//! servers' `ACL LOG` empty (nothing it ran was refused). Real servers, restart quarantine
//! on.

use crate::support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use support::{Cluster, query_port, wait_for};
use tower::{Layer, ServiceExt, service_fn};
use tower_redlock::layer::{Header, PrefixedBody};
use tower_redlock::{NodeConfig, Redlock, RedlockLayer};

const TTL: Duration = Duration::from_secs(1);

/// The README's ACL line that starts with `start`, as words after `ACL`.
fn readme_rule(start: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let line = readme
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("the README has an ACL line starting with {start:?}"));
    line.split_whitespace().skip(1).map(str::to_owned).collect()
}

/// The line for every lock node.
fn node_rule() -> Vec<String> {
    readme_rule("ACL SETUSER locker on >secret resetkeys")
}

/// Runs `ACL <rule>` on the server at `port`.
fn apply(port: u16, rule: &[String]) {
    let mut acl = redis::cmd("ACL");
    for word in rule {
        acl.arg(word);
    }
    let done: Option<String> = query_port(port, &acl);
    assert_eq!(done.as_deref(), Some("OK"), "ACL {rule:?} on port {port}");
}

/// What the server at `port` refused user `locker` (its `ACL LOG`): the commands or keys.
/// `client|setinfo` (which redis-rs's connections send on Redis 7.2 and later, and the
/// README's lines leave out: Redis 7.0 refuses a rule that names it) is left out.
fn refused(port: u16) -> Vec<String> {
    let log: Vec<Vec<redis::Value>> =
        query_port(port, redis::cmd("ACL").arg("LOG")).expect("ACL LOG");
    log.into_iter()
        .filter_map(|entry| {
            let field = |name: &str| {
                entry
                    .chunks(2)
                    .find(|kv| {
                        redis::from_redis_value_ref::<String>(&kv[0])
                            .ok()
                            .as_deref()
                            == Some(name)
                    })
                    .and_then(|kv| redis::from_redis_value_ref::<String>(&kv[1]).ok())
            };
            let object = field("object").unwrap_or_default();
            let ours = field("username").as_deref() == Some("locker");
            (ours && object != "client|setinfo")
                .then(|| format!("{object} ({})", field("reason").unwrap_or_default()))
        })
        .collect()
}

/// Whether the server at `port` has a subscriber to the lock key of `name` (a waiter).
fn subscribed(port: u16, name: &str) -> bool {
    let counts: Option<(String, u64)> = query_port(
        port,
        redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(format!("redlock:{{{name}}}")),
    );
    counts.is_some_and(|(_, n)| n > 0)
}

/// Everything a user does with a client over `nodes`: lock, extend, release, fencing, a
/// waiter of another client woken by the release, health, and a replayed request. With
/// `subscriber`, the port of the server where the waiter subscribes (none on a cluster,
/// whose waiters poll).
async fn exercise(nodes: impl Fn() -> Vec<NodeConfig>, subscriber: Option<u16>) {
    let build = || {
        Redlock::builder(nodes())
            .ttl(TTL)
            .node_timeout(Duration::from_millis(100))
            .build()
            .expect("build")
    };
    let (redlock, other) = (build(), build());
    wait_for("every node usable", Duration::from_secs(10), || async {
        redlock.health().await.ready() && other.health().await.ready()
    })
    .await;
    let mut lock = redlock.lock("acl-job").await.expect("lock");
    let first = lock.fencing_token().expect("a fencing number");
    redlock.extend(&mut lock, TTL).await.expect("extend");
    assert_eq!(redlock.unlock(&lock).await.released(), redlock.node_count());
    let held = redlock.lock("acl-job").await.expect("lock again");
    assert!(held.fencing_token() > Some(first), "fencing numbers grow");
    // A waiter of another client, woken by the release (or polling a cluster node).
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            other
                .lock_until("acl-job", TTL, std::time::Instant::now() + TTL * 5)
                .await
        }
    });
    if let Some(port) = subscriber {
        wait_for("the waiter subscribed", Duration::from_secs(5), || {
            let on = subscribed(port, "acl-job");
            async move { on }
        })
        .await;
    }
    let _ = redlock.unlock(&held).await;
    let taken = waiter
        .await
        .expect("task")
        .expect("the waiter gets the lock");
    let _ = other.unlock(&taken).await;

    // A finished request replayed: the handler runs once per key.
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = RedlockLayer::new(redlock.clone(), Header::new("idempotency-key").required())
        .replay(Duration::from_secs(60))
        .layer(service_fn({
            let runs = Arc::clone(&runs);
            move |_: Request<PrefixedBody<Full<Bytes>>>| {
                let runs = Arc::clone(&runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("paid"))))
                }
            }
        }));
    for attempt in 0..2 {
        let res = svc
            .clone()
            .oneshot(
                Request::post("/pay")
                    .header("idempotency-key", "\"acl-pay-1\"")
                    .body(Full::default())
                    .expect("request"),
            )
            .await
            .expect("response");
        assert_eq!(res.status(), 200, "attempt {attempt}");
        let replayed = res.headers().get("idempotent-replayed").is_some();
        assert_eq!(replayed, attempt == 1, "attempt {attempt}");
        let body = res.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"paid");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_line_for_plain_masters_is_enough() {
    let servers = Cluster::start(3);
    for node in &servers.nodes {
        apply(node.port(), &node_rule());
    }
    servers.age_ledgers();
    let urls: Vec<String> = servers
        .nodes
        .iter()
        .map(|n| format!("redis://locker:secret@127.0.0.1:{}", n.port()))
        .collect();
    let first = servers.nodes[0].port();
    exercise(|| urls.iter().map(NodeConfig::from).collect(), Some(first)).await;
    for node in &servers.nodes {
        assert_eq!(
            refused(node.port()),
            Vec::<String>::new(),
            "ACL LOG of {}",
            node.port()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_lines_for_sentinel_managed_masters_are_enough() {
    use support::sentinel::SentinelNode;

    let node = tokio::task::block_in_place(|| SentinelNode::start("locks-acl"));
    for port in [node.master.port(), node.replica.port()] {
        apply(port, &node_rule());
    }
    let sentinel_port: u16 = node
        .sentinel_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the sentinel's port");
    apply(
        sentinel_port,
        &readme_rule("ACL SETUSER locker on >secret -@all +sentinel"),
    );
    tokio::task::block_in_place(|| node.age_ledgers());
    let sentinel = format!("redis://locker:secret@127.0.0.1:{sentinel_port}");
    let master: redis::ConnectionInfo = "redis://locker:secret@127.0.0.1:6379"
        .parse()
        .expect("master settings");
    exercise(
        || {
            vec![
                NodeConfig::sentinel([sentinel.clone()], node.name.clone())
                    .master_settings(master.clone()),
            ]
        },
        Some(node.master.port()),
    )
    .await;
    for port in [node.master.port(), node.replica.port(), sentinel_port] {
        assert_eq!(refused(port), Vec::<String>::new(), "ACL LOG of {port}");
    }
}

#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_lines_for_a_redis_cluster_are_enough() {
    use support::cluster::RedisCluster;

    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let extra = readme_rule("ACL SETUSER locker +cluster");
    for m in &cluster.masters {
        apply(m.port(), &node_rule());
        apply(m.port(), &extra);
    }
    tokio::task::block_in_place(|| cluster.age_ledgers());
    let seeds: Vec<String> = cluster
        .masters
        .iter()
        .map(|m| format!("redis://locker:secret@127.0.0.1:{}", m.port()))
        .collect();
    exercise(|| vec![NodeConfig::cluster(seeds.clone())], None).await;
    for m in &cluster.masters {
        assert_eq!(
            refused(m.port()),
            Vec::<String>::new(),
            "ACL LOG of {}",
            m.port()
        );
    }
}
