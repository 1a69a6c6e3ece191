//! One simulated client's nodes: the crate's [`Nodes`] seam over simulated servers, so
//! that the crate's operations run unchanged. Each node connects on first use (and after
//! its process changed), judging it as a real connect does (the check's request, the
//! crate's `judging::settle` and `judging::keep` over the simulated connection), keeps
//! it out of deciding rounds while its quarantine lasts, and is checked again by
//! [`SimNodes::check`] (the background check, node by node).
//!
//! ```text
//! send(request) -> per node: [landing of the round before] -> connect (judge) if needed
//!                  -> quarantined and deciding? Quarantined : Call::run(SimConn)
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use redis::{RedisResult, Value};

use super::conn::{Link, SimConn};
use super::server::Server;
use crate::error::NodeError;
use crate::landing::LandingState;
use crate::node::clocks::NodeClocks;
use crate::node::judging::{self, LedgerRead};
use crate::node::loss::{LedgerKeys, NodeLoss, Role, ServerInfo};
use crate::node::{Horizon, Whole};
use crate::quorum::NodeMask;
use crate::round::{InFlight, Nodes, Plan, Purpose, Round};
use crate::scripts::{Call, Request};

/// What one client knows of one node.
#[derive(Default)]
struct View {
    conn: Option<SimConn>,
    loss: NodeLoss,
    run_id: Option<String>,
}

/// One node as one client sees it.
pub(crate) struct SimNode {
    index: usize,
    server: Arc<Mutex<Server>>,
    link: Arc<Link>,
    view: Mutex<View>,
    horizon: Arc<Horizon>,
    clocks: Arc<NodeClocks>,
    keys: LedgerKeys,
    /// Whether the restart quarantine is on.
    judging: bool,
}

impl SimNode {
    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection to the server's current process: the open one, or a new one,
    /// judged first (as the crate's connect does).
    async fn connection(&self) -> Result<SimConn, NodeError> {
        let generation = self
            .server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .generation();
        if let Some(conn) = self
            .view()
            .conn
            .clone()
            .filter(|c| c.generation == generation)
        {
            return Ok(conn);
        }
        let conn = SimConn {
            server: Arc::clone(&self.server),
            link: Arc::clone(&self.link),
            generation,
        };
        let info = self.judge(&conn, true).await?;
        let mut view = self.view();
        view.run_id = (!info.run_id.is_empty()).then(|| info.run_id.clone());
        view.conn = Some(conn.clone());
        Ok(conn)
    }

    /// A check over `conn` (a connect's handshake when `connecting`): `INFO` and the
    /// ledger read, judged, kept. What `INFO` said.
    async fn judge(&self, conn: &SimConn, connecting: bool) -> Result<ServerInfo, NodeError> {
        let pipe = judging::check_pipe(self.judging.then(|| (&self.keys, self.horizon.own_ms())));
        let replies: Vec<RedisResult<Value>> = pipe.query_async(&mut conn.clone()).await?;
        let received = crate::clock::now();
        let mut replies = replies.into_iter();
        let (info, _memory) = judging::check_info(&mut replies);
        if let Role::Other(role) = &info.role {
            return Err(NodeError::NotMaster { role: role.clone() });
        }
        if connecting && let Some(us) = info.time_us {
            self.clocks.record(self.index, us, received);
        }
        if !self.judging {
            return Ok(info);
        }
        let read = LedgerRead::parse(replies.next(), replies.next())?;
        let known = self.view().run_id.clone();
        let send = |cmd: redis::Cmd| {
            let mut conn = conn.clone();
            async move { cmd.query_async::<Value>(&mut conn).await }
        };
        let seen = (&info, known.as_deref());
        let settled = judging::settle(
            &self.keys,
            seen,
            read,
            (received, self.horizon.length()),
            send,
        )
        .await?;
        judging::keep(&self.horizon, self.index, &mut self.view().loss, &settled);
        Ok(info)
    }

    /// The background check: over the open connection, or a connect.
    pub(crate) async fn check(&self) -> Result<(), NodeError> {
        let open = self.view().conn.clone();
        let generation = self
            .server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .generation();
        match open.filter(|c| c.generation == generation) {
            Some(conn) => self.judge(&conn, false).await.map(|_| ()),
            None => self.connection().await.map(|_| ()),
        }
    }

    /// How much longer the node is quarantined, as an error for a deciding call.
    fn quarantined(&self) -> Option<NodeError> {
        let view = self.view();
        let (remaining, reason) = view.loss.quarantine(crate::clock::now(), &self.horizon)?;
        Some(NodeError::Quarantined { remaining, reason })
    }

    /// Runs `call` on the node (after the landing of node's call in `after`, if any):
    /// refused at once while quarantined, for a deciding call.
    async fn run(
        self: Arc<Self>,
        call: Arc<Call>,
        deciding: bool,
        marks: Option<Arc<LandingState>>,
    ) -> Result<Value, NodeError> {
        let landed = Landed(marks.as_ref(), self.index);
        let mut conn = self.connection().await?;
        if deciding && let Some(refused) = self.quarantined() {
            return Err(refused);
        }
        landed.now();
        call.run(&mut conn).await.map_err(NodeError::from)
    }
}

/// Marks a node's call landed once its command is on the connection, or when it ends.
struct Landed<'a>(Option<&'a Arc<LandingState>>, usize);

impl Landed<'_> {
    fn now(&self) {
        if let Some(marks) = self.0 {
            marks.sent(self.1);
        }
    }
}

impl Drop for Landed<'_> {
    fn drop(&mut self) {
        if let Some(marks) = self.0 {
            marks.done(self.1);
        }
    }
}

/// A call in flight to a simulated node.
pub(crate) struct SimCall {
    index: usize,
    future: Pin<Box<dyn Future<Output = Result<Value, NodeError>> + Send>>,
}

impl Future for SimCall {
    type Output = Result<Value, NodeError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.future.as_mut().poll(cx)
    }
}

impl InFlight for SimCall {
    fn index(&self) -> usize {
        self.index
    }

    /// A simulated call is one future of several steps (the request's way, the server,
    /// the reply's way, a follow-up), as the crate's running calls are.
    fn takes_steps(&self) -> bool {
        true
    }

    fn timed_out(&self, _sent_at: Instant) {}
}

/// One client's simulated nodes (see the module docs).
pub(crate) struct SimNodes {
    nodes: Vec<Arc<SimNode>>,
    labels: Vec<String>,
}

impl SimNodes {
    /// A client's view of `servers`, over its `links` to them, with its `horizon` and
    /// `clocks`; `judging`: the restart quarantine on.
    pub(crate) fn new(
        servers: &[Arc<Mutex<Server>>],
        links: Vec<Arc<Link>>,
        (horizon, clocks): (Arc<Horizon>, Arc<NodeClocks>),
        prefix: &[u8],
        judging: bool,
    ) -> Self {
        let nodes = servers
            .iter()
            .zip(links)
            .enumerate()
            .map(|(index, (server, link))| {
                Arc::new(SimNode {
                    index,
                    server: Arc::clone(server),
                    link,
                    view: Mutex::default(),
                    horizon: Arc::clone(&horizon),
                    clocks: Arc::clone(&clocks),
                    keys: LedgerKeys::new(prefix),
                    judging,
                })
            })
            .collect();
        let labels = (0..servers.len()).map(|i| format!("sim{i}:6379")).collect();
        Self { nodes, labels }
    }

    /// Whether this client keeps node `i` out of deciding rounds now (quarantined).
    pub(crate) fn keeps_out(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| n.quarantined().is_some())
    }

    /// Whether this client has a connection open to node `i`'s current process (a node
    /// it has still to connect to answers a round only after the connect's handshake).
    pub(crate) fn connected(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| {
            let generation = n
                .server
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .generation();
            n.view()
                .conn
                .as_ref()
                .is_some_and(|c| c.generation == generation)
        })
    }

    /// A check of every node, at once (before and after a schedule).
    pub(crate) async fn check_all(&self) {
        let checks = (0..self.nodes.len()).map(|i| self.check(i));
        let _ = futures_util::future::join_all(checks).await;
    }

    /// The check of node `i`, bounded by the crate's connect timeout, as the crate's
    /// background check is (a partitioned node's check gives up; the next one tries
    /// again). The background check runs it per node, as `Node::watch` does: a node
    /// whose checks time out delays no other node's.
    pub(crate) async fn check(&self, i: usize) {
        if let Some(node) = self.nodes.get(i) {
            let timeout = crate::defaults::DEFAULT_CONNECT_TIMEOUT;
            let _ = tokio::time::timeout(timeout, node.check()).await;
        }
    }
}

impl Nodes for SimNodes {
    type Call = SimCall;

    fn count(&self) -> usize {
        self.nodes.len()
    }

    fn label(&self, i: usize) -> &str {
        self.labels.get(i).map_or("?", String::as_str)
    }

    fn send(&self, request: &Request<'_>, plan: Plan<'_>) -> Round<SimCall> {
        let n = self.nodes.len();
        let (deciding, after) = match plan.purpose {
            Purpose::Decide => (true, None),
            Purpose::Everywhere { after } => (false, after.cloned()),
        };
        let landing =
            deciding.then(|| LandingState::new(NodeMask::matching(n, |i| !plan.skip.contains(i))));
        let call = Arc::new(request.call());
        let deadline = plan.deadline;
        let calls = self
            .nodes
            .iter()
            .filter(|node| !plan.skip.contains(node.index))
            .map(|node| {
                let (node, call, marks) = (Arc::clone(node), Arc::clone(&call), landing.clone());
                let after = after.clone();
                let index = node.index;
                let future = async move {
                    if let Some(after) = after {
                        after.wait(index, deadline).await;
                    }
                    node.run(call, deciding, marks).await
                };
                SimCall {
                    index,
                    future: Box::pin(future),
                }
            })
            .collect();
        Round::of(calls, deadline, landing, crate::clock::now())
    }

    fn notifications_refused(&self, _i: usize, _message: &str) {}

    fn whole(&self, i: usize) -> Whole {
        self.nodes
            .get(i)
            .map_or(Whole::Unknown, |n| n.view().loss.whole())
    }

    /// Connects every node not connected yet (the crate's client starts its connects when
    /// built; a simulated one when asked), one at a time as they settle, until `enough`.
    async fn settle(&self, enough: impl Fn() -> bool + Send) {
        let mut settling: futures_util::stream::FuturesUnordered<_> =
            self.nodes.iter().map(|node| node.connection()).collect();
        while futures_util::StreamExt::next(&mut settling).await.is_some() {
            if enough() {
                return;
            }
        }
    }

    async fn announce(&self, ttl_ms: u64, deadline: Instant) -> Vec<Result<(), NodeError>> {
        let deadline = tokio::time::Instant::from_std(deadline);
        let each = self.nodes.iter().map(|node| async move {
            let raise = async {
                let mut conn = node.connection().await?;
                let keys = (&node.keys, &mut conn);
                judging::raise_horizon(keys, ttl_ms, &node.horizon, node.index).await
            };
            tokio::time::timeout_at(deadline, raise)
                .await
                .unwrap_or(Err(NodeError::Timeout))
        });
        futures_util::future::join_all(each).await
    }
}
