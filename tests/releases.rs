//! Releases that must get through: past a refused notification, past a caller that stops
//! polling, and never overtaken by their own acquisition across a reconnect; against real
//! Redis nodes.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use support::{CapturedLogs, Cluster};
use tower_redlock::Redlock;

/// A user whose ACL lets it run `PUBLISH` but not on the lock channels (Redis 7's default
/// `acl-pubsub-default resetchannels`): releases still release. A single unlock reports the
/// key released, a batch of releases deletes every key of the batch, and the refusal is
/// named once per node.
#[tokio::test]
async fn a_refused_publish_does_not_stop_a_release() {
    let cluster = Cluster::start(1);
    let mut admin = cluster.raw(0).await;
    // The README's rule without the channel pattern.
    let rule = "SETUSER locker on >secret resetkeys ~redlock:* resetchannels -@all +set +get \
                +pttl +del +pexpire +publish +hget +time +evalsha +eval +script|load +info \
                +subscribe +unsubscribe +ping";
    let mut acl = redis::cmd("ACL");
    for word in rule.split_whitespace() {
        acl.arg(word);
    }
    let _: () = acl.query_async(&mut admin).await.expect("ACL SETUSER");
    let url = format!(
        "redis://locker:secret@127.0.0.1:{}",
        cluster.nodes[0].port()
    );
    let logs = CapturedLogs::start();
    let redlock = Redlock::builder([url])
        .restart_quarantine(false)
        .build()
        .expect("build");

    let lock = redlock.lock("no-channel").await.expect("lock");
    let report = redlock.unlock(&lock).await;
    assert_eq!(report.released(), 1, "{report:?}");
    assert!(report.failures().is_empty(), "{report:?}");
    assert_eq!(cluster.nodes_holding("redlock:no-channel").await, 0);

    // Released together: the first takes the node's turn, the others go out as batches.
    let names: Vec<String> = (0..40).map(|i| format!("batch-{i}")).collect();
    let locks = join_all(names.iter().map(|n| redlock.lock(n))).await;
    let locks: Vec<_> = locks.into_iter().map(|l| l.expect("lock")).collect();
    let reports = join_all(locks.iter().map(|l| redlock.unlock(l))).await;
    for (name, report) in names.iter().zip(&reports) {
        assert_eq!(report.released(), 1, "{name}: {report:?}");
        assert_eq!(
            cluster.nodes_holding(format!("redlock:{name}")).await,
            0,
            "{name} is still locked"
        );
    }
    let text = logs.text();
    assert_eq!(
        text.matches("refused PUBLISH").count(),
        1,
        "one warning per node that names the refused command: {text}"
    );
    assert!(
        text.contains("&<key prefix>*"),
        "it says what fixes it: {text}"
    );
}
