//! Releasing: compare-and-delete on every node, the layer's completion record (a
//! compare-and-set of the lock's value into the record, which releases the lock where it
//! is stored), and what a release in the background needs.
//!
//! ```text
//! Release { core, waiters }.run(&deletion)
//!   RELEASE key value id -> every node but the foreign ones (after the SET's landing there)
//!   handed to the connections -> wake this client's first waiter (OnSent)
//!   a quorum deleted          -> wake it (AtQuorum), or again
//!   every answer              -> Released { released, not_held, failures }
//!
//! Release { core, waiters }.complete(observe, &lock, record, retention)
//!   COMPLETE key value record -> every node but the foreign ones: the record in place
//!                                of the value (released there, waiters told)
//!   every answer              -> wake this client's first waiter
//!   nodes that did not answer -> RELEASE there only (none: one round trip in all)
//!
//! A release whose every node is foreign (another client's value, a record) sends nothing.
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use redis::Value;
use tracing::Instrument;

use super::observe::{Observe, Operation, elapsed_us};
use crate::core::{Core, ttl_ms};
use crate::error::{NodeError, NodeFailure};
use crate::landing::Landing;
use crate::name::Resource;
use crate::node::Node;
use crate::quorum::{NodeMask, later};
use crate::round::{Nodes, Plan, Purpose};
use crate::scripts::{Arg, COMPLETE_SCRIPT, Deleted, Invocation, LockKeys, Request, parse_deleted};
use crate::token::Lock;
use crate::waiters::Waiters;

/// The outcome of an unlock: on how many nodes our key was deleted.
///
/// Releasing never deletes a key that holds another client's value; a lock that already
/// expired simply counts as not held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "a release short of a quorum leaves the lock held on some nodes until its TTL ends: check `released()` (or write `let _ =` to ignore it)"]
pub struct Released {
    released: usize,
    not_held: usize,
    failures: Vec<NodeFailure>,
}

impl Released {
    /// A release that deleted the key on `released` nodes and found it no longer ours on
    /// `not_held`, with no node failing (the in-memory lock's release).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn counted(released: usize, not_held: usize) -> Self {
        Self {
            released,
            not_held,
            failures: Vec::new(),
        }
    }

    /// Nodes on which the key still held our value and was deleted.
    pub fn released(&self) -> usize {
        self.released
    }

    /// Nodes on which the key no longer held our value (expired, or someone else's).
    pub fn not_held(&self) -> usize {
        self.not_held
    }

    /// Nodes that did not answer or failed; their keys expire at the end of the TTL.
    pub fn failures(&self) -> &[NodeFailure] {
        &self.failures
    }
}

/// When a release wakes this client's first waiter for the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The release of a held lock: as soon as the deletes are handed to the connections.
    /// The waiter's `SET`s go out behind them on the same connections, so the handoff
    /// takes about one round trip instead of two (the delete's, then the `SET`'s).
    OnSent,
    /// The clean-up of an attempt that did not get the lock: only once a quorum of nodes
    /// deleted it (a failed attempt usually holds fewer; waking the waiter, which may be
    /// the attempt's own task, would only send it back at once).
    AtQuorum,
}

/// What a release deletes: a lock's value at its key, on which nodes, after what, and
/// whom it wakes.
#[derive(Debug, Clone)]
pub(crate) struct Deletion {
    pub(crate) resource: Arc<Resource>,
    pub(crate) value: Arc<str>,
    /// The lock's TTL: no node call waits longer.
    pub(crate) ttl: Duration,
    /// The nodes that answered the acquisition with another client's value: skipped.
    pub(crate) foreign: NodeMask,
    /// The acquisition's stragglers: a node's delete goes after that node's `SET`.
    pub(crate) landing: Option<Landing>,
    pub(crate) wake: Wake,
}

impl Deletion {
    /// The release of `lock`, waking this client's waiters as `wake` says.
    pub(crate) fn of(lock: &Lock, wake: Wake) -> Self {
        Self {
            resource: Arc::clone(&lock.resource),
            value: Arc::clone(&lock.value),
            ttl: lock.ttl,
            foreign: lock.foreign,
            landing: lock.landing.clone(),
            wake,
        }
    }
}

/// Who runs a release in the background when an operation's future is dropped: the
/// client, which owns what such a task needs. Never blocks.
pub(crate) trait Background {
    /// Spawns `deletion`, if a tokio runtime is running; otherwise the keys expire at the
    /// end of their TTL.
    fn release_in_background(&self, deletion: Deletion);
}

/// The release operation: compare-and-delete over `core`'s nodes, waking `waiters`.
pub(crate) struct Release<'a, N: ?Sized = [Arc<Node>]> {
    pub(crate) core: &'a Core<N>,
    pub(crate) waiters: &'a Waiters,
}

impl<N: Nodes + ?Sized> Release<'_, N> {
    /// Releases `lock` on every node in a `redlock.release` span, as an unlock does.
    pub(crate) async fn unlock(&self, observe: Observe, lock: &Lock) -> Released {
        self.observed(observe, lock, async {
            let out = self.run(&Deletion::of(lock, Wake::OnSent)).await;
            tracing::debug!(
                released = out.released,
                not_held = out.not_held,
                failed = out.failures.len(),
                "redlock released"
            );
            let released = out.released;
            (out, released)
        })
        .await
    }

    /// Stores `record` in place of `lock`'s value for `retention` on every node where the
    /// lock is still ours (the layer's completion record), which releases it there and
    /// tells the waiters; then releases it on the nodes that did not answer, whose
    /// `COMPLETE` may not have run. One round trip when every node answers, where a
    /// completion and then a release took two. In a `redlock.release` span; returns on
    /// how many nodes the record was stored.
    pub(crate) async fn complete(
        &self,
        observe: Observe,
        lock: &Lock,
        record: &[u8],
        retention: Duration,
    ) -> usize {
        self.observed(observe, lock, async {
            // Counted until its nodes answered, for `shutdown`.
            let _running = self.core.release_running();
            let stores = store(self.core, &Held::of(lock), record, retention).await;
            // The record holds the name where it was stored: this client's first waiter
            // finds it there (the nodes' messages are for the other clients).
            let _ = self.waiters.wake(lock.key());
            // Released there only where no answer came (none: no round at all).
            let answered =
                NodeMask::matching(self.core.node_count(), |i| !stores.unanswered.contains(i));
            let deletion = Deletion {
                foreign: answered,
                ..Deletion::of(lock, Wake::AtQuorum)
            };
            let released = stores.stored + self.run(&deletion).await.released;
            tracing::debug!(
                stored = stores.stored,
                unanswered = stores.unanswered.len(),
                released,
                "redlock released by its completion record"
            );
            (stores.stored, released)
        })
        .await
    }

    /// Runs `release`, which gives its outcome and on how many nodes it released, in a
    /// `redlock.release` span for `lock`, and counts how long the lock was held.
    fn observed<T>(
        &self,
        observe: Observe,
        lock: &Lock,
        release: impl Future<Output = (T, usize)>,
    ) -> impl Future<Output = T> {
        // Not an `async fn`: one would keep `release` both as its argument and as the
        // future it awaits, twice the release's size in every caller's future (an unlock
        // was 1,376 bytes, over the allocator's small blocks when boxed).
        let span = observe.span(self.core, Operation::Release, lock.name());
        let start = crate::clock::now();
        let acquired_at = lock.acquired_at;
        release
            .instrument(span.clone())
            .map(move |(out, released)| {
                crate::metrics::released(crate::clock::since(acquired_at).as_secs_f64());
                if !span.is_disabled() {
                    span.record("released", released);
                    span.record("elapsed_us", elapsed_us(start));
                }
                out
            })
    }

    /// Compare-and-delete of the deletion's value at its key on every node but the
    /// foreign ones (which answered the acquisition with another client's value, so ours
    /// never reached them and they count as not held), waiting for all answers (each
    /// bounded by the per-node timeout, or the TTL if shorter). On a node where the
    /// acquisition is still landing, the delete waits for it, so it cannot overtake the
    /// `SET`. This client's first waiter for the key is woken as the deletion says.
    pub(crate) async fn run(&self, deletion: &Deletion) -> Released {
        let mut out = Released {
            released: 0,
            not_held: deletion.foreign.len(),
            failures: Vec::new(),
        };
        if out.not_held >= self.core.node_count() {
            // Every node answered with another client's value or with a record (a replay
            // found everywhere, a completion every node answered): ours is on none, and
            // no release goes down.
            return out;
        }
        // Counted until its nodes answered, for `shutdown`.
        let _running = self.core.release_running();
        let (key, request) = (&*deletion.resource.key, self.request(deletion));
        let mut round = self.core.nodes().send(&request, self.plan(deletion));
        let waiters = self.waiters;
        // Every call has been polled once, so each has handed its delete to its node's
        // connection unless it waits (for a connection, or for the landing): a `SET` this
        // client sends to a node afterwards runs after it there.
        while let Some((i, reply)) = round.ready().await {
            self.count_deleted(&mut out, i, reply);
        }
        let woken = match deletion.wake {
            Wake::OnSent => waiters.wake(key),
            Wake::AtQuorum => None,
        };
        let quorum = self.core.quorum();
        // A release woken as sent does not wake again for a quorum reached by then.
        let mut told = deletion.wake == Wake::OnSent && out.released >= quorum;
        loop {
            if !told && out.released >= quorum {
                // This client's own waiters need not wait for the nodes' messages (they
                // ignore this client's).
                told = true;
                match (deletion.wake, woken) {
                    (Wake::AtQuorum, _) => drop(waiters.wake(key)),
                    (Wake::OnSent, Some(id)) => waiters.wake_again(key, id),
                    (Wake::OnSent, None) => {}
                }
            }
            // Every answer is needed: look again once all are in (or at the deadline).
            round.wake_after(round.out());
            let Some((i, reply)) = round.next().await else {
                break;
            };
            self.count_deleted(&mut out, i, reply);
        }
        out
    }

    /// The [`RELEASE`](crate::scripts) of `deletion`, telling the waiters with this
    /// client's id.
    fn request<'d>(&'d self, deletion: &'d Deletion) -> Request<'d> {
        Request::Release {
            key: &deletion.resource.key,
            waiting: deletion.resource.waiting_key.as_deref(),
            value: deletion.value.as_bytes(),
            id: self.waiters.id(),
        }
    }

    /// The round of `deletion`: every node but the foreign ones, each after the
    /// acquisition's landing there, within the per-node timeout (or the TTL, if shorter).
    fn plan<'d>(&self, deletion: &'d Deletion) -> Plan<'d> {
        Plan {
            skip: deletion.foreign,
            deadline: later(
                crate::clock::now(),
                self.core.node_timeout().min(deletion.ttl),
            ),
            purpose: Purpose::Everywhere {
                after: deletion.landing.as_ref(),
            },
        }
    }

    /// Counts node `i`'s answer to a release in `out`.
    fn count_deleted(&self, out: &mut Released, i: usize, reply: Result<Value, NodeError>) {
        let nodes = self.core.nodes();
        match reply.and_then(|reply| deleted(nodes, i, reply)) {
            Ok(true) => out.released += 1,
            Ok(false) => out.not_held += 1,
            Err(error) => out.failures.push(NodeFailure::new(nodes.label(i), error)),
        }
    }
}

/// Where a value is held: its key, the value, the nodes that hold another's (skipped) and
/// its acquisition's landing (a completion waits for the `SET` that lands late).
pub(crate) struct Held<'a> {
    pub(crate) key: &'a [u8],
    /// The nodes' waiting key: the record tells the waiters only where it is there (and
    /// always, without one).
    pub(crate) waiting: Option<&'a [u8]>,
    pub(crate) value: &'a str,
    pub(crate) foreign: NodeMask,
    pub(crate) landing: Option<&'a Landing>,
}

impl<'a> Held<'a> {
    /// Where `lock` is held.
    pub(crate) fn of(lock: &'a Lock) -> Self {
        Self {
            key: lock.key(),
            waiting: lock.resource.waiting_key.as_deref(),
            value: lock.value(),
            foreign: lock.foreign,
            landing: lock.landing.as_ref(),
        }
    }
}

/// Replaces the value `held` with `record` for `retention` on every node where it is
/// still there (a lock's completion record, or an acquisition that restores a record it
/// found on fewer than a quorum of nodes); returns on how many nodes.
pub(crate) async fn complete_held<N: Nodes + ?Sized>(
    core: &Core<N>,
    held: &Held<'_>,
    record: &[u8],
    retention: Duration,
) -> usize {
    store(core, held, record, retention).await.stored
}

/// What storing a record did.
struct Stores {
    /// The nodes where the record took the value's place.
    stored: usize,
    /// The nodes that failed or did not answer in time: the record may or may not be
    /// there, and the value too.
    unanswered: NodeMask,
}

/// [`complete_held`], telling also which nodes did not answer.
async fn store<N: Nodes + ?Sized>(
    core: &Core<N>,
    held: &Held<'_>,
    record: &[u8],
    retention: Duration,
) -> Stores {
    let args = [
        Arg::Bytes(held.value.as_bytes()),
        Arg::Bytes(record),
        Arg::Int(ttl_ms(retention)),
    ];
    let keys = LockKeys::new(held.key, held.waiting);
    let request = Request::Script(Invocation {
        script: &COMPLETE_SCRIPT,
        keys: keys.as_slice(),
        args: &args,
    });
    let plan = Plan {
        skip: held.foreign,
        deadline: later(crate::clock::now(), core.node_timeout()),
        // On the nodes where the acquisition lands late, too.
        purpose: Purpose::Everywhere {
            after: held.landing,
        },
    };
    let nodes = core.nodes();
    let mut round = nodes.send(&request, plan);
    let mut out = Stores {
        stored: 0,
        unanswered: NodeMask::default(),
    };
    loop {
        round.wake_after(round.out());
        let Some((i, reply)) = round.next().await else {
            return out;
        };
        match reply.and_then(|reply| deleted(nodes, i, reply)) {
            Ok(true) => out.stored += 1,
            Ok(false) => {}
            Err(error) => {
                out.unanswered.insert(i);
                tracing::debug!(
                    node = %nodes.label(i),
                    %error,
                    "redlock completion record not stored on a node"
                );
            }
        }
    }
}

/// Whether node `i` did what a [`RELEASE`](crate::scripts) or completion asked (the key
/// held our value). A refused `PUBLISH` does not undo that: the node is only noted as
/// one whose waiters are not told (see [`Node::notifications_refused`]).
fn deleted<N: Nodes + ?Sized>(nodes: &N, i: usize, reply: Value) -> Result<bool, NodeError> {
    Ok(match parse_deleted(reply)? {
        Deleted::NotHeld => false,
        Deleted::Told => true,
        Deleted::Untold(message) => {
            nodes.notifications_refused(i, &message);
            true
        }
    })
}
