//! A gRPC reply that streams through its recorder: the frames pass on as they come; at
//! the end, when the reply is kept, its trailers wait until its record is stored, and the
//! lock is held until then.
//!
//! ```text
//! data, data, ... -> (recorder copies them) -> trailers -> store the record -> trailers out
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

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::completion::{Finishing, GrpcRecorder};

pin_project! {
    /// A gRPC reply being recorded.
    pub(crate) struct RecordingBody<B> {
        #[pin]
        body: B,
        // Boxed: most responses never need it.
        rec: Box<Recording>,
    }
}

/// Where the recording is.
struct Recording {
    recorder: Option<GrpcRecorder>,
    /// The record being stored (the reply is kept), with the lock.
    finishing: Option<Finishing>,
    /// The trailers, held until the record is stored.
    trailers: Option<HeaderMap>,
    finished: bool,
}

impl<B> RecordingBody<B> {
    /// `body`, recorded by `recorder`.
    pub(crate) fn new(body: B, recorder: GrpcRecorder) -> Self {
        Self {
            body,
            rec: Box::new(Recording {
                recorder: Some(recorder),
                finishing: None,
                trailers: None,
                finished: false,
            }),
        }
    }

    /// Whether the lock is still held (the stream has not ended, or its record is being
    /// stored).
    pub(crate) fn holds_lock(&self) -> bool {
        !self.rec.finished
    }
}

impl Recording {
    /// The record is being stored: the trailers, once it is.
    fn poll_stored<D, E>(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<D>, E>>> {
        if let Some(f) = self.finishing.as_mut() {
            ready!(f.work.as_mut().poll(cx));
        }
        if let Some(mut f) = self.finishing.take() {
            f.guard.disarm();
        }
        self.finished = true;
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    /// The stream ended (with `trailers`, if any): the record is stored if the reply is
    /// kept, and the trailers wait for it.
    fn end<D, E>(
        &mut self,
        trailers: Option<HeaderMap>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<D>, E>>> {
        self.trailers = trailers;
        self.finishing = self
            .recorder
            .take()
            .and_then(|r| r.finish(self.trailers.as_ref()));
        // Polled now, so that the work is registered with the waker.
        self.poll_stored(cx)
    }
}

impl<B: Body> Body for RecordingBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let rec = &mut **this.rec;
        if rec.finished {
            return Poll::Ready(None);
        }
        if rec.finishing.is_some() {
            return rec.poll_stored(cx);
        }
        match ready!(this.body.poll_frame(cx)) {
            Some(Ok(frame)) => match frame.into_trailers() {
                Ok(trailers) => rec.end(Some(trailers), cx),
                Err(frame) => {
                    if let (Some(r), Some(data)) = (rec.recorder.as_mut(), frame.data_ref()) {
                        r.data(data);
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
            },
            None => rec.end(None, cx),
            Some(Err(e)) => {
                // No record; dropping the recorder releases in the background.
                rec.recorder.take();
                Poll::Ready(Some(Err(e)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rec.finished
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
