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

/// Parses one reply from the start of `buf`: the value and the bytes it used, `None`
/// when `buf` holds only part of it, or why the bytes are not a RESP2 reply.
pub(super) fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, String> {
    parse_at(buf, 0, 0)
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Value, usize)>, String> {
    let Some((line, next)) = line(buf, at)? else {
        return Ok(None);
    };
    let Some((&kind, rest)) = line.split_first() else {
        return Err("an empty reply line".into());
    };
    let value = match kind {
        b'+' => {
            if rest == b"OK" {
                Value::Okay
            } else {
                Value::SimpleString(String::from_utf8_lossy(rest).into_owned())
            }
        }
        b'-' => {
            // redis-rs classifies the error (NOSCRIPT, READONLY, WRONGTYPE, ...).
            redis::parse_redis_value(&buf[at..next]).map_err(|e| e.to_string())?
        }
        b':' => Value::Int(integer(rest)?),
        b'$' => {
            let len = integer(rest)?;
            if len < 0 {
                return Ok(Some((Value::Nil, next)));
            }
            let len = usize::try_from(len)
                .ok()
                .filter(|&l| l <= MAX_BULK)
                .ok_or("a bulk string longer than 512 MiB")?;
            let end = next.saturating_add(len);
            if buf.len() < end.saturating_add(2) {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err("a bulk string not followed by CRLF".into());
            }
            return Ok(Some((Value::BulkString(buf[next..end].to_vec()), end + 2)));
        }
        b'*' => {
            let count = integer(rest)?;
            if count < 0 {
                return Ok(Some((Value::Nil, next)));
            }
            if depth >= MAX_DEPTH {
                return Err("arrays nested too deeply".into());
            }
            let count = usize::try_from(count).map_err(|_| "an array too long")?;
            // Never trust the count for the allocation: each item takes at least 3 bytes.
            let mut items = Vec::with_capacity(count.min((buf.len() - next) / 3));
            let mut pos = next;
            for _ in 0..count {
                let Some((item, used)) = parse_at(buf, pos, depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                pos = used;
            }
            return Ok(Some((Value::Array(items), pos)));
        }
        other => {
            return Err(format!(
                "unexpected reply type byte {:?}",
                char::from(other)
            ));
        }
    };
    Ok(Some((value, next)))
}

/// The line starting at `at` (without its CRLF) and where the next one starts; `None`
/// when its end has not arrived yet.
fn line(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, String> {
    let rest = &buf[at.min(buf.len())..];
    let window = &rest[..rest.len().min(MAX_LINE + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(end) => Ok(Some((&rest[..end], at + end + 2))),
        None if window.len() > MAX_LINE => Err("a reply line longer than 64 KiB".into()),
        None => Ok(None),
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
}
