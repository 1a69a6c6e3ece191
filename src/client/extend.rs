//! Extending: compare-and-pexpire on every node, with the quorum and validity rule of
//! acquiring.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let mut lock = redlock.lock("export:7").await?;
//! redlock.extend(&mut lock, Duration::from_secs(30)).await?;
//! assert!(lock.remaining() > Duration::from_secs(20));
//! # Ok(()) }
//! ```

use std::time::{Duration, Instant};

use tracing::Instrument;

use super::spans::{Operation, elapsed_us};
use super::{Redlock, check_ttl, ttl_ms};
use crate::error::LockError;
use crate::quorum::{self, NodeMask, Outcome, later};
use crate::round::{Plan, Purpose, Round};
use crate::scripts::{Arg, EXTEND_SCRIPT, Invocation, Request, parse_flag};
use crate::token::Lock;
use crate::votes::Votes;

impl Redlock {
    /// One extension attempt (see [`Redlock::extend`]), in a `redlock.extend` span.
    pub(crate) async fn extend_once(
        &self,
        lock: &mut Lock,
        ttl: Duration,
    ) -> Result<(), LockError> {
        let span = self.span(Operation::Extend, lock.name());
        let start = Instant::now();
        let result = self.extend_inner(lock, ttl).instrument(span.clone()).await;
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

    async fn extend_inner(&self, lock: &mut Lock, ttl: Duration) -> Result<(), LockError> {
        self.inner.lifecycle.check_open()?;
        check_ttl(ttl, self.inner.node_timeout).map_err(LockError::from)?;
        self.note_ttl(ttl);
        let ttl = Duration::from_millis(ttl_ms(ttl));
        let start = Instant::now();
        if start >= lock.valid_until {
            // The validity ran out: another client may have held the lock since, so the
            // hold cannot be continued, even if our keys are still there.
            return Err(LockError::NotHeld {
                held_on: 0,
                needed: self.quorum(),
                failures: Vec::new(),
                attempts: 1,
            });
        }
        let round = self.extend_round(lock, ttl, start).await?;
        // The extension lands on the nodes that had not answered yet, too.
        round.land().await;
        let elapsed = start.elapsed();
        let drift = quorum::drift(ttl, self.inner.drift_factor);
        match quorum::validity(ttl, elapsed, drift) {
            Some(validity) if validity > self.inner.min_validity => {
                lock.started = start;
                lock.valid_until = later(start, validity);
                lock.ttl = ttl;
                Ok(())
            }
            _ => Err(LockError::ValidityExhausted {
                elapsed,
                ttl,
                attempts: 1,
            }),
        }
    }

    /// Compare-and-pexpire of `lock` to `ttl` on every node, until a quorum extended it
    /// (the round, its calls still out) or it cannot: not held when as many nodes said
    /// so as failed, short of nodes otherwise.
    async fn extend_round(
        &self,
        lock: &Lock,
        ttl: Duration,
        start: Instant,
    ) -> Result<Round, LockError> {
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
            deadline: self.call_deadline(start, ttl, Some(lock.valid_until)),
            purpose: Purpose::Decide,
        };
        let nodes = &self.inner.nodes;
        let mut round = Round::send(nodes, &request, plan);
        let mut votes = Votes::new(nodes.len());
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
            votes.count(nodes[i].label(), outcome);
        }
        if votes.reached() {
            Ok(round)
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
}
