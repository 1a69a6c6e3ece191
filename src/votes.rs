//! What a deciding round's answers add up to: each node's outcome counted in a [`Tally`],
//! and the nodes that failed, with their causes, for the error.
//!
//! ```text
//! 5 nodes, quorum 3:  granted, failed (timeout), granted, granted  ->  reached
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! match redlock.lock("job:1").await {
//!     Ok(lock) => drop(redlock.unlock(&lock).await),
//!     // The votes of the nodes that failed, with their causes.
//!     Err(error) => eprintln!("{error}"),
//! }
//! # Ok(()) }
//! ```

use crate::error::{LockError, NodeError, NodeFailure};
use crate::quorum::{Decision, Outcome, Tally};

/// The outcomes a deciding round has counted so far.
#[derive(Debug)]
pub(crate) struct Votes {
    pub(crate) tally: Tally,
    /// The nodes that failed, with their causes.
    pub(crate) failures: Vec<NodeFailure>,
}

impl Votes {
    /// No outcome yet, of `nodes` nodes.
    pub(crate) fn new(nodes: usize) -> Self {
        Self {
            tally: Tally::new(nodes),
            failures: Vec::new(),
        }
    }

    /// Counts the outcome of the node labelled `node`: what its answer meant, or why it
    /// failed (the failure is kept for the error).
    pub(crate) fn count(&mut self, node: &str, outcome: Result<Outcome, NodeError>) {
        let outcome = outcome.unwrap_or_else(|error| {
            self.failures.push(NodeFailure::new(node, error));
            Outcome::Failed
        });
        self.tally.record_outcome(outcome);
    }

    /// Counts a node the round did not ask (it cannot grant).
    pub(crate) fn skipped(&mut self) {
        self.tally.record_outcome(Outcome::Failed);
    }

    /// Whether more answers are needed: the quorum is neither reached nor out of reach,
    /// or the failure could still turn out "busy" rather than "short of nodes" (so the
    /// error can say which).
    pub(crate) fn undecided(&self) -> bool {
        self.tally.decision() == Decision::Pending || self.tally.busy_undecided()
    }

    /// The fewest further answers that could change the decision (at least 1).
    pub(crate) fn to_decide(&self) -> usize {
        self.tally.outcomes_to_decide()
    }

    /// Whether a node failed because it is in the restart quarantine.
    pub(crate) fn quarantined(&self) -> bool {
        self.failures
            .iter()
            .any(|f| matches!(f.error, NodeError::Quarantined { .. }))
    }

    /// Whether a quorum granted.
    pub(crate) fn reached(&self) -> bool {
        self.tally.decision() == Decision::Reached
    }

    /// The failure of a round that did not reach its quorum because nodes failed.
    pub(crate) fn no_quorum(self) -> LockError {
        LockError::NoQuorum {
            needed: self.tally.quorum(),
            reached: self.tally.successes(),
            held_elsewhere: self.tally.held_elsewhere(),
            failures: self.failures,
            attempts: 1,
        }
    }
}
