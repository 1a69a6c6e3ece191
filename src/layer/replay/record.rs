//! Completion records for idempotent replay: what the layer keeps of a finished response
//! under its lock key, and how a later request with the same name gets it back.
//!
//! A record holds the status, the headers of [`ReplayPolicy::headers`] and the body, when
//! the response says its body is at most [`ReplayPolicy::max_body`] bytes (a body of
//! unknown or larger size keeps status and headers only). A gRPC record also holds the
//! reply message and the trailers (`grpc-status`, `grpc-message`,
//! `grpc-status-details-bin` and the selected headers); a gRPC reply is kept only when it
//! is one message within the size limit, so streaming responses are not replayed. A record
//! is stored with a marker that no lock value has, so the acquire script can tell a record
//! from a holder.
//!
//! A record holds at most [`MAX_RECORD_HEADERS`] header fields in each of its header and
//! trailer sections: a response with more is not kept, and a stored record with more (one
//! written by hand on a node) is refused when read ([`RecordError::TooManyHeaders`]), so a
//! record can never overflow a `HeaderMap`.
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::layer::ReplayPolicy;
//!
//! let policy = ReplayPolicy::new(Duration::from_secs(24 * 3600)).max_body(16 * 1024);
//! assert!(policy.keeps(http::StatusCode::CREATED));
//! assert!(!policy.keeps(http::StatusCode::CONFLICT)); // 409 and 429 are retried
//! assert!(!policy.keeps(http::StatusCode::BAD_GATEWAY)); // 5xx are retried
//! ```

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use super::fingerprint::Fingerprint;
use crate::scripts::RECORD_MARKER;

/// The header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The most header fields a record keeps in its headers, and in its trailers. A response
/// with more fields to keep is not recorded; a stored record with more is refused.
pub(crate) const MAX_RECORD_HEADERS: usize = 1_000;

/// The gRPC status headers (trailers, or headers of a trailers-only reply): always kept.
const GRPC_STATUS_HEADERS: [&str; 3] = ["grpc-status", "grpc-message", "grpc-status-details-bin"];

/// Which responses the layer keeps for replay, and how much of them.
#[derive(Debug, Clone)]
pub struct ReplayPolicy {
    retention: Duration,
    max_body: usize,
    headers: Vec<HeaderName>,
}

impl ReplayPolicy {
    /// Keeps records for `retention`, bodies up to 8 KiB, and the headers `content-type`,
    /// `content-encoding`, `content-language`, `location`, `etag` and `last-modified`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// // Clients retry with the same key for up to a day: keep the answers that long.
    /// let policy = ReplayPolicy::new(Duration::from_secs(24 * 3600));
    /// assert_eq!(policy.retention(), Duration::from_secs(86_400));
    /// ```
    pub fn new(retention: Duration) -> Self {
        Self {
            retention,
            max_body: 8 * 1024,
            headers: vec![
                header::CONTENT_TYPE,
                header::CONTENT_ENCODING,
                header::CONTENT_LANGUAGE,
                header::LOCATION,
                header::ETAG,
                header::LAST_MODIFIED,
            ],
        }
    }

    /// The largest body kept (default 8 KiB): a response whose body is larger, or of
    /// unknown size (streamed), is kept with status and headers only. (A response with
    /// more than 1,000 header fields to keep is not kept at all.)
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// // JSON answers up to 64 KiB replay whole; larger ones replay status and headers only.
    /// let policy = ReplayPolicy::new(Duration::from_secs(3600)).max_body(64 * 1024);
    /// # let _ = policy;
    /// ```
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The response headers kept (replacing the default set).
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::header::{CONTENT_TYPE, HeaderName, LOCATION};
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// // Clients read a custom header back; the list replaces the default one.
    /// let policy = ReplayPolicy::new(Duration::from_secs(3600)).headers([
    ///     CONTENT_TYPE,
    ///     LOCATION,
    ///     HeaderName::from_static("x-payment-id"),
    /// ]);
    /// # let _ = policy;
    /// ```
    pub fn headers(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.headers = headers.into_iter().collect();
        self
    }

    /// How long a record is kept.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// let policy = ReplayPolicy::new(Duration::from_secs(3600));
    /// // Tell API clients how long a key stays bound to its first answer.
    /// assert_eq!(policy.retention(), Duration::from_secs(3600));
    /// ```
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Whether a response with `status` is kept: 2xx, and 4xx except 409 and 429 (those
    /// and 5xx are worth a retry, so the next request runs the handler again).
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::StatusCode;
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// let policy = ReplayPolicy::new(Duration::from_secs(3600));
    /// assert!(policy.keeps(StatusCode::CREATED));
    /// assert!(policy.keeps(StatusCode::UNPROCESSABLE_ENTITY)); // a retry would fail the same way
    /// assert!(!policy.keeps(StatusCode::CONFLICT)); // busy: a retry may succeed
    /// assert!(!policy.keeps(StatusCode::SERVICE_UNAVAILABLE));
    /// ```
    pub fn keeps(&self, status: StatusCode) -> bool {
        status.is_success()
            || (status.is_client_error()
                && status != StatusCode::CONFLICT
                && status != StatusCode::TOO_MANY_REQUESTS)
    }

    /// Whether a gRPC reply with status `code` is kept: `OK`, and the statuses a retry
    /// would only repeat (`INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`,
    /// `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED`,
    /// `UNAUTHENTICATED`). The others (`ABORTED`, the layer's own busy answer, and
    /// `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `INTERNAL`, ...) are worth a retry.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// let policy = ReplayPolicy::new(Duration::from_secs(3600));
    /// assert!(policy.keeps_grpc(0)); // OK
    /// assert!(policy.keeps_grpc(6)); // ALREADY_EXISTS: a retry would only repeat it
    /// assert!(!policy.keeps_grpc(14)); // UNAVAILABLE: worth a retry
    /// ```
    pub fn keeps_grpc(&self, code: u16) -> bool {
        matches!(code, 0 | 3 | 5 | 6 | 7 | 9 | 11 | 12 | 16)
    }

    /// The largest body kept.
    pub(crate) fn body_limit(&self) -> usize {
        self.max_body
    }

    /// The record of a response with `status`, `headers` and, if kept, `body` and
    /// `trailers`, for a request with `fingerprint`; `None` when the headers or trailers
    /// to keep are more than [`MAX_RECORD_HEADERS`] fields (such a response is not kept).
    pub(crate) fn encode(
        &self,
        fingerprint: &Fingerprint,
        status: StatusCode,
        headers: &HeaderMap,
        body: Option<&[u8]>,
        trailers: Option<&HeaderMap>,
    ) -> Option<Vec<u8>> {
        let mut out = RECORD_MARKER.to_vec();
        out.extend_from_slice(fingerprint);
        out.extend_from_slice(&status.as_u16().to_be_bytes());
        self.put_headers(&mut out, headers)?;
        match body {
            Some(body) => {
                out.push(1);
                put_bytes(&mut out, body);
            }
            None => out.push(0),
        }
        if let Some(trailers) = trailers {
            self.put_headers(&mut out, trailers)?;
        }
        Some(out)
    }

    /// Writes the kept headers of `headers`: the policy's, and gRPC's status headers;
    /// `None` when they are more than [`MAX_RECORD_HEADERS`].
    fn put_headers(&self, out: &mut Vec<u8>, headers: &HeaderMap) -> Option<()> {
        let kept: Vec<_> = headers
            .iter()
            .filter(|(name, _)| {
                self.headers.contains(name) || GRPC_STATUS_HEADERS.contains(&name.as_str())
            })
            .collect();
        if kept.len() > MAX_RECORD_HEADERS {
            return None;
        }
        put_len(out, kept.len());
        for (name, value) in kept {
            put_bytes(out, name.as_str().as_bytes());
            put_bytes(out, value.as_bytes());
        }
        Some(())
    }
}

/// The gRPC status code in `headers` (a reply's trailers, or the headers of a
/// trailers-only reply).
pub(crate) fn grpc_status(headers: &HeaderMap) -> Option<u16> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// Whether `body` is at most one whole gRPC message (a unary reply; a stream that sent
/// more is not kept).
pub(crate) fn is_unary_grpc_body(body: &[u8]) -> bool {
    // A message: a compressed flag byte, a big-endian u32 length, the message.
    let Some((_flag, rest)) = body.split_first() else {
        return true;
    };
    let Some((len, message)) = rest.split_first_chunk::<4>() else {
        return false;
    };
    usize::try_from(u32::from_be_bytes(*len)).is_ok_and(|len| len == message.len())
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// A stored response, decoded.
#[derive(Debug)]
pub(crate) struct Record {
    /// The fingerprint of the request that produced it.
    pub(crate) fingerprint: Fingerprint,
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

/// Why a stored record could not be read (the layer answers 503 / `UNAVAILABLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordError {
    /// Not a record this version wrote (truncated, another format, an invalid header).
    Unreadable,
    /// A header or trailer section with more than [`MAX_RECORD_HEADERS`] fields.
    TooManyHeaders {
        /// The count the record gives.
        count: usize,
    },
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreadable => f.write_str("not a completion record this version can read"),
            Self::TooManyHeaders { count } => write!(
                f,
                "the record gives {count} header fields, more than the {MAX_RECORD_HEADERS} a record may hold"
            ),
        }
    }
}

/// Reads a record, or says why it cannot be read.
pub(crate) fn decode(record: &[u8]) -> Result<Record, RecordError> {
    use RecordError::Unreadable;
    let mut r = Reader(record.strip_prefix(RECORD_MARKER).ok_or(Unreadable)?);
    let fingerprint = r.take(32)?.try_into().map_err(|_| Unreadable)?;
    let status = r.take(2)?.try_into().map_err(|_| Unreadable)?;
    let status = StatusCode::from_u16(u16::from_be_bytes(status)).map_err(|_| Unreadable)?;
    let headers = r.headers()?;
    let body = match r.take(1)? {
        [1] => Bytes::copy_from_slice(r.bytes()?),
        _ => Bytes::new(),
    };
    let trailers = if r.0.is_empty() {
        None
    } else {
        Some(r.headers()?)
    };
    Ok(Record {
        fingerprint,
        status,
        headers,
        body,
        trailers,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        let (head, rest) = self.0.split_at_checked(n).ok_or(RecordError::Unreadable)?;
        self.0 = rest;
        Ok(head)
    }

    fn len(&mut self) -> Result<usize, RecordError> {
        let len = self
            .take(4)?
            .try_into()
            .map_err(|_| RecordError::Unreadable)?;
        usize::try_from(u32::from_be_bytes(len)).map_err(|_| RecordError::Unreadable)
    }

    fn bytes(&mut self) -> Result<&'a [u8], RecordError> {
        let n = self.len()?;
        self.take(n)
    }

    /// A header section: at most [`MAX_RECORD_HEADERS`] fields, refused before any is
    /// read (a `HeaderMap` panics beyond 32,768).
    fn headers(&mut self) -> Result<HeaderMap, RecordError> {
        let count = self.len()?;
        if count > MAX_RECORD_HEADERS {
            return Err(RecordError::TooManyHeaders { count });
        }
        let mut headers = HeaderMap::with_capacity(count.min(64));
        for _ in 0..count {
            let name =
                HeaderName::from_bytes(self.bytes()?).map_err(|_| RecordError::Unreadable)?;
            let value =
                HeaderValue::from_bytes(self.bytes()?).map_err(|_| RecordError::Unreadable)?;
            headers
                .try_append(name, value)
                .map_err(|_| RecordError::TooManyHeaders { count })?;
        }
        Ok(headers)
    }
}

impl Record {
    /// The replayed response, marked with [`REPLAYED_HEADER`], and its trailers (gRPC).
    pub(crate) fn into_response(self) -> (Response<Bytes>, Option<HeaderMap>) {
        let mut res = Response::new(self.body);
        *res.status_mut() = self.status;
        *res.headers_mut() = self.headers;
        res.headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        (res, self.trailers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let policy = ReplayPolicy::new(Duration::from_secs(60));
        let (mut parts, ()) = Response::new(()).into_parts();
        parts.status = StatusCode::CREATED;
        parts
            .headers
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        parts
            .headers
            .insert("x-secret", HeaderValue::from_static("not kept"));
        let encoded = policy
            .encode(&[7; 32], parts.status, &parts.headers, Some(b"hello"), None)
            .unwrap_or_default();
        assert_eq!(decode(&encoded).map(|r| r.fingerprint), Ok([7; 32]));
        let (res, trailers) = decode(&encoded)
            .map(Record::into_response)
            .unwrap_or_default();
        assert!(trailers.is_none());
        assert_eq!(res.status(), StatusCode::CREATED);
        assert_eq!(res.headers()[header::CONTENT_TYPE], "text/plain");
        assert!(res.headers().get("x-secret").is_none());
        assert_eq!(res.headers()[REPLAYED_HEADER], "true");
        assert_eq!(res.body(), &Bytes::from_static(b"hello"));
        assert_eq!(
            decode(b"#record\n\x00").err(),
            Some(RecordError::Unreadable)
        );
        assert_eq!(decode(b"0123abcd").err(), Some(RecordError::Unreadable));
        let headers_only = policy
            .encode(&[7; 32], parts.status, &parts.headers, None, None)
            .unwrap_or_default();
        let (res, _) = decode(&headers_only)
            .map(Record::into_response)
            .unwrap_or_default();
        assert!(res.body().is_empty());
    }

    #[test]
    fn grpc_records_keep_trailers_and_one_message_only() {
        let policy = ReplayPolicy::new(Duration::from_secs(60));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("x-internal", HeaderValue::from_static("not kept"));
        let message = b"\x00\x00\x00\x00\x02hi";
        let encoded = policy
            .encode(
                &[1; 32],
                StatusCode::OK,
                &HeaderMap::new(),
                Some(message),
                Some(&trailers),
            )
            .unwrap_or_default();
        let (res, kept) = decode(&encoded)
            .map(Record::into_response)
            .unwrap_or_default();
        assert_eq!(res.body().as_ref(), message);
        let kept = kept.unwrap_or_default();
        assert_eq!(grpc_status(&kept), Some(0));
        assert!(kept.get("x-internal").is_none());
        assert!(is_unary_grpc_body(message));
        assert!(is_unary_grpc_body(b""));
        assert!(!is_unary_grpc_body(
            b"\x00\x00\x00\x00\x02hi\x00\x00\x00\x00\x00"
        ));
        assert!(!is_unary_grpc_body(b"\x00\x00\x00"));
        assert!(policy.keeps_grpc(0) && policy.keeps_grpc(5));
        assert!(!policy.keeps_grpc(10) && !policy.keeps_grpc(14));
    }

    #[test]
    fn header_counts_are_capped_when_written_and_when_read() {
        let policy = ReplayPolicy::new(Duration::from_secs(60));
        let mut headers = HeaderMap::new();
        for i in 0..=MAX_RECORD_HEADERS {
            let value = HeaderValue::from(i);
            headers.append(header::LOCATION, value);
        }
        assert_eq!(
            policy.encode(&[0; 32], StatusCode::OK, &headers, None, None),
            None,
            "more fields than a record holds: not kept"
        );
        // A hand-made record with 40,000 distinct fields (a HeaderMap holds 32,768).
        let mut forged = RECORD_MARKER.to_vec();
        forged.extend_from_slice(&[0; 32]);
        forged.extend_from_slice(&201u16.to_be_bytes());
        put_len(&mut forged, 40_000);
        for i in 0..40_000 {
            put_bytes(&mut forged, format!("x-h{i}").as_bytes());
            put_bytes(&mut forged, b"v");
        }
        forged.push(0);
        assert_eq!(
            decode(&forged).err(),
            Some(RecordError::TooManyHeaders { count: 40_000 })
        );
    }
}
