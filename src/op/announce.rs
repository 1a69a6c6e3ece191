//! Announcing a TTL: before its first lock with a TTL longer than any this client
//! announced, the client raises every node's horizon to it (`node::loss::horizon`) and
//! waits for a quorum to take it, so that a client with a shorter TTL keeps a node that
//! lost keys out for at least this long. Later connects and checks raise it on every node.
//!
//! ```text
//! try_lock_with_ttl(name, 60 s), announced 10 s -> EVAL raise <prefix>#horizon 60000 on
//!   every node; a quorum took it -> announced 60 s -> SET NX PX 60000 ...
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.try_lock_with_ttl("report", Duration::from_secs(60)).await?;
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::time::Duration;

use crate::core::{Core, ttl_ms};
use crate::error::{LockError, NodeFailure};
use crate::quorum::later;
use crate::round::Nodes;

/// Announces `ttl` to `core`'s nodes if it is longer than any this client announced (and
/// the restart quarantine is on), within the per-node timeout: a no-quorum error if
/// fewer than a quorum took it.
pub(crate) async fn announce<N: Nodes + ?Sized>(
    core: &Core<N>,
    ttl: Duration,
) -> Result<(), LockError> {
    if !core.horizon().uses(ttl) {
        return Ok(());
    }
    let deadline = later(crate::clock::now(), core.node_timeout());
    let each = core.nodes().announce(ttl_ms(ttl), deadline).await;
    let took = each.iter().filter(|r| r.is_ok()).count();
    if took >= core.quorum() {
        core.horizon().announced(ttl);
        return Ok(());
    }
    let failures = each
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| {
            r.err().map(|error| NodeFailure {
                node: core.nodes().label(i).to_owned(),
                error,
            })
        })
        .collect();
    Err(LockError::NoQuorum {
        needed: core.quorum(),
        reached: took,
        held_elsewhere: 0,
        failures,
        attempts: 1,
    })
}
