//! [`PrefixedBody`]: a request body whose start was read before the lock (for a lock name
//! in the body, for replay's fingerprint, or both at once), handed on whole: the frames
//! read first, then the rest. Shared by body keys ([`BodyKey`](crate::layer::BodyKey)) and
//! replay ([`BodyFingerprintLayer`](crate::layer::BodyFingerprintLayer)).
//!
//! ```
//! use http_body::Body as _;
//! use tower_redlock::layer::PrefixedBody;
//!
//! // What the inner service of a body-reading layer gets: a body like any other.
//! fn size(body: &PrefixedBody<String>) -> Option<u64> {
//!     body.size_hint().exact()
//! }
//! # let _ = size;
//! ```

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::Request;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::layer::request::fingerprint::{Hasher, RequestFingerprint};

/// Reads up to `limit` bytes of `req`'s body (for a gRPC call: its first message, at most
/// `limit` bytes; a streaming call's later messages may wait for the reply) and puts a
/// [`RequestFingerprint`] of the request and those bytes into its extensions, unless it
/// has one already (then nothing is read); the request with the whole body, the bytes
/// read first. The bytes are hashed as they come: what is held is the frames themselves.
pub(crate) async fn read_prefix<B>(req: Request<B>, limit: usize) -> Request<PrefixedBody<B>>
where
    B: Body + Unpin,
{
    if req.extensions().get::<RequestFingerprint>().is_some() {
        return req.map(PrefixedBody::untouched);
    }
    read_start(req, limit, limit).await
}

/// Reads the start of `req`'s body for a lock name in it (up to `read` bytes: a longer
/// body names no lock, so nothing past them is read) and for its fingerprint (at most the
/// first `hash` of those bytes; a fingerprint the request already has is kept).
pub(crate) async fn read_for_key<B>(
    req: Request<B>,
    hash: usize,
    read: usize,
) -> Request<PrefixedBody<B>>
where
    B: Body + Unpin,
{
    let given = req.extensions().get::<RequestFingerprint>().copied();
    let hash = if given.is_some() { 0 } else { hash.min(read) };
    let mut req = read_start(req, hash, read).await;
    if let Some(given) = given {
        req.extensions_mut().insert(given);
    }
    req
}

/// A gRPC call's first message prefix (a flag byte and a 4-byte length), as its bytes come.
#[derive(Default)]
struct MessagePrefix(Vec<u8>);

impl MessagePrefix {
    /// Takes the next bytes of the body: the first message's length once its prefix is in
    /// (once only).
    fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        if self.0.len() >= 5 {
            return None;
        }
        self.0.extend(bytes.iter().take(5 - self.0.len()));
        match self.0[..] {
            [_, a, b, c, d] => {
                Some(usize::try_from(u32::from_be_bytes([a, b, c, d])).unwrap_or(usize::MAX))
            }
            _ => None,
        }
    }
}

/// Reads the start of `req`'s body: up to `read` bytes (a gRPC call's first message), the
/// first `hash` of them hashed into its fingerprint.
async fn read_start<B>(req: Request<B>, hash: usize, read: usize) -> Request<PrefixedBody<B>>
where
    B: Body + Unpin,
{
    let limit = read;
    let grpc = crate::layer::Protocol::of(&req) == crate::layer::Protocol::Grpc;
    let mut hasher = Hasher::new(&req);
    let (parts, mut body) = req.into_parts();
    let mut read = PrefixedBody {
        frames: VecDeque::new(),
        error: None,
        rest: None,
    };
    let mut seen = 0usize;
    let mut prefix = grpc.then(MessagePrefix::default);
    let mut wanted = limit;
    let mut ended = false;
    while seen < wanted {
        match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            // The end, or an error (kept for the inner service).
            end @ (None | Some(Err(_))) => {
                read.error = end.and_then(Result::err);
                ended = true;
                break;
            }
            Some(Ok(frame)) => {
                let frame = frame.map_data(|mut d| d.copy_to_bytes(d.remaining()));
                if let Some(data) = frame.data_ref() {
                    let take = data.len().min(wanted - seen);
                    let counted = data.get(..take).unwrap_or_default();
                    let hashed = take.min(hash.saturating_sub(seen));
                    hasher.body(counted.get(..hashed).unwrap_or_default());
                    seen += take;
                    if let Some(message) = prefix.as_mut().and_then(|p| p.feed(counted)) {
                        wanted = limit.min(message.saturating_add(5));
                    }
                }
                read.frames.push_back(frame);
            }
        }
    }
    if !ended {
        read.rest = Some(body);
    }
    let mut req = Request::from_parts(parts, read);
    req.extensions_mut().insert(hasher.finish());
    req
}

pin_project! {
    /// A request body of which the first frames were read (for the fingerprint): they come
    /// first, then the rest of the original body.
    pub struct PrefixedBody<B: Body> {
        frames: VecDeque<Frame<Bytes>>,
        error: Option<B::Error>,
        rest: Option<B>,
    }
}

impl<B: Body> std::fmt::Debug for PrefixedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixedBody")
            .field("read_frames", &self.frames.len())
            .field("more", &self.rest.is_some())
            .finish()
    }
}

impl<B: Body> PrefixedBody<B> {
    /// `body`, none of it read.
    pub(crate) fn untouched(body: B) -> Self {
        Self {
            frames: VecDeque::new(),
            error: None,
            rest: Some(body),
        }
    }

    /// A body read to its end: its `frames`, then nothing.
    #[cfg(feature = "webhook-verify")]
    pub(crate) fn whole(frames: VecDeque<Frame<Bytes>>) -> Self {
        Self {
            frames,
            error: None,
            rest: None,
        }
    }

    /// The bytes read so far, and whether they are the whole body (it ended, without an
    /// error).
    pub(crate) fn read_bytes(&self) -> (Vec<u8>, bool) {
        let data = self.frames.iter().filter_map(Frame::data_ref);
        let mut out = Vec::with_capacity(data.clone().map(Bytes::len).sum());
        for bytes in data {
            out.extend_from_slice(bytes);
        }
        (out, self.rest.is_none() && self.error.is_none())
    }
}

impl<B> Body for PrefixedBody<B>
where
    B: Body + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(frame) = this.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(error) = this.error.take() {
            return Poll::Ready(Some(Err(error)));
        }
        match this.rest {
            Some(rest) => Pin::new(rest)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining()))))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
            && self.error.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self
            .frames
            .iter()
            .filter_map(|f| f.data_ref())
            .map(|d| d.len() as u64)
            .sum();
        let rest = self
            .rest
            .as_ref()
            .map_or(SizeHint::with_exact(0), Body::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(read));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint
    }
}
