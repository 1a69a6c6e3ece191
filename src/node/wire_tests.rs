//! The connection's own state machine, tested without a server: over an in-memory
//! transport whose every read and every write the test scripts (split replies, many
//! replies in one read, partial and blocked writes, a caller that gives up, a cut), and
//! over a local socket for what only a real socket shows (a full send buffer).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redis::Value;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::{Wire, Writer, Writes};

/// How long a test waits for something that must happen (it never sleeps for it).
pub(super) const PATIENCE: Duration = Duration::from_secs(5);

/// `SET key value` as RESP.
fn set(key: &str, value: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n",
        key.len(),
        value.len()
    )
    .into_bytes();
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
    out
}

/// The server's side of an in-memory connection: what the client wrote, and the replies
/// it reads, one scripted read at a time.
pub(super) struct Server {
    requests: Arc<Pipe>,
    replies: mpsc::Sender<Vec<u8>>,
}

/// Client to server: a pipe that takes at most `capacity` bytes until the server reads.
struct Pipe(Mutex<PipeState>);

struct PipeState {
    bytes: Vec<u8>,
    capacity: usize,
    /// The client's task, waiting for room.
    writer: Option<Waker>,
}

/// The client's writing side of the pipe.
struct PipeWriter(Arc<Pipe>);

impl Writer for PipeWriter {
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        let mut st = self.0.0.lock().expect("pipe");
        let n = bytes.len().min(st.capacity - st.bytes.len());
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        st.bytes.extend_from_slice(&bytes[..n]);
        Ok(n)
    }

    fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.0.0.lock().expect("pipe");
        if st.bytes.len() < st.capacity {
            return Poll::Ready(Ok(()));
        }
        st.writer = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Server to client: each chunk the server sends is one read of the client (or several,
/// if the client's buffer is smaller); the end of the channel is the end of the stream.
struct ScriptedReader {
    chunks: mpsc::Receiver<Vec<u8>>,
    current: Vec<u8>,
}

impl AsyncRead for ScriptedReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.current.is_empty() {
            match self.chunks.poll_recv(cx) {
                Poll::Ready(Some(chunk)) => self.current = chunk,
                Poll::Ready(None) => return Poll::Ready(Ok(())), // the end of the stream
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = self.current.len().min(buf.remaining());
        buf.put_slice(&self.current[..n]);
        self.current.drain(..n);
        Poll::Ready(Ok(()))
    }
}

/// A connection over an in-memory transport whose request pipe takes `capacity` bytes;
/// the server sends each reply chunk only once the client took the one before.
pub(super) fn in_memory(capacity: usize) -> (Wire, Server) {
    let requests = Arc::new(Pipe(Mutex::new(PipeState {
        bytes: Vec::new(),
        capacity,
        writer: None,
    })));
    let (replies, chunks) = mpsc::channel(1);
    let reader = ScriptedReader {
        chunks,
        current: Vec::new(),
    };
    let wire = Wire::over(reader, PipeWriter(Arc::clone(&requests)));
    (wire, Server { requests, replies })
}

impl Server {
    /// How many bytes the client wrote that the server has not taken yet.
    pub(super) fn written(&self) -> usize {
        self.requests.0.lock().expect("pipe").bytes.len()
    }

    /// Sends `chunk` as one read of the client.
    pub(super) async fn send(&self, chunk: &[u8]) {
        let sent = tokio::time::timeout(PATIENCE, self.replies.send(chunk.to_vec()));
        assert!(
            matches!(sent.await, Ok(Ok(()))),
            "the client stopped reading"
        );
    }

    /// Takes `n` bytes the client wrote, as they come (making room for more each time).
    pub(super) async fn take(&self, n: usize) -> Vec<u8> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut taken = Vec::with_capacity(n);
        while taken.len() < n {
            {
                let mut st = self.requests.0.lock().expect("pipe");
                let k = st.bytes.len().min(n - taken.len());
                taken.extend(st.bytes.drain(..k));
                if k > 0
                    && let Some(w) = st.writer.take()
                {
                    w.wake();
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the client wrote {} of {n} bytes",
                taken.len()
            );
            tokio::task::yield_now().await;
        }
        taken
    }
}

/// A reply split at every byte boundary, into two reads, is read whole.
#[tokio::test]
async fn a_reply_split_at_every_byte_is_read_whole() {
    let reply = b"*3\r\n$5\r\nhe\r\no\r\n:-42\r\n*1\r\n$-1\r\n";
    let expected = Value::Array(vec![
        Value::BulkString(b"he\r\no".to_vec()),
        Value::Int(-42),
        Value::Array(vec![Value::Nil]),
    ]);
    for split in 1..reply.len() {
        let (wire, server) = in_memory(1024);
        let answer = wire.request(b"*1\r\n$4\r\nPING\r\n", Writes::Caller);
        server.send(&reply[..split]).await;
        server.send(&reply[split..]).await;
        let got = tokio::time::timeout(PATIENCE, answer).await;
        assert_eq!(
            got.ok().and_then(Result::ok),
            Some(expected.clone()),
            "split at {split}"
        );
    }
}

/// Many replies in one read go to their requests, in order.
#[tokio::test]
async fn many_replies_in_one_read_go_to_their_requests() {
    let (wire, server) = in_memory(1 << 20);
    let answers: Vec<_> = (0..100)
        .map(|_| wire.request(b"*1\r\n$4\r\nPING\r\n", Writes::Task))
        .collect();
    let all: Vec<u8> = (0..100)
        .flat_map(|i| format!(":{i}\r\n").into_bytes())
        .collect();
    server.send(&all).await;
    for (i, answer) in answers.into_iter().enumerate() {
        let got = tokio::time::timeout(PATIENCE, answer).await;
        assert_eq!(got.ok().and_then(Result::ok), Some(Value::Int(i as i64)));
    }
}

/// A request written in pieces (the transport takes a few bytes at a time) goes out
/// whole, while the replies to the requests before it come in.
#[tokio::test]
async fn a_partial_write_goes_on_while_replies_come_in() {
    let (wire, server) = in_memory(7);
    let requests: Vec<Vec<u8>> = (0..3).map(|i| set(&format!("key{i}"), b"value")).collect();
    let answers: Vec<_> = requests
        .iter()
        .map(|r| wire.request(r, Writes::Caller))
        .collect();
    for (i, request) in requests.iter().enumerate() {
        let mut got = Vec::new();
        while got.len() < request.len() {
            let n = 7.min(request.len() - got.len());
            got.extend(server.take(n).await);
        }
        assert_eq!(&got, request, "request {i} arrives whole, in order");
        server.send(format!(":{i}\r\n").as_bytes()).await;
    }
    for (i, answer) in answers.into_iter().enumerate() {
        let got = tokio::time::timeout(PATIENCE, answer).await;
        assert_eq!(got.ok().and_then(Result::ok), Some(Value::Int(i as i64)));
    }
}

/// The deadlock redis-rs guards against: the client's writes are blocked (the server reads
/// nothing) while the server sends replies it needs read before it reads on. The client
/// keeps reading replies while its writes wait, so both sides go on.
#[tokio::test]
async fn replies_are_read_while_writes_are_blocked() {
    let (wire, server) = in_memory(64);
    let request = set("k", &[b'x'; 100]);
    let answers: Vec<_> = (0..50)
        .map(|_| wire.request(&request, Writes::Task))
        .collect();
    // Every reply, one read at a time, each sent only once the client took the one
    // before, and none of the requests read yet.
    for i in 0..50 {
        server.send(format!(":{i}\r\n").as_bytes()).await;
    }
    for (i, answer) in answers.into_iter().enumerate() {
        let got = tokio::time::timeout(PATIENCE, answer).await;
        assert_eq!(got.ok().and_then(Result::ok), Some(Value::Int(i as i64)));
    }
    // And the requests all go out once the server reads.
    for _ in 0..50 {
        assert_eq!(server.take(request.len()).await, request);
    }
}

/// A caller that gives up before its reply arrives leaves it to nobody: the next caller
/// gets its own reply, never the stale one.
#[tokio::test]
async fn a_stale_reply_goes_to_nobody() {
    let (wire, server) = in_memory(1024);
    let gone = wire.request(b"*1\r\n$4\r\nPING\r\n", Writes::Caller);
    drop(gone);
    let next = wire.request(b"*1\r\n$4\r\nPING\r\n", Writes::Caller);
    server.send(b"$5\r\nstale\r\n").await;
    server.send(b"$4\r\nmine\r\n").await;
    let got = tokio::time::timeout(PATIENCE, next).await;
    assert_eq!(
        got.ok().and_then(Result::ok),
        Some(Value::BulkString(b"mine".to_vec()))
    );
}

/// A connection cut in the middle of a reply fails every request still out, and the
/// requests after it fail at once.
#[tokio::test]
async fn a_cut_mid_reply_fails_what_is_out() {
    let (wire, server) = in_memory(1024);
    let first = wire.request(b"*1\r\n$4\r\nPING\r\n", Writes::Caller);
    let second = wire.request(b"*1\r\n$4\r\nPING\r\n", Writes::Caller);
    server.send(b"*2\r\n:1\r\n").await;
    drop(server);
    for answer in [first, second] {
        let got = tokio::time::timeout(PATIENCE, answer).await;
        let error = got.expect("answered").expect_err("the cut fails it");
        assert!(
            error.is_io_error() || error.is_connection_dropped(),
            "{error}"
        );
    }
    let after = tokio::time::timeout(
        PATIENCE,
        wire.request(b"*1\r\n$4\r\nPING\r\n", Writes::Caller),
    );
    assert!(after.await.expect("answered at once").is_err());
}

/// A connection closed because its node stopped answering fails what is still out as
/// timed out (which is what happened to it); one closed for another reason, as dropped.
#[tokio::test]
async fn a_connection_closed_after_timeouts_fails_its_requests_as_timed_out() {
    for timed_out in [true, false] {
        let (wire, _server) = in_memory(1024);
        let out = wire.request(b"*1\r\n$4\r\nPING\r\n", Writes::Caller);
        wire.close(timed_out);
        let got = tokio::time::timeout(PATIENCE, out).await;
        let error = got.expect("answered at once").expect_err("closed");
        assert_eq!(error.is_timeout(), timed_out, "{error}");
        assert!(error.is_io_error(), "{error}");
    }
}

/// Reads one request of `len` bytes on the server side and answers `+OK`.
async fn answer(server: &mut tokio::net::TcpStream, len: usize) {
    use tokio::io::AsyncWriteExt;
    let mut request = vec![0; len];
    server.read_exact(&mut request).await.expect("read");
    server.write_all(b"+OK\r\n").await.expect("write");
}

/// A large request (an 8 MiB completion record, say) does not leave its memory in the
/// connection's write buffers for the connection's life.
#[tokio::test]
async fn a_large_request_does_not_keep_its_memory() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let wire = Wire::connect("127.0.0.1", port, &Default::default())
        .await
        .expect("connect");
    let (mut server, _) = listener.accept().await.expect("accept");
    let large = set("record", &vec![b'x'; 8 << 20]);
    let reply = wire.request(&large, Writes::Task);
    answer(&mut server, large.len()).await;
    assert!(reply.await.is_ok());
    // The buffers take turns: a few small requests after it go through both.
    for _ in 0..3 {
        let small = set("k", b"v");
        let reply = wire.request(&small, Writes::Task);
        answer(&mut server, small.len()).await;
        assert!(reply.await.is_ok());
        let kept = wire.0.0.state().out.capacity();
        assert!(kept <= super::MAX_IDLE_BUFFER, "{kept} bytes kept");
    }
}

/// A connection that is closed (replaced after timeouts) writes nothing more: what it
/// held unwritten, say a straggling `SET`, never reaches the server after a release
/// sent on the next connection; and its requests fail at once.
#[tokio::test]
async fn a_closed_connection_writes_nothing_more() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let wire = Wire::connect("127.0.0.1", port, &Default::default())
        .await
        .expect("connect");
    let (mut server, _) = listener.accept().await.expect("accept");
    // The server reads nothing, so the socket fills up and the connection's task is
    // left holding bytes it could not write.
    let filler = wire.request(&set("filler", &vec![b'x'; 32 << 20]), Writes::Task);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !wire.0.0.state().task_writing {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the socket took 32 MiB"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Queued behind them: a straggling SET, whose call keeps a handle on the connection.
    let straggler = wire.request(&set("straggler", b"late"), Writes::Task);
    let kept = wire.clone();
    assert!(!wire.0.0.state().out.is_empty());
    wire.close(false);
    let failed = tokio::time::timeout(Duration::from_secs(5), async {
        (straggler.await.is_err(), filler.await.is_err())
    });
    assert_eq!(
        failed.await.ok(),
        Some((true, true)),
        "a closed connection's requests fail at once"
    );
    assert!(
        kept.0.0.state().out.is_empty(),
        "the unwritten bytes are dropped"
    );
    // The connection's task ends although a handle remains: nothing more is written.
    let shared = std::sync::Arc::clone(&kept.0.0);
    while std::sync::Arc::strong_count(&shared) > 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the closed connection's task still runs"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop((shared, kept, wire));
    // Everything the server gets from now on was in the socket before the close.
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), server.read_to_end(&mut got));
    read.await.expect("the socket closes").expect("read");
    assert!(!got.is_empty());
    assert!(
        !got.windows(9).any(|w| w == b"straggler"),
        "the straggling SET was written after the close"
    );
}

/// A request of several commands (a fenced acquisition's pipeline) gets all its replies
/// as one array, whatever reads they come in, a server error among them as a value, and
/// the request after it gets the next reply.
#[tokio::test]
async fn a_request_of_several_commands_gets_its_replies_together() {
    let (wire, server) = in_memory(1 << 20);
    let three = [set("a", b"1"), set("b", b"2"), set("c", b"3")].concat();
    let pipeline = wire.request_all(&three, 3, Writes::Caller, b"k");
    let failing = wire.request_all(&three, 3, Writes::Caller, b"k");
    let next = wire.request(b"*1\r\n$4\r\nPING\r\n", Writes::Caller);
    // The first request's replies split across reads, one of them with the second's.
    server.send(b"+OK\r\n:1").await;
    server.send(b"\r\n:1\r\n+OK\r\n-WRONGTYPE bad\r\n").await;
    let first = tokio::time::timeout(PATIENCE, pipeline).await;
    assert_eq!(
        first.ok().and_then(Result::ok),
        Some(Value::Array(vec![
            Value::Okay,
            Value::Int(1),
            Value::Int(1)
        ]))
    );
    server.send(b":0\r\n+PONG\r\n").await;
    let second = tokio::time::timeout(PATIENCE, failing).await;
    match second.ok().and_then(Result::ok) {
        Some(Value::Array(replies)) => {
            assert!(
                matches!(replies.as_slice(), [Value::Okay, Value::ServerError(e), Value::Int(0)] if e.code() == "WRONGTYPE"),
                "{replies:?}"
            );
        }
        other => panic!("three replies, one an error: {other:?}"),
    }
    let after = tokio::time::timeout(PATIENCE, next).await;
    assert_eq!(
        after.ok().and_then(Result::ok),
        Some(Value::SimpleString("PONG".into()))
    );
}

/// With many replies still to come, the requests of rounds to one node (the caller
/// writes) go out as soon as `CHUNK` of them wait, without waiting for a reply; those of
/// rounds to several nodes wait for the next replies, however many they are.
#[tokio::test]
async fn a_deep_connection_writes_a_chunk_of_one_node_requests_at_once() {
    const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
    for writes in [Writes::Caller, Writes::Task] {
        let (wire, server) = in_memory(1 << 16);
        // Enough requests on their way for the connection to be deep.
        let mut answers: Vec<_> = (0..super::SHALLOW)
            .map(|_| wire.request(PING, Writes::Caller))
            .collect();
        server.take(super::SHALLOW * PING.len()).await;
        answers.extend((0..super::CHUNK - 1).map(|_| wire.request(PING, writes)));
        let written = || server.written();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            written(),
            0,
            "{writes:?}: fewer than a chunk wait for the replies"
        );
        answers.push(wire.request(PING, writes));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let chunk = super::CHUNK * PING.len();
        match writes {
            Writes::Caller => assert_eq!(written(), chunk, "a chunk goes at once"),
            Writes::Task => {
                assert_eq!(written(), 0, "rounds to several nodes wait for the replies");
                server.send(b"+PONG\r\n").await;
                server.take(chunk).await;
            }
        }
        let replies: Vec<u8> = b"+PONG\r\n".repeat(answers.len());
        let rest = if writes == Writes::Task { 1 } else { 0 };
        server.send(&replies[rest * 7..]).await;
        for answer in answers {
            let got = tokio::time::timeout(PATIENCE, answer).await;
            assert!(matches!(got, Ok(Ok(_))), "{writes:?}: {got:?}");
        }
    }
}

/// On an idle connection the caller of a round to one node writes its request itself,
/// before it even waits (no task hop); a round to several nodes leaves it to the task.
#[tokio::test]
async fn the_caller_writes_on_an_idle_connection_for_a_one_node_round() {
    const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
    for writes in [Writes::Caller, Writes::Task] {
        let (wire, server) = in_memory(1 << 16);
        let answer = wire.request(PING, writes);
        let written = server.written();
        match writes {
            Writes::Caller => assert_eq!(written, PING.len(), "written by the caller"),
            Writes::Task => assert_eq!(written, 0, "left to the task"),
        }
        server.take(PING.len()).await;
        server.send(b"+PONG\r\n").await;
        let got = tokio::time::timeout(PATIENCE, answer).await;
        assert!(matches!(got, Ok(Ok(_))), "{writes:?}: {got:?}");
    }
}
