//! The waiters' queue of one client, without a server: arrival order and the head, the
//! head handed on (at once after a waiter gave up, after the release when it got the
//! lock), release messages counted to a quorum, a release by this client, a name whose
//! work is done, the head's backstop and deadline, and the nodes' mark it counts on. Time
//! is real but short: each wait is bounded by a deadline, and only lower bounds of waits
//! are asserted, besides one a hundred times the backstop it is about.

use std::time::{Duration, Instant};

use super::*;

/// Long enough that a wait that should end early is seen to.
const PATIENCE: Duration = Duration::from_secs(5);

/// A backstop that never comes into play.
const NEVER: Duration = Duration::from_secs(3600);

fn key() -> &'static [u8] {
    b"redlock:{queue}"
}

/// How long `ticket`'s wait took, with `backstop` and `deadline`.
async fn waits_until(ticket: &Ticket, backstop: Duration, deadline: Instant) -> Duration {
    let start = Instant::now();
    tokio::time::timeout(PATIENCE, ticket.wait(backstop, Some(deadline)))
        .await
        .expect("the wait ends by its deadline");
    start.elapsed()
}

/// Whether `ticket`'s wait ends at once (well before `PATIENCE`).
async fn goes_at_once(ticket: &Ticket) -> bool {
    tokio::time::timeout(PATIENCE, ticket.wait(NEVER, None))
        .await
        .is_ok()
}

/// How long `ticket` waited (with `backstop`) after a missed attempt that found the
/// holder's key lasting `holder` more.
async fn waited_after_a_miss(ticket: &Ticket, holder: Duration, backstop: Duration) -> Duration {
    ticket.busy(Some(holder));
    ticket.attempting();
    waits_until(ticket, backstop, Instant::now() + PATIENCE).await
}

/// After a miss that found the holder's key lasting 120 ms more, `ticket` does not go
/// before that key expires, whatever its `backstop`.
async fn waits_for_the_holder(ticket: &Ticket, backstop: Duration) {
    let holder = Duration::from_millis(120);
    let waited = waited_after_a_miss(ticket, holder, backstop).await;
    assert!(
        waited >= holder - Duration::from_millis(5),
        "went after {waited:?}, before the holder's key expired"
    );
}

/// Waiters queue in arrival order; only the first is the head. A head that gives up lets
/// the next go at once (the lock may be free); the last to leave removes the queue.
#[tokio::test]
async fn waiters_queue_in_order_and_a_head_that_gives_up_lets_the_next_go() {
    let waiters = Waiters::new(3, 2);
    let (a, b, c) = (
        waiters.join(key()),
        waiters.join(key()),
        waiters.join(key()),
    );
    assert!(a.is_head() && !b.is_head() && !c.is_head());
    drop(a);
    assert!(b.is_head() && !c.is_head());
    assert!(goes_at_once(&b).await, "the next head attempts at once");
    drop(b);
    assert!(c.is_head());
    drop(c);
    assert!(
        !waiters.has_queue(key()),
        "the last waiter removes the queue"
    );
}

/// A head that leaves with the lock makes the next one wait for its release: it waits
/// until its deadline, unless this client's release (`wake`) or a quorum of the nodes'
/// release messages tells it to go. One message short of a quorum does not.
#[tokio::test]
async fn after_a_head_that_got_the_lock_the_next_waits_for_the_release() {
    let waiters = Waiters::new(3, 2);
    let (a, b) = (waiters.join(key()), waiters.join(key()));
    a.acquired(Instant::now() + Duration::from_secs(60));
    assert!(b.is_head());
    let short = Duration::from_millis(50);
    let waited = waits_until(&b, NEVER, Instant::now() + short).await;
    assert!(waited >= short, "went after {waited:?} without a release");
    assert_eq!(
        waiters.wake(key()),
        Some(b.id),
        "this client's release wakes the head"
    );
    assert!(goes_at_once(&b).await);
    b.attempting();
    waiters.released(key());
    let waited = waits_until(&b, NEVER, Instant::now() + short).await;
    assert!(waited >= short, "one message of a quorum of two woke it");
    waiters.released(key());
    assert!(goes_at_once(&b).await, "a quorum of messages wakes it");
}

/// An attempt forgets the messages before it: they were seen by the attempt itself.
/// Messages during the attempt count towards the next wake-up.
#[tokio::test]
async fn an_attempt_forgets_the_messages_before_it() {
    let waiters = Waiters::new(3, 2);
    let a = waiters.join(key());
    waiters.released(key());
    a.attempting();
    waiters.released(key());
    let note = waiters.with_queue(key(), |q| (q.notes, q.go));
    assert_eq!(note, Some((1, false)));
    waiters.released(key());
    assert_eq!(
        waiters.with_queue(key(), |q| (q.notes, q.go)),
        Some((0, true))
    );
}

/// `wake_again` wakes the head it names only while that one is still the head.
#[tokio::test]
async fn wake_again_wakes_only_the_same_head() {
    let waiters = Waiters::new(1, 1);
    let (a, b) = (waiters.join(key()), waiters.join(key()));
    let woken = waiters.wake(key()).expect("a head");
    a.attempting();
    a.acquired(Instant::now() + Duration::from_secs(60));
    b.attempting();
    waiters.wake_again(key(), woken);
    assert_eq!(
        waiters.with_queue(key(), |q| q.go),
        Some(false),
        "a head that left is not woken again in its successor"
    );
    let id = b.id;
    waiters.wake_again(key(), id);
    assert!(goes_at_once(&b).await);
}

/// Once a waiter found the name's completion record, every head goes at once (to get the
/// record too), without a release.
#[tokio::test]
async fn a_name_whose_work_is_done_lets_every_head_go() {
    let waiters = Waiters::new(3, 2);
    let (a, b) = (waiters.join(key()), waiters.join(key()));
    a.done();
    a.acquired(Instant::now() + Duration::from_secs(60));
    assert!(b.is_head());
    assert!(goes_at_once(&b).await);
}

/// The head's backstop: it tries without being told once the backstop has passed, and no
/// earlier than the holder's key lasts (when it will be told of the release).
#[tokio::test]
async fn the_head_tries_at_its_backstop_and_not_before_the_holder_expires() {
    let waiters = Waiters::new(3, 2);
    let a = waiters.join(key());
    let backstop = Duration::from_millis(30);
    let waited = waits_until(&a, backstop, Instant::now() + PATIENCE).await;
    assert!(waited >= backstop, "{waited:?}");
    waits_for_the_holder(&a, backstop).await;
}

/// A head that listens for another client's release trusts the holder's TTL only while a
/// quorum of nodes carries its mark (without one, a release tells nobody): unmarked, or
/// marked on too few nodes, it tries at its backstop; marked, not before the holder's key
/// expires.
#[tokio::test]
async fn a_listening_head_waits_for_the_holder_only_while_the_nodes_carry_its_mark() {
    let waiters = Waiters::new(3, 2);
    let a = waiters.join(key());
    waiters.with_queue(key(), |q| {
        q.subscribed = true;
        q.listening = true;
    });
    let backstop = Duration::from_millis(30);
    let far = Duration::from_secs(3);
    for marked_on_a_quorum in [None, Some(false)] {
        if let Some(on_quorum) = marked_on_a_quorum {
            a.marked(Instant::now() + PATIENCE, on_quorum);
        }
        let waited = waited_after_a_miss(&a, far, backstop).await;
        assert!(
            waited >= backstop && waited < far,
            "marked on a quorum: {marked_on_a_quorum:?}; went after {waited:?}"
        );
    }
    a.marked(Instant::now() + PATIENCE, true);
    waits_for_the_holder(&a, backstop).await;
}

/// A waiter behind the head waits until its deadline, whatever the head is told.
#[tokio::test]
async fn a_waiter_behind_the_head_waits_until_its_deadline() {
    let waiters = Waiters::new(1, 1);
    let (_a, b) = (waiters.join(key()), waiters.join(key()));
    waiters.wake(key());
    let short = Duration::from_millis(50);
    let waited = waits_until(&b, Duration::ZERO, Instant::now() + short).await;
    assert!(waited >= short, "{waited:?}");
    assert!(!b.is_head());
}
