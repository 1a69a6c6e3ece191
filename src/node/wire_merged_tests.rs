//! Releases merged as the connection writes them (see `merged`), over the in-memory
//! transport of `wire_tests`: which releases go out as one call, where it goes among the
//! other requests, and how its reply (or its failure) reaches each release.

use std::sync::Arc;

use redis::Value;

use super::tests::{PATIENCE, Server, in_memory};
use super::{Reply, Wire, Writes};
use crate::scripts::{self, Call, Request};

const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// The release of `key` holding `value`, by client `id`.
fn release(key: &str, value: &str) -> Arc<Call> {
    let request = Request::Release {
        key: key.as_bytes(),
        waiting: Some(b"redlock:#waiting"),
        value: value.as_bytes(),
        id: b"client-1",
    };
    Arc::new(request.call())
}

/// The bytes of `calls` merged into one `RELEASE_MANY`.
fn merged(calls: &[Arc<Call>]) -> Vec<u8> {
    let mut out = Vec::new();
    scripts::pack_release_many(calls, &mut out);
    out
}

/// Takes exactly `expected` from what the client wrote.
async fn expect(server: &Server, expected: &[u8], what: &str) {
    let got = server.take(expected.len()).await;
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(expected),
        "{what}"
    );
}

/// A `PING` on an idle connection (written at once), then the releases of `a` and `b`,
/// merged into the connection's next write: both on the server. Their replies.
async fn a_ping_then_two_merged_releases(wire: &Wire, server: &Server) -> (Reply, Vec<Reply>) {
    let ping = wire.request(PING, Writes::Caller);
    let calls: Vec<Arc<Call>> = ["a", "b"].iter().map(|k| release(k, "v")).collect();
    let written: Vec<Reply> = calls
        .iter()
        .map(|c| wire.release(c, Writes::Task))
        .collect();
    expect(server, PING, "the request written at once").await;
    expect(server, &merged(&calls), "the releases merged").await;
    (ping, written)
}

/// A connection busy with a `PING` (answered `+PONG` once the server sends `then`) when
/// the releases of `keys` come, `writes` as given: they go out merged after it. Each
/// release's answer, once the server replied `then`.
async fn merged_after_a_ping(
    keys: &[&str],
    writes: Writes,
    then: Option<&[u8]>,
) -> Vec<redis::RedisResult<Value>> {
    let (wire, server) = in_memory(1 << 16);
    let ping = wire.request(PING, Writes::Caller);
    let calls: Vec<Arc<Call>> = keys.iter().map(|k| release(k, "v")).collect();
    let replies: Vec<Reply> = calls.iter().map(|c| wire.release(c, writes)).collect();
    expect(&server, PING, "the request written at once").await;
    expect(&server, &merged(&calls), "the releases merged").await;
    server.send(b"+PONG\r\n").await;
    assert!(answer(ping).await.is_ok());
    match then {
        Some(reply) => server.send(reply).await,
        None => drop(server),
    }
    let mut answers = Vec::new();
    for reply in replies {
        answers.push(answer(reply).await);
    }
    answers
}

async fn answer(reply: Reply) -> redis::RedisResult<Value> {
    tokio::time::timeout(PATIENCE, reply)
        .await
        .expect("answered in time")
}

/// A busy connection (a request on its way) with a release, a request and two more
/// releases to write: the three releases go out as one call in the first one's place,
/// before the request that came after it, and each gets its own answer from its reply.
#[tokio::test]
async fn releases_to_write_together_go_out_as_one_call_in_the_first_ones_place() {
    let (wire, server) = in_memory(1 << 16);
    let ping = wire.request(PING, Writes::Caller); // idle: written at once
    let calls: Vec<Arc<Call>> = ["a", "b", "c"].iter().map(|k| release(k, "v")).collect();
    let a = wire.release(&calls[0], Writes::Caller);
    let set = wire.request_all(b"*2\r\n$3\r\nGET\r\n$1\r\nx\r\n", 1, Writes::Caller, b"x");
    let b = wire.release(&calls[1], Writes::Caller);
    let c = wire.release(&calls[2], Writes::Task);
    expect(&server, PING, "the request written at once").await;
    expect(&server, &merged(&calls), "the releases merged").await;
    expect(
        &server,
        b"*2\r\n$3\r\nGET\r\n$1\r\nx\r\n",
        "the request after the first release",
    )
    .await;
    server
        .send(b"+PONG\r\n*3\r\n:1\r\n:0\r\n*1\r\n$22\r\nWRONGTYPE not a string\r\n$1\r\ny\r\n")
        .await;
    assert_eq!(
        answer(ping).await.ok(),
        Some(Value::SimpleString("PONG".into()))
    );
    assert_eq!(answer(a).await.ok(), Some(Value::Int(1)));
    assert_eq!(answer(b).await.ok(), Some(Value::Int(0)));
    let error = answer(c)
        .await
        .expect_err("the third key's error is its own");
    assert_eq!(error.code(), Some("WRONGTYPE"), "{error}");
    assert_eq!(
        answer(set).await.ok(),
        Some(Value::BulkString(b"y".to_vec()))
    );
}

/// A release alone in its write goes out as itself, and gets the reply as it is.
#[tokio::test]
async fn a_release_alone_in_its_write_goes_as_itself() {
    let (wire, server) = in_memory(1 << 16);
    let ping = wire.request(PING, Writes::Caller);
    let call = release("a", "v");
    let a = wire.release(&call, Writes::Caller);
    expect(&server, PING, "the request written at once").await;
    expect(&server, call.packed(), "the lone release").await;
    server.send(b"+PONG\r\n:1\r\n").await;
    assert!(answer(ping).await.is_ok());
    assert_eq!(answer(a).await.ok(), Some(Value::Int(1)));
    // On an idle connection the caller of a one-node round writes it at once, as itself
    // too (before it even waits); a round to several nodes leaves it to the task.
    for writes in [Writes::Caller, Writes::Task] {
        let again = wire.release(&call, writes);
        let written = server.written();
        let by_caller = if writes == Writes::Caller {
            call.packed().len()
        } else {
            0
        };
        assert_eq!(written, by_caller, "{writes:?}");
        expect(&server, call.packed(), "the release on an idle connection").await;
        server.send(b":0\r\n").await;
        assert_eq!(answer(again).await.ok(), Some(Value::Int(0)));
    }
}

/// A merged call the node no longer has the script of (`NOSCRIPT`) fails each release
/// with it, so that each is sent again alone by `EVAL`, as a lone release would be.
#[tokio::test]
async fn noscript_for_a_merged_call_reaches_each_release() {
    let noscript = b"-NOSCRIPT No matching script. Please use EVAL.\r\n";
    let answers = merged_after_a_ping(&["a", "b"], Writes::Caller, Some(noscript)).await;
    for answer in answers {
        let error = answer.expect_err("NOSCRIPT");
        assert_eq!(
            error.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
            "{error}"
        );
    }
}

/// A connection cut before a merged call is answered fails each of its releases.
#[tokio::test]
async fn a_cut_fails_each_merged_release() {
    for answer in merged_after_a_ping(&["a", "b", "c"], Writes::Task, None).await {
        let error = answer.expect_err("cut");
        assert!(
            error.is_io_error() || error.is_connection_dropped(),
            "{error}"
        );
    }
}

/// When the connection breaks, the merged releases it had not written yet go where
/// `on_unsent` said, with their calls, and their callers get the answers given there (a
/// failure for one dropped unanswered); a
/// merged call that was written, a request on its way, and a release sent on the broken
/// connection fail. Without `on_unsent` the releases not written fail too.
#[tokio::test]
async fn releases_not_written_when_the_connection_breaks_go_where_it_says() {
    for told in [true, false] {
        let (wire, server) = in_memory(1 << 16);
        let handed = Arc::new(std::sync::Mutex::new(Vec::new()));
        if told {
            let handed = Arc::clone(&handed);
            wire.on_unsent(move |unsent| handed.lock().expect("handed").extend(unsent));
        }
        let (ping, written) = a_ping_then_two_merged_releases(&wire, &server).await;
        // The task is asked to write these, and has not run yet when the connection breaks.
        let later_calls: Vec<Arc<Call>> = ["c", "d"].iter().map(|k| release(k, "v")).collect();
        let later: Vec<Reply> = later_calls
            .iter()
            .map(|c| wire.release(c, Writes::Caller))
            .collect();
        wire.close(false);
        let after = wire.release(&release("e", "v"), Writes::Caller);
        for reply in [ping, after].into_iter().chain(written) {
            assert!(answer(reply).await.is_err(), "sent, or sent when broken");
        }
        let unsent = std::mem::take(&mut *handed.lock().expect("handed"));
        if !told {
            assert!(unsent.is_empty());
            for reply in later {
                assert!(answer(reply).await.is_err(), "not written, nowhere to go");
            }
            continue;
        }
        let keys: Vec<&[u8]> = unsent.iter().map(|u| u.call().key()).collect();
        let expected: Vec<&[u8]> = later_calls.iter().map(|c| c.key()).collect();
        assert_eq!(keys, expected, "the releases not written, in order");
        // The first is answered from the next connection; the second is dropped unanswered
        // (its node gone, say), which fails it.
        let mut unsent = unsent.into_iter();
        if let Some(first) = unsent.next() {
            first.answer(Ok(Value::Int(1)));
        }
        drop(unsent);
        let mut later = later.into_iter();
        let first = later.next().expect("c");
        assert_eq!(answer(first).await.ok(), Some(Value::Int(1)));
        let second = later.next().expect("d");
        assert!(answer(second).await.is_err(), "dropped unanswered");
        assert_eq!(server.written(), 0, "nothing more was written");
    }
}

/// A connection that breaks with no release left unwritten calls nobody: the node starts
/// no resend for nothing.
#[tokio::test]
async fn a_break_with_every_release_written_hands_nothing_on() {
    let (wire, server) = in_memory(1 << 16);
    let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let told = Arc::clone(&told);
        wire.on_unsent(move |_| {
            told.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
    }
    let (ping, written) = a_ping_then_two_merged_releases(&wire, &server).await;
    wire.close(false);
    for reply in std::iter::once(ping).chain(written) {
        assert!(answer(reply).await.is_err(), "sent, then broken");
    }
    assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// More releases than one call takes go out as several, one after the other, each
/// answered in order.
#[tokio::test]
async fn more_releases_than_one_call_takes_go_out_as_several() {
    let (wire, server) = in_memory(1 << 20);
    let ping = wire.request(PING, Writes::Caller);
    let n = super::MAX_MERGED + 10;
    let calls: Vec<Arc<Call>> = (0..n).map(|i| release(&format!("k{i}"), "v")).collect();
    let replies: Vec<Reply> = calls
        .iter()
        .map(|c| wire.release(c, Writes::Task))
        .collect();
    let (first, second) = calls.split_at(super::MAX_MERGED);
    expect(&server, PING, "the request written at once").await;
    expect(&server, &merged(first), "a full call").await;
    expect(&server, &merged(second), "the rest").await;
    let mut reply = b"+PONG\r\n".to_vec();
    for part in [first, second] {
        reply.extend(format!("*{}\r\n", part.len()).into_bytes());
        for i in 0..part.len() {
            reply.extend(format!(":{}\r\n", i % 2).into_bytes());
        }
    }
    server.send(&reply).await;
    assert!(answer(ping).await.is_ok());
    for (i, reply) in replies.into_iter().enumerate() {
        let i = if i < super::MAX_MERGED {
            i
        } else {
            i - super::MAX_MERGED
        };
        assert_eq!(answer(reply).await.ok(), Some(Value::Int((i % 2) as i64)));
    }
}

/// A reply that is not one answer per release (a server that answers something else)
/// fails each release, with the reply described.
#[tokio::test]
async fn a_reply_of_the_wrong_shape_fails_each_release() {
    let one_answer = b"*1\r\n:1\r\n";
    for answer in merged_after_a_ping(&["a", "b"], Writes::Caller, Some(one_answer)).await {
        let error = answer.expect_err("wrong shape");
        assert_eq!(
            error.kind(),
            redis::ErrorKind::UnexpectedReturnType,
            "{error}"
        );
    }
}

/// A release never overtakes a request about its key sent before it (its own lock's
/// `SET`, still on its way when the acquisition gave up, say): it starts a new call after
/// that request. A request whose key is not known (a follow-up, a health check) closes
/// the call too; a later release starts another after it.
#[tokio::test]
async fn a_release_does_not_overtake_a_request_about_its_key() {
    let (wire, server) = in_memory(1 << 16);
    let ping = wire.request(PING, Writes::Caller);
    let calls: Vec<Arc<Call>> = ["a", "b", "c", "d"]
        .iter()
        .map(|k| release(k, "v"))
        .collect();
    let set_b = set_nx(&calls[1]);
    let a = wire.release(&calls[0], Writes::Caller);
    let sent_b = wire.request_all(&set_b, 1, Writes::Caller, calls[1].key());
    let b = wire.release(&calls[1], Writes::Caller);
    let c = wire.release(&calls[2], Writes::Caller);
    let health = wire.request(PING, Writes::Caller);
    let d = wire.release(&calls[3], Writes::Caller);
    expect(&server, PING, "the request written at once").await;
    expect(&server, calls[0].packed(), "a alone: b's key came after it").await;
    expect(&server, &set_b, "b's SET").await;
    expect(&server, &merged(&calls[1..3]), "b and c, after b's SET").await;
    expect(&server, PING, "a request of no known key").await;
    expect(&server, calls[3].packed(), "d, after it").await;
    server
        .send(b"+PONG\r\n:1\r\n+OK\r\n*2\r\n:1\r\n:0\r\n+PONG\r\n:1\r\n")
        .await;
    assert!(answer(ping).await.is_ok());
    assert_eq!(answer(a).await.ok(), Some(Value::Int(1)));
    assert!(answer(sent_b).await.is_ok());
    assert_eq!(answer(b).await.ok(), Some(Value::Int(1)));
    assert_eq!(answer(c).await.ok(), Some(Value::Int(0)));
    assert!(answer(health).await.is_ok());
    assert_eq!(answer(d).await.ok(), Some(Value::Int(1)));
}

/// `SET key v NX` for the key of the release `call`.
fn set_nx(call: &Call) -> Vec<u8> {
    let key = call.key();
    let mut out = format!("*4\r\n$3\r\nSET\r\n${}\r\n", key.len()).into_bytes();
    out.extend_from_slice(key);
    out.extend_from_slice(b"\r\n$1\r\nv\r\n$2\r\nNX\r\n");
    out
}

/// Releases count towards the chunk that a round to one node has written at once on a
/// deep connection, as requests do.
#[tokio::test]
async fn releases_count_towards_a_chunk() {
    let (wire, server) = in_memory(1 << 16);
    let mut pings: Vec<Reply> = (0..super::SHALLOW)
        .map(|_| wire.request(PING, Writes::Caller))
        .collect();
    server.take(super::SHALLOW * PING.len()).await;
    let calls: Vec<Arc<Call>> = (0..super::CHUNK - 1)
        .map(|i| release(&format!("k{i}"), "v"))
        .collect();
    let releases: Vec<Reply> = calls
        .iter()
        .map(|c| wire.release(c, Writes::Caller))
        .collect();
    pings.push(wire.request_all(PING, 1, Writes::Caller, b"other"));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let chunk = merged(&calls).len() + PING.len();
    let written = server.written();
    assert_eq!(
        written, chunk,
        "the chunk of releases and a request goes at once"
    );
    let mut replies = b"+PONG\r\n".repeat(super::SHALLOW);
    replies.extend(format!("*{}\r\n", calls.len()).into_bytes());
    replies.extend(b":1\r\n".repeat(calls.len()));
    replies.extend(b"+PONG\r\n");
    server.take(chunk).await;
    server.send(&replies).await;
    for reply in pings {
        assert!(answer(reply).await.is_ok());
    }
    for reply in releases {
        assert_eq!(answer(reply).await.ok(), Some(Value::Int(1)));
    }
}

/// A large request written together with merged releases does not leave its memory in the
/// buffers that take turns with `out`.
#[tokio::test]
async fn a_large_request_among_merged_releases_does_not_keep_its_memory() {
    let (wire, server) = in_memory(1 << 24);
    let call = release("a", "v");
    let large = {
        let mut out = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1048576\r\n".to_vec();
        out.extend(vec![b'x'; 1 << 20]);
        out.extend(b"\r\n");
        out
    };
    let ping = wire.request(PING, Writes::Caller);
    let set = wire.request_all(&large, 1, Writes::Task, b"k");
    let a = wire.release(&call, Writes::Caller);
    server
        .take(PING.len() + large.len() + call.packed().len())
        .await;
    server.send(b"+PONG\r\n+OK\r\n:1\r\n").await;
    assert!(answer(ping).await.is_ok());
    assert!(answer(set).await.is_ok());
    assert!(answer(a).await.is_ok());
    // Small writes, with and without a merged release, so every buffer takes its turn
    // as `out`.
    for i in 0..6 {
        let ping = wire.request(PING, Writes::Task);
        let a = (i % 2 == 0).then(|| wire.release(&call, Writes::Caller));
        let len = PING.len() + a.as_ref().map_or(0, |_| call.packed().len());
        server.take(len).await;
        server
            .send(if a.is_some() {
                b"+PONG\r\n:1\r\n"
            } else {
                b"+PONG\r\n"
            })
            .await;
        assert!(answer(ping).await.is_ok());
        if let Some(a) = a {
            assert!(answer(a).await.is_ok());
        }
        let kept = wire.0.0.state().out.capacity();
        assert!(kept <= super::MAX_IDLE_BUFFER, "{kept} bytes kept");
    }
}
