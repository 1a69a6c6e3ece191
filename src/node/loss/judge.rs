//! The judge: from what a node's ledger says and what its `INFO` says, whether the node
//! lost keys now, and the ledger it must hold from now on. A pure function (no clock, no
//! I/O, no randomness: the node's time and a fresh epoch come in), so the connect, health
//! and cluster paths share it, and a simulation can drive it.
//!
//! | the node answers | `INFO` against the ledger | verdict | the ledger |
//! |---|---|---|---|
//! | without a ledger (or another program's value) | any | lost everything: `Empty` | new epoch, `since` = the process's start if younger than the horizon and never promoted nor reloaded, else now |
//! | with its ledger | another `run_id`, a process younger than the horizon this client did not know | `Restarted` | `since` = now |
//! | with its ledger | another `run_id`, otherwise | `Promoted` (a failover) | `since` = now |
//! | with its ledger | same `run_id`, another replication id, `master_replid2` set | `Promoted` (demoted and promoted again) | `since` = now |
//! | with its ledger | same `run_id`, another replication id, `master_replid2` cleared | nothing lost (a replica attached, a backup, the backlog freed) | new replication id |
//! | with its ledger | same `run_id` and replication id | nothing | unchanged |
//!
//! A field `INFO` does not tell (no `run_id` behind some proxies) is not compared: the
//! epoch still decides. A loss never moves `since` back. A process found empty, younger
//! than the horizon and never promoted nor reloaded (`master_replid2` cleared) lost its
//! data at its start at the latest: the same address served the process before it, and no
//! client has used it since (each kept it out for the horizon from a moment no earlier
//! than its start), so a flush since its start lost nothing that counts, and its
//! quarantine ends a horizon after the restart, as the Redlock spec's delayed restart
//! asks, whenever a client first reads it. Any other loss (a promotion, a reload, a flush
//! of an older process) is dated by the first read that shows it: `INFO` does not date it.
//!
//! ```
//! // Checked from the outside through `health()`: a node that lost its data shows as
//! // quarantined, with the same end on every client.
//! use tower_redlock::{NodeStatus, QuarantineReason};
//! fn lost_everything(status: &NodeStatus) -> bool {
//!     matches!(status, NodeStatus::Quarantined { reason: QuarantineReason::Empty, .. })
//! }
//! # let _ = lost_everything;
//! ```

use std::time::Duration;

use super::info::ServerInfo;
use super::ledger::{Ledger, Why};

/// What the judge looks at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen<'a> {
    /// The ledger's value on the node (`None`: no ledger).
    pub(crate) ledger: Option<&'a [u8]>,
    /// What `INFO` said in the same request.
    pub(crate) info: &'a ServerInfo,
    /// The node's clock at the read, in ms since the Unix epoch.
    pub(crate) now_ms: u64,
    /// The longest TTL in use: a process younger than this restarted, an older one that
    /// takes over was promoted (the reason's label only; both lose keys now).
    pub(crate) horizon: Duration,
    /// The `run_id` this client saw at the node before, if any: a process this client
    /// knew did not restart (the label only).
    pub(crate) known_run: Option<&'a str>,
    /// The epoch of a ledger this judgement makes, if it must make one.
    pub(crate) fresh_epoch: &'a str,
}

/// The judge's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Judgement {
    /// The ledger the node holds from now on.
    pub(crate) ledger: Ledger,
    /// Whether that differs from what was read (the node's ledger must be swapped).
    pub(crate) write: bool,
    /// The loss found now, if any (the ledger's `since` is then `now_ms`, or later if it
    /// already was).
    pub(crate) loss: Option<Why>,
}

/// Judges what a node said (see the module docs).
pub(crate) fn judge(seen: &Seen<'_>) -> Judgement {
    let info = seen.info;
    let Some(before) = seen.ledger.and_then(Ledger::parse) else {
        let ledger = Ledger {
            epoch: seen.fresh_epoch.to_owned(),
            since_ms: lost_at(seen),
            why: Why::Empty,
            run_id: info.run_id.clone(),
            replid: info.replid.clone(),
        };
        return Judgement {
            ledger,
            write: true,
            loss: Some(Why::Empty),
        };
    };
    let differs = |was: &str, now: &str| !was.is_empty() && !now.is_empty() && was != now;
    let loss = if differs(&before.run_id, &info.run_id) {
        let known = seen.known_run == Some(info.run_id.as_str());
        Some(if young(seen) && !known {
            Why::Restarted
        } else {
            Why::Promoted
        })
    } else if differs(&before.replid, &info.replid) && info.promoted {
        Some(Why::Promoted)
    } else {
        None
    };
    let mut ledger = before.clone();
    // What INFO tells now replaces what it told before (or fills in what it did not).
    if !info.run_id.is_empty() {
        ledger.run_id.clone_from(&info.run_id);
    }
    if !info.replid.is_empty() {
        ledger.replid.clone_from(&info.replid);
    }
    if let Some(why) = loss {
        ledger.since_ms = ledger.since_ms.max(seen.now_ms);
        ledger.why = why;
    }
    Judgement {
        write: ledger != before,
        ledger,
        loss,
    }
}

/// Whether the server process started less than the horizon ago (by an `INFO` that names
/// its process: behind a proxy that hides `run_id`, the uptime may be the proxy's).
fn young(seen: &Seen<'_>) -> bool {
    !seen.info.run_id.is_empty() && seen.info.uptime < seen.horizon
}

/// When a server found without its ledger lost what it held: at its start, for a process
/// younger than the horizon that never took over another's data (`master_replid2`
/// cleared: not promoted, not reloaded): the same address served the process before it,
/// which granted nothing after it died, and no client took a lock on this one since (each
/// kept it out for the horizon from a moment no earlier than its start), so a flush since
/// lost nothing that counts. Now otherwise: a flush could have come any time, and a
/// promoted replica lost the old master's writes at its promotion, which `INFO` does not
/// date. `uptime_in_seconds` is rounded down, so the start is late by under a second: the
/// long side.
fn lost_at(seen: &Seen<'_>) -> u64 {
    if !young(seen) || seen.info.promoted {
        return seen.now_ms;
    }
    let uptime = u64::try_from(seen.info.uptime.as_millis()).unwrap_or(u64::MAX);
    seen.now_ms.saturating_sub(uptime)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::loss::info::Role;

    const NOW: u64 = 1_800_000_000_000;
    const HORIZON: Duration = Duration::from_secs(30);

    fn info(run_id: &str, replid: &str, promoted: bool, uptime_s: u64) -> ServerInfo {
        ServerInfo {
            run_id: run_id.into(),
            uptime: Duration::from_secs(uptime_s),
            role: Role::Master,
            replid: replid.into(),
            promoted,
            ..ServerInfo::default()
        }
    }

    fn ledger(run_id: &str, replid: &str, since_ms: u64) -> String {
        Ledger {
            epoch: "e1".into(),
            since_ms,
            why: Why::Empty,
            run_id: run_id.into(),
            replid: replid.into(),
        }
        .value()
    }

    fn judged(ledger: Option<&str>, info: &ServerInfo) -> Judgement {
        judge(&Seen {
            ledger: ledger.map(str::as_bytes),
            info,
            now_ms: NOW,
            horizon: HORIZON,
            known_run: None,
            fresh_epoch: "fresh",
        })
    }

    #[test]
    fn a_node_without_a_ledger_lost_everything_now() {
        let i = info("a", "r", false, 86_400);
        for read in [None, Some(""), Some("not ours"), Some("2 e 1 empty - -")] {
            let j = judged(read, &i);
            assert_eq!(j.loss, Some(Why::Empty), "{read:?}");
            assert!(j.write);
            assert_eq!(j.ledger.epoch, "fresh");
            assert_eq!(j.ledger.since_ms, NOW, "up for long: flushed any time");
            assert_eq!(
                (j.ledger.run_id.as_str(), j.ledger.replid.as_str()),
                ("a", "r")
            );
        }
    }

    /// A process younger than the horizon found without a ledger, never promoted nor
    /// reloaded, lost its data at its start at the latest: the same address served the
    /// process before it, and no client has used it since (each kept it out from a moment
    /// no earlier than its start). Any other loss is dated now.
    #[test]
    fn a_young_fresh_process_without_a_ledger_lost_its_data_at_its_start() {
        let fresh = info("a", "r", false, 12);
        assert_eq!(judged(None, &fresh).ledger.since_ms, NOW - 12_000);
        // As old as the horizon or older, or an uptime without a run id (a proxy's?): now.
        assert_eq!(
            judged(None, &info("a", "r", false, 30)).ledger.since_ms,
            NOW
        );
        assert_eq!(judged(None, &info("", "r", false, 12)).ledger.since_ms, NOW);
        // A young replica promoted (or a reload): what it lacks was lost at a moment INFO
        // does not date.
        assert_eq!(judged(None, &info("a", "r", true, 12)).ledger.since_ms, NOW);
        // Another process with the ledger: a reload or a failover, now.
        let read = ledger("x", "r", 5);
        let restarted = judged(Some(&read), &fresh);
        assert_eq!(restarted.loss, Some(Why::Restarted));
        assert_eq!(restarted.ledger.since_ms, NOW);
    }

    #[test]
    fn the_same_server_with_its_ledger_lost_nothing() {
        let read = ledger("a", "r", 5);
        let j = judged(Some(&read), &info("a", "r", true, 10));
        assert_eq!(
            (j.loss, j.write, j.ledger.since_ms),
            (None, false, 5),
            "promoted long ago, seen before: nothing new"
        );
    }

    #[test]
    fn another_process_lost_what_was_not_saved_or_replicated() {
        let read = ledger("a", "r", 5);
        let young = judged(Some(&read), &info("b", "r2", true, 3));
        assert_eq!(young.loss, Some(Why::Restarted), "reloaded from its file");
        assert_eq!(young.ledger.since_ms, NOW, "not dated by INFO");
        assert!(young.write);
        assert_eq!(young.ledger.run_id, "b");
        assert_eq!(young.ledger.epoch, "e1", "the dataset is the same one");
        let old = judged(Some(&read), &info("b", "r2", false, 86_400));
        assert_eq!(old.loss, Some(Why::Promoted), "a replica took over");
        // A replica promoted over an hour ago whose old history was cleared since: the
        // ledger it replicated still names the old master.
        let cleared = judged(Some(&read), &info("b", "r3", false, 7_200));
        assert_eq!(cleared.loss, Some(Why::Promoted));
        // A young process this client knew: it did not restart, it took another server's
        // data (demoted, synced, promoted again).
        let knew = judge(&Seen {
            ledger: Some(read.as_bytes()),
            info: &info("b", "r2", true, 3),
            now_ms: NOW,
            horizon: HORIZON,
            known_run: Some("b"),
            fresh_epoch: "fresh",
        });
        assert_eq!(knew.loss, Some(Why::Promoted));
    }

    #[test]
    fn a_new_replication_id_is_a_loss_only_after_a_promotion() {
        let read = ledger("a", "r", 5);
        let promoted = judged(Some(&read), &info("a", "r2", true, 86_400));
        assert_eq!(
            promoted.loss,
            Some(Why::Promoted),
            "demoted, promoted again"
        );
        assert_eq!(promoted.ledger.since_ms, NOW);
        // A replica attached to a master without a backlog, a backup by SYNC, the backlog
        // freed: a new id, the old one cleared. Kept in service; the ledger follows.
        let routine = judged(Some(&read), &info("a", "r2", false, 86_400));
        assert_eq!(routine.loss, None);
        assert!(routine.write);
        assert_eq!(routine.ledger.replid, "r2");
        assert_eq!(routine.ledger.since_ms, 5);
    }

    #[test]
    fn what_info_does_not_tell_is_not_compared() {
        let read = ledger("a", "r", 5);
        let hidden = judged(Some(&read), &info("", "", false, 0));
        assert_eq!((hidden.loss, hidden.write), (None, false));
        assert_eq!(hidden.ledger.run_id, "a", "kept for when INFO tells again");
        let unknown_before = ledger("", "", 5);
        let told = judged(Some(&unknown_before), &info("a", "r", true, 1));
        assert_eq!(told.loss, None, "nothing to compare with");
        assert!(told.write, "filled in");
        assert_eq!(
            (told.ledger.run_id.as_str(), told.ledger.replid.as_str()),
            ("a", "r")
        );
        // Without a run id, a node that comes back empty is still seen.
        assert_eq!(judged(None, &info("", "", false, 0)).loss, Some(Why::Empty));
    }

    #[test]
    fn a_loss_never_moves_since_back() {
        let read = ledger("a", "r", NOW + 60_000);
        let j = judged(Some(&read), &info("b", "r", false, 1));
        assert_eq!(j.loss, Some(Why::Restarted));
        assert_eq!(j.ledger.since_ms, NOW + 60_000, "a clock stepped back");
    }
}
