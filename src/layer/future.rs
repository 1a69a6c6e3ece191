//! The response future of [`RedlockService`](super::RedlockService).
//!
//! States: acquiring the lock, then calling the inner service with the [`LockToken`] in the
//! request extensions, then (in the default release mode) releasing before the response is
//! returned. Dropping the future in any state releases what it holds in the background.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::Response;
use pin_project_lite::pin_project;

use super::body::ResponseBody;
use super::reject::Rejection;
use super::{Config, ReleaseOn};
use crate::client::{Redlock, Released};
use crate::error::LockError;
use crate::guard::{LockGuard, LostReason};
use crate::token::{Lock, LockToken};

/// Calls the inner service once the lock is held.
pub(crate) type CallFn<F> = Box<dyn FnOnce(LockToken) -> F + Send>;

pin_project! {
    /// The response future of [`RedlockService`](super::RedlockService).
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
        ctx: Option<Ctx>,
    }
}

/// What a releasing future returns once the lock is released.
enum Output<B, E> {
    Inner(Result<Response<B>, E>),
    Rejection(Response<Bytes>),
}

/// What the future needs once the lock is held.
pub(crate) struct Ctx {
    pub(crate) redlock: Redlock,
    pub(crate) config: Arc<Config>,
    pub(crate) grpc: bool,
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, E> {
        Acquiring {
            acquire: BoxFuture<'static, Result<Lock, (LockError, Vec<u8>)>>,
            call: Option<CallFn<F>>,
        },
        Calling {
            #[pin]
            fut: F,
            held: Option<LockGuard>,
            lost: Option<BoxFuture<'static, LostReason>>,
        },
        Releasing {
            release: BoxFuture<'static, Released>,
            held: Option<LockGuard>,
            output: Option<Output<B, E>>,
        },
        Rejected {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(crate) fn passthrough(fut: F) -> Self {
        Self {
            state: State::Calling {
                fut,
                held: None,
                lost: None,
            },
            ctx: None,
        }
    }

    pub(crate) fn rejected(rejection: Rejection, config: &Config) -> Self {
        Self {
            state: State::Rejected {
                response: Some(config.respond(rejection)),
            },
            ctx: None,
        }
    }

    pub(crate) fn acquiring(
        acquire: BoxFuture<'static, Result<Lock, (LockError, Vec<u8>)>>,
        call: CallFn<F>,
        ctx: Ctx,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                call: Some(call),
            },
            ctx: Some(ctx),
        }
    }
}

impl<F, B, E> std::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Acquiring { .. } => "acquiring",
            State::Calling { .. } => "calling",
            State::Releasing { .. } => "releasing",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

/// Logs why a request did not get its lock: service failures (with each node's cause) at
/// `warn`, contention at `debug`. Lock names are logged, lock values never.
fn log_rejected(error: &LockError, name: &[u8]) {
    let name = String::from_utf8_lossy(name);
    match error {
        LockError::Busy { .. } | LockError::InvalidName { .. } => {
            tracing::debug!(lock = %name, %error, "redlock layer rejected a request");
        }
        _ => tracing::warn!(lock = %name, %error, "redlock layer rejected a request"),
    }
}

fn wrap<B>(res: Response<B>, held: Option<LockGuard>) -> Response<ResponseBody<B>> {
    res.map(|b| ResponseBody::inner(b, held))
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring { acquire, call } => {
                    let result = ready!(acquire.as_mut().poll(cx));
                    let Some(ctx) = this.ctx.as_ref() else {
                        unreachable!("an acquiring future always has its context")
                    };
                    match result {
                        Ok(lock) => {
                            let guard = if ctx.config.auto_extend {
                                ctx.redlock.guard(lock)
                            } else {
                                ctx.redlock.guard_without_extension(lock)
                            };
                            let held = guard;
                            let lost = ctx.config.abort_on_loss.then(|| {
                                let shared = std::sync::Arc::clone(held.shared());
                                let lost: BoxFuture<'static, LostReason> =
                                    Box::pin(async move { shared.lost().await });
                                lost
                            });
                            let Some(call) = call.take() else {
                                unreachable!("the inner service is called once")
                            };
                            let fut = call(held.token());
                            this.state.set(State::Calling {
                                fut,
                                held: Some(held),
                                lost,
                            });
                        }
                        Err((error, name)) => {
                            log_rejected(&error, &name);
                            let rejection =
                                Rejection::from_lock_error(error, ctx.grpc).with_name(name);
                            let response = ctx.config.respond(rejection);
                            this.state.set(State::Rejected {
                                response: Some(response),
                            });
                        }
                    }
                }
                StateProj::Calling { fut, held, lost } => {
                    if let Some(lost) = lost.as_mut()
                        && let Poll::Ready(reason) = lost.as_mut().poll(cx)
                    {
                        // Abort on loss: drop the inner future, answer 503 / UNAVAILABLE.
                        let Some(ctx) = this.ctx.as_ref() else {
                            unreachable!("a locked future always has its context")
                        };
                        let mut rejection = Rejection::lost(&reason, ctx.grpc);
                        if let Some(held) = held.as_ref() {
                            rejection = rejection.with_name(held.name().to_vec());
                        }
                        tracing::warn!(%reason, "redlock layer aborted a request: its lock was lost");
                        let response = ctx.config.respond(rejection);
                        let mut guard = held.take();
                        let release = guard.as_mut().map(LockGuard::release_future);
                        match release {
                            Some(release) => this.state.set(State::Releasing {
                                release,
                                held: guard,
                                output: Some(Output::Rejection(response)),
                            }),
                            None => this.state.set(State::Rejected {
                                response: Some(response),
                            }),
                        }
                        continue;
                    }
                    let output = ready!(fut.poll(cx));
                    let Some(mut guard) = held.take() else {
                        // Passed through without a lock.
                        return Poll::Ready(output.map(|res| wrap(res, None)));
                    };
                    let body_end = this
                        .ctx
                        .as_ref()
                        .is_some_and(|c| c.config.release == ReleaseOn::BodyEnd);
                    match output {
                        Ok(res) if body_end => return Poll::Ready(Ok(wrap(res, Some(guard)))),
                        output => {
                            let release = guard.release_future();
                            this.state.set(State::Releasing {
                                release,
                                held: Some(guard),
                                output: Some(Output::Inner(output)),
                            });
                        }
                    }
                }
                StateProj::Releasing {
                    release,
                    held,
                    output,
                } => {
                    ready!(release.as_mut().poll(cx));
                    if let Some(mut guard) = held.take() {
                        guard.disarm();
                    }
                    return match output.take() {
                        Some(Output::Inner(output)) => {
                            Poll::Ready(output.map(|res| wrap(res, None)))
                        }
                        Some(Output::Rejection(response)) => {
                            Poll::Ready(Ok(response.map(ResponseBody::rejection)))
                        }
                        None => unreachable!("the output is returned once"),
                    };
                }
                StateProj::Rejected { response } => {
                    let Some(response) = response.take() else {
                        unreachable!("polled after completion")
                    };
                    return Poll::Ready(Ok(response.map(ResponseBody::rejection)));
                }
            }
        }
    }
}
