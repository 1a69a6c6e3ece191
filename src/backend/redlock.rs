//! [`Redlock`] as the layer's and the guard's lock backend: each seam operation is one of
//! the client's operations.
//!
//! ```text
//! acquire  -> try_lock_with_ttl / lock_until, or acquire_or_replay (replay)
//! keep     -> the client's keep-alive driver (extend = true), or nothing
//! release  -> unlock on every node; dropped guards: release in the background
//! complete -> the completion record on the nodes where the lock is held
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let guard = redlock.acquire("report").await?; // kept alive through this seam
//! let _ = guard.release().await;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use super::sealed::Backend;
use super::{Acquisition, Stored};
use crate::client::{Acquired, Deletion, Redlock, Released, Wake};
use crate::error::LockError;
use crate::keepalive;
use crate::token::Shared;

impl Backend for Redlock {
    fn default_ttl(&self) -> Duration {
        self.ttl()
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
        match (how.replay, how.until) {
            (Some(retention), until) => self.acquire_or_replay(name, ttl, retention, until).await,
            (None, None) => self.try_lock_with_ttl(name, ttl).await.map(Acquired::Lock),
            (None, Some(until)) => self.lock_until(name, ttl, until).await.map(Acquired::Lock),
        }
    }

    fn keep(&self, shared: &Arc<Shared>, extend: bool) -> Option<u64> {
        if !extend {
            return None;
        }
        keepalive::start(self.keeper(), Arc::clone(shared), self.keep_alive())
    }

    fn stop(&self, id: u64) {
        keepalive::stop(self.guards(), id);
    }

    fn release(&self, shared: Arc<Shared>) -> impl Future<Output = Released> + Send + 'static {
        let redlock = self.clone();
        async move { redlock.unlock(&shared.lock).await }
    }

    fn release_in_background(&self, shared: &Shared) {
        Redlock::release_in_background(self, Deletion::of(&shared.lock, Wake::OnSent));
    }

    fn complete(
        &self,
        shared: Arc<Shared>,
        record: Vec<u8>,
        retention: Duration,
    ) -> impl Future<Output = Stored> + Send + 'static {
        let redlock = self.clone();
        async move {
            let on = redlock.complete(&shared.lock, &record, retention).await;
            Stored {
                on,
                needed: redlock.quorum(),
            }
        }
    }

    fn shown_name(&self, name: &[u8]) -> String {
        Redlock::shown_name(self, name)
    }

    fn room_for_records(&self) -> bool {
        Redlock::room_for_records(self)
    }
}
