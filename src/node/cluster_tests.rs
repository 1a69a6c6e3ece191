//! Unit tests of `cluster.rs`.

use super::*;

const NODES: &str = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,hostname4 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002,hostname2 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003,hostname3 master - 0 1426238318243 3 connected 10923-16383 [10923->-292f8b365bb7]
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001,hostname1 myself,master - 0 0 1 connected 0-5460
9fd8b365bb7edb5e285caf0b7e6ddc7265d2f4f0 127.0.0.1:30005@31005 master,fail - 0 0 5 disconnected 7
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30006@31006 master - 0 0 6 connected
";

#[test]
fn masters_with_slots_from_cluster_nodes() {
    let m = masters(NODES);
    assert_eq!(m.len(), 3, "{m:?}");
    assert_eq!(m[0].id, "67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1");
    assert_eq!((m[0].host.as_str(), m[0].port), ("127.0.0.1", 30002));
    assert_eq!(m[0].hostname.as_deref(), Some("hostname2"));
    let routes: Vec<_> = m[0].routes().collect();
    assert_eq!(
        routes.len(),
        3,
        "by slot, by IP, then by the announced hostname"
    );
    assert_eq!(
        routes[0],
        SingleNodeRoutingInfo::SpecificNode(Route::new(5461, SlotAddr::Master))
    );
    assert_eq!(m[0].slots, vec![(5461, 10922)]);
    assert_eq!(
        m[1].slots,
        vec![(10923, 16383)],
        "migrating marks are no slots"
    );
    assert_eq!(m[2].slots, vec![(0, 5460)]);
}

fn landed(server: &str, client_id: u64, lastsave: i64) -> Landed {
    Landed {
        server: server.into(),
        token: Token {
            client_id,
            lastsave,
        },
    }
}

fn judged(server: &str, client_id: u64, lastsave: i64, version: &str) -> Judged {
    Judged {
        server: server.into(),
        token: Token {
            client_id,
            lastsave,
        },
        version: version.into(),
        ledger: None,
    }
}

#[test]
fn only_a_checked_master_over_the_checked_connection_is_trusted() {
    let mut map = ShardMap::default();
    let m = masters(NODES);
    assert!(
        !map.trusts(&landed("127.0.0.1:30001", 7, 100)),
        "nothing checked yet"
    );
    map.record(vec![
        (m[2].id.clone(), judged("127.0.0.1:30001", 7, 100, "7.0.15")),
        (m[0].id.clone(), judged("127.0.0.1:30002", 9, 100, "6.2.1")),
    ]);
    assert!(map.trusts(&landed("127.0.0.1:30001", 7, 100)));
    // A resharding's ASK runs a name on the importing master: judged too.
    assert!(map.trusts(&landed("127.0.0.1:30002", 9, 100)));
    // A new connection, or a restart that moved LASTSAVE.
    assert!(!map.trusts(&landed("127.0.0.1:30001", 8, 100)));
    assert!(!map.trusts(&landed("127.0.0.1:30001", 7, 101)));
    // A master that did not answer the check (or a replica promoted since) is not.
    assert!(!map.trusts(&landed("127.0.0.1:30003", 1, 100)));
    assert_eq!(map.oldest_version(), Some("6.2.1"));
}

#[test]
fn an_old_server_without_client_info_is_named_with_its_version() {
    let unknown = redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
        "An error was signalled by the server",
        "Unknown subcommand or wrong number of arguments for 'INFO'. Try CLIENT HELP.".into(),
    ));
    let message = probe_refused(&unknown, Some("6.0.16")).to_string();
    assert!(message.contains("Redis 6.2 or later"), "{message}");
    assert!(message.contains("6.0.16"), "{message}");
    let denied = redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
        "denied",
        "this user has no permissions to run the 'client|info' command".into(),
    ));
    let message = probe_refused(&denied, Some("7.0.15")).to_string();
    assert!(message.contains("+client|info"), "{message}");
}

#[test]
fn reads_where_a_command_ran() {
    let info = Value::BulkString(
        b"id=42 addr=127.0.0.1:51234 laddr=127.0.0.1:30001 fd=9 name= age=3".to_vec(),
    );
    assert_eq!(
        Landed::parse(&info, &Value::Int(1_795_712_258)),
        Some(landed("127.0.0.1:30001", 42, 1_795_712_258))
    );
    assert_eq!(Landed::parse(&info, &Value::Nil), None);
    assert_eq!(Landed::parse(&Value::Int(1), &Value::Int(1)), None);
    // Over RESP3, CLIENT INFO is a verbatim string.
    let verbatim = Value::VerbatimString {
        format: redis::VerbatimFormat::Text,
        text: "id=7 addr=127.0.0.1:1 laddr=10.0.0.2:6379 fd=9".into(),
    };
    assert_eq!(
        Landed::parse(&verbatim, &Value::Int(5)),
        Some(landed("10.0.0.2:6379", 7, 5))
    );
    let missing_id = Value::SimpleString("laddr=10.0.0.2:6379".into());
    assert_eq!(Landed::parse(&missing_id, &Value::Int(5)), None);
}

#[test]
fn the_probe_asks_for_the_connection_and_the_last_save() {
    let mut pipe = redis::pipe();
    add_probe(&mut pipe);
    let packed = String::from_utf8(pipe.get_packed_pipeline()).expect("ASCII");
    assert_eq!(
        packed,
        "*2\r\n$6\r\nCLIENT\r\n$4\r\nINFO\r\n*1\r\n$8\r\nLASTSAVE\r\n"
    );
    assert_eq!(PROBE, 2, "two replies to split off");
}

/// A master's ledger sits in its lowest slot; a master listed without a hostname is
/// reached by its IP only.
#[test]
fn a_masters_ledger_is_in_its_lowest_slot() {
    let nodes = "a1 127.0.0.1:1@2 master - 0 0 1 connected 16000-16383 5 7-9\n";
    let m = masters(nodes);
    assert_eq!(m[0].slots, vec![(16000, 16383), (5, 5), (7, 9)]);
    assert_eq!(m[0].ledger_slot(), 5);
    assert_eq!(m[0].hostname, None);
    assert_eq!(m[0].routes().count(), 2, "by slot, then by IP");
}

/// A check's answer counts as master `m`'s when `CLUSTER MYID` names it; refused (an ACL
/// without `+cluster|myid`), only when it was sent to `m`'s address, never by a slot.
#[test]
fn an_answer_is_the_masters_when_its_id_says_so() {
    let m = &masters("a1 127.0.0.1:1@2 master - 0 0 1 connected 0-9\n")[0];
    let routes: Vec<_> = m.routes().collect();
    let (by_slot, by_address) = (&routes[0], &routes[1]);
    let answer = |id: Value| vec![Value::Okay, id];
    let id = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    assert!(reached(&answer(id("a1")), 1, m, by_slot));
    assert!(reached(&answer(id("a1")), 1, m, by_address));
    assert!(
        !reached(&answer(id("b2")), 1, m, by_slot),
        "a slot map behind"
    );
    assert!(!reached(&answer(id("b2")), 1, m, by_address));
    let refused = redis::parse_redis_value(b"-NOPERM no permissions\r\n").expect("an error reply");
    assert!(matches!(refused, Value::ServerError(_)));
    assert!(!reached(&answer(refused.clone()), 1, m, by_slot));
    assert!(reached(&answer(refused), 1, m, by_address));
    assert!(!reached(&[Value::Okay], 1, m, by_slot), "no reply");
}
