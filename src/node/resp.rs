//! Reading RESP2 replies off a byte buffer into `redis::Value`s, for the node's own
//! connection ([`super::wire`]). It reads only what a server sends to a RESP2 client that
//! does not subscribe: simple strings, errors, integers, bulk strings and arrays. Anything
//! else is a protocol error, and so are lines, lengths or nesting beyond sane limits, so a
//! server that speaks something else can neither hang nor exhaust the client.
//!
//! ```text
//! b"+OK\r\n"               ->  Value::Okay                       (5 bytes used)
//! b"*2\r\n:1\r\n$-1\r\n"   ->  Value::Array([Int(1), Nil])        (13 bytes used)
//! b"$5\r\nhel"             ->  incomplete: wait for more bytes
//! ```
//!
//! ```
//! // The parser is internal; a lock's round trip is what uses it.
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! # let _ = redlock;
//! # Ok(()) }
//! ```

use redis::Value;

/// The longest header line (type, length or simple string) accepted.
const MAX_LINE: usize = 64 * 1024;
/// The deepest nesting of arrays accepted.
const MAX_DEPTH: usize = 16;
/// The longest bulk string accepted (Redis's own limit).
const MAX_BULK: usize = 512 * 1024 * 1024;
/// The most bytes one reply may take, all its parts together: one longest bulk string and
/// a header line. A reply still incomplete past that is a protocol error, so a server
/// cannot make the client buffer without bound.
pub(super) const MAX_REPLY: usize = MAX_BULK + MAX_LINE;
/// The longest length or integer line (`-` and 19 digits).
const MAX_DIGITS: usize = 20;

/// Parses one reply from the start of `buf`: the value and the bytes it used, `None`
/// when `buf` holds only part of it, or why the bytes are not a RESP2 reply.
pub(super) fn parse(buf: &[u8]) -> Parsed {
    parse_at(buf, 0, 0)
}

/// A parsed reply and where the next one starts, `None` when incomplete, or why not RESP2.
type Parsed = Result<Option<(Value, usize)>, String>;

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Parsed {
    let Some((line, next)) = line(buf, at)? else {
        return Ok(None);
    };
    let Some((&kind, rest)) = line.split_first() else {
        return Err("an empty reply line".into());
    };
    let value = match kind {
        b'+' if rest == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(String::from_utf8_lossy(rest).into_owned()),
        // redis-rs classifies the error (NOSCRIPT, READONLY, WRONGTYPE, ...).
        b'-' => redis::parse_redis_value(&buf[at..next]).map_err(|e| e.to_string())?,
        b':' => Value::Int(integer(rest)?),
        b'$' => return bulk(buf, next, integer(rest)?),
        b'*' => return array(buf, next, integer(rest)?, depth),
        other => {
            return Err(format!(
                "unexpected reply type byte {:?}",
                char::from(other)
            ));
        }
    };
    Ok(Some((value, next)))
}

/// A bulk string of `len` bytes starting at `at` (nil when negative).
fn bulk(buf: &[u8], at: usize, len: i64) -> Parsed {
    if len < 0 {
        return Ok(Some((Value::Nil, at)));
    }
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= MAX_BULK)
        .ok_or("a bulk string longer than 512 MiB")?;
    let end = at.saturating_add(len);
    if buf.len() < end.saturating_add(2) {
        return Ok(None);
    }
    if &buf[end..end + 2] != b"\r\n" {
        return Err("a bulk string not followed by CRLF".into());
    }
    Ok(Some((Value::BulkString(buf[at..end].to_vec()), end + 2)))
}

/// An array of `count` replies starting at `at` (nil when negative), nested `depth` deep.
fn array(buf: &[u8], at: usize, count: i64, depth: usize) -> Parsed {
    if count < 0 {
        return Ok(Some((Value::Nil, at)));
    }
    if depth >= MAX_DEPTH {
        return Err("arrays nested too deeply".into());
    }
    let count = usize::try_from(count).map_err(|_| "an array too long")?;
    // Never trust the count for the allocation: each item takes at least 3 bytes.
    let mut items = Vec::with_capacity(count.min((buf.len() - at) / 3));
    let mut pos = at;
    for _ in 0..count {
        let Some((item, used)) = parse_at(buf, pos, depth + 1)? else {
            return Ok(None);
        };
        items.push(item);
        pos = used;
    }
    Ok(Some((Value::Array(items), pos)))
}

/// The line starting at `at` (without its CRLF) and where the next one starts; `None`
/// when its end has not arrived yet. What has arrived of a line must be able to start a
/// RESP2 reply (a type byte, then digits for lengths and integers), so bytes of another
/// protocol (a TLS record, say) are an error at once, not a wait for a line end that
/// never comes.
fn line(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, String> {
    let rest = &buf[at.min(buf.len())..];
    let window = &rest[..rest.len().min(MAX_LINE + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(end) => Ok(Some((&rest[..end], at + end + 2))),
        None if window.len() > MAX_LINE => Err("a reply line longer than 64 KiB".into()),
        None => check_start(window).map(|()| None),
    }
}

/// Whether `partial`, the start of a line whose end has not arrived, can still become a
/// RESP2 header line.
fn check_start(partial: &[u8]) -> Result<(), String> {
    let Some((&kind, rest)) = partial.split_first() else {
        return Ok(());
    };
    // A CR may be the first half of the line's CRLF.
    let rest = rest.strip_suffix(b"\r").unwrap_or(rest);
    match kind {
        b'+' | b'-' => Ok(()),
        b':' | b'$' | b'*' => {
            let digits = rest.strip_prefix(b"-").unwrap_or(rest);
            if rest.len() <= MAX_DIGITS && digits.iter().all(u8::is_ascii_digit) {
                Ok(())
            } else {
                Err(format!(
                    "not an integer: {:?}",
                    String::from_utf8_lossy(rest)
                ))
            }
        }
        other => Err(format!(
            "unexpected reply type byte {:?}",
            char::from(other)
        )),
    }
}

/// How far the scan of an incomplete reply got, so the next read resumes there instead of
/// parsing the reply again from its start (a large array arriving in pieces would
/// otherwise cost time quadratic in its size).
#[derive(Debug, Default)]
pub(super) struct Scan {
    /// Where the next element starts (relative to the reply's start).
    at: usize,
    /// The elements still to come in each array that is open, outermost first.
    open: Vec<usize>,
    /// Bytes looked at by the scan, for the tests.
    #[cfg(test)]
    looked_at: usize,
}

impl Scan {
    /// Whether nothing of the current reply has been scanned yet.
    pub(super) fn is_fresh(&self) -> bool {
        self.at == 0 && self.open.is_empty()
    }

    /// Where the reply starting at `buf[0]` ends, once all of it is in `buf`; `None` while
    /// it is incomplete (the scan then resumes where it stopped on the next call, with
    /// `buf` holding the same start and more bytes). Reset it for the next reply.
    pub(super) fn complete(&mut self, buf: &[u8]) -> Result<Option<usize>, String> {
        self.complete_within(buf, MAX_REPLY)
    }

    /// [`complete`](Self::complete) with `limit` as the most bytes of one reply.
    fn complete_within(&mut self, buf: &[u8], limit: usize) -> Result<Option<usize>, String> {
        let incomplete = || {
            if buf.len() > limit {
                return Err(format!("a reply larger than {limit} bytes"));
            }
            Ok(None)
        };
        loop {
            let Some((line, next)) = line(buf, self.at)? else {
                return incomplete();
            };
            #[cfg(test)]
            {
                self.looked_at += next - self.at;
            }
            let Some((&kind, rest)) = line.split_first() else {
                return Err("an empty reply line".into());
            };
            let end = match kind {
                b'$' => match usize::try_from(integer(rest)?) {
                    // A bulk string: its bytes and CRLF must all be in.
                    Ok(len) if len > MAX_BULK => {
                        return Err("a bulk string longer than 512 MiB".into());
                    }
                    Ok(len) if buf.len() < next.saturating_add(len).saturating_add(2) => {
                        return incomplete();
                    }
                    Ok(len) => next + len + 2,
                    Err(_) => next, // $-1: nil
                },
                b'*' => match usize::try_from(integer(rest)?) {
                    Ok(count) if count > 0 => {
                        if self.open.len() >= MAX_DEPTH {
                            return Err("arrays nested too deeply".into());
                        }
                        self.open.push(count);
                        self.at = next;
                        continue;
                    }
                    _ => next, // an empty or nil array
                },
                _ => next,
            };
            self.at = end;
            // One element is done: close every array it completes.
            loop {
                match self.open.last_mut() {
                    None => return Ok(Some(self.at)),
                    Some(left) if *left > 1 => {
                        *left -= 1;
                        break;
                    }
                    Some(_) => {
                        self.open.pop();
                    }
                }
            }
        }
    }
}

/// A decimal integer of a header line.
fn integer(digits: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an integer: {:?}", String::from_utf8_lossy(digits)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_reply_type_and_says_how_much_it_used() {
        assert_eq!(parse(b"+OK\r\n"), Ok(Some((Value::Okay, 5))));
        assert_eq!(
            parse(b"+PONG\r\nrest"),
            Ok(Some((Value::SimpleString("PONG".into()), 7)))
        );
        assert_eq!(parse(b":-42\r\n"), Ok(Some((Value::Int(-42), 6))));
        assert_eq!(parse(b"$-1\r\n"), Ok(Some((Value::Nil, 5))));
        assert_eq!(parse(b"*-1\r\n"), Ok(Some((Value::Nil, 5))));
        assert_eq!(
            parse(b"$5\r\nhe\r\no\r\n"),
            Ok(Some((Value::BulkString(b"he\r\no".to_vec()), 11)))
        );
        assert_eq!(
            parse(b"*3\r\n:1\r\n$-1\r\n*1\r\n$0\r\n\r\n"),
            Ok(Some((
                Value::Array(vec![
                    Value::Int(1),
                    Value::Nil,
                    Value::Array(vec![Value::BulkString(Vec::new())])
                ]),
                23
            )))
        );
        match parse(b"-NOSCRIPT No matching script\r\n") {
            Ok(Some((v, 30))) => {
                let e = v.extract_error().expect_err("an error");
                assert_eq!(
                    e.kind(),
                    redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn waits_for_the_rest_of_a_reply() {
        for partial in [
            &b""[..],
            b"+O",
            b"+OK\r",
            b"$5\r\nhel",
            b"$5\r\nhello\r",
            b"*2\r\n:1\r\n",
            b"*2\r\n:1\r\n$3\r\nab",
        ] {
            assert_eq!(parse(partial), Ok(None), "{partial:?}");
        }
    }

    #[test]
    fn refuses_what_is_not_resp2_and_claims_beyond_the_limits() {
        for bad in [
            &b"HTTP/1.1 400 Bad Request\r\n"[..],
            b"\r\n",
            b":12x\r\n",
            b"$3\r\nabcd\r\n",
            b"$999999999999\r\n",
            b"%1\r\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let deep = b"*1\r\n".repeat(MAX_DEPTH + 1);
        assert!(parse(&deep).is_err());
        // A huge claimed count allocates nothing up front; it just waits for the items.
        assert_eq!(parse(b"*4000000000\r\n:1\r\n"), Ok(None));
        let long = vec![b'+'; MAX_LINE + 3];
        assert!(parse(&long).is_err());
    }

    /// Bytes that cannot start a RESP2 reply are refused at once, before any line end
    /// arrives: a TLS record or binary garbage is a protocol error, not a wait for a CRLF
    /// that never comes. What can still become a reply waits.
    #[test]
    fn refuses_a_reply_that_cannot_start_before_its_line_ends() {
        for bad in [
            &b"\x16\x03\x01\x00\x2a"[..],
            b"\x00\x01\x02",
            b"H",
            b"$12a",
            b"*x",
            b":1-",
            b"$123456789012345678901",
            b"*2\r\n\x16",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
            assert!(Scan::default().complete(bad).is_err(), "{bad:?}");
        }
        for partial in [&b"$12"[..], b"$-", b"*", b":-4\r", b"+any text", b"-ERR x"] {
            assert_eq!(parse(partial), Ok(None), "{partial:?}");
        }
    }

    /// A large array that arrives in small pieces is scanned once, not again from its
    /// start at each piece, and is complete exactly when its last byte is in.
    #[test]
    fn a_reply_arriving_in_pieces_is_scanned_once() {
        let mut reply = b"*100000\r\n".to_vec();
        for i in 0..100_000 {
            if i % 2 == 0 {
                reply.extend_from_slice(format!(":{i}\r\n").as_bytes());
            } else {
                reply.extend_from_slice(
                    format!("*2\r\n$1\r\nx\r\n${}\r\n{i}\r\n", i.to_string().len()).as_bytes(),
                );
            }
        }
        let mut scan = Scan::default();
        let mut arrived = 0;
        while arrived < reply.len() {
            arrived = (arrived + 7).min(reply.len());
            let done = scan.complete(&reply[..arrived]).expect("valid");
            assert_eq!(done.is_some(), arrived == reply.len(), "at {arrived}");
        }
        // Each header line is read again at most while its own bytes arrive.
        assert!(
            scan.looked_at < 3 * reply.len(),
            "looked at {} bytes of a {}-byte reply",
            scan.looked_at,
            reply.len()
        );
        let (value, used) = parse(&reply).expect("valid").expect("complete");
        assert_eq!(used, reply.len());
        assert!(matches!(value, Value::Array(items) if items.len() == 100_000));
    }

    /// A reply still incomplete past the limit is refused, however it is made up (one
    /// bulk string, or many small items).
    #[test]
    fn a_reply_may_not_grow_without_bound() {
        let many = b"*1000000\r\n"
            .iter()
            .chain(b":1\r\n".repeat(300).iter())
            .copied()
            .collect::<Vec<_>>();
        assert_eq!(Scan::default().complete_within(&many, 2048), Ok(None));
        let err =
            Scan::default().complete_within(&[&many[..], &b":1\r\n".repeat(300)].concat(), 2048);
        assert!(err.is_err(), "{err:?}");
        let bulk = [&b"$100000\r\n"[..], &[b'x'; 4096]].concat();
        assert!(Scan::default().complete_within(&bulk, 2048).is_err());
        const {
            assert!(
                MAX_REPLY > MAX_BULK,
                "the largest bulk string fits in a reply"
            )
        };
    }
}
