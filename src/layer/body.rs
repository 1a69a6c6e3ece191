//! The response body of [`RedlockService`](super::RedlockService): the inner service's body,
//! a rejection's, or a replayed response's.
//!
//! In body-end release mode ([`RedlockLayer::release_on_body_end`](crate::RedlockLayer::release_on_body_end))
//! the body holds the lock until the stream ends (its last frame, an error, trailers) or
//! the body is dropped, and then releases it in the background. With replay on, a gRPC
//! reply streams through a recorder that holds the lock to the end and, when the reply is
//! kept, holds the trailers back until its record is stored.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::rejection_hook::{Answer, BoxBody};
use super::replay::completion::{Finishing, GrpcRecorder};
use crate::guard::LockGuard;

pin_project! {
    /// The body of responses from [`RedlockService`](super::RedlockService).
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            held: Option<LockGuard>,
        },
        Fixed {
            data: Option<Bytes>,
            trailers: Option<Box<HeaderMap>>,
        },
        Recording {
            #[pin]
            body: B,
            rec: Box<Recording>,
        },
        Hook {
            body: Option<BoxBody>,
        },
    }
}

/// A gRPC reply being recorded (boxed: most responses never need it).
struct Recording {
    recorder: Option<GrpcRecorder>,
    finishing: Option<Finishing>,
    trailers: Option<HeaderMap>,
    finished: bool,
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, held: Option<LockGuard>) -> Self {
        Self {
            kind: Kind::Inner { body, held },
        }
    }

    /// A rejection's answer (the default body, or a hook's).
    pub(crate) fn answer(answer: Answer) -> Self {
        match answer {
            Answer::Data(data) => Self::fixed(data, None),
            Answer::Boxed(body) => Self {
                kind: Kind::Hook { body: Some(body) },
            },
        }
    }

    /// Bytes known in full, and the trailers of a gRPC reply if any: a rejection's default
    /// body, a replayed response's, or a response collected for its record.
    pub(crate) fn fixed(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: Kind::Fixed {
                data: (!data.is_empty()).then_some(data),
                trailers: trailers.map(Box::new),
            },
        }
    }

    /// A gRPC reply that streams through `recorder`.
    pub(crate) fn recording(body: B, recorder: GrpcRecorder) -> Self {
        Self {
            kind: Kind::Recording {
                body,
                rec: Box::new(Recording {
                    recorder: Some(recorder),
                    finishing: None,
                    trailers: None,
                    finished: false,
                }),
            },
        }
    }

    /// Whether this body still holds a lock (body-end release mode or a gRPC reply being
    /// recorded, stream not ended).
    pub fn holds_lock(&self) -> bool {
        match &self.kind {
            Kind::Inner { held, .. } => held.is_some(),
            Kind::Fixed { .. } | Kind::Hook { .. } => false,
            Kind::Recording { rec, .. } => !rec.finished,
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { held, .. } => f
                .debug_struct("ResponseBody::Inner")
                .field("holds_lock", &held.is_some())
                .finish_non_exhaustive(),
            Kind::Fixed { data, trailers } => f
                .debug_struct("ResponseBody::Rejection")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .field("trailers", &trailers.is_some())
                .finish(),
            Kind::Recording { rec, .. } => f
                .debug_struct("ResponseBody::Recording")
                .field("holds_lock", &!rec.finished)
                .finish_non_exhaustive(),
            Kind::Hook { .. } => f.debug_struct("ResponseBody::Hook").finish_non_exhaustive(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, held } => {
                let frame = ready!(body.poll_frame(cx));
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
            KindProj::Fixed { data, trailers } => Poll::Ready(match data.take() {
                Some(d) => Some(Ok(Frame::data(B::Data::from(d)))),
                None => trailers.take().map(|t| Ok(Frame::trailers(*t))),
            }),
            KindProj::Hook { body } => {
                let Some(inner) = body.as_mut() else {
                    return Poll::Ready(None);
                };
                match ready!(inner.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) => Poll::Ready(Some(Ok(frame.map_data(B::Data::from)))),
                    Some(Err(error)) => {
                        tracing::warn!(%error, "the rejection hook's response body failed; ending it");
                        body.take();
                        Poll::Ready(None)
                    }
                    None => {
                        body.take();
                        Poll::Ready(None)
                    }
                }
            }
            KindProj::Recording { body, rec } => {
                let Recording {
                    recorder,
                    finishing,
                    trailers,
                    finished,
                } = &mut **rec;
                if *finished {
                    return Poll::Ready(None);
                }
                if let Some(f) = finishing.as_mut() {
                    // The reply is kept: its trailers wait for the record to be stored.
                    ready!(f.work.as_mut().poll(cx));
                    if let Some(mut f) = finishing.take() {
                        f.guard.disarm();
                    }
                    *finished = true;
                    return Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))));
                }
                let end = match ready!(body.poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_trailers() {
                        Ok(t) => Some(t),
                        Err(frame) => {
                            if let (Some(r), Some(data)) = (recorder.as_mut(), frame.data_ref()) {
                                let chunk = data.chunk();
                                r.data(chunk, chunk.len() == data.remaining());
                            }
                            return Poll::Ready(Some(Ok(frame)));
                        }
                    },
                    None => None,
                    Some(Err(e)) => {
                        // No record; dropping the recorder releases in the background.
                        recorder.take();
                        return Poll::Ready(Some(Err(e)));
                    }
                };
                match recorder.take().and_then(|r| r.finish(end.as_ref())) {
                    Some(mut f) => {
                        // Poll the work now, so it is registered with the waker.
                        let done = f.work.as_mut().poll(cx).is_ready();
                        if done {
                            f.guard.disarm();
                            *finished = true;
                            return Poll::Ready(end.map(|t| Ok(Frame::trailers(t))));
                        }
                        *finishing = Some(f);
                        *trailers = end;
                        Poll::Pending
                    }
                    None => {
                        *finished = true;
                        Poll::Ready(end.map(|t| Ok(Frame::trailers(t))))
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            // While the lock is held, ask to be polled once more so the end is seen.
            Kind::Inner { body, held } => held.is_none() && body.is_end_stream(),
            Kind::Fixed { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Recording { rec, .. } => rec.finished,
            Kind::Hook { body } => body.as_ref().is_none_or(|b| b.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } | Kind::Recording { body, .. } => body.size_hint(),
            Kind::Fixed { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Hook { body } => body
                .as_ref()
                .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint()),
        }
    }
}
