//! Node loss, in one room: whether a node may have lost keys, decided by what the node
//! itself keeps, so that every client and every app instance reaches the same verdict.
//!
//! A Redis node that restarts without persistence forgets its keys; one flushed forgets
//! them too; a replica promoted by a failover lacks the writes replication had not
//! carried. Any of these could grant a lock another client still holds through it (the
//! "delayed restart" rule of the Redlock spec exists for this). So each node keeps a
//! [`ledger`]: an epoch naming its dataset and the moment of its last possible loss, on
//! its own clock; and a [`horizon`]: the longest TTL any client of these nodes uses. Every
//! connect and every health check reads both with `INFO` in one request, and the
//! [`judge`] decides, from the ledger first and `INFO` as a second opinion:
//!
//! | what happened | how it shows | verdict |
//! |---|---|---|
//! | restart without data, `FLUSHALL`, a replica that never synced, a new node | no ledger | lost everything now |
//! | restart that reloaded a file | ledger of another `run_id` | lost unsaved writes now |
//! | failover to a replica | ledger of another `run_id` (replicated) | lost unreplicated writes now |
//! | demoted and promoted again | same `run_id`, new replication id, `master_replid2` set | lost unreplicated writes now |
//! | a replica attached, a backup (`SYNC`), the backlog freed | same `run_id`, new replication id, `master_replid2` cleared | nothing lost |
//!
//! A node that lost keys is kept out of acquisitions and extensions (releases still go to
//! it) until the horizon has passed since the loss ([`state`]); a replay acquisition
//! doubts its "no record" for the retention ([`doubts`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::{NodeStatus, Redlock};
//!
//! let redlock = Redlock::builder(["redis://10.0.0.1:6379"]).build()?;
//! for node in redlock.health().await.nodes() {
//!     if let NodeStatus::Quarantined { remaining, reason } = node.status() {
//!         println!("{} may have lost keys ({reason}): back in {remaining:?}", node.node());
//!     }
//! }
//! # Ok(()) }
//! ```

pub(crate) mod doubts;
pub(crate) mod horizon;
pub(crate) mod info;
pub(crate) mod judge;
pub(crate) mod ledger;
pub(crate) mod state;

pub(crate) use doubts::{Doubts, Whole};
pub(crate) use horizon::Horizon;
pub(crate) use info::{Role, ServerInfo};
pub(crate) use judge::{Seen, judge};
pub(crate) use ledger::{Ledger, LedgerKeys};
pub(crate) use state::{News, NodeLoss};

/// A fresh epoch: 16 bytes from the OS's CSPRNG, in hex. An epoch only needs to differ
/// from every other of the same nodes; `None` if the OS refused randomness.
pub(crate) fn fresh_epoch() -> Option<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn epochs_differ() {
        let (a, b) = (super::fresh_epoch(), super::fresh_epoch());
        assert_eq!(a.as_ref().map(String::len), Some(32));
        assert_ne!(a, b);
    }
}
