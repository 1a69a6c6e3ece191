//! Waking waiters on release: a release tells the waiters, and the next one goes at once.
//!
//! Each client keeps a local registry of waiters per lock key, in arrival order. Only the
//! head of a queue makes attempts; the others wait for their turn without touching the
//! nodes, so a hot name does not stampede every node at each release, and a task that
//! just released queues behind the waiters instead of taking the lock again at once.
//!
//! - **Held by this client** (lock values start with the client's id, so a busy answer
//!   tells whose the key is): its release wakes the head directly, as soon as the deletes
//!   are handed to the node connections; the head's `SET`s follow them on the same
//!   connections, so the handoff takes about one round trip. If the head's attempt still
//!   came first on some node, it is woken again once the release reached a quorum.
//! - **Held by another client**: the queue subscribes to the key's channel on every node
//!   (one pub/sub connection per node per client, opened the first time it is needed).
//!   The release script publishes on that channel right after it deletes the key (in the
//!   same script, so the message cannot come before the delete), with the releasing
//!   client's id; a client ignores its own messages. The head retries once a quorum of
//!   nodes said the key was released. A release publishes only while the node's waiting
//!   key is there (almost no release has anybody waiting, and a script's `PUBLISH` costs
//!   the node about as much as the rest of the release): once subscribed, and before
//!   each wait, the head sets it for as long as it may wait (`crate::op::mark`), and then
//!   tries again at once, since a release before that told nobody.
//!
//! Either way the head also has a backstop: the holder's remaining TTL (the key expires
//! then, release or not), or one jittered retry delay while fewer than a quorum of nodes
//! confirmed the subscription. A dropped pub/sub connection wakes every head once it is
//! back, since messages may have been lost. No waiter waits past its call's budget:
//! `lock()`'s waiting time (its attempts times the longest retry pause, or its retry
//! deadline) or `lock_until`'s deadline, whichever applies.
//!
//! A notification is only ever a hint to retry the normal acquisition, never a reason to
//! believe the lock is free. If a node refuses `SUBSCRIBE` (ACL), is down or restarts,
//! its notifications are missing and waiting falls back to polling.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"])
//!     .retry_delay(Duration::from_millis(500), Duration::from_millis(500)) // the backstop
//!     .build()?;
//! let held = redlock.lock("report").await?;
//! let waiter = tokio::spawn({
//!     let redlock = redlock.clone();
//!     async move { redlock.lock("report").await } // waits for this client's release
//! });
//! let _ = redlock.unlock(&held).await; // the waiter gets the lock about one round trip later
//! let lock = waiter.await??;
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::mpsc::{self, UnboundedSender, error::SendError};
use tokio::sync::{Notify, oneshot};

use crate::name::CLIENT_ID_LEN;
use crate::node::Node;

mod pubsub;
#[cfg(test)]
mod tests;

use pubsub::{Listener, PubSub, Subscription};

/// The waiters of one client, per lock key, and its pub/sub connections.
#[derive(Debug)]
pub(crate) struct Waiters {
    registry: Mutex<Registry>,
    /// How many nodes' release messages wake a head: a quorum, since the next acquisition
    /// needs the key gone from that many nodes.
    quorum: usize,
    /// What this client's releases publish: a random id, so that its own release messages
    /// are told apart. They are ignored, since each release of this client wakes its
    /// waiters itself (as soon as its deletes are on the way); counting them too would
    /// wake the next head again, after the handoff, for an attempt that cannot succeed.
    id: [u8; CLIENT_ID_LEN],
}

#[derive(Debug, Default)]
struct Registry {
    queues: HashMap<Box<[u8]>, Queue>,
    next_id: u64,
    /// One subscription manager per node, by node index, while one runs.
    managers: Vec<Option<UnboundedSender<Subscription>>>,
}

#[derive(Debug, Default)]
struct Queue {
    /// Waiters in arrival order; the first is the head.
    order: VecDeque<(u64, Arc<Notify>)>,
    /// Release messages since the head was last woken.
    notes: usize,
    /// The head should attempt now: a release was heard (or a reconnect may have lost
    /// one, or the head before gave up). Cleared when the head attempts.
    go: bool,
    /// The name's work is done (a waiter found its completion record): every waiter
    /// attempts at once to get the record too.
    done: bool,
    /// Whether a quorum of nodes confirmed the subscription: releases will be heard.
    listening: bool,
    /// Whether the queue subscribed to the key's channel: only once a waiter found the key
    /// held by another client. This client's own releases wake its waiters directly.
    subscribed: bool,
    /// Until when the holder's key lasts at least, as last seen (its remaining TTL, or the
    /// validity of this client's lock when a waiter took it): a head that will be told of
    /// the release waits up to then before it tries without being told.
    holder_until: Option<Instant>,
    /// Until when the nodes' waiting key is there for this queue, as its last mark set it
    /// (see `crate::op::mark`): a release tells the waiters only while it is.
    marked_until: Option<Instant>,
}

impl Queue {
    /// Tells the head to attempt; returns its id.
    fn go(&mut self) -> Option<u64> {
        let (id, head) = self.order.front()?;
        self.go = true;
        head.notify_one();
        Some(*id)
    }
}

impl Waiters {
    pub(crate) fn new(nodes: usize, quorum: usize) -> Arc<Self> {
        Arc::new(Self {
            registry: Mutex::new(Registry {
                managers: (0..nodes).map(|_| None).collect(),
                ..Registry::default()
            }),
            quorum,
            id: client_id(),
        })
    }

    /// What this client's releases publish (see [`Waiters`]).
    pub(crate) fn id(&self) -> &[u8; CLIENT_ID_LEN] {
        &self.id
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on `key`'s queue, if there is one.
    fn with_queue<T>(&self, key: &[u8], f: impl FnOnce(&mut Queue) -> T) -> Option<T> {
        self.registry().queues.get_mut(key).map(f)
    }

    /// Whether some task of this client waits for `key`.
    pub(crate) fn has_queue(&self, key: &[u8]) -> bool {
        self.registry().queues.contains_key(key)
    }

    /// Queues up for `key` (see [`Ticket::subscribe`] to hear of releases by other
    /// clients too).
    pub(crate) fn join(self: &Arc<Self>, key: &[u8]) -> Ticket {
        let notify = Arc::new(Notify::new());
        let id = {
            let mut reg = self.registry();
            let id = reg.next_id;
            reg.next_id += 1;
            let queue = reg.queues.entry(key.into()).or_default();
            queue.order.push_back((id, Arc::clone(&notify)));
            id
        };
        crate::metrics::gauge(crate::metrics::Gauge::Waiting, crate::metrics::Move::Up);
        Ticket {
            waiters: Arc::clone(self),
            key: key.into(),
            id,
            notify,
            acquired: None,
        }
    }

    /// Subscribes `key`'s queue to the key's channel on every node, unless it is already,
    /// waiting for each node's confirmation up to `timeout`. The queue keeps the
    /// subscriptions until its last waiter leaves.
    async fn subscribe(self: &Arc<Self>, key: &[u8], nodes: &[Arc<Node>], timeout: Duration) {
        let mut confirmations = Vec::new();
        {
            let mut reg = self.registry();
            match reg.queues.get_mut(key) {
                Some(queue) if !queue.subscribed => queue.subscribed = true,
                _ => return,
            }
            for (i, node) in nodes.iter().enumerate() {
                let (tx, rx) = oneshot::channel();
                // A node that refused a release's PUBLISH tells nothing: it is polled.
                if self.send(&mut reg, i, node, Subscription::Subscribe(key.into(), tx))
                    && node.tells_waiters()
                {
                    confirmations.push(rx);
                }
            }
        }
        // A node that does not confirm in time is simply not waited for: its
        // notifications may be missing, and the backstop covers that.
        let confirmed = tokio::time::timeout(timeout, join_all(confirmations))
            .await
            .map_or(0, |all| {
                all.iter().filter(|c| matches!(c, Ok(Ok(())))).count()
            });
        self.with_queue(key, |queue| queue.listening = confirmed >= self.quorum);
    }

    /// Sends `request` to node `i`'s subscription manager, starting one if none runs
    /// (or its runtime is gone). False outside a tokio runtime.
    fn send(
        self: &Arc<Self>,
        reg: &mut Registry,
        i: usize,
        node: &Arc<Node>,
        request: Subscription,
    ) -> bool {
        let Some(slot) = reg.managers.get_mut(i) else {
            return false;
        };
        let request = match slot.as_ref() {
            Some(tx) => match tx.send(request) {
                Ok(()) => return true,
                Err(SendError(request)) => request,
            },
            None => request,
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        if tx.send(request).is_err() {
            return false;
        }
        let listener: std::sync::Weak<dyn Listener> = Arc::downgrade(self) as _;
        handle.spawn(PubSub::new(listener, Arc::clone(node), rx).run());
        *slot = Some(tx);
        true
    }

    /// A node said `key` was released: wake the head of its queue once a quorum of nodes
    /// said so.
    fn released(&self, key: &[u8]) {
        let mut reg = self.registry();
        let Some(queue) = reg.queues.get_mut(key) else {
            return;
        };
        queue.notes += 1;
        if queue.notes >= self.quorum {
            queue.notes = 0;
            queue.go();
        }
    }

    /// This client is releasing `key`: wake the head of its queue at once. Returns the
    /// head woken, for [`wake_again`](Self::wake_again).
    pub(crate) fn wake(&self, key: &[u8]) -> Option<u64> {
        self.with_queue(key, |queue| {
            queue.notes = 0;
            queue.go()
        })
        .flatten()
    }

    /// This client's release of `key` reached a quorum: wake head `id` again if it is
    /// still the head. Woken as the deletes were sent, its attempt may have reached a node
    /// before the delete there (when the delete waited for something); it would then
    /// wait for messages that this client's own release does not count for.
    pub(crate) fn wake_again(&self, key: &[u8], id: u64) {
        self.with_queue(key, |queue| {
            if queue.order.front().is_some_and(|(head, _)| *head == id) {
                queue.go();
            }
        });
    }

    /// A waiter found `key`'s completion record: the others need not wait for a release.
    pub(crate) fn done(&self, key: &[u8]) {
        self.with_queue(key, |queue| queue.done = true);
    }

    /// Wakes every head (after a reconnect, messages may have been lost).
    fn wake_heads(&self) {
        for queue in self.registry().queues.values_mut() {
            queue.go();
        }
    }

    /// Takes ticket `id` off `key`'s queue, and drops the subscriptions with the last
    /// waiter. If it was the head, the next waiter becomes the head: it attempts at once
    /// if the one before gave up (the lock may be free, and a release it was woken for
    /// would be lost), and waits for the release if the one before got the lock.
    fn leave(&self, key: &[u8], id: u64, acquired: Option<Instant>) {
        let mut reg = self.registry();
        let Some(queue) = reg.queues.get_mut(key) else {
            return;
        };
        let was_head = queue.order.front().is_some_and(|(head, _)| *head == id);
        queue.order.retain(|(other, _)| *other != id);
        if !queue.order.is_empty() {
            if was_head {
                // Messages so far were seen by the previous head's attempts.
                queue.notes = 0;
                queue.go = false;
                queue.holder_until = acquired;
                if acquired.is_none() {
                    queue.go();
                }
                // The next waiter learns that it is the head now.
                if let Some((_, next)) = queue.order.front() {
                    next.notify_one();
                }
            }
            return;
        }
        let subscribed = reg.queues.remove(key).is_some_and(|q| q.subscribed);
        for tx in reg.managers.iter().flatten().filter(|_| subscribed) {
            // A manager that is gone has nothing to unsubscribe.
            let _ = tx.send(Subscription::Unsubscribe(key.into()));
        }
    }
}

/// The waiters hear what their subscription managers hear.
impl Listener for Waiters {
    fn client_id(&self) -> &[u8] {
        Waiters::id(self)
    }

    fn released(&self, key: &[u8]) {
        Waiters::released(self, key);
    }

    fn reconnected(&self) {
        self.wake_heads();
    }
}

/// A place in the queue of one lock key; leaving it (drop) lets the next waiter go.
#[derive(Debug)]
pub(crate) struct Ticket {
    waiters: Arc<Waiters>,
    key: Box<[u8]>,
    id: u64,
    notify: Arc<Notify>,
    /// Until when the lock this waiter leaves with is valid, if it got it.
    acquired: Option<Instant>,
}

impl Ticket {
    /// Whether this waiter is the first in its queue (the one that makes attempts).
    pub(crate) fn is_head(&self) -> bool {
        self.queue(|q| q.order.front().is_some_and(|(head, _)| *head == self.id))
    }

    /// Whether this ticket's queue subscribed to the key's channel.
    pub(crate) fn subscribed(&self) -> bool {
        self.queue(|q| q.subscribed)
    }

    /// Whether the queue's last mark of the nodes lasts until `until`.
    pub(crate) fn marked_until(&self, until: Instant) -> bool {
        self.queue(|q| q.marked_until.is_some_and(|m| m >= until))
    }

    /// The nodes were marked until `until` for the queue, on a quorum of them or not: a
    /// release on a node without the mark tells nobody, so without a quorum the head
    /// cannot count on hearing the release, and polls.
    pub(crate) fn marked(&self, until: Instant, on_quorum: bool) {
        self.waiters.with_queue(&self.key, |queue| {
            queue.marked_until = on_quorum.then_some(until);
        });
    }

    /// Subscribes the queue to the key's channel on every node, if it is not yet: needed
    /// once another client holds the key, whose release only the nodes can tell about.
    pub(crate) async fn subscribe(&self, nodes: &[Arc<Node>], timeout: Duration) {
        self.waiters.subscribe(&self.key, nodes, timeout).await;
    }

    /// Reads this ticket's queue (false if it is gone).
    fn queue(&self, f: impl FnOnce(&Queue) -> bool) -> bool {
        self.waiters
            .with_queue(&self.key, |q| f(q))
            .unwrap_or(false)
    }

    /// Tells the waiters behind that the name's work is done (its record was found).
    pub(crate) fn done(&self) {
        self.waiters.done(&self.key);
    }

    /// Forgets the release messages so far: called right before an attempt, which sees
    /// their effect anyway. Messages that come during the attempt count towards the next
    /// wake-up, so a release that the attempt just missed still wakes the head.
    pub(crate) fn attempting(&self) {
        self.waiters.with_queue(&self.key, |queue| {
            queue.notes = 0;
            queue.go = false;
        });
    }

    /// Leaves the queue with the lock: the next waiter waits for its release.
    pub(crate) fn acquired(mut self, valid_until: Instant) {
        self.acquired = Some(valid_until);
    }

    /// This waiter found the key held, for at least `remaining` (if known).
    pub(crate) fn busy(&self, remaining: Option<Duration>) {
        let until = remaining.map(|r| crate::quorum::later(Instant::now(), r));
        self.waiters
            .with_queue(&self.key, |queue| queue.holder_until = until);
    }

    /// Waits until it is this waiter's turn to attempt: as the head, until a quorum of
    /// release messages or the `backstop` delay; behind others, until it is the head and
    /// then the same. Returns early at `deadline`.
    pub(crate) async fn wait(&self, backstop: Duration, deadline: Option<Instant>) {
        let far = || crate::quorum::later(Instant::now(), Duration::from_secs(3600));
        let end = deadline.unwrap_or_else(far);
        // When the backstop runs out, counted from when this waiter is the head.
        let mut backstop_at = None;
        loop {
            let now = Instant::now();
            if now >= end {
                return;
            }
            // The head goes when told to, or at once when a waiter found the name's record.
            let (head, go, holder_until) = self
                .waiters
                .with_queue(&self.key, |q| {
                    let head = q.order.front().is_some_and(|(head, _)| *head == self.id);
                    // Told of the release: by this client (its own lock) or by the nodes.
                    let told = !q.subscribed || (q.listening && q.marked_until.is_some());
                    (head, q.go || q.done, q.holder_until.filter(|_| told))
                })
                .unwrap_or((false, false, None));
            if head && go {
                return;
            }
            let until = if head {
                let at = *backstop_at.get_or_insert_with(|| {
                    let backstop = crate::quorum::later(now, backstop);
                    holder_until.map_or(backstop, |h| h.max(backstop))
                });
                if now >= at {
                    return;
                }
                at.min(end)
            } else {
                end
            };
            tokio::select! {
                () = self.notify.notified() => {}
                () = tokio::time::sleep_until(tokio::time::Instant::from_std(until)) => {}
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        crate::metrics::gauge(crate::metrics::Gauge::Waiting, crate::metrics::Move::Down);
        self.waiters.leave(&self.key, self.id, self.acquired);
    }
}

/// A random id of 16 hex digits, at the start of this client's lock values and in its
/// release messages (a fixed one if the OS generator fails, but then no lock value can be
/// made either).
fn client_id() -> [u8; CLIENT_ID_LEN] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let r = getrandom::u64().unwrap_or(0);
    let mut id = [0; CLIENT_ID_LEN];
    for (i, digit) in id.iter_mut().enumerate() {
        *digit = HEX[usize::try_from((r >> (4 * i)) & 0xf).unwrap_or(0)];
    }
    id
}
