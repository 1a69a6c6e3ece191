//! The parsing of the scripts' replies (and of `SET NX PX`'s) into what each operation
//! needs: granted or held elsewhere, released or not, what a node holds for a name.
//!
//! ```text
//! [OK, 1, 1] (SET, ZADD GT CH, PEXPIRE) ->  AcquireReply::Won { fence: Accepted }
//! {0, 2500, 1}                   ->  AcquireReply::HeldElsewhere { pttl: 2.5 s, ours }
//! 1 / 0 / "ERR ... publish ..."  ->  Deleted::Told / NotHeld / Untold(message)
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // The replies are internal; an inspection shows what they say about a name.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let seen = redlock.inspect("invoice:42").await?;
//! println!("held on {} of {} nodes", seen.held_on(), seen.nodes());
//! # Ok(()) }
//! ```

use std::time::Duration;

use redis::Value;

use super::lua::RECORD_MARKER;
use crate::error::NodeError;

/// What one node holds for a name ([`INSPECT`](super::lua::INSPECT)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Inspected {
    /// A lock or a record is stored under the key.
    pub(crate) held: bool,
    /// It is a completion record.
    pub(crate) record: bool,
    /// The key's remaining TTL, if it has one.
    pub(crate) pttl: Option<Duration>,
    /// The node's fencing counter for the name.
    pub(crate) counter: Option<u64>,
}

/// Parses the reply to [`INSPECT`](super::lua::INSPECT).
pub(crate) fn parse_inspect(v: Value) -> Result<Inspected, NodeError> {
    let bad = || NodeError::Protocol("unexpected reply to the inspect script".into());
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let [Value::Int(kind), Value::Int(pttl), counter] = items.as_slice() else {
        return Err(bad());
    };
    let counter = match counter {
        Value::BulkString(b) if b.is_empty() => None,
        score => Some(
            counter_score(score)
                .or_else(|| pinned(score))
                .ok_or_else(bad)?,
        ),
    };
    Ok(Inspected {
        held: *kind != 0,
        record: *kind == 2,
        pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
        counter,
    })
}

/// What a node answered to an acquisition: `SET NX PX` (then [`HOLDER_TTL`](super::lua::HOLDER_TTL)),
/// or a fenced acquisition's pipeline (then [`HELD_OR_RECORD`](super::lua::HELD_OR_RECORD));
/// a replay's, with the reads of its key, as `Call::settled` leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The key was set; with fencing, whether the node accepted the proposal.
    Won { fence: Option<FenceRead> },
    /// Another value is stored under the key; `pttl` is its remaining TTL, if it has one;
    /// `ours` when the value is one of this client's (starts with its id).
    HeldElsewhere { pttl: Option<Duration>, ours: bool },
    /// The key holds a completion record (the name's work is done): the record.
    Record(Vec<u8>),
}

/// What phase 1 of fencing did on a node that granted the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FenceRead {
    /// The node's counter was below the proposal (or missing): it is the proposal now.
    Accepted,
    /// The node's counter was at or above the proposal, and is left as it is.
    Refused,
}

/// Parses the reply to an acquisition: `OK` (set) or the holder's PTTL from
/// [`HOLDER_TTL`](super::lua::HOLDER_TTL) for `SET NX PX`; `[OK, changed]` (and the
/// `PEXPIRE`'s answer, when it renewed the set) for a fenced
/// acquisition that set the key (`changed`: the `ZADD GT CH`'s answer, 1 when the proposal
/// was accepted); otherwise the scripts' arrays.
pub(crate) fn parse_acquire(v: Value) -> Result<AcquireReply, NodeError> {
    let bad = |what: &dyn std::fmt::Debug| {
        NodeError::Protocol(format!("unexpected reply to the acquire command: {what:?}").into())
    };
    let mut items = match v {
        Value::Okay => return Ok(AcquireReply::Won { fence: None }),
        Value::Array(items) => items,
        other => return Err(bad(&other)),
    };
    if let [Value::Okay | Value::Nil | Value::ServerError(_), ..] = items.as_slice() {
        // A fenced acquisition's pipeline: `SET`, `ZADD`, maybe `PEXPIRE`. An error of
        // any of them fails the node.
        if let Some(at) = items
            .iter()
            .position(|v| matches!(v, Value::ServerError(_)))
        {
            return Err(match items.swap_remove(at).extract_error() {
                Err(e) => NodeError::from(e),
                Ok(other) => bad(&other),
            });
        }
        if let [_, _, Value::Int(_)] = items.as_slice() {
            // The expiry's answer says nothing of the lock.
            items.truncate(2);
        }
    }
    match items.as_slice() {
        [Value::Okay, Value::Int(changed @ (0 | 1))] => Ok(AcquireReply::Won {
            fence: Some(if *changed == 1 {
                FenceRead::Accepted
            } else {
                FenceRead::Refused
            }),
        }),
        [Value::Int(0), Value::Int(pttl), Value::Int(ours)] => Ok(AcquireReply::HeldElsewhere {
            pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
            ours: *ours == 1,
        }),
        [Value::Int(1)] => Ok(AcquireReply::Won { fence: None }),
        [Value::Int(2), Value::BulkString(record)] if record.starts_with(RECORD_MARKER) => {
            Ok(AcquireReply::Record(record.clone()))
        }
        _ => Err(bad(&items)),
    }
}

/// Parses the reply to a compare-and-set script ([`FENCE`](super::lua::FENCE), [`EXTEND`](super::lua::EXTEND)): whether the key
/// still held our value.
pub(crate) fn parse_flag(v: Value) -> Result<bool, NodeError> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected_flag(&other)),
    }
}

/// What a [`RELEASE`](super::lua::RELEASE) (or [`COMPLETE`](super::lua::COMPLETE)) did on one node.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Deleted {
    /// The key no longer held our value: nothing was done.
    NotHeld,
    /// Done, and the waiters were told.
    Told,
    /// Done, but the node refused the `PUBLISH` that tells the waiters: its message.
    Untold(String),
}

/// Parses the reply to [`RELEASE`](super::lua::RELEASE) or [`COMPLETE`](super::lua::COMPLETE).
pub(crate) fn parse_deleted(v: Value) -> Result<Deleted, NodeError> {
    match v {
        Value::Int(1) => Ok(Deleted::Told),
        Value::Int(0) => Ok(Deleted::NotHeld),
        Value::BulkString(message) => Ok(Deleted::Untold(
            String::from_utf8_lossy(&message).into_owned(),
        )),
        other => Err(unexpected_flag(&other)),
    }
}

fn unexpected_flag(other: &Value) -> NodeError {
    NodeError::Protocol(format!("unexpected reply to a compare-and-set script: {other:?}").into())
}

/// The largest fencing number a counter holds exactly: a sorted set's score is a double,
/// exact for every integer up to 2^53 (about 9.0e15; the clock in microseconds is about
/// 1.8e15 in 2026).
pub(crate) const MAX_NUMBER: u64 = 1 << 53;

/// A counter as the node formats a score (`"1764115200000000"`, or a form with an
/// exponent): a whole number from 0 to [`MAX_NUMBER`], or `None`.
fn counter_score(v: &Value) -> Option<u64> {
    let text = match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?,
        Value::Int(n) => return u64::try_from(*n).ok().filter(|n| *n <= MAX_NUMBER),
        _ => return None,
    };
    if let Ok(n) = text.parse::<u64>() {
        return (n <= MAX_NUMBER).then_some(n);
    }
    let x: f64 = text.parse().ok()?;
    let exact = x.is_finite() && x >= 0.0 && x.fract() == 0.0 && x <= MAX_NUMBER as f64;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a whole number from 0 to 2^53, checked above"
    )]
    exact.then_some(x as u64)
}

/// A counter above [`MAX_NUMBER`] (`"9007199254740993"`, `"1e+17"`, `"inf"`): read as
/// [`MAX_NUMBER`], *pinned* (fencing's phase 2 resets it).
fn pinned(v: &Value) -> Option<u64> {
    let Value::BulkString(b) = v else {
        return None;
    };
    let x: f64 = std::str::from_utf8(b).ok()?.parse().ok()?;
    (x >= MAX_NUMBER as f64).then_some(MAX_NUMBER)
}

/// One key's answer in a [`RELEASE_MANY`](super::lua::RELEASE_MANY) reply: `{message}` is the error the key's
/// `GET` raised, as the server would have sent it for that key alone.
pub(super) fn key_answer(answer: Value) -> redis::RedisResult<Value> {
    match answer {
        Value::Array(message) => match message.as_slice() {
            [Value::BulkString(text)] => {
                let mut error = Vec::with_capacity(text.len() + 3);
                error.push(b'-');
                error.extend(text.iter().filter(|&&b| b != b'\r' && b != b'\n'));
                error.extend_from_slice(b"\r\n");
                redis::parse_redis_value(&error)?.extract_error()
            }
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected error in the reply to the batched release script",
            ))),
        },
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn parses_acquire_replies() {
        assert_eq!(
            parse_acquire(Value::Okay).ok(),
            Some(AcquireReply::Won { fence: None })
        );
        let busy =
            |pttl, ours| Value::Array(vec![Value::Int(0), Value::Int(pttl), Value::Int(ours)]);
        assert_eq!(
            parse_acquire(busy(250, 0)).ok(),
            Some(AcquireReply::HeldElsewhere {
                pttl: Some(Duration::from_millis(250)),
                ours: false,
            })
        );
        assert_eq!(
            parse_acquire(busy(-2, 1)).ok(),
            Some(AcquireReply::HeldElsewhere {
                pttl: None,
                ours: true,
            })
        );
        assert!(matches!(
            parse_acquire(Value::Int(250)),
            Err(NodeError::Protocol(_))
        ));
        assert!(matches!(
            parse_acquire(Value::Nil),
            Err(NodeError::Protocol(_))
        ));
        let fenced = |changed| Value::Array(vec![Value::Okay, Value::Int(changed)]);
        assert_eq!(
            parse_acquire(fenced(0)).ok(),
            Some(AcquireReply::Won {
                fence: Some(FenceRead::Refused)
            })
        );
        assert_eq!(
            parse_acquire(fenced(1)).ok(),
            Some(AcquireReply::Won {
                fence: Some(FenceRead::Accepted)
            })
        );
        // With the set's expiry renewed.
        let renewed = Value::Array(vec![Value::Okay, Value::Int(1), Value::Int(1)]);
        assert_eq!(
            parse_acquire(renewed).ok(),
            Some(AcquireReply::Won {
                fence: Some(FenceRead::Accepted)
            })
        );
        let error = |text: &[u8]| redis::parse_redis_value(text).unwrap_or(Value::Nil);
        let failed = Value::Array(vec![
            Value::Okay,
            error(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"),
            Value::Int(1),
        ]);
        assert!(matches!(parse_acquire(failed), Err(NodeError::Redis(_))));
        let unrenewed = Value::Array(vec![
            Value::Okay,
            Value::Int(1),
            error(b"-NOPERM no permission\r\n"),
        ]);
        assert!(
            matches!(parse_acquire(unrenewed), Err(NodeError::Redis(_))),
            "a set whose expiry the node does not renew would stay for ever"
        );
        let more =
            |extra: Vec<Value>| Value::Array([vec![Value::Okay, Value::Int(1)], extra].concat());
        for garbage in [
            fenced(2),
            fenced(-1),
            Value::Array(vec![Value::Okay]),
            more(vec![bulk("1")]),
            more(vec![Value::Int(1), Value::Int(12)]),
            more(vec![Value::Int(1), Value::Int(0), Value::Int(0)]),
        ] {
            assert!(matches!(
                parse_acquire(garbage),
                Err(NodeError::Protocol(_))
            ));
        }
        assert!(matches!(
            parse_flag(Value::Okay),
            Err(NodeError::Protocol(_))
        ));
    }

    #[test]
    fn counters_are_read_in_every_form_a_node_writes_a_score() {
        for (text, n) in [
            ("0", Some(0)),
            ("1764115200000000", Some(1_764_115_200_000_000)),
            ("1.7641152e+15", Some(1_764_115_200_000_000)),
            ("9007199254740992", Some(MAX_NUMBER)),
            ("9007199254740993", None),
            ("1e+17", None),
            ("-1", None),
            ("1.5", None),
            ("inf", None),
            ("nan", None),
            ("", None),
        ] {
            assert_eq!(counter_score(&bulk(text)), n, "{text:?}");
        }
        let inspected = |counter| {
            parse_inspect(Value::Array(vec![Value::Int(1), Value::Int(10), counter]))
                .map(|i| i.counter)
        };
        assert_eq!(inspected(bulk("")).ok(), Some(None));
        assert_eq!(inspected(bulk("42")).ok(), Some(Some(42)));
        assert!(matches!(inspected(bulk("x")), Err(NodeError::Protocol(_))));
        // Above the largest exact number: pinned, read as the maximum.
        for above in ["9007199254740993", "1e+17", "inf"] {
            assert_eq!(
                inspected(bulk(above)).ok(),
                Some(Some(MAX_NUMBER)),
                "{above}"
            );
        }
        for garbage in ["-1", "1.5", "nan", "-inf"] {
            assert!(inspected(bulk(garbage)).is_err(), "{garbage}");
        }
    }
}
