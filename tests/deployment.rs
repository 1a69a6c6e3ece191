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
