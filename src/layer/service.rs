//! The service [`RedlockLayer`](super::RedlockLayer) wraps around an inner service.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response, header};
use tower_service::Service;

use super::extract::ExtractLockName;
use super::future::{Ctx, ResponseFuture};
use super::reject::Rejection;
use super::{BusyPolicy, Config};
use crate::client::Redlock;
use crate::error::LockError;
use crate::token::Lock;

/// Holds a quorum lock, named by the extractor, while the inner service runs. Created by
/// [`RedlockLayer`](super::RedlockLayer).
#[derive(Debug, Clone)]
pub struct RedlockService<S, E> {
    pub(crate) inner: S,
    pub(crate) redlock: Redlock,
    pub(crate) extractor: E,
    pub(crate) config: Arc<Config>,
}

impl<S, E> RedlockService<S, E> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Acquires the lock per the busy policy; on failure, hands back the name for the
/// rejection.
async fn acquire(
    redlock: Redlock,
    name: Vec<u8>,
    config: Arc<Config>,
) -> Result<Lock, (LockError, Vec<u8>)> {
    let ttl = config.ttl.unwrap_or_else(|| redlock.ttl());
    let first = redlock.try_lock_with_ttl(&name, ttl).await;
    let result = match (&first, &config.busy) {
        (Err(LockError::Busy { .. }), BusyPolicy::Wait { timeout, waiters }) => {
            // Beyond the bound on waiting requests: reject at once.
            match Arc::clone(waiters).try_acquire_owned() {
                Ok(_permit) => {
                    redlock
                        .lock_until(&name, ttl, Instant::now() + *timeout)
                        .await
                }
                Err(_) => first,
            }
        }
        _ => first,
    };
    result.map_err(|e| (e, name))
}

impl<S, E, ReqBody, ResBody> Service<Request<ReqBody>> for RedlockService<S, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    E: ExtractLockName<ReqBody>,
    ReqBody: Send + 'static,
{
    type Response = Response<super::ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let grpc = is_grpc(&req);
        let name = match self.extractor.extract(&req) {
            Ok(Some(name)) => name,
            Ok(None) => return ResponseFuture::passthrough(self.inner.call(req)),
            Err(e) => {
                return ResponseFuture::rejected(
                    Rejection::bad_request(e.message(), grpc),
                    &self.config,
                );
            }
        };
        // Keep the service that was driven to readiness; leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let acquire = Box::pin(acquire(
            self.redlock.clone(),
            name,
            Arc::clone(&self.config),
        ));
        let call = Box::new(move |token| {
            req.extensions_mut().insert(token);
            inner.call(req)
        });
        ResponseFuture::acquiring(
            acquire,
            call,
            Ctx {
                redlock: self.redlock.clone(),
                config: Arc::clone(&self.config),
                grpc,
            },
        )
    }
}
