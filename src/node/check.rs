//! A node's health check: `PING` and `INFO replication` in one timed round trip.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let health = redlock.health().await;
//! println!("{} of {} nodes usable", health.usable(), health.nodes().len());
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use tokio::time::timeout_at;

use super::identity::{Role, ServerInfo};
use super::{Node, Quarantine};
use crate::error::NodeError;

/// The outcome of a health check of one node ([`Node::check`]).
pub(crate) struct Check {
    pub(crate) result: Result<(), NodeError>,
    pub(crate) round_trip: Option<Duration>,
    pub(crate) version: Option<String>,
    pub(crate) role: Option<String>,
}

impl Check {
    /// This check of `node` (connected in `generation`), with what its `INFO replication`
    /// said: the role, and a failure if the replication changed under the connection
    /// (which is then dropped, so that the next connect judges the server anew).
    fn with_replication(self, node: &Node, generation: u64, replication: Option<&str>) -> Self {
        let role = replication.and_then(|info| {
            info.lines()
                .find_map(|l| l.trim_end().strip_prefix("role:").map(str::to_owned))
        });
        let changed = replication
            .filter(|_| !node.is_cluster())
            .and_then(|info| node.moved_on(info));
        match changed {
            Some(changed) => {
                node.invalidate(generation, &changed);
                Self {
                    result: Err(changed),
                    round_trip: None,
                    role,
                    ..self
                }
            }
            None => Self { role, ..self },
        }
    }
}

impl Node {
    /// A health check within `deadline`: `PING` and `INFO replication` (for the role) in
    /// one round trip, timed.
    pub(crate) async fn check(self: &Arc<Self>, deadline: Instant) -> Check {
        let failed = |error| Check {
            result: Err(error),
            round_trip: None,
            version: self.state().version.clone(),
            role: None,
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        let (mut conn, generation) =
            match timeout_at(deadline, self.connection(Quarantine::Ignored)).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return failed(e),
                Err(_) => return failed(NodeError::Timeout),
            };
        let start = Instant::now();
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .cmd("PING")
            .cmd("INFO")
            .arg("replication");
        let replies = timeout_at(
            deadline,
            pipe.query_async::<Vec<redis::RedisResult<Value>>>(&mut conn),
        )
        .await;
        let round_trip = start.elapsed();
        let mut replies = match replies {
            Ok(Ok(replies)) => replies.into_iter(),
            Ok(Err(e)) => {
                let e = NodeError::from(e);
                if e.breaks_connection() {
                    self.invalidate(generation, &e);
                }
                return failed(e);
            }
            Err(_) => return failed(NodeError::Timeout),
        };
        if let Some(Err(e)) = replies.next() {
            return failed(NodeError::from(e));
        }
        let replication = replies
            .next()
            .and_then(Result::ok)
            .and_then(|v| redis::from_redis_value::<String>(v).ok());
        // The state's lock is not held past this line: the replication's judgment takes it.
        let version = self.state().version.clone();
        let checked = Check {
            result: Ok(()),
            round_trip: Some(round_trip),
            version,
            role: None,
        };
        checked.with_replication(self, generation, replication.as_deref())
    }

    /// Whether the server's replication changed under a connection that stayed up: it is
    /// no longer a master, or it is one with another replication id than at connect (a
    /// master demoted and promoted again, which may lack keys).
    fn moved_on(&self, replication: &str) -> Option<NodeError> {
        let now = ServerInfo::parse([replication]);
        if let Role::Other(role) = now.role {
            return Some(NodeError::NotMaster { role });
        }
        let st = self.state();
        let known = st.known.as_ref()?;
        let changed =
            !known.replid.is_empty() && !now.replid.is_empty() && known.replid != now.replid;
        changed.then(|| {
            NodeError::Connection(
                "the server's replication id changed since it connected (a failover?): \
                 reconnecting"
                    .into(),
            )
        })
    }
}
