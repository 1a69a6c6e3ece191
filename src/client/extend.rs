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
use crate::fanout;
use crate::quorum::later;
use crate::quorum::{self, Outcome};
use crate::scripts::{Arg, EXTEND_SCRIPT, Invocation, Request, parse_flag};
use crate::token::Lock;

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
        let keys = [lock.key()];
        let args = [Arg::Bytes(lock.value().as_bytes()), Arg::Int(ttl_ms(ttl))];
        let request = Request::Script(Invocation {
            script: &EXTEND_SCRIPT,
            keys: &keys,
            args: &args,
        });
        // The extension must take effect within the current validity.
        let deadline = self.call_deadline(start, ttl, Some(lock.valid_until));
        let mut not_held = 0;
        let mut round = fanout::decide(
            &self.inner.nodes,
            &request,
            deadline,
            |_| true,
            |_, reply| {
                if parse_flag(reply?)? {
                    Ok(Outcome::Granted)
                } else {
                    not_held += 1;
                    Ok(Outcome::Failed)
                }
            },
        )
        .await;
        let elapsed = start.elapsed();
        let drift = quorum::drift(ttl, self.inner.drift_factor);
        if round.reached() {
            if let Some(stragglers) = round.stragglers.take() {
                // The extension lands on the nodes that had not answered yet, too.
                stragglers.land();
            }
            return match quorum::validity(ttl, elapsed, drift) {
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
            };
        }
        if not_held > 0 && not_held >= round.failures.len() {
            Err(LockError::NotHeld {
                held_on: round.tally.successes(),
                needed: round.tally.quorum(),
                failures: round.failures,
                attempts: 1,
            })
        } else {
            Err(round.no_quorum())
        }
    }
}
