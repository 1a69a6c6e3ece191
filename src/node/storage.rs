//! How a node keeps data, as its `INFO` says at each connect and check: whether it keeps
//! an append-only file, and whether it is near its `maxmemory`.
//!
//! **Append-only file.** Shown by `health()`
//! ([`NodeHealth::append_only`](crate::NodeHealth::append_only)), counted in the
//! `redlock_nodes_without_aof` gauge, and warned about once per node when a replay
//! acquisition first relies on it. A node without one forgets its lock keys and completion
//! records when it restarts: the restart quarantine keeps the locks safe, but a record kept
//! only there is gone (see the README's replay section).
//!
//! **Memory.** A node that runs `noeviction` under a `maxmemory` refuses every write once
//! full, lock keys included. Replay records are what fills it (up to the policy's
//! `max_body` each, for the retention), so a node at [`NEAR_FULL_PERCENT`] of its
//! `maxmemory` takes records without their response ("completed, not kept": a retry gets
//! 410, never a second run) until it has room again, and locks keep working; counted in
//! the `redlock_nodes_near_maxmemory` gauge, and warned about when it starts.
//!
//! ```text
//! INFO persistence  aof_enabled:0  ->  append_only = Some(false): gauge +1, warned once by replay
//! INFO persistence  aof_enabled:1  ->  append_only = Some(true)
//! INFO memory  used_memory >= 90 % of maxmemory  ->  records kept without their response
//! INFO refused                     ->  unchanged (unknown until told)
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! for node in redlock.health().await.nodes() {
//!     if node.append_only() == Some(false) {
//!         println!("{} forgets replay records when it restarts", node.node());
//!     }
//! }
//! # Ok(()) }
//! ```

use std::sync::atomic::Ordering;

use super::handshake::info_field;
use super::{Node, NodeState};
use crate::metrics::{Gauge, Move, gauge};

impl Node {
    /// The node's server said whether it keeps an append-only file (`None`: it did not
    /// say; what was known stays). Keeps the gauge of nodes without one (the state is
    /// locked by the caller).
    pub(super) fn saw_persistence(&self, st: &mut NodeState, append_only: Option<bool>) {
        let Some(append_only) = append_only else {
            return;
        };
        let was_without = st.append_only == Some(false);
        st.append_only = Some(append_only);
        match (was_without, append_only) {
            (false, false) => gauge(Gauge::NodesWithoutAof, Move::Up),
            (true, true) => gauge(Gauge::NodesWithoutAof, Move::Down),
            _ => {}
        }
    }

    /// A replay acquisition relies on the node's records (the state is locked by the
    /// caller): the first time it is known to keep no append-only file, says so at
    /// `warn`, once per node.
    pub(super) fn warn_replay_without_aof(&self, st: &NodeState) {
        if st.append_only != Some(false) || self.aof_warned.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            node = %self.label,
            "redlock node runs without an append-only file (aof_enabled:0): replay records \
             kept only on it are gone when it restarts, and their keys run again \
             (AfterLoss::Run) or are refused (AfterLoss::Refuse); set appendonly yes"
        );
    }
}

/// How full (in % of `maxmemory`) a node's memory is when records stop keeping responses.
pub(crate) const NEAR_FULL_PERCENT: u64 = 90;

/// Whether a server whose `INFO memory` is `memory` is at [`NEAR_FULL_PERCENT`] of its
/// `maxmemory` (`Some(false)` without a limit; `None` when the reply does not tell).
pub(crate) fn near_maxmemory(memory: &str) -> Option<bool> {
    let max: u64 = info_field(memory, "maxmemory")?.parse().ok()?;
    if max == 0 {
        return Some(false);
    }
    let used: u64 = info_field(memory, "used_memory")?.parse().ok()?;
    Some(used.saturating_mul(100) >= max.saturating_mul(NEAR_FULL_PERCENT))
}

impl Node {
    /// The node's server answered `INFO memory` with `memory`: whether it is near its
    /// `maxmemory` now (the gauge kept, and the start of it warned about).
    pub(super) fn saw_memory(&self, memory: &str) {
        let Some(near) = near_maxmemory(memory) else {
            return;
        };
        let was = self.near_full.swap(near, Ordering::AcqRel);
        match (was, near) {
            (false, true) => {
                gauge(Gauge::NodesNearMaxmemory, Move::Up);
                tracing::warn!(
                    node = %self.label,
                    used = info_field(memory, "used_memory_human").unwrap_or("?"),
                    maxmemory = info_field(memory, "maxmemory_human").unwrap_or("?"),
                    "redlock node is near its maxmemory: replay records are kept without \
                     their response (retries get 410) until it has room, so that locks keep \
                     working; give it more memory or shorten the retention"
                );
            }
            (true, false) => {
                gauge(Gauge::NodesNearMaxmemory, Move::Down);
                tracing::info!(node = %self.label, "redlock node has room again: replay records keep their response");
            }
            _ => {}
        }
    }

    /// Whether the node has room for whole replay records (it is not near its
    /// `maxmemory`, as last seen).
    pub(crate) fn has_room_for_records(&self) -> bool {
        !self.near_full.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_near_full_at_ninety_percent_of_a_limit_only() {
        let memory = |used: u64, max: u64| format!("used_memory:{used}\r\nmaxmemory:{max}\r\n");
        assert_eq!(near_maxmemory(&memory(899, 1000)), Some(false));
        assert_eq!(near_maxmemory(&memory(900, 1000)), Some(true));
        assert_eq!(near_maxmemory(&memory(5000, 1000)), Some(true));
        assert_eq!(
            near_maxmemory(&memory(u64::MAX, 0)),
            Some(false),
            "no limit"
        );
        assert_eq!(near_maxmemory(&memory(u64::MAX, u64::MAX)), Some(true));
        assert_eq!(near_maxmemory("maxmemory:1000\r\n"), None);
        assert_eq!(near_maxmemory("used_memory:1\r\n"), None);
    }
}
