//! One node's pub/sub connection for the waiters: subscribes and unsubscribes lock keys
//! in the order asked, hands release messages to the registry, and reconnects (renewing
//! every subscription) after a failure. While it is down, it answers subscriptions at once
//! with the error, so no waiter waits on the node: they poll it instead.
//!
//! ```text
//! connect -> SUBSCRIBE every key kept -> wake the heads -> serve (requests, messages)
//!    ^                                                          |
//!    \------------------ the connection broke ------------------/
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let held = redlock.lock("job:1").await?;
//! // Another client's waiter for "job:1" subscribes on the node and is woken by this release.
//! let _ = redlock.unlock(&held).await;
//! # Ok(()) }
//! ```

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;

use crate::error::NodeError;
use crate::node::Node;

/// A request to a node's subscription manager.
#[derive(Debug)]
pub(super) enum Subscription {
    Subscribe(Box<[u8]>, oneshot::Sender<Result<(), NodeError>>),
    Unsubscribe(Box<[u8]>),
}

/// Whom a subscription manager tells what it hears: the waiters of its client.
pub(super) trait Listener: Send + Sync {
    /// What the client's own release messages carry (they are not passed on).
    fn client_id(&self) -> &[u8];
    /// A node said `key` was released.
    fn released(&self, key: &[u8]);
    /// The connection is (back) up: messages may have been lost while it was down.
    fn reconnected(&self);
}

/// Shortest wait before reconnecting a pub/sub connection after a failure.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest wait before reconnecting a pub/sub connection after repeated failures.
const BACKOFF_MAX: Duration = Duration::from_millis(1_000);

/// A node's subscription manager (see the module docs).
pub(super) struct PubSub {
    waiters: Weak<dyn Listener>,
    node: Arc<Node>,
    requests: UnboundedReceiver<Subscription>,
    /// The keys subscribed (or to subscribe once connected).
    subscribed: HashSet<Box<[u8]>>,
    /// A refused `SUBSCRIBE` was logged (once per manager).
    refused_logged: bool,
}

/// Why a connection's service ended.
enum Ended {
    /// The connection broke: reconnect.
    Broken,
    /// The client is gone: the manager ends.
    ClientGone,
}

impl PubSub {
    pub(super) fn new(
        waiters: Weak<dyn Listener>,
        node: Arc<Node>,
        requests: UnboundedReceiver<Subscription>,
    ) -> Self {
        Self {
            waiters,
            node,
            requests,
            subscribed: HashSet::new(),
            refused_logged: false,
        }
    }

    /// Runs until the client is gone.
    pub(super) async fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let (sink, stream) = match self.connect().await {
                Ok(pubsub) => pubsub,
                Err(error) => {
                    tracing::debug!(node = %self.node.label(), %error, "redlock pub/sub connect failed: waiters poll this node");
                    if let Ended::ClientGone = self.down(&error, backoff).await {
                        return;
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            };
            backoff = BACKOFF_MIN;
            if let Ended::ClientGone = self.serve(sink, stream).await {
                return;
            }
        }
    }

    /// A pub/sub connection to the node, with every key kept subscribed again.
    async fn connect(&mut self) -> Result<(PubSubSink, PubSubStream), NodeError> {
        let client = self
            .node
            .client()
            .ok_or_else(|| NodeError::Connection("the master is not known yet".into()))?;
        let pubsub = tokio::time::timeout(self.node.connect_timeout(), client.get_async_pubsub())
            .await
            .map_err(|_| NodeError::Timeout)?
            .map_err(NodeError::from)?;
        let (mut sink, stream) = pubsub.split();
        if !self.subscribed.is_empty() {
            let keys: Vec<&[u8]> = self.subscribed.iter().map(|k| &**k).collect();
            if let Err(e) = sink.subscribe(keys).await {
                self.refused(&NodeError::from(e));
            }
        }
        Ok((sink, stream))
    }

    /// While the node is down (for `backoff`), answers subscriptions at once with `error`
    /// so no waiter waits on this node.
    async fn down(&mut self, error: &NodeError, backoff: Duration) -> Ended {
        let pause = tokio::time::sleep(backoff);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => return Ended::Broken,
                request = self.requests.recv() => match request {
                    None => return Ended::ClientGone,
                    Some(Subscription::Subscribe(key, reply)) => {
                        self.subscribed.insert(key);
                        let _ = reply.send(Err(error.clone()));
                    }
                    Some(Subscription::Unsubscribe(key)) => {
                        self.subscribed.remove(&key);
                    }
                },
            }
        }
    }

    /// Serves requests and messages on a connection until it breaks. Wakes every head
    /// first: messages may have been lost while it was down.
    async fn serve(&mut self, mut sink: PubSubSink, mut stream: PubSubStream) -> Ended {
        match self.waiters.upgrade() {
            Some(w) => w.reconnected(),
            None => return Ended::ClientGone,
        }
        loop {
            tokio::select! {
                request = self.requests.recv() => match request {
                    None => return Ended::ClientGone,
                    Some(request) => self.handle(request, &mut sink).await,
                },
                message = stream.next() => {
                    // None: the connection broke; reconnect and renew the subscriptions.
                    let Some(message) = message else { return Ended::Broken };
                    let Some(w) = self.waiters.upgrade() else { return Ended::ClientGone };
                    let ours = message.get_payload_bytes() == w.client_id();
                    if let (false, Ok(key)) = (ours, message.get_channel::<Vec<u8>>()) {
                        w.released(&key);
                    }
                }
            }
        }
    }

    /// Carries out a subscription request on a live connection.
    async fn handle(&mut self, request: Subscription, sink: &mut PubSubSink) {
        match request {
            Subscription::Subscribe(key, reply) => {
                let result = if self.subscribed.contains(&key) {
                    Ok(())
                } else {
                    let result = sink.subscribe(&*key).await.map_err(NodeError::from);
                    self.subscribed.insert(key);
                    result
                };
                if let Err(error) = &result {
                    self.refused(error);
                }
                let _ = reply.send(result);
            }
            Subscription::Unsubscribe(key) => {
                if self.subscribed.remove(&key) {
                    let _ = sink.unsubscribe(&*key).await;
                }
            }
        }
    }

    /// Logs, once per manager, that the node refused or failed a `SUBSCRIBE`.
    fn refused(&mut self, error: &NodeError) {
        if !std::mem::replace(&mut self.refused_logged, true) {
            tracing::warn!(
                node = %self.node.label(),
                %error,
                "redlock node refused SUBSCRIBE: waiters fall back to polling it (grant the \
                 client SUBSCRIBE on the lock channels to wake waiters on release)"
            );
        }
    }
}
