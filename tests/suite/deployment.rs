//! What the client says about how a node is run, against real Redis nodes.

use crate::support;

use support::{CapturedLogs, RedisNode};
use tower_redlock::{LockError, NodeError};

/// A node with a memory limit and a policy that evicts keys is refused by default, with
/// the typed error in the no-quorum error (and a message that says what to set); with
/// `allow_eviction(true)` it is used, with one warning per client that names the policy
/// and the fix; a node without a memory limit evicts nothing and is used without a word,
/// whatever its policy.
#[tokio::test]
async fn a_node_that_may_evict_keys_is_refused_unless_allowed() {
    let evicting = RedisNode::start_with_args(
        None,
        ["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"]
            .map(String::from)
            .to_vec(),
    );
    let unlimited = RedisNode::start_with_args(
        None,
        vec!["--maxmemory-policy".into(), "allkeys-lru".into()],
    );
    let safe = [RedisNode::start(), RedisNode::start()];
    let logs = CapturedLogs::start();

    let refused = support::builder([evicting.url()])
        .max_attempts(1)
        .build()
        .expect("build");
    let error = refused.lock("evicting").await.expect_err("refused");
    let LockError::NoQuorum { failures, .. } = &error else {
        panic!("not a no-quorum error: {error:?}");
    };
    assert!(
        failures.iter().any(|f| f.node == evicting.addr()
            && f.error
                == NodeError::Evicting {
                    policy: "volatile-lru".into()
                }),
        "{error:?}"
    );
    let message = failures[0].to_string();
    assert!(message.contains("maxmemory-policy noeviction"), "{message}");
    assert!(message.contains("allow_eviction"), "{message}");

    // A quorum without it still locks; the refused node is listed nowhere else.
    let three = support::builder([evicting.url(), safe[0].url(), safe[1].url()])
        .build()
        .expect("build");
    support::warm(&three).await;

    let allowed = support::builder([evicting.url(), safe[0].url(), safe[1].url()])
        .allow_eviction(true)
        .build()
        .expect("build");
    support::warm(&allowed).await;
    let lock = allowed.lock("evicting").await.expect("lock");
    assert_eq!(
        allowed.unlock(&lock).await.released(),
        3,
        "every node took it"
    );
    // Another client: its own connections, its own warning.
    let again = support::builder([evicting.url()])
        .allow_eviction(true)
        .build()
        .expect("build");
    support::warm(&again).await;

    let no_limit = support::builder([unlimited.url()]).build().expect("build");
    support::warm(&no_limit).await;

    let text = logs.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("maxmemory-policy is not noeviction"))
        .collect();
    assert_eq!(
        warnings.len(),
        2,
        "one per allowing client and evicting node: {text}"
    );
    for line in warnings {
        assert!(line.contains(&evicting.addr()), "{line}");
        assert!(line.contains("volatile-lru"), "{line}");
        assert!(line.contains("set maxmemory-policy noeviction"), "{line}");
    }
    assert!(
        !text
            .lines()
            .any(|l| l.contains(&unlimited.addr()) && l.contains("evict")),
        "a node without a memory limit evicts nothing: {text}"
    );
}

/// Nodes given as `redis::ConnectionInfo`s with TCP settings (keep-alive, linger, user
/// timeout) lock, extend and unlock over the crate's own connection, which applies them
/// (`src/node/wire/open.rs` reads them back from the socket).
#[tokio::test]
async fn nodes_with_tcp_settings_in_their_connection_info_lock() {
    use std::time::Duration;

    use redis::io::tcp::{TcpSettings, socket2::TcpKeepalive};

    let nodes = [RedisNode::start(), RedisNode::start(), RedisNode::start()];
    let settings = TcpSettings::default()
        .set_keepalive(
            TcpKeepalive::new()
                .with_time(Duration::from_secs(60))
                .with_interval(Duration::from_secs(10)),
        )
        .set_linger_time(Duration::from_secs(1));
    #[cfg(target_os = "linux")]
    let settings = settings.set_user_timeout(Duration::from_secs(30));
    let infos = nodes.iter().map(|node| {
        node.url()
            .parse::<redis::ConnectionInfo>()
            .expect("connection info")
            .set_tcp_settings(settings.clone())
    });
    let redlock = support::builder(infos)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("build");
    let mut lock = redlock.lock("tcp-settings").await.expect("lock");
    redlock
        .extend(&mut lock, Duration::from_secs(10))
        .await
        .expect("extend");
    assert_eq!(redlock.unlock(&lock).await.released(), 3);
}

/// Whether a node keeps an append-only file is visible: `health()` tells it for each node
/// (and follows a `CONFIG SET appendonly yes` at the next check), and a replay layer whose
/// nodes run without one warns once per node, naming the node, whatever the traffic.
#[tokio::test]
async fn nodes_without_an_append_only_file_are_shown_and_warned_about_once_by_replay() {
    use tower::{Layer, ServiceExt, service_fn};
    let nodes = [
        RedisNode::start(),
        RedisNode::start_with_args(None, vec!["--appendonly".into(), "yes".into()]),
        RedisNode::start(),
    ];
    let logs = CapturedLogs::start();
    let redlock = support::builder(nodes.iter().map(RedisNode::url))
        .restart_quarantine(false)
        .build()
        .expect("build");
    let append_only = |health: tower_redlock::Health| {
        health
            .nodes()
            .iter()
            .map(tower_redlock::NodeHealth::append_only)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        append_only(redlock.health().await),
        [Some(false), Some(true), Some(false)]
    );
    assert!(
        !logs.contains("without an append-only file"),
        "plain locking is not warned about"
    );

    let svc = tower_redlock::RedlockLayer::new(
        redlock.clone(),
        tower_redlock::layer::Header::new("idempotency-key"),
    )
    .replay(std::time::Duration::from_secs(60))
    .layer(service_fn(|_req: http::Request<_>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::from("done")))
    }));
    for key in ["a", "b", "a"] {
        let req = http::Request::post("/pay")
            .header("idempotency-key", key)
            .body(String::new())
            .expect("request");
        let res = svc.clone().oneshot(req).await.expect("response");
        assert_eq!(res.status(), 200);
        let _ = http_body_util::BodyExt::collect(res.into_body()).await;
    }
    let text = logs.text();
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("without an append-only file"))
        .collect();
    assert_eq!(warned.len(), 2, "once per node without one: {warned:#?}");
    for node in [&nodes[0], &nodes[2]] {
        assert!(
            warned.iter().any(|l| l.contains(&node.addr())),
            "{warned:#?}"
        );
    }

    let _: () = support::query_port(
        nodes[0].port(),
        redis::cmd("CONFIG").arg("SET").arg("appendonly").arg("yes"),
    )
    .expect("CONFIG SET appendonly yes");
    assert_eq!(
        append_only(redlock.health().await),
        [Some(true), Some(true), Some(false)]
    );
}

/// A node near its `maxmemory` (with `noeviction`, every write fails once it is full)
/// takes replay records without their response, so that locks keep working: a retry of
/// a request finished meanwhile gets 410 (completed, not kept), never a second run; once
/// the node has room again, records keep their response. Warned about when it starts.
#[tokio::test]
async fn a_node_near_its_maxmemory_refuses_responses_in_records_before_it_refuses_locks() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Layer, ServiceExt, service_fn};
    let nodes = [RedisNode::start(), RedisNode::start(), RedisNode::start()];
    let logs = CapturedLogs::start();
    let redlock = support::builder(nodes.iter().map(RedisNode::url))
        .build()
        .expect("build");
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = tower_redlock::RedlockLayer::new(
        redlock.clone(),
        tower_redlock::layer::Header::new("idempotency-key"),
    )
    .replay(std::time::Duration::from_secs(60))
    .layer(service_fn({
        let runs = Arc::clone(&runs);
        move |_req: http::Request<_>| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::convert::Infallible>(http::Response::new("x".repeat(32 << 10))) }
        }
    }));
    let send = |key: &'static str| {
        let svc = svc.clone();
        async move {
            let req = http::Request::post("/report")
                .header("idempotency-key", key)
                .body(String::new())
                .expect("request");
            let res = svc.oneshot(req).await.expect("response");
            let status = res.status().as_u16();
            let body = http_body_util::BodyExt::collect(res.into_body())
                .await
                .expect("body")
                .to_bytes();
            (status, body.len())
        }
    };
    let set_maxmemory = |bytes: u64| {
        for node in &nodes {
            let _: () = support::query_port(
                node.port(),
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("maxmemory")
                    .arg(bytes.to_string()),
            )
            .expect("CONFIG SET maxmemory");
        }
    };
    assert_eq!(send("roomy").await, (200, 32 << 10));
    assert_eq!(send("roomy").await, (200, 32 << 10), "replayed whole");

    // Each node at about 93 % of a limit just above what it uses now.
    let used = nodes
        .iter()
        .map(|node| {
            let info: String =
                support::query_port(node.port(), redis::cmd("INFO").arg("memory")).expect("INFO");
            info.lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .expect("used_memory")
        })
        .max()
        .expect("nodes");
    set_maxmemory(used * 100 / 93);
    let _ = redlock.health().await; // the check reads INFO memory
    assert!(
        logs.contains("near its maxmemory"),
        "warned: {}",
        logs.text()
    );
    let before = runs.load(Ordering::SeqCst);
    assert_eq!(
        send("tight").await,
        (200, 32 << 10),
        "the request itself runs"
    );
    assert_eq!(send("tight").await.0, 410, "its retry: completed, not kept");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        before + 1,
        "never a second run"
    );
    let lock = redlock
        .lock("still-locks")
        .await
        .expect("locks keep working");
    let _ = redlock.unlock(&lock).await;

    set_maxmemory(0);
    let _ = redlock.health().await;
    assert_eq!(send("roomy-again").await, (200, 32 << 10));
    assert_eq!(send("roomy-again").await, (200, 32 << 10));
    assert_eq!(runs.load(Ordering::SeqCst), before + 2);
}
