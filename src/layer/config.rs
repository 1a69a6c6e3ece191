//! The settings a [`RedlockLayer`](crate::RedlockLayer) hands to its services and
//! futures: TTL, busy policy, release point, extension, abort on loss, rejection hook.
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::{Redlock, RedlockLayer};
//! use tower_redlock::layer::Header;
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let layer = RedlockLayer::new(redlock, Header::new("idempotency-key").required())
//!     .ttl(Duration::from_secs(30))
//!     .wait(Duration::from_secs(2), 64)
//!     .release_on_body_end();
//! # let _ = layer;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tokio::sync::Semaphore;

use super::record::ReplayPolicy;
use super::reject::Rejection;

pub(crate) type RejectionHook = Arc<dyn Fn(Rejection) -> Response<Bytes> + Send + Sync>;

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
}

impl Config {
    pub(crate) fn respond(&self, rejection: Rejection) -> Response<Bytes> {
        match &self.on_rejection {
            Some(hook) => hook(rejection),
            None => rejection.into_response(),
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
            .finish()
    }
}
