//! Rejections: the responses the layer gives instead of calling the inner service.
//!
//! | case | HTTP | gRPC (trailers-only) |
//! |---|---|---|
//! | held by someone else | 409 + `Retry-After` | `ABORTED` (10) + `grpc-retry-pushback-ms` |
//! | no quorum, validity exhausted, lock lost (abort on loss) | 503 + `Retry-After` | `UNAVAILABLE` (14) + `grpc-retry-pushback-ms` |
//! | the extractor refused the request, bad name | 400 | `INVALID_ARGUMENT` (3) |
//! | a misconfigured layer (bad TTL) | 500 | `INTERNAL` (13) |
//! | with replay: the key was used for a different request | 422 | `INVALID_ARGUMENT` (3) |
//! | with replay: the request completed, its response was too large to keep | 410 | `ALREADY_EXISTS` (6) |
//!
//! HTTP bodies are a line of text, or a problem document (RFC 9457) for clients that
//! accept `application/problem+json` (or plain JSON for `application/json`), whose `type`
//! links to the section of [`problems`](super::problems) that says what it means and what
//! the client should do. With
//! [`replay`](crate::RedlockLayer::replay) on, the layer is an idempotency layer and its
//! default is the problem document, as the IETF Idempotency-Key draft answers: clients
//! that state no preference (no `Accept`, `*/*`) get one, clients that ask for
//! `text/plain` still get text.
//!
//! gRPC requests are recognised by `content-type: application/grpc*` and answered with
//! HTTP 200 and `grpc-status` / `grpc-message` headers and no body.
//!
//! Busy and unavailable answers advise when to retry: HTTP answers with `Retry-After`
//! (whole seconds), gRPC answers with `grpc-retry-pushback-ms` (the same advice in
//! milliseconds, which gRPC clients with a retry policy follow) and no `Retry-After`.
//!
//! A hook set with [`RedlockLayer::on_rejection`](crate::RedlockLayer::on_rejection) sees
//! the rejection and the request's head, and can answer as it likes.
//!
//! ```
//! use tower_redlock::layer::{Protocol, Rejection, RejectionKind};
//!
//! let r = Rejection::bad_request("the idempotency-key header is empty", Protocol::Http);
//! assert_eq!(r.kind(), &RejectionKind::BadRequest);
//! let res = r.into_response();
//! assert_eq!(res.status(), 400);
//! assert_eq!(res.body(), "the idempotency-key header is empty\n");
//! ```

use std::fmt;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

pub(crate) mod hook;
mod kind;
pub(crate) mod problem;

use super::problems::Problem;
use crate::error::LockError;
use crate::token::LostReason;
pub use kind::{Protocol, RejectionKind};
use problem::Format;

/// A rejected request: what happened, and how to answer it.
///
/// [`message`](Self::message) is meant for the remote client and names no internal
/// detail; [`lock_error`](Self::lock_error) has the details (such as each failed node and
/// its cause) for logs. The layer logs them itself: no-quorum and other service failures
/// at `warn`, busy and bad requests at `debug`.
#[derive(Debug, Clone)]
pub struct Rejection {
    kind: RejectionKind,
    message: String,
    protocol: Protocol,
    /// Boxed: a hook's `Result<_, Rejection>` stays small.
    error: Option<Box<LockError>>,
    name: Option<Vec<u8>>,
    /// The longest `Retry-After` the layer advises.
    retry_cap: Duration,
    /// The format of the default HTTP body.
    format: Format,
    /// The problem type of the default problem document.
    problem: Problem,
}

/// The default cap on `Retry-After` (see [`RedlockLayer::retry_after_cap`](crate::RedlockLayer::retry_after_cap)).
pub const DEFAULT_RETRY_AFTER_CAP: Duration = Duration::from_secs(1);

/// The cap on the `Retry-After` of a 503 during the restart quarantine
/// ([`problems::QUARANTINE`](super::problems::QUARANTINE)), when the layer's
/// [`retry_after_cap`](crate::RedlockLayer::retry_after_cap) is lower: the nodes come back
/// at a known time, and a client that retries every second into a 10 s quarantine only
/// gets the same answer. The advice is the quarantine's real remaining time up to this.
pub const QUARANTINE_RETRY_AFTER_CAP: Duration = Duration::from_secs(30);

impl Rejection {
    /// A rejection for a lock error.
    pub fn from_lock_error(error: LockError, protocol: Protocol) -> Self {
        let (kind, problem, message) = match &error {
            LockError::Busy { retry_after, .. } => (
                RejectionKind::Busy {
                    retry_after: *retry_after,
                },
                Problem::Busy,
                "the resource is locked by another request; retry later".to_owned(),
            ),
            LockError::InvalidName { reason } => (
                RejectionKind::BadRequest,
                Problem::BadRequest,
                format!("invalid lock name: {reason}"),
            ),
            LockError::Config(_) => (
                RejectionKind::Internal,
                Problem::Internal,
                "the lock layer is misconfigured".to_owned(),
            ),
            LockError::Unverifiable { .. } => (
                RejectionKind::Unavailable,
                Problem::ReplayUnverifiable,
                "the lock service cannot tell whether a request with this key already ran: \
                 some of its nodes restarted recently and may have lost stored responses; \
                 retry after the advised time"
                    .to_owned(),
            ),
            e if only_quarantined(e) => (
                RejectionKind::Unavailable,
                Problem::Quarantine,
                "the lock service is starting up: its nodes restarted recently and wait for \
                 their old locks to expire; retry after the advised time"
                    .to_owned(),
            ),
            _ => (
                RejectionKind::Unavailable,
                Problem::Unavailable,
                "the lock service is unavailable; retry later".to_owned(),
            ),
        };
        Self::new(kind, message, protocol, Some(Box::new(error))).with_problem(problem)
    }

    /// A rejection with the defaults: no lock name, the default `Retry-After` cap, text,
    /// the problem type of `kind`.
    fn new(
        kind: RejectionKind,
        message: String,
        protocol: Protocol,
        error: Option<Box<LockError>>,
    ) -> Self {
        let problem = match kind {
            RejectionKind::Busy { .. } => Problem::Busy,
            RejectionKind::Unavailable => Problem::Unavailable,
            RejectionKind::BadRequest => Problem::BadRequest,
            RejectionKind::Internal => Problem::Internal,
            RejectionKind::KeyReused => Problem::KeyReused,
            RejectionKind::ResponseNotKept => Problem::ResponseNotKept,
            RejectionKind::BodyTooLarge => Problem::BodyTooLarge,
            RejectionKind::Unauthenticated => Problem::Unauthenticated,
        };
        Self {
            kind,
            message,
            protocol,
            error,
            name: None,
            retry_cap: DEFAULT_RETRY_AFTER_CAP,
            format: Format::Text,
            problem,
        }
    }

    /// The same rejection, of problem type `problem` (a finer type than its kind's).
    fn with_problem(mut self, problem: Problem) -> Self {
        self.problem = problem;
        self
    }

    /// The same rejection, advising a `Retry-After` of at most `cap`.
    pub(crate) fn with_retry_cap(mut self, cap: Duration) -> Self {
        self.retry_cap = cap;
        self
    }

    /// The same rejection, answered in the format the request's `Accept` headers rate
    /// best: a problem document (RFC 9457) for `application/problem+json`, the same
    /// document as `application/json`, or text (the default, also for `*/*`). The layer
    /// does this before it calls the rejection hook; with
    /// [`replay`](crate::RedlockLayer::replay) on, its default is the problem document.
    #[must_use = "`negotiate` returns the rejection in the format the request accepts"]
    pub fn negotiate(self, request_headers: &HeaderMap) -> Self {
        self.negotiate_or(request_headers, Format::Text)
    }

    /// [`negotiate`](Self::negotiate), with `default` for a client that states no
    /// preference (see [`problem`](problem)).
    pub(crate) fn negotiate_or(mut self, request_headers: &HeaderMap, default: Format) -> Self {
        self.format = Format::negotiate(request_headers, default);
        self
    }

    /// The same rejection, told to a webhook sender: a busy or reused key is a delivery
    /// id (the kind, status and problem type stay).
    pub(crate) fn of_a_delivery(mut self) -> Self {
        let message = match self.kind {
            RejectionKind::Busy { .. } => {
                "a delivery with this delivery id is being processed; redeliver later"
            }
            RejectionKind::KeyReused => {
                "this delivery id was already used for a different delivery (another body, \
                 path or sender); a redelivery must be the original delivery"
            }
            _ => return self,
        };
        message.clone_into(&mut self.message);
        self
    }

    /// The same rejection, naming the lock it is about.
    pub(crate) fn with_name(mut self, name: Vec<u8>) -> Self {
        self.name = Some(name);
        self
    }

    /// The lock name, when the extractor gave one: the layer's namespace, a space, and the
    /// extractor's name (see [`RedlockLayer::namespace`](crate::RedlockLayer::namespace)).
    pub fn lock_name(&self) -> Option<&[u8]> {
        self.name.as_deref()
    }

    /// A rejection for a request whose lock was lost while its handler ran (abort on loss).
    pub fn lost(reason: &LostReason, protocol: Protocol) -> Self {
        let error = match reason {
            LostReason::ExtendFailed(e) => Some(Box::new(e.clone())),
            _ => None,
        };
        let message = match reason {
            LostReason::MaxHoldReached => "the request ran past the longest a lock may be held",
            LostReason::Expired => "the request ran past its lock's validity; retry later",
            _ => "the lock was lost while the request ran; retry later",
        };
        Self::new(
            RejectionKind::Unavailable,
            message.to_owned(),
            protocol,
            error,
        )
        .with_problem(Problem::Lost)
    }

    /// A rejection for an idempotency key already used for a different request (replay):
    /// 422 / `INVALID_ARGUMENT`.
    pub fn key_reused(protocol: Protocol) -> Self {
        Self::new(
            RejectionKind::KeyReused,
            "the key this request carries was already used for a different request; a new \
             request needs a new key"
                .to_owned(),
            protocol,
            None,
        )
    }

    /// A rejection for a request whose key's request completed with a response too large
    /// to keep (replay): 410 / `ALREADY_EXISTS`. It cannot be mistaken for the original
    /// response: the handler ran once, and its answer is gone.
    pub fn response_not_kept(protocol: Protocol) -> Self {
        Self::new(
            RejectionKind::ResponseNotKept,
            "the request with this key was completed, but its response was too large to keep \
             for replay"
                .to_owned(),
            protocol,
            None,
        )
    }

    /// A rejection for a request whose body is over the `limit` bytes its extractor reads
    /// for the lock name ([`BodyKey`](super::BodyKey)): 413 / `RESOURCE_EXHAUSTED`.
    pub fn body_too_large(limit: usize, protocol: Protocol) -> Self {
        Self::new(
            RejectionKind::BodyTooLarge,
            format!("the request body is over the {limit} bytes read for its lock name"),
            protocol,
            None,
        )
    }

    /// A rejection for a webhook delivery whose body is over the `limit` bytes its
    /// `webhook::Signature` (feature `webhook-verify`) layer reads to verify it: 413 /
    /// `RESOURCE_EXHAUSTED`.
    pub fn too_large_to_verify(limit: usize, protocol: Protocol) -> Self {
        Self::new(
            RejectionKind::BodyTooLarge,
            format!("the request body is over the {limit} bytes read to verify its signature"),
            protocol,
            None,
        )
    }

    /// A rejection for a webhook delivery whose signature does not verify (`why`: what
    /// is wrong, naming no secret): 401 / `UNAUTHENTICATED`, before any lock is taken.
    pub fn unauthenticated(why: impl std::fmt::Display, protocol: Protocol) -> Self {
        Self::new(
            RejectionKind::Unauthenticated,
            format!("the delivery's signature does not verify: {why}"),
            protocol,
            None,
        )
    }

    /// A rejection for a request that ran, whose response has no body to cut short and
    /// whose record reached too few nodes (replay): 503 / `UNAVAILABLE`, so the client
    /// retries rather than take an answer a retry would not replay.
    pub(crate) fn not_recorded(protocol: Protocol) -> Self {
        Self::new(
            RejectionKind::Unavailable,
            "the request ran, but its response could not be stored for replay; retry with the \
             same key"
                .to_owned(),
            protocol,
            None,
        )
        .with_problem(Problem::NotRecorded)
    }

    /// A rejection for a request whose name has a completion record that cannot be read
    /// (replay): 503 / `UNAVAILABLE`, until the record expires or is removed.
    pub(crate) fn unreadable_record(protocol: Protocol) -> Self {
        Self::new(
            RejectionKind::Unavailable,
            "the stored response for this request cannot be read".to_owned(),
            protocol,
            None,
        )
        .with_problem(Problem::RecordUnreadable)
    }

    /// A rejection for a layer that cannot serve the request as it was built: 500 /
    /// `INTERNAL`.
    pub(crate) fn misconfigured(message: &str, protocol: Protocol) -> Self {
        Self::new(RejectionKind::Internal, message.to_owned(), protocol, None)
    }

    /// A rejection for bad input (an extractor's refusal).
    pub fn bad_request(message: impl Into<String>, protocol: Protocol) -> Self {
        Self::new(RejectionKind::BadRequest, message.into(), protocol, None)
    }

    /// Why.
    pub fn kind(&self) -> &RejectionKind {
        &self.kind
    }

    /// The `type` URI of the default problem document: one of the constants of
    /// [`problems`](super::problems), a link to what the rejection means and what a client
    /// should do. Finer than [`kind`](Self::kind): a lock lost while the handler ran
    /// ([`problems::LOST`](super::problems::LOST)) and a stored response that cannot be read
    /// ([`problems::RECORD_UNREADABLE`](super::problems::RECORD_UNREADABLE)) are of kind
    /// [`Unavailable`](RejectionKind::Unavailable).
    ///
    /// ```
    /// use tower_redlock::layer::{Protocol, Rejection, problems};
    ///
    /// let r = Rejection::key_reused(Protocol::Http);
    /// assert_eq!(r.problem_type(), problems::KEY_REUSED);
    /// ```
    pub fn problem_type(&self) -> &'static str {
        self.problem.uri()
    }

    /// A message for the client.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the request was plain HTTP or a gRPC call.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The lock error behind the rejection, if there was one (with per-node causes for
    /// no quorum).
    pub fn lock_error(&self) -> Option<&LockError> {
        self.error.as_deref()
    }

    /// The HTTP status of the default response.
    pub fn http_status(&self) -> StatusCode {
        self.kind.http_status()
    }

    /// The gRPC status code of the default response.
    pub fn grpc_code(&self) -> u8 {
        self.kind.grpc_code()
    }

    /// `Retry-After` in whole seconds, rounded up, at least 1, for busy and unavailable
    /// rejections: the holder's remaining TTL (busy), or the time until the nodes kept
    /// out by the restart quarantine return, capped by the layer's
    /// [`retry_after_cap`](crate::RedlockLayer::retry_after_cap) (1 s by default: a holder
    /// usually releases long before its TTL runs out). When the quarantine alone left no
    /// quorum ([`problems::QUARANTINE`](super::problems::QUARANTINE)), the cap is at least
    /// [`QUARANTINE_RETRY_AFTER_CAP`] (30 s): the quarantine's real remaining time goes
    /// through; the same for a replayed key that too few nodes can answer for
    /// ([`problems::REPLAY_UNVERIFIABLE`](super::problems::REPLAY_UNVERIFIABLE)). Another
    /// unavailable rejection advises the cap.
    pub fn retry_after_secs(&self) -> Option<u64> {
        let after = self.retry_advice()?;
        Some(
            u64::try_from(after.as_millis().div_ceil(1000))
                .unwrap_or(u64::MAX)
                .max(1),
        )
    }

    /// The same advice as [`retry_after_secs`](Self::retry_after_secs) in milliseconds,
    /// not rounded to seconds (at least 1): the `grpc-retry-pushback-ms` of gRPC answers.
    fn retry_pushback_ms(&self) -> Option<u64> {
        let after = self.retry_advice()?;
        Some(u64::try_from(after.as_millis()).unwrap_or(u64::MAX).max(1))
    }

    /// How long to wait before a retry, for busy and unavailable rejections: the hint
    /// (holder's TTL, end of the quarantine), or the cap without one, at most the cap.
    fn retry_advice(&self) -> Option<Duration> {
        let hint = match self.kind {
            RejectionKind::Busy { retry_after } => retry_after,
            RejectionKind::Unavailable => match self.error.as_deref() {
                Some(LockError::Unverifiable { retry_after, .. }) => *retry_after,
                error => error.and_then(quarantine_ends),
            },
            _ => return None,
        };
        let cap = match self.problem {
            Problem::Quarantine | Problem::ReplayUnverifiable => {
                self.retry_cap.max(QUARANTINE_RETRY_AFTER_CAP)
            }
            _ => self.retry_cap,
        };
        Some(hint.map_or(self.retry_cap, |d| d.min(cap)))
    }

    /// The default response: the status of [`http_status`](Self::http_status) with a
    /// text or JSON body (see [`negotiate`](Self::negotiate)) and `Retry-After` when
    /// [`retry_after_secs`](Self::retry_after_secs) advises one; or for gRPC a
    /// trailers-only answer with [`grpc_code`](Self::grpc_code) and the message, and
    /// instead of `Retry-After` (which gRPC clients do not read) the same advice in
    /// `grpc-retry-pushback-ms`, which gRPC clients with a retry policy follow.
    ///
    /// ```
    /// use http::{Request, header};
    /// use tower_redlock::LockError;
    /// use tower_redlock::layer::{Protocol, Rejection};
    /// # use std::time::Duration;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let req = Request::post("/demo.Payments/Charge")
    ///     .header(header::CONTENT_TYPE, "application/grpc")
    ///     .body(())?;
    /// # let busy = LockError::Busy { held_elsewhere: 2, nodes: 3, retry_after: Some(Duration::from_millis(250)), attempts: 1 };
    /// // `busy`: the holder's lock expires in 250 ms.
    /// let res = Rejection::from_lock_error(busy.clone(), Protocol::of(&req)).into_response();
    /// assert_eq!(res.headers()["grpc-status"], "10"); // ABORTED
    /// assert_eq!(res.headers()["grpc-retry-pushback-ms"], "250");
    /// assert!(res.headers().get(header::RETRY_AFTER).is_none());
    ///
    /// let res = Rejection::from_lock_error(busy, Protocol::Http).into_response();
    /// assert_eq!(res.status(), 409);
    /// assert_eq!(res.headers()[header::RETRY_AFTER], "1"); // whole seconds, rounded up
    /// # Ok(()) }
    /// ```
    pub fn into_response(self) -> Response<String> {
        if self.protocol == Protocol::Grpc {
            let mut res = Response::new(String::new());
            let h = res.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert(
                "grpc-status",
                HeaderValue::from(u16::from(self.grpc_code())),
            );
            if let Ok(v) = HeaderValue::from_str(&percent_encode(&self.message)) {
                h.insert("grpc-message", v);
            }
            if let Some(ms) = self.retry_pushback_ms() {
                h.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
            }
            return res;
        }
        let retry_after = self.retry_after_secs();
        let status = self.http_status();
        let body = match self.format {
            Format::Text => format!("{}\n", self.message),
            Format::Problem | Format::Json => problem::document(
                self.problem,
                status,
                self.kind.as_str(),
                &self.message,
                retry_after,
            ),
        };
        let mut res = Response::new(body);
        *res.status_mut() = status;
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(self.format.content_type()),
        );
        if let Some(secs) = retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// When the nodes of a no-quorum error that are in the restart quarantine return (the
/// first of them), if any is.
fn quarantine_ends(error: &LockError) -> Option<Duration> {
    quarantine_left(error).min()
}

/// Whether the restart quarantine alone left a no-quorum error without its quorum: every
/// node that failed is quarantined.
fn only_quarantined(error: &LockError) -> bool {
    matches!(error, LockError::NoQuorum { failures, .. }
        if !failures.is_empty() && quarantine_left(error).count() == failures.len())
}

/// The remaining quarantine of each quarantined node of a no-quorum error.
fn quarantine_left(error: &LockError) -> impl Iterator<Item = Duration> + '_ {
    let failures = match error {
        LockError::NoQuorum { failures, .. } => failures.as_slice(),
        _ => &[],
    };
    failures.iter().filter_map(|f| match f.error {
        crate::error::NodeError::Quarantined { remaining, .. } => Some(remaining),
        _ => None,
    })
}

/// Percent-encodes a `grpc-message` (bytes outside printable ASCII, and `%`).
fn percent_encode(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
    out
}

#[cfg(test)]
mod tests;
