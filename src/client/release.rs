//! Releasing: compare-and-delete on every node, and the background release of dropped
//! locks and attempts.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?;
//! let report = redlock.unlock(&lock).await;
//! println!("released on {}, gone on {}", report.released(), report.not_held());
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::Redlock;
use super::spans::{Operation, elapsed_us};
use crate::error::NodeFailure;
use crate::fanout;
use crate::landing::Landing;
use crate::quorum::NodeMask;
use crate::quorum::later;
use crate::scripts::{Arg, COMPLETE_SCRIPT, Deleted, Invocation, Request, parse_deleted};
use crate::token::{Lock, Resource};

/// The outcome of [`Redlock::unlock`]: on how many nodes our key was deleted.
///
/// Releasing never deletes a key that holds another client's value; a lock that already
/// expired simply counts as not held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    released: usize,
    not_held: usize,
    failures: Vec<NodeFailure>,
}

impl Released {
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

impl Redlock {
    /// Releases `lock` on every node (see [`Redlock::unlock`]).
    pub(super) async fn release(&self, lock: &Lock) -> Released {
        let span = self.span(Operation::Release, lock.name());
        let start = Instant::now();
        let out = self.release_lock(lock).instrument(span.clone()).await;
        crate::metrics::released(lock.acquired_at.elapsed().as_secs_f64());
        if !span.is_disabled() {
            span.record("released", out.released);
            span.record("elapsed_us", elapsed_us(start));
        }
        out
    }

    async fn release_lock(&self, lock: &Lock) -> Released {
        let out = self
            .release_key(
                lock.key(),
                lock.value().as_bytes(),
                lock.ttl,
                lock.foreign,
                lock.landing.as_ref(),
                Wake::OnSent,
            )
            .await;
        tracing::debug!(
            released = out.released,
            not_held = out.not_held,
            failed = out.failures.len(),
            "redlock released"
        );
        out
    }

    /// Compare-and-delete of `value` at `key` on every node but those in `foreign` (which
    /// answered the acquisition with another client's value, so ours never reached them
    /// and they count as not held), waiting for all answers (each bounded by the per-node
    /// timeout, or the TTL if shorter). On a node where the acquisition is still
    /// `landing`, the delete waits for it, so it cannot overtake the `SET`. This client's
    /// first waiter for the key is woken per `wake`.
    pub(super) async fn release_key(
        &self,
        key: &[u8],
        value: &[u8],
        ttl: Duration,
        foreign: NodeMask,
        landing: Option<&Landing>,
        wake: Wake,
    ) -> Released {
        let request = Request::Release {
            key,
            value,
            id: self.inner.waiters.id(),
        };
        let deadline = later(Instant::now(), self.inner.node_timeout.min(ttl));
        let (mut released, mut not_held) = (0, foreign.len());
        let nodes = &self.inner.nodes;
        let quorum = self.quorum();
        let waiters = &self.inner.waiters;
        // The waiter woken as the deletes went out.
        let woken = std::sync::OnceLock::new();
        let on_reply = |i: usize, reply| {
            match self.deleted(i, reply)? {
                true => {
                    released += 1;
                    if released == quorum {
                        // This client's own waiters need not wait for the nodes' messages
                        // (they ignore this client's).
                        match (wake, woken.get()) {
                            (Wake::AtQuorum, _) => drop(waiters.wake(key)),
                            (Wake::OnSent, Some(Some(id))) => waiters.wake_again(key, *id),
                            (Wake::OnSent, _) => {}
                        }
                    }
                }
                false => not_held += 1,
            }
            Ok(())
        };
        let on_sent = || {
            if wake == Wake::OnSent {
                let _ = woken.set(waiters.wake(key));
            }
        };
        let failures = fanout::everywhere(
            nodes, &request, deadline, foreign, landing, on_reply, on_sent,
        )
        .await;
        Released {
            released,
            not_held,
            failures,
        }
    }

    /// Replaces `lock`'s value with `record` for `retention` on every node where the lock
    /// is still ours (the layer's completion record); returns on how many nodes.
    pub(crate) async fn complete(&self, lock: &Lock, record: &[u8], retention: Duration) -> usize {
        // On the nodes where the acquisition landed late, too.
        let args = [
            Arg::Bytes(lock.value().as_bytes()),
            Arg::Bytes(record),
            Arg::Int(super::ttl_ms(retention)),
        ];
        let request = Request::Script(Invocation {
            script: &COMPLETE_SCRIPT,
            keys: &[lock.key()],
            args: &args,
        });
        let deadline = later(Instant::now(), self.inner.node_timeout);
        let mut stored = 0;
        let nodes = &self.inner.nodes;
        // On the nodes where the acquisition lands late, too.
        let landing = lock.landing.as_ref();
        let on_reply = |i: usize, reply| {
            if self.deleted(i, reply)? {
                stored += 1;
            }
            Ok(())
        };
        let failures = fanout::everywhere(
            nodes,
            &request,
            deadline,
            lock.foreign,
            landing,
            on_reply,
            || {},
        )
        .await;
        for failure in &failures {
            tracing::debug!(%failure, "redlock completion record not stored on a node");
        }
        stored
    }

    /// Whether node `i` did what a [`RELEASE`](crate::scripts) or completion asked (the key
    /// held our value). A refused `PUBLISH` does not undo that: the node is only noted as
    /// one whose waiters are not told (see [`Node::notifications_refused`]).
    ///
    /// [`Node::notifications_refused`]: crate::node::Node::notifications_refused
    fn deleted(&self, i: usize, reply: redis::Value) -> Result<bool, crate::error::NodeError> {
        Ok(match parse_deleted(reply)? {
            Deleted::NotHeld => false,
            Deleted::Told => true,
            Deleted::Untold(message) => {
                if let Some(node) = self.inner.nodes.get(i) {
                    node.notifications_refused(&message);
                }
                true
            }
        })
    }

    /// Spawns a release of `value` on every node, if a tokio runtime is running;
    /// otherwise the keys expire at the end of their TTL. Never blocks.
    pub(crate) fn release_in_background(
        &self,
        resource: Arc<Resource>,
        value: Arc<str>,
        ttl: Duration,
        foreign: NodeMask,
        landing: Option<Landing>,
        wake: Wake,
    ) {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let redlock = self.clone();
                // The release carries the span of the code that dropped the lock.
                let span = redlock.span(Operation::Release, &resource.name);
                let release = async move {
                    redlock
                        .release_key(
                            &resource.key,
                            value.as_bytes(),
                            ttl,
                            foreign,
                            landing.as_ref(),
                            wake,
                        )
                        .await;
                };
                handle.spawn(release.instrument(span));
            }
            Err(_) => tracing::debug!("no tokio runtime: the lock will expire at its TTL"),
        }
    }
}
