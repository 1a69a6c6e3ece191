//! Writing completion records (idempotent replay). A response whose status the policy
//! keeps streams to the client through a [`Recorder`] (see
//! [`recording`](super::recording)): it copies the body as it goes, up to the policy's
//! limit, and when the body has ended, stores the record on the nodes where the lock is
//! held, in the lock's place: that releases it there, in the same round trip. A body that
//! fails, or that is dropped before its end (the client went away), leaves no record: the
//! recorder is dropped with the lock guard, which releases in the background.
//!
//! ```text
//! body ended --> lock still held? --yes--> record (status, headers, body or "not kept"
//!            |                              [, trailers]) --> COMPLETE on every node
//!            |                              (the record replaces the lock), RELEASE
//!            |                              only where no answer came
//!            \--no (lost, validity over)--> (no record) --> RELEASE
//!            --> last frame (or end of stream) to the client
//! ```
//!
//! ```no_run
//! # #[cfg(feature = "axum")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_redlock::layer::Header;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! // Each kept response is recorded as it streams, and stored before its last frame.
//! let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key").required())
//!     .replay(Duration::from_secs(24 * 60 * 60));
//! # let _ = layer; Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::HeaderMap;

use super::record::{self, ReplayPolicy};
use crate::backend::LockBackend;
use crate::guard::LockGuard;
use crate::layer::reject::Protocol;
use crate::layer::request::fingerprint::Fingerprint;
use crate::token::Shared;

/// Stores `record` where `guard`'s lock is held, keeping it for `retention`, and releases
/// the lock, in one trip down ([`LockGuard::complete`]): whether a quorum of nodes holds
/// the record. A lock that is no longer held (lost, or its validity ran out, as with a
/// handler that outlived its TTL without extension) gets no record, only the release:
/// another request may hold the name by now and write its own, and two records for one
/// name must not come from two runs.
async fn store_then_release<L: LockBackend>(
    guard: LockGuard<L>,
    record: Vec<u8>,
    retention: Duration,
) -> bool {
    match guard.complete(record, retention).await {
        Some(stored) if stored.on >= stored.needed => true,
        Some(stored) => {
            tracing::warn!(
                stored = stored.on,
                needed = stored.needed,
                "redlock layer stored the completion record on too few nodes: the response ends with an error, and a retry gets the record restored or runs the handler again"
            );
            false
        }
        None => {
            tracing::warn!(
                "redlock layer: the lock was lost before the response was recorded; no completion record (the response ends with an error, and a retry runs the handler again)"
            );
            false
        }
    }
}

/// What recording a response needs besides the response and its lock.
pub(crate) struct Keep<L> {
    pub(crate) lock: L,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) policy: ReplayPolicy,
    pub(crate) protocol: Protocol,
}

/// Copies a kept response as it streams to the client, and at its end stores its record
/// (see the module docs). Dropped before the end, it leaves no record, and its guard
/// releases the lock in the background.
pub(crate) struct Recorder<L: LockBackend> {
    /// The record's head: marker, fingerprint, status and kept headers.
    head: Vec<u8>,
    /// The body so far; `None` once it is over the policy's limit (the record then says
    /// "completed, response not kept").
    body: Option<Vec<u8>>,
    /// A gRPC reply: its message framing, and the status its headers give (a
    /// trailers-only reply).
    grpc: Option<(GrpcFrames, Option<u16>)>,
    keep: Keep<L>,
    guard: LockGuard<L>,
}

impl<L: LockBackend> Recorder<L> {
    /// The shared state of the lock being held while the response is recorded.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        self.guard.shared()
    }

    /// Records the response of `parts`, whose body is expected to be of `size` bytes if
    /// known; `Err` gives the guard back when the response cannot be recorded (more
    /// header fields to keep than a record holds).
    pub(crate) fn new(
        parts: &http::response::Parts,
        size: Option<u64>,
        guard: LockGuard<L>,
        keep: Keep<L>,
    ) -> Result<Self, LockGuard<L>> {
        let Some(head) = keep
            .policy
            .encode_head(&keep.fingerprint, parts.status, &parts.headers)
        else {
            tracing::warn!("redlock layer: too many headers to keep; no completion record");
            return Err(guard);
        };
        let limit = keep.policy.body_limit();
        // Room for the whole body when its size is known and kept, up to 1 MiB: more grows
        // as it comes (a size hint is no reason to allocate gigabytes up front).
        let capacity = size
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n <= limit)
            .map_or(0, |n| n.min(1 << 20));
        let grpc = (keep.protocol == Protocol::Grpc)
            .then(|| (GrpcFrames::default(), record::grpc_status(&parts.headers)));
        Ok(Self {
            head,
            body: Some(Vec::with_capacity(capacity)),
            grpc,
            keep,
            guard,
        })
    }

    /// A data frame went by.
    pub(crate) fn data(&mut self, data: &[u8]) {
        if let Some((frames, _)) = &mut self.grpc {
            frames.feed(data);
        }
        let limit = self.keep.policy.body_limit();
        if let Some(body) = &mut self.body {
            if body.len().saturating_add(data.len()) <= limit {
                body.extend_from_slice(data);
            } else {
                self.body = None;
            }
        }
    }

    /// The body ended (with `trailers`, if any): the work that stores the record and
    /// releases the lock, or only releases it when the response is not kept after all (a
    /// gRPC status worth a retry, a streaming gRPC reply). It runs on its own task, so a
    /// client that goes away now does not cut a record short.
    pub(crate) fn finish(mut self, trailers: Option<&HeaderMap>) -> Finishing {
        let record = self.record(trailers);
        let retention = self.keep.policy.retention();
        let guard = self.guard;
        match record {
            Some(record) => Finishing::start(store_then_release(guard, record, retention)),
            None => Finishing::start(async move {
                let _ = guard.release().await;
                // Not kept: nothing to wait for.
                true
            }),
        }
    }

    /// The record of the response, or `None` when it is not kept.
    fn record(&mut self, trailers: Option<&HeaderMap>) -> Option<Vec<u8>> {
        // A node near its memory limit takes no responses: "completed, not kept".
        let body = self
            .body
            .take()
            .filter(|_| self.keep.lock.room_for_records());
        let trailers = match &self.grpc {
            Some((frames, code)) => {
                let code = trailers.and_then(record::grpc_status).or(*code)?;
                if !self.keep.policy.keeps_grpc(code) || !frames.is_unary() {
                    return None;
                }
                trailers
            }
            // HTTP trailers are not kept.
            None => None,
        };
        let mut out = std::mem::take(&mut self.head);
        let written = self
            .keep
            .policy
            .encode_tail(&mut out, body.as_deref(), trailers);
        if written.is_none() {
            tracing::warn!("redlock layer: too many trailers to keep; no completion record");
            return None;
        }
        crate::metrics::record_bytes(out.len());
        Some(out)
    }
}

/// A gRPC reply's framing, followed across data frames: each message is a compressed
/// flag byte, a big-endian u32 length and the message.
#[derive(Debug, Default)]
struct GrpcFrames {
    /// Messages begun.
    messages: u32,
    /// Bytes of the current message's prefix seen (0 to 4), and the prefix.
    prefix: [u8; 5],
    prefix_len: usize,
    /// Bytes of the current message still to come.
    left: u64,
}

impl GrpcFrames {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = usize::try_from(self.left).map_or(bytes.len(), |l| l.min(bytes.len()));
                self.left = self.left.saturating_sub(n as u64);
                bytes = bytes.get(n..).unwrap_or_default();
                continue;
            }
            let n = (5 - self.prefix_len).min(bytes.len());
            if let (Some(dst), Some(src)) = (
                self.prefix.get_mut(self.prefix_len..self.prefix_len + n),
                bytes.get(..n),
            ) {
                dst.copy_from_slice(src);
            }
            self.prefix_len += n;
            bytes = bytes.get(n..).unwrap_or_default();
            if self.prefix_len == 5 {
                let [_, a, b, c, d] = self.prefix;
                self.left = u64::from(u32::from_be_bytes([a, b, c, d]));
                self.messages = self.messages.saturating_add(1);
                self.prefix_len = 0;
            }
        }
    }

    /// Whether the reply so far is at most one whole message (a unary reply).
    fn is_unary(&self) -> bool {
        self.messages <= 1 && self.prefix_len == 0 && self.left == 0
    }
}

/// A record being stored and the lock released, on a task of its own (or, outside a
/// tokio runtime, polled by the body).
pub(crate) enum Finishing {
    Task(tokio::task::JoinHandle<bool>),
    Inline(BoxFuture<'static, bool>),
}

impl Finishing {
    fn start(work: impl Future<Output = bool> + Send + 'static) -> Self {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => Self::Task(runtime.spawn(work)),
            Err(_) => Self::Inline(Box::pin(work)),
        }
    }

    /// Whether the work is done, and then whether the response may go out complete: its
    /// record is on a quorum of nodes (or it was not to be kept after all).
    pub(crate) fn poll_done(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        match self {
            // A task that panicked or was cancelled (its runtime shut down) stored nothing
            // it could vouch for.
            Self::Task(task) => Pin::new(task).poll(cx).map(|done| done.unwrap_or(false)),
            Self::Inline(work) => work.as_mut().poll(cx),
        }
    }
}

/// The error a kept response's body ends with instead of its last frame when its record
/// did not reach a quorum of nodes (or the lock was lost before it was stored): the client
/// sees a failed response, never a complete answer a retry would not replay. A retry
/// with the same key gets the record restored from the nodes that have it, or runs the
/// handler again if none has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct NotRecorded;

impl std::fmt::Display for NotRecorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the response's completion record reached too few nodes: the response is cut \
             short so that the client retries",
        )
    }
}

impl std::error::Error for NotRecorded {}

#[cfg(test)]
mod tests {
    use super::GrpcFrames;

    /// One message, split at every byte, is unary; two messages, or a message cut short,
    /// are not; no message (a trailers-only reply) is.
    #[test]
    fn grpc_framing_is_followed_across_frames() {
        let one = b"\x00\x00\x00\x00\x02hi";
        for split in 0..=one.len() {
            let mut frames = GrpcFrames::default();
            let (a, b) = one.split_at(split);
            frames.feed(a);
            frames.feed(b);
            assert!(frames.is_unary(), "split at {split}");
        }
        let mut two = GrpcFrames::default();
        two.feed(b"\x00\x00\x00\x00\x02hi\x00\x00\x00\x00\x00");
        assert!(!two.is_unary());
        let mut cut = GrpcFrames::default();
        cut.feed(b"\x00\x00\x00\x00\x05hi");
        assert!(!cut.is_unary());
        let mut prefix_only = GrpcFrames::default();
        prefix_only.feed(b"\x00\x00\x00");
        assert!(!prefix_only.is_unary());
        assert!(GrpcFrames::default().is_unary());
        let mut empty_message = GrpcFrames::default();
        empty_message.feed(b"\x00\x00\x00\x00\x00");
        assert!(empty_message.is_unary());
    }
}
