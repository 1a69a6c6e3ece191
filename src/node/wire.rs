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
//! and the reply is dropped when it arrives.
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

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use redis::{RedisError, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

use super::resp;

mod merged;
mod open;
mod slot;

pub(crate) use merged::Unsent;
pub(crate) use open::{handshake, plain_tcp};

use merged::{Keys, MAX_MERGED, Merged};
use slot::Slot;
pub(crate) use slot::{Replies, Reply};

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

/// How much the task reads at most per read.
const READ_CHUNK: usize = 16 * 1024;

/// The most memory a write or read buffer keeps once it is empty again: after a large
/// request or reply it is given back, so one large completion record does not stay in the
/// connection's buffers for its whole life.
const MAX_IDLE_BUFFER: usize = 4 * READ_CHUNK;

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

/// The writing side of a connection's transport, written without waiting: by the task,
/// and by a caller that finds the connection idle. A TCP socket's writing half in use;
/// an in-memory pipe in the tests.
pub(crate) trait Writer: Send + Sync + 'static {
    /// Writes what the transport takes now (`WouldBlock` when it takes nothing).
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize>;
    /// Ready once the transport may take more bytes.
    fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

impl Writer for OwnedWriteHalf {
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        OwnedWriteHalf::try_write(self, bytes)
    }

    fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let stream: &TcpStream = self.as_ref();
        stream.poll_write_ready(cx)
    }
}

struct WireShared {
    /// The transport's writing side: the task writes, and so does a caller that finds the
    /// connection idle (under the state lock, with nothing left unwritten).
    writing: Box<dyn Writer>,
    state: Mutex<WireState>,
    /// Wakes the task: there is something to write, or it should stop.
    wake: Notify,
}

#[derive(Default)]
struct WireState {
    /// Requests not yet handed to the task for writing.
    out: Vec<u8>,
    /// Where each reply still to come goes, in order (a request of n commands has n).
    waiting: VecDeque<Waiter>,
    /// The releases that join one call at this place in `out`, and the keys of the
    /// requests sent after it (see `merged`).
    merging: Option<(usize, Arc<Merged>, Keys)>,
    /// Earlier such calls that are full, with their places in `out`, in order.
    merged: Vec<(usize, Arc<Merged>)>,
    /// The task was woken to write `out` and has not taken it yet.
    write_asked: bool,
    /// How many requests `out` holds (each release of a merged call counted).
    queued: usize,
    /// The task holds bytes it took from `out` and has not fully written.
    task_writing: bool,
    /// Why the connection can no longer be used.
    broken: Option<Broken>,
    /// Where the releases not written yet go when it breaks (see [`Wire::on_unsent`]).
    on_unsent: Option<OnUnsent>,
    /// Every handle is gone.
    closed: bool,
}

impl WireState {
    /// Whether the caller writes its request itself, at once: a round to one node
    /// (`Writes::Caller`) on an idle connection (no reply to come, nothing left to write).
    fn caller_writes(&self, writes: Writes, in_flight: usize) -> bool {
        writes == Writes::Caller && in_flight == 0 && self.out.is_empty() && !self.task_writing
    }
}

/// Takes the releases a connection had not written when it broke.
type OnUnsent = Box<dyn FnOnce(Vec<Unsent>) + Send>;

/// Where a reply goes.
enum Waiter {
    /// To the slot of its request.
    Reply(Arc<Slot>),
    /// To the releases of a merged call.
    Merged(Arc<Merged>),
}

/// Why a connection broke, kept to fail later requests with.
#[derive(Clone)]
enum Broken {
    Io(io::ErrorKind, String),
    Protocol(String),
}

impl Broken {
    fn error(&self) -> RedisError {
        match self {
            Self::Io(kind, message) => RedisError::from(io::Error::new(*kind, message.clone())),
            Self::Protocol(message) => RedisError::from((
                redis::ErrorKind::Parse,
                "the server's reply is not RESP2",
                message.clone(),
            )),
        }
    }

    fn io(e: &io::Error) -> Self {
        Self::Io(e.kind(), e.to_string())
    }
}

impl WireShared {
    fn state(&self) -> MutexGuard<'_, WireState> {
        // Every change leaves the state consistent, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the connection broken and fails every request still out, except merged
    /// releases not written yet: they go where [`Wire::on_unsent`] said (or fail too).
    fn break_with(&self, why: Broken) {
        let (waiting, on_unsent) = {
            let mut st = self.state();
            if st.broken.is_none() {
                st.broken = Some(why.clone());
            }
            st.out = Vec::new();
            st.merging = None;
            st.merged = Vec::new();
            (std::mem::take(&mut st.waiting), st.on_unsent.take())
        };
        let mut unsent = Vec::new();
        let mut last: Option<Arc<Slot>> = None;
        for waiter in waiting {
            match waiter {
                // The slots of one request are next to each other: fail each once.
                Waiter::Reply(slot) if last.as_ref().is_some_and(|l| Arc::ptr_eq(l, &slot)) => {}
                Waiter::Reply(slot) => {
                    slot.fail(why.error());
                    last = Some(slot);
                }
                Waiter::Merged(merged) => merged.fail(&why.error(), &mut unsent),
            }
        }
        match on_unsent {
            _ if unsent.is_empty() => {}
            Some(on_unsent) => on_unsent(unsent),
            None => {
                for release in unsent {
                    release.answer(Err(why.error()));
                }
            }
        }
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
            (None, Some(_)) => close_merging(&mut st),
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
            close_merging(&mut st);
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
            close_merging(&mut st);
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

/// The connection's task: reads and hands out replies, writes what callers left in `out`
/// (outside the lock; a caller writes only while the task holds nothing unwritten), and
/// closes the socket when every handle is gone.
async fn drive(shared: Arc<WireShared>, mut reading: impl AsyncRead + Unpin) {
    // However the task ends (even dropped by a runtime shutting down), requests fail at
    // once from then on, so the node reconnects.
    let _stopped = Stopped(&shared);
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    // How far the reply at the start of `buf` was read, while it is incomplete.
    let mut scan = resp::Scan::default();
    // What the task took from `out` and has not fully written yet.
    let mut unwritten: Vec<u8> = Vec::new();
    // Where `out` goes while merged releases are put in their places.
    let mut spare: Vec<u8> = Vec::new();
    loop {
        if !take_out(&shared, &mut unwritten, &mut spare) {
            break;
        }
        if let Err(why) = write_some(&shared, &mut unwritten) {
            shared.break_with(why);
            break;
        }
        buf.reserve(READ_CHUNK);
        tokio::select! {
            biased;
            read = reading.read_buf(&mut buf) => {
                let why = match read {
                    Ok(0) => Some(Broken::Io(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection".into(),
                    )),
                    Ok(_) => None,
                    Err(e) => Some(Broken::io(&e)),
                };
                if let Some(why) = why.or_else(|| hand_out(&shared, &mut buf, &mut scan).err()) {
                    shared.break_with(why);
                    break;
                }
            }
            ready = std::future::poll_fn(|cx| shared.writing.poll_writable(cx)), if !unwritten.is_empty() => {
                if let Err(e) = ready {
                    shared.break_with(Broken::io(&e));
                    break;
                }
            }
            () = shared.wake.notified() => {}
        }
    }
}

/// Takes what callers left in `out` into `unwritten` once the last of it is written, the
/// merged releases written in their places (using `spare`); `false` when the connection
/// is closed or broken (the task ends).
fn take_out(shared: &WireShared, unwritten: &mut Vec<u8>, spare: &mut Vec<u8>) -> bool {
    let mut st = shared.state();
    if st.closed || st.broken.is_some() {
        return false;
    }
    st.write_asked = false;
    if !unwritten.is_empty() {
        st.task_writing = true;
        return true;
    }
    st.queued = 0;
    close_merging(&mut st);
    let merged = std::mem::take(&mut st.merged);
    if merged.is_empty() {
        std::mem::swap(unwritten, &mut st.out);
        st.task_writing = !unwritten.is_empty();
        return true;
    }
    std::mem::swap(spare, &mut st.out);
    st.task_writing = true;
    drop(st);
    // No caller writes meanwhile (the merged calls' replies are still to come).
    let mut from = 0;
    for (at, call) in merged {
        unwritten.extend_from_slice(spare.get(from..at).unwrap_or_default());
        call.pack_into(unwritten);
        from = at;
    }
    unwritten.extend_from_slice(spare.get(from..).unwrap_or_default());
    spare.clear();
    give_back(spare);
    true
}

/// Gives back the memory of the empty buffer `buf` when it is large (after a large
/// request), so that one large request does not stay in the connection for its life.
fn give_back(buf: &mut Vec<u8>) {
    if buf.capacity() > MAX_IDLE_BUFFER {
        *buf = Vec::new();
    }
}

/// Closes the call that releases join now, if any: later ones start another.
fn close_merging(st: &mut WireState) {
    if let Some((at, merged, _)) = st.merging.take() {
        st.merged.push((at, merged));
    }
}

/// Writes what the socket takes now of `unwritten`.
fn write_some(shared: &WireShared, unwritten: &mut Vec<u8>) -> Result<(), Broken> {
    if unwritten.is_empty() {
        return Ok(());
    }
    let n = write(&*shared.writing, unwritten)?;
    unwritten.drain(..n);
    if unwritten.is_empty() {
        // A large request is out (the buffer goes back to `out` at the next swap).
        give_back(unwritten);
        shared.state().task_writing = false;
    }
    Ok(())
}

/// Breaks the connection when its task ends.
struct Stopped<'a>(&'a WireShared);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        if self.0.state().broken.is_none() {
            self.0.break_with(Broken::Io(
                io::ErrorKind::NotConnected,
                "the connection's task stopped (closed, or its tokio runtime shut down)".into(),
            ));
        }
    }
}

/// Writes as much of `bytes` as the socket takes now; how much it took.
fn write(writing: &dyn Writer, bytes: &[u8]) -> Result<usize, Broken> {
    let mut written = 0;
    while written < bytes.len() {
        match writing.try_write(&bytes[written..]) {
            Ok(0) => return Err(Broken::Io(io::ErrorKind::WriteZero, "wrote 0 bytes".into())),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(Broken::io(&e)),
        }
    }
    Ok(written)
}

/// The next complete reply at the start of `buf`, and the bytes it took; `None` while it
/// is incomplete. A reply is parsed at once when it is all there (the usual case);
/// otherwise `scan` records how far it got, and later calls resume from there, parsing
/// the reply only once it is complete.
fn next_reply(buf: &[u8], scan: &mut resp::Scan) -> Result<Option<(Value, usize)>, String> {
    if scan.is_fresh()
        && let Some(done) = resp::parse(buf)?
    {
        return Ok(Some(done));
    }
    let Some(end) = scan.complete(buf)? else {
        return Ok(None);
    };
    *scan = resp::Scan::default();
    resp::parse(&buf[..end])
}

/// Hands out every complete reply in `buf` to its request, in order; `scan` is how far
/// the reply that is still incomplete was read.
fn hand_out(shared: &WireShared, buf: &mut Vec<u8>, scan: &mut resp::Scan) -> Result<(), Broken> {
    let mut used = 0;
    let mut values = Vec::new();
    let mut failed = None;
    loop {
        match next_reply(&buf[used..], scan) {
            Ok(Some((value, n))) => {
                used += n;
                values.push(value);
            }
            Ok(None) => break,
            Err(message) => {
                failed = Some(Broken::Protocol(message));
                break;
            }
        }
    }
    buf.drain(..used);
    if buf.is_empty() && buf.capacity() > MAX_IDLE_BUFFER {
        // A large reply is past: give its memory back.
        buf.shrink_to(READ_CHUNK);
    }
    let mut waiters = Vec::with_capacity(values.len());
    {
        let mut st = shared.state();
        for _ in 0..values.len() {
            match st.waiting.pop_front() {
                Some(waiter) => waiters.push(waiter),
                None => {
                    failed = Some(Broken::Protocol("a reply to no request".into()));
                    break;
                }
            }
        }
    }
    for (waiter, value) in waiters.into_iter().zip(values) {
        match waiter {
            Waiter::Reply(slot) => slot.deliver(value),
            Waiter::Merged(merged) => merged.deliver(value),
        }
    }
    failed.map_or(Ok(()), Err)
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "wire_merged_tests.rs"]
mod merged_tests;
