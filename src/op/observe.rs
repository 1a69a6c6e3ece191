//! How the operations are observed: the `redlock.acquire`, `redlock.extend` and
//! `redlock.release` tracing spans, with the node count, quorum, attempts, elapsed time and
//! outcome, and the acquisition metrics. They never carry the lock's value; the name only
//! when the builder's `log_lock_names` is on, otherwise a short hash of it (enough to
//! follow one name through the logs).
//!
//! ```text
//! redlock.acquire{nodes=5 quorum=3 lock=#5f1c93e0a8d2b417 attempts=1 elapsed_us=412 outcome="acquired"}: close
//! ```

use std::hash::{Hash, Hasher};
use std::time::Instant;

use crate::core::Core;

/// How a client's operations show in spans and logs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Observe {
    /// Whether spans and logs show lock names (otherwise a hash).
    log_names: bool,
}

/// The operations that have spans.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Operation {
    Acquire,
    Extend,
    Release,
}

impl Observe {
    /// Spans that show lock names (`log_names`) or a hash of them.
    pub(crate) fn new(log_names: bool) -> Self {
        Self { log_names }
    }

    /// How lock `name` appears in spans and logs: the name, or `#` and a hash of it.
    pub(crate) fn shown_name(self, name: &[u8]) -> String {
        if self.log_names {
            let mut shown = String::from_utf8_lossy(name).into_owned();
            if shown.len() > 64 {
                let mut cut = 64;
                while !shown.is_char_boundary(cut) {
                    cut -= 1;
                }
                shown.truncate(cut);
                shown.push('…');
            }
            shown
        } else {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            name.hash(&mut h);
            format!("#{:016x}", h.finish())
        }
    }

    /// A span for `operation` on lock `name` over `core`'s nodes, with the fields the
    /// operation records later (`attempts`, `elapsed_us`, `outcome`). The name is only
    /// worked out when the span is enabled.
    pub(crate) fn span<N: ?Sized>(
        self,
        core: &Core<N>,
        operation: Operation,
        name: &[u8],
    ) -> tracing::Span {
        let nodes = core.node_count();
        let quorum = core.quorum();
        let span = match operation {
            Operation::Acquire => tracing::debug_span!(
                "redlock.acquire",
                lock = tracing::field::Empty,
                nodes,
                quorum,
                attempts = tracing::field::Empty,
                elapsed_us = tracing::field::Empty,
                outcome = tracing::field::Empty,
            ),
            Operation::Extend => tracing::debug_span!(
                "redlock.extend",
                lock = tracing::field::Empty,
                nodes,
                quorum,
                elapsed_us = tracing::field::Empty,
                outcome = tracing::field::Empty,
            ),
            Operation::Release => tracing::debug_span!(
                "redlock.release",
                lock = tracing::field::Empty,
                nodes,
                quorum,
                released = tracing::field::Empty,
                elapsed_us = tracing::field::Empty,
            ),
        };
        if !span.is_disabled() {
            span.record("lock", tracing::field::display(self.shown_name(name)));
        }
        span
    }
}

/// Microseconds since `start`, for `elapsed_us`.
pub(crate) fn elapsed_us(start: Instant) -> u64 {
    u64::try_from(crate::clock::since(start).as_micros()).unwrap_or(u64::MAX)
}
