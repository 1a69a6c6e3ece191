//! Releases merged as they are written: the releases a connection has to write in one go
//! become one [`RELEASE_MANY`](crate::scripts) script call, and its reply is split back
//! into each release's own answer. A release never waits for another to be answered:
//! it waits only for the connection's next write, like any request, and finds there the
//! releases that came meanwhile (a script call costs the server several times what the
//! `GET`, `DEL` and `PUBLISH` inside it cost, so a node under load runs one per write
//! instead of one per lock).
//!
//! The merged call takes the place of the first of its releases among the requests, so a
//! command sent after a release still runs after it. A release joins it only if no
//! request sent since may be about its key (a `SET` of this client's that the release
//! must not overtake, say): requests whose key is not known (follow-ups, health checks)
//! close it, and a release whose key may be among the others' starts a new call after
//! them. A release alone in its write goes as itself. Releases still waiting for the
//! write when the connection breaks were never seen by the node: they go to its next
//! connection ([`Unsent`]), even if their callers stopped waiting.
//!
//! ```text
//! out:  SET a | RELEASE b | SET c | RELEASE d | RELEASE e | SET f | RELEASE f
//! sent: SET a | EVALSHA <release many> 3 b d e ... | SET c | SET f | RELEASE f
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let (a, b) = (redlock.lock("a").await?, redlock.lock("b").await?);
//! // Sent together: both deletes may go out as one script call.
//! let (ra, rb) = tokio::join!(redlock.unlock(&a), redlock.unlock(&b));
//! assert_eq!((ra.released(), rb.released()), (1, 1));
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use redis::{RedisError, Value};

use super::slot::Slot;
use crate::scripts::{self, Call};

/// The most releases in one script call.
pub(super) const MAX_MERGED: usize = 256;

/// The keys of the requests sent after a merged call opened, as a filter: a key it holds
/// may be among them; one it does not hold is not (a false "may" only splits a call).
#[derive(Default, Clone, Copy)]
pub(super) struct Keys([u64; 4]);

impl Keys {
    /// Notes `key`.
    pub(super) fn insert(&mut self, key: &[u8]) {
        let bit = Self::bit(key);
        self.0[bit / 64] |= 1 << (bit % 64);
    }

    /// Whether `key` may have been noted.
    pub(super) fn may_hold(&self, key: &[u8]) -> bool {
        let bit = Self::bit(key);
        self.0[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// Where `key` goes in the filter: FNV-1a, folded to 8 bits.
    fn bit(key: &[u8]) -> usize {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in key {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        usize::from(hash.to_le_bytes().iter().fold(0u8, |acc, b| acc ^ b))
    }
}

/// Releases to be written as one call, and where their answers go. Releases join it until
/// the connection takes it to write; it is answered by one reply.
#[derive(Default)]
pub(super) struct Merged(Mutex<Vec<Item>>);

struct Item {
    /// Kept until the call is written.
    call: Option<Arc<Call>>,
    slot: Arc<Slot>,
}

impl Merged {
    fn items(&self) -> MutexGuard<'_, Vec<Item>> {
        // Every change leaves the list consistent, so a poisoned lock is still usable.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds the release `call`, answered through `slot`; how many the call has now.
    pub(super) fn join(&self, call: &Arc<Call>, slot: Arc<Slot>) -> usize {
        let mut items = self.items();
        items.push(Item {
            call: Some(Arc::clone(call)),
            slot,
        });
        items.len()
    }

    /// Writes the call at the end of `out`: a lone release as itself, several as one
    /// `RELEASE_MANY`. The releases are no longer needed once written.
    pub(super) fn pack_into(&self, out: &mut Vec<u8>) {
        let mut items = self.items();
        let calls: Vec<Arc<Call>> = items.iter_mut().filter_map(|i| i.call.take()).collect();
        match calls.as_slice() {
            // Failed while being taken (the connection broke): nothing to write.
            [] => {}
            [lone] => out.extend_from_slice(lone.packed()),
            many => scripts::pack_release_many(many, out),
        }
    }

    /// The call's reply: each release gets its own answer (a lone release the reply
    /// itself). A reply the releases cannot be told from (an error such as `NOSCRIPT`
    /// among them) is each release's answer, as it would have been alone. Read by `at`.
    pub(super) fn deliver(&self, reply: Value, at: Instant) {
        let items = std::mem::take(&mut *self.items());
        if let [lone] = items.as_slice() {
            lone.slot.deliver(reply, at);
            return;
        }
        let error = match reply {
            Value::ServerError(_) => reply.extract_error().err(),
            reply => match scripts::release_many_answers(reply, items.len()) {
                Ok(answers) => {
                    for (item, answer) in items.iter().zip(answers) {
                        match answer {
                            Ok(value) => item.slot.deliver(value, at),
                            Err(e) => item.slot.fail(e),
                        }
                    }
                    None
                }
                Err(e) => Some(e),
            },
        };
        if let Some(error) = error {
            for item in &items {
                item.slot.fail(error.clone());
            }
        }
    }

    /// The connection broke: a call written fails each of its releases; the releases of
    /// one not written yet go to `unsent` (the node never saw them).
    pub(super) fn fail(&self, error: &RedisError, unsent: &mut Vec<Unsent>) {
        for item in std::mem::take(&mut *self.items()) {
            match item.call {
                Some(call) => unsent.push(Unsent {
                    call,
                    slot: Some(item.slot),
                }),
                None => item.slot.fail(error.clone()),
            }
        }
    }
}

/// A release its connection broke before writing: the node never saw it, so it may go on
/// the node's next connection; its caller, if still waiting, gets the answer from there
/// (or a failure, if it is dropped unanswered).
pub(crate) struct Unsent {
    call: Arc<Call>,
    /// Taken by the answer.
    slot: Option<Arc<Slot>>,
}

impl Unsent {
    /// The release.
    pub(crate) fn call(&self) -> &Arc<Call> {
        &self.call
    }

    /// Its answer, for its caller.
    pub(crate) fn answer(mut self, answer: redis::RedisResult<Value>) {
        match (self.slot.take(), answer) {
            (Some(slot), Ok(value)) => slot.deliver(value, crate::clock::now()),
            (Some(slot), Err(error)) => slot.fail(error),
            (None, _) => {}
        }
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.fail(RedisError::from((
                redis::ErrorKind::Io,
                "the connection broke before the release was written",
            )));
        }
    }
}
