//! What a server says of itself in `INFO`: who it is (`run_id`), since when it runs, its
//! replication role and history, its clock and whether it keeps an append-only file. The
//! node-loss judge reads it as a second opinion beside the node's own ledger.
//!
//! ```text
//! INFO server       run_id, uptime_in_seconds, redis_version, server_time_usec
//! INFO replication  role, master_replid, master_replid2 (set: promoted, or reloaded)
//! INFO persistence  aof_enabled
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Every connect and every health check reads it; `health()` shows version and role.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! for node in redlock.health().await.nodes() {
//!     println!("{}: {:?} {:?}", node.node(), node.version(), node.role());
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

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

/// What `INFO server`, `INFO replication` and `INFO persistence` said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    /// `run_id`: the server process (empty when `INFO` does not tell, as behind some
    /// proxies).
    pub(crate) run_id: String,
    pub(crate) uptime: Duration,
    pub(crate) version: String,
    pub(crate) role: Role,
    /// `master_replid`: the replication history the server's data belongs to.
    pub(crate) replid: String,
    /// `master_replid2` is set: the server became a master from a replica, or reloaded
    /// its data from a file as a master (both shift the old history there).
    pub(crate) promoted: bool,
    /// `server_time_usec`: the server's clock, in µs since the Unix epoch, when it wrote
    /// the reply (Redis 5 and later, Valkey).
    pub(crate) time_us: Option<u64>,
    /// `aof_enabled` (`INFO persistence`): whether the server logs its writes to an
    /// append-only file and reloads them when it restarts (`None`: not told).
    pub(crate) append_only: Option<bool>,
}

/// `master_replid2` of a server that was never promoted (or whose old history was
/// cleared).
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
                "aof_enabled" => out.append_only = Some(v == "1"),
                _ => {}
            }
        }
        out
    }

    /// The server's clock in whole ms since the Unix epoch, if `INFO server` told.
    pub(crate) fn time_ms(&self) -> Option<u64> {
        self.time_us.map(|us| us / 1_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_info_server_replication_and_persistence() {
        let server = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n\
             server_time_usec:1764115200123456\r\n";
        let replication = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\
             master_replid:c70cabafba6da01746872b7d0fe1dc5ce1ce997d\r\n\
             master_replid2:2f28f74cc6fd3da380f78cdfe24446b3d02d5cda\r\n";
        let s = ServerInfo::parse([server, replication]);
        assert_eq!(s.version, "7.0.15");
        assert_eq!(s.run_id, "abc123");
        assert_eq!(s.uptime, Duration::from_secs(42));
        assert_eq!(s.role, Role::Master);
        assert_eq!(s.replid, "c70cabafba6da01746872b7d0fe1dc5ce1ce997d");
        assert!(s.promoted);
        assert_eq!(s.time_us, Some(1_764_115_200_123_456));
        assert_eq!(s.time_ms(), Some(1_764_115_200_123));
        assert_eq!(ServerInfo::parse(["server_time_usec:x\r\n"]).time_us, None);
        let fresh = ServerInfo::parse([&*format!("role:master\r\nmaster_replid2:{NO_REPLID}\r\n")]);
        assert!(!fresh.promoted);
        let replica = ServerInfo::parse(["role:slave\r\nmaster_host:10.0.0.1\r\n"]);
        assert_eq!(replica.role, Role::Other("slave".into()));
        assert_eq!(ServerInfo::parse([""]).role, Role::Unknown);
        assert_eq!(
            ServerInfo::parse(["# Persistence\r\naof_enabled:1\r\n"]).append_only,
            Some(true)
        );
        assert_eq!(
            ServerInfo::parse(["aof_enabled:0\r\n"]).append_only,
            Some(false)
        );
        assert_eq!(ServerInfo::parse(["role:master\r\n"]).append_only, None);
    }
}
