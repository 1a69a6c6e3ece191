//! One attempt of [`Acquire`] over fake nodes, whose answers each test scripts round by
//! round (a reply, a late reply, or none: the call times out at the round's deadline):
//! held, busy, no quorum, a completion record a quorum agrees on (or not), validity
//! exhausted, and fencing's phase 2; and a held lock's completion (the record in its
//! place, a release only where no answer came). The releases of a missed attempt are
//! answered by every node. Time is tokio's paused clock, except where validity must
//! really run out.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use super::*;
use crate::core::{AfterLoss, CoreParts, KeySpace, Timing};
use crate::error::NodeError;
use crate::landing::LandingState;
use crate::name::CounterSets;
use crate::node::clocks::NodeClocks;
use crate::round::InFlight;
use crate::scripts::{
    COMPLETE_SCRIPT, FENCE_SCRIPT, HELD_OR_RECORD_SCRIPT, INSPECT_SCRIPT, RECORD_MARKER,
};
use redis::Value;

/// One node's answer in a scripted round.
#[derive(Clone)]
enum Answer {
    /// At once.
    Now(Value),
    /// After this long (real time).
    Late(Duration, Value),
    /// A failure, at once.
    Fails,
    /// A refusal of the restart quarantine, at once.
    Quarantined,
    /// Never: the call times out at the deadline.
    Silent,
}

/// A call that answers as scripted.
struct FakeCall {
    index: usize,
    answer: Option<Result<Value, NodeError>>,
    delay: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for FakeCall {
    type Output = Result<Value, NodeError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(delay) = self.delay.as_mut() {
            if delay.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.delay = None;
        }
        match self.answer.take() {
            Some(answer) => Poll::Ready(answer),
            None => Poll::Pending,
        }
    }
}

impl InFlight for FakeCall {
    fn index(&self) -> usize {
        self.index
    }

    fn takes_steps(&self) -> bool {
        false
    }

    fn timed_out(&self, _sent_at: Instant) {}
}

/// Nodes whose rounds answer from a script (a release: every node deletes), and what each
/// round sent.
struct FakeNodes {
    labels: Vec<String>,
    rounds: Mutex<VecDeque<Vec<Answer>>>,
    sent: Mutex<Vec<(String, NodeMask)>>,
    /// What each node may have lost (none: whole).
    doubts: Vec<Whole>,
}

impl FakeNodes {
    fn sent(&self) -> Vec<String> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// What kind of request this is, as the tests name it.
fn kind(request: &Request<'_>) -> String {
    match request {
        Request::SetNx { .. } => "set".into(),
        Request::SetNxOrReplay { .. } => "set or replay".into(),
        Request::FencedSetNx(_) => "fenced set".into(),
        Request::FencedSetNxOrReplay(_) => "fenced set or replay".into(),
        Request::Release { .. } => "release".into(),
        Request::Script(inv) if inv.script.sha == FENCE_SCRIPT.sha => "fence".into(),
        Request::Script(inv) if inv.script.sha == INSPECT_SCRIPT.sha => "read".into(),
        Request::Script(inv) if inv.script.sha == COMPLETE_SCRIPT.sha => "complete".into(),
        Request::Script(inv) if inv.script.sha == HELD_OR_RECORD_SCRIPT.sha => "read record".into(),
        Request::Script(_) => "script".into(),
    }
}

impl Nodes for FakeNodes {
    type Call = FakeCall;

    fn count(&self) -> usize {
        self.labels.len()
    }

    fn label(&self, i: usize) -> &str {
        &self.labels[i]
    }

    fn send(&self, request: &Request<'_>, plan: Plan<'_>) -> Round<FakeCall> {
        let n = self.labels.len();
        let kind = kind(request);
        self.sent.lock().unwrap().push((kind.clone(), plan.skip));
        let answers = if kind == "release" {
            vec![Answer::Now(Value::Int(1)); n]
        } else {
            self.rounds
                .lock()
                .unwrap()
                .pop_front()
                .expect("a scripted round")
        };
        let calls = (0..n)
            .filter(|i| !plan.skip.contains(*i))
            .map(|index| {
                let (answer, delay) = match answers[index].clone() {
                    Answer::Now(v) => (Some(Ok(v)), None),
                    Answer::Late(d, v) => (Some(Ok(v)), Some(Box::pin(tokio::time::sleep(d)))),
                    Answer::Fails => (Some(Err(NodeError::Connection("refused".into()))), None),
                    Answer::Quarantined => (
                        Some(Err(NodeError::Quarantined {
                            remaining: Duration::from_secs(3),
                            reason: crate::error::QuarantineReason::Empty,
                        })),
                        None,
                    ),
                    Answer::Silent => (None, None),
                };
                FakeCall {
                    index,
                    answer,
                    delay,
                }
            })
            .collect();
        let landing = matches!(plan.purpose, Purpose::Decide)
            .then(|| LandingState::new(NodeMask::matching(n, |i| !plan.skip.contains(i))));
        Round::of(calls, plan.deadline, landing, crate::clock::now())
    }

    fn notifications_refused(&self, _i: usize, _message: &str) {}

    fn whole(&self, i: usize) -> Whole {
        self.doubts.get(i).copied().unwrap_or(Whole::Unknown)
    }

    async fn settle(&self, _enough: impl Fn() -> bool + Send) {}
}

/// Counts the releases handed to the background.
#[derive(Default)]
struct Spawned(Mutex<usize>);

impl Background for Spawned {
    fn release_in_background(&self, _deletion: Deletion) {
        *self.0.lock().unwrap() += 1;
    }
}

/// A core over 3 fake nodes answering `rounds`, a TTL of 1 s and a node timeout of 50 ms.
struct Setup {
    core: Core<FakeNodes>,
    fencing: Fencing,
    waiters: Arc<Waiters>,
    spawned: Spawned,
}

impl Setup {
    fn new(rounds: Vec<Vec<Answer>>) -> Self {
        Self::with_min_validity(rounds, Duration::ZERO)
    }

    fn with_min_validity(rounds: Vec<Vec<Answer>>, min_validity: Duration) -> Self {
        Self::with(rounds, min_validity, vec![Whole::Unknown; 3])
    }

    /// Nodes that may have lost writes as `doubts` say.
    fn with_doubts(rounds: Vec<Vec<Answer>>, doubts: Vec<Whole>) -> Self {
        Self::with(rounds, Duration::ZERO, doubts)
    }

    fn with(rounds: Vec<Vec<Answer>>, min_validity: Duration, doubts: Vec<Whole>) -> Self {
        let n = 3;
        let nodes = FakeNodes {
            labels: (0..n).map(|i| format!("node{i}:6379")).collect(),
            rounds: Mutex::new(rounds.into()),
            sent: Mutex::new(Vec::new()),
            doubts,
        };
        let timing = Timing {
            ttl: Duration::from_secs(1),
            node_timeout: Duration::from_millis(50),
            drift_factor: 0.01,
            min_validity,
            fencing_retention: Duration::from_secs(3600),
        };
        let keys = KeySpace {
            prefix: b"test:".to_vec(),
            counter_sets: CounterSets::One,
        };
        let core = Core::new(CoreParts {
            nodes: Box::new(nodes),
            count: n,
            timing,
            keys,
            horizon: Arc::new(Horizon::new(n, Duration::from_secs(1), true)),
            releases: Arc::default(),
        });
        let clocks = Arc::new(NodeClocks::new(n, Duration::from_secs(10)));
        Self {
            core,
            fencing: Fencing::new(Clock::new(clocks), 5_400_000),
            waiters: Waiters::new(n, 2),
            spawned: Spawned::default(),
        }
    }

    async fn attempt(&self, accepts: Accepts, fenced: Fenced) -> Attempt {
        let ttl = self.core.ttl();
        let target = self.core.target(b"job", ttl, accepts, fenced).unwrap();
        let acquire = Acquire {
            core: &self.core,
            fencing: &self.fencing,
            waiters: &self.waiters,
            background: &self.spawned,
        };
        acquire.attempt(&target, None, 1).await
    }

    fn sent(&self) -> Vec<String> {
        self.core.nodes().sent()
    }

    /// The nodes the `k`th round skipped.
    fn skipped(&self, k: usize) -> NodeMask {
        self.core.nodes().sent.lock().unwrap()[k].1
    }
}

use crate::fencing::Clock;
use crate::node::{Horizon, Whole};

/// A replay acquisition whose records live a minute (keys whose record may have been lost
/// run).
const REPLAY: Accepts = Accepts::LockOrRecord {
    retention: Duration::from_secs(60),
    after_loss: AfterLoss::Run,
};

/// The same, refusing keys whose record may have been lost.
const STRICT: Accepts = Accepts::LockOrRecord {
    retention: Duration::from_secs(60),
    after_loss: AfterLoss::Refuse,
};

/// A completion stored on a node.
fn stored() -> Answer {
    Answer::Now(Value::Int(1))
}

/// A node whose data is whole since `secs` ago (its ledger's last loss).
fn whole_for(secs: u64) -> Whole {
    Whole::Since(Instant::now() - Duration::from_secs(secs))
}

/// A node whose data is whole for a day: the oldest, doubted by no one.
fn old() -> Whole {
    whole_for(86_400)
}

fn won() -> Answer {
    Answer::Now(Value::Okay)
}

/// Another client holds the key for 500 ms more.
fn held() -> Answer {
    Answer::Now(Value::Array(vec![
        Value::Int(0),
        Value::Int(500),
        Value::Int(0),
    ]))
}

fn record(body: &[u8]) -> Answer {
    let mut bytes = RECORD_MARKER.to_vec();
    bytes.extend_from_slice(body);
    Answer::Now(Value::Array(vec![Value::Int(2), Value::BulkString(bytes)]))
}

/// A fenced `SET` that won, the node accepting the proposal or not.
fn fenced_won(accepted: bool) -> Answer {
    Answer::Now(Value::Array(vec![
        Value::Okay,
        Value::Int(i64::from(accepted)),
    ]))
}

/// A counter read: the key held (ours), the counter at `counter`.
fn counter(counter: u64) -> Answer {
    Answer::Now(Value::Array(vec![
        Value::Int(1),
        Value::Int(900),
        Value::BulkString(counter.to_string().into_bytes()),
    ]))
}

#[tokio::test(start_paused = true)]
async fn a_quorum_holds_the_lock_and_nothing_is_released() {
    let s = Setup::new(vec![vec![won(), won(), Answer::Silent]]);
    let Attempt::Held(lock) = s.attempt(Accepts::Lock, Fenced::No).await else {
        panic!("held")
    };
    assert_eq!(lock.attempts, 1);
    assert_eq!(lock.fencing_token(), None);
    assert!(lock.valid_until > Instant::now());
    assert_eq!(s.sent(), ["set"]);
    assert_eq!(*s.spawned.0.lock().unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn busy_when_another_client_holds_a_quorum_and_the_release_skips_its_nodes() {
    let s = Setup::new(vec![vec![won(), held(), held()]]);
    let Attempt::Missed { error, by_others } = s.attempt(Accepts::Lock, Fenced::No).await else {
        panic!("missed")
    };
    assert!(by_others);
    let LockError::Busy {
        held_elsewhere,
        retry_after,
        ..
    } = error
    else {
        panic!("busy: {error:?}")
    };
    assert_eq!(held_elsewhere, 2);
    assert_eq!(retry_after, Some(Duration::from_millis(500)));
    assert_eq!(s.sent(), ["set", "release"]);
    let skipped = s.skipped(1);
    assert!(!skipped.contains(0) && skipped.contains(1) && skipped.contains(2));
}

#[tokio::test(start_paused = true)]
async fn no_quorum_when_nodes_fail_or_stay_silent_and_every_node_is_released() {
    let s = Setup::new(vec![vec![won(), Answer::Fails, Answer::Silent]]);
    let Attempt::Missed { error, by_others } = s.attempt(Accepts::Lock, Fenced::No).await else {
        panic!("missed")
    };
    assert!(!by_others);
    assert!(matches!(error, LockError::NoQuorum { .. }), "{error:?}");
    assert_eq!(s.sent(), ["set", "release"]);
    assert_eq!(s.skipped(1).len(), 0, "released everywhere");
}

#[tokio::test(start_paused = true)]
async fn a_record_a_quorum_agrees_on_is_replayed() {
    let s = Setup::new(vec![vec![record(b"a"), won(), record(b"a")]]);
    let Attempt::Record(RecordBytes(bytes)) = s.attempt(REPLAY, Fenced::No).await else {
        panic!("record")
    };
    assert!(bytes.ends_with(b"a"));
    assert_eq!(s.sent(), ["set or replay", "release"]);
}

/// The record on every node: our value went nowhere, so nothing is released (a replay
/// takes one round trip, and no release round is even packed).
#[tokio::test(start_paused = true)]
async fn a_record_on_every_node_is_replayed_with_no_release() {
    let s = Setup::new(vec![vec![record(b"a"), record(b"a"), record(b"a")]]);
    let Attempt::Record(RecordBytes(bytes)) = s.attempt(REPLAY, Fenced::No).await else {
        panic!("record")
    };
    assert!(bytes.ends_with(b"a"));
    assert_eq!(s.sent(), ["set or replay"]);
}

#[tokio::test(start_paused = true)]
async fn records_that_differ_are_never_replayed() {
    let s = Setup::new(vec![vec![record(b"a"), won(), record(b"b")]]);
    let attempt = s.attempt(REPLAY, Fenced::No).await;
    let Attempt::Missed { error, .. } = attempt else {
        panic!("missed: {attempt:?}")
    };
    assert!(matches!(error, LockError::Busy { .. }), "{error:?}");
}

/// A record on one node of three, one grant, one node still quarantined (nodes coming back
/// after losing their data): a replay acquisition is short of nodes, not busy (no request
/// holds the name); a lock-only acquisition finds the name busy.
#[tokio::test(start_paused = true)]
async fn a_record_on_a_minority_is_short_of_nodes_for_a_replay_acquisition() {
    let answers = || vec![vec![record(b"a"), won(), Answer::Quarantined]];
    let s = Setup::new(answers());
    let attempt = s.attempt(REPLAY, Fenced::No).await;
    let Attempt::Missed { error, .. } = attempt else {
        panic!("missed: {attempt:?}")
    };
    assert!(matches!(error, LockError::NoQuorum { .. }), "{error:?}");
    let s = Setup::new(answers());
    let attempt = s.attempt(Accepts::Lock, Fenced::No).await;
    let Attempt::Missed { error, .. } = attempt else {
        panic!("missed: {attempt:?}")
    };
    assert!(matches!(error, LockError::Busy { .. }), "{error:?}");
}

#[tokio::test(start_paused = true)]
async fn a_record_makes_the_name_busy_for_a_lock_only_acquisition() {
    let s = Setup::new(vec![vec![record(b"a"), record(b"a"), won()]]);
    let Attempt::Missed { error, by_others } = s.attempt(Accepts::Lock, Fenced::No).await else {
        panic!("missed")
    };
    assert!(by_others);
    assert!(matches!(error, LockError::Busy { .. }), "{error:?}");
}

#[tokio::test]
async fn a_quorum_that_came_too_late_leaves_no_validity() {
    // 1 s TTL, 12 ms drift: a minimum validity of 950 ms leaves 38 ms for the round.
    let late = |v| Answer::Late(Duration::from_millis(40), v);
    let rounds = vec![vec![
        late(Value::Okay),
        late(Value::Okay),
        late(Value::Okay),
    ]];
    let s = Setup::with_min_validity(rounds, Duration::from_millis(950));
    let Attempt::Missed { error, .. } = s.attempt(Accepts::Lock, Fenced::No).await else {
        panic!("missed")
    };
    assert!(
        matches!(error, LockError::ValidityExhausted { .. }),
        "{error:?}"
    );
    assert_eq!(s.sent(), ["set", "release"]);
}

#[tokio::test(start_paused = true)]
async fn a_proposal_a_quorum_accepted_is_the_number_in_one_round() {
    let s = Setup::new(vec![vec![
        fenced_won(true),
        fenced_won(true),
        Answer::Silent,
    ]]);
    let Attempt::Held(lock) = s.attempt(Accepts::Lock, Fenced::Yes).await else {
        panic!("held")
    };
    assert!(lock.fencing_token().is_some());
    assert_eq!(s.sent(), ["fenced set"]);
}

/// A fenced replay goes down once: its script finds the record (replayed, nothing more
/// sent where every node answered with it), or takes the lock with the proposal as phase
/// 1 does.
#[tokio::test(start_paused = true)]
async fn a_fenced_replay_finds_the_record_or_the_lock_in_one_round() {
    let s = Setup::new(vec![vec![record(b"a"), record(b"a"), record(b"a")]]);
    assert_replayed(s.attempt(REPLAY, Fenced::Yes).await, b"a");
    assert_eq!(s.sent(), ["fenced set or replay"]);

    let s = Setup::new(vec![vec![
        fenced_won(true),
        fenced_won(true),
        Answer::Silent,
    ]]);
    let Attempt::Held(lock) = s.attempt(REPLAY, Fenced::Yes).await else {
        panic!("held")
    };
    assert!(lock.fencing_token().is_some());
    assert_eq!(s.sent(), ["fenced set or replay"]);
}

#[tokio::test(start_paused = true)]
async fn phase_two_raises_the_counters_above_the_highest_read() {
    let far = 1 << 52;
    let s = Setup::new(vec![
        vec![fenced_won(false), fenced_won(false), fenced_won(true)],
        vec![counter(far), counter(7), counter(3)],
        vec![
            Answer::Now(Value::Int(1)),
            Answer::Now(Value::Int(1)),
            Answer::Silent,
        ],
    ]);
    let Attempt::Held(lock) = s.attempt(Accepts::Lock, Fenced::Yes).await else {
        panic!("held")
    };
    assert_eq!(lock.fencing_token(), Some(far + 1));
    assert_eq!(s.sent(), ["fenced set", "read", "fence"]);
    assert!(
        s.fencing.clock().propose() > far,
        "the clock saw the number"
    );
}

/// Two successive holders at the top of the exact range: the first reads a counter at
/// 2^53 - 1 and takes 2^53; its client, having seen 2^53, proposes at the cap, finds the
/// counter pinned and resets it (the documented deliberate loss): to a number below the
/// first's, never the same one (the cap used to be 2^53 - 1, which made it 2^53 again).
#[tokio::test(start_paused = true)]
async fn at_the_top_of_the_range_two_holders_never_share_a_number() {
    let fence_ok = || vec![Answer::Now(Value::Int(1)); 3];
    let s = Setup::new(vec![
        vec![fenced_won(false); 3],
        vec![counter(MAX_NUMBER - 1); 3],
        fence_ok(),
        vec![fenced_won(false); 3],
        vec![counter(MAX_NUMBER); 3],
        fence_ok(),
    ]);
    let Attempt::Held(first) = s.attempt(Accepts::Lock, Fenced::Yes).await else {
        panic!("held")
    };
    assert_eq!(first.fencing_token(), Some(MAX_NUMBER));
    let Attempt::Held(second) = s.attempt(Accepts::Lock, Fenced::Yes).await else {
        panic!("held")
    };
    let number = second.fencing_token().expect("a number");
    assert_ne!(number, MAX_NUMBER, "the same number twice");
    assert!(number < MAX_NUMBER, "{number}");
}

#[tokio::test(start_paused = true)]
async fn phase_two_without_a_quorum_misses_and_releases() {
    let s = Setup::new(vec![
        vec![fenced_won(false), fenced_won(false), fenced_won(false)],
        vec![counter(1), counter(2), counter(3)],
        vec![
            Answer::Now(Value::Int(0)),
            Answer::Now(Value::Int(0)),
            Answer::Fails,
        ],
    ]);
    let Attempt::Missed { error, .. } = s.attempt(Accepts::Lock, Fenced::Yes).await else {
        panic!("missed")
    };
    assert!(matches!(error, LockError::NoQuorum { .. }), "{error:?}");
    assert_eq!(s.sent(), ["fenced set", "read", "fence", "release"]);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_attempt_releases_in_the_background() {
    let s = Setup::new(vec![vec![Answer::Silent, Answer::Silent, Answer::Silent]]);
    let attempt = s.attempt(Accepts::Lock, Fenced::No);
    // Dropped while its SETs are out.
    let cut = tokio::time::timeout(Duration::from_millis(10), attempt).await;
    assert!(cut.is_err());
    assert_eq!(*s.spawned.0.lock().unwrap(), 1);
}

#[test]
fn only_a_record_a_quorum_agrees_on_is_replayed() {
    let (a, b) = (b"#record\na".to_vec(), b"#record\nb".to_vec());
    assert_eq!(agreed_record(&mut vec![a.clone(), b.clone()], 2), None);
    assert_eq!(agreed_record(&mut vec![a.clone()], 2), None);
    assert_eq!(
        agreed_record(&mut vec![b.clone(), a.clone(), a.clone()], 2),
        Some(a.clone())
    );
    assert_eq!(agreed_record(&mut vec![a.clone()], 1), Some(a.clone()));
    assert_eq!(agreed_record(&mut Vec::new(), 1), None);
    assert_eq!(only_record(&[a.clone(), a.clone()]), Some(a.clone()));
    assert_eq!(only_record(&[a.clone(), b]), None, "two runs' records");
    assert_eq!(only_record(&[]), None);
}

/// Asserts that `attempt` replays a record whose body is `body`.
fn assert_replayed(attempt: Attempt, body: &[u8]) {
    let Attempt::Record(RecordBytes(bytes)) = attempt else {
        panic!("replayed: {attempt:?}")
    };
    assert!(bytes.ends_with(body));
}

/// A finished key's record survives on one node of three; the two others restarted
/// empty 10 s ago and grant. The work is done: the record is restored onto the two (in
/// place of our value) and replayed, and the handler does not run again.
#[tokio::test(start_paused = true)]
async fn a_record_on_a_minority_next_to_a_quorum_of_grants_is_restored_and_replayed() {
    let doubts = vec![old(), whole_for(10), whole_for(10)];
    for accepts in [REPLAY, STRICT] {
        let rounds = vec![
            vec![record(b"a"), won(), won()],
            vec![Answer::Silent, stored(), stored()],
        ];
        let s = Setup::with_doubts(rounds, doubts.clone());
        assert_replayed(s.attempt(accepts, Fenced::No).await, b"a");
        assert_eq!(s.sent(), ["set or replay", "complete", "release"]);
        assert!(s.skipped(1).contains(0), "the record's node is left alone");
    }
}

/// The record survives only on a node restarted with its data, which the quarantine
/// keeps out; the two others lost theirs a moment ago and grant. The quarantine keeps out
/// the node's grant, not its evidence: its record is read, restored onto the two and
/// replayed, under either policy (the simulation's seed 8466921549206095768 ran such a
/// key again under `AfterLoss::Refuse`, the two young grants vouching as peers).
#[tokio::test(start_paused = true)]
async fn a_record_on_a_node_kept_out_is_read_restored_and_replayed() {
    let doubts = vec![whole_for(1), whole_for(2), whole_for(2)];
    for accepts in [REPLAY, STRICT] {
        let rounds = vec![
            vec![Answer::Quarantined, won(), won()],
            vec![record(b"a"), Answer::Silent, Answer::Silent],
            vec![Answer::Silent, stored(), stored()],
        ];
        let s = Setup::with_doubts(rounds, doubts.clone());
        assert_replayed(s.attempt(accepts, Fenced::No).await, b"a");
        assert_eq!(
            s.sent(),
            ["set or replay", "read record", "complete", "release"]
        );
        assert_eq!(s.skipped(1), NodeMask::matching(3, |i| i != 0), "the read");
        assert!(
            s.skipped(2).contains(0),
            "nothing written on the kept-out node"
        );
    }
}

/// Without a record on the node kept out, the key goes on as the policy says; a lock-only
/// acquisition, and a replay round that found a record, read nothing more.
#[tokio::test(start_paused = true)]
async fn a_node_kept_out_without_a_record_changes_nothing() {
    let gone = || {
        Answer::Now(Value::Array(vec![
            Value::Int(0),
            Value::Int(-2),
            Value::Int(1),
        ]))
    };
    let s = Setup::with_doubts(
        vec![
            vec![Answer::Quarantined, won(), won()],
            vec![gone(), Answer::Silent, Answer::Silent],
        ],
        vec![old(); 3],
    );
    let attempt = s.attempt(REPLAY, Fenced::No).await;
    assert!(matches!(attempt, Attempt::Held(_)), "{attempt:?}");
    assert_eq!(s.sent(), ["set or replay", "read record"]);

    let s = Setup::new(vec![vec![Answer::Quarantined, won(), won()]]);
    let attempt = s.attempt(Accepts::Lock, Fenced::No).await;
    assert!(matches!(attempt, Attempt::Held(_)), "{attempt:?}");
    assert_eq!(s.sent(), ["set"]);

    let s = Setup::new(vec![vec![Answer::Quarantined, record(b"a"), record(b"a")]]);
    let attempt = s.attempt(REPLAY, Fenced::No).await;
    assert!(matches!(attempt, Attempt::Record(_)), "{attempt:?}");
    assert_eq!(s.sent()[0], "set or replay");
    assert!(!s.sent().contains(&"read record".to_owned()));
}

/// Restored onto too few nodes (our value gone from both by then): short of nodes, not
/// replayed; with one of the two, the record and it make a quorum.
#[tokio::test(start_paused = true)]
async fn a_record_restored_onto_too_few_nodes_is_not_replayed() {
    let gone = || Answer::Now(Value::Int(0));
    let rounds = vec![
        vec![record(b"a"), won(), won()],
        vec![Answer::Silent, stored(), gone()],
    ];
    let s = Setup::new(rounds);
    assert!(matches!(
        s.attempt(REPLAY, Fenced::No).await,
        Attempt::Record(_)
    ));
    let rounds = vec![
        vec![record(b"a"), won(), won()],
        vec![Answer::Silent, gone(), gone()],
    ];
    let s = Setup::new(rounds);
    let attempt = s.attempt(REPLAY, Fenced::No).await;
    let Attempt::Missed { error, .. } = attempt else {
        panic!("missed: {attempt:?}")
    };
    assert!(
        matches!(
            error,
            LockError::NoQuorum {
                reached: 1,
                needed: 2,
                ..
            }
        ),
        "{error:?}"
    );
}

/// A client that just started has judged the two restarted nodes, not yet the third
/// (its connect still under way): the round waits for it, and its late record is
/// restored and replayed. Before the doubts were read as the answers came, the first
/// replay acquisition of a new app instance decided on the two young grants and ran the
/// handler again.
#[tokio::test(start_paused = true)]
async fn a_node_not_judged_yet_is_heard_before_young_grants_decide() {
    let late_record = match record(b"a") {
        Answer::Now(v) => Answer::Late(Duration::from_millis(20), v),
        other => other,
    };
    let doubts = vec![Whole::Unknown, whole_for(10), whole_for(10)];
    let rounds = vec![
        vec![late_record, won(), won()],
        vec![Answer::Silent, stored(), stored()],
    ];
    let s = Setup::with_doubts(rounds, doubts);
    let attempt = s.attempt(REPLAY, Fenced::No).await;
    assert!(matches!(attempt, Attempt::Record(_)), "{attempt:?}");
}

/// Restarted nodes, no record anywhere: a new key runs (no evidence it completed; a
/// record on those two alone is the documented limit of nodes without persistence), or,
/// refusing such keys, it is refused until the retention has passed since the loss.
#[tokio::test(start_paused = true)]
async fn without_a_record_a_key_runs_or_is_refused_as_the_policy_says() {
    let doubts = vec![old(), whole_for(10), whole_for(10)];
    let s = Setup::with_doubts(vec![vec![won(), won(), won()]], doubts.clone());
    let attempt = s.attempt(REPLAY, Fenced::No).await;
    assert!(matches!(attempt, Attempt::Held(_)), "{attempt:?}");

    let s = Setup::with_doubts(vec![vec![Answer::Silent, won(), won()]], doubts);
    let attempt = s.attempt(STRICT, Fenced::No).await;
    let Attempt::Missed { error, .. } = attempt else {
        panic!("missed: {attempt:?}")
    };
    let LockError::Unverifiable {
        vouching,
        granted,
        needed,
        retry_after,
        ..
    } = error
    else {
        panic!("unverifiable: {error:?}")
    };
    assert_eq!((vouching, granted, needed), (0, 2, 2));
    let after = retry_after.expect("a time");
    assert!(
        after <= Duration::from_secs(50) && after > Duration::from_secs(49),
        "{after:?}"
    );
    assert!(!error.is_retryable());
}

/// Refusing keys whose record may have been lost: grants from nodes of one age, from
/// nodes whose loss is older than the retention, or from enough nodes that lost nothing
/// hold.
#[tokio::test(start_paused = true)]
async fn a_strict_replay_holds_where_enough_nodes_vouch() {
    let cases = [
        vec![whole_for(10); 3],
        vec![old(), whole_for(61), whole_for(61)],
        vec![whole_for(10), old(), old()],
    ];
    for doubts in cases {
        let s = Setup::with_doubts(vec![vec![won(), won(), won()]], doubts.clone());
        let attempt = s.attempt(STRICT, Fenced::No).await;
        assert!(
            matches!(attempt, Attempt::Held(_)),
            "{doubts:?}: {attempt:?}"
        );
    }
}

/// A quorum decides a lock-only round: it does not wait for a silent node, whose call
/// lands in the background.
#[tokio::test(start_paused = true)]
async fn a_quorum_decides_without_waiting_for_a_silent_node() {
    let s = Setup::new(vec![vec![won(), won(), Answer::Silent]]);
    let start = tokio::time::Instant::now();
    let attempt = s.attempt(Accepts::Lock, Fenced::No).await;
    assert!(matches!(attempt, Attempt::Held(_)), "{attempt:?}");
    assert!(
        start.elapsed() < Duration::from_millis(10),
        "waited {:?} for the silent node",
        start.elapsed()
    );
}

/// A replay round hears every node by its deadline, also after a quorum granted, with no
/// node doubted: a record on the node that answers last is the key's answer (restored
/// and replayed), and a silent node delays the grant by the node timeout (50 ms here) at most. (With
/// a quorum deciding, the record was heard only when it came before the second grant:
/// the handler ran again, 2 runs in 5 of an axum test.)
#[tokio::test(start_paused = true)]
async fn a_replay_round_hears_every_node_by_its_deadline() {
    let late = |answer: Answer| match answer {
        Answer::Now(v) => Answer::Late(Duration::from_millis(20), v),
        other => other,
    };
    let s = Setup::new(vec![
        vec![won(), won(), late(record(b"a"))],
        vec![stored(), stored(), Answer::Silent],
    ]);
    let attempt = s.attempt(REPLAY, Fenced::No).await;
    assert!(matches!(attempt, Attempt::Record(_)), "{attempt:?}");

    let s = Setup::new(vec![vec![won(), won(), Answer::Silent]]);
    let start = tokio::time::Instant::now();
    let attempt = s.attempt(REPLAY, Fenced::No).await;
    assert!(matches!(attempt, Attempt::Held(_)), "{attempt:?}");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(10) && waited <= Duration::from_millis(60),
        "waited {waited:?} for the silent node"
    );
}

/// Quarantined nodes refuse at once: the error names every one of them, also those whose
/// refusal came in after the outcome was certain.
#[tokio::test(start_paused = true)]
async fn a_no_quorum_error_names_every_quarantined_node() {
    let quarantined = vec![Answer::Quarantined; 3];
    let s = Setup::new(vec![quarantined]);
    let attempt = s.attempt(Accepts::Lock, Fenced::No).await;
    let Attempt::Missed {
        error: LockError::NoQuorum { failures, .. },
        ..
    } = attempt
    else {
        panic!("no quorum: {attempt:?}")
    };
    assert_eq!(failures.len(), 3, "{failures:?}");
}

/// A lock held on every node, and the completion of a finished request over it
/// ([`Release::complete`]): the record in the lock's place, kept for a minute.
async fn complete_after(s: &Setup) -> usize {
    let Attempt::Held(lock) = s.attempt(Accepts::Lock, Fenced::No).await else {
        panic!("held")
    };
    let release = Release {
        core: &s.core,
        waiters: &s.waiters,
    };
    let observe = crate::op::observe::Observe::new(false);
    let mut record = RECORD_MARKER.to_vec();
    record.extend_from_slice(b"done");
    release
        .complete(observe, &lock, &record, Duration::from_secs(60))
        .await
}

/// Every node answers the completion (stored, or the key no longer ours): the record
/// released the lock where it was stored, and nothing else goes down, one round trip
/// where a completion and then a release took two.
#[tokio::test(start_paused = true)]
async fn a_completion_every_node_answers_sends_no_release() {
    let not_ours = Answer::Now(Value::Int(0));
    let s = Setup::new(vec![
        vec![won(), won(), won()],
        vec![stored(), stored(), not_ours],
    ]);
    assert_eq!(complete_after(&s).await, 2);
    assert_eq!(s.sent(), ["set", "complete"]);
}

/// A node that fails or stays silent may still hold the lock (its `COMPLETE` may not have
/// run): the release goes to those nodes, and to no other.
#[tokio::test(start_paused = true)]
async fn a_completion_releases_on_the_nodes_that_did_not_answer_only() {
    let s = Setup::new(vec![
        vec![won(), won(), won()],
        vec![stored(), Answer::Fails, Answer::Silent],
    ]);
    assert_eq!(complete_after(&s).await, 1);
    assert_eq!(s.sent(), ["set", "complete", "release"]);
    assert_eq!(s.skipped(2), NodeMask::matching(3, |i| i == 0));
}
