//! The connection's task: it reads the replies and hands them out to their requests in
//! order, writes what the callers left in `out` (the merged releases in their places), and
//! breaks the connection when the transport fails, a reply is not RESP2 (or answers no
//! request), or the task ends. A reply split over reads is scanned where it stopped, and
//! parsed once it is whole; a buffer that grew for a large request or reply gives its
//! memory back once it is empty.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?; // the task hands the SET's reply out
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::io;
use std::sync::Arc;

use redis::Value;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::state::{Broken, Waiter, WireShared, Writer};
use crate::node::resp;

/// How much the task reads at most per read.
const READ_CHUNK: usize = 16 * 1024;

/// The most memory a write or read buffer keeps once it is empty again: after a large
/// request or reply it is given back, so one large completion record does not stay in the
/// connection's buffers for its whole life.
pub(super) const MAX_IDLE_BUFFER: usize = 4 * READ_CHUNK;

/// The connection's task: reads and hands out replies, writes what callers left in `out`
/// (outside the lock; a caller writes only while the task holds nothing unwritten), and
/// closes the socket when every handle is gone.
pub(super) async fn drive(shared: Arc<WireShared>, mut reading: impl AsyncRead + Unpin) {
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
    st.close_merging();
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
pub(super) fn write(writing: &dyn Writer, bytes: &[u8]) -> Result<usize, Broken> {
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
    // Every reply of this read had arrived by now: one clock read for all of them.
    let at = crate::clock::now();
    for (waiter, value) in waiters.into_iter().zip(values) {
        match waiter {
            Waiter::Reply(slot) => slot.deliver(value, at),
            Waiter::Merged(merged) => merged.deliver(value, at),
        }
    }
    failed.map_or(Ok(()), Err)
}
