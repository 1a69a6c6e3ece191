//! The commands packed as redis-rs packs them, their words kept as ranges, and the
//! batched release.

use super::*;
use crate::scripts::lua::{RECORD_MARKER, RELEASE_MANY_SCRIPT};

/// Commands are packed as redis-rs packs them, also binary keys and `u64::MAX`, and
/// keep their typed fields: a `SET NX PX`'s key and value, a release's key, value and
/// client id, every word for redis-rs, without reading the packed bytes back.
#[test]
fn commands_are_packed_as_redis_rs_packs_them_and_keep_their_fields() {
    let odd: &[u8] = b"a\r\n$3\r\n*\x00\xff";
    for (key, value, ttl_ms) in [
        (&b"redlock:{k}"[..], &b"v"[..], 10_000),
        (odd, &b""[..], u64::MAX),
        (&b""[..], odd, 0),
    ] {
        let call = Request::SetNx { key, value, ttl_ms }.call();
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value).arg("NX").arg("PX").arg(ttl_ms);
        assert_eq!(call.packed(), cmd.get_packed_command());
        assert_eq!(call.cmd().get_packed_command(), cmd.get_packed_command());
        assert!(matches!(
            call.kind,
            CallKind::SetNx {
                key: 1,
                value: 2,
                replay: false
            }
        ));
        assert_eq!(
            (call.word(1), call.word(2), call.word(6)),
            (key, value, &b""[..])
        );
        assert!(!call.is_release() && call.release().is_none());

        let waiting = &b"redlock:#waiting"[..];
        let release = Request::Release {
            key,
            waiting: Some(waiting),
            value,
            id: odd,
        }
        .call();
        let mut by_hand = redis::cmd("EVALSHA");
        by_hand
            .arg(RELEASE_SCRIPT.sha.as_str())
            .arg(2)
            .arg(key)
            .arg(waiting)
            .arg(value)
            .arg(odd);
        assert_eq!(release.packed(), by_hand.get_packed_command());
        assert!(release.is_release());
        assert_eq!(release.release(), Some([key, waiting, value, odd]));
    }
    let keys: [&[u8]; 2] = [b"redlock:{k}", odd];
    let args = [
        Arg::Bytes(odd),
        Arg::Int(0),
        Arg::Int(u64::MAX),
        Arg::Bytes(b""),
        Arg::Bytes(b"more words than are kept inline"),
        Arg::Int(7),
    ];
    for (keys, args) in [
        (&keys[..], &args[..]),
        (&keys[..1], &args[..0]),
        (&[][..], &args[..4]),
    ] {
        let inv = Invocation {
            script: &RELEASE_MANY_SCRIPT,
            keys,
            args,
        };
        let call = Request::Script(Invocation { ..inv }).call();
        let mut by_hand = redis::cmd("EVALSHA");
        by_hand
            .arg(RELEASE_MANY_SCRIPT.sha.as_str())
            .arg(keys.len());
        for key in keys {
            by_hand.arg(*key);
        }
        for arg in args {
            match arg {
                Arg::Bytes(b) => by_hand.arg(*b),
                Arg::Int(n) => by_hand.arg(*n),
            };
        }
        let expected = by_hand.get_packed_command();
        assert_eq!(Invocation { ..inv }.cmd().get_packed_command(), expected);
        assert_eq!(call.packed(), expected);
        assert_eq!(
            call.cmd().get_packed_command(),
            expected,
            "every word, also past 8"
        );
        assert_eq!(call.words.len(), 3 + keys.len() + args.len());
        assert_eq!(call.word(0), b"EVALSHA");
        assert!(
            !call.is_release(),
            "a release is known by its type, not its script"
        );
    }
}

/// `SET NX PX` and `ZADD GT CH` of `fenced`, as redis-rs packs them.
fn fenced_pipe(fenced: &FencedSet<'_>) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(fenced.key)
        .arg(fenced.value)
        .arg("NX")
        .arg("PX")
        .arg(fenced.ttl_ms);
    pipe.cmd("ZADD")
        .arg(fenced.counters)
        .arg("GT")
        .arg("CH")
        .arg(fenced.proposal)
        .arg(fenced.member);
    pipe
}

/// `call`, the acquisition of `fenced`, goes to a Redis Cluster node as its `SET` alone,
/// then the counter's raise and renewal as one script.
fn assert_split_for_a_cluster(call: &Call, fenced: FencedSet<'_>) {
    let (first, then) = call.for_cluster();
    let mut set = redis::pipe();
    set.cmd("SET")
        .arg(fenced.key)
        .arg(fenced.value)
        .arg("NX")
        .arg("PX")
        .arg(fenced.ttl_ms);
    assert_eq!(first.get_packed_pipeline(), set.get_packed_pipeline());
    let mut raise = redis::cmd("EVAL");
    raise
        .arg(crate::scripts::lua::RAISE_COUNTER)
        .arg(1)
        .arg(fenced.counters)
        .arg(fenced.proposal)
        .arg(fenced.member)
        .arg(fenced.renew.expire_ms);
    assert_eq!(
        then.map(|c| c.get_packed_command()),
        Some(raise.get_packed_command())
    );
}

/// The fenced acquisition of the tests: TTL 10 s, set 7, the largest expiry.
fn fenced_set<'a>(
    key: &'a [u8],
    counters: &'a [u8],
    member: &'a [u8],
    value: &'a [u8],
) -> FencedSet<'a> {
    FencedSet {
        key,
        counters,
        member,
        value,
        ttl_ms: 10_000,
        proposal: 1_764_115_200_000_000,
        renew: Renewal {
            expire_ms: u64::MAX,
        },
        set: 7,
    }
}

/// A fenced acquisition is three commands in one request, packed as redis-rs packs the
/// same pipeline, with its key and value kept for the busy path's follow-up; a node sends
/// the first two alone where its connection renewed the set recently.
#[test]
fn a_fenced_acquisition_is_packed_as_a_pipeline() {
    let (key, counters, value) = (&b"redlock:{k}"[..], &b"redlock:#fencing"[..], &b"v"[..]);
    let member = &b"16383"[..];
    let call = Request::FencedSetNx(fenced_set(key, counters, member, value)).call();
    let mut pipe = fenced_pipe(&fenced_set(key, counters, member, value));
    let unrenewed = pipe.get_packed_pipeline();
    pipe.cmd("PEXPIRE").arg(counters).arg(u64::MAX);
    assert_eq!(call.packed(), pipe.get_packed_pipeline());
    assert_eq!(
        call.pipeline_of(3).get_packed_pipeline(),
        pipe.get_packed_pipeline()
    );
    // On a cluster: the SET alone, then the counter's raise and renewal as one script.
    assert_split_for_a_cluster(&call, fenced_set(key, counters, member, value));
    assert_eq!(call.commands(), 3);
    assert_eq!(call.renews(), Some(7));
    assert_eq!(call.without_renewal(), (&unrenewed[..], 2));
    assert_eq!(call.pipeline_of(2).get_packed_pipeline(), unrenewed);
    assert!(matches!(
        call.kind,
        CallKind::FencedSetNx {
            key: 1,
            value: 2,
            set: 7,
            replay: false,
        }
    ));
    assert_eq!((call.word(1), call.word(2)), (key, value));
    assert!(!call.is_release());
    // Only a refused `SET` (its reply first) asks for the holder, with or without the
    // renewal's reply.
    for renewal in [vec![], vec![Value::Int(1)]] {
        let replies = |first| {
            Ok(Value::Array(
                [vec![first, Value::Int(1)], renewal.clone()].concat(),
            ))
        };
        assert!(call.needs_more(&replies(Value::Nil)));
        assert!(!call.needs_more(&replies(Value::Okay)));
    }
    // Other calls have no renewal to leave out.
    let plain = Request::SetNx {
        key,
        value,
        ttl_ms: 1,
    }
    .call();
    assert_eq!(plain.renews(), None);
    assert_eq!(plain.without_renewal(), (plain.packed(), 1));
}

/// A fenced replay's acquisition is the fenced pipeline with `GET` and `PTTL` of the key
/// before the renewal: a refused `SET` needs no follow-up, and its answer is settled into
/// the holder script's (a record, another holder with its TTL and whether it is ours, or a
/// key gone by now); a granted one into the pipeline's. On a cluster the reads are left
/// out and the holder script follows as for the pipeline.
#[test]
fn a_fenced_replay_reads_the_key_in_the_same_request() {
    let (key, counters, value) = (
        &b"redlock:{k}"[..],
        &b"redlock:#fencing"[..],
        &b"0123456789abcdefv1"[..],
    );
    let member = &b"16383"[..];
    let call = Request::FencedSetNxOrReplay(fenced_set(key, counters, member, value)).call();
    let mut pipe = fenced_pipe(&fenced_set(key, counters, member, value));
    pipe.cmd("GET").arg(key);
    pipe.cmd("PTTL").arg(key);
    let unrenewed = pipe.get_packed_pipeline();
    pipe.cmd("PEXPIRE").arg(counters).arg(u64::MAX);
    assert_eq!(call.packed(), pipe.get_packed_pipeline());
    assert_eq!(call.commands(), 5);
    assert_eq!(call.renews(), Some(7));
    assert_eq!(call.without_renewal(), (&unrenewed[..], 4));
    assert_eq!(call.key(), key);
    // On a cluster: the SET alone, then the counter's raise and renewal.
    assert_split_for_a_cluster(&call, fenced_set(key, counters, member, value));

    let bulk = |b: &[u8]| Value::BulkString(b.to_vec());
    let error = |text: &[u8]| redis::parse_redis_value(text).unwrap_or(Value::Nil);
    let record = [RECORD_MARKER, b"body"].concat();
    let array = |v: Vec<Value>| Ok(Value::Array(v));
    let refused = |held: Value, pttl: i64, renewal: Option<Value>| {
        let mut replies = vec![Value::Nil, Value::Int(0), held, Value::Int(pttl)];
        replies.extend(renewal);
        array(replies)
    };
    for renewal in [None, Some(Value::Int(1))] {
        let settle = |first: redis::RedisResult<Value>| {
            assert!(!call.needs_more(&first), "{first:?}");
            call.settled(first).ok()
        };
        assert_eq!(
            settle(refused(bulk(&record), 500, renewal.clone())),
            Some(Value::Array(vec![Value::Int(2), bulk(&record)]))
        );
        for (held, ours) in [
            (&b"0123456789abcdefv2"[..], 1),
            (b"fedcba9876543210v2", 0),
            (b"short", 0),
        ] {
            assert_eq!(
                settle(refused(bulk(held), 500, renewal.clone())),
                Some(Value::Array(vec![
                    Value::Int(0),
                    Value::Int(500),
                    Value::Int(ours)
                ])),
                "{held:?}"
            );
        }
        assert_eq!(
            settle(refused(Value::Nil, -2, renewal.clone())),
            Some(Value::Array(vec![
                Value::Int(0),
                Value::Int(-2),
                Value::Int(1)
            ])),
            "gone by now"
        );
        let mut won = vec![Value::Okay, Value::Int(1), bulk(value), Value::Int(10_000)];
        won.extend(renewal.clone());
        let mut pipeline = vec![Value::Okay, Value::Int(1)];
        pipeline.extend(renewal.clone());
        let settled = settle(array(won));
        assert_eq!(settled, Some(Value::Array(pipeline)));
        assert_eq!(
            call.renewal_ran(
                &settled.ok_or_else(|| redis::RedisError::from(std::io::Error::other("none")))
            ),
            renewal.is_some()
        );
        // An error is left for the parse to fail the node with.
        let wrongtype = refused(
            error(b"-WRONGTYPE Operation against a key\r\n"),
            -1,
            renewal,
        );
        assert_eq!(settle(wrongtype.clone()), wrongtype.ok());
    }
    // Without the reads (a cluster node's answer): the holder script follows.
    let clustered = array(vec![Value::Nil, Value::Int(0), Value::Int(1)]);
    assert!(call.needs_more(&clustered));
    assert_eq!(call.settled(clustered.clone()).ok(), clustered.ok());
    // The pipeline of a lock without replay is left as it is.
    let plain = Request::FencedSetNx(fenced_set(key, counters, member, value)).call();
    let answer = array(vec![
        Value::Nil,
        Value::Int(0),
        bulk(&record),
        Value::Int(5),
    ]);
    assert_eq!(plain.settled(answer.clone()).ok(), answer.ok());
}

/// An unfenced replay's acquisition is `SET NX PX`, `GET` and `PTTL` in one request,
/// settled as the fenced one's: `OK` where the key was set, the holder script's answer
/// where it was taken. On a cluster the `SET` goes alone, and a refused one asks for the
/// holder or the record.
#[test]
fn an_unfenced_replay_reads_the_key_in_the_same_request() {
    let (key, value) = (&b"redlock:{k}"[..], &b"0123456789abcdefv1"[..]);
    let call = Request::SetNxOrReplay {
        key,
        value,
        ttl_ms: 10_000,
    }
    .call();
    let mut set = redis::pipe();
    set.cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(10_000);
    let mut pipe = set.clone();
    pipe.cmd("GET").arg(key);
    pipe.cmd("PTTL").arg(key);
    assert_eq!(call.packed(), pipe.get_packed_pipeline());
    assert_eq!((call.commands(), call.renews()), (3, None));
    assert_eq!(call.key(), key);
    let (first, then) = call.for_cluster();
    assert_eq!(first.get_packed_pipeline(), set.get_packed_pipeline());
    assert!(then.is_none());

    let bulk = |b: &[u8]| Value::BulkString(b.to_vec());
    let record = [RECORD_MARKER, b"body"].concat();
    let replies = |v: Vec<Value>| Ok(Value::Array(v));
    let settled = |first: redis::RedisResult<Value>| {
        assert!(!call.needs_more(&first), "{first:?}");
        call.settled(first).ok()
    };
    assert_eq!(
        settled(replies(vec![Value::Okay, bulk(value), Value::Int(10_000)])),
        Some(Value::Okay)
    );
    assert_eq!(
        settled(replies(vec![Value::Nil, bulk(&record), Value::Int(500)])),
        Some(Value::Array(vec![Value::Int(2), bulk(&record)]))
    );
    assert_eq!(
        settled(replies(vec![
            Value::Nil,
            bulk(b"0123456789abcdefv0"),
            Value::Int(500)
        ])),
        Some(Value::Array(vec![
            Value::Int(0),
            Value::Int(500),
            Value::Int(1)
        ]))
    );
    // A cluster node's answer to the `SET` alone.
    assert!(call.needs_more(&Ok(Value::Nil)));
    assert!(!call.needs_more(&Ok(Value::Okay)));
    // Replies short of the reads (a server that answers fewer) are left for the parse to
    // refuse.
    for short in [vec![Value::Nil, bulk(&record)], vec![Value::Nil]] {
        assert!(!call.needs_more(&replies(short.clone())));
        assert_eq!(
            call.settled(replies(short.clone())).ok(),
            Some(Value::Array(short))
        );
    }
}

/// A script call asks for its `EVAL` fallback when the node lost the script, and only
/// then.
#[test]
fn a_lost_script_asks_for_the_eval_fallback() {
    let call = Request::Release {
        key: b"k",
        waiting: None,
        value: b"v",
        id: b"c",
    }
    .call();
    let error = |text: &[u8]| redis::parse_redis_value(text).unwrap_or(Value::Nil);
    assert!(call.needs_more(&error(b"-NOSCRIPT No matching script.\r\n").extract_error()));
    assert!(!call.needs_more(&error(b"-ERR other\r\n").extract_error()));
    assert!(!call.needs_more(&Ok(Value::Int(1))));
}
