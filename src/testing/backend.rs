//! [`InMemoryLock`] as a lock backend: the seam's operations over the table of names,
//! and waiting for a busy name until it is freed or the deadline passes.
//!
//! ```text
//! acquire --attempt--> lock / record / error
//!            \--busy, waiting--> sleep until freed, the holder's expiry or the deadline --> attempt
//! ```
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let lock = tower_redlock::testing::InMemoryLock::new();
//! let guard = lock.acquire("report").await.unwrap();
//! assert!(lock.acquire("report").await.is_err()); // busy
//! let _ = guard.release().await;
//! assert!(lock.acquire("report").await.is_ok());
//! # }
//! ```

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::InMemoryLock;
use super::names::{Ask, Failure, Taken};
use crate::backend::sealed::Backend;
use crate::backend::{Acquisition, Stored};
use crate::client::{Acquired, Released};
use crate::defaults::MAX_TTL;
use crate::error::{ConfigError, LockError, RecordBytes};
use crate::name::{CounterSets, Resource, keys_for, new_value};
use crate::quorum::{NodeMask, later};
use crate::token::{Lock, Shared};

/// The id at the start of the in-memory lock's values.
const MEMORY_ID: [u8; 16] = *b"0000000000000000";

/// What one attempt on a name came to.
enum Attempted {
    /// The lock, or the name's record.
    Done(Acquired),
    /// The name is busy (until then, if known).
    Busy {
        error: LockError,
        until: Option<Instant>,
    },
}

impl InMemoryLock {
    /// One attempt, then the lock (for [`acquire`](Self::acquire)).
    pub(crate) async fn try_lock(&self, name: &[u8], ttl: Duration) -> Result<Lock, LockError> {
        let how = Acquisition {
            replay: None,
            until: None,
        };
        match Backend::acquire(self, name, ttl, how).await? {
            Acquired::Lock(lock) => Ok(lock),
            Acquired::Record { attempts, .. } => Err(Failure::Busy.error(attempts, None)),
        }
    }

    /// The `attempts`-th attempt on `name`, for `ttl`.
    fn attempt(
        &self,
        name: &[u8],
        ttl: Duration,
        replay: bool,
        attempts: u32,
    ) -> Result<Attempted, LockError> {
        let resource = self.checked(name, ttl, attempts)?;
        if let Some(failed) = self.injected(name, attempts)? {
            return Ok(failed);
        }
        let value: Arc<str> = new_value(&MEMORY_ID)?.into();
        let now = Instant::now();
        let ask = Ask {
            value: &value,
            ttl,
            replay,
        };
        let number = match self.state.names.take(name, &ask, now) {
            Taken::Lock { number } => number,
            Taken::Record(record) => {
                return Ok(Attempted::Done(Acquired::Record {
                    record: RecordBytes(record.to_vec()),
                    attempts,
                }));
            }
            Taken::Busy { until } => {
                let retry_after = until.map(|t| t.saturating_duration_since(now));
                return Ok(Attempted::Busy {
                    error: Failure::Busy.error(attempts, retry_after),
                    until,
                });
            }
        };
        Ok(Attempted::Done(Acquired::Lock(Lock {
            resource,
            value,
            started: now,
            acquired_at: now,
            valid_until: later(now, ttl),
            ttl,
            attempts,
            fence: self.fencing.then_some(number),
            foreign: NodeMask::default(),
            landing: None,
        })))
    }

    /// The failure a test queued for `name`'s next attempt (the `attempts`-th): busy, an
    /// error, or none.
    fn injected(&self, name: &[u8], attempts: u32) -> Result<Option<Attempted>, LockError> {
        match self.state.names.next_failure(name) {
            Some(Failure::Busy) => Ok(Some(Attempted::Busy {
                error: Failure::Busy.error(attempts, None),
                until: None,
            })),
            Some(failure) => Err(failure.error(attempts, None)),
            None => Ok(None),
        }
    }

    /// What the client checks before it sends anything (the TTL, the name), and whether
    /// a test made every acquisition unavailable: the name's keys.
    fn checked(
        &self,
        name: &[u8],
        ttl: Duration,
        attempts: u32,
    ) -> Result<Arc<Resource>, LockError> {
        if ttl.as_millis() == 0 {
            return Err(LockError::Config(ConfigError::ZeroTtl));
        }
        if ttl > MAX_TTL {
            return Err(LockError::Config(ConfigError::TtlTooLong { ttl }));
        }
        let keys = keys_for(b"", name, CounterSets::One)?;
        if self.state.unavailable.load(Ordering::Relaxed) {
            return Err(Failure::Unavailable.error(attempts, None));
        }
        Ok(Arc::new(Resource::new(name, keys)))
    }

    /// Tells waiters that a name may be free.
    fn freed(&self) {
        self.state.freed.notify_waiters();
    }
}

impl Backend for InMemoryLock {
    fn default_ttl(&self) -> Duration {
        self.ttl
    }

    fn fenced(&self, on: bool) -> Self {
        self.with_fencing(on)
    }

    async fn acquire(
        &self,
        name: &[u8],
        ttl: Duration,
        how: Acquisition,
    ) -> Result<Acquired, LockError> {
        let mut attempts = 0u32;
        loop {
            // Registered before the attempt, so that a release right after it wakes us.
            let freed = self.state.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            attempts = attempts.saturating_add(1);
            let (error, until) = match self.attempt(name, ttl, how.replay.is_some(), attempts)? {
                Attempted::Done(acquired) => return Ok(acquired),
                Attempted::Busy { error, until } => (error, until),
            };
            let Some(deadline) = how.until.filter(|d| Instant::now() < *d) else {
                return Err(error);
            };
            let wake = until.map_or(deadline, |t| t.min(deadline));
            let _ = tokio::time::timeout_at(wake.into(), freed).await;
        }
    }

    fn keep(&self, shared: &Arc<Shared>, extend: bool) -> Option<u64> {
        let now = Instant::now();
        if self.state.names.guard(shared, extend, now) && extend {
            // Kept alive until released or lost.
            shared.set_valid_until(later(now, Duration::MAX));
        }
        None
    }

    fn stop(&self, _id: u64) {}

    fn release(&self, shared: Arc<Shared>) -> impl Future<Output = Released> + Send + 'static {
        let this = self.clone();
        async move {
            let held = this.state.names.release(&shared.lock, Instant::now());
            this.freed();
            Released::counted(usize::from(held), usize::from(!held))
        }
    }

    fn release_in_background(&self, shared: &Shared) {
        self.state.names.release(&shared.lock, Instant::now());
        self.freed();
    }

    fn complete(
        &self,
        shared: Arc<Shared>,
        record: Vec<u8>,
        retention: Duration,
    ) -> impl Future<Output = Stored> + Send + 'static {
        let this = self.clone();
        async move {
            let now = Instant::now();
            let until = later(now, retention);
            let stored = this.state.names.complete(&shared.lock, record, until, now);
            this.freed();
            Stored {
                on: usize::from(stored),
                needed: 1,
            }
        }
    }

    fn shown_name(&self, name: &[u8]) -> String {
        String::from_utf8_lossy(name).into_owned()
    }

    fn room_for_records(&self) -> bool {
        true
    }
}
