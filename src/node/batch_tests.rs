//! The release queue of one node, without a server: who takes the turn, who queues, who
//! starts the sending task, the batches' order and size, the turn handed on by its
//! holder or taken at its deadline, a full queue, and a sending task that is gone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use super::*;
use crate::scripts::Request;

/// How long a test waits for something that must happen (it never sleeps for it).
const PATIENCE: Duration = Duration::from_secs(5);

/// The release of lock `i`.
fn release(i: usize) -> Arc<Call> {
    let key = format!("redlock:{{k{i}}}");
    Arc::new(
        Request::Release {
            key: key.as_bytes(),
            waiting: Some(b"redlock:#waiting"),
            value: b"value",
            id: b"client",
        }
        .call(),
    )
}

/// A deadline far enough away not to matter.
fn later() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// The key of a queued release.
fn key_of(queued: &Queued) -> Vec<u8> {
    queued.call.key().to_vec()
}

/// The first release to an idle node takes its turn; the ones after it queue, and only
/// the first of them starts the task that sends the queue. Once the turn is handed on,
/// the queue goes out as one batch, in the order the releases came, and each gets its own
/// answer; then the queue is empty, the task is over, and the next release takes the turn
/// again.
#[tokio::test]
async fn releases_behind_the_turn_go_out_together_in_order() {
    let releases = Arc::new(Releases::default());
    let Release::Turn(turn) = releases.take_turn_or_queue(&release(0), later()) else {
        panic!("an idle node gives the first release its turn");
    };
    let mut waiting = Vec::new();
    for i in 1..=3 {
        match releases.take_turn_or_queue(&release(i), later()) {
            Release::Queued {
                waiting: w,
                start_sender,
            } => {
                assert_eq!(start_sender, i == 1, "release {i}");
                waiting.push(w);
            }
            _ => panic!("release {i} queues behind the turn"),
        }
    }
    let sender = Sender::new(&releases);
    let turn_over = tokio::spawn({
        let releases = Arc::clone(&releases);
        async move { releases.wait_turn().await }
    });
    assert!(!turn_over.is_finished());
    drop(turn);
    tokio::time::timeout(PATIENCE, turn_over)
        .await
        .expect("the queue goes once the turn is handed on")
        .expect("task");
    let batch = releases.next_batch().expect("a batch");
    let keys: Vec<Vec<u8>> = batch.iter().map(key_of).collect();
    assert_eq!(
        keys,
        [1, 2, 3].map(|i| format!("redlock:{{k{i}}}").into_bytes())
    );
    for (i, queued) in batch.into_iter().enumerate() {
        queued.answer(Ok(Value::Int(i64::try_from(i).unwrap_or(0))));
    }
    for (i, w) in waiting.into_iter().enumerate() {
        let answer = tokio::time::timeout(PATIENCE, w).await.expect("answered");
        assert_eq!(answer, Ok(Value::Int(i64::try_from(i).unwrap_or(0))));
    }
    assert!(releases.next_batch().is_none(), "the queue is empty");
    sender.finished();
    assert!(
        matches!(
            releases.take_turn_or_queue(&release(4), later()),
            Release::Turn(_)
        ),
        "the node is idle again"
    );
}

/// A turn held past its holder's deadline is taken from it: the releases behind it go on
/// without waiting for its answer, and the late holder's end does not hand on a turn that
/// is no longer its own.
#[tokio::test]
async fn a_turn_kept_past_its_deadline_is_taken_from_its_holder() {
    let releases = Arc::new(Releases::default());
    let deadline = Instant::now() + Duration::from_millis(50);
    let Release::Turn(stale) = releases.take_turn_or_queue(&release(0), deadline) else {
        panic!("the turn");
    };
    let Release::Queued { waiting, .. } = releases.take_turn_or_queue(&release(1), later()) else {
        panic!("queued");
    };
    let sender = Sender::new(&releases);
    tokio::time::timeout(PATIENCE, releases.wait_turn())
        .await
        .expect("the turn is over at its holder's deadline");
    assert!(Instant::now() >= deadline);
    let batch = releases.next_batch().expect("the release behind it");
    assert_eq!(batch.len(), 1);
    // While the batch is out, a new release queues (the task still sends)...
    let Release::Queued {
        waiting: behind,
        start_sender,
    } = releases.take_turn_or_queue(&release(2), later())
    else {
        panic!("queued behind the batch");
    };
    assert!(!start_sender, "the sending task is still on");
    for queued in batch {
        queued.answer(Ok(Value::Okay));
    }
    assert_eq!(waiting.await, Ok(Value::Okay));
    // ...and the stale holder's end changes nothing.
    drop(stale);
    let batch = releases.next_batch().expect("the next batch");
    assert_eq!(batch.len(), 1);
    for queued in batch {
        queued.answer(Ok(Value::Okay));
    }
    assert_eq!(behind.await, Ok(Value::Okay));
    assert!(releases.next_batch().is_none());
    sender.finished();
}

/// A batch holds at most `MAX_BATCH` releases, the oldest first; past `MAX_QUEUED`
/// waiting, a release goes out alone at once instead of queueing.
#[tokio::test]
async fn batches_are_bounded_and_a_full_queue_sends_alone() {
    let releases = Arc::new(Releases::default());
    let Release::Turn(_turn) = releases.take_turn_or_queue(&release(0), later()) else {
        panic!("the turn");
    };
    let mut waiting = Vec::new();
    for i in 1..=MAX_QUEUED {
        match releases.take_turn_or_queue(&release(i), later()) {
            Release::Queued { waiting: w, .. } => waiting.push(w),
            _ => panic!("release {i} queues"),
        }
    }
    assert!(
        matches!(
            releases.take_turn_or_queue(&release(MAX_QUEUED + 1), later()),
            Release::Alone
        ),
        "a full queue sends alone"
    );
    let first = releases.next_batch().expect("a batch");
    assert_eq!(first.len(), MAX_BATCH);
    assert_eq!(key_of(&first[0]), b"redlock:{k1}".to_vec());
    let mut sent = first.len();
    while let Some(batch) = releases.next_batch() {
        assert!(batch.len() <= MAX_BATCH);
        sent += batch.len();
    }
    assert_eq!(sent, MAX_QUEUED, "every queued release goes out once");
}

/// When the task that sends the queue is gone (its runtime shut down), the releases that
/// waited for it get an error instead of waiting forever, and the queue can start anew.
#[tokio::test]
async fn releases_queued_for_a_task_that_is_gone_fail_at_once() {
    let releases = Arc::new(Releases::default());
    let Release::Turn(_turn) = releases.take_turn_or_queue(&release(0), later()) else {
        panic!("the turn");
    };
    let Release::Queued { waiting, .. } = releases.take_turn_or_queue(&release(1), later()) else {
        panic!("queued");
    };
    drop(Sender::new(&releases));
    let answer = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("answered at once");
    assert!(
        matches!(answer, Err(NodeError::Connection(_))),
        "{answer:?}"
    );
    let Release::Queued { start_sender, .. } = releases.take_turn_or_queue(&release(2), later())
    else {
        panic!("queued");
    };
    assert!(start_sender, "a new task sends the queue");
}

/// Outside a tokio runtime no task can send a queue: a release behind the turn goes out
/// alone.
#[test]
fn without_a_runtime_a_release_behind_the_turn_goes_alone() {
    let releases = Arc::new(Releases::default());
    let Release::Turn(_turn) = releases.take_turn_or_queue(&release(0), later()) else {
        panic!("the turn");
    };
    assert!(matches!(
        releases.take_turn_or_queue(&release(1), later()),
        Release::Alone
    ));
}

/// A queued release counts among the client's running releases (what `shutdown` waits
/// for) from when it queues until it is answered, whether or not its caller still waits;
/// the release that holds the turn is its caller's to count.
#[tokio::test]
async fn a_queued_release_counts_as_running_until_answered() {
    let running = Arc::new(running::Releases::default());
    let releases = Arc::new(Releases::counting_in(Arc::clone(&running)));
    let Release::Turn(turn) = releases.take_turn_or_queue(&release(0), later()) else {
        panic!("the turn");
    };
    assert_eq!(running.count(), 0, "the turn's holder is its caller's");
    let mut waiting = Vec::new();
    for i in 1..=2 {
        let Release::Queued { waiting: w, .. } = releases.take_turn_or_queue(&release(i), later())
        else {
            panic!("queued");
        };
        waiting.push(w);
    }
    assert_eq!(running.count(), 2);
    drop(waiting); // the callers stop waiting: still running
    assert_eq!(running.count(), 2);
    drop(turn);
    let batch = releases.next_batch().expect("the queue");
    let mut batch = batch.into_iter();
    if let Some(first) = batch.next() {
        first.answer(Ok(Value::Int(1)));
    }
    assert_eq!(running.count(), 1);
    drop(batch);
    assert_eq!(running.count(), 0);
}
