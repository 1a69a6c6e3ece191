//! The response body of [`RedlockService`](super::RedlockService): the inner service's body,
//! or a rejection's.
//!
//! In body-end release mode ([`RedlockLayer::release_on_body_end`](super::RedlockLayer::release_on_body_end))
//! the body holds the lock until the stream ends (its last frame, an error, trailers) or
//! the body is dropped, and then releases it in the background.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

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
        Rejection {
            data: Option<Bytes>,
        },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, held: Option<LockGuard>) -> Self {
        Self {
            kind: Kind::Inner { body, held },
        }
    }

    pub(crate) fn rejection(data: Bytes) -> Self {
        Self {
            kind: Kind::Rejection {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    /// Whether this body still holds a lock (body-end release mode, stream not ended).
    pub fn holds_lock(&self) -> bool {
        matches!(&self.kind, Kind::Inner { held: Some(_), .. })
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { held, .. } => f
                .debug_struct("ResponseBody::Inner")
                .field("holds_lock", &held.is_some())
                .finish_non_exhaustive(),
            Kind::Rejection { data } => f
                .debug_struct("ResponseBody::Rejection")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
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
            KindProj::Rejection { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(B::Data::from(d)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            // While the lock is held, ask to be polled once more so the end is seen.
            Kind::Inner { body, held } => held.is_none() && body.is_end_stream(),
            Kind::Rejection { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Rejection { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
