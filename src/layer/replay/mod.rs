//! Idempotent replay, in its own room: the completion record (its format and the policy of
//! what is kept), recording a response as it streams and storing it before the lock is
//! released, and the answer a record gives (the request fingerprint it was stored for, and
//! the body-fingerprint layer, are the request room's). The lock layer's future and body
//! hand over to it when
//! [`RedlockLayer::replay`](crate::RedlockLayer::replay) is on.
//!
//! ```text
//! first request  -> lock -> handler -> 201, body streams out (copied) -> body ends
//!                -> record stored under the lock key -> release -> last frame out
//! retry          -> SET NX finds the record (a quorum agreeing) -> 201 replayed, no handler
//! other request  -> same key, other fingerprint -> 422
//! response over the limit -> "completed, not kept" -> a retry gets 410
//! ```
//!
//! ```no_run
//! # #[cfg(feature = "axum")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_redlock::layer::Header;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key").required())
//!     .fencing(false)
//!     .replay(Duration::from_secs(24 * 60 * 60));
//! # let _ = layer; Ok(()) }
//! ```

pub(crate) mod completion;
pub(crate) mod keeping;
pub(crate) mod record;
pub(crate) mod recording;

use bytes::Bytes;
use http::{HeaderMap, Response};

use crate::layer::reject::{Protocol, Rejection};
use crate::layer::request::fingerprint::Fingerprint;

/// What a request gets for the completion `record` found under its key: the stored
/// response (and trailers, for a gRPC reply) when it was recorded for the same request
/// (`fingerprint`); else 422 (the key was used for another request), 410 when the
/// response was too large to keep, or 503 when the record cannot be read. Rejections
/// name the lock (`name`).
pub(crate) fn answer(
    record: &[u8],
    fingerprint: &Fingerprint,
    protocol: Protocol,
    name: Vec<u8>,
) -> Result<(Response<Bytes>, Option<HeaderMap>), Rejection> {
    let rejection = match record::decode(record) {
        Ok(record) if record.fingerprint == *fingerprint => match record.into_response() {
            Some(response) => {
                crate::metrics::replayed();
                return Ok(response);
            }
            None => Rejection::response_not_kept(protocol),
        },
        Ok(_) => Rejection::key_reused(protocol),
        Err(error) => {
            tracing::warn!(%error, "redlock layer found a completion record it cannot read");
            Rejection::unreadable_record(protocol)
        }
    };
    Err(rejection.with_name(name))
}
