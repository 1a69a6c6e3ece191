//! What the client says about how a node is run, against real Redis nodes.

mod support;

use support::{CapturedLogs, RedisNode};

/// A node whose `maxmemory-policy` evicts keys gets one warning that names the policy and
/// the fix, however often the client connects; a `noeviction` node gets none.
#[tokio::test]
async fn a_node_that_may_evict_keys_is_warned_about_once() {
    let evicting = RedisNode::start_with_args(
        None,
        vec!["--maxmemory-policy".into(), "volatile-lru".into()],
    );
    let safe = [RedisNode::start(), RedisNode::start()];
    let logs = CapturedLogs::start();
    let redlock = support::builder([evicting.url(), safe[0].url(), safe[1].url()])
        .build()
        .expect("build");
    support::warm(&redlock).await;
    // A second client: its own connections, its own warning.
    let again = support::builder([evicting.url()]).build().expect("build");
    support::warm(&again).await;
    let text = logs.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("maxmemory-policy is not noeviction"))
        .collect();
    assert_eq!(
        warnings.len(),
        2,
        "one per client and evicting node: {text}"
    );
    for line in warnings {
        assert!(line.contains(&evicting.addr()), "{line}");
        assert!(line.contains("volatile-lru"), "{line}");
        assert!(line.contains("set maxmemory-policy noeviction"), "{line}");
    }
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
