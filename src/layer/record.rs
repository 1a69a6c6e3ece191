//! Completion records for idempotent replay: what the layer keeps of a finished response
//! under its lock key, and how a later request with the same name gets it back.
//!
//! A record holds the status, the headers of [`ReplayPolicy::headers`] and the body, when
//! the response says its body is at most [`ReplayPolicy::max_body`] bytes (a body of
//! unknown or larger size keeps status and headers only). It is stored with a marker that no
//! lock value has, so the acquire script can tell a record from a holder.
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
use http::{HeaderValue, Response, StatusCode};

use crate::scripts::RECORD_MARKER;

/// The header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

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
    /// unknown size (streamed), is kept with status and headers only.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The response headers kept (replacing the default set).
    pub fn headers(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.headers = headers.into_iter().collect();
        self
    }

    /// How long a record is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Whether a response with `status` is kept: 2xx, and 4xx except 409 and 429 (those
    /// and 5xx are worth a retry, so the next request runs the handler again).
    pub fn keeps(&self, status: StatusCode) -> bool {
        status.is_success()
            || (status.is_client_error()
                && status != StatusCode::CONFLICT
                && status != StatusCode::TOO_MANY_REQUESTS)
    }

    /// The largest body kept.
    pub(crate) fn body_limit(&self) -> usize {
        self.max_body
    }

    /// The record of a response with `parts` and, if kept, `body`, for a request with
    /// `fingerprint`.
    pub(crate) fn encode(
        &self,
        fingerprint: &Fingerprint,
        parts: &http::response::Parts,
        body: Option<&[u8]>,
    ) -> Vec<u8> {
        let mut out = RECORD_MARKER.to_vec();
        out.extend_from_slice(fingerprint);
        out.extend_from_slice(&parts.status.as_u16().to_be_bytes());
        let kept: Vec<_> = self
            .headers
            .iter()
            .flat_map(|name| parts.headers.get_all(name).iter().map(move |v| (name, v)))
            .collect();
        put_len(&mut out, kept.len());
        for (name, value) in kept {
            put_bytes(&mut out, name.as_str().as_bytes());
            put_bytes(&mut out, value.as_bytes());
        }
        match body {
            Some(body) => {
                out.push(1);
                put_bytes(&mut out, body);
            }
            None => out.push(0),
        }
        out
    }
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// What identifies a request beyond its lock name: the SHA-256 of its method, path and
/// query. The same idempotency key sent with a different request is refused with 422.
pub(crate) type Fingerprint = [u8; 32];

/// The fingerprint of `request`.
pub(crate) fn fingerprint<B>(request: &http::Request<B>) -> Fingerprint {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(request.method().as_str().as_bytes());
    h.update(b" ");
    h.update(
        request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .as_bytes(),
    );
    h.finalize().into()
}

/// A stored response, decoded.
#[derive(Debug)]
pub(crate) struct Record {
    /// The fingerprint of the request that produced it.
    pub(crate) fingerprint: Fingerprint,
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
}

/// Reads a record; `None` if it is not one this version wrote.
pub(crate) fn decode(record: &[u8]) -> Option<Record> {
    let mut r = Reader(record.strip_prefix(RECORD_MARKER)?);
    let fingerprint = r.take(32)?.try_into().ok()?;
    let status = StatusCode::from_u16(u16::from_be_bytes(r.take(2)?.try_into().ok()?)).ok()?;
    let count = r.len()?;
    let mut headers = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let name = HeaderName::from_bytes(r.bytes()?).ok()?;
        let value = HeaderValue::from_bytes(r.bytes()?).ok()?;
        headers.push((name, value));
    }
    let body = match r.take(1)? {
        [1] => Bytes::copy_from_slice(r.bytes()?),
        _ => Bytes::new(),
    };
    Some(Record {
        fingerprint,
        status,
        headers,
        body,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn len(&mut self) -> Option<usize> {
        usize::try_from(u32::from_be_bytes(self.take(4)?.try_into().ok()?)).ok()
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.len()?;
        self.take(n)
    }
}

impl Record {
    /// The replayed response, marked with [`REPLAYED_HEADER`].
    pub(crate) fn into_response(self) -> Response<Bytes> {
        let mut res = Response::new(self.body);
        *res.status_mut() = self.status;
        for (name, value) in self.headers {
            res.headers_mut().append(name, value);
        }
        res.headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        res
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
        let encoded = policy.encode(&[7; 32], &parts, Some(b"hello"));
        assert_eq!(decode(&encoded).map(|r| r.fingerprint), Some([7; 32]));
        let res = decode(&encoded).map(Record::into_response);
        let res = res.unwrap_or_default();
        assert_eq!(res.status(), StatusCode::CREATED);
        assert_eq!(res.headers()[header::CONTENT_TYPE], "text/plain");
        assert!(res.headers().get("x-secret").is_none());
        assert_eq!(res.headers()[REPLAYED_HEADER], "true");
        assert_eq!(res.body(), &Bytes::from_static(b"hello"));
        assert!(decode(b"#record\n\x00").is_none());
        assert!(decode(b"0123abcd").is_none());
        let headers_only = policy.encode(&[7; 32], &parts, None);
        let res = decode(&headers_only)
            .map(Record::into_response)
            .unwrap_or_default();
        assert!(res.body().is_empty());
    }
}
