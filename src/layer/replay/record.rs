//! Completion records for idempotent replay: what the layer keeps of a finished response
//! under its lock key, and how a later request with the same name gets it back.
//!
//! A record holds the status, the headers of [`ReplayPolicy::headers`] and the body, byte
//! for byte, whatever its size hint (a sized, a streamed or a compressed body alike), when
//! it is at most [`ReplayPolicy::max_body`] bytes. A larger body is not kept: the record
//! then says "completed, response not kept", and a retry gets the explicit
//! [`RejectionKind::ResponseNotKept`](crate::layer::RejectionKind::ResponseNotKept) answer
//! (410 / `ALREADY_EXISTS`, or the rejection hook's), never an empty success. A gRPC
//! record also holds the trailers; gRPC records always keep `content-type` and every
//! `grpc-*` header and trailer, whatever the header list. A gRPC reply is kept only when
//! it is one message, so streaming responses are not replayed. A record is stored with a
//! marker that no lock value has, so the acquire script can tell a record from a holder.
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

pub use crate::core::AfterLoss;
use crate::layer::request::fingerprint::Fingerprint;
use crate::scripts::RECORD_MARKER;

/// The header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The most header fields a record keeps in its headers, and in its trailers. A response
/// with more fields to keep is not recorded; a stored record with more is refused.
pub(crate) const MAX_RECORD_HEADERS: usize = 1_000;

/// The longest a record is kept: 100 years (a `PX` of `Duration::MAX` is refused by the
/// nodes, "invalid expire time", and no record would be stored).
const LONGEST_RETENTION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The default [`ReplayPolicy::max_body`]: 256 KiB. It covers the answers of typical JSON
/// APIs whole (an object is a few KiB; a page of 100 list items, tens to a couple of
/// hundred KiB), while bounding what one in-flight request buffers. A record costs, on
/// each node and for the retention, its body, its kept headers and about 100 bytes
/// (marker, fingerprint, status, lengths, and Redis's own per-key overhead): a 2 KiB JSON
/// answer takes about 2.2 KiB per node; a record at the limit, about 256 KiB per node.
pub const DEFAULT_REPLAY_MAX_BODY: usize = 256 * 1024;

/// Which responses the layer keeps for replay, and how much of them.
#[derive(Debug, Clone)]
#[must_use = "a `ReplayPolicy` does nothing until passed to `RedlockLayer::replay_policy`"]
pub struct ReplayPolicy {
    retention: Duration,
    max_body: usize,
    headers: Vec<HeaderName>,
    /// HTTP statuses kept besides the default rule, and never kept.
    statuses: Overrides<StatusCode>,
    /// gRPC codes kept besides the default rule, and never kept.
    grpc_codes: Overrides<u16>,
    after_loss: AfterLoss,
}

/// Statuses (or codes) a policy keeps besides its default rule, and those it never keeps.
#[derive(Debug, Clone)]
struct Overrides<T> {
    kept: Vec<T>,
    not_kept: Vec<T>,
}

impl<T: PartialEq> Overrides<T> {
    fn new() -> Self {
        Self {
            kept: Vec::new(),
            not_kept: Vec::new(),
        }
    }

    /// What the overrides say of `item`, if anything.
    fn says(&self, item: &T) -> Option<bool> {
        if self.not_kept.contains(item) {
            Some(false)
        } else if self.kept.contains(item) {
            Some(true)
        } else {
            None
        }
    }

    fn keep(&mut self, item: T, keep: bool) {
        self.kept.retain(|k| *k != item);
        self.not_kept.retain(|k| *k != item);
        if keep {
            self.kept.push(item);
        } else {
            self.not_kept.push(item);
        }
    }
}

/// The 4xx statuses not kept by default: those a forged or unauthenticated request can
/// cause (401, 403, 407: the real request with the same key must not get them; 408: an
/// inner timeout; 425 Too Early: a replayed early-data request) and those worth a retry
/// (409, 429).
const NOT_KEPT: [StatusCode; 7] = [
    StatusCode::UNAUTHORIZED,
    StatusCode::FORBIDDEN,
    StatusCode::PROXY_AUTHENTICATION_REQUIRED,
    StatusCode::REQUEST_TIMEOUT,
    StatusCode::CONFLICT,
    StatusCode::TOO_EARLY,
    StatusCode::TOO_MANY_REQUESTS,
];

impl ReplayPolicy {
    /// Keeps records for `retention`, bodies up to [`DEFAULT_REPLAY_MAX_BODY`] (256 KiB), and the
    /// headers `content-type`, `content-encoding`, `content-language`, `location`, `etag`
    /// and `last-modified`. The retention is taken between 1 ms and 100 years (an expiry
    /// the nodes accept: `Duration::ZERO` keeps records 1 ms, `Duration::MAX` 100 years).
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
            retention: retention.clamp(Duration::from_millis(1), LONGEST_RETENTION),
            max_body: DEFAULT_REPLAY_MAX_BODY,
            headers: vec![
                header::CONTENT_TYPE,
                header::CONTENT_ENCODING,
                header::CONTENT_LANGUAGE,
                header::LOCATION,
                header::ETAG,
                header::LAST_MODIFIED,
            ],
            statuses: Overrides::new(),
            grpc_codes: Overrides::new(),
            after_loss: AfterLoss::default(),
        }
    }

    /// What a key gets when no node answers with its record but nodes that granted its
    /// lock may have lost it (they lost data, later than their peers, within the
    /// retention): [`AfterLoss::Run`] by default (the handler runs, counted), or
    /// [`AfterLoss::Refuse`] (503 until they have held their data for a retention). A
    /// record found on any node is replayed either way (restored onto a quorum first).
    /// Without persistence on the nodes, a record lost with every node that held it
    /// cannot be told from no record: `Run` then runs the key again, `Refuse` refuses
    /// every new key on those nodes for up to a retention after each loss. Nodes with
    /// `appendonly yes` (`appendfsync always`) lose no record in a restart and make the
    /// choice moot.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::layer::{AfterLoss, ReplayPolicy};
    ///
    /// // Payments: never a second charge, even at the cost of refusals after a restart.
    /// let policy = ReplayPolicy::new(Duration::from_secs(24 * 3600)).after_loss(AfterLoss::Refuse);
    /// # let _ = policy;
    /// ```
    pub fn after_loss(mut self, after_loss: AfterLoss) -> Self {
        self.after_loss = after_loss;
        self
    }

    /// What a key gets when nodes that granted may have lost its record (see
    /// [`after_loss`](Self::after_loss)).
    pub(crate) fn on_loss(&self) -> AfterLoss {
        self.after_loss
    }

    /// The largest body kept, byte for byte (default [`DEFAULT_REPLAY_MAX_BODY`], 256 KiB). The
    /// layer buffers up to this much of each kept response while it streams, and the
    /// record costs its size on each node for the retention (see [`DEFAULT_REPLAY_MAX_BODY`]).
    /// A request whose response was larger is recorded as "completed, response not kept":
    /// its retries get 410 / `ALREADY_EXISTS` (or the rejection hook's answer for
    /// [`RejectionKind::ResponseNotKept`](crate::layer::RejectionKind::ResponseNotKept)),
    /// and the handler does not run again. (A response with more than 1,000 header fields
    /// to keep is not kept at all.)
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// // Small JSON answers only: a retry of a larger one gets 410 instead of the response.
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

    /// Whether a response with `status` is kept. By default: 2xx, and 4xx except those a
    /// forged or unauthenticated request can cause (401, 403, 407: kept, the real request
    /// that retries with the same key and good credentials would get them; the layer's
    /// webhook receivers check signatures in front of the lock for the same reason), an
    /// inner timeout (408), a replayed early-data request (425), and those worth a retry
    /// (409, 429). 5xx are worth a retry too. [`keep_status`](Self::keep_status) changes
    /// the rule for one status.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::StatusCode;
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// let policy = ReplayPolicy::new(Duration::from_secs(3600));
    /// assert!(policy.keeps(StatusCode::CREATED));
    /// assert!(policy.keeps(StatusCode::UNPROCESSABLE_ENTITY)); // a retry would fail the same way
    /// assert!(!policy.keeps(StatusCode::UNAUTHORIZED)); // never decides what the real caller gets
    /// assert!(!policy.keeps(StatusCode::CONFLICT)); // busy: a retry may succeed
    /// assert!(!policy.keeps(StatusCode::SERVICE_UNAVAILABLE));
    /// ```
    pub fn keeps(&self, status: StatusCode) -> bool {
        self.statuses.says(&status).unwrap_or_else(|| {
            status.is_success() || (status.is_client_error() && !NOT_KEPT.contains(&status))
        })
    }

    /// Keeps responses with `status` (`keep` true) or never keeps them (false), whatever
    /// the default rule of [`keeps`](Self::keeps) says: for example 403 where a caller's
    /// permissions never change within the retention, or 404 where a resource may appear.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::StatusCode;
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// let policy = ReplayPolicy::new(Duration::from_secs(3600))
    ///     .keep_status(StatusCode::FORBIDDEN, true)
    ///     .keep_status(StatusCode::NOT_FOUND, false);
    /// assert!(policy.keeps(StatusCode::FORBIDDEN));
    /// assert!(!policy.keeps(StatusCode::NOT_FOUND));
    /// ```
    pub fn keep_status(mut self, status: StatusCode, keep: bool) -> Self {
        self.statuses.keep(status, keep);
        self
    }

    /// Whether a gRPC reply with status `code` is kept. By default: `OK`, and the statuses
    /// a retry would only repeat (`INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`,
    /// `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED`). Not `UNAUTHENTICATED` and
    /// `PERMISSION_DENIED` (a forged or unauthenticated call must not decide what the real
    /// one gets), and not those worth a retry (`ABORTED`, the layer's own busy answer,
    /// `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `INTERNAL`, ...).
    /// [`keep_grpc_code`](Self::keep_grpc_code) changes the rule for one code.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// let policy = ReplayPolicy::new(Duration::from_secs(3600));
    /// assert!(policy.keeps_grpc(0)); // OK
    /// assert!(policy.keeps_grpc(6)); // ALREADY_EXISTS: a retry would only repeat it
    /// assert!(!policy.keeps_grpc(16)); // UNAUTHENTICATED: never decides the real call's answer
    /// assert!(!policy.keeps_grpc(14)); // UNAVAILABLE: worth a retry
    /// ```
    pub fn keeps_grpc(&self, code: u16) -> bool {
        self.grpc_codes
            .says(&code)
            .unwrap_or(matches!(code, 0 | 3 | 5 | 6 | 9 | 11 | 12))
    }

    /// Keeps gRPC replies with status `code` (`keep` true) or never keeps them (false),
    /// whatever the default rule of [`keeps_grpc`](Self::keeps_grpc) says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::layer::ReplayPolicy;
    ///
    /// // PERMISSION_DENIED (7) is final for these callers: keep it.
    /// let policy = ReplayPolicy::new(Duration::from_secs(3600)).keep_grpc_code(7, true);
    /// assert!(policy.keeps_grpc(7));
    /// ```
    pub fn keep_grpc_code(mut self, code: u16, keep: bool) -> Self {
        self.grpc_codes.keep(code, keep);
        self
    }

    /// The largest body kept.
    pub(crate) fn body_limit(&self) -> usize {
        self.max_body
    }

    /// The head of the record of a response with `status` and `headers`, for a request
    /// with `fingerprint`: marker, fingerprint, status and kept headers; `None` when the
    /// headers to keep are more than [`MAX_RECORD_HEADERS`] fields (such a response is not
    /// kept).
    pub(crate) fn encode_head(
        &self,
        fingerprint: &Fingerprint,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<Vec<u8>> {
        let mut out = RECORD_MARKER.to_vec();
        out.extend_from_slice(fingerprint);
        out.extend_from_slice(&status.as_u16().to_be_bytes());
        self.put_headers(&mut out, headers)?;
        Some(out)
    }

    /// Completes a record's head: the body (`None`: over the limit, "completed, response
    /// not kept") and the trailers, if any; `None` when the trailers to keep are more than
    /// [`MAX_RECORD_HEADERS`] fields.
    pub(crate) fn encode_tail(
        &self,
        out: &mut Vec<u8>,
        body: Option<&[u8]>,
        trailers: Option<&HeaderMap>,
    ) -> Option<()> {
        match body {
            Some(body) => {
                out.push(BODY_KEPT);
                put_bytes(out, body);
            }
            None => out.push(BODY_NOT_KEPT),
        }
        if let Some(trailers) = trailers {
            self.put_headers(out, trailers)?;
        }
        Some(())
    }

    /// The whole record (head and tail) of a response.
    #[cfg(test)]
    pub(crate) fn encode(
        &self,
        fingerprint: &Fingerprint,
        status: StatusCode,
        headers: &HeaderMap,
        body: Option<&[u8]>,
        trailers: Option<&HeaderMap>,
    ) -> Option<Vec<u8>> {
        let mut out = self.encode_head(fingerprint, status, headers)?;
        self.encode_tail(&mut out, body, trailers)?;
        Some(out)
    }

    /// Writes the kept headers of `headers`: the policy's, and those a gRPC client needs
    /// (every `grpc-*` field, and a gRPC `content-type`); `None` when they are more than
    /// [`MAX_RECORD_HEADERS`].
    fn put_headers(&self, out: &mut Vec<u8>, headers: &HeaderMap) -> Option<()> {
        let kept: Vec<_> = headers
            .iter()
            .filter(|(name, value)| self.headers.contains(name) || is_grpc_field(name, value))
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

/// Whether a header field is one a gRPC client needs: `grpc-*` (status, message,
/// details, encoding), or a gRPC `content-type`.
fn is_grpc_field(name: &HeaderName, value: &HeaderValue) -> bool {
    name.as_str().starts_with("grpc-")
        || (name == header::CONTENT_TYPE && value.as_bytes().starts_with(b"application/grpc"))
}

/// The body flag of a record whose body is kept (its length and bytes follow).
const BODY_KEPT: u8 = 1;
/// The body flag of a record whose body was not kept (over the limit; a record of an
/// older version with a body of unknown size reads the same).
const BODY_NOT_KEPT: u8 = 0;

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
    /// `None`: the request completed, its response was not kept.
    body: Option<Bytes>,
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
        [BODY_KEPT] => Some(Bytes::copy_from_slice(r.bytes()?)),
        [BODY_NOT_KEPT] => None,
        _ => return Err(Unreadable),
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
    /// The replayed response, marked with [`REPLAYED_HEADER`], and its trailers (gRPC);
    /// `None` when the response was not kept.
    pub(crate) fn into_response(self) -> Option<(Response<Bytes>, Option<HeaderMap>)> {
        let mut res = Response::new(self.body?);
        *res.status_mut() = self.status;
        *res.headers_mut() = self.headers;
        res.headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        Some((res, self.trailers))
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
