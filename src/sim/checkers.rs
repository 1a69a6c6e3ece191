//! The simulation's checkers, over one schedule's [`History`]: never two valid holders
//! of a name, and fencing numbers that strictly increase from holder to holder, across
//! clients (but where a documented limit of `docs/reliability.md` explains it: within a
//! check interval after a FLUSHALL, or after a majority of the nodes lost their data,
//! counters and horizon included, before the clients with the longest TTL checked them
//! again); no
//! refusal in a schedule whose faults lose nothing; no acquisition longer than its
//! rounds' per-node timeouts; every client served at the healed end.
//!
//! ```text
//! grants of one name, by time:  [a.from, a.until) and [b.from, b.until) overlap -> two holders
//!                               a before b, both fenced, b.fence <= a.fence      -> fencing
//! ```

use std::time::Duration;

use super::world::{CHECK_EVERY, FAULTS_LAST, Fault, History, NODE_TIMEOUT, Plan, RETENTION};
use crate::core::AfterLoss;
use crate::node::clocks::micros;

/// A rule a schedule broke, with what shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    pub(crate) rule: &'static str,
    pub(crate) detail: String,
}

/// Whether a documented limit explains a grant at `at` next to an earlier one (a second
/// holder, or a number no higher): a FLUSHALL within the check interval before it (not
/// seen yet), or a majority of the nodes that lost their data (their counters and the
/// horizon with it).
fn explained(plan: &Plan, history: &History, client: usize, at: Duration) -> bool {
    flush_unseen(history, client, at)
        || majority_lost_before(plan, history, at)
        || quarantine_cut(plan, history, at)
}

/// Whether `client` may not have checked a node flushed before `at` yet: within a check
/// interval of the flush, or, if its link to that node was cut (a partition, lost
/// replies) around the flush, within the longest such fault, a check's timeout and a
/// check interval (its next check is the first to reach the node).
fn flush_unseen(history: &History, client: usize, at: Duration) -> bool {
    let slack = Duration::from_millis(50);
    history.faults.iter().any(|(f, fault)| {
        let Fault::Flush(node) = fault else {
            return false;
        };
        let since = at.saturating_sub(*f);
        let cut = history.faults.iter().any(|(t, link)| {
            matches!(link, Fault::Partition { client: c, node: n } | Fault::LoseReplies { client: c, node: n }
                if *c == client && n == node)
                && *t <= at
                && *t + FAULTS_LAST >= *f
        });
        let window = if cut {
            FAULTS_LAST + crate::defaults::DEFAULT_CONNECT_TIMEOUT + CHECK_EVERY
        } else {
            CHECK_EVERY
        };
        *f <= at && since <= window + slack
    })
}

/// Whether, before `at`, a node clock jumped beyond the drift bound on a node that had
/// lost its data within the longest TTL and a check interval before the jump: the
/// node's quarantine is measured on its own clock, so the jump cuts it short (Redlock's
/// drift assumption broken, documented in docs/reliability.md).
fn quarantine_cut(plan: &Plan, history: &History, at: Duration) -> bool {
    let longest = plan.clients.iter().map(|c| c.ttl).max().unwrap_or_default();
    history.faults.iter().any(|(jumped, jump)| {
        let Fault::ClockStep { node, .. } = jump else {
            return false;
        };
        jump.beyond_drift()
            && *jumped <= at
            && history.faults.iter().any(|(lost, f)| {
                f.loses_data() == Some(*node)
                    && lost <= jumped
                    && *jumped - *lost <= longest + CHECK_EVERY
            })
    })
}

/// Whether every node that held a record stored at `done` lost its data before `at`
/// (`during`): the record is gone everywhere, and no node can tell it ever existed (a
/// documented limit that persistence closes: docs/reliability.md, "Replay across
/// restarts").
fn lost_by_every_holder(
    history: &History,
    holders: &[usize],
    during: (Duration, Duration),
) -> bool {
    let (done, at) = during;
    !holders.is_empty()
        && holders.iter().all(|&n| {
            history
                .faults
                .iter()
                .any(|(t, f)| f.loses_data() == Some(n) && *t >= done && *t <= at)
        })
}

/// Whether, at `at`, a majority of `plan`'s nodes had lost their data (horizon included)
/// within the longest TTL and a check interval: the horizon then falls back to the TTLs
/// of the clients that raised it since (a documented limit).
fn majority_lost_before(plan: &Plan, history: &History, at: Duration) -> bool {
    let longest = plan.clients.iter().map(|c| c.ttl).max().unwrap_or_default();
    let since = at.saturating_sub(longest + CHECK_EVERY);
    let mut lost: Vec<usize> = history
        .faults
        .iter()
        .filter(|(t, _)| *t >= since && *t <= at)
        .filter_map(|(_, f)| f.loses_data())
        .collect();
    lost.sort_unstable();
    lost.dedup();
    lost.len() > plan.nodes / 2
}

/// The replay rules over `history`'s runs, into `found`: no run while a node the round
/// hears held the key's record; a refusing client never reruns a key within the
/// retention of a record a quorum stored (but for the documented limits).
fn replay(plan: &Plan, history: &History, found: &mut Vec<Violation>) {
    for (client, key, at, evidence) in &history.runs {
        if *evidence {
            found.push(Violation {
                rule: "replay",
                detail: format!(
                    "client {client} ran key {key} at {at:?} while a node it hears held its record"
                ),
            });
        }
        let refuses = plan.clients.get(*client).and_then(|c| c.replay) == Some(AfterLoss::Refuse);
        let again = history
            .completed
            .iter()
            .find(|(k, done, _)| k == key && done < at && at.saturating_sub(*done) < RETENTION);
        if let Some((_, done, holders)) = again
            && refuses
            && !explained(plan, history, *client, *at)
            && !jumped_between(history, *done, *at)
            && !lost_by_every_holder(history, holders, (*done, *at))
        {
            found.push(Violation {
                rule: "replay (refuse)",
                detail: format!(
                    "client {client} ran key {key} at {at:?}, completed at {done:?}, within the retention"
                ),
            });
        }
    }
}

/// How far above real time a fencing number may be: the fencing clock bound, plus how far
/// ahead the clock a quorum of the nodes is at or above got (a minority far ahead does
/// not count), the handshake's estimate of it (within a per-node timeout), and one per
/// acquisition (a number one above a counter); or, after a fenced attempt begun before its
/// client had the cap, that client's own clock.
fn fence_allowance_us(plan: &Plan, history: &History) -> u64 {
    // How far ahead each node's clock got (a clock far off from the start, the steps
    // forward since), and the clock a quorum of them is at or above.
    let mut ahead_ms = vec![0_u64; plan.nodes];
    if let Some((node, far)) = plan.far
        && let Some(a) = ahead_ms.get_mut(node)
    {
        *a = u64::try_from(far.as_millis()).unwrap_or(u64::MAX);
    }
    for (_, f) in &history.faults {
        if let Fault::ClockStep { node, ms } = f
            && let Some(a) = ahead_ms.get_mut(*node)
        {
            *a = a.saturating_add(u64::try_from(*ms).unwrap_or(0));
        }
    }
    // The quorum-th highest, computed here rather than by the crate's code under test.
    ahead_ms.sort_unstable_by(|a, b| b.cmp(a));
    let quorum_ahead_ms = ahead_ms.get(plan.nodes / 2).copied().unwrap_or(0);
    let bound = crate::defaults::DEFAULT_FENCING_CLOCK_BOUND + NODE_TIMEOUT;
    // A proposal made before the cap (its number may live on in the counters).
    let uncapped = history.uncapped.iter().copied().max().unwrap_or(0);
    micros(bound)
        .saturating_add(quorum_ahead_ms.saturating_mul(1_000))
        .max(
            u64::try_from(uncapped)
                .unwrap_or(0)
                .saturating_add(micros(NODE_TIMEOUT)),
        )
        .saturating_add(history.acquisitions as u64)
}

/// The fencing bound over `history`'s grants, into `found`: once a client's proposals are
/// capped (a quorum of its nodes gave an estimate of their clocks), no number further
/// above real time than the bound allows ("a client ahead ... issues numbers that are
/// only that far ahead", docs/fencing.md), whatever the client's own clock says.
fn fence_bound(plan: &Plan, history: &History, found: &mut Vec<Violation>) {
    let allowance = fence_allowance_us(plan, history);
    for g in &history.grants {
        if let Some(fence) = g.fence
            && g.capped
            && fence > g.wall_us.saturating_add(allowance)
        {
            found.push(Violation {
                rule: "fencing bound",
                detail: format!(
                    "{g:?}: {} µs above real time (allowed {allowance})",
                    fence - g.wall_us
                ),
            });
        }
    }
}

/// Whether a node clock jumped beyond the drift bound while a lock granted (or a record
/// stored) at `from` may still have been held, up to `to` (Redlock's own assumption
/// broken: the keys of that lock, or that record, expire early on that node; fencing is
/// not excused).
fn jumped_between(history: &History, from: Duration, to: Duration) -> bool {
    history
        .faults
        .iter()
        .any(|(at, f)| f.beyond_drift() && *at + NODE_TIMEOUT >= from && *at <= to)
}

/// Every rule `history` (of `plan`) broke.
pub(crate) fn check(plan: &Plan, history: &History) -> Vec<Violation> {
    let mut found = Vec::new();
    fence_bound(plan, history, &mut found);
    let mut grants = history.grants.clone();
    grants.sort_by_key(|g| g.from);
    for (i, a) in grants.iter().enumerate() {
        for b in grants[i + 1..].iter().filter(|b| b.name == a.name) {
            let rule = if b.from < a.until {
                "two holders"
            } else if let (Some(x), Some(y)) = (a.fence, b.fence)
                && y <= x
            {
                "fencing"
            } else {
                continue;
            };
            let jumped = rule == "two holders" && jumped_between(history, a.from, b.from);
            if !explained(plan, history, b.client, b.from) && !jumped {
                found.push(Violation {
                    rule,
                    detail: format!("{a:?}, then {b:?}"),
                });
            }
        }
    }
    replay(plan, history, &mut found);
    for (client, at, took) in &history.stalls {
        found.push(Violation {
            rule: "stall",
            detail: format!(
                "client {client}'s acquisition at {at:?} took {took:?}, more than its rounds' per-node timeouts allow"
            ),
        });
    }
    if plan.is_routine() {
        for (client, _, why) in &history.refusals {
            found.push(Violation {
                rule: "outage",
                detail: format!("client {client} refused with only routine faults: {why}"),
            });
        }
    }
    for why in &history.refused_at_end {
        found.push(Violation {
            rule: "outage at the healed end",
            detail: why.clone(),
        });
    }
    found
}
