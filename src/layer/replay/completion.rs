//! Writing completion records (idempotent replay): once a kept response is known, the
//! record is stored on the nodes where the lock is held, and only then is the lock
//! released. HTTP responses are recorded by the response future before the response goes
//! out; gRPC replies by the response body, which holds the trailers back until the record
//! is stored ([`GrpcRecorder`]).
//!
//! ```text
//! handler done --> lock still held? --yes--> record (status, headers, body[, trailers])
//!              |                              --> COMPLETE on held nodes --> release
//!              \--no (lost, validity over)--> release (no record)
//!              --> response (or trailers) to the client
//! ```

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{HeaderMap, StatusCode};

use super::fingerprint::Fingerprint;
use super::record::{self, ReplayPolicy};
use crate::client::Redlock;
use crate::guard::LockGuard;

/// Stores `record` where `guard`'s lock is held, keeping it for `retention`, then releases
/// the lock. A lock that is no longer held (lost, or its validity ran out, as with a
/// handler that outlived its TTL without extension) gets no record, only the release:
/// another request may hold the name by now and write its own, and two records for one
/// name must not come from two runs. The caller disarms the guard once the future is done.
pub(crate) fn store_then_release(
    guard: &mut LockGuard,
    redlock: &Redlock,
    record: Vec<u8>,
    retention: Duration,
) -> BoxFuture<'static, ()> {
    let redlock = redlock.clone();
    let shared = Arc::clone(guard.shared());
    // Stops the extensions first: from here on the validity only runs down.
    let release = guard.release_future();
    Box::pin(async move {
        if shared.is_held() {
            let stored = redlock.complete(&shared.lock, &record, retention).await;
            if stored < redlock.quorum() {
                tracing::warn!(
                    stored,
                    needed = redlock.quorum(),
                    "redlock layer stored the completion record on too few nodes: a retry may run the handler again"
                );
            }
        } else {
            tracing::warn!(
                "redlock layer: the lock was lost before the response was recorded; no completion record (a retry runs the handler again)"
            );
        }
        release.await;
    })
}

/// Copies a gRPC reply as it streams to the client, and at its end decides whether it is
/// kept: one message within the size limit, and a status the policy keeps.
pub(crate) struct GrpcRecorder {
    /// The reply so far; `None` once it cannot be kept (too large, unreadable).
    buf: Option<Vec<u8>>,
    status: StatusCode,
    headers: HeaderMap,
    fingerprint: Fingerprint,
    policy: ReplayPolicy,
    redlock: Redlock,
    guard: LockGuard,
}

impl GrpcRecorder {
    pub(crate) fn new(
        parts: &http::response::Parts,
        fingerprint: Fingerprint,
        policy: ReplayPolicy,
        redlock: Redlock,
        guard: LockGuard,
    ) -> Self {
        Self {
            buf: Some(Vec::new()),
            status: parts.status,
            headers: parts.headers.clone(),
            fingerprint,
            policy,
            redlock,
            guard,
        }
    }

    /// A data frame went by. A frame that is not one contiguous chunk, or that takes the
    /// reply past the size limit, ends the recording (the lock is still held to the end).
    pub(crate) fn data(&mut self, data: &impl bytes::Buf) {
        let chunk = data.chunk();
        let contiguous = chunk.len() == data.remaining();
        let limit = self.policy.body_limit();
        if let Some(buf) = &mut self.buf {
            if contiguous && buf.len().saturating_add(chunk.len()) <= limit {
                buf.extend_from_slice(chunk);
            } else {
                self.buf = None;
            }
        }
    }

    /// The reply ended (with `trailers`, if any): the work that stores its record and
    /// releases the lock, or `None` if it is not kept (too large, more than one message, a
    /// status the policy does not keep, or too many header fields; the lock is released in
    /// the background as the recorder drops).
    pub(crate) fn finish(mut self, trailers: Option<&HeaderMap>) -> Option<Finishing> {
        let buf = self.buf.take()?;
        let code = trailers
            .and_then(record::grpc_status)
            .or_else(|| record::grpc_status(&self.headers))?;
        if !self.policy.keeps_grpc(code) || !record::is_unary_grpc_body(&buf) {
            return None;
        }
        let record = self.policy.encode(
            &self.fingerprint,
            self.status,
            &self.headers,
            Some(&buf),
            trailers,
        )?;
        let retention = self.policy.retention();
        let work = store_then_release(&mut self.guard, &self.redlock, record, retention);
        Some(Finishing {
            work,
            guard: self.guard,
        })
    }
}

/// A kept reply's record being stored; the guard is disarmed once `work` is done.
pub(crate) struct Finishing {
    pub(crate) work: BoxFuture<'static, ()>,
    pub(crate) guard: LockGuard,
}
