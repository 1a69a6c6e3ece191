//! The response future of [`RedlockService`](super::RedlockService).
//!
//! States: acquiring the lock, then calling the inner service with the
//! [`LockToken`](crate::LockToken) in the request extensions, then (in the default release
//! mode) releasing before the response is returned. Each state holds what it needs; `poll`
//! hands each state to one small function. Dropping the future in any state releases what
//! it holds in the background. The future runs in a `redlock.layer` span (at `debug`) that
//! records the request's `outcome`: `acquired`, `replayed`, `rejected` (with the
//! `rejection` kind) or `lost` (abort on loss).
//!
//! ```text
//! (replay, by default: Reading the start of the request body, for its fingerprint -->)
//! Acquiring --lock--> Calling --response--> Releasing --> response
//!     |                  |  \--kept for replay--> response whose body records it
//!     |                  |       (the replay room; the lock is held until the record is stored)
//!     |                  |  \--lost (abort on loss)--> Releasing --> 503
//!     |--record--> Replayed (the replay room's answer) --> stored response / 422 / 410
//!     \--error--> Rejected --> 409 / 503 / 400
//! Passthrough (no lock name) --> response
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use super::acquire::{AcquireFuture, BodyNamed, CallFn, Denied, Read, ReadFuture};
use super::body::ResponseBody;
use super::config::{Config, ReleaseOn};
use super::reject::hook::Answer;
use super::reject::{Protocol, Rejection};
use super::replay::completion::{Finishing, Keep};
use super::replay::keeping::{self, Recording};
use super::replay::{self};
use super::request::fingerprint::Fingerprint;
use crate::backend::{Acquired, LockBackend, Redlock, Released};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::token::LostReason;

pin_project! {
    /// The response future of [`RedlockService`](super::RedlockService).
    pub struct ResponseFuture<F, B, E, L: LockBackend = Redlock> {
        #[pin]
        state: State<F, B, E, L>,
        // The request's `redlock.layer` span (none for requests passed through).
        span: tracing::Span,
    }
}

/// What the future needs once the lock is held.
pub(crate) struct Ctx<L> {
    pub(crate) lock: L,
    pub(crate) config: Arc<Config>,
    pub(crate) protocol: Protocol,
    /// The request's fingerprint, with replay on.
    pub(crate) fingerprint: Fingerprint,
    /// A copy of the request's head, kept for the rejection when the lock may be lost
    /// while the inner service has the request (abort on loss).
    pub(crate) head: Option<Box<http::request::Parts>>,
    /// A `HEAD` request: its response's body is never sent.
    pub(crate) head_request: bool,
}

/// What a releasing future returns once the lock is released.
enum Output<B, E> {
    Inner(Result<Response<B>, E>),
    Rejection(Response<Answer>),
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateOwned]
    enum State<F, B, E, L: LockBackend> {
        Reading {
            read: ReadFuture<F>,
            acquire: Option<AcquireFuture>,
            ctx: Ctx<L>,
        },
        Acquiring {
            acquire: AcquireFuture,
            call: CallFn<F>,
            ctx: Ctx<L>,
        },
        Passthrough {
            #[pin]
            fut: F,
        },
        Calling {
            #[pin]
            fut: F,
            guard: LockGuard<L>,
            lost: Option<BoxFuture<'static, LostReason>>,
            ctx: Ctx<L>,
        },
        Releasing {
            release: BoxFuture<'static, Released>,
            guard: LockGuard<L>,
            output: Output<B, E>,
        },
        Rejected {
            response: Response<Answer>,
        },
        Replayed {
            response: Response<Bytes>,
            trailers: Option<http::HeaderMap>,
        },
        Storing {
            finishing: Finishing,
            response: Option<Response<ResponseBody<B, L>>>,
            // What goes out instead if the record reached too few nodes.
            not_recorded: Option<Response<Answer>>,
        },
        Done,
    }
}

type Ready<B, E, L> = Result<Response<ResponseBody<B, L>>, E>;

/// What one step of a state gave: a new state was set, or the output is ready.
enum Step<B, E, L: LockBackend> {
    Next,
    Ready(Ready<B, E, L>),
}

impl<F, B, E, L: LockBackend> ResponseFuture<F, B, E, L> {
    pub(crate) fn passthrough(fut: F) -> Self {
        Self {
            state: State::Passthrough { fut },
            span: tracing::Span::none(),
        }
    }

    pub(crate) fn rejected(response: Response<Answer>, span: tracing::Span) -> Self {
        Self {
            state: State::Rejected { response },
            span,
        }
    }

    /// Reads the start of the request's body first (for its fingerprint, or the lock name
    /// in it: then `acquire` is `None`), then acquires.
    pub(crate) fn reading(
        read: ReadFuture<F>,
        acquire: Option<AcquireFuture>,
        ctx: Ctx<L>,
        span: tracing::Span,
    ) -> Self {
        Self {
            state: State::Reading { read, acquire, ctx },
            span,
        }
    }

    pub(crate) fn acquiring(
        acquire: AcquireFuture,
        call: CallFn<F>,
        ctx: Ctx<L>,
        span: tracing::Span,
    ) -> Self {
        Self {
            state: State::Acquiring { acquire, call, ctx },
            span,
        }
    }
}

impl<F, B, E, L: LockBackend> std::fmt::Debug for ResponseFuture<F, B, E, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Reading { .. } => "reading the request body",
            State::Acquiring { .. } => "acquiring",
            State::Passthrough { .. } => "passthrough",
            State::Calling { .. } => "calling",
            State::Releasing { .. } => "releasing",
            State::Rejected { .. } => "rejected",
            State::Replayed { .. } => "replayed",
            State::Storing { .. } => "storing the record of a response without a body",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, B, E, L> Future for ResponseFuture<F, B, E, L>
where
    L: LockBackend,
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
    B::Data: From<Bytes>,
{
    type Output = Ready<B, E, L>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (span, mut state) = (&*this.span, this.state);
        let _entered = span.enter();
        loop {
            let step = match state.as_mut().project() {
                StateProj::Reading { read, .. } => {
                    let read = ready!(read.as_mut().poll(cx));
                    read_body(state.as_mut(), read, span)
                }
                StateProj::Acquiring { acquire, .. } => {
                    let result = ready!(acquire.as_mut().poll(cx));
                    acquired(state.as_mut(), result, span)
                }
                StateProj::Passthrough { fut } => {
                    Step::Ready(ready!(fut.poll(cx)).map(|res| wrap(res, None)))
                }
                StateProj::Calling { fut, lost, .. } => {
                    match lost.as_mut().map(|lost| lost.as_mut().poll(cx)) {
                        Some(Poll::Ready(reason)) => {
                            lost_while_calling(state.as_mut(), &reason, span)
                        }
                        _ => {
                            let output = ready!(fut.poll(cx));
                            called(state.as_mut(), output)
                        }
                    }
                }
                StateProj::Releasing { release, .. } => {
                    let _ = ready!(release.as_mut().poll(cx));
                    released(state.as_mut())
                }
                StateProj::Rejected { .. } => rejected(state.as_mut()),
                StateProj::Replayed { .. } => replayed(state.as_mut()),
                StateProj::Storing {
                    finishing,
                    response,
                    not_recorded,
                } => {
                    let recorded = ready!(finishing.poll_done(cx));
                    let instead = not_recorded.take().filter(|_| !recorded);
                    stored(instead, response.take(), span)
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };
            if let Step::Ready(output) = step {
                return Poll::Ready(output);
            }
        }
    }
}

type StatePin<'a, F, B, E, L> = Pin<&'a mut State<F, B, E, L>>;

/// A kept response's record is stored (or not): the response, or, with nothing sent yet
/// and the record short of a quorum, the rejection `instead`.
fn stored<B, E, L: LockBackend>(
    instead: Option<Response<Answer>>,
    response: Option<Response<ResponseBody<B, L>>>,
    span: &tracing::Span,
) -> Step<B, E, L> {
    match (instead, response) {
        (Some(rejection), _) => {
            span.record("outcome", "not_recorded");
            Step::Ready(Ok(rejection.map(ResponseBody::answer)))
        }
        (None, Some(response)) => Step::Ready(Ok(response)),
        (None, None) => Step::Next,
    }
}

/// The start of the body is read: acquire, with the request's fingerprint (and the name
/// the body gave), pass through, or reject. The outcome of a rejection goes to `span`.
fn read_body<F, B, E, L: LockBackend>(
    mut state: StatePin<'_, F, B, E, L>,
    read: Read<F>,
    span: &tracing::Span,
) -> Step<B, E, L> {
    if let StateOwned::Reading {
        acquire, mut ctx, ..
    } = state.as_mut().project_replace(State::Done)
    {
        ctx.fingerprint = read.fingerprint;
        let call = read.call;
        let next = match (read.named, acquire) {
            (BodyNamed::Lock(acquire), _) | (BodyNamed::Head, Some(acquire)) => {
                State::Acquiring { acquire, call, ctx }
            }
            (BodyNamed::Pass | BodyNamed::Head, _) => State::Passthrough { fut: call.pass() },
            (BodyNamed::Reject(rejection), _) => {
                span.record("outcome", "rejected");
                span.record("rejection", rejection.kind().as_str());
                State::Rejected {
                    response: ctx.config.respond(rejection, &call.head()),
                }
            }
        };
        state.set(next);
    }
    Step::Next
}

/// The lock is held: call the inner service. Or it is not: reject. The outcome goes to
/// the request's `span`.
fn acquired<F, B, E, L: LockBackend>(
    mut state: StatePin<'_, F, B, E, L>,
    result: Result<(Acquired, Vec<u8>), Denied>,
    span: &tracing::Span,
) -> Step<B, E, L> {
    if let StateOwned::Acquiring { call, ctx, .. } = state.as_mut().project_replace(State::Done) {
        let reject = |rejection: Rejection, call: CallFn<F>| {
            span.record("outcome", "rejected");
            span.record("rejection", rejection.kind().as_str());
            State::Rejected {
                response: ctx.config.respond(rejection, &call.head()),
            }
        };
        let next = match result {
            Ok((Acquired::Lock(lock), _)) => {
                span.record("outcome", "acquired");
                calling(lock, call, ctx)
            }
            Err(Denied { error, name }) => {
                log_rejected(&ctx.lock, &error, &name);
                let rejection = Rejection::from_lock_error(error, ctx.protocol).with_name(name);
                reject(rejection, call)
            }
            // The name's work is done: the replay room says what the request gets.
            Ok((Acquired::Record { record, .. }, name)) => {
                match replay::answer(&record.0, &ctx.fingerprint, ctx.protocol, name) {
                    Ok((response, trailers)) => {
                        span.record("outcome", "replayed");
                        State::Replayed { response, trailers }
                    }
                    Err(rejection) => reject(rejection, call),
                }
            }
        };
        state.set(next);
    }
    Step::Next
}

/// The lock is held: the inner service called with its token, the lock guarded (and
/// watched for a loss, with abort on loss).
fn calling<F, B, E, L: LockBackend>(
    lock: crate::token::Lock,
    call: CallFn<F>,
    ctx: Ctx<L>,
) -> State<F, B, E, L> {
    let config = &ctx.config;
    let guard = LockGuard::watched(
        ctx.lock.clone(),
        lock,
        config.auto_extend,
        config.stall_timeout,
    );
    let lost = config.abort_on_loss.then(|| {
        let token = guard.token();
        let lost: BoxFuture<'static, LostReason> = Box::pin(async move { token.lost().await });
        lost
    });
    let fut = call.call(guard.token());
    State::Calling {
        fut,
        guard,
        lost,
        ctx,
    }
}

/// The inner service answered: hand a response to keep to the replay room's recording
/// body (which holds the lock until the record is stored), release first (default), or
/// hand the lock to the body.
fn called<F, B, E, L: LockBackend>(
    mut state: StatePin<'_, F, B, E, L>,
    output: Result<Response<B>, E>,
) -> Step<B, E, L>
where
    B: Body,
{
    let StateOwned::Calling { mut guard, ctx, .. } = state.as_mut().project_replace(State::Done)
    else {
        return Step::Next;
    };
    let output = match (output, ctx.config.replay.as_ref()) {
        (Ok(res), Some(policy)) if policy.keeps(res.status()) => {
            let keep = Keep {
                policy: policy.clone(),
                lock: ctx.lock.clone(),
                fingerprint: ctx.fingerprint,
                protocol: ctx.protocol,
            };
            match keeping::recording(res, guard, keep, ctx.head_request) {
                Recording::Streams(res) => return Step::Ready(Ok(res)),
                Recording::Storing(finishing, res) => {
                    state.set(storing(finishing, res, ctx));
                    return Step::Next;
                }
                Recording::NotKept(res, given_back) => {
                    guard = given_back;
                    Ok(res)
                }
            }
        }
        (output, _) => output,
    };
    match output {
        Ok(res) if ctx.config.release == ReleaseOn::BodyEnd => {
            Step::Ready(Ok(wrap(res, Some(guard))))
        }
        output => {
            state.set(releasing(guard, Output::Inner(output)));
            Step::Next
        }
    }
}

/// A kept response with nothing to stream: its record being stored before it goes out,
/// with the 503 it gets instead if the record reaches too few nodes.
fn storing<F, B, E, L: LockBackend>(
    finishing: Finishing,
    res: Response<ResponseBody<B, L>>,
    ctx: Ctx<L>,
) -> State<F, B, E, L> {
    let rejection = Rejection::not_recorded(ctx.protocol);
    let head = ctx
        .head
        .map_or_else(|| http::Request::new(()).into_parts().0, |head| *head);
    State::Storing {
        finishing,
        response: Some(res),
        not_recorded: Some(ctx.config.respond(rejection, &head)),
    }
}

/// Abort on loss: drop the inner future, release, and answer 503 / `UNAVAILABLE` (the
/// outcome goes to `span`).
fn lost_while_calling<F, B, E, L: LockBackend>(
    mut state: StatePin<'_, F, B, E, L>,
    reason: &LostReason,
    span: &tracing::Span,
) -> Step<B, E, L> {
    span.record("outcome", "lost");
    if let StateOwned::Calling { mut guard, ctx, .. } = state.as_mut().project_replace(State::Done)
    {
        let rejection = Rejection::lost(reason, ctx.protocol).with_name(guard.name().to_vec());
        tracing::warn!(%reason, "redlock layer aborted a request: its lock was lost");
        let head = ctx
            .head
            .map_or_else(|| http::Request::new(()).into_parts().0, |head| *head);
        state.set(State::Releasing {
            release: guard.release_future(),
            guard,
            output: Output::Rejection(ctx.config.respond(rejection, &head)),
        });
    }
    Step::Next
}

/// The lock is released: return what was kept.
fn released<F, B, E, L: LockBackend>(mut state: StatePin<'_, F, B, E, L>) -> Step<B, E, L> {
    let StateOwned::Releasing {
        mut guard, output, ..
    } = state.as_mut().project_replace(State::Done)
    else {
        return Step::Next;
    };
    guard.disarm();
    Step::Ready(match output {
        Output::Inner(output) => output.map(|res| wrap(res, None)),
        Output::Rejection(response) => Ok(response.map(ResponseBody::answer)),
    })
}

fn replayed<F, B, E, L: LockBackend>(mut state: StatePin<'_, F, B, E, L>) -> Step<B, E, L> {
    match state.as_mut().project_replace(State::Done) {
        StateOwned::Replayed { response, trailers } => {
            Step::Ready(Ok(response.map(|data| ResponseBody::fixed(data, trailers))))
        }
        _ => Step::Next,
    }
}

fn rejected<F, B, E, L: LockBackend>(mut state: StatePin<'_, F, B, E, L>) -> Step<B, E, L> {
    match state.as_mut().project_replace(State::Done) {
        StateOwned::Rejected { response } => Step::Ready(Ok(response.map(ResponseBody::answer))),
        _ => Step::Next,
    }
}

/// Releases the lock, then returns `output`.
fn releasing<F, B, E, L: LockBackend>(
    mut guard: LockGuard<L>,
    output: Output<B, E>,
) -> State<F, B, E, L> {
    State::Releasing {
        release: guard.release_future(),
        guard,
        output,
    }
}

/// Logs why a request did not get its lock: service failures (with each node's cause) at
/// `warn`, contention at `debug`. Lock names are logged as the client shows them (a hash
/// unless [`log_lock_names`](crate::RedlockBuilder::log_lock_names) is on), lock values
/// never.
fn log_rejected<L: LockBackend>(lock: &L, error: &LockError, name: &[u8]) {
    let name = lock.shown_name(name);
    match error {
        LockError::Busy { .. } | LockError::InvalidName { .. } => {
            tracing::debug!(lock = %name, %error, "redlock layer rejected a request");
        }
        _ => tracing::warn!(lock = %name, %error, "redlock layer rejected a request"),
    }
}

fn wrap<B, L: LockBackend>(
    res: Response<B>,
    held: Option<LockGuard<L>>,
) -> Response<ResponseBody<B, L>> {
    res.map(|b| ResponseBody::inner(b, held))
}

#[cfg(test)]
#[path = "future_tests.rs"]
mod tests;
