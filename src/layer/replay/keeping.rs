//! A response the replay policy keeps, handed to the replay room: its body records it as
//! it streams, or, with no body to send, its record is stored before it goes out.
//!
//! ```text
//! kept response --headers fit a record?--no--> not kept (the guard back: released as usual)
//!               --no body to send (204, 304, HEAD, empty)--> record stored, then the response
//!               --otherwise--> a recording body: the record is stored before its last frame
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_redlock::layer::Header;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key").required())
//!     .replay(Duration::from_secs(3600)); // 2xx and most 4xx responses are kept
//! # let _ = layer; Ok(()) }
//! ```

use http::Response;
use http_body::Body;

use super::completion::{Finishing, Keep, Recorder};
use crate::backend::LockBackend;
use crate::guard::LockGuard;
use crate::layer::body::ResponseBody;
use crate::layer::reject::Protocol;

/// How a response to keep is recorded.
pub(crate) enum Recording<B, L: LockBackend> {
    /// Its body records it as it streams.
    Streams(Response<ResponseBody<B, L>>),
    /// It has no body to send (empty, a 204 or 304, an answer to `HEAD`): its record is
    /// stored before it goes out (a server may drop such a body without polling it).
    Storing(Finishing, Response<ResponseBody<B, L>>),
    /// It cannot be recorded (too many headers to keep): the response and the guard back.
    NotKept(Response<B>, LockGuard<L>),
}

/// A response to keep, recorded.
pub(crate) fn recording<B: Body, L: LockBackend>(
    res: Response<B>,
    guard: LockGuard<L>,
    keep: Keep<L>,
    head_request: bool,
) -> Recording<B, L> {
    let (parts, body) = res.into_parts();
    // An HTTP body's size marks its last frame (for an HTTP/1 client it ends the
    // response): its exact size hint, or else the `Content-Length` its handler set (a
    // streamed body's, which a server writes, then stops polling the body); a gRPC reply
    // always ends with its trailers.
    let size = (keep.protocol == Protocol::Http)
        .then(|| {
            body.size_hint()
                .exact()
                .or_else(|| content_length(&parts.headers))
        })
        .flatten();
    // An HTTP body that says it has no bytes: a server sends `content-length: 0` and may
    // drop it unpolled. (A gRPC reply's trailers come in its body: it is polled.)
    let empty = size == Some(0);
    let bodiless = head_request
        || empty
        || body.is_end_stream()
        || matches!(
            parts.status,
            http::StatusCode::NO_CONTENT | http::StatusCode::NOT_MODIFIED
        );
    match Recorder::new(&parts, size.or(body.size_hint().exact()), guard, keep) {
        Ok(recorder) if bodiless => Recording::Storing(
            recorder.finish(None),
            Response::from_parts(parts, ResponseBody::inner(body, None)),
        ),
        Ok(recorder) => Recording::Streams(Response::from_parts(
            parts,
            ResponseBody::recording(body, recorder, size),
        )),
        Err(guard) => Recording::NotKept(Response::from_parts(parts, body), guard),
    }
}

/// The one `Content-Length` of `headers`, if it is one number (several, or a value that is
/// not one, tells nothing).
fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::content_length;

    #[test]
    fn a_content_length_is_one_number() {
        let headers = |values: &[&str]| {
            let mut h = http::HeaderMap::new();
            for v in values {
                h.append(http::header::CONTENT_LENGTH, v.parse().expect("a value"));
            }
            h
        };
        assert_eq!(content_length(&headers(&["12"])), Some(12));
        assert_eq!(content_length(&headers(&[" 0 "])), Some(0));
        assert_eq!(content_length(&headers(&[])), None);
        assert_eq!(content_length(&headers(&["12", "12"])), None);
        assert_eq!(content_length(&headers(&["-1"])), None);
        assert_eq!(content_length(&headers(&["ten"])), None);
    }
}
