//! The mark of a waiter for another client's lock: once it listens for the release (and
//! before each wait), a waiter sets the nodes' waiting key
//! ([`MARK_WAITING`](crate::scripts)) for as long as it may wait, and then tries again at
//! once; a release tells the waiters on a node only while that key is there. A
//! release that nobody waits for then publishes nothing, which is almost every release: a
//! script's `PUBLISH` costs the node about as much as the rest of the release.
//!
//! ```text
//! attempt: busy (another client's) -> subscribe -> mark (every node, for the wait) -> attempt
//! release: GET, DEL, [waiting key there?] PUBLISH
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::Redlock;
//!
//! let (a, b) = (
//!     Redlock::builder(["redis://127.0.0.1:6379"]).build()?,
//!     Redlock::builder(["redis://127.0.0.1:6379"]).build()?,
//! );
//! let held = a.lock("report").await?;
//! // b waits: it marks the node, so a's release tells it.
//! let waiting = tokio::spawn(async move { b.lock("report").await });
//! let _ = a.unlock(&held).await;
//! let _ = waiting.await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use crate::core::{Core, ttl_ms};
use crate::name::Resource;
use crate::quorum::{NodeMask, later};
use crate::round::{Nodes, Plan, Purpose};
use crate::scripts::{Arg, Invocation, MARK_WAITING_SCRIPT, Request};

/// Marks every node for a waiter of `resource` that may wait up to `wait` (a mark already
/// there for longer stays as it is); returns on how many nodes it is there now. Each
/// node's call is bounded by the node timeout. Without a waiting key (a Redis Cluster's
/// names), every release tells: there is nothing to mark, and every node counts.
pub(crate) async fn mark_waiting<N: Nodes + ?Sized>(
    core: &Core<N>,
    resource: &Resource,
    wait: Duration,
) -> usize {
    let Some(waiting) = resource.waiting_key.as_deref() else {
        return core.node_count();
    };
    let args = [Arg::Int(ttl_ms(wait).max(1))];
    let request = Request::Script(Invocation {
        script: &MARK_WAITING_SCRIPT,
        keys: &[waiting],
        args: &args,
    });
    let plan = Plan {
        skip: NodeMask::default(),
        deadline: later(crate::clock::now(), core.node_timeout()),
        purpose: Purpose::Everywhere { after: None },
    };
    let mut round = core.nodes().send(&request, plan);
    let mut marked = 0;
    while let Some((_, reply)) = round.next().await {
        marked += usize::from(matches!(reply, Ok(redis::Value::Int(1))));
    }
    marked
}
