//! The node's own pipelined connection over plain TCP: every lock of the client shares
//! it, as they would share a `redis::aio::MultiplexedConnection`, at a fraction of the cost
//! per call. A request to one node only is written by its caller when nothing else is on
//! its way (no task hop on an idle connection). Otherwise it is appended to one buffer
//! that the connection's task writes in one go: at once when few replies are still to
//! come, else right after it hands out the next replies (many requests per write under
//! load), or, for rounds to one node, as soon as a few requests wait. A round to several
//! nodes leaves the writing to their tasks, so the writes run side by side rather than
//! one after another on the caller's thread. The releases of one write go out as one
//! script call (see `merged`). Replies are matched to requests in order, each into a
//! small shared slot the caller waits on; a caller that stops waiting leaves its slot,
//! and the reply is dropped when it arrives. Here are the connection's API and who writes
//! a request when; the task that writes and reads is in `task`, what it shares with the
//! callers in `state`.
//!
//! Nodes reached over TLS or a Unix socket, with RESP3 asked for, or in a cluster use
//! redis-rs's connections instead, which apply the TCP settings of the node's
//! `redis::ConnectionInfo` themselves. This one applies its keep-alive, linger and TCP
//! user timeout, and always sets `TCP_NODELAY` (a lock's round trip must not wait for
//! Nagle's algorithm; see `open.rs`).
//!
//! ```text
//! caller:  send(SET ...)  --alone, idle-----> try_write now                 --> await slot
//!                         --shallow, or 8th--> append to `out`, wake the task --> await slot
//!                         --deep-------------> append to `out`                --> await slot
//!          release(...)   --not idle---------> join the write's merged call   --> await slot
//! task:    readable -> parse replies -> fill slots in order -> write what `out` holds
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // A plain `redis://` node uses this connection; nothing to configure.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?;
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use redis::Value;
use tokio::io::AsyncRead;
use tokio::sync::Notify;

mod merged;
mod open;
mod slot;
mod state;
mod task;

pub(crate) use merged::Unsent;
pub(crate) use open::{handshake, plain_tcp};

use merged::{Keys, MAX_MERGED, Merged};
use slot::Slot;
pub(crate) use slot::{Replies, Reply};
use state::{Broken, Waiter, WireShared, WireState, Writer};
#[cfg(test)]
use task::MAX_IDLE_BUFFER;
use task::{drive, write};

use crate::scripts::Call;

/// With fewer replies than this still to come, a request wakes the task to write it now;
/// with more, it waits for the task to write it after handing out the next replies.
const SHALLOW: usize = 4;

/// With many replies still to come, a round to one node has the task woken to write once
/// this many requests wait, rather than at the next replies: the server starts on the
/// first requests of a burst while the callers make the rest, instead of taking the whole
/// burst at once after a wait (a round trip saved under load). Rounds to several nodes
/// leave the writes for the next replies, where their servers' CPU, not the wait, bounds
/// them: fewer, larger writes cost the servers less.
const CHUNK: usize = 16;

/// Who writes a request on a connection that has nothing else on its way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writes {
    /// The caller, at once (no task hop): for a round to one node.
    Caller,
    /// The connection's task: for a round to several nodes, so that their writes run side
    /// by side instead of one after another on the caller's thread.
    Task,
}

/// A handle on the connection; clones share it. When the last handle is gone the task
/// closes the socket (requests still out then fail).
#[derive(Clone)]
pub(crate) struct Wire(Arc<Handle>);

struct Handle(Arc<WireShared>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.state().closed = true;
        self.0.wake.notify_one();
    }
}

impl WireState {
    /// Whether the caller writes its request itself, at once: a round to one node
    /// (`Writes::Caller`) on an idle connection (no reply to come, nothing left to write).
    fn caller_writes(&self, writes: Writes, in_flight: usize) -> bool {
        writes == Writes::Caller && in_flight == 0 && self.out.is_empty() && !self.task_writing
    }
}

impl Wire {
    /// Connects to `host:port` with the node's TCP `settings` (keep-alive, linger and user
    /// timeout as given, `TCP_NODELAY` always on: see [`open`]), with no handshake (the
    /// caller sends `AUTH` and the like as its first requests), and starts the
    /// connection's task. Must be called within a tokio runtime.
    pub(crate) async fn connect(
        host: &str,
        port: u16,
        settings: &redis::io::tcp::TcpSettings,
    ) -> io::Result<Self> {
        let stream = open::tcp_stream(host, port, settings).await?;
        let (reading, writing) = stream.into_split();
        Ok(Self::over(reading, writing))
    }

    /// A connection over a transport: replies are read from `reading`, requests written
    /// to `writing`. Starts the connection's task; must be called within a tokio runtime.
    fn over(reading: impl AsyncRead + Unpin + Send + 'static, writing: impl Writer) -> Self {
        let shared = Arc::new(WireShared {
            writing: Box::new(writing),
            state: Mutex::new(WireState::default()),
            wake: Notify::new(),
        });
        tokio::spawn(drive(Arc::clone(&shared), reading));
        Self(Arc::new(Handle(shared)))
    }

    /// Sends `packed` (one or more commands, as RESP) and expects `replies` replies; the
    /// slot they fill.
    fn send(&self, packed: &[u8], replies: usize, writes: Writes, key: Option<&[u8]>) -> Arc<Slot> {
        let slot = Arc::new(Slot::new(replies));
        let Some(mut st) = self.open(&slot) else {
            return slot;
        };
        let in_flight = st.waiting.len();
        for _ in 0..replies {
            st.waiting.push_back(Waiter::Reply(Arc::clone(&slot)));
        }
        // A release that joins the call merging before this request must not overtake it.
        match (key, &mut st.merging) {
            (Some(key), Some((_, _, after))) => after.insert(key),
            (None, Some(_)) => st.close_merging(),
            (_, None) => {}
        }
        self.enqueue(st, packed, in_flight, writes);
        slot
    }

    /// The connection's state, to send the request whose replies go to `slot`; `None`
    /// when it is broken (`slot` then failed with why).
    fn open(&self, slot: &Slot) -> Option<MutexGuard<'_, WireState>> {
        let st = self.0.0.state();
        match &st.broken {
            Some(broken) => {
                slot.fail(broken.error());
                None
            }
            None => Some(st),
        }
    }

    /// Puts `packed` on its way, its replies' places taken behind `in_flight` others. On an
    /// idle connection a caller that `Writes::Caller` writes itself, sparing a task
    /// wake-up. With many replies still to come, the task writes `out` when it hands them
    /// out (many requests per write); with few, it is woken to write now.
    fn enqueue(
        &self,
        mut st: MutexGuard<'_, WireState>,
        packed: &[u8],
        in_flight: usize,
        writes: Writes,
    ) {
        let shared = &self.0.0;
        let mut rest = packed;
        if st.caller_writes(writes, in_flight) {
            match write(&*shared.writing, packed) {
                Ok(n) => rest = &packed[n..],
                Err(why) => {
                    drop(st);
                    shared.break_with(why);
                    return;
                }
            }
        }
        if rest.is_empty() {
            return;
        }
        st.out.extend_from_slice(rest);
        st.queued += 1;
        self.wake_if_due(st, in_flight, writes);
    }

    /// Wakes the task to write now when fewer than [`SHALLOW`] replies are still to come,
    /// or, for rounds to one node, when [`CHUNK`] requests wait.
    fn wake_if_due(&self, mut st: MutexGuard<'_, WireState>, in_flight: usize, writes: Writes) {
        // (A task still writing earlier bytes writes these as soon as the socket takes more.)
        let chunk = writes == Writes::Caller && st.queued >= CHUNK && !st.task_writing;
        let due = in_flight < SHALLOW || chunk;
        if due && !st.write_asked {
            st.write_asked = true;
            drop(st);
            self.0.0.wake.notify_one();
        }
    }

    /// Sends the release `call`: alone if the caller finds the connection idle; otherwise
    /// merged with the other releases of the connection's next write into one call (see
    /// `merged`), each answered as it would have been alone.
    pub(crate) fn release(&self, call: &Arc<Call>, writes: Writes) -> Reply {
        let slot = Arc::new(Slot::new(1));
        let Some(mut st) = self.open(&slot) else {
            return Reply(slot);
        };
        let in_flight = st.waiting.len();
        if st.caller_writes(writes, in_flight) {
            st.waiting.push_back(Waiter::Reply(Arc::clone(&slot)));
            self.enqueue(st, call.packed(), in_flight, writes);
            return Reply(slot);
        }
        if st
            .merging
            .as_ref()
            .is_some_and(|(_, _, after)| after.may_hold(call.key()))
        {
            // A request sent since may be about this key: the release goes after it.
            st.close_merging();
        }
        let merged = match &st.merging {
            Some((_, merged, _)) => Arc::clone(merged),
            None => {
                let merged = Arc::new(Merged::default());
                st.merging = Some((st.out.len(), Arc::clone(&merged), Keys::default()));
                st.waiting.push_back(Waiter::Merged(Arc::clone(&merged)));
                merged
            }
        };
        if merged.join(call, Arc::clone(&slot)) >= MAX_MERGED {
            st.close_merging();
        }
        st.queued += 1;
        self.wake_if_due(st, in_flight, writes);
        Reply(slot)
    }

    /// Where the merged releases not written yet go if the connection breaks (the node
    /// sends them on its next connection); without it they fail with the connection.
    pub(crate) fn on_unsent(&self, on_unsent: impl FnOnce(Vec<Unsent>) + Send + 'static) {
        let mut st = self.0.0.state();
        if st.broken.is_none() {
            st.on_unsent = Some(Box::new(on_unsent));
        }
    }

    /// Closes the connection now: nothing more is written (what was not written yet is
    /// dropped), and every request still out fails. For a connection that is replaced;
    /// one replaced because its node stopped answering (`timed_out`) fails them as timed
    /// out, which is what happened to them.
    pub(crate) fn close(&self, timed_out: bool) {
        let shared = &self.0.0;
        shared.break_with(if timed_out {
            Broken::Io(
                io::ErrorKind::TimedOut,
                "the connection was dropped after consecutive timeouts".into(),
            )
        } else {
            Broken::Io(
                io::ErrorKind::ConnectionAborted,
                "the connection was dropped (a broken reply, or a failover)".into(),
            )
        });
        shared.wake.notify_one();
    }

    /// Sends one command; its reply, a server error being `Err`. With `Writes::Caller`, the
    /// caller writes it itself if the connection is idle.
    pub(crate) fn request(&self, packed: &[u8], writes: Writes) -> Reply {
        Reply(self.send(packed, 1, writes, None))
    }

    /// Sends `commands` commands at once about `key`, as [`request`](Self::request) sends
    /// one: their replies as one array, server errors among them as values (a reply of one
    /// command as itself). Releases sent later may still go out before it, unless theirs
    /// is `key`.
    pub(crate) fn request_all(
        &self,
        packed: &[u8],
        commands: usize,
        writes: Writes,
        key: &[u8],
    ) -> Reply {
        Reply(self.send(packed, commands, writes, Some(key)))
    }

    /// Sends `commands` commands at once; their replies, errors among them as values.
    pub(crate) fn pipeline(&self, packed: &[u8], commands: usize) -> Replies {
        Replies(self.send(packed, commands, Writes::Caller, None))
    }
}

impl redis::aio::ConnectionLike for Wire {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        let reply = self.request(&cmd.get_packed_command(), Writes::Caller);
        Box::pin(reply)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        let replies = self.pipeline(&pipeline.get_packed_pipeline(), offset + count);
        Box::pin(async move {
            let mut values = replies.await?;
            Ok(values.split_off(offset.min(values.len())))
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "wire_merged_tests.rs"]
mod merged_tests;
