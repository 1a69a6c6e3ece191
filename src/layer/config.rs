//! The settings a [`RedlockLayer`](crate::RedlockLayer) hands to its services and
//! futures: TTL, busy policy, release point, extension, abort on loss, rejection hook,
//! namespace.
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::{Redlock, RedlockLayer};
//! use tower_redlock::layer::{Header, WaitPolicy};
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let layer = RedlockLayer::new(redlock, Header::new("idempotency-key").required())
//!     .ttl(Duration::from_secs(30))
//!     .wait(WaitPolicy::up_to(Duration::from_secs(2)).max_waiters(64))
//!     .release_on_body_end();
//! # let _ = layer;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http::request::Parts;
use tokio::sync::Semaphore;

use super::extract::namespace::Namespace;
use super::reject::Rejection;
use super::reject::hook::{Answer, RejectionHook};
use super::reject::problem::Format;
use super::replay::record::ReplayPolicy;
use super::request::caller::Caller;

/// How a request whose lock is busy waits, for [`RedlockLayer::wait`](crate::RedlockLayer::wait):
/// up to a timeout, with at most so many requests of the layer waiting at once (beyond
/// that, busy requests are rejected at once).
///
/// ```
/// use std::time::Duration;
/// use tower_redlock::layer::WaitPolicy;
///
/// let policy = WaitPolicy::up_to(Duration::from_secs(5)).max_waiters(32);
/// assert_eq!(policy.timeout(), Duration::from_secs(5));
/// assert_eq!(policy.waiters(), 32);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a `WaitPolicy` does nothing until passed to `RedlockLayer::wait`"]
pub struct WaitPolicy {
    timeout: Duration,
    max_waiters: usize,
}

impl WaitPolicy {
    /// Waits up to `timeout` (`Duration::MAX`: no limit); at most 64 requests wait at once.
    pub fn up_to(timeout: Duration) -> Self {
        Self {
            timeout,
            max_waiters: 64,
        }
    }

    /// At most `max_waiters` requests of the layer wait at once (0: none waits).
    pub fn max_waiters(mut self, max_waiters: usize) -> Self {
        self.max_waiters = max_waiters;
        self
    }

    /// How long a request waits at most.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How many requests may wait at once.
    pub fn waiters(&self) -> usize {
        self.max_waiters
    }
}

/// What to do when the lock is held by another request.
#[derive(Clone)]
pub(crate) enum BusyPolicy {
    Reject,
    Wait {
        timeout: Duration,
        waiters: Arc<Semaphore>,
    },
}

/// When the lock is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleaseOn {
    Response,
    BodyEnd,
}

/// How long a response body that holds its lock may go without the server taking a frame
/// before the lock is released and the body fails (see
/// [`RedlockLayer::stall_timeout`](crate::RedlockLayer::stall_timeout)).
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) ttl: Option<Duration>,
    pub(crate) busy: BusyPolicy,
    pub(crate) release: ReleaseOn,
    pub(crate) auto_extend: bool,
    pub(crate) abort_on_loss: bool,
    pub(crate) on_rejection: Option<RejectionHook>,
    /// Idempotent replay of finished responses, when on.
    pub(crate) replay: Option<ReplayPolicy>,
    /// The longest `Retry-After` advised.
    pub(crate) retry_after_cap: Duration,
    /// What comes before each lock name the layer takes.
    pub(crate) namespace: Namespace,
    /// Where the caller comes from when no `Principal` is in a request's extensions.
    pub(crate) caller: Option<Caller>,
    /// How long a lock-holding response body may go unread before its lock is released.
    pub(crate) stall_timeout: Option<Duration>,
    /// The names are webhook delivery ids (a [`Receiver`](super::webhook)): rejections
    /// speak of deliveries, not of idempotency keys.
    pub(crate) deliveries: bool,
}

impl Config {
    /// The answer to a rejected request with head `head`: the hook's, or the default in
    /// the format the request accepts (without a preference: a problem document with
    /// replay on, as the IETF Idempotency-Key draft answers, else text). Every rejection
    /// the layer answers passes here, and is counted by kind.
    pub(crate) fn respond(&self, rejection: Rejection, head: &Parts) -> Response<Answer> {
        crate::metrics::rejected(rejection.kind().as_str());
        let default = if self.replay.is_some() {
            Format::Problem
        } else {
            Format::Text
        };
        let rejection = rejection
            .with_retry_cap(self.retry_after_cap)
            .negotiate_or(&head.headers, default);
        let rejection = if self.deliveries {
            rejection.of_a_delivery()
        } else {
            rejection
        };
        match &self.on_rejection {
            Some(hook) => hook(rejection, head),
            None => rejection
                .into_response()
                .map(|body| Answer::Data(Bytes::from(body))),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let busy = match &self.busy {
            BusyPolicy::Reject => "reject".to_owned(),
            BusyPolicy::Wait { timeout, waiters } => format!(
                "wait up to {timeout:?}, {} waiter slots free",
                waiters.available_permits()
            ),
        };
        f.debug_struct("Config")
            .field("ttl", &self.ttl)
            .field("busy", &busy)
            .field("release", &self.release)
            .field("auto_extend", &self.auto_extend)
            .field("abort_on_loss", &self.abort_on_loss)
            .field("on_rejection", &self.on_rejection.is_some())
            .field("replay", &self.replay)
            .field("retry_after_cap", &self.retry_after_cap)
            .field("namespace", &self.namespace)
            .field("caller", &self.caller)
            .field("stall_timeout", &self.stall_timeout)
            .finish()
    }
}
