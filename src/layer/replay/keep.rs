//! Keeping a response for replay: the lock layer's future hands over a response its
//! policy keeps, with the lock; this future stores the completion record where the lock
//! is still held, releases, and then hands the response back. A response whose body is
//! small enough is read in full first (the record holds it); a larger one keeps its
//! status and headers only; a streaming gRPC reply is recorded by its body as it streams
//! (see [`recording`](super::recording)).
//!
//! ```text
//! 201 + body -> Collecting (read the body) -> Finishing (store the record, release) -> 201
//! gRPC reply -> a recording body, at once (its trailers wait for the record)
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
//! // Responses the policy keeps are stored before the lock is released.
//! let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key").required())
//!     .replay(Duration::from_secs(24 * 60 * 60));
//! # let _ = layer; Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http::Response;
use http::response::Parts;
use http_body::Body;
use pin_project_lite::pin_project;

use super::completion::{GrpcRecorder, store_then_release};
use super::fingerprint::Fingerprint;
use super::record::{self, ReplayPolicy};
use crate::client::Redlock;
use crate::guard::LockGuard;
use crate::layer::body::ResponseBody;
use crate::layer::reject::Protocol;

/// What keeping a response needs besides the response and its lock.
pub(crate) struct Keep {
    pub(crate) redlock: Redlock,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) policy: ReplayPolicy,
    pub(crate) protocol: Protocol,
}

pin_project! {
    /// Stores a kept response's record, releases its lock, then yields the response.
    pub(crate) struct KeepFuture<B> {
        #[pin]
        state: KeepState<B>,
        keep: Keep,
    }
}

pin_project! {
    #[project = KeepProj]
    #[project_replace = KeepOwned]
    enum KeepState<B> {
        /// Reading the body of a response small enough to keep whole.
        Collecting {
            #[pin]
            body: B,
            parts: Parts,
            buf: Vec<u8>,
            guard: LockGuard,
        },
        /// Storing the record (or only releasing); the response waits.
        Finishing {
            work: BoxFuture<'static, ()>,
            guard: LockGuard,
            response: Response<ResponseBody<B>>,
        },
        /// The response is ready.
        Ready {
            response: Response<ResponseBody<B>>,
        },
        Done,
    }
}

impl<B: Body> KeepFuture<B> {
    /// Keeps `res` (which the policy keeps by its status), holding `guard`'s lock until
    /// its record is stored.
    pub(crate) fn new(res: Response<B>, guard: LockGuard, keep: Keep) -> Self {
        let state = if keep.protocol == Protocol::Grpc {
            match record::grpc_status(res.headers()) {
                // A trailers-only reply (an error status): kept or not by its code.
                Some(code) if keep.policy.keeps_grpc(code) => whole(res, guard, &keep),
                Some(_) => release(guard, res.map(|b| ResponseBody::inner(b, None))),
                None => {
                    let (parts, body) = res.into_parts();
                    let recorder = GrpcRecorder::new(
                        &parts,
                        keep.fingerprint,
                        keep.policy.clone(),
                        keep.redlock.clone(),
                        guard,
                    );
                    let body = ResponseBody::recording(body, recorder);
                    KeepState::Ready {
                        response: Response::from_parts(parts, body),
                    }
                }
            }
        } else {
            whole(res, guard, &keep)
        };
        Self { state, keep }
    }
}

impl<B: Body> Future for KeepFuture<B> {
    type Output = Response<ResponseBody<B>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut state = this.state;
        loop {
            let next = match state.as_mut().project() {
                KeepProj::Collecting { body, buf, .. } => {
                    let complete = ready!(collect(body, buf, cx));
                    match state.as_mut().project_replace(KeepState::Done) {
                        KeepOwned::Collecting {
                            parts, buf, guard, ..
                        } => collected(parts, buf, guard, complete.then_some(&*this.keep)),
                        _ => KeepState::Done,
                    }
                }
                KeepProj::Finishing { work, .. } => {
                    ready!(work.as_mut().poll(cx));
                    match state.as_mut().project_replace(KeepState::Done) {
                        KeepOwned::Finishing {
                            mut guard,
                            response,
                            ..
                        } => {
                            guard.disarm();
                            return Poll::Ready(response);
                        }
                        _ => KeepState::Done,
                    }
                }
                KeepProj::Ready { .. } => match state.as_mut().project_replace(KeepState::Done) {
                    KeepOwned::Ready { response } => return Poll::Ready(response),
                    _ => KeepState::Done,
                },
                KeepProj::Done => panic!("KeepFuture polled after completion"),
            };
            state.set(next);
        }
    }
}

/// A response to keep whole: its body is read if it is small enough, otherwise only
/// status and headers are kept.
fn whole<B: Body>(res: Response<B>, guard: LockGuard, keep: &Keep) -> KeepState<B> {
    let (parts, body) = res.into_parts();
    let small = body
        .size_hint()
        .upper()
        .and_then(|n| usize::try_from(n).ok())
        .is_some_and(|n| n <= keep.policy.body_limit());
    if small {
        return KeepState::Collecting {
            body,
            parts,
            buf: Vec::new(),
            guard,
        };
    }
    let record = keep
        .policy
        .encode(&keep.fingerprint, parts.status, &parts.headers, None, None);
    let response = Response::from_parts(parts, ResponseBody::inner(body, None));
    match record {
        Some(record) => store(guard, keep, record, response),
        None => {
            tracing::warn!("redlock layer: too many headers to keep; no completion record");
            release(guard, response)
        }
    }
}

/// Reads the whole body into `buf`; `Ready(true)` at its end, `Ready(false)` on an error.
fn collect<B: Body>(mut body: Pin<&mut B>, buf: &mut Vec<u8>, cx: &mut Context<'_>) -> Poll<bool> {
    loop {
        match ready!(body.as_mut().poll_frame(cx)) {
            None => return Poll::Ready(true),
            Some(Err(_)) => return Poll::Ready(false),
            Some(Ok(frame)) => {
                // HTTP trailers are not kept (gRPC replies are recorded by their body).
                if let Ok(mut data) = frame.into_data() {
                    while data.has_remaining() {
                        let chunk = data.chunk();
                        buf.extend_from_slice(chunk);
                        let n = chunk.len();
                        data.advance(n);
                    }
                }
            }
        }
    }
}

/// The body is read (`keep` is `None` after a body error): store the record, or release
/// without one.
fn collected<B>(parts: Parts, buf: Vec<u8>, guard: LockGuard, keep: Option<&Keep>) -> KeepState<B> {
    let record = keep.map(|k| {
        k.policy.encode(
            &k.fingerprint,
            parts.status,
            &parts.headers,
            Some(&buf),
            None,
        )
    });
    let response = Response::from_parts(parts, ResponseBody::fixed(Bytes::from(buf), None));
    match (keep, record) {
        (Some(keep), Some(Some(record))) => store(guard, keep, record, response),
        (_, record) => {
            if record.is_some() {
                tracing::warn!("redlock layer: too many headers to keep; no completion record");
            } else {
                tracing::warn!("redlock layer: the response body failed; no completion record");
            }
            release(guard, response)
        }
    }
}

/// Stores `record` where the lock is held, then releases what is left.
fn store<B>(
    mut guard: LockGuard,
    keep: &Keep,
    record: Vec<u8>,
    response: Response<ResponseBody<B>>,
) -> KeepState<B> {
    let work = store_then_release(&mut guard, &keep.redlock, record, keep.policy.retention());
    KeepState::Finishing {
        work,
        guard,
        response,
    }
}

/// Only releases (nothing to keep after all).
fn release<B>(mut guard: LockGuard, response: Response<ResponseBody<B>>) -> KeepState<B> {
    KeepState::Finishing {
        work: guard.release_future().map(drop).boxed(),
        guard,
        response,
    }
}
