//! What the response future drives: the acquisition ([`acquire`], per the busy policy),
//! the pending call ([`Pending`]: the request and the service that answers it, called once
//! the lock is held), and what reading the start of the body found (a fingerprint, a lock
//! name in the body). The service builds them; the future never calls back into it.
//!
//! ```text
//! service --CallFn, AcquireFuture--> future (name in the head)
//!         --ReadFuture --> Read { call, fingerprint, named: Head | Lock | Pass | Reject }
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::layer::Header;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! // Each request becomes a pending call that runs once its lock is held.
//! let layer = RedlockLayer::new(redlock, Header::new("idempotency-key"));
//! # let _ = layer; Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::BoxFuture;
use http::Request;
use http::request::Parts;
use tower_service::Service;

use super::config::{BusyPolicy, Config};
use super::reject::Rejection;
use super::request::fingerprint::Fingerprint;
use crate::backend::{Acquired, Acquisition, LockBackend};
use crate::error::LockError;
use crate::quorum::later;
use crate::token::LockToken;

/// The request and the service that answers it, waiting for the lock.
pub(crate) trait PendingCall<F>: Send {
    /// Calls the service with `token` in the request's extensions.
    fn call(self: Box<Self>, token: LockToken) -> F;
    /// Gives the call up: the request's head, for the rejection hook.
    fn head(self: Box<Self>) -> http::request::Parts;
    /// Calls the service without a lock (no name in the request).
    fn pass(self: Box<Self>) -> F;
}

/// Calls the inner service once the lock is held.
pub(crate) type CallFn<F> = Box<dyn PendingCall<F>>;

/// Reads the start of the request's body (replay's body fingerprint, a lock name in the
/// body): the call, with what the reading found.
pub(crate) type ReadFuture<F> = BoxFuture<'static, Read<F>>;

/// What reading the start of a request's body found.
pub(crate) struct Read<F> {
    pub(crate) call: CallFn<F>,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) named: BodyNamed,
}

/// What the body said about the lock.
pub(crate) enum BodyNamed {
    /// Nothing: the name came from the head (its acquisition is under way).
    Head,
    /// The name in the body, being acquired.
    Lock(AcquireFuture),
    /// No name: the request passes through.
    Pass,
    /// The body cannot name a lock (too large, no key in it).
    Reject(Rejection),
}

/// Acquires the lock (or, with replay, finds the name's record); with the name.
pub(crate) type AcquireFuture = BoxFuture<'static, Result<(Acquired, Vec<u8>), Denied>>;

/// Why a request got no lock: the error, and the name for the rejection.
pub(crate) struct Denied {
    pub(crate) error: LockError,
    pub(crate) name: Vec<u8>,
}

/// Acquires the lock per the busy policy (with replay: or finds the name's record); with
/// the name.
pub(crate) async fn acquire<L: LockBackend>(
    lock: L,
    name: Vec<u8>,
    config: Arc<Config>,
) -> Result<(Acquired, Vec<u8>), Denied> {
    let ttl = config.ttl.unwrap_or_else(|| lock.default_ttl());
    let replay = config
        .replay
        .as_ref()
        .map(|policy| (policy.retention(), policy.on_loss()));
    let attempt = |until: Option<Instant>| lock.acquire(&name, ttl, Acquisition { replay, until });
    let first = attempt(None).await;
    let result = match (&first, &config.busy) {
        (Err(LockError::Busy { .. }), BusyPolicy::Wait { timeout, waiters }) => {
            // Beyond the bound on waiting requests: reject at once.
            match Arc::clone(waiters).try_acquire_owned() {
                Ok(_permit) => attempt(Some(later(crate::clock::now(), *timeout))).await,
                Err(_) => first,
            }
        }
        _ => first,
    };
    match result {
        Ok(acquired) => Ok((acquired, name)),
        Err(error) => Err(Denied { error, name }),
    }
}

/// A request waiting for its lock, with the service to call.
pub(crate) struct Pending<S, R> {
    pub(crate) inner: S,
    pub(crate) req: Request<R>,
}

impl<S, R> PendingCall<S::Future> for Pending<S, R>
where
    S: Service<Request<R>> + Send,
    R: Send,
{
    fn call(self: Box<Self>, token: LockToken) -> S::Future {
        let Pending { mut inner, mut req } = *self;
        req.extensions_mut().insert(token);
        inner.call(req)
    }

    fn head(self: Box<Self>) -> Parts {
        self.req.into_parts().0
    }

    fn pass(self: Box<Self>) -> S::Future {
        let Pending { mut inner, req } = *self;
        inner.call(req)
    }
}
