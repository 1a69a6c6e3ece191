//! The commands packed as redis-rs packs them, their words kept as ranges, and the
//! batched release.

use super::*;
use crate::scripts::lua::RELEASE_MANY_SCRIPT;

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
        assert!(matches!(call.kind, CallKind::SetNx { key: 1, value: 2 }));
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

/// A fenced acquisition is three commands in one request, packed as redis-rs packs the
/// same pipeline, with its key and value kept for the busy path's follow-up; a node sends
/// the first two alone where its connection renewed the set recently.
#[test]
fn a_fenced_acquisition_is_packed_as_a_pipeline() {
    let (key, counters, value) = (&b"redlock:{k}"[..], &b"redlock:#fencing"[..], &b"v"[..]);
    let member = &b"16383"[..];
    let call = Request::FencedSetNx {
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
    .call();
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(10_000);
    pipe.cmd("ZADD")
        .arg(counters)
        .arg("GT")
        .arg("CH")
        .arg(1_764_115_200_000_000_u64)
        .arg(member);
    let unrenewed = pipe.get_packed_pipeline();
    pipe.cmd("PEXPIRE").arg(counters).arg(u64::MAX);
    assert_eq!(call.packed(), pipe.get_packed_pipeline());
    assert_eq!(
        call.pipeline_of(3).get_packed_pipeline(),
        pipe.get_packed_pipeline()
    );
    // On a cluster: the SET alone, then the counter's raise and renewal as one script.
    let (first, then) = call.for_cluster();
    let mut set = redis::pipe();
    set.cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(10_000);
    assert_eq!(first.get_packed_pipeline(), set.get_packed_pipeline());
    let mut raise = redis::cmd("EVAL");
    raise
        .arg(crate::scripts::lua::RAISE_COUNTER)
        .arg(1)
        .arg(counters)
        .arg(1_764_115_200_000_000_u64)
        .arg(member)
        .arg(u64::MAX);
    assert_eq!(
        then.map(|c| c.get_packed_command()),
        Some(raise.get_packed_command())
    );
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
