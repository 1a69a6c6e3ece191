//! The response body of [`RedlockService`](super::RedlockService): the inner service's body,
//! a rejection's, or a replayed response's.
//!
//! In body-end release mode ([`RedlockLayer::release_on_body_end`](crate::RedlockLayer::release_on_body_end))
//! the body holds the lock until the stream ends (its last frame, an error, trailers) or
//! the body is dropped, and then releases it in the background. With replay on, a
//! response to keep streams through the replay room's recording body
//! (`replay::recording`), which holds the lock until the record is stored.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::reject::hook::BoxError;
use super::reject::hook::{Answer, BoxBody};
use super::replay::completion::Recorder;
use super::replay::recording::RecordingBody;
use crate::backend::{LockBackend, Redlock};
use crate::guard::LockGuard;
use crate::token::Shared;

pin_project! {
    /// The body of responses from [`RedlockService`](super::RedlockService).
    pub struct ResponseBody<B, L: LockBackend = Redlock> {
        #[pin]
        kind: BodyKind<B, L>,
        // The lock this body holds, watched for a stall (see `crate::stall`), until the
        // body ends.
        watch: Option<Arc<Shared>>,
        // The body stalled and ended with `Stalled`: it gives nothing more.
        stalled: bool,
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
        let watch = held.as_ref().map(|guard| Arc::clone(guard.shared()));
        Self::watching(BodyKind::Inner { body, held }, watch)
    }

    /// A body of `kind` that holds the lock of `watch`, if any: watched for a stall from
    /// now, as the server has it.
    fn watching(kind: BodyKind<B, L>, watch: Option<Arc<Shared>>) -> Self {
        if let Some(shared) = &watch {
            shared.stall.idle_from(crate::clock::now());
        }
        Self {
            kind,
            watch,
            stalled: false,
        }
    }

    /// A rejection's answer (the default body, or a hook's).
    pub(crate) fn answer(answer: Answer) -> Self {
        match answer {
            Answer::Data(data) => Self::fixed(data, None),
            Answer::Boxed(body) => Self {
                kind: BodyKind::Hook { body: Some(body) },
                watch: None,
                stalled: false,
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
            watch: None,
            stalled: false,
        }
    }

    /// A response to keep, streaming through `recorder` (`size`: the body's size when
    /// known, which marks its last data frame).
    pub(crate) fn recording(body: B, recorder: Recorder<L>, size: Option<u64>) -> Self {
        let watch = Some(Arc::clone(recorder.shared()));
        let body = RecordingBody::new(body, recorder, size);
        Self::watching(BodyKind::Recording { body }, watch)
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
        let this = self.project();
        if *this.stalled {
            return Poll::Ready(None);
        }
        let Some(watch) = this.watch.as_ref() else {
            return poll_kind(this.kind, cx);
        };
        if watch.stall.fired() {
            // Its lock was released for the stall: end the response here.
            *this.watch = None;
            *this.stalled = true;
            return Poll::Ready(Some(Err(Box::new(Stalled))));
        }
        let frame = poll_kind(this.kind, cx);
        match &frame {
            Poll::Pending => watch.stall.busy(),
            Poll::Ready(Some(Ok(_))) => watch.stall.idle_from(crate::clock::now()),
            Poll::Ready(None | Some(Err(_))) => *this.watch = None,
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        if self.stalled {
            return true;
        }
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

/// The next frame of a body of `kind`.
fn poll_kind<B, L>(
    kind: Pin<&mut BodyKind<B, L>>,
    cx: &mut Context<'_>,
) -> NextFrame<B::Data, BoxError>
where
    B: Body,
    L: LockBackend,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
{
    match kind.project() {
        BodyKindProj::Inner { body, held } => poll_holding(body, held, cx),
        BodyKindProj::Fixed { data, trailers } => Poll::Ready(match data.take() {
            Some(d) => Some(Ok(Frame::data(B::Data::from(d)))),
            None => trailers.take().map(|t| Ok(Frame::trailers(*t))),
        }),
        BodyKindProj::Hook { body } => poll_hook(body, cx),
        BodyKindProj::Recording { body } => body.poll_frame(cx),
    }
}

/// The error a response body ends with when the server stopped taking its frames for the
/// layer's [`stall_timeout`](crate::RedlockLayer::stall_timeout) and its lock was
/// released ([`LostReason::BodyStalled`](crate::LostReason::BodyStalled)): the rest of the
/// response is not sent, and nothing is recorded for replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stalled;

impl fmt::Display for Stalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "the response body was not read for the layer's stall timeout: its lock was released",
        )
    }
}

impl std::error::Error for Stalled {}

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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use futures_util::task::noop_waker;
    use tokio::sync::mpsc;

    use super::*;
    use crate::testing::InMemoryLock;

    type Source = http_body_util::StreamBody<
        futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, std::convert::Infallible>>,
    >;

    /// A body whose frames the test sends, holding a watched lock on `name`.
    async fn watched(name: &str) -> (ResponseBody<Source, InMemoryLock>, mpsc::Sender<Bytes>) {
        let backend = InMemoryLock::new();
        let lock = backend
            .try_lock(name.as_bytes(), Duration::from_secs(30))
            .await
            .expect("lock");
        let guard = LockGuard::watched(backend, lock, true, Some(Duration::from_secs(1)));
        let (tx, mut rx) = mpsc::channel::<Bytes>(4);
        let frames = futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx).map(|d| d.map(|d| Ok(Frame::data(d))))
        });
        let body = http_body_util::StreamBody::new(Box::pin(frames) as _);
        (ResponseBody::inner(body, Some(guard)), tx)
    }

    fn poll(body: &mut ResponseBody<Source, InMemoryLock>) -> NextFrame<Bytes, BoxError> {
        let waker = noop_waker();
        Pin::new(body).poll_frame(&mut Context::from_waker(&waker))
    }

    #[tokio::test]
    async fn only_a_body_left_unread_stalls_and_a_stalled_body_fails_once() {
        let (mut body, tx) = watched("stall").await;
        let watch = Arc::clone(body.watch.as_ref().expect("watched"));
        let later = Instant::now() + Duration::from_secs(3600);
        assert!(watch.stall.stalled(later), "handed to the server: idle");
        assert!(poll(&mut body).is_pending());
        assert!(!watch.stall.stalled(later), "waiting on its source");
        tx.send(Bytes::from_static(b"a")).await.expect("send");
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Ok(_)))));
        assert!(watch.stall.stalled(later), "a frame out: idle again");
        assert!(!watch.stall.fired());

        assert!(watch.stall.fire_if_stalled(later));
        tx.send(Bytes::from_static(b"b")).await.expect("send");
        let Poll::Ready(Some(Err(error))) = poll(&mut body) else {
            panic!("a stalled body fails");
        };
        assert!(error.is::<Stalled>(), "{error}");
        assert!(matches!(poll(&mut body), Poll::Ready(None)), "and ends");
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn a_body_that_ends_stops_being_watched() {
        let (mut body, tx) = watched("ends").await;
        drop(tx);
        assert!(matches!(poll(&mut body), Poll::Ready(None)));
        assert!(body.watch.is_none());
        assert!(!body.holds_lock());
        let fixed = ResponseBody::<Source, InMemoryLock>::fixed(Bytes::from_static(b"x"), None);
        assert!(fixed.watch.is_none());
    }
}
