//! Health and inspection: how each node looks from this client right now (with a
//! readiness verdict), and what the nodes hold for a name (never the lock's value).
//!
//! ```text
//! health(core)        PING + INFO on every node, by the node timeout
//!                     -> Up / Quarantined { remaining, reason } / Down(why); ready = usable >= quorum
//! inspect(core, name) INSPECT key counter on every node, every answer awaited
//!                     -> held on k nodes, longest PTTL, highest fencing number, record on m nodes
//! ```

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use crate::core::{Core, Fenced};
use crate::error::{LockError, NodeError, NodeFailure, QuarantineReason};
use crate::fencing::CounterAt;
use crate::node::Node;
use crate::quorum::{NodeMask, later};
use crate::round::{Nodes, Plan, Purpose};
use crate::scripts::{Arg, parse_inspect};

/// The state of one node, from a health check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeStatus {
    /// Connected, answering, and taking part in acquisitions.
    Up,
    /// Answering, but kept out of acquisitions by the restart quarantine for `remaining`:
    /// it may have lost lock keys that are still valid (`reason` says how).
    Quarantined {
        /// How much longer the quarantine lasts.
        remaining: Duration,
        /// Why the node may have lost keys.
        reason: QuarantineReason,
    },
    /// Not usable: why.
    Down(NodeError),
}

/// One node's health.
#[derive(Debug, Clone)]
pub struct NodeHealth {
    node: String,
    status: NodeStatus,
    round_trip: Option<Duration>,
    version: Option<String>,
    role: Option<String>,
    append_only: Option<bool>,
}

impl NodeHealth {
    /// The node's address (`host:port`, never credentials).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Up, quarantined, or down and why.
    pub fn status(&self) -> &NodeStatus {
        &self.status
    }

    /// How long the health check's round trip took, if the node answered.
    pub fn round_trip(&self) -> Option<Duration> {
        self.round_trip
    }

    /// The server's version (`redis_version`), if known.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// The server's replication role (`master`, `slave`), if the user may run `INFO`.
    /// A node that is not a master may lose lock keys in a failover.
    pub fn role(&self) -> Option<&str> {
        self.role.as_deref()
    }

    /// Whether the server keeps an append-only file (`aof_enabled` in `INFO
    /// persistence`), if it said. A node without one forgets its lock keys (the restart
    /// quarantine covers those) and its replay records when it restarts: a replay layer's
    /// finished keys whose records were only there run again
    /// ([`AfterLoss`](crate::layer::AfterLoss)). `Some(false)` is counted in the
    /// `redlock_nodes_without_aof` gauge and warned about once by the first replay.
    pub fn append_only(&self) -> Option<bool> {
        self.append_only
    }
}

/// Every node's health, and whether a quorum is usable now.
#[derive(Debug, Clone)]
#[must_use = "a `Health` report changes nothing: read `ready()` or the nodes' status"]
pub struct Health {
    nodes: Vec<NodeHealth>,
    quorum: usize,
}

impl Health {
    /// Each node, in the order given to the builder.
    pub fn nodes(&self) -> &[NodeHealth] {
        &self.nodes
    }

    /// How many nodes are up and not quarantined.
    pub fn usable(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.status == NodeStatus::Up)
            .count()
    }

    /// The number of nodes a lock needs.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Whether a quorum of nodes is usable now: a readiness check. A node that is up but
    /// quarantined does not count.
    pub fn ready(&self) -> bool {
        self.usable() >= self.quorum
    }
}

/// What the nodes hold for a name, from an inspection. Never the lock's value.
#[derive(Debug, Clone)]
#[must_use = "an `Inspection` changes nothing: read what the nodes hold (`held_on()`, `remaining()`, ...)"]
pub struct Inspection {
    held_on: usize,
    nodes: usize,
    remaining: Option<Duration>,
    fencing: Option<u64>,
    record_on: usize,
    failures: Vec<NodeFailure>,
}

impl Inspection {
    /// On how many nodes a lock key for the name exists.
    pub fn held_on(&self) -> usize {
        self.held_on
    }

    /// How many nodes the client has.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Whether the name is held: its key exists on a quorum of nodes.
    pub fn is_held(&self, quorum: usize) -> bool {
        self.held_on >= quorum
    }

    /// The longest remaining TTL of the name's keys, if any node holds one.
    pub fn remaining(&self) -> Option<Duration> {
        self.remaining
    }

    /// The highest fencing number recorded for the name on any node, if any: its counter,
    /// which the names of its hash slot share, so it may be another name's number, and is
    /// never below the name's own last one.
    pub fn fencing(&self) -> Option<u64> {
        self.fencing
    }

    /// On how many nodes a completion record (layer replay) is stored under the name.
    pub fn record_on(&self) -> usize {
        self.record_on
    }

    /// The nodes that did not answer, with why.
    pub fn failures(&self) -> &[NodeFailure] {
        &self.failures
    }
}

/// Checks every node of `core` now (one round trip each, bounded by the per-node
/// timeout): up, quarantined or down with the cause, its round-trip time, version and
/// role; and whether a quorum is usable ([`Health::ready`]), for a readiness probe.
pub(crate) async fn health(core: &Core<[Arc<Node>]>) -> Health {
    let deadline = later(crate::clock::now(), core.node_timeout());
    let nodes = join_all(core.nodes().iter().map(|node| async move {
        let check = node.check(deadline).await;
        NodeHealth {
            node: node.label().to_owned(),
            status: match check.result {
                Err(error) => NodeStatus::Down(error),
                Ok(()) => match node.quarantined_for() {
                    Some((remaining, reason)) => NodeStatus::Quarantined { remaining, reason },
                    None => NodeStatus::Up,
                },
            },
            round_trip: check.round_trip,
            version: check.version,
            role: check.role,
            append_only: check.append_only,
        }
    }))
    .await;
    Health {
        nodes,
        quorum: core.quorum(),
    }
}

/// What `core`'s nodes hold for `name` now: on how many nodes its key exists, the longest
/// remaining TTL, the highest fencing number, and whether a completion record is stored.
/// The lock's value is never read out. Fails only for an invalid name.
/// (`fenced`: the name's checks are those of a fenced acquisition.)
pub(crate) async fn inspect<N: Nodes + ?Sized>(
    core: &Core<N>,
    name: &[u8],
    fenced: Fenced,
) -> Result<Inspection, LockError> {
    let resource = core.resource(name, core.ttl(), fenced)?;
    let at = CounterAt::of(&resource);
    let args = [Arg::Bytes(at.member)];
    let request = at.inspect(&args);
    let deadline = later(crate::clock::now(), core.node_timeout());
    let mut out = Inspection {
        held_on: 0,
        nodes: core.node_count(),
        remaining: None,
        fencing: None,
        record_on: 0,
        failures: Vec::new(),
    };
    let plan = Plan {
        skip: NodeMask::default(),
        deadline,
        purpose: Purpose::Everywhere { after: None },
    };
    let nodes = core.nodes();
    let mut round = nodes.send(&request, plan);
    loop {
        round.wake_after(round.out());
        let Some((i, reply)) = round.next().await else {
            break;
        };
        match reply.and_then(parse_inspect) {
            Ok(seen) => {
                if seen.held {
                    out.held_on += 1;
                    out.remaining = out.remaining.max(seen.pttl);
                }
                out.record_on += usize::from(seen.record);
                out.fencing = out.fencing.max(seen.counter);
            }
            Err(error) => out.failures.push(NodeFailure::new(nodes.label(i), error)),
        }
    }
    Ok(out)
}
