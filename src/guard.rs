//! Releasing a held lock when its owner goes away.
//!
//! [`Held`] owns a [`Lock`] on behalf of the layer's response future or body: it releases
//! in a spawned task when dropped (a client that disconnects drops both), and never blocks
//! in `Drop`.

use futures_util::future::BoxFuture;

use crate::client::{Redlock, Released};
use crate::token::Lock;

/// A held lock that is released in the background if dropped before an explicit release.
pub(crate) struct Held {
    redlock: Redlock,
    lock: Option<Lock>,
}

impl Held {
    pub(crate) fn new(redlock: Redlock, lock: Lock) -> Self {
        Self {
            redlock,
            lock: Some(lock),
        }
    }

    /// The release, as a future that owns what it needs. The guard stays armed until
    /// [`disarm`](Self::disarm), so dropping the future half-way still releases.
    pub(crate) fn release(&self) -> BoxFuture<'static, Released> {
        let redlock = self.redlock.clone();
        let lock = self.lock.clone();
        Box::pin(async move {
            match lock {
                Some(lock) => redlock.unlock(&lock).await,
                None => Released::default(),
            }
        })
    }

    /// Marks the lock as released: dropping the guard does nothing more.
    pub(crate) fn disarm(&mut self) {
        self.lock = None;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            tracing::debug!("redlock holder dropped: releasing in the background");
            self.redlock
                .release_in_background(lock.resource, lock.value, lock.ttl);
        }
    }
}
