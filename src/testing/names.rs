//! The in-memory lock's table: per name, who holds it until when, its completion record
//! and until when it is kept, its fencing counter, and the failures a test queued for it.
//! Every decision is one call under one mutex, so it needs no clock of its own: the
//! caller says what time it is.
//!
//! ```text
//! take(name) --queued failure?--> that error
//!            --record kept?-----> the record (replay) / busy
//!            --held, not expired-> busy (retry after its expiry)
//!            --free-------------> held by a fresh value, the counter one higher
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::error::{LockError, NodeError, NodeFailure};
use crate::quorum::later;
use crate::token::{Lock, LostReason, Shared};

/// What a test makes an acquisition of a name come to instead of its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// Another holder has it: [`LockError::Busy`] (the layer answers 409, or waits per its
    /// [`WaitPolicy`](crate::layer::WaitPolicy)).
    Busy,
    /// No quorum answered: [`LockError::NoQuorum`] (the layer answers 503).
    Unavailable,
}

impl Failure {
    /// The error this failure gives on the `attempts`-th attempt.
    pub(super) fn error(self, attempts: u32, retry_after: Option<Duration>) -> LockError {
        match self {
            Self::Busy => LockError::Busy {
                held_elsewhere: 1,
                nodes: 1,
                retry_after,
                attempts,
            },
            Self::Unavailable => LockError::NoQuorum {
                needed: 1,
                reached: 0,
                held_elsewhere: 0,
                failures: vec![NodeFailure::new("in-memory", NodeError::Refused)],
                attempts,
            },
        }
    }
}

/// A name's holder.
#[derive(Debug)]
struct Holder {
    value: Arc<str>,
    /// When the lock runs out; `None` while a guard keeps it alive.
    expires: Option<Instant>,
    /// The holder's tokens, once guarded: told when a test makes the lock lost.
    shared: Weak<Shared>,
}

/// Everything about one name.
#[derive(Debug, Default)]
struct Entry {
    holder: Option<Holder>,
    /// The completion record, and until when it is kept.
    record: Option<(Arc<[u8]>, Instant)>,
    /// The last fencing number handed out.
    counter: u64,
    failures: VecDeque<Failure>,
}

impl Entry {
    /// Drops what has run out by `now`.
    fn expire(&mut self, now: Instant) {
        if self
            .holder
            .as_ref()
            .and_then(|h| h.expires)
            .is_some_and(|t| t <= now)
        {
            self.holder = None;
        }
        if self.record.as_ref().is_some_and(|(_, until)| *until <= now) {
            self.record = None;
        }
    }

    /// The holder of `value`, if it still holds the name at `now`.
    fn held_by(&mut self, value: &str, now: Instant) -> Option<&mut Holder> {
        self.expire(now);
        self.holder.as_mut().filter(|h| &*h.value == value)
    }
}

/// What an attempt asks for: the name for `value`, for `ttl`, and whether the name's
/// completion record answers it (`replay`).
#[derive(Debug)]
pub(super) struct Ask<'a> {
    pub(super) value: &'a Arc<str>,
    pub(super) ttl: Duration,
    pub(super) replay: bool,
}

/// What an attempt on a free or busy name came to.
#[derive(Debug)]
pub(super) enum Taken {
    /// Held by `value`, with this fencing number (counted whether or not it is used).
    Lock { number: u64 },
    /// The name's completion record.
    Record(Arc<[u8]>),
    /// Someone holds it, until then if known (the record holds it without replay).
    Busy { until: Option<Instant> },
}

/// The table of every name.
#[derive(Debug, Default)]
pub(super) struct Names {
    entries: Mutex<HashMap<Box<[u8]>, Entry>>,
}

impl Names {
    fn entries(&self) -> MutexGuard<'_, HashMap<Box<[u8]>, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `failure` for the next acquisition of `name`.
    pub(super) fn queue(&self, name: &[u8], failure: Failure) {
        let mut entries = self.entries();
        entries
            .entry(name.into())
            .or_default()
            .failures
            .push_back(failure);
    }

    /// The failure queued next for `name`, taken off the queue.
    pub(super) fn next_failure(&self, name: &[u8]) -> Option<Failure> {
        self.entries().get_mut(name)?.failures.pop_front()
    }

    /// One attempt on `name` at `now`, as `ask` says.
    pub(super) fn take(&self, name: &[u8], ask: &Ask<'_>, now: Instant) -> Taken {
        let mut entries = self.entries();
        let entry = entries.entry(name.into()).or_default();
        entry.expire(now);
        if let Some((record, until)) = &entry.record {
            return match ask.replay {
                true => Taken::Record(Arc::clone(record)),
                false => Taken::Busy {
                    until: Some(*until),
                },
            };
        }
        if let Some(holder) = &entry.holder {
            return Taken::Busy {
                until: holder.expires,
            };
        }
        entry.counter = entry.counter.saturating_add(1);
        entry.holder = Some(Holder {
            value: Arc::clone(ask.value),
            expires: Some(later(now, ask.ttl)),
            shared: Weak::new(),
        });
        Taken::Lock {
            number: entry.counter,
        }
    }

    /// A guard took the lock of `shared`: it is told if a test makes the lock lost, and,
    /// when `extend`, it no longer runs out. Whether the lock was still held.
    pub(super) fn guard(&self, shared: &Arc<Shared>, extend: bool, now: Instant) -> bool {
        let lock = &shared.lock;
        let mut entries = self.entries();
        let Some(holder) = entries
            .get_mut(lock.name())
            .and_then(|entry| entry.held_by(lock.value(), now))
        else {
            return false;
        };
        holder.shared = Arc::downgrade(shared);
        if extend {
            holder.expires = None;
        }
        true
    }

    /// Releases `lock`'s name if `lock` holds it; whether it did.
    pub(super) fn release(&self, lock: &Lock, now: Instant) -> bool {
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(lock.name()) else {
            return false;
        };
        let held = entry.held_by(lock.value(), now).is_some();
        if held {
            entry.holder = None;
        }
        held
    }

    /// Replaces `lock`'s hold on its name with `record`, kept until `until`; whether
    /// `lock` still held the name.
    pub(super) fn complete(
        &self,
        lock: &Lock,
        record: Vec<u8>,
        until: Instant,
        now: Instant,
    ) -> bool {
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(lock.name()) else {
            return false;
        };
        if entry.held_by(lock.value(), now).is_none() {
            return false;
        }
        entry.holder = None;
        entry.record = Some((record.into(), until));
        true
    }

    /// Makes `name`'s lock lost: the name is free, and a guarded holder is told, as
    /// when its extension finds the key gone. Whether the name was held.
    pub(super) fn lose(&self, name: &[u8], now: Instant) -> bool {
        let holder = {
            let mut entries = self.entries();
            let Some(entry) = entries.get_mut(name) else {
                return false;
            };
            entry.expire(now);
            entry.holder.take()
        };
        let Some(holder) = holder else {
            return false;
        };
        if let Some(shared) = holder.shared.upgrade() {
            shared.set_valid_until(now);
            shared.mark_lost(LostReason::ExtendFailed(LockError::NotHeld {
                held_on: 0,
                needed: 1,
                failures: Vec::new(),
                attempts: 1,
            }));
        }
        true
    }

    /// Whether `name` is held at `now`.
    pub(super) fn is_held(&self, name: &[u8], now: Instant) -> bool {
        let mut entries = self.entries();
        entries.get_mut(name).is_some_and(|entry| {
            entry.expire(now);
            entry.holder.is_some()
        })
    }

    /// `name`'s completion record, if one is kept at `now`.
    pub(super) fn record(&self, name: &[u8], now: Instant) -> Option<Arc<[u8]>> {
        let mut entries = self.entries();
        let entry = entries.get_mut(name)?;
        entry.expire(now);
        entry.record.as_ref().map(|(record, _)| Arc::clone(record))
    }

    /// Forgets `name`'s completion record.
    pub(super) fn forget_record(&self, name: &[u8]) -> bool {
        self.entries()
            .get_mut(name)
            .and_then(|entry| entry.record.take())
            .is_some()
    }
}
