//! Extending: compare-and-pexpire on every node, with the quorum and validity rule of
//! acquiring (CONTRIBUTING.md, "The algorithm").
//!
//! ```text
//! Extend { core }.run(&mut lock, ttl)
//!   validity already over? -> NotHeld (another client may have held it since)
//!   EXTEND key value ttl on every node, by min(node timeout, usable TTL, the lock's validity)
//!   a quorum extended -> validity = ttl - elapsed - drift > min? -> the lock's deadline moves
//!   otherwise         -> NotHeld (as many said "not ours" as failed) / NoQuorum / ValidityExhausted
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::observe::{Observe, Operation, elapsed_us};
use crate::core::{Core, ttl_ms};
use crate::error::LockError;
use crate::node::Node;
use crate::quorum::{NodeMask, Outcome, later};
use crate::round::{Nodes, Plan, Purpose, Round};
use crate::scripts::{Arg, EXTEND_SCRIPT, Invocation, Request, parse_flag};
use crate::token::Lock;
use crate::votes::Votes;

/// The extend operation over `core`'s nodes.
pub(crate) struct Extend<'a, N: ?Sized = [Arc<Node>]> {
    pub(crate) core: &'a Core<N>,
}

impl<N: Nodes + ?Sized> Extend<'_, N> {
    /// One extension attempt, in a `redlock.extend` span.
    pub(crate) async fn observed(
        &self,
        observe: Observe,
        lock: &mut Lock,
        ttl: Duration,
    ) -> Result<(), LockError> {
        let span = observe.span(self.core, Operation::Extend, lock.name());
        let start = crate::clock::now();
        let result = self.run(lock, ttl).instrument(span.clone()).await;
        if !span.is_disabled() {
            span.record("elapsed_us", elapsed_us(start));
            span.record(
                "outcome",
                result
                    .as_ref()
                    .map_or_else(LockError::outcome, |()| "extended"),
            );
        }
        result
    }

    /// One extension attempt: `lock` lives `ttl` from now on every node where it is still
    /// ours, or why not (its deadline then stays as it was).
    pub(crate) async fn run(&self, lock: &mut Lock, ttl: Duration) -> Result<(), LockError> {
        let core = self.core;
        core.check_open()?;
        core.check_ttl(ttl)?;
        super::announce::announce(core, ttl).await?;
        let ttl = Duration::from_millis(ttl_ms(ttl));
        let start = crate::clock::now();
        if start >= lock.valid_until {
            // The validity ran out: another client may have held the lock since, so the
            // hold cannot be continued, even if our keys are still there.
            return Err(LockError::NotHeld {
                held_on: 0,
                needed: core.quorum(),
                failures: Vec::new(),
                attempts: 1,
            });
        }
        let round = self.round(lock, ttl, start).await?;
        // The extension lands on the nodes that had not answered yet, too.
        round.land().await;
        let elapsed = crate::clock::since(start);
        match core.validity(ttl, elapsed, core.drift(ttl)) {
            Some(validity) => {
                lock.started = start;
                lock.valid_until = later(start, validity);
                lock.ttl = ttl;
                Ok(())
            }
            None => Err(LockError::ValidityExhausted {
                elapsed,
                ttl,
                attempts: 1,
            }),
        }
    }

    /// Compare-and-pexpire of `lock` to `ttl` on every node, until a quorum extended it
    /// (the round, its calls still out) or it cannot: not held when as many nodes said
    /// so as failed, short of nodes otherwise.
    async fn round(
        &self,
        lock: &Lock,
        ttl: Duration,
        start: Instant,
    ) -> Result<Round<N::Call>, LockError> {
        let keys = [lock.key()];
        let args = [Arg::Bytes(lock.value().as_bytes()), Arg::Int(ttl_ms(ttl))];
        let request = Request::Script(Invocation {
            script: &EXTEND_SCRIPT,
            keys: &keys,
            args: &args,
        });
        let plan = Plan {
            skip: NodeMask::default(),
            // The extension must take effect within the current validity.
            deadline: self.core.call_deadline(start, ttl, Some(lock.valid_until)),
            purpose: Purpose::Decide,
        };
        let nodes = self.core.nodes();
        let mut round = nodes.send(&request, plan);
        let mut votes = Votes::new(nodes.count());
        let mut not_held = 0;
        while votes.undecided() {
            round.wake_after(votes.to_decide());
            let Some((i, reply)) = round.next().await else {
                break;
            };
            let outcome = reply.and_then(parse_flag).map(|extended| {
                not_held += usize::from(!extended);
                if extended {
                    Outcome::Granted
                } else {
                    Outcome::Failed
                }
            });
            votes.count(nodes.label(i), outcome);
        }
        verdict(votes, not_held).map(|()| round)
    }
}

/// What an extension round's `votes` came to: extended once a quorum extended the lock;
/// not held when as many nodes said so (`not_held`) as failed; short of nodes otherwise
/// (no answer at all included).
fn verdict(votes: Votes, not_held: usize) -> Result<(), LockError> {
    if votes.reached() {
        Ok(())
    } else if not_held > 0 && not_held >= votes.failures.len() {
        Err(LockError::NotHeld {
            held_on: votes.tally.successes(),
            needed: votes.tally.quorum(),
            failures: votes.failures,
            attempts: 1,
        })
    } else {
        Err(votes.no_quorum())
    }
}

#[cfg(test)]
#[path = "extend_tests.rs"]
mod tests;
