//! Whether a node keeps an append-only file, as its `INFO persistence` says at each connect
//! and check: shown by `health()` ([`NodeHealth::append_only`](crate::NodeHealth::append_only)),
//! counted in the `redlock_nodes_without_aof` gauge, and warned about once per node when
//! a replay acquisition first relies on it. A node without one forgets its lock keys and
//! completion records when it restarts: the restart quarantine keeps the locks safe, but
//! a record kept only there is gone (see the README's replay section).
//!
//! ```text
//! INFO persistence  aof_enabled:0  ->  append_only = Some(false): gauge +1, warned once by replay
//! INFO persistence  aof_enabled:1  ->  append_only = Some(true)
//! INFO refused                     ->  unchanged (None until told)
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
