//! The response body of [`RedlockService`](super::RedlockService): the inner service's body,
//! a rejection's, or a replayed response's.
//!
//! In body-end release mode ([`RedlockLayer::release_on_body_end`](crate::RedlockLayer::release_on_body_end))
//! the body holds the lock until the stream ends (its last frame, an error, trailers) or
//! the body is dropped, and then releases it in the background. With replay on, a
//! response to keep streams through the replay room's recording body
//! (`replay::recording`), which holds the lock until the record is stored.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::rejection_hook::BoxError;
use super::rejection_hook::{Answer, BoxBody};
use super::replay::completion::Recorder;
use super::replay::recording::RecordingBody;
use crate::backend::LockBackend;
use crate::client::Redlock;
use crate::guard::LockGuard;

pin_project! {
    /// The body of responses from [`RedlockService`](super::RedlockService).
    pub struct ResponseBody<B, L: LockBackend = Redlock> {
        #[pin]
        kind: BodyKind<B, L>,
    }
}

pin_project! {
    #[project = BodyKindProj]
    enum BodyKind<B, L: LockBackend> {
        Inner {
            #[pin]
            body: B,
            held: Option<LockGuard<L>>,
        },
        Fixed {
            data: Option<Bytes>,
            trailers: Option<Box<HeaderMap>>,
        },
        Recording {
            #[pin]
            body: RecordingBody<B, L>,
        },
        Hook {
            body: Option<BoxBody>,
        },
    }
}

impl<B, L: LockBackend> ResponseBody<B, L> {
    pub(crate) fn inner(body: B, held: Option<LockGuard<L>>) -> Self {
        Self {
            kind: BodyKind::Inner { body, held },
        }
    }

    /// A rejection's answer (the default body, or a hook's).
    pub(crate) fn answer(answer: Answer) -> Self {
        match answer {
            Answer::Data(data) => Self::fixed(data, None),
            Answer::Boxed(body) => Self {
                kind: BodyKind::Hook { body: Some(body) },
            },
        }
    }

    /// Bytes known in full, and the trailers of a gRPC reply if any: a rejection's default
    /// body, or a replayed response's.
    pub(crate) fn fixed(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: BodyKind::Fixed {
                data: (!data.is_empty()).then_some(data),
                trailers: trailers.map(Box::new),
            },
        }
    }

    /// A response to keep, streaming through `recorder` (`size`: the body's size when
    /// known, which marks its last data frame).
    pub(crate) fn recording(body: B, recorder: Recorder<L>, size: Option<u64>) -> Self {
        Self {
            kind: BodyKind::Recording {
                body: RecordingBody::new(body, recorder, size),
            },
        }
    }

    /// Whether this body still holds a lock (body-end release mode, or a response being
    /// recorded for replay, until its record is stored).
    pub fn holds_lock(&self) -> bool {
        match &self.kind {
            BodyKind::Inner { held, .. } => held.is_some(),
            BodyKind::Fixed { .. } | BodyKind::Hook { .. } => false,
            BodyKind::Recording { body } => body.holds_lock(),
        }
    }
}

impl<B, L: LockBackend> std::fmt::Debug for ResponseBody<B, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            BodyKind::Inner { held, .. } => f
                .debug_struct("ResponseBody::Inner")
                .field("holds_lock", &held.is_some())
                .finish_non_exhaustive(),
            BodyKind::Fixed { data, trailers } => f
                .debug_struct("ResponseBody::Rejection")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .field("trailers", &trailers.is_some())
                .finish(),
            BodyKind::Recording { body } => f
                .debug_struct("ResponseBody::Recording")
                .field("holds_lock", &body.holds_lock())
                .finish_non_exhaustive(),
            BodyKind::Hook { .. } => f.debug_struct("ResponseBody::Hook").finish_non_exhaustive(),
        }
    }
}

impl<B, L> Body for ResponseBody<B, L>
where
    B: Body,
    L: LockBackend,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    /// The inner body's error, boxed, or the replay room's
    /// [`NotRecorded`](super::NotRecorded) for a kept response whose record reached too
    /// few nodes.
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            BodyKindProj::Inner { body, held } => poll_holding(body, held, cx),
            BodyKindProj::Fixed { data, trailers } => Poll::Ready(match data.take() {
                Some(d) => Some(Ok(Frame::data(B::Data::from(d)))),
                None => trailers.take().map(|t| Ok(Frame::trailers(*t))),
            }),
            BodyKindProj::Hook { body } => poll_hook(body, cx),
            BodyKindProj::Recording { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            // While the lock is held, ask to be polled once more so the end is seen.
            BodyKind::Inner { body, held } => held.is_none() && body.is_end_stream(),
            BodyKind::Fixed { data, trailers } => data.is_none() && trailers.is_none(),
            BodyKind::Recording { body } => body.is_end_stream(),
            BodyKind::Hook { body } => body.as_ref().is_none_or(|b| b.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Inner { body, .. } => body.size_hint(),
            BodyKind::Recording { body } => body.size_hint(),
            BodyKind::Fixed { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            BodyKind::Hook { body } => body
                .as_ref()
                .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint()),
        }
    }
}

/// A body's next frame, as `poll_frame` gives it.
type NextFrame<D, E> = Poll<Option<Result<Frame<D>, E>>>;

/// The inner body's next frame; its last one (or an error) releases the lock it held.
fn poll_holding<B: Body, L: LockBackend>(
    body: Pin<&mut B>,
    held: &mut Option<LockGuard<L>>,
    cx: &mut Context<'_>,
) -> NextFrame<B::Data, BoxError>
where
    B::Error: Into<BoxError>,
{
    let frame = ready!(body.poll_frame(cx)).map(|f| f.map_err(Into::into));
    let last = match &frame {
        None | Some(Err(_)) => true,
        Some(Ok(f)) => f.is_trailers(),
    };
    if last {
        // Dropping the guard releases the lock in the background.
        held.take();
    }
    Poll::Ready(frame)
}

/// A rejection hook's body's next frame; an error ends it (logged: the status is sent).
fn poll_hook<D: From<Bytes>, E>(
    body: &mut Option<BoxBody>,
    cx: &mut Context<'_>,
) -> NextFrame<D, E> {
    let Some(inner) = body.as_mut() else {
        return Poll::Ready(None);
    };
    let frame = ready!(inner.as_mut().poll_frame(cx));
    match frame {
        Some(Ok(frame)) => return Poll::Ready(Some(Ok(frame.map_data(D::from)))),
        Some(Err(error)) => {
            tracing::warn!(%error, "the rejection hook's response body failed; ending it");
        }
        None => {}
    }
    body.take();
    Poll::Ready(None)
}
