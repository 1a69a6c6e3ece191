//! One seeded schedule of the simulation: 3 or 5 simulated servers, 2 or 3 clients (each
//! the crate's own `Core`, `Acquire`, `Release` and fencing clock over [`SimNodes`], with
//! its own TTL, fenced or not), which lock and release a few names at random moments,
//! while faults play: restarts with and without data, an append-only file that comes back
//! empty, FLUSHALL, failovers to a lagging replica (with `master_replid2` kept or
//! cleared), a replica attaching, `INFO` without `run_id`, partitions, slow and lost
//! replies, node clock steps within the drift bound. Everything runs on one thread with
//! tokio's paused clock, so a seed replays the same schedule.
//!
//! ```text
//! seed -> Plan (nodes, clients, faults)  -> play -> History (grants, refusals, faults)
//! ```

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::client::SimNodes;
use super::conn::Link;
use super::keyspace::Keyspace;
use super::server::Server;
use crate::core::{Accepts, AfterLoss, Core, CoreParts, Fenced, KeySpace, Timing};
use crate::error::LockError;
use crate::fencing::{Clock, Fencing};
use crate::name::CounterSets;
use crate::node::Horizon;
use crate::node::clocks::{NodeClocks, micros};
use crate::op::acquire::{Acquire, Acquired};
use crate::op::observe::Observe;
use crate::op::release::{Background, Deletion, Release};
use crate::waiters::Waiters;

/// A small seeded generator (SplitMix64).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 for `n` = 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// True with probability `percent` / 100.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration in `lo..hi` ms.
    pub(crate) fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo).max(1)))
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[usize::try_from(self.below(from.len() as u64)).unwrap_or(0)]
    }
}

/// A fault, at a moment of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// A restart that reloads the data (an append-only file).
    RestartKeep(usize),
    /// A restart without persistence: empty.
    RestartEmpty(usize),
    /// A restart with an append-only file on a volume that came back empty.
    AofLost(usize),
    /// FLUSHALL (seen within a check interval: a documented window).
    Flush(usize),
    /// A failover to a replica whose copy lags; `cleared`: its `master_replid2` cleared
    /// `repl-backlog-ttl` later (shorter than the longest TTL in one of two).
    FailOver { node: usize, cleared: bool },
    /// A replica attaches (a new replication id, nothing lost).
    AttachReplica(usize),
    /// `INFO` stops telling `run_id`.
    HideRunId(usize),
    /// A client cannot reach a node for a while.
    Partition { client: usize, node: usize },
    /// A client's replies from a node are lost for a while.
    LoseReplies { client: usize, node: usize },
    /// A client's link to a node gets slow for a while (µs one way).
    Slow { client: usize, node: usize, us: u64 },
    /// A node's clock steps by this many ms (within the drift bound, or, in a few
    /// schedules, seconds forward: see [`Fault::beyond_drift`]).
    ClockStep { node: usize, ms: i64 },
}

impl Fault {
    /// A fault drawn from `rng` on `node` (for links: `client`'s), only routine ones if
    /// `routine`, a clock step at most once a schedule (`stepped`).
    fn drawn(
        rng: &mut Rng,
        routine: bool,
        stepped: &mut bool,
        (node, client): (usize, usize),
    ) -> Self {
        match rng.below(if routine { 3 } else { 11 }) {
            0 => Self::AttachReplica(node),
            1 => Self::HideRunId(node),
            2 if !*stepped => {
                *stepped = true;
                let ms = i64::try_from(rng.below(3)).unwrap_or(0);
                Self::ClockStep {
                    node,
                    ms: if rng.chance(50) { ms } else { -ms },
                }
            }
            2 => Self::Slow {
                client,
                node,
                us: 1_000,
            },
            3 => Self::RestartKeep(node),
            4 => Self::RestartEmpty(node),
            5 => Self::AofLost(node),
            6 => Self::Flush(node),
            7 => Self::FailOver {
                node,
                cleared: rng.chance(50),
            },
            8 => Self::Partition { client, node },
            9 => Self::LoseReplies { client, node },
            _ => Self::Slow {
                client,
                node,
                us: 1_000 * rng.below(40),
            },
        }
    }

    /// The fault's kind, for counts.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Self::RestartKeep(_) => "restart keeping data",
            Self::RestartEmpty(_) => "restart empty",
            Self::AofLost(_) => "append-only file lost",
            Self::Flush(_) => "flushall",
            Self::FailOver { cleared: false, .. } => "failover",
            Self::FailOver { cleared: true, .. } => "failover, replid2 cleared",
            Self::AttachReplica(_) => "replica attached",
            Self::HideRunId(_) => "no run_id",
            Self::Partition { .. } => "partition",
            Self::LoseReplies { .. } => "lost replies",
            Self::Slow { .. } => "slow link",
            Self::ClockStep { .. } if self.beyond_drift() => "clock jump beyond the bound",
            Self::ClockStep { .. } => "clock step",
        }
    }

    /// The node that loses its data (the horizon with it) to this fault, if any.
    pub(crate) fn loses_data(self) -> Option<usize> {
        match self {
            Self::RestartEmpty(n) | Self::AofLost(n) | Self::Flush(n) => Some(n),
            Self::FailOver { node, .. } => Some(node),
            _ => None,
        }
    }

    /// Whether the fault may lose keys or refuse locks: a schedule with none of these
    /// must never refuse a lock nobody holds.
    pub(crate) fn is_routine(self) -> bool {
        matches!(self, Self::AttachReplica(_) | Self::HideRunId(_))
            || matches!(self, Self::ClockStep { .. } if !self.beyond_drift())
            || matches!(self, Self::Slow { us, .. } if us < 2_000)
    }

    /// Whether this is a node clock step beyond the drift bound (Redlock's own
    /// assumption: the node's keys expire early, and two holders may follow).
    pub(crate) fn beyond_drift(self) -> bool {
        matches!(self, Self::ClockStep { ms, .. } if ms.unsigned_abs() > DRIFT_STEP_MS)
    }
}

/// One client of the schedule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientPlan {
    pub(crate) ttl: Duration,
    pub(crate) fenced: bool,
    /// How far its wall clock is from the simulation's (µs): its fencing proposals.
    pub(crate) skew_us: i64,
    /// A replay client (the layer's replay): what it does with a key whose record may
    /// have been lost; its names are keys that complete with a record.
    pub(crate) replay: Option<AfterLoss>,
    /// When it starts.
    pub(crate) start: Duration,
    /// When it stops, as a process that dies does: wherever it is (an attempt's round, a
    /// lock held), nothing more is sent; its lock expires. `None`: it runs to the end.
    pub(crate) stop: Option<Duration>,
}

/// What a seed plays.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) seed: u64,
    pub(crate) nodes: usize,
    pub(crate) names: usize,
    pub(crate) clients: Vec<ClientPlan>,
    pub(crate) faults: Vec<(Duration, Fault)>,
    /// How long faults and locks play, before the healed end.
    pub(crate) length: Duration,
    /// How far a replica's copy lags.
    pub(crate) lag: Duration,
    /// Clocks far off (one schedule in ten): a node whose clock runs this far ahead of
    /// the others from the start (a minority: the proposals' cap must not follow it), and
    /// client 0, fenced, as far ahead as that; both beyond the fencing clock bound.
    pub(crate) far: Option<(usize, Duration)>,
    /// A read order schedule (see `read_order`): its first faults last the schedule.
    pub(crate) read_order: bool,
}

/// The largest node clock step within the drift bound, in ms.
const DRIFT_STEP_MS: u64 = 2;

/// The per-node timeout of every client (the shortest TTL is 10 times as long).
pub(crate) const NODE_TIMEOUT: Duration = Duration::from_millis(20);
/// The longest an acquisition may take: its rounds (the announce of a longer TTL, the
/// `SET`s, the counters' read and phase 2, or the release of a miss), each bounded by the
/// per-node timeout ("a paused or dead node never stalls an operation beyond its
/// per-node timeout").
pub(crate) const MAX_ACQUIRE: Duration = Duration::from_millis(4 * 20 + 1);
/// The longest a partition, lost replies or a slow link last.
pub(crate) const FAULTS_LAST: Duration = Duration::from_millis(1_500);
/// The background check's interval.
pub(crate) const CHECK_EVERY: Duration = crate::defaults::DEFAULT_CHECK_INTERVAL;
const TTLS: [u64; 3] = [200, 700, 2_000];

impl Plan {
    /// The schedule of `seed`.
    pub(crate) fn of(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let nodes = if rng.chance(25) { 5 } else { 3 };
        let mut side = Rng::new(seed ^ 0x7265_706c_6179);
        let mut stops = Rng::new(seed ^ 0x7374_6f70);
        let mut clients = (0..2 + rng.below(2))
            .map(|_| ClientPlan {
                replay: side.chance(30).then(|| {
                    if side.chance(50) {
                        AfterLoss::Run
                    } else {
                        AfterLoss::Refuse
                    }
                }),
                ttl: Duration::from_millis(rng.pick(&TTLS)),
                fenced: rng.chance(50),
                skew_us: if rng.chance(30) {
                    i64::try_from(rng.below(1_000_000)).unwrap_or(0) - 500_000
                } else {
                    0
                },
                start: rng.ms(0, 800),
                stop: stops.chance(20).then(|| stops.ms(900, 2_500)),
            })
            .collect::<Vec<_>>();
        let length = rng.ms(1_000, 2_500);
        let routine = rng.chance(30);
        let mut faults = Vec::new();
        let mut stepped = false;
        for _ in 0..rng.below(6) {
            let at = rng.ms(0, u64::try_from(length.as_millis()).unwrap_or(0));
            let node = usize::try_from(rng.below(nodes as u64)).unwrap_or(0);
            let client = usize::try_from(rng.below(clients.len() as u64)).unwrap_or(0);
            let fault = Fault::drawn(&mut rng, routine, &mut stepped, (node, client));
            faults.push((at, fault));
        }
        let read_order = read_order(seed, nodes, &mut clients, &mut faults);
        behind_a_proxy(seed, nodes, &mut faults);
        clock_jump(seed, nodes, length, &mut faults);
        let length = if read_order {
            length.max(Duration::from_millis(2_000))
        } else {
            length
        };
        faults.sort_by_key(|(at, _)| *at);
        assume_backlog_behind_proxies(&mut faults);
        let far = far_off(seed, nodes, &mut clients);
        Self {
            seed,
            nodes,
            names: 1 + usize::try_from(rng.below(2)).unwrap_or(0),
            clients,
            faults,
            length,
            lag: rng.ms(20, 150),
            far,
            read_order,
        }
    }

    /// The nodes that fail over in the schedule.
    pub(crate) fn failing(&self) -> Vec<usize> {
        let mut failing: Vec<usize> = self
            .faults
            .iter()
            .filter_map(|(_, f)| match f {
                Fault::FailOver { node, .. } => Some(*node),
                _ => None,
            })
            .collect();
        failing.sort_unstable();
        failing.dedup();
        failing
    }

    /// Whether every fault is routine (see [`Fault::is_routine`]).
    pub(crate) fn is_routine(&self) -> bool {
        self.faults.iter().all(|(_, f)| f.is_routine())
    }
}

/// A read order, in three schedules of `seed` in a hundred with 3 nodes (drawn on a
/// generator of their own): the schedule where a counter read must skip a quarantined
/// node. Client 0 (clock 0.4 s ahead) cannot reach node 2, so its numbers land on nodes 0
/// and 1; node 1 restarts empty and stays quarantined (both clients hold 2 s locks); client
/// 1 (clock 0.4 s behind) then gets nodes 0 and 2, its proposal is below client 0's
/// number, and node 0, the one that kept that number, answers it last (a slower link).
/// Read only on the nodes that granted, the counters give client 1 a higher number; read
/// on every node, the quarantined node's empty answer and node 2's make a quorum first.
/// Whether the schedule is one.
fn read_order(
    seed: u64,
    nodes: usize,
    clients: &mut [ClientPlan],
    faults: &mut Vec<(Duration, Fault)>,
) -> bool {
    let mut order = Rng::new(seed ^ 0x0072_6561_645f_6f72);
    if nodes != 3 || clients.len() < 2 || !order.chance(3) {
        return false;
    }
    for (i, client) in clients.iter_mut().enumerate() {
        client.ttl = Duration::from_millis(2_000);
        client.fenced = true;
        client.replay = None;
        client.skew_us = match i {
            0 => 400_000,
            1 => -400_000,
            _ => client.skew_us,
        };
    }
    faults.push((Duration::ZERO, Fault::Partition { client: 0, node: 2 }));
    faults.push((
        Duration::ZERO,
        Fault::Slow {
            client: 1,
            node: 0,
            us: 3_000 + order.below(5_000),
        },
    ));
    faults.push((order.ms(100, 900), Fault::RestartEmpty(1)));
    true
}

/// Failovers behind a proxy, in three schedules of `seed` in a hundred (drawn on a
/// generator of their own): a node whose `INFO` hides `run_id` from the start fails over
/// twice to its lagging replica (keeping `master_replid2`, the documented assumption), so
/// that only the new replication history tells the clients it may have lost keys.
fn behind_a_proxy(seed: u64, nodes: usize, faults: &mut Vec<(Duration, Fault)>) {
    let mut proxy = Rng::new(seed ^ 0x0070_726f_7879_5f66);
    if !proxy.chance(3) {
        return;
    }
    let node = usize::try_from(proxy.below(nodes as u64)).unwrap_or(0);
    faults.push((Duration::ZERO, Fault::HideRunId(node)));
    for _ in 0..2 {
        let at = proxy.ms(200, 1_500);
        faults.push((
            at,
            Fault::FailOver {
                node,
                cleared: false,
            },
        ));
    }
}

/// A node clock that jumps seconds forward mid-schedule, in five schedules of `seed` in a
/// hundred (drawn on a generator of their own): beyond Redlock's drift bound, so a second
/// holder may follow (its keys expire early), but fencing numbers must still increase.
fn clock_jump(seed: u64, nodes: usize, length: Duration, faults: &mut Vec<(Duration, Fault)>) {
    let mut jump = Rng::new(seed ^ 0x006a_756d_705f_6f6e);
    if !jump.chance(5) {
        return;
    }
    let at = jump.ms(100, u64::try_from(length.as_millis()).unwrap_or(0));
    let node = usize::try_from(jump.below(nodes as u64)).unwrap_or(0);
    let ms = i64::try_from(jump.ms(2_000, 10_000).as_millis()).unwrap_or(0);
    faults.push((at, Fault::ClockStep { node, ms }));
}

/// Clocks far off, in one schedule of `seed` in ten (drawn on a generator of their own, so
/// the rest of the schedule is the same with or without): a node ahead from the start by
/// 2 to 10 s, and the first client fenced and as far ahead (see [`Plan::far`]).
fn far_off(seed: u64, nodes: usize, clients: &mut [ClientPlan]) -> Option<(usize, Duration)> {
    let mut far = Rng::new(seed ^ 0x0066_6172_5f6f_6666);
    if !far.chance(10) {
        return None;
    }
    let node = usize::try_from(far.below(nodes as u64)).unwrap_or(0);
    let ahead = far.ms(2_000, 10_000);
    if let Some(first) = clients.first_mut() {
        first.fenced = true;
        first.skew_us = i64::try_from(micros(ahead)).unwrap_or(0);
    }
    Some((node, ahead))
}

/// The documented assumption for a node whose `INFO` hides `run_id`: its
/// `repl-backlog-ttl` is above the longest TTL, so a failover there keeps
/// `master_replid2` for the schedule.
fn assume_backlog_behind_proxies(faults: &mut [(Duration, Fault)]) {
    let hidden: Vec<usize> = faults
        .iter()
        .filter_map(|(_, f)| match f {
            Fault::HideRunId(n) => Some(*n),
            _ => None,
        })
        .collect();
    for (_, fault) in faults.iter_mut() {
        if let Fault::FailOver { node, cleared } = fault
            && hidden.contains(node)
        {
            *cleared = false;
        }
    }
}

/// A lock held: by whom, with which number, from when it was known held to when it was
/// released or its validity ended (since the schedule's start).
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    pub(crate) client: usize,
    pub(crate) name: usize,
    pub(crate) fence: Option<u64>,
    pub(crate) from: Duration,
    pub(crate) until: Duration,
    /// The simulation's wall clock (real time) when the grant was known, in µs.
    pub(crate) wall_us: u64,
    /// Whether the client's proposals were capped when the attempt began (a quorum of
    /// its nodes had given an estimate of their clocks): the fencing bound applies.
    pub(crate) capped: bool,
}

/// What a schedule did.
#[derive(Debug, Default)]
pub(crate) struct History {
    pub(crate) grants: Vec<Grant>,
    /// Acquisitions refused for another reason than a holder: (client, when, why).
    pub(crate) refusals: Vec<(usize, Duration, String)>,
    /// Faults, as they played.
    pub(crate) faults: Vec<(Duration, Fault)>,
    /// When the schedule started (after the warm-up).
    pub(crate) start: Option<Instant>,
    /// Replay keys whose handler ran: (client, key, when, whether a node the round could
    /// hear, in service, held the key's record then).
    pub(crate) runs: Vec<(usize, usize, Duration, bool)>,
    /// Replay keys whose record a quorum of nodes stored: (key, when, the nodes that
    /// held it just after).
    pub(crate) completed: Vec<(usize, Duration, Vec<usize>)>,
    /// Acquisitions that took longer than their rounds' per-node timeouts allow:
    /// (client, when, how long).
    pub(crate) stalls: Vec<(usize, Duration, Duration)>,
    /// Fenced attempts begun before a quorum of the client's nodes had given an estimate
    /// of their clocks (the proposal is the client's own clock then): the client's skew.
    pub(crate) uncapped: Vec<i64>,
    /// Locks refused at the healed end, once every quarantine was over.
    pub(crate) refused_at_end: Vec<String>,
    pub(crate) acquisitions: usize,
}

/// A client of the schedule: the crate's operations over its nodes.
struct SimClient {
    core: Core<SimNodes>,
    fencing: Fencing,
    waiters: Arc<Waiters>,
    plan: ClientPlan,
}

/// Releases of dropped attempts: none are dropped in a schedule.
struct NoBackground;

impl Background for NoBackground {
    fn release_in_background(&self, _deletion: Deletion) {}
}

impl SimClient {
    fn new(servers: &[Arc<Mutex<Server>>], links: Vec<Arc<Link>>, plan: ClientPlan) -> Self {
        let n = servers.len();
        let horizon = Arc::new(Horizon::new(n, plan.ttl, true));
        let clocks = Arc::new(NodeClocks::new(
            n,
            crate::defaults::DEFAULT_FENCING_CLOCK_BOUND,
        ));
        let nodes = SimNodes::new(
            servers,
            links,
            (Arc::clone(&horizon), Arc::clone(&clocks)),
            b"sim:",
            true,
        );
        let timing = Timing {
            ttl: plan.ttl,
            node_timeout: NODE_TIMEOUT,
            drift_factor: crate::defaults::DEFAULT_DRIFT_FACTOR,
            min_validity: Duration::ZERO,
            fencing_retention: crate::defaults::DEFAULT_FENCING_RETENTION,
        };
        let keys = KeySpace {
            prefix: b"sim:".to_vec(),
            counter_sets: CounterSets::One,
        };
        let core = Core::new(CoreParts {
            nodes: Box::new(nodes),
            count: n,
            timing,
            keys,
            horizon,
            releases: Arc::default(),
        });
        let expiry = crate::node::set_expiry_ms(crate::defaults::DEFAULT_FENCING_RETENTION);
        Self {
            core,
            fencing: Fencing::new(Clock::new(clocks).skewed(plan.skew_us), expiry),
            waiters: Waiters::new(n, crate::quorum::quorum(n)),
            plan,
        }
    }

    /// One `try_lock` of `name`: the lock, or why not.
    async fn try_lock(&self, name: &str) -> Result<crate::Lock, LockError> {
        match self.acquire(name, Accepts::Lock).await? {
            Acquired::Lock(lock) => Ok(lock),
            other => other.lock_or_busy(self.core.quorum(), self.core.node_count()),
        }
    }

    /// One attempt at `name`, accepting what `accepts` says.
    async fn acquire(&self, name: &str, accepts: Accepts) -> Result<Acquired, LockError> {
        let fenced = if self.plan.fenced {
            Fenced::Yes
        } else {
            Fenced::No
        };
        let target = self
            .core
            .target(name.as_bytes(), self.plan.ttl, accepts, fenced)?;
        let acquire = Acquire {
            core: &self.core,
            fencing: &self.fencing,
            waiters: &self.waiters,
            background: &NoBackground,
        };
        acquire.attempt(&target, None, 1).await.finish(1)
    }

    /// Stores `record` in place of `lock` and releases it, as the layer does once a
    /// response is finished: on how many nodes the record was stored.
    async fn complete(&self, lock: &crate::Lock, record: &[u8]) -> usize {
        let release = Release {
            core: &self.core,
            waiters: &self.waiters,
        };
        release
            .complete(Observe::new(false), lock, record, RETENTION)
            .await
    }

    async fn unlock(&self, lock: &crate::Lock) {
        let release = Release {
            core: &self.core,
            waiters: &self.waiters,
        };
        let _ = release.unlock(Observe::new(false), lock).await;
    }
}

/// A slow spell of `us` each way on `l` for `lasts`. Spells may overlap: the link comes
/// back to its own latency after the last one, not to a spell's.
async fn slow_spell(l: &Link, us: u64, lasts: Duration) {
    {
        let mut slow = l.slow.lock().unwrap_or_else(PoisonError::into_inner);
        if slow.0 == 0 {
            slow.1 = l.latency_us.load(Ordering::Relaxed);
        }
        slow.0 += 1;
    }
    l.latency_us.store(us, Ordering::Relaxed);
    tokio::time::sleep(lasts).await;
    let mut slow = l.slow.lock().unwrap_or_else(PoisonError::into_inner);
    slow.0 = slow.0.saturating_sub(1);
    if slow.0 == 0 {
        l.latency_us.store(slow.1, Ordering::Relaxed);
    }
}

/// Whether a client hears a node within the per-node timeout over a connection open to
/// it, and the node's process.
type Heard = (bool, u64);

/// The simulation's wall clock at the start of every schedule (ms since the Unix epoch).
const WALL_ORIGIN_MS: u64 = 1_800_000_000_000;

/// The shared state of a schedule being played.
struct Stage {
    servers: Vec<Arc<Mutex<Server>>>,
    /// Each node's replica: a copy of its keys as of `lag` ago, and since when it runs.
    replicas: Vec<Mutex<(Keyspace, u64)>>,
    /// links[client][node]
    links: Vec<Vec<Arc<Link>>>,
    history: Mutex<History>,
}

impl Stage {
    /// The stage of `plan`: its servers, up for an hour, their replicas, and each
    /// client's links (latency from `rng`).
    fn new(plan: &Plan, rng: &mut Rng) -> Self {
        let servers = (0..plan.nodes)
            .map(|i| {
                let up = Duration::from_secs(3_600);
                Arc::new(Mutex::new(Server::new(
                    plan.seed.wrapping_add(i as u64),
                    up,
                )))
            })
            .collect();
        let started = WALL_ORIGIN_MS.saturating_sub(3_600_000);
        let link = |rng: &mut Rng| {
            let link = Link::default();
            link.latency_us
                .store(100 + rng.below(900), Ordering::Relaxed);
            Arc::new(link)
        };
        Self {
            replicas: (0..plan.nodes)
                .map(|_| Mutex::new((Keyspace::default(), started)))
                .collect(),
            links: plan
                .clients
                .iter()
                .map(|_| (0..plan.nodes).map(|_| link(rng)).collect())
                .collect(),
            servers,
            history: Mutex::default(),
        }
    }

    fn server(&self, i: usize) -> std::sync::MutexGuard<'_, Server> {
        self.servers[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long ago the schedule started.
    fn since_start(&self) -> Duration {
        let start = self.history().start;
        start.map_or(Duration::ZERO, |s| {
            Instant::now().saturating_duration_since(s)
        })
    }

    /// Plays `fault` now; a fault that lasts is undone after `lasts`.
    async fn play(&self, fault: Fault, lasts: Duration) {
        let at = self.since_start();
        self.history().faults.push((at, fault));
        let link = |c: usize, n: usize| Arc::clone(&self.links[c][n]);
        match fault {
            Fault::RestartKeep(n) => self.server(n).restart(true),
            Fault::RestartEmpty(n) => self.server(n).restart(false),
            Fault::AofLost(n) => {
                let mut s = self.server(n);
                s.aof = true;
                s.restart(false);
            }
            Fault::Flush(n) => {
                let _ = self.server(n).command(b"FLUSHALL", &[]);
            }
            Fault::FailOver { node, cleared } => {
                let (copy, since) = self.replicas[node]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                let generation = {
                    let mut server = self.server(node);
                    server.fail_over(copy, since);
                    server.generation()
                };
                if cleared {
                    tokio::time::sleep(lasts).await;
                    self.server(node).clear_replid2(generation);
                }
            }
            Fault::AttachReplica(n) => self.server(n).attach_replica(),
            Fault::HideRunId(n) => self.server(n).hides_run_id = true,
            Fault::ClockStep { node, ms } => self.server(node).step_clock(ms),
            Fault::Partition { client, node } => {
                let l = link(client, node);
                l.partitioned.store(true, Ordering::Relaxed);
                tokio::time::sleep(lasts).await;
                l.partitioned.store(false, Ordering::Relaxed);
            }
            Fault::LoseReplies { client, node } => {
                let l = link(client, node);
                l.loses_replies.store(true, Ordering::Relaxed);
                tokio::time::sleep(lasts).await;
                l.loses_replies.store(false, Ordering::Relaxed);
            }
            Fault::Slow { client, node, us } => slow_spell(&link(client, node), us, lasts).await,
        }
    }

    /// Whether a node that `client` (number `i`) can hear within the per-node timeout, and
    /// that it does not keep out, holds a completion record under `key` now.
    /// Counted only on a node heard, by the same process, since `before` (taken when the
    /// attempt began): a record that came with a failover during the round, or on a node
    /// the round could not hear then (or had still to connect to: the handshake comes
    /// first), was not there for the round to see.
    fn record_visible(&self, client: &SimClient, i: usize, key: &[u8], before: &[Heard]) -> bool {
        let now = self.heard(client, i);
        (0..self.servers.len()).any(|n| {
            let steady = matches!((before.get(n), now.get(n)), (Some(b), Some(a)) if b.0 && a.0 && b.1 == a.1);
            steady && !client.core.nodes().keeps_out(n) && self.server(n).holds_record(key)
        })
    }

    /// Whether `client` (number `i`) hears each node within the per-node timeout now,
    /// over a connection it has open, and the node's process.
    fn heard(&self, client: &SimClient, i: usize) -> Vec<Heard> {
        (0..self.servers.len())
            .map(|n| {
                let link = &self.links[i][n];
                let heard = client.core.nodes().connected(n)
                    && !link.partitioned.load(Ordering::Relaxed)
                    && !link.loses_replies.load(Ordering::Relaxed)
                    && link.latency_us.load(Ordering::Relaxed) * 4 < micros(NODE_TIMEOUT);
                (heard, self.server(n).generation())
            })
            .collect()
    }

    /// Copies the keys of each node in `failing` (those that fail over in the schedule:
    /// no other replica is ever read) to its replica every `lag`.
    async fn replicate(&self, lag: Duration, failing: Vec<usize>) {
        if failing.is_empty() {
            return;
        }
        loop {
            tokio::time::sleep(lag).await;
            for &i in &failing {
                let Some(replica) = self.replicas.get(i) else {
                    continue;
                };
                let copy = self.server(i).keyspace().clone();
                replica.lock().unwrap_or_else(PoisonError::into_inner).0 = copy;
            }
        }
    }
}

/// Plays `plan`: its history.
pub(crate) async fn play(plan: &Plan) -> History {
    crate::clock::sim::set_wall(Some(Duration::from_millis(WALL_ORIGIN_MS)));
    let mut rng = Rng::new(plan.seed ^ 0x5eed);
    let stage = Arc::new(Stage::new(plan, &mut rng));
    if let Some((node, ahead)) = plan.far {
        let ms = i64::try_from(ahead.as_millis()).unwrap_or(0);
        stage.server(node).step_clock(ms);
    }
    let clients: Vec<Arc<SimClient>> = plan
        .clients
        .iter()
        .enumerate()
        .map(|(i, p)| Arc::new(SimClient::new(&stage.servers, stage.links[i].clone(), *p)))
        .collect();
    warm_up(&stage).await;
    let start = Instant::now();
    stage.history().start = Some(start);
    let mut tasks = tokio::task::JoinSet::new();
    {
        let stage = Arc::clone(&stage);
        let (lag, failing) = (plan.lag, plan.failing());
        tasks.spawn(async move { stage.replicate(lag, failing).await });
    }
    for (at, fault) in plan.faults.clone() {
        let stage = Arc::clone(&stage);
        let lasts = rng.ms(50, u64::try_from(FAULTS_LAST.as_millis()).unwrap_or(0));
        let lasts = if plan.read_order && at.is_zero() {
            plan.length
        } else {
            lasts
        };
        tasks.spawn(async move {
            tokio::time::sleep_until(start + at).await;
            stage.play(fault, lasts).await;
        });
    }
    for (i, client) in clients.iter().enumerate() {
        let rng = Rng::new(plan.seed.wrapping_mul(31).wrapping_add(i as u64));
        let run = Run {
            client: Arc::clone(client),
            stage: Arc::clone(&stage),
            index: i,
            names: plan.names as u64,
            end: start + plan.length,
        };
        run.spawn(&mut tasks, start, rng);
    }
    healed_end(plan, start, &clients, &stage).await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    crate::clock::sim::set_wall(None);
    std::mem::take(&mut *stage.history())
}

/// One client's part of a schedule.
struct Run {
    client: Arc<SimClient>,
    stage: Arc<Stage>,
    index: usize,
    names: u64,
    end: Instant,
}

impl Run {
    /// Spawns the client's background check (one loop per node, as the crate's
    /// `Node::watch`: a check every interval after the last one ended) and its locking,
    /// from its start on, until the schedule's end.
    fn spawn(self, tasks: &mut tokio::task::JoinSet<()>, start: Instant, mut rng: Rng) {
        let end = self.end;
        let stop = self.client.plan.stop.map(|stop| start + stop);
        for node in 0..crate::round::Nodes::count(self.client.core.nodes()) {
            let client = Arc::clone(&self.client);
            tasks.spawn(until(stop, async move {
                tokio::time::sleep_until(start + client.plan.start).await;
                while Instant::now() < end {
                    client.core.nodes().check(node).await;
                    tokio::time::sleep(CHECK_EVERY).await;
                }
            }));
        }
        tasks.spawn(until(stop, async move {
            tokio::time::sleep_until(start + self.client.plan.start).await;
            // The crate's client starts its connects when built: the simulated one
            // connects before its first attempt, for a per-node timeout at most.
            let clock = self.client.fencing.clock();
            let connects =
                crate::round::Nodes::settle(self.client.core.nodes(), || clock.bounded());
            let _ = tokio::time::timeout(NODE_TIMEOUT, connects).await;
            while Instant::now() < self.end {
                let name = rng.below(self.names);
                let held = lock_once(&self.client, &self.stage, self.index, name, &mut rng).await;
                let gap = if held {
                    rng.ms(0, 100)
                } else {
                    rng.ms(50, 400)
                };
                tokio::time::sleep(gap).await;
            }
        }));
    }
}

/// `work`, cut wherever it is at `stop` (a client whose process dies).
async fn until(stop: Option<Instant>, work: impl Future<Output = ()>) {
    match stop {
        Some(stop) => {
            let _ = tokio::time::timeout_at(stop, work).await;
        }
        None => work.await,
    }
}

/// The healed end of a schedule started at `start`: once every fault is undone and every
/// quarantine over, each client must get a name nobody holds.
async fn healed_end(plan: &Plan, start: Instant, clients: &[Arc<SimClient>], stage: &Stage) {
    let faults_done = plan
        .faults
        .iter()
        .map(|(at, _)| *at)
        .max()
        .unwrap_or_default();
    let longest = Duration::from_millis(TTLS[TTLS.len() - 1]);
    let healed = faults_done.max(plan.length) + FAULTS_LAST;
    tokio::time::sleep_until(start + healed).await;
    for client in clients {
        client.core.nodes().check_all().await;
    }
    // A loss first seen now is quarantined from now, for the horizon.
    tokio::time::sleep(longest + Duration::from_millis(200)).await;
    for (i, client) in clients.iter().enumerate() {
        if client.plan.stop.is_some() {
            continue;
        }
        client.core.nodes().check_all().await;
        if let Err(e) = client.try_lock(&format!("end-{i}")).await {
            stage
                .history()
                .refused_at_end
                .push(format!("client {i}: {e}"));
        }
    }
}

/// Brings the nodes to a steady state before the schedule: a client of the longest TTL
/// met them long ago (their ledgers written, their first quarantine over).
async fn warm_up(stage: &Stage) {
    let longest = Duration::from_millis(TTLS[TTLS.len() - 1]);
    let links = (0..stage.servers.len())
        .map(|_| Arc::new(Link::default()))
        .collect();
    let plan = ClientPlan {
        ttl: longest,
        fenced: false,
        skew_us: 0,
        replay: None,
        start: Duration::ZERO,
        stop: None,
    };
    let client = SimClient::new(&stage.servers, links, plan);
    client.core.nodes().check_all().await;
    let _ = crate::op::announce::announce(&client.core, longest).await;
    tokio::time::sleep(longest * 2).await;
}

/// One acquisition by `client` (number `i`) of name `name`, held for a while and then
/// released or left to expire; recorded in the stage's history. Whether it was held.
async fn lock_once(client: &SimClient, stage: &Stage, i: usize, name: u64, rng: &mut Rng) -> bool {
    if let Some(after_loss) = client.plan.replay {
        return run_once(client, stage, (i, name), after_loss, rng).await;
    }
    let asked = Instant::now();
    let capped = capped(client, stage);
    let result = client.try_lock(&format!("n{name}")).await;
    let from = stage.since_start();
    let wall_us = crate::clock::wall_us();
    let took = asked.elapsed();
    if took > MAX_ACQUIRE {
        stage.history().stalls.push((i, from, took));
    }
    stage.history().acquisitions += 1;
    let lock = match result {
        Ok(lock) => lock,
        Err(LockError::Busy { .. }) => return false,
        Err(e) => {
            stage.history().refusals.push((i, from, e.to_string()));
            return false;
        }
    };
    let start = stage.history().start.unwrap_or_else(Instant::now);
    let valid_until = Instant::from_std(lock.valid_until).saturating_duration_since(start);
    // Held to the end of its validity unless released (a client that stops holds it so).
    let grant = {
        let mut history = stage.history();
        history.grants.push(Grant {
            client: i,
            name: usize::try_from(name).unwrap_or(0),
            fence: lock.fence,
            from,
            until: valid_until,
            wall_us,
            capped,
        });
        history.grants.len() - 1
    };
    let hold = rng.ms(
        0,
        u64::try_from(client.plan.ttl.as_millis()).unwrap_or(0) * 3 / 2,
    );
    tokio::time::sleep(hold).await;
    // Released from here (a release cut short by the client's stop may have reached
    // some nodes).
    let until = stage.since_start().min(valid_until);
    if let Some(g) = stage.history().grants.get_mut(grant) {
        g.until = until;
    }
    if rng.chance(80) {
        client.unlock(&lock).await;
    }
    true
}

/// Whether `client`'s proposals are capped by its nodes' clocks now; a fenced attempt
/// about to begin without the cap is noted in the stage's history.
fn capped(client: &SimClient, stage: &Stage) -> bool {
    let capped = client.fencing.clock().bounded();
    if client.plan.fenced && !capped {
        stage.history().uncapped.push(client.plan.skew_us);
    }
    capped
}

/// How long a replay key's record lives.
pub(crate) const RETENTION: Duration = Duration::from_secs(5);

/// One delivery of replay key `name` by `client` (number `i`): its record replayed, or
/// its handler run (noting whether a node the round could hear, in service, held the
/// key's record: the evidence the rule must not miss) and its record stored.
async fn run_once(
    client: &SimClient,
    stage: &Stage,
    (i, name): (usize, u64),
    after_loss: AfterLoss,
    rng: &mut Rng,
) -> bool {
    let accepts = Accepts::LockOrRecord {
        retention: RETENTION,
        after_loss,
    };
    let asked = Instant::now();
    capped(client, stage);
    let before = stage.heard(client, i);
    let result = client.acquire(&format!("k{name}"), accepts).await;
    let from = stage.since_start();
    if asked.elapsed() > MAX_ACQUIRE {
        stage.history().stalls.push((i, from, asked.elapsed()));
    }
    stage.history().acquisitions += 1;
    let key = usize::try_from(name).unwrap_or(0);
    let lock = match result {
        Ok(Acquired::Lock(lock)) => lock,
        Ok(Acquired::Record { .. }) | Err(LockError::Busy { .. }) => return false,
        Err(e) => {
            stage.history().refusals.push((i, from, e.to_string()));
            return false;
        }
    };
    let evidence = stage.record_visible(client, i, lock.key(), &before);
    stage.history().runs.push((i, key, from, evidence));
    tokio::time::sleep(rng.ms(0, 50)).await;
    let mut record = crate::scripts::RECORD_MARKER.to_vec();
    record.extend_from_slice(format!("run by client {i} at {from:?}").as_bytes());
    let stored = client.complete(&lock, &record).await;
    if stored >= client.core.quorum() {
        let at = stage.since_start();
        let holders = (0..stage.servers.len())
            .filter(|&n| stage.server(n).holds_record(lock.key()))
            .collect();
        stage.history().completed.push((key, at, holders));
    }
    true
}
