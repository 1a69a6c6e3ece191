//! The lost signal shared by a lock's tokens: told to whoever waits, and readable by whoever
//! looks later, whether or not anybody waited when the lock was lost.

use super::*;
use crate::name::{CounterSets, keys_for};

/// How long a test waits for something that must happen.
const PATIENCE: Duration = Duration::from_secs(5);

/// The shared state of a lock on `name` held for a minute.
fn shared(name: &str) -> Arc<Shared> {
    let keys = keys_for(b"t:", name.as_bytes(), CounterSets::One).expect("keys");
    let now = Instant::now();
    Shared::new(
        Lock {
            resource: Arc::new(Resource::new(name.as_bytes(), keys)),
            value: Arc::from("value"),
            started: now,
            acquired_at: now,
            valid_until: now + Duration::from_secs(60),
            ttl: Duration::from_secs(60),
            attempts: 1,
            fence: None,
            foreign: NodeMask::default(),
            landing: None,
        },
        None,
    )
}

/// A holder already waiting for the signal is told, with the first reason only.
#[tokio::test]
async fn a_waiting_holder_is_told_the_first_reason() {
    let shared = shared("waited");
    let waiter = tokio::spawn({
        let shared = Arc::clone(&shared);
        async move { shared.lost().await }
    });
    // The waiter registers before the loss, or reads it when it starts.
    tokio::task::yield_now().await;
    assert!(shared.mark_lost(LostReason::Released), "the first reason");
    assert!(
        !shared.mark_lost(LostReason::Expired),
        "a later one is ignored"
    );
    let reason = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("told in time")
        .expect("task");
    assert_eq!(reason, LostReason::Released);
}

/// A loss with nobody waiting is still seen by whoever looks or waits afterwards.
#[tokio::test]
async fn a_loss_nobody_waited_for_is_seen_later() {
    let shared = shared("unwatched");
    assert!(shared.mark_lost(LostReason::Released));
    assert!(!shared.mark_lost(LostReason::Expired));
    assert_eq!(shared.lost_reason(), Some(LostReason::Released));
    assert!(!shared.is_held());
    let reason = tokio::time::timeout(PATIENCE, shared.lost()).await;
    assert_eq!(reason.ok(), Some(LostReason::Released));
}

/// Holders waiting from many threads while the loss is marked are each told, however
/// their subscriptions and the mark interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_waiting_while_the_loss_is_marked_are_all_told() {
    for i in 0..5000 {
        let shared = shared(&format!("race-{i}"));
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let shared = Arc::clone(&shared);
                tokio::spawn(async move { shared.lost().await })
            })
            .collect();
        // From the other thread too, a little later each round.
        let marks = tokio::task::spawn_blocking({
            let shared = Arc::clone(&shared);
            move || {
                for _ in 0..i % 64 {
                    std::hint::spin_loop();
                }
                shared.mark_lost(LostReason::Released);
            }
        });
        marks.await.expect("marked");
        for waiter in waiters {
            let reason = tokio::time::timeout(PATIENCE, waiter)
                .await
                .unwrap_or_else(|_| panic!("round {i}: not told in time"))
                .expect("task");
            assert_eq!(reason, LostReason::Released, "round {i}");
        }
    }
}
