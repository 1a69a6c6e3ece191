//! An exhaustive model check of the fencing protocol of `docs/fencing.md`: small systems
//! of nodes and clients in which *every* order of the steps below is explored, a
//! depth-first search over the reachable states that visits each state once (nodes
//! sorted, so that states that differ only in the nodes' order are one; attempts that are
//! over forgotten), up to a bound on time, acquisitions and faults.
//!
//! The steps: a client starts an acquisition (its proposal from its clock, its renewal
//! decided for each node's connection); a node runs a request (phase 1's `SET NX PX`,
//! `ZADD GT CH` and renewal, as separate steps in the scopes that say `split`, other
//! connections' commands running between them; a read; phase 2's script), each
//! connection's requests in the order they were sent, the reply arriving as the last
//! command ran; the clock ticks (lock keys and sets of counters expire; a request not
//! answered by the node timeout counts as failed); a connection drops (what was still to
//! run on it never runs, the next request reconnects); a node restarts empty, or fails over
//! to a replica that has the keys but lacks the counters (both quarantined for the TTL, as
//! the client does); a lock key vanishes early (a clock jump on its node); a client
//! restarts with a fresh clock; a client's clock steps (within the assumed skew); another
//! name of the same slot raises a counter.
//!
//! Two simplifications, each of which only gives the adversary less than nothing: a reply
//! arrives when its request's last command ran (a later arrival only delays the client's
//! decision, and every step after the decision may be delayed as it is); an attempt that is
//! over drops what it has not run yet (a late `SET` is released as soon as it landed, a
//! late `ZADD` could only raise a counter, and a late renewal runs at once, no later than
//! it would have).
//!
//! The clients decide with the crate's own code: the proposal ([`capped_proposal`], the
//! nodes' clocks being real time), each reply's
//! parsing ([`parse_acquire`] of the pipeline's answer, built as a node sends it) and what
//! it counts for ([`PhaseOne::take`]), the quorums ([`Votes`]), whether to read
//! ([`PhaseOne::needs_read`]), the counters read ([`PhaseOne::read`]), the number
//! ([`PhaseOne::number`]), phase 2's nodes ([`PhaseOne::refused`]), the validity
//! ([`validity`]), the renewal schedule ([`due_after`], [`mark_of`], [`set_expiry_ms`],
//! [`renewal_interval`]). Two rules are the model's own: the nodes follow Redis's rules for
//! the commands (the server is not ours), and an answer counts only if it came before the
//! node timeout ([`in_time`]: a round gives its calls up at its deadline with tokio's
//! timer, which the model cannot call).
//!
//! What it asserts, whenever an acquisition returns a number `n`:
//! - **real-time order**: `n` is above every number returned before the acquisition
//!   started;
//! - **holder order**: `n` is above every number returned before the `SET`s of the nodes
//!   whose grants it counted ran (a later holder of the lock has a higher number, even one
//!   that started earlier).
//!
//! Counters are lost only where the proof allows for it: by a restart or a failover (the
//! node is quarantined for the TTL) and by the expiry of a set a retention after its last
//! renewal. There the clocks protect the numbers, and each scope keeps the clients' clocks
//! within the proof's bound: two clocks differ by less than the TTL minus the node timeout,
//! and less than the retention minus the node timeout. With clocks further apart the check
//! fails (a test shows it).
//!
//! `cargo test --lib fencing::model` runs the fast mode (the five scopes of [`FAST`], about
//! 12 million states, 20 s); `FENCING_MODEL=long cargo test --release --lib fencing::model
//! -- --nocapture` adds the larger scopes of [`LONG`]. The shipped rules pass; each mutant
//! test replaces one rule and asserts that the check fails.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::Duration;

use redis::Value;

use super::{Number, PhaseOne, accepts, capped_proposal};
use crate::error::NodeError;
use crate::node::{due_after, mark_of, renewal_interval, set_expiry_ms};
use crate::quorum::{Outcome, quorum, validity};
use crate::scripts::parse_acquire;
use crate::votes::Votes;

/// The rules under check: the node's `ZADD GT CH`, and the client's decisions. The shipped
/// ones are the crate's own; a mutant replaces one.
#[derive(Clone, Copy)]
struct Rules {
    /// The counter after `ZADD GT CH proposal` on `counter`, and its answer (changed).
    zadd: fn(Option<u64>, u64) -> (Option<u64>, bool),
    needs_read: fn(&PhaseOne, usize) -> bool,
    number: fn(&PhaseOne, usize) -> Number,
    /// Whether an answer at a tick counts for a deadline.
    in_time: fn(u16, u16) -> bool,
    /// Whether a request renews: the mark, the connection, the second, the interval.
    renewal_due: fn(u64, u64, u32, u32) -> bool,
}

/// Whether an answer at tick `answered` counts for a request whose node timeout ends at
/// `deadline`. (The model's own: a [`Round`](crate::round::Round) gives up its calls at
/// its deadline with tokio's timer, and only counts what answered before.)
fn in_time(answered: u16, deadline: u16) -> bool {
    answered < deadline
}

/// Redis's `ZADD GT CH`: a missing member is added; an existing one is raised only above.
fn zadd_gt(counter: Option<u64>, p: u64) -> (Option<u64>, bool) {
    match counter {
        Some(c) if !accepts(c, p) => (counter, false),
        _ => (Some(p), true),
    }
}

/// The protocol as shipped.
const SHIPPED: Rules = Rules {
    zadd: zadd_gt,
    needs_read: PhaseOne::needs_read,
    number: PhaseOne::number,
    in_time,
    renewal_due: due_after,
};

/// The size of a model and its adversary. Times are in ticks; a tick is a second for
/// the renewal schedule.
#[derive(Debug, Clone, Copy)]
struct Scope {
    name: &'static str,
    nodes: usize,
    clients: usize,
    /// Acquisitions per client, up to 2 clients (the first `clients` count).
    acquisitions: [u8; 2],
    /// The last tick.
    ticks: u16,
    /// Microseconds of a client's clock per tick.
    us_per_tick: u64,
    /// The clock offsets (µs) a client may start with and step to.
    skews: &'static [i64],
    ttl: u16,
    /// The node timeout: an answer counts only if it came this many ticks after the start.
    timeout: u16,
    /// The fencing retention; 0: sets never expire (and requests carry no renewal).
    retention: u16,
    /// Whether phase 1's commands on a node are steps of their own (other connections'
    /// commands run between them; a dropped connection cuts the pipeline), or one step.
    split: bool,
    faults: Faults,
    /// States to explore at most (a guard: the check fails beyond it).
    max_states: usize,
}

/// How many of each fault a run may have.
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    drops: u8,
    restarts: u8,
    /// Failovers to a replica that has the keys but not the counters.
    losses: u8,
    /// Lock keys that vanish early.
    expiries: u8,
    client_restarts: u8,
    clock_steps: u8,
    /// Raises of a counter by another name of the slot.
    neighbours: u8,
}

/// Clocks a tick apart, in either direction.
const SKEWED: &[i64] = &[-10, 0, 10];

/// The fast mode's scopes: each kills at least one mutant (see the tests), and the shipped
/// rules pass all of them.
const FAST: [Scope; 5] = [
    // Contention, the order of every command and reply, a dropped connection.
    Scope {
        name: "3 nodes, 2 clients, 1 acquisition each, a dropped connection",
        nodes: 3,
        clients: 2,
        acquisitions: [1, 1],
        ticks: 1,
        us_per_tick: 10,
        skews: SKEWED,
        ttl: 3,
        timeout: 2,
        retention: 0,
        split: true,
        faults: Faults {
            drops: 1,
            ..NO_FAULTS
        },
        max_states: 30_000_000,
    },
    // Five nodes: quorums of three.
    Scope {
        name: "5 nodes, 2 clients, 1 acquisition each",
        nodes: 5,
        clients: 2,
        acquisitions: [1, 1],
        ticks: 1,
        us_per_tick: 10,
        skews: &[-10, 10],
        ttl: 3,
        timeout: 2,
        retention: 0,
        split: false,
        faults: NO_FAULTS,
        max_states: 30_000_000,
    },
    // Restarts and failovers that lose counters, answers after the node timeout.
    Scope {
        name: "3 nodes, 2 clients, a restart and a failover",
        nodes: 3,
        clients: 2,
        acquisitions: [1, 1],
        ticks: 4,
        us_per_tick: 50,
        skews: &[-70, 70],
        ttl: 4,
        timeout: 1,
        retention: 0,
        split: false,
        faults: Faults {
            restarts: 1,
            losses: 1,
            ..NO_FAULTS
        },
        max_states: 30_000_000,
    },
    // Client restarts, clock steps, neighbours.
    Scope {
        name: "3 nodes, 2 clients, fresh clocks, steps and neighbours",
        nodes: 3,
        clients: 2,
        acquisitions: [1, 1],
        ticks: 1,
        us_per_tick: 10,
        skews: &[-10, 10],
        ttl: 3,
        timeout: 2,
        retention: 0,
        split: false,
        faults: Faults {
            client_restarts: 1,
            clock_steps: 1,
            neighbours: 1,
            ..NO_FAULTS
        },
        max_states: 30_000_000,
    },
    // Sets that expire a retention after their last renewal, connections that drop.
    Scope {
        name: "1 node, 2 clients, renewals over dropped connections",
        nodes: 1,
        clients: 2,
        acquisitions: [5, 1],
        ticks: 6,
        us_per_tick: 100,
        skews: &[-190, 190],
        ttl: 1,
        timeout: 1,
        retention: 4,
        split: false,
        faults: Faults {
            drops: 3,
            ..NO_FAULTS
        },
        max_states: 30_000_000,
    },
];

/// No faults.
const NO_FAULTS: Faults = Faults {
    drops: 0,
    restarts: 0,
    losses: 0,
    expiries: 0,
    client_restarts: 0,
    clock_steps: 0,
    neighbours: 0,
};

/// The long mode's scopes, on top of the fast ones (release build: 6.8 and 18.4 million
/// states, about 1.5 min in all on a small machine).
const LONG: [Scope; 2] = [
    Scope {
        name: "3 nodes, 2 clients, 2 + 1 acquisitions, split commands, a drop",
        nodes: 3,
        clients: 2,
        acquisitions: [2, 1],
        ticks: 1,
        us_per_tick: 10,
        skews: SKEWED,
        ttl: 3,
        timeout: 1,
        retention: 0,
        split: true,
        faults: Faults {
            drops: 1,
            ..NO_FAULTS
        },
        max_states: 500_000_000,
    },
    Scope {
        name: "3 nodes, 2 clients, a restart, a drop, an early expiry, a clock step",
        nodes: 3,
        clients: 2,
        acquisitions: [1, 1],
        ticks: 4,
        us_per_tick: 50,
        skews: &[-70, 70],
        ttl: 4,
        timeout: 1,
        retention: 0,
        split: false,
        faults: Faults {
            drops: 1,
            restarts: 1,
            expiries: 1,
            clock_steps: 1,
            ..NO_FAULTS
        },
        max_states: 500_000_000,
    },
];

/// A read or a phase-2 request to one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Flight {
    /// Not sent.
    Idle,
    /// Sent, not run yet.
    Out,
    /// Answered, failed, or not needed.
    Done,
}

/// Phase 1 on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum One {
    Idle,
    /// On the connection: `ran` of its commands have run (`SET`, `ZADD`, the renewal);
    /// what the `SET` and the `ZADD` answered, and the highest number returned when the
    /// `SET` ran.
    Queued {
        ran: u8,
        renew: bool,
        set: bool,
        changed: bool,
        floor: u64,
    },
    Done,
}

/// What the client took from a node's phase-1 reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Got {
    /// Nothing yet.
    Nothing,
    /// The reply (`set`, `changed`: as the pipeline answered), with the holder floor of
    /// its `SET`.
    Reply {
        set: bool,
        changed: bool,
        floor: u64,
    },
    /// The node failed: no answer in time, or the connection dropped.
    Failed,
}

/// One attempt's requests to one node, and what they answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Reqs {
    one: One,
    got: Got,
    read: Flight,
    /// The counter read (`Some(None)`: none), or `None`.
    read_got: Option<Option<u64>>,
    read_failed: bool,
    /// Phase 2's number rides with it.
    two: Flight,
    two_token: u64,
    /// Whether phase 2 recorded the number (`Some(false)`: the lock was not ours, or it
    /// failed).
    two_got: Option<bool>,
}

const NO_REQS: Reqs = Reqs {
    one: One::Idle,
    got: Got::Nothing,
    read: Flight::Idle,
    read_got: None,
    read_failed: false,
    two: Flight::Idle,
    two_token: 0,
    two_got: None,
};

/// A client's connection to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Conn {
    generation: u64,
    /// The renewal mark of the set (see `node::renewals`).
    mark: u64,
}

/// One node, with everything about it (so that sorting the nodes maps a state onto the
/// states that differ from it only in the nodes' order).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct NodeSt {
    /// The attempt whose key is set, and the tick it expires.
    lock: Option<(u8, u16)>,
    counter: Option<u64>,
    /// When the set of counters expires (`None`: never).
    set_expires: Option<u16>,
    quarantined_until: u16,
    /// Per client.
    conns: Vec<Conn>,
    /// Per attempt.
    reqs: Vec<Reqs>,
}

/// Where an attempt is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Stage {
    One,
    Read,
    Two(u64),
    Over,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Attempt {
    client: u8,
    started: u16,
    proposal: u64,
    stage: Stage,
    /// The highest number returned before it started.
    floor: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Client {
    skew: i64,
    /// Its hybrid clock's floor.
    highest: u64,
    left: u8,
    attempt: Option<u8>,
}

/// The faults a state has still to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Left {
    drops: u8,
    restarts: u8,
    losses: u8,
    expiries: u8,
    client_restarts: u8,
    clock_steps: u8,
    neighbours: u8,
}

/// A state of the system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    tick: u16,
    clients: Vec<Client>,
    attempts: Vec<Attempt>,
    nodes: Vec<NodeSt>,
    /// The highest number returned so far.
    returned: u64,
    left: Left,
}

/// A step.
#[derive(Debug, Clone, Copy)]
enum Step {
    Tick,
    Start(usize),
    /// The next command of attempt `.0`'s phase 1 on node `.1` (after the last, its
    /// reply arrives).
    Run(usize, usize),
    /// The read of node `.1`'s counter, answered at once.
    Read(usize, usize),
    /// Phase 2 on node `.1`, answered at once.
    Two(usize, usize),
    /// Client `.0`'s connection to node `.1`.
    Drop(usize, usize),
    Restart(usize),
    Loss(usize),
    Expire(usize),
    ClientRestart(usize),
    ClockJump(usize, i64),
    /// Client `.1` raises node `.0`'s counter for another name of the slot.
    Neighbour(usize, usize),
}

/// The model: a scope and its rules.
struct Model {
    scope: Scope,
    rules: Rules,
}

impl Model {
    fn quorum(&self) -> usize {
        quorum(self.scope.nodes)
    }

    /// A client's clock at `tick`, in µs (real time starts far from 0).
    fn clock(&self, tick: u16, skew: i64) -> u64 {
        let real = 1_000_000 + u64::from(tick) * self.scope.us_per_tick;
        real.saturating_add_signed(skew)
    }

    /// A client's proposal at `tick`: its clock, capped by the nodes' clocks (real time)
    /// plus a bound as wide as the scope's skew.
    fn propose(&self, tick: u16, client: Client) -> u64 {
        let bound = self
            .scope
            .skews
            .iter()
            .map(|k| k.unsigned_abs())
            .max()
            .unwrap_or(0);
        let cap = self.clock(tick, 0).saturating_add(bound);
        capped_proposal(self.clock(tick, client.skew), client.highest, Some(cap))
    }

    /// The set's expiry a renewal gives, in ticks.
    fn set_expiry(&self) -> u16 {
        let retention = Duration::from_secs(u64::from(self.scope.retention));
        u16::try_from(set_expiry_ms(retention) / 1000).unwrap_or(u16::MAX)
    }

    /// The renewal interval, in ticks.
    fn renew_every(&self) -> u32 {
        let retention = Duration::from_secs(u64::from(self.scope.retention));
        u32::try_from(renewal_interval(retention).as_secs()).unwrap_or(u32::MAX)
    }

    /// The states to start from: every combination of the clients' clock offsets.
    fn initial(&self) -> Vec<State> {
        let s = &self.scope;
        let mut combos: Vec<Vec<i64>> = vec![Vec::new()];
        for _ in 0..s.clients {
            combos = combos
                .into_iter()
                .flat_map(|c| {
                    s.skews.iter().map(move |k| {
                        let mut c = c.clone();
                        c.push(*k);
                        c
                    })
                })
                .collect();
        }
        let f = s.faults;
        combos
            .into_iter()
            .map(|skews| State {
                tick: 0,
                clients: skews
                    .into_iter()
                    .enumerate()
                    .map(|(c, skew)| Client {
                        skew,
                        highest: 0,
                        left: s.acquisitions[c],
                        attempt: None,
                    })
                    .collect(),
                attempts: Vec::new(),
                nodes: vec![
                    NodeSt {
                        lock: None,
                        counter: None,
                        set_expires: None,
                        quarantined_until: 0,
                        conns: vec![
                            Conn {
                                generation: 1,
                                mark: 0
                            };
                            s.clients
                        ],
                        reqs: Vec::new(),
                    };
                    s.nodes
                ],
                returned: 0,
                left: Left {
                    drops: f.drops,
                    restarts: f.restarts,
                    losses: f.losses,
                    expiries: f.expiries,
                    client_restarts: f.client_restarts,
                    clock_steps: f.clock_steps,
                    neighbours: f.neighbours,
                },
            })
            .collect()
    }

    /// Every step possible in `st`.
    fn steps(&self, st: &State) -> Vec<Step> {
        let mut out = Vec::new();
        if st.tick < self.scope.ticks {
            out.push(Step::Tick);
        }
        for (c, client) in st.clients.iter().enumerate() {
            if client.attempt.is_none() && client.left > 0 {
                out.push(Step::Start(c));
            }
            if st.left.client_restarts > 0 {
                out.push(Step::ClientRestart(c));
            }
            if st.left.clock_steps > 0 {
                for &k in self.scope.skews.iter().filter(|k| **k != client.skew) {
                    out.push(Step::ClockJump(c, k));
                }
            }
        }
        for (i, node) in st.nodes.iter().enumerate() {
            // A connection runs its requests in the order they were sent: per client, the
            // first one still to run on the node is the only one that can.
            let mut next: Vec<Option<Step>> = vec![None; self.scope.clients];
            for (a, r) in node.reqs.iter().enumerate() {
                let c = usize::from(st.attempts[a].client);
                let step = if matches!(r.one, One::Queued { .. }) {
                    Step::Run(a, i)
                } else if r.read == Flight::Out {
                    Step::Read(a, i)
                } else if r.two == Flight::Out {
                    Step::Two(a, i)
                } else {
                    continue;
                };
                next[c].get_or_insert(step);
            }
            out.extend(next.into_iter().flatten());
            if st.left.drops > 0 {
                out.extend((0..self.scope.clients).map(|c| Step::Drop(c, i)));
            }
            if st.left.restarts > 0 {
                out.push(Step::Restart(i));
            }
            if st.left.losses > 0 && node.counter.is_some() {
                out.push(Step::Loss(i));
            }
            if st.left.expiries > 0 && node.lock.is_some() {
                out.push(Step::Expire(i));
            }
            if st.left.neighbours > 0 {
                out.extend((0..self.scope.clients).map(|c| Step::Neighbour(i, c)));
            }
        }
        out
    }

    /// Takes `step` in `st`: an error names a violated property.
    fn take(&self, st: &mut State, step: Step) -> Result<(), String> {
        match step {
            Step::Tick => return self.tick(st),
            Step::Start(c) => self.start(st, c),
            Step::Run(a, i) => self.run(st, a, i),
            Step::Read(a, i) => {
                // Run and answered at once: a late read only delays the decision, which
                // the order of the other nodes' steps already covers. A quarantined node
                // fails it (the connection it goes on is new).
                let node = &mut st.nodes[i];
                if st.tick < node.quarantined_until {
                    node.reqs[a].read_failed = true;
                } else {
                    node.reqs[a].read_got = Some(node.counter);
                }
                node.reqs[a].read = Flight::Done;
            }
            Step::Two(a, i) => self.run_two(st, a, i),
            Step::Drop(c, i) => {
                st.left.drops -= 1;
                self.drop_conn(st, c, i);
            }
            Step::Restart(i) => {
                st.left.restarts -= 1;
                let node = &mut st.nodes[i];
                node.lock = None;
                self.lose(st, i);
            }
            Step::Loss(i) => {
                st.left.losses -= 1;
                self.lose(st, i);
            }
            Step::Expire(i) => {
                st.left.expiries -= 1;
                st.nodes[i].lock = None;
            }
            Step::ClientRestart(c) => self.restart_client(st, c),
            Step::ClockJump(c, k) => {
                st.left.clock_steps -= 1;
                st.clients[c].skew = k;
            }
            Step::Neighbour(i, c) => {
                st.left.neighbours -= 1;
                let node = &st.nodes[i];
                if st.tick >= node.quarantined_until {
                    let client = st.clients[c];
                    let p = self.propose(st.tick, client);
                    st.clients[c].highest = p;
                    let counter = st.nodes[i].counter;
                    st.nodes[i].counter = (self.rules.zadd)(counter, p).0;
                }
            }
        }
        self.decide_all(st)
    }

    fn tick(&self, st: &mut State) -> Result<(), String> {
        st.tick += 1;
        let tick = st.tick;
        for node in &mut st.nodes {
            if node.lock.is_some_and(|(_, until)| until <= tick) {
                node.lock = None;
            }
            if node.set_expires.is_some_and(|until| until <= tick) {
                node.counter = None;
                node.set_expires = None;
            }
        }
        self.decide_all(st)
    }

    fn start(&self, st: &mut State, c: usize) {
        let client = st.clients[c];
        let p = self.propose(st.tick, client);
        let a = st.attempts.len();
        st.attempts.push(Attempt {
            client: u8::try_from(c).unwrap_or(0),
            started: st.tick,
            proposal: p,
            stage: Stage::One,
            floor: st.returned,
        });
        let every = self.renew_every();
        let tick = u32::from(st.tick);
        let renewing = self.scope.retention > 0;
        for node in &mut st.nodes {
            let conn = &mut node.conns[c];
            let renew =
                renewing && (self.rules.renewal_due)(conn.mark, conn.generation, tick, every);
            if renew {
                conn.mark = mark_of(conn.generation, tick);
            }
            let mut reqs = NO_REQS;
            reqs.one = One::Queued {
                ran: 0,
                renew,
                set: false,
                changed: false,
                floor: 0,
            };
            node.reqs.push(reqs);
        }
        let client = &mut st.clients[c];
        client.highest = p;
        client.left -= 1;
        client.attempt = u8::try_from(a).ok();
    }

    /// The next command of phase 1 on node `i`. A quarantined node fails the request.
    fn run(&self, st: &mut State, a: usize, i: usize) {
        let (tick, returned) = (st.tick, st.returned);
        let over = st.attempts[a].stage == Stage::Over;
        let p = st.attempts[a].proposal;
        let node = &mut st.nodes[i];
        let One::Queued {
            ran,
            renew,
            mut set,
            mut changed,
            mut floor,
        } = node.reqs[a].one
        else {
            return;
        };
        if tick < node.quarantined_until {
            node.reqs[a].one = One::Done;
            if node.reqs[a].got == Got::Nothing {
                node.reqs[a].got = Got::Failed;
            }
            return;
        }
        let total = 2 + u8::from(renew);
        let mut ran = ran;
        while ran < total {
            match ran {
                0 => {
                    set = node.lock.is_none();
                    if set {
                        // A SET that lands after its attempt ended is released once it
                        // landed.
                        node.lock =
                            (!over).then(|| (u8::try_from(a).unwrap_or(0), tick + self.scope.ttl));
                    }
                    floor = returned;
                }
                1 => {
                    let (counter, ch) = (self.rules.zadd)(node.counter, p);
                    if node.counter.is_none() && counter.is_some() {
                        node.set_expires = None; // a new set, without an expiry
                    }
                    node.counter = counter;
                    changed = ch;
                }
                _ => {
                    if node.counter.is_some() {
                        node.set_expires = Some(tick.saturating_add(self.set_expiry()));
                    }
                }
            }
            ran += 1;
            if self.scope.split && ran < total {
                node.reqs[a].one = One::Queued {
                    ran,
                    renew,
                    set,
                    changed,
                    floor,
                };
                return;
            }
        }
        node.reqs[a].one = One::Done;
        // The reply arrives: taken while the attempt is in phase 1, and in time. (A reply
        // that comes later than its last command ran gives the adversary nothing more:
        // the client would decide later on the same replies, and every step it takes
        // after deciding may be delayed as it is.)
        let attempt = st.attempts[a];
        let in_time = (self.rules.in_time)(tick, attempt.started + self.scope.timeout);
        let r = &mut st.nodes[i].reqs[a];
        if attempt.stage == Stage::One && r.got == Got::Nothing {
            r.got = if in_time {
                Got::Reply {
                    set,
                    changed,
                    floor,
                }
            } else {
                Got::Failed
            };
        }
    }

    /// Phase 2's script on node `i`: raises the counter only where the lock is ours.
    fn run_two(&self, st: &mut State, a: usize, i: usize) {
        let tick = st.tick;
        let expiry = self.set_expiry();
        let renewing = self.scope.retention > 0;
        let node = &mut st.nodes[i];
        let token = node.reqs[a].two_token;
        let ours = tick >= node.quarantined_until
            && node
                .lock
                .is_some_and(|(holder, _)| usize::from(holder) == a);
        if ours {
            node.counter = (self.rules.zadd)(node.counter, token).0;
            node.set_expires = renewing.then(|| tick.saturating_add(expiry));
        }
        // Answered at once, like a read.
        node.reqs[a].two = Flight::Done;
        node.reqs[a].two_got = Some(ours);
    }

    /// Client `c`'s connection to node `i` drops: what was still to run never runs,
    /// replies on their way are lost, and the next request goes on a new connection.
    fn drop_conn(&self, st: &mut State, c: usize, i: usize) {
        let node = &mut st.nodes[i];
        node.conns[c].generation += 1;
        for (a, attempt) in st.attempts.iter().enumerate() {
            if usize::from(attempt.client) != c {
                continue;
            }
            let r = &mut node.reqs[a];
            if matches!(r.one, One::Queued { .. }) {
                r.one = One::Done;
                if r.got == Got::Nothing {
                    r.got = Got::Failed;
                }
            }
            if r.read == Flight::Out {
                r.read = Flight::Done;
                r.read_failed = true;
            }
            if r.two == Flight::Out {
                r.two = Flight::Done;
                r.two_got.get_or_insert(false);
            }
        }
    }

    /// Node `i` loses its counters (a restart, which loses its keys too, or a failover to
    /// a replica that lacks them): every connection to it drops, and the clients
    /// quarantine it for the TTL.
    fn lose(&self, st: &mut State, i: usize) {
        let node = &mut st.nodes[i];
        node.counter = None;
        node.set_expires = None;
        node.quarantined_until = st.tick + self.scope.ttl;
        for c in 0..self.scope.clients {
            self.drop_conn(st, c, i);
        }
    }

    /// Client `c` restarts: a fresh clock and new connections; its attempt is abandoned
    /// (its commands in flight still run, its keys expire with their TTL).
    fn restart_client(&self, st: &mut State, c: usize) {
        st.left.client_restarts -= 1;
        let client = &mut st.clients[c];
        client.highest = 0;
        if let Some(a) = client.attempt.take() {
            // Abandoned: its keys stay until they expire.
            let a = usize::from(a);
            for node in &mut st.nodes {
                if let Some((holder, _)) = &mut node.lock
                    && usize::from(*holder) == a
                {
                    *holder = GONE;
                }
            }
            self.fail(st, a);
        }
        for node in &mut st.nodes {
            let conn = &mut node.conns[c];
            conn.generation += 1;
            conn.mark = 0;
        }
    }

    fn decide_all(&self, st: &mut State) -> Result<(), String> {
        for a in 0..st.attempts.len() {
            self.decide(st, a)?;
        }
        Ok(())
    }

    /// Phase 1 as the client has it: its [`PhaseOne`] and votes, from the replies taken
    /// (a request not answered by its deadline counts as failed).
    fn phase_one(&self, st: &State, a: usize) -> (PhaseOne, Votes) {
        let attempt = st.attempts[a];
        let mut p1 = PhaseOne::new(attempt.proposal);
        let mut votes = Votes::new(self.scope.nodes);
        let expired = !(self.rules.in_time)(st.tick, attempt.started + self.scope.timeout);
        for (i, node) in st.nodes.iter().enumerate() {
            let r = &node.reqs[a];
            let reply = match r.got {
                Got::Reply { set, changed, .. } => Some(pipeline_reply(set, changed)),
                Got::Failed => None,
                Got::Nothing if expired => None,
                Got::Nothing => continue,
            };
            let parsed = reply.map(parse_acquire).and_then(Result::ok);
            let outcome = p1.take(i, parsed.as_ref());
            votes.count("node", Ok(outcome));
        }
        (p1, votes)
    }

    /// Attempt `a` decides, if it can.
    fn decide(&self, st: &mut State, a: usize) -> Result<(), String> {
        let attempt = st.attempts[a];
        if attempt.stage == Stage::Over {
            return Ok(());
        }
        let elapsed = Duration::from_secs(u64::from(st.tick - attempt.started));
        let ttl = Duration::from_secs(u64::from(self.scope.ttl));
        if validity(ttl, elapsed, Duration::ZERO).is_none() {
            self.fail(st, a);
            return Ok(());
        }
        let q = self.quorum();
        let (mut p1, votes) = self.phase_one(st, a);
        if !votes.reached() {
            if !votes.undecided() {
                self.fail(st, a);
            }
            return Ok(());
        }
        match attempt.stage {
            Stage::One if (self.rules.needs_read)(&p1, q) => {
                st.attempts[a].stage = Stage::Read;
                for i in 0..self.scope.nodes {
                    if !p1.refused.contains(i)
                        && matches!(st.nodes[i].reqs[a].got, Got::Reply { .. })
                    {
                        st.nodes[i].reqs[a].read = Flight::Out;
                    }
                }
            }
            Stage::One => return self.number(st, a, &p1),
            Stage::Read => {
                let mut reads = Votes::new(self.scope.nodes);
                for node in &st.nodes {
                    let r = &node.reqs[a];
                    if r.read == Flight::Idle && r.read_got.is_none() && !r.read_failed {
                        reads.skipped(); // not asked: its grant was not counted
                    } else if let Some(counter) = r.read_got {
                        let outcome = p1.read(counter).map(|()| Outcome::Granted);
                        reads.count("node", outcome);
                    } else if r.read_failed {
                        reads.count("node", Err(NodeError::Timeout));
                    }
                }
                if reads.reached() {
                    let highest = p1.highest().unwrap_or(0);
                    let client = &mut st.clients[usize::from(attempt.client)];
                    client.highest = client.highest.max(highest);
                    return self.number(st, a, &p1);
                }
                if !reads.undecided() {
                    self.fail(st, a);
                }
            }
            Stage::Two(t) => {
                let mut recorded = Votes::new(self.scope.nodes);
                for (i, node) in st.nodes.iter().enumerate() {
                    if p1.refused.contains(i) {
                        recorded.skipped();
                        continue;
                    }
                    match node.reqs[a].two_got {
                        Some(true) => recorded.count("node", Ok(Outcome::Granted)),
                        Some(false) => {
                            recorded.count("node", Err(NodeError::LockLost));
                        }
                        None => {}
                    }
                }
                if recorded.reached() {
                    return self.returned(st, a, t);
                }
                if !recorded.undecided() {
                    self.fail(st, a);
                }
            }
            Stage::Over => {}
        }
        Ok(())
    }

    /// The number of attempt `a`, whose phase one is `p1` (read if it needed to be).
    fn number(&self, st: &mut State, a: usize, p1: &PhaseOne) -> Result<(), String> {
        match (self.rules.number)(p1, self.quorum()) {
            Number::Accepted(n) => self.returned(st, a, n),
            Number::Raise(t) => {
                st.attempts[a].stage = Stage::Two(t);
                for i in 0..self.scope.nodes {
                    // Every node but those that refused (unanswered ones too).
                    if !p1.refused.contains(i) {
                        let r = &mut st.nodes[i].reqs[a];
                        r.two = Flight::Out;
                        r.two_token = t;
                    }
                }
                Ok(())
            }
        }
    }

    /// Attempt `a` failed: released everywhere at once (a late release only makes the
    /// adversary weaker), and its client goes on.
    ///
    /// What it has not yet run is dropped: a `SET` that lands late is released as soon as
    /// it landed; its `ZADD` could only raise a counter, which never lowers a number; a
    /// renewal it carried runs now (no later than it would have, so the set lives no
    /// longer than it would have).
    fn fail(&self, st: &mut State, a: usize) {
        let (tick, expiry) = (st.tick, self.set_expiry());
        for node in &mut st.nodes {
            if node
                .lock
                .is_some_and(|(holder, _)| usize::from(holder) == a)
            {
                node.lock = None;
            }
            let r = &mut node.reqs[a];
            if let One::Queued { ran, renew, .. } = r.one {
                if renew && ran < 3 && node.counter.is_some() && tick >= node.quarantined_until {
                    node.set_expires = Some(tick.saturating_add(expiry));
                }
                r.one = One::Done;
            }
            if r.read == Flight::Out {
                r.read = Flight::Done;
            }
            if r.two == Flight::Out {
                r.two = Flight::Done;
            }
        }
        let attempt = &mut st.attempts[a];
        attempt.stage = Stage::Over;
        let c = usize::from(attempt.client);
        if st.clients[c].attempt == u8::try_from(a).ok() {
            st.clients[c].attempt = None;
        }
    }

    /// Attempt `a` returned number `n`: checked, then the holder releases.
    fn returned(&self, st: &mut State, a: usize, n: u64) -> Result<(), String> {
        let attempt = st.attempts[a];
        if n <= attempt.floor {
            return Err(format!(
                "real-time order: attempt {a} started after a number {} was returned, and \
                 got {n}",
                attempt.floor
            ));
        }
        // The nodes whose grant it counted: their SETs ran after every number up to the
        // least of their floors was returned.
        let holder_floor = st
            .nodes
            .iter()
            .filter_map(|node| match node.reqs[a].got {
                Got::Reply {
                    set: true, floor, ..
                } => Some(floor),
                _ => None,
            })
            .min()
            .unwrap_or(0);
        if n <= holder_floor {
            return Err(format!(
                "holder order: attempt {a} took the lock after a number {holder_floor} was \
                 returned, and got {n}"
            ));
        }
        st.returned = st.returned.max(n);
        let client = &mut st.clients[usize::from(attempt.client)];
        client.highest = client.highest.max(n);
        self.fail(st, a);
        Ok(())
    }

    /// Explores every state reachable from the initial ones: how many, or the first
    /// violation.
    fn explore(&self) -> Result<usize, String> {
        let mut seen: HashSet<u64, BuildHasherDefault<Identity>> = HashSet::default();
        let mut stack = self.initial();
        for st in &stack {
            seen.insert(fingerprint(st));
        }
        while let Some(st) = stack.pop() {
            if seen.len() > self.scope.max_states {
                return Err(format!(
                    "{}: more than {} states",
                    self.scope.name, self.scope.max_states
                ));
            }
            for step in self.steps(&st) {
                let mut next = st.clone();
                self.take(&mut next, step).map_err(|e| {
                    format!("{e} ({}; after {step:?} from {st:?})", self.scope.name)
                })?;
                compact(&mut next);
                next.nodes.sort();
                if seen.insert(fingerprint(&next)) {
                    stack.push(next);
                }
            }
        }
        Ok(seen.len())
    }
}

/// Forgets the attempts that are over and have nothing left to run: states that differ
/// only in what such attempts did are one. (Their keys stay, held by nobody alive.)
fn compact(st: &mut State) {
    let live: Vec<bool> = (0..st.attempts.len())
        .map(|a| {
            st.attempts[a].stage != Stage::Over
                || st.nodes.iter().any(|node| {
                    let r = &node.reqs[a];
                    matches!(r.one, One::Queued { .. })
                        || r.read == Flight::Out
                        || r.two == Flight::Out
                })
        })
        .collect();
    if live.iter().all(|l| *l) {
        return;
    }
    let mut index = vec![GONE; live.len()];
    let mut next = 0u8;
    for (a, l) in live.iter().enumerate() {
        if *l {
            index[a] = next;
            next += 1;
        }
    }
    let mut a = 0;
    st.attempts.retain(|_| {
        a += 1;
        live[a - 1]
    });
    for node in &mut st.nodes {
        let mut a = 0;
        node.reqs.retain(|_| {
            a += 1;
            live[a - 1]
        });
        if let Some((holder, _)) = &mut node.lock
            && *holder != GONE
        {
            *holder = index[usize::from(*holder)];
        }
    }
    for client in &mut st.clients {
        if let Some(a) = &mut client.attempt {
            *a = index[usize::from(*a)];
        }
    }
}

/// The holder of a key whose attempt is forgotten.
const GONE: u8 = u8::MAX;

/// The answer of a fenced acquisition's pipeline on a node, as the node sends it: `SET`
/// and `ZADD GT CH` where the `SET` set the key; the holder script's where it did not.
fn pipeline_reply(set: bool, changed: bool) -> Value {
    if set {
        Value::Array(vec![Value::Okay, Value::Int(i64::from(changed))])
    } else {
        Value::Array(vec![Value::Int(0), Value::Int(1000), Value::Int(0)])
    }
}

/// A state's fingerprint (64 bits: collisions are negligible at these counts).
fn fingerprint(st: &State) -> u64 {
    let mut h = Fingerprint(0);
    st.hash(&mut h);
    h.finish()
}

/// A fast hash of a state's bytes (a multiply-rotate, word by word).
struct Fingerprint(u64);

impl Hasher for Fingerprint {
    fn finish(&self) -> u64 {
        // A last avalanche, so that the set's buckets see every bit.
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    fn write_i64(&mut self, i: i64) {
        self.write_u64(i.cast_unsigned());
    }
}

/// The visited states' set hashes fingerprints no further.
#[derive(Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }
}

/// Checks `scopes` with `rules`: the states explored per scope, or the first violation.
fn check(scopes: &[Scope], rules: Rules) -> Result<Vec<usize>, String> {
    scopes
        .iter()
        .map(|scope| {
            let started = std::time::Instant::now();
            let states = Model {
                scope: *scope,
                rules,
            }
            .explore()?;
            println!("{}: {states} states, {:?}", scope.name, started.elapsed());
            Ok(states)
        })
        .collect()
}

/// Checks `rules` in the fast scopes, and the long ones with `FENCING_MODEL=long`.
fn check_all(rules: Rules) -> Result<Vec<usize>, String> {
    let mut counts = check(&FAST, rules)?;
    if std::env::var("FENCING_MODEL").is_ok_and(|m| m == "long") {
        counts.extend(check(&LONG, rules)?);
    }
    Ok(counts)
}

/// Asserts that `mutant` fails the check, in `scope` (the first fast scope that finds it
/// is named in the test).
fn assert_caught(mutant: Rules, scope: usize) {
    let model = Model {
        scope: FAST[scope],
        rules: mutant,
    };
    match model.explore() {
        Err(violation) => println!("caught: {violation:.300}"),
        Ok(states) => panic!("the mutant passed {} ({states} states)", FAST[scope].name),
    }
}

#[test]
fn numbers_increase_in_real_time_and_holder_order() {
    // Prints each scope's states as it is done (`-- --nocapture`).
    if let Err(violation) = check_all(SHIPPED) {
        panic!("{violation}");
    }
}

/// A client that takes its proposal when one acceptance short of a quorum.
const ONE_SHORT: Rules = Rules {
    needs_read: |p1, quorum| p1.needs_read(quorum - 1),
    number: |p1, quorum| p1.number(quorum - 1),
    ..SHIPPED
};

#[test]
fn the_check_catches_taking_the_proposal_one_acceptance_short_with_3_nodes() {
    assert_caught(ONE_SHORT, 0);
}

#[test]
fn the_check_catches_taking_the_proposal_one_acceptance_short_with_5_nodes() {
    assert_caught(ONE_SHORT, 1);
}

#[test]
fn the_check_catches_counting_a_grant_that_answered_after_the_node_timeout() {
    let mutant = Rules {
        in_time: |_, _| true,
        ..SHIPPED
    };
    assert_caught(mutant, 2);
}

#[test]
fn the_check_catches_a_node_that_accepts_an_equal_counter() {
    let mutant = Rules {
        zadd: |counter, p| match counter {
            Some(c) if c > p => (counter, false),
            _ => (Some(p), true),
        },
        ..SHIPPED
    };
    assert_caught(mutant, 0);
}

#[test]
fn the_check_catches_a_zadd_without_gt() {
    let mutant = Rules {
        zadd: |counter, p| (Some(p), counter != Some(p)),
        ..SHIPPED
    };
    assert_caught(mutant, 0);
}

#[test]
fn the_check_catches_phase_2_without_the_read() {
    let mutant = Rules {
        needs_read: |_, _| false,
        ..SHIPPED
    };
    assert_caught(mutant, 0);
}

#[test]
fn the_check_catches_skipping_the_renewal_after_a_reconnect() {
    // Renewing by the clock only, whatever connection the last renewal went on.
    let mutant = Rules {
        renewal_due: |mark, _, now, every| {
            mark == 0
                || every == 0
                || u64::from(now) >= (mark & u64::from(u32::MAX)) + u64::from(every)
        },
        ..SHIPPED
    };
    assert_caught(mutant, 4);
}

#[test]
fn the_check_fails_when_clocks_are_further_apart_than_the_proof_allows() {
    // After a restart, clocks 16 ticks apart (the TTL is 4): a lagging client's proposal
    // is accepted below an earlier number.
    let far_apart = Scope {
        skews: &[-400, 400],
        ..FAST[2]
    };
    assert!(
        Model {
            scope: far_apart,
            rules: SHIPPED
        }
        .explore()
        .is_err(),
        "no violation found with the clocks far apart"
    );
}

#[test]
fn pipeline_replies_parse_as_the_acquisition_reads_them() {
    use crate::scripts::{AcquireReply, FenceRead};
    assert!(matches!(
        parse_acquire(pipeline_reply(true, true)),
        Ok(AcquireReply::Won {
            fence: Some(FenceRead::Accepted)
        })
    ));
    assert!(matches!(
        parse_acquire(pipeline_reply(true, false)),
        Ok(AcquireReply::Won {
            fence: Some(FenceRead::Refused)
        })
    ));
    assert!(matches!(
        parse_acquire(pipeline_reply(false, true)),
        Ok(AcquireReply::HeldElsewhere { ours: false, .. })
    ));
}
