//! A kept response that streams through its [`Recorder`]: its frames pass on as they
//! come; its last frame (the last data frame of a body whose end is known, or its
//! trailers), or else the end of the stream, waits until the record is stored and the
//! lock released. So a client never sees a complete response whose record is not stored:
//! a record that reached fewer than a quorum of nodes (or a lock lost before it was
//! stored) ends the body with [`NotRecorded`] instead of its last frame. A body that
//! fails or is dropped before its end (the client went away) leaves no record; the client
//! sees the failure as a failure, since the body is passed on as it is.
//!
//! ```text
//! data, data, ... -> (copied) -> last data / trailers / end -> store the record
//!                 -> release -> on a quorum? last frame out : error (NotRecorded)
//! error, or dropped before the end -> no record, release in the background
//! ```
//!
//! ```no_run
//! # #[cfg(feature = "tonic")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_redlock::layer::Header;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! // A unary gRPC reply is recorded as it streams, its trailers held until it is stored.
//! let layer = RedlockLayer::new(redlock, Header::new("idempotency-key").required())
//!     .replay(Duration::from_secs(3600));
//! # let _ = layer; Ok(()) }
//! ```

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::completion::{Finishing, NotRecorded, Recorder};
use crate::backend::LockBackend;
use crate::layer::reject::hook::BoxError;

pin_project! {
    /// A kept response's body, being recorded.
    pub(crate) struct RecordingBody<B, L: LockBackend> {
        #[pin]
        body: B,
        // Boxed: the body stays small in the response body enum.
        rec: Box<Recording<L>>,
    }
}

/// Where the recording is.
struct Recording<L: LockBackend> {
    /// Until the body ends or fails.
    recorder: Option<Recorder<L>>,
    /// The record being stored and the lock released, once the body has ended.
    finishing: Option<Finishing>,
    /// The last frame, out once the record is stored.
    held: Option<Frame<Bytes>>,
    /// The body's size, when it gave one: its last data frame is known as it comes.
    size: Option<u64>,
    /// Bytes passed on so far.
    seen: u64,
    /// The body ended, or failed: it is not polled again.
    ended: bool,
}

impl<B, L: LockBackend> RecordingBody<B, L> {
    /// `body`, recorded by `recorder` (`size`: the body's size, when its exact size hint or
    /// its response's `Content-Length` tells, marks its last data frame, as it does for an
    /// HTTP/1 client: a server stops polling the body once it has written that many bytes).
    pub(crate) fn new(body: B, recorder: Recorder<L>, size: Option<u64>) -> Self {
        Self {
            body,
            rec: Box::new(Recording {
                recorder: Some(recorder),
                finishing: None,
                held: None,
                size,
                seen: 0,
                ended: false,
            }),
        }
    }
}

impl<B, L: LockBackend> RecordingBody<B, L> {
    /// Whether the lock is still held (the body has not ended, or its record is being
    /// stored).
    pub(crate) fn holds_lock(&self) -> bool {
        self.rec.recorder.is_some() || self.rec.finishing.is_some()
    }
}

impl<L: LockBackend> Recording<L> {
    /// The body ended, with `trailers` if any: the record is stored (or the lock only
    /// released), and `last` waits for it.
    fn end(&mut self, last: Option<Frame<Bytes>>) {
        self.ended = true;
        let trailers = last.as_ref().and_then(Frame::trailers_ref);
        self.finishing = self.recorder.take().map(|r| r.finish(trailers));
        self.held = last;
    }

    /// The body failed with `error`: no record (dropping the recorder releases the lock in
    /// the background), and the error goes on.
    fn failed(&mut self, error: BoxError) -> BoxError {
        self.ended = true;
        self.recorder = None;
        error
    }

    /// A data frame of the body, recorded: handed back to pass on, or (`None`) held as the
    /// last one (the body's end, `at_end` or as its size tells) until the record is stored.
    fn data(&mut self, data: Bytes, at_end: bool) -> Option<Bytes> {
        self.seen = self.seen.saturating_add(data.len() as u64);
        if let Some(recorder) = self.recorder.as_mut() {
            recorder.data(&data);
        }
        if at_end || self.completes_size() {
            self.end(Some(Frame::data(data)));
            return None;
        }
        Some(data)
    }

    /// Whether `data` is the body's last data frame, as far as its size tells.
    fn completes_size(&self) -> bool {
        self.size.is_some_and(|size| self.seen >= size)
    }
}

impl<B, L> Body for RecordingBody<B, L>
where
    B: Body,
    L: LockBackend,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let rec = &mut **this.rec;
        loop {
            if let Some(finishing) = rec.finishing.as_mut() {
                let recorded = ready!(finishing.poll_done(cx));
                rec.finishing = None;
                if !recorded {
                    rec.held = None;
                    return Poll::Ready(Some(Err(Box::new(NotRecorded))));
                }
            }
            if let Some(frame) = rec.held.take() {
                return Poll::Ready(Some(Ok(frame.map_data(B::Data::from))));
            }
            if rec.ended {
                return Poll::Ready(None);
            }
            let frame = match ready!(this.body.as_mut().poll_frame(cx)) {
                None => {
                    rec.end(None);
                    continue;
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(rec.failed(e.into())))),
                Some(Ok(frame)) => frame,
            };
            let frame = match frame.into_data() {
                Ok(mut data) => {
                    let data = data.copy_to_bytes(data.remaining());
                    match rec.data(data, this.body.is_end_stream()) {
                        Some(data) => Frame::data(B::Data::from(data)),
                        None => continue,
                    }
                }
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => {
                        rec.end(Some(Frame::trailers(trailers)));
                        continue;
                    }
                    Err(other) => other,
                },
            };
            return Poll::Ready(Some(Ok(frame)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rec.ended && self.rec.finishing.is_none() && self.rec.held.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.rec.ended {
            let held = self
                .rec
                .held
                .as_ref()
                .and_then(Frame::data_ref)
                .map_or(0, |d| d.len() as u64);
            return SizeHint::with_exact(held);
        }
        self.body.size_hint()
    }
}
