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

fn judged(server: &str, client_id: u64, lastsave: i64) -> Judged {
    Judged {
        identity: Identity {
            run_id: "r".into(),
            replid: "x".into(),
        },
        server: server.into(),
        token: Token {
            client_id,
            lastsave,
        },
    }
}

#[test]
fn only_the_checked_master_over_the_checked_connection_is_trusted() {
    let mut map = ShardMap::default();
    let m = masters(NODES);
    assert!(
        !map.trusts(0, &landed("127.0.0.1:30001", 7, 100)),
        "nothing checked yet"
    );
    map.record(
        &m,
        vec![
            (m[2].id.clone(), judged("127.0.0.1:30001", 7, 100)),
            (m[0].id.clone(), judged("127.0.0.1:30002", 9, 100)),
        ],
    );
    assert!(map.trusts(0, &landed("127.0.0.1:30001", 7, 100)));
    assert!(map.trusts(5460, &landed("127.0.0.1:30001", 7, 100)));
    assert!(map.trusts(5461, &landed("127.0.0.1:30002", 9, 100)));
    // Another master for the slot (a failover, or a slot moved).
    assert!(!map.trusts(5461, &landed("127.0.0.1:30001", 7, 100)));
    // A new connection, or a restart that moved LASTSAVE.
    assert!(!map.trusts(0, &landed("127.0.0.1:30001", 8, 100)));
    assert!(!map.trusts(0, &landed("127.0.0.1:30001", 7, 101)));
    // A master that did not answer the check is not trusted.
    assert!(!map.trusts(10923, &landed("127.0.0.1:30003", 1, 100)));
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

/// `CLUSTER NODES` from a broken or hostile server may list slots past the last one:
/// they are ignored, never an out-of-bounds write.
#[test]
fn slots_past_the_last_one_are_ignored() {
    let mut map = ShardMap::default();
    let nodes = "a1 127.0.0.1:1@2 master - 0 0 1 connected 16000-65535\n";
    let m = masters(nodes);
    assert_eq!(m[0].slots, vec![(16000, 65535)]);
    map.record(&m, vec![(m[0].id.clone(), judged("127.0.0.1:1", 1, 1))]);
    assert!(map.trusts(16383, &landed("127.0.0.1:1", 1, 1)));
    assert_eq!(map.owners.len(), SLOTS);
}
