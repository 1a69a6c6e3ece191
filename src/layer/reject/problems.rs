//! The problem types of the layer's default rejections: what each `type` URI of a problem
//! document (RFC 9457) means, and what a client developer should do about it.
//!
//! A client that accepts `application/problem+json` (or, with
//! [`replay`](crate::RedlockLayer::replay) on, any client that does not ask for text) gets
//! a rejection as a problem document such as:
//!
//! ```json
//! {"type":"https://docs.rs/tower-redlock/latest/tower_redlock/layer/problems/index.html#busy",
//!  "title":"The key is locked by another request","status":409,
//!  "detail":"the resource is locked by another request; retry later","kind":"busy","retry_after":1}
//! ```
//!
//! `type` is one of the URIs below (the constants of this module), each a link to its
//! section on this page; `kind` is the [`RejectionKind`](super::RejectionKind) as a string
//! (several types share a kind: `quarantine`, `replay-unverifiable`, `lost` and
//! `record-unreadable` are `unavailable`);
//! `retry_after` (seconds) is there when the answer advises a retry, as is the
//! `Retry-After` header. gRPC calls get the status code of the table, the detail as
//! `grpc-message`, and instead of `Retry-After` the same advice in milliseconds in
//! `grpc-retry-pushback-ms`. A [rejection hook](crate::RedlockLayer::on_rejection) can
//! answer otherwise; [`Rejection::problem_type`](super::Rejection::problem_type) gives it
//! the URI.
//!
//! | `type` | HTTP | gRPC | retry? |
//! |---|---|---|---|
//! | [`#busy`](#busy) | 409 | `ABORTED` (10) | yes, after `Retry-After` |
//! | [`#unavailable`](#unavailable) | 503 | `UNAVAILABLE` (14) | yes, after `Retry-After`, with backoff |
//! | [`#quarantine`](#quarantine) | 503 | `UNAVAILABLE` (14) | yes, after `Retry-After` (the quarantine's end) |
//! | [`#replay-unverifiable`](#replay-unverifiable) | 503 | `UNAVAILABLE` (14) | yes, after `Retry-After` (when enough nodes can answer) |
//! | [`#lost`](#lost) | 503 | `UNAVAILABLE` (14) | only if the operation is idempotent |
//! | [`#record-unreadable`](#record-unreadable) | 503 | `UNAVAILABLE` (14) | later; tell the operator if it lasts |
//! | [`#bad-request`](#bad-request) | 400 | `INVALID_ARGUMENT` (3) | no: fix the request |
//! | [`#internal`](#internal) | 500 | `INTERNAL` (13) | no: the service is misconfigured |
//! | [`#key-reused`](#key-reused) | 422 | `INVALID_ARGUMENT` (3) | no: a new request needs a new key |
//! | [`#response-not-kept`](#response-not-kept) | 410 | `ALREADY_EXISTS` (6) | no: the request was done |
//! | [`#body-too-large`](#body-too-large) | 413 | `RESOURCE_EXHAUSTED` (8) | no: the body must be smaller, or the limit raised |
//! | [`#unauthenticated`](#unauthenticated) | 401 | `UNAUTHENTICATED` (16) | no: fix the secret, the body or the clock, then redeliver |
//!
//! The URIs are stable: they change only with a major version of the crate, and the
//! sections keep their anchors.
//!
//! # busy
//!
//! **Another request holds the lock for this key** (`kind`: `busy`; 409, gRPC `ABORTED`).
//! A request with the same key (an idempotency key, a webhook delivery id, an order id in
//! the path) is running now: typically a duplicate sent while the first was still being
//! handled. Nothing ran for this request.
//!
//! *What to do:* retry the same request, with the same key, after `Retry-After` seconds
//! (gRPC: `grpc-retry-pushback-ms`). The advice is the holder's remaining lock time, capped
//! by the service ([`retry_after_cap`](crate::RedlockLayer::retry_after_cap), 1 s by
//! default, since holders usually finish well before their TTL). With replay on, the retry
//! after the first request finished gets the first response back instead of running again.
//!
//! # unavailable
//!
//! **The lock service is unavailable** (`kind`: `unavailable`; 503, gRPC `UNAVAILABLE`).
//! Too few of the service's Redis nodes answered to form a quorum (nodes down, slow, or
//! kept out for a while after a restart), or acquiring took so long that no lock time was
//! left. Nothing ran for this request.
//!
//! *What to do:* retry later, with backoff, after `Retry-After` (when nodes are coming back
//! from a restart, the time until they do; otherwise the service's cap, 1 s by default).
//! Retrying is safe: the handler did not run.
//!
//! # quarantine
//!
//! **The lock service is starting up** (`kind`: `unavailable`; 503, gRPC `UNAVAILABLE`).
//! Too many of the service's Redis nodes started or restarted recently: they may have lost
//! the locks they held, so they are kept out of locking until those locks would have
//! expired (the restart quarantine, at most the longest lock TTL). The service is not
//! failing; it is waiting out a known time. Nothing ran for this request.
//!
//! *What to do:* retry the same request after `Retry-After` (gRPC:
//! `grpc-retry-pushback-ms`): the time until the nodes are back, not capped at the
//! service's usual 1 s but up to
//! [`QUARANTINE_RETRY_AFTER_CAP`](super::reject::QUARANTINE_RETRY_AFTER_CAP) (30 s), or the
//! service's own [`retry_after_cap`](crate::RedlockLayer::retry_after_cap) if larger.
//! Retrying sooner gets the same answer. Retrying is safe: the handler did not run.
//!
//! # replay-unverifiable
//!
//! **The service cannot tell whether this key's request already ran** (`kind`:
//! `unavailable`; 503, gRPC `UNAVAILABLE`). With replay on, the service keeps each finished
//! key's response for its retention. Some of its Redis nodes lost their data (restarted
//! without persistence, were flushed, or took over in a failover) within that retention,
//! so they may have lost stored responses, no node has one for this key, and too few of
//! the others could answer for it. The service was set to refuse such keys
//! ([`AfterLoss::Refuse`](crate::layer::AfterLoss::Refuse)) rather than run the handler a
//! possible second time, until enough nodes have held their data for the whole retention.
//! Nothing ran for this request.
//!
//! *What to do:* retry the same request, with the same key, after `Retry-After` (the
//! time until enough nodes can answer, capped like the quarantine's: up to
//! [`QUARANTINE_RETRY_AFTER_CAP`](super::reject::QUARANTINE_RETRY_AFTER_CAP), or the
//! service's own cap if larger); the answer may last as long as the retention. For the
//! operator: persistent nodes (`appendonly yes`; `appendfsync always` loses nothing) keep
//! stored responses across restarts, and this answer does not happen.
//!
//! # lost
//!
//! **The lock was lost while the request ran** (`kind`: `unavailable`; 503, gRPC
//! `UNAVAILABLE`). Only from services that stop a handler whose lock is lost
//! ([`abort_on_loss`](crate::RedlockLayer::abort_on_loss)): the lock could not be extended
//! (the lock nodes became unreachable), or the request ran past the longest time a lock
//! may be held (the detail says so). The handler started and was stopped part-way: some
//! of its work may be done.
//!
//! *What to do:* retry only an operation that is safe to repeat (an idempotent one, or one
//! sent with the same idempotency key), after `Retry-After`. When the detail says the
//! request ran past the longest hold, the same request will likely run as long again: do
//! not retry it unchanged.
//!
//! # not-recorded
//!
//! **The request ran, but its response could not be stored for replay** (`kind`:
//! `unavailable`; 503, gRPC `UNAVAILABLE`). With replay on, a response goes out only once
//! its record is on a quorum of the service's Redis nodes, so that a retry gets it back;
//! this one's record reached too few (nodes failing at that moment), or the lock was lost
//! before it was stored. (A response with a body is cut short instead, with an error
//! before its last bytes: the client sees a failed response.) The handler ran: its work is
//! done.
//!
//! *What to do:* retry the same request with the same key, after `Retry-After`. If a node
//! kept the record, the retry gets this response (the record is restored onto the
//! others); if none did, the handler runs again, so send the same key only for an
//! operation that is safe to repeat when that happens.
//!
//! # record-unreadable
//!
//! **The stored response for this key cannot be read** (`kind`: `unavailable`; 503, gRPC
//! `UNAVAILABLE`). With replay on, a response was stored under this key, but the record
//! cannot be decoded (for example one written by an incompatible version). The handler
//! does not run for this key while the record exists: it may have run already.
//!
//! *What to do:* retry later, after `Retry-After`; the answer lasts until the record
//! expires (the service's replay retention) or the operator removes it, so report one that
//! persists to the service's operator. Do not send the operation again with a new key
//! unless you know the first one did not take effect.
//!
//! # bad-request
//!
//! **The request cannot be locked as sent** (`kind`: `bad_request`; 400, gRPC
//! `INVALID_ARGUMENT`). The service could not name a lock from the request: the key header
//! (such as `Idempotency-Key`) is missing where it is required, empty, sent twice or, with
//! replay on, not a structured-field string (`Idempotency-Key: "8e03978e-40d5"`, quotes
//! included); or the service's own extractor refused the request. The detail says which.
//! Nothing ran.
//!
//! *What to do:* do not retry as is; fix the request (exactly one key header, in the form
//! the detail names) and send it again. A detail that names the service's configuration
//! (a header name or route template it cannot use) is for its operator.
//!
//! # internal
//!
//! **The lock layer is misconfigured** (`kind`: `internal`; 500, gRPC `INTERNAL`). The
//! service's lock settings are refused by its lock client (for example a lock TTL out of
//! range). Nothing ran.
//!
//! *What to do:* nothing a client can fix; retrying does not help until the service is
//! fixed. Report it to the service's operator.
//!
//! # key-reused
//!
//! **The key was already used for another request** (`kind`: `key_reused`; 422, gRPC
//! `INVALID_ARGUMENT`). The key is the request's idempotency key, or a webhook's delivery
//! id. With replay on, a response is stored under this key for a request that differs from
//! this one: another method, path or query, another caller, or another body. Nothing ran.
//!
//! *What to do:* do not retry with this key. A new operation needs a new key; a retry of
//! the original operation must send the original request unchanged (same body, same
//! credentials).
//!
//! # response-not-kept
//!
//! **The request with this key was completed, but its response was not kept** (`kind`:
//! `response_not_kept`; 410, gRPC `ALREADY_EXISTS`). With replay on, the handler ran once
//! for this key and finished, but its response was larger than the service keeps for
//! replay ([`ReplayPolicy::max_body`](super::ReplayPolicy::max_body)), so it cannot be sent
//! again. The operation is done: this is not a failure of it.
//!
//! *What to do:* do not retry with this key (it would get this answer again until the
//! retention ends). Read the result some other way, such as the resource the operation
//! created or changed.
//!
//! # body-too-large
//!
//! **The request body is too large** (`kind`: `body_too_large`; 413, gRPC
//! `RESOURCE_EXHAUSTED`). The route takes the lock name from the body (a webhook's event
//! id, see [`BodyKey`](super::BodyKey)), or verifies a webhook's signature over the whole
//! body (`webhook::Signature`, feature `webhook-verify`), and reads at most a set number
//! of bytes for it. Nothing ran.
//!
//! *What to do:* do not retry the same body. A webhook sender that gets this needs the
//! receiver's limit raised ([`BodyKey::limit`](super::BodyKey::limit),
//! `webhook::Signature::max_body`).
//!
//! # unauthenticated
//!
//! **The delivery's signature does not verify** (`kind`: `unauthenticated`; 401, gRPC
//! `UNAUTHENTICATED`). The route receives webhooks and checks each delivery's signature
//! before anything else: the signature header is missing or malformed, no signature
//! matches the body under the endpoint's secret, or the signed timestamp is further from
//! the receiver's clock than its tolerance. Nothing ran, no lock was taken and nothing was
//! stored under the delivery's id, so the real delivery with the same id is not affected.
//!
//! *What to do:* a sender's own delivery that gets this points at a wrong secret on either
//! side, a body changed on the way (a proxy that re-encodes it), or a clock off by more
//! than the tolerance; fix that, then redeliver.

/// A problem type's URI: the section `anchor` of this page (the docs.rs address of the
/// crate's latest version).
macro_rules! uri {
    ($anchor:literal) => {
        concat!(
            "https://docs.rs/tower-redlock/latest/tower_redlock/layer/problems/index.html#",
            $anchor
        )
    };
}

/// The `type` of a busy rejection: see [busy](self#busy).
pub const BUSY: &str = uri!("busy");
/// The `type` of an unavailable lock service: see [unavailable](self#unavailable).
pub const UNAVAILABLE: &str = uri!("unavailable");
/// The `type` of an unavailable lock service whose nodes are in the restart quarantine:
/// see [quarantine](self#quarantine).
pub const QUARANTINE: &str = uri!("quarantine");
/// The `type` of a replayed key that too few nodes can answer for after restarts: see
/// [replay-unverifiable](self#replay-unverifiable).
pub const REPLAY_UNVERIFIABLE: &str = uri!("replay-unverifiable");
/// The `type` of a lock lost while the request ran: see [lost](self#lost).
pub const LOST: &str = uri!("lost");
/// The `type` of a response whose record could not be stored: see
/// [not-recorded](self#not-recorded).
pub const NOT_RECORDED: &str = uri!("not-recorded");
/// The `type` of a stored response that cannot be read: see
/// [record-unreadable](self#record-unreadable).
pub const RECORD_UNREADABLE: &str = uri!("record-unreadable");
/// The `type` of a request that cannot be locked as sent: see [bad-request](self#bad-request).
pub const BAD_REQUEST: &str = uri!("bad-request");
/// The `type` of a misconfigured layer: see [internal](self#internal).
pub const INTERNAL: &str = uri!("internal");
/// The `type` of an idempotency key used for another request: see
/// [key-reused](self#key-reused).
pub const KEY_REUSED: &str = uri!("key-reused");
/// The `type` of a completed request whose response was not kept: see
/// [response-not-kept](self#response-not-kept).
pub const RESPONSE_NOT_KEPT: &str = uri!("response-not-kept");
/// The `type` of a request body over what is read for its key: see
/// [body-too-large](self#body-too-large).
pub const BODY_TOO_LARGE: &str = uri!("body-too-large");
/// The `type` of a webhook delivery whose signature does not verify: see
/// [unauthenticated](self#unauthenticated).
pub const UNAUTHENTICATED: &str = uri!("unauthenticated");

/// The problem type of a rejection: its `type` URI and `title`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    Busy,
    Unavailable,
    Quarantine,
    ReplayUnverifiable,
    Lost,
    NotRecorded,
    RecordUnreadable,
    BadRequest,
    Internal,
    KeyReused,
    ResponseNotKept,
    BodyTooLarge,
    Unauthenticated,
}

impl Problem {
    /// Every problem type, for tests.
    #[cfg(test)]
    pub(crate) const ALL: [Problem; 13] = [
        Problem::Busy,
        Problem::Unavailable,
        Problem::Quarantine,
        Problem::ReplayUnverifiable,
        Problem::Lost,
        Problem::NotRecorded,
        Problem::RecordUnreadable,
        Problem::BadRequest,
        Problem::Internal,
        Problem::KeyReused,
        Problem::ResponseNotKept,
        Problem::BodyTooLarge,
        Problem::Unauthenticated,
    ];

    /// The `type` URI: a section of this module's documentation.
    pub(crate) fn uri(self) -> &'static str {
        match self {
            Problem::Busy => BUSY,
            Problem::Unavailable => UNAVAILABLE,
            Problem::Quarantine => QUARANTINE,
            Problem::ReplayUnverifiable => REPLAY_UNVERIFIABLE,
            Problem::Lost => LOST,
            Problem::NotRecorded => NOT_RECORDED,
            Problem::RecordUnreadable => RECORD_UNREADABLE,
            Problem::BadRequest => BAD_REQUEST,
            Problem::Internal => INTERNAL,
            Problem::KeyReused => KEY_REUSED,
            Problem::ResponseNotKept => RESPONSE_NOT_KEPT,
            Problem::BodyTooLarge => BODY_TOO_LARGE,
            Problem::Unauthenticated => UNAUTHENTICATED,
        }
    }

    /// The `title`: the same for every occurrence of the type (RFC 9457, 3.1.3).
    pub(crate) fn title(self) -> &'static str {
        match self {
            Problem::Busy => "The key is locked by another request",
            Problem::Unavailable => "The lock service is unavailable",
            Problem::Quarantine => "The lock service is starting up",
            Problem::ReplayUnverifiable => "The service cannot tell whether this key already ran",
            Problem::Lost => "The lock was lost while the request ran",
            Problem::NotRecorded => "The request ran, but its response could not be stored",
            Problem::RecordUnreadable => "The stored response cannot be read",
            Problem::BadRequest => "The request cannot be locked as sent",
            Problem::Internal => "The lock layer is misconfigured",
            Problem::KeyReused => "The key was used for another request",
            Problem::ResponseNotKept => "The response was not kept for replay",
            Problem::BodyTooLarge => "The request body is too large",
            Problem::Unauthenticated => "The delivery's signature does not verify",
        }
    }
}
