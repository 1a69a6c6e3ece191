//! Where the replies of one request go: a small shared slot the connection's task fills
//! in order and the caller waits on ([`Reply`], [`Replies`]). A caller that stops waiting
//! leaves its slot; the reply is dropped when it arrives.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?; // the SET's reply comes through a slot
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use redis::{RedisError, RedisResult, Value};

/// Where the replies of one request go.
pub(super) struct Slot(Mutex<SlotState>);

struct SlotState {
    /// Replies still to come.
    expected: usize,
    got: Got,
    waker: Option<Waker>,
    /// When the last reply (or the failure) came in, on the crate's monotonic clock.
    arrived: Option<Instant>,
}

enum Got {
    Nothing,
    One(Value),
    Many(Vec<Value>),
    Failed(RedisError),
    /// The caller took the result.
    Taken,
}

impl Slot {
    pub(super) fn new(expected: usize) -> Self {
        Self(Mutex::new(SlotState {
            expected,
            got: Got::Nothing,
            waker: None,
            arrived: None,
        }))
    }

    fn state(&self) -> MutexGuard<'_, SlotState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more reply arrived; the connection's task read it by `at` (one clock read for
    /// every reply of a read).
    pub(super) fn deliver(&self, value: Value, at: Instant) {
        let waker = {
            let mut st = self.state();
            st.expected = st.expected.saturating_sub(1);
            st.got = match std::mem::replace(&mut st.got, Got::Nothing) {
                Got::Nothing if st.expected == 0 => Got::One(value),
                Got::Nothing => {
                    let mut values = Vec::with_capacity(st.expected + 1);
                    values.push(value);
                    Got::Many(values)
                }
                Got::Many(mut values) => {
                    values.push(value);
                    Got::Many(values)
                }
                other => other,
            };
            if st.expected == 0 {
                st.arrived = Some(at);
                st.waker.take()
            } else {
                None
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The request failed (the connection broke).
    pub(super) fn fail(&self, error: RedisError) {
        let waker = {
            let mut st = self.state();
            st.expected = 0;
            st.got = Got::Failed(error);
            st.arrived = Some(crate::clock::now());
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Slot {
    /// What arrived, once everything has (taking it), or `Pending` with `cx` to wake.
    fn poll_take(&self, cx: &mut Context<'_>) -> Poll<Got> {
        let mut st = self.state();
        if st.expected > 0 {
            match &st.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => st.waker = Some(cx.waker().clone()),
            }
            return Poll::Pending;
        }
        Poll::Ready(std::mem::replace(&mut st.got, Got::Taken))
    }

    /// When everything had arrived (`None` while something is still to come).
    fn arrived(&self) -> Option<Instant> {
        self.state().arrived
    }
}

/// The replies to one request, once all have arrived.
pub(crate) struct Replies(pub(super) Arc<Slot>);

impl Future for Replies {
    type Output = RedisResult<Vec<Value>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.poll_take(cx).map(|got| match got {
            Got::One(v) => Ok(vec![v]),
            Got::Many(values) => Ok(values),
            Got::Failed(e) => Err(e),
            Got::Nothing => Ok(Vec::new()),
            Got::Taken => Err(RedisError::from((
                redis::ErrorKind::Client,
                "the replies were already taken",
            ))),
        })
    }
}

/// The reply to a request: a one-command request's reply, a server error being `Err`; or
/// the replies of several commands as one array, server errors among them as values (as
/// a redis-rs pipeline that ignores errors gives them).
pub(crate) struct Reply(pub(super) Arc<Slot>);

impl Reply {
    /// When the reply came in from the connection (the connection's task stamps it as it
    /// hands it over), whenever the caller then took it: `None` until it has.
    pub(crate) fn arrived(&self) -> Option<Instant> {
        self.0.arrived()
    }
}

impl Future for Reply {
    type Output = RedisResult<Value>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.poll_take(cx).map(|got| match got {
            Got::One(v) => v.extract_error(),
            Got::Many(values) => Ok(Value::Array(values)),
            Got::Failed(e) => Err(e),
            Got::Nothing | Got::Taken => Err(RedisError::from((
                redis::ErrorKind::Client,
                "a request of no command, or its reply was already taken",
            ))),
        })
    }
}
