//! Releases sent again: those our connection broke before writing (merged releases wait
//! for the connection's next write) go to the node's next connection, in a task of their
//! own, so they reach the node even when their callers stopped waiting; a caller still
//! waiting gets its release's answer from there. Sending them again cannot delete twice:
//! the node never saw them. Each counts as running until answered (shutdown waits for
//! it), and those that still fail are logged: their keys stay until their TTL.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("job:1").await?;
//! // Not written when the connection breaks: sent again on the next one.
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::sync::{Arc, Weak};
use std::time::Instant;

use redis::RedisError;

use super::call::How;
use super::running::Running;
use super::{Node, wire};
use crate::error::NodeError;
use crate::quorum::later;

impl Node {
    /// Sends `unsent` again on the node's next connection: releases its connection broke
    /// before writing (merged releases wait for the connection's next write). In a task of
    /// their own, so they reach the node even when their callers stopped waiting (within
    /// twice the connect timeout), as a batch of releases does (see
    /// [`send_batch`](Self::send_batch)); their callers still waiting get these answers.
    /// Sending them again cannot delete twice: the node never saw them.
    pub(super) fn resend(node: &Weak<Self>, unsent: Vec<wire::Unsent>) {
        // Without the node or a runtime, each release fails (see `Unsent`'s drop).
        let (Some(node), Ok(runtime)) = (node.upgrade(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        // Connecting takes at most the connect timeout; the answer gets as long again.
        let limit = later(
            crate::clock::now(),
            node.connect_timeout().saturating_mul(2),
        );
        // Each counts as running until answered: `shutdown` waits for them.
        let unsent: Vec<_> = unsent
            .into_iter()
            .map(|release| (release, node.settings.releases.start()))
            .collect();
        runtime.spawn(async move {
            let sent = unsent
                .into_iter()
                .map(|(release, running)| node.resend_one(release, running, limit));
            let failed = futures_util::future::join_all(sent)
                .await
                .into_iter()
                .filter(|sent| !sent)
                .count();
            if failed > 0 {
                tracing::warn!(
                    node = %node.label(),
                    releases = failed,
                    "redlock releases could not be sent to a node after its connection broke: \
                     their keys stay until their TTL"
                );
            } else {
                tracing::debug!(
                    node = %node.label(),
                    "redlock releases sent again to a node after its connection broke"
                );
            }
        });
    }

    /// Sends one release of [`resend`](Self::resend) until `limit` and hands its caller
    /// the answer; whether the node answered it. It counts as running (`_running`, dropped
    /// when this returns) until then.
    async fn resend_one(
        self: &Arc<Self>,
        release: wire::Unsent,
        _running: Running,
        limit: Instant,
    ) -> bool {
        let sending = How::release_by_task(limit);
        let call = Arc::clone(release.call());
        let limit = tokio::time::Instant::from_std(limit);
        let answer = tokio::time::timeout_at(limit, self.call_now(&call, sending))
            .await
            .unwrap_or(Err(NodeError::Timeout));
        let sent = answer.is_ok();
        release.answer(answer.map_err(|error| {
            let detail = error.to_string();
            RedisError::from((
                redis::ErrorKind::Io,
                "the release could not be sent again",
                detail,
            ))
        }));
        sent
    }
}
