//! The round over fake node calls (each answered through a channel the test holds): early
//! decision, the deadline, stragglers that land, the gate, and abandoned calls. Time is
//! tokio's paused clock, so the deadlines are exact and nothing sleeps for real.

use std::pin::pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

use tokio::sync::oneshot;

use super::*;
use crate::quorum::Outcome;
use crate::votes::Votes;

/// A node call the test answers by hand.
struct Fake {
    index: usize,
    answer: oneshot::Receiver<Result<Value, NodeError>>,
    /// The calls the round gave up on, by node.
    timed_out: Arc<Mutex<Vec<usize>>>,
    /// When each node's answer came, if the calls tell (see [`Setup::stamped`]).
    arrivals: Option<Arrivals>,
    /// A call of two steps: once its first answer is in, it sends a follow-up (the flag
    /// says it did) and answers with the follow-up's answer.
    follow_up: Option<(Arc<AtomicBool>, Answering)>,
}

/// Where a fake call's answer comes from.
type Answering = oneshot::Receiver<Result<Value, NodeError>>;

/// When each node's answer came in.
type Arrivals = Arc<Mutex<Vec<Option<Instant>>>>;

impl Future for Fake {
    type Output = Result<Value, NodeError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Some((sent, follow_up)) = &mut this.follow_up {
            if !sent.load(Ordering::SeqCst) {
                let _first = std::task::ready!(std::pin::Pin::new(&mut this.answer).poll(cx));
                sent.store(true, Ordering::SeqCst);
            }
            return std::pin::Pin::new(follow_up)
                .poll(cx)
                .map(|answer| answer.unwrap_or(Err(NodeError::Connection("dropped".into()))));
        }
        std::pin::Pin::new(&mut self.answer)
            .poll(cx)
            .map(|answer| answer.unwrap_or(Err(NodeError::Connection("dropped".into()))))
    }
}

impl InFlight for Fake {
    fn index(&self) -> usize {
        self.index
    }

    fn takes_steps(&self) -> bool {
        self.follow_up.is_some()
    }

    fn timed_out(&self, _sent_at: Instant) {
        self.timed_out.lock().unwrap().push(self.index);
    }

    fn arrived(&self) -> Option<Instant> {
        let arrivals = self.arrivals.as_ref()?;
        arrivals.lock().unwrap()[self.index]
    }
}

/// A round of `n` fake calls, given up after `deadline`, and the senders that answer them.
struct Setup {
    round: Round<Fake>,
    answers: Vec<Option<oneshot::Sender<Result<Value, NodeError>>>>,
    timed_out: Arc<Mutex<Vec<usize>>>,
    arrivals: Option<Arrivals>,
}

impl Setup {
    /// `n` calls that cannot tell when their answer came (as calls on redis-rs's
    /// connections).
    fn new(n: usize, deadline: Duration) -> Self {
        Self::with(n, deadline, None)
    }

    /// `n` calls that tell when their answer came (as calls on the crate's own
    /// connections): [`answer`](Self::answer) stamps it.
    fn stamped(n: usize, deadline: Duration) -> Self {
        Self::with(n, deadline, Some(Arc::new(Mutex::new(vec![None; n]))))
    }

    fn with(n: usize, deadline: Duration, arrivals: Option<Arrivals>) -> Self {
        let timed_out = Arc::new(Mutex::new(Vec::new()));
        let (mut calls, mut answers) = (Vec::new(), Vec::new());
        for index in 0..n {
            let (tx, answer) = oneshot::channel();
            answers.push(Some(tx));
            calls.push(Fake {
                index,
                answer,
                timed_out: Arc::clone(&timed_out),
                arrivals: arrivals.clone(),
                follow_up: None,
            });
        }
        let landing = LandingState::new(NodeMask::matching(n, |_| true));
        let round = Round::of(
            calls,
            Instant::now() + deadline,
            Some(landing),
            Instant::now(),
        );
        Self {
            round,
            answers,
            timed_out,
            arrivals,
        }
    }

    /// Node `i` answers `granted` (1) or refused (0), now.
    fn answer(&mut self, i: usize, granted: bool) {
        if let Some(arrivals) = &self.arrivals {
            arrivals.lock().unwrap()[i] = Some(crate::clock::now());
        }
        answer(&mut self.answers, i, granted);
    }
}

/// Node `i` answers `granted` (1) or refused (0) through its sender in `answers`.
fn answer(
    answers: &mut [Option<oneshot::Sender<Result<Value, NodeError>>>],
    i: usize,
    granted: bool,
) {
    let tx = answers[i].take().expect("answered once");
    let _ = tx.send(Ok(Value::Int(i64::from(granted))));
}

/// Every answer still to come out of `round`, by node.
async fn every_answer(round: &mut Round<Fake>) -> Vec<(usize, Result<Value, NodeError>)> {
    let mut taken = Vec::new();
    while let Some(answer) = round.next().await {
        taken.push(answer);
    }
    taken.sort_by_key(|(i, _)| *i);
    taken
}

/// Counts the wake-ups of the task that polls the round.
#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// An operation's loop: until the votes decide, counting "1" as granted.
async fn decide(round: &mut Round<Fake>, nodes: usize) -> Votes {
    let mut votes = Votes::new(nodes);
    while votes.undecided() {
        round.wake_after(votes.to_decide());
        let Some((i, reply)) = round.next().await else {
            break;
        };
        let outcome = reply.map(|v| match v {
            Value::Int(1) => Outcome::Granted,
            _ => Outcome::HeldElsewhere,
        });
        votes.count(&format!("node {i}"), outcome);
    }
    votes
}

#[tokio::test(start_paused = true)]
async fn decides_at_the_quorum_and_lands_the_stragglers() {
    let mut s = Setup::new(5, Duration::from_secs(1));
    for i in [1, 3, 4] {
        s.answer(i, true);
    }
    let votes = decide(&mut s.round, 5).await;
    assert!(votes.reached());
    assert_eq!(votes.tally.successes(), 3);
    assert_eq!(s.round.out(), 2, "nodes 0 and 2 were not waited for");
    let Setup {
        round,
        mut answers,
        timed_out,
        ..
    } = s;
    let landing = round.land().await.expect("two calls still out");
    assert!(!landing.has_landed(0) && !landing.has_landed(2));
    assert!(landing.has_landed(1), "answered calls have landed");
    answer(&mut answers, 0, true);
    let far = Instant::now() + Duration::from_secs(60);
    landing.wait(0, far).await;
    assert!(landing.has_landed(0));
    assert!(!landing.has_landed(2));
    // The last straggler gets no answer: it lands (as done) at the round's deadline.
    landing.wait(2, far).await;
    assert!(landing.is_done());
    assert_eq!(*timed_out.lock().unwrap(), [2]);
}

#[tokio::test(start_paused = true)]
async fn a_round_decided_by_refusals_does_not_wait_for_the_rest() {
    let mut s = Setup::new(5, Duration::from_secs(1));
    for i in [0, 2, 4] {
        s.answer(i, false);
    }
    let start = tokio::time::Instant::now();
    let votes = decide(&mut s.round, 5).await;
    assert!(!votes.reached());
    assert_eq!(votes.tally.held_elsewhere(), 3);
    assert_eq!(start.elapsed(), Duration::ZERO, "no wait for nodes 1 and 3");
    assert_eq!(s.round.out(), 2);
}

#[tokio::test(start_paused = true)]
async fn gives_up_every_call_still_out_at_the_deadline() {
    let mut s = Setup::new(3, Duration::from_millis(100));
    s.answer(1, true);
    let start = tokio::time::Instant::now();
    let mut seen = Vec::new();
    while let Some((i, reply)) = s.round.next().await {
        // Given up at the deadline (the timer's granularity is 1 ms), not before.
        let waited = start.elapsed();
        let at_deadline =
            waited >= Duration::from_millis(100) && waited < Duration::from_millis(102);
        seen.push((
            i,
            reply.map_err(|e| e == NodeError::Timeout),
            waited.is_zero(),
            at_deadline,
        ));
    }
    assert_eq!(
        seen,
        [
            (1, Ok(Value::Int(1)), true, false),
            (0, Err(true), false, true),
            (2, Err(true), false, true),
        ]
    );
    let mut timed_out = s.timed_out.lock().unwrap().clone();
    timed_out.sort_unstable();
    assert_eq!(timed_out, [0, 2], "each node told of its timeout once");
    assert!(
        s.answers[0].as_ref().unwrap().is_closed(),
        "given-up calls are dropped"
    );
}

/// A connection that broke once the deadline had passed (closed after other rounds'
/// timeouts, say) gave its call no answer in time: the call timed out. Before the
/// deadline it is the connection error it is; other answers are what they are.
#[tokio::test(start_paused = true)]
async fn a_connection_broken_after_the_deadline_is_a_timeout() {
    let mut s = Setup::new(4, Duration::from_millis(100));
    let broken = || Err(NodeError::Connection("dropped".into()));
    let _ = s.answers[3].take().unwrap().send(broken());
    let early = s.round.next().await;
    assert_eq!(early, Some((3, broken())), "before the deadline");
    // Past the deadline (a std instant, a little after the paused clock's start).
    tokio::time::advance(Duration::from_millis(150)).await;
    let _ = s.answers[0].take().unwrap().send(broken());
    s.answer(1, true);
    let refused = Err(NodeError::Redis("NOPERM".into()));
    let _ = s.answers[2].take().unwrap().send(refused.clone());
    assert_eq!(
        every_answer(&mut s.round).await,
        [
            (0, Err(NodeError::Timeout)),
            (1, Ok(Value::Int(1))),
            (2, refused)
        ]
    );
}

/// A call that tells when its answer came in: an answer that came before the deadline
/// counts even when the task takes it after (the gate woke it only at the deadline); one
/// that came after the deadline is a timeout, however soon the task takes it (a grant
/// after the node timeout never counts).
#[tokio::test(start_paused = true)]
async fn an_answer_that_came_after_the_deadline_is_a_timeout_however_soon_it_is_taken() {
    let mut s = Setup::stamped(3, Duration::from_millis(100));
    s.round.wake_after(3);
    s.answer(0, true);
    // The task does not run until after the deadline (as a busy runtime may), and by then
    // node 1 has answered too, late.
    tokio::time::advance(Duration::from_millis(150)).await;
    s.answer(1, true);
    assert_eq!(
        every_answer(&mut s.round).await,
        [
            (0, Ok(Value::Int(1))),
            (1, Err(NodeError::Timeout)),
            (2, Err(NodeError::Timeout))
        ]
    );
    assert_eq!(
        *s.timed_out.lock().unwrap(),
        [2],
        "a late answer says the connection works: only the silent call counts against its node"
    );
}

/// A round that waits for every call (a replay round) with one node silent: a call of two
/// steps sends its follow-up as soon as its first answer is in, not at the deadline (the
/// gate would have waited for the silent node's news), so its answer counts.
#[tokio::test(start_paused = true)]
async fn a_call_of_two_steps_takes_its_second_at_once_beside_a_silent_node() {
    let mut s = Setup::new(3, Duration::from_millis(100));
    let sent = Arc::new(AtomicBool::new(false));
    let (follow_up, answer_follow_up) = oneshot::channel();
    s.round.calls[1].follow_up = Some((Arc::clone(&sent), answer_follow_up));
    let mut round = s.round;
    let taking = tokio::spawn(async move {
        let mut taken = Vec::new();
        loop {
            round.wake_after(round.out());
            let Some(answer) = round.next().await else {
                return taken;
            };
            taken.push(answer);
        }
    });
    // The round waits (its task has polled every call) before any answer comes.
    tokio::time::sleep(Duration::from_millis(1)).await;
    answer(&mut s.answers, 0, true);
    answer(&mut s.answers, 1, true);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(
        sent.load(Ordering::SeqCst),
        "the follow-up went out once the first answer was in"
    );
    let _ = follow_up.send(Ok(Value::Int(2)));
    let mut taken = taking.await.expect("the round");
    taken.sort_by_key(|(i, _)| *i);
    assert_eq!(
        taken,
        [
            (0, Ok(Value::Int(1))),
            (1, Ok(Value::Int(2))),
            (2, Err(NodeError::Timeout))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_task_is_woken_only_once_enough_calls_answered() {
    let mut s = Setup::new(5, Duration::from_secs(1));
    s.round.wake_after(3);
    let wakes = Arc::new(Wakes::default());
    let waker = Waker::from(Arc::clone(&wakes));
    let mut cx = Context::from_waker(&waker);
    let mut next = pin!(s.round.next());
    assert!(next.as_mut().poll(&mut cx).is_pending());
    for i in [0, 1] {
        let _ = s.answers[i].take().unwrap().send(Ok(Value::Int(1)));
    }
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        0,
        "two answers cannot decide"
    );
    let _ = s.answers[2].take().unwrap().send(Ok(Value::Int(1)));
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        1,
        "the third wakes the task"
    );
    assert!(matches!(next.as_mut().poll(&mut cx), Poll::Ready(Some(_))));
}

#[tokio::test(start_paused = true)]
async fn ready_takes_what_is_in_without_waiting() {
    let mut s = Setup::new(3, Duration::from_secs(1));
    s.answer(2, true);
    let start = tokio::time::Instant::now();
    assert_eq!(s.round.ready().await.map(|(i, _)| i), Some(2));
    assert!(s.round.ready().await.is_none());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(s.round.out(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_round_abandons_its_calls() {
    let mut s = Setup::new(3, Duration::from_secs(1));
    s.answer(0, true);
    assert!(s.round.next().await.is_some());
    let Setup { round, answers, .. } = s;
    drop(round);
    assert!(
        answers.iter().flatten().all(oneshot::Sender::is_closed),
        "nobody is left to take a late answer"
    );
}
