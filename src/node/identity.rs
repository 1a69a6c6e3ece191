//! Who answers at a node's address, and whether it may have lost lock keys: what a connect
//! reads from `INFO server` and `INFO replication` ([`ServerInfo`]), and the rule that
//! keeps a node out of acquisitions until every lock it may have lost has expired
//! ([`quarantine_for`]).
//!
//! A node may have lost keys that are still valid when, within the longest TTL in use:
//! - it restarted (its `run_id` differs from the one this client saw), or it started (on
//!   first contact, its uptime is below the TTL): without `appendfsync always`, a restart
//!   forgets recent writes;
//! - it became a master: replication is asynchronous, so a promoted replica may lack the
//!   writes that had not reached it (a Sentinel or manual failover). `INFO replication`
//!   tells *that* a master was promoted (its `master_replid2` is set: the replication id it
//!   had before) but not *when*; the first client that meets it as a master under its new
//!   replication id leaves a marker key on it (`SET NX PX` of a fixed lifetime), and the
//!   marker's remaining TTL, on the node's own clock, tells every later client how long
//!   ago that was at least ([`PromotionMarker`]). A client that finds no marker counts the
//!   promotion as happening now.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redlock::{NodeStatus, QuarantineReason, Redlock};
//!
//! let redlock = Redlock::builder(["redis://10.0.0.1:6379"]).build()?;
//! for node in redlock.health().await.nodes() {
//!     if let NodeStatus::Quarantined { remaining, reason: QuarantineReason::Promoted } = node.status() {
//!         println!("{} was promoted by a failover: back in {remaining:?}", node.node());
//!     }
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use crate::error::QuarantineReason;

/// The replication role a server reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Role {
    /// Not read (`INFO` refused, or a reply without a role).
    #[default]
    Unknown,
    /// A master: it takes writes.
    Master,
    /// A replica (or any other role): `role:<what>`.
    Other(String),
}

/// What `INFO server` and `INFO replication` said on the last connect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    pub(crate) run_id: String,
    pub(crate) uptime: Duration,
    pub(crate) version: String,
    pub(crate) role: Role,
    /// `master_replid`: the replication history the server's data belongs to.
    pub(crate) replid: String,
    /// `master_replid2` is set: the server was promoted to master (at some time).
    pub(crate) promoted: bool,
    /// `server_time_usec`: the server's clock, in µs since the Unix epoch, when it wrote
    /// the reply (Redis 5 and later, Valkey).
    pub(crate) time_us: Option<u64>,
    /// `aof_enabled:1` (`INFO persistence`): the server logs its writes to an append-only
    /// file and reloads them when it restarts.
    pub(crate) persistent: bool,
}

/// `master_replid2` of a server that was never promoted.
const NO_REPLID: &str = "0000000000000000000000000000000000000000";

impl ServerInfo {
    /// Reads the fields out of `INFO` replies (any sections; unknown lines are skipped).
    pub(crate) fn parse<'a>(replies: impl IntoIterator<Item = &'a str>) -> Self {
        let mut out = Self::default();
        for line in replies.into_iter().flat_map(str::lines) {
            let Some((k, v)) = line.trim_end().split_once(':') else {
                continue;
            };
            match k {
                "run_id" => out.run_id = v.to_owned(),
                "redis_version" => out.version = v.to_owned(),
                "uptime_in_seconds" => out.uptime = Duration::from_secs(v.parse().unwrap_or(0)),
                "role" if v == "master" => out.role = Role::Master,
                "role" => out.role = Role::Other(v.to_owned()),
                "master_replid" => out.replid = v.to_owned(),
                "master_replid2" => out.promoted = !v.is_empty() && v != NO_REPLID,
                "server_time_usec" => out.time_us = v.parse().ok(),
                "aof_enabled" => out.persistent = v == "1",
                _ => {}
            }
        }
        out
    }

    /// Who the server is, if `INFO` told.
    pub(crate) fn identity(&self) -> Option<Identity> {
        (!self.run_id.is_empty()).then(|| Identity {
            run_id: self.run_id.clone(),
            replid: self.replid.clone(),
        })
    }
}

/// A server process and the replication history of its data: a new `run_id` is a restart
/// (or another server), a new replication id of the same process a promotion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) run_id: String,
    pub(crate) replid: String,
}

/// How long to keep a node that just connected out of acquisitions, and why: given who
/// answered there before (`known`, if this client connected before), what it says now,
/// how long it has been a master at least (`master_for`, from its [`PromotionMarker`];
/// zero when unknown), and the longest TTL in use. The longest of the reasons that apply.
pub(crate) fn quarantine_for(
    known: Option<&Identity>,
    now: &ServerInfo,
    master_for: Duration,
    max_ttl: Duration,
) -> Option<(Duration, QuarantineReason)> {
    let promoted = (
        max_ttl.saturating_sub(master_for),
        QuarantineReason::Promoted,
    );
    let reasons = match known {
        Some(k) if k.run_id != now.run_id => [Some((max_ttl, QuarantineReason::Restarted)), None],
        // The same process with another replication history: demoted, then promoted.
        Some(k) if !k.replid.is_empty() && !now.replid.is_empty() && k.replid != now.replid => {
            [Some(promoted), None]
        }
        Some(_) => [None, None],
        // First contact. `uptime_in_seconds` is rounded down, so this errs on the long side.
        None => [
            Some((max_ttl.saturating_sub(now.uptime), QuarantineReason::Young)),
            now.promoted.then_some(promoted),
        ],
    };
    reasons
        .into_iter()
        .flatten()
        .filter(|(length, _)| !length.is_zero())
        .max_by_key(|(length, _)| *length)
}

/// How long a promotion marker lives: a client that meets a master promoted longer ago
/// than this finds no marker and counts the promotion as new (a quarantine of one TTL).
pub(crate) const MARKER_LIFETIME: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// The marker a client leaves on a promoted master: a key named after its replication id,
/// set once (`NX`) with [`MARKER_LIFETIME`], whose remaining TTL tells how long ago the
/// first client met the server as a master under that id.
#[derive(Debug, Clone)]
pub(crate) struct PromotionMarker {
    pub(crate) key: Vec<u8>,
}

impl PromotionMarker {
    /// The marker of replication id `replid` under `prefix` (the client's key prefix, so
    /// that the key falls under the ACL pattern of its keys).
    pub(crate) fn new(prefix: &[u8], replid: &str) -> Self {
        let mut key = prefix.to_vec();
        key.extend_from_slice(b"#promoted:");
        key.extend_from_slice(replid.as_bytes());
        Self { key }
    }

    /// The marker of `replid` under `prefix` in hash slot `slot` (on a Redis Cluster, the
    /// marker of a shard's master goes in one of its slots).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn in_slot(prefix: &[u8], replid: &str, slot: u16) -> Self {
        let infix = [&b"#promoted:"[..], replid.as_bytes()].concat();
        Self {
            key: crate::name::tagged_key(prefix, &infix, &crate::name::slot::tag(slot)),
        }
    }

    /// `SET key 1 NX PX lifetime` and `PTTL key`, in one pipeline.
    pub(crate) fn commands(&self) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&self.key)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(millis(MARKER_LIFETIME))
            .cmd("PTTL")
            .arg(&self.key);
        pipe
    }

    /// How long the server has been a master at least, from the replies to
    /// [`commands`](Self::commands) (the marker's remaining TTL in ms): zero for a marker
    /// just made, or missing.
    pub(crate) fn master_for(replies: &[redis::Value]) -> Duration {
        let pttl = replies
            .get(1)
            .and_then(|v| redis::from_redis_value_ref::<i64>(v).ok());
        match pttl.map(u64::try_from) {
            Some(Ok(left)) => MARKER_LIFETIME.saturating_sub(Duration::from_millis(left)),
            _ => Duration::ZERO,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(run_id: &str, uptime: u64, replid: &str, promoted: bool) -> ServerInfo {
        ServerInfo {
            run_id: run_id.into(),
            uptime: Duration::from_secs(uptime),
            version: "7.0.0".into(),
            role: Role::Master,
            replid: replid.into(),
            promoted,
            time_us: None,
            persistent: false,
        }
    }

    fn known(run_id: &str, replid: &str) -> Identity {
        Identity {
            run_id: run_id.into(),
            replid: replid.into(),
        }
    }

    const TTL: Duration = Duration::from_secs(30);
    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn first_contact_with_a_young_node_waits_out_the_rest_of_the_ttl() {
        let young = info("a", 10, "r", false);
        assert_eq!(
            quarantine_for(None, &young, Duration::ZERO, TTL),
            Some((S(20), QuarantineReason::Young))
        );
        assert_eq!(
            quarantine_for(None, &info("a", 30, "r", false), S(0), TTL),
            None
        );
        assert_eq!(
            quarantine_for(None, &info("a", 3600, "r", false), S(0), TTL),
            None
        );
    }

    /// A replica promoted days after it started: its uptime says nothing of the failover.
    #[test]
    fn first_contact_with_a_promoted_master_counts_from_its_marker() {
        let promoted = info("a", 86_400, "r2", true);
        assert_eq!(
            quarantine_for(None, &promoted, Duration::ZERO, TTL),
            Some((TTL, QuarantineReason::Promoted)),
            "no marker yet: the promotion counts as now"
        );
        assert_eq!(
            quarantine_for(None, &promoted, S(12), TTL),
            Some((S(18), QuarantineReason::Promoted))
        );
        assert_eq!(quarantine_for(None, &promoted, S(30), TTL), None);
        assert_eq!(quarantine_for(None, &promoted, S(3600), TTL), None);
        // Young and promoted: the longer wait wins.
        let both = info("a", 5, "r2", true);
        assert_eq!(
            quarantine_for(None, &both, S(20), TTL),
            Some((S(25), QuarantineReason::Young))
        );
        assert_eq!(
            quarantine_for(None, &both, S(2), TTL),
            Some((S(28), QuarantineReason::Promoted))
        );
    }

    #[test]
    fn a_new_run_id_waits_a_whole_ttl_whatever_its_uptime_or_marker() {
        assert_eq!(
            quarantine_for(
                Some(&known("a", "r")),
                &info("b", 3600, "r", true),
                S(3600),
                TTL
            ),
            Some((TTL, QuarantineReason::Restarted))
        );
        assert_eq!(
            quarantine_for(Some(&known("a", "r")), &info("a", 1, "r", false), S(0), TTL),
            None,
            "the same process, the same history: trusted"
        );
    }

    #[test]
    fn the_same_process_with_a_new_replication_history_was_promoted() {
        let again = info("a", 3600, "r3", true);
        assert_eq!(
            quarantine_for(Some(&known("a", "r1")), &again, S(0), TTL),
            Some((TTL, QuarantineReason::Promoted))
        );
        assert_eq!(
            quarantine_for(Some(&known("a", "r1")), &again, S(40), TTL),
            None
        );
        // A server that did not tell its replication id is judged by its run id alone.
        assert_eq!(
            quarantine_for(Some(&known("a", "")), &again, S(0), TTL),
            None
        );
    }

    #[test]
    fn parses_info_server_and_replication() {
        let server = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n\
             server_time_usec:1764115200123456\r\n";
        let replication = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\
             master_replid:c70cabafba6da01746872b7d0fe1dc5ce1ce997d\r\n\
             master_replid2:2f28f74cc6fd3da380f78cdfe24446b3d02d5cda\r\n";
        let s = ServerInfo::parse([server, replication]);
        assert_eq!(s.version, "7.0.15");
        assert_eq!(s.run_id, "abc123");
        assert_eq!(s.uptime, S(42));
        assert_eq!(s.role, Role::Master);
        assert_eq!(s.replid, "c70cabafba6da01746872b7d0fe1dc5ce1ce997d");
        assert!(s.promoted);
        assert_eq!(s.time_us, Some(1_764_115_200_123_456));
        assert_eq!(ServerInfo::parse(["server_time_usec:x\r\n"]).time_us, None);
        let fresh = ServerInfo::parse([&*format!("role:master\r\nmaster_replid2:{NO_REPLID}\r\n")]);
        assert!(!fresh.promoted);
        let replica = ServerInfo::parse(["role:slave\r\nmaster_host:10.0.0.1\r\n"]);
        assert_eq!(replica.role, Role::Other("slave".into()));
        assert_eq!(ServerInfo::parse([""]).role, Role::Unknown);
        assert!(ServerInfo::parse(["# Persistence\r\naof_enabled:1\r\n"]).persistent);
        assert!(!ServerInfo::parse(["aof_enabled:0\r\n"]).persistent);
    }

    #[test]
    fn an_identity_needs_a_run_id() {
        let s = info("abc", 1, "r1", false);
        assert_eq!(
            s.identity(),
            Some(Identity {
                run_id: "abc".into(),
                replid: "r1".into()
            })
        );
        assert_eq!(ServerInfo::default().identity(), None, "INFO refused");
    }

    #[test]
    fn a_marker_is_set_once_for_thirty_days_and_read_in_one_request() {
        assert_eq!(MARKER_LIFETIME, Duration::from_secs(2_592_000));
        let marker = PromotionMarker::new(b"p:", "r9");
        let packed = String::from_utf8(marker.commands().get_packed_pipeline()).expect("ASCII");
        assert_eq!(
            packed,
            "*6\r\n$3\r\nSET\r\n$14\r\np:#promoted:r9\r\n$1\r\n1\r\n$2\r\nNX\r\n\
             $2\r\nPX\r\n$10\r\n2592000000\r\n*2\r\n$4\r\nPTTL\r\n$14\r\np:#promoted:r9\r\n"
        );
    }

    #[test]
    fn a_marker_tells_how_long_ago_it_was_made() {
        let life = i64::try_from(MARKER_LIFETIME.as_millis()).expect("fits");
        let pttl = |ms: i64| [redis::Value::Nil, redis::Value::Int(ms)];
        assert_eq!(PromotionMarker::master_for(&pttl(life)), Duration::ZERO);
        assert_eq!(PromotionMarker::master_for(&pttl(life - 12_000)), S(12));
        assert_eq!(
            PromotionMarker::master_for(&pttl(-2)),
            Duration::ZERO,
            "missing"
        );
        assert_eq!(
            PromotionMarker::master_for(&pttl(-1)),
            Duration::ZERO,
            "no expiry"
        );
        assert_eq!(PromotionMarker::master_for(&[]), Duration::ZERO, "refused");
        assert_eq!(
            PromotionMarker::new(b"redlock:", "ab12").key,
            b"redlock:#promoted:ab12".to_vec()
        );
        // Slot 7638 is that of `{8586}`.
        let in_slot = PromotionMarker::in_slot(b"redlock:", "ab12", 7638).key;
        assert_eq!(in_slot, b"redlock:#promoted:ab12{8586}".to_vec());
        assert_eq!(crate::name::slot::slot(&in_slot), 7638);
    }
}
