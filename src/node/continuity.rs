//! Since when a node's data is whole, as far as the client can tell: what the layer's
//! replay needs before it believes a node that finds no completion record for a name.
//!
//! A completion record lives for the replay retention (hours, days), far longer than any
//! lock. A node that restarted without persistence within that time has forgotten the
//! records written before its restart, and a replica promoted by a failover lacks what
//! replication had not carried yet. Such a node granting the lock says nothing about
//! whether the name's work was done: `op::acquire` refuses a replay acquisition
//! ([`LockError::Unverifiable`](crate::LockError::Unverifiable)) unless a quorum of the
//! nodes that granted can vouch (`docs/reliability.md`, "Replay across restarts").
//!
//! ```text
//! this client saw a new run_id, no AOF,     -> Seen: never vouches within the retention since
//!   never promoted (a restart, not failover)   its start
//! its data began over 2 s after the oldest  -> Possible: vouches unless another node answered
//!   node's (met young, promoted,                 with the name's record within the retention
//!   restarted with AOF)                          since its start (the round hears every node)
//! anything else (nodes of one age: a new    -> vouches
//!   deployment, or all restarted at once)
//! ```
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::LockError;
//!
//! // What a replay acquisition (the layer's, with `replay` on) that no quorum of nodes
//! // can vouch for advises: when enough of them will.
//! fn advice(error: &LockError) -> Option<Duration> {
//!     match error {
//!         LockError::Unverifiable { retry_after, .. } => *retry_after,
//!         _ => None,
//!     }
//! }
//! # let _ = advice;
//! ```

use std::time::{Duration, Instant};

use super::identity::{Identity, ServerInfo};

/// How much later than the oldest node's a node's data may begin and still count as
/// the same age: `uptime_in_seconds` is whole seconds, and connects are not at one
/// instant. Nodes started further apart (a staggered first start) are doubted, which
/// costs their replay acquisitions a wait for every node's answer, never a refusal
/// without another node's record.
pub(crate) const PEER_SLACK: Duration = Duration::from_secs(2);

/// Since when a node's data is whole, and what may be missing before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Continuity {
    /// When the server's data began, as far as the client can tell: its start, or its
    /// promotion (`None`: before the client's clock can say).
    pub(crate) since: Option<Instant>,
    pub(crate) loss: Loss,
}

/// What the client knows of what a node's data lacks. The order is the severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Loss {
    /// Nothing: the server keeps an append-only file and was never seen to lose it.
    Whole,
    /// Writes from before `since` may be missing: the client met it first (a node that
    /// started empty is new to the deployment as often as restarted), it was promoted,
    /// or it restarted with an append-only file. It counts when the node is younger than
    /// its peers and another node answers with the name's record.
    Possible,
    /// Writes from before `since` are gone: this client saw it restart (a new `run_id`,
    /// never promoted: not a failover) without an append-only file.
    Seen,
}

impl Continuity {
    /// The judgement after a connect at `now` where the server said `info` (with
    /// `master_for`, how long it has been a master at least), given who answered there
    /// before (`known`) and the judgement before (`previous`). A server that tells no
    /// `run_id` (a cluster, `INFO` refused) leaves the judgement as it was.
    pub(crate) fn after_connect(
        previous: Option<Self>,
        known: Option<&Identity>,
        info: &ServerInfo,
        master_for: Duration,
        now: Instant,
    ) -> Option<Self> {
        if info.run_id.is_empty() {
            return previous;
        }
        let started = now.checked_sub(info.uptime);
        let promoted = Self {
            since: Some(now.checked_sub(master_for).unwrap_or(now)),
            loss: Loss::Possible,
        };
        let new = match known {
            // Another process that was promoted: a failover (Sentinel) to a replica, which
            // has what replication carried.
            Some(k) if k.run_id != info.run_id && info.promoted => promoted,
            // Restarted: nothing before its start, whatever it said before.
            Some(k) if k.run_id != info.run_id => Self {
                since: Some(started.unwrap_or(now)),
                loss: if info.persistent {
                    Loss::Possible
                } else {
                    Loss::Seen
                },
            },
            Some(k)
                if !k.replid.is_empty() && !info.replid.is_empty() && k.replid != info.replid =>
            {
                promoted
            }
            Some(_) => return previous,
            None => {
                let met = Self {
                    since: started,
                    loss: if info.persistent {
                        Loss::Whole
                    } else {
                        Loss::Possible
                    },
                };
                if info.promoted {
                    met.worse(promoted)
                } else {
                    met
                }
            }
        };
        Some(previous.map_or(new, |p| p.worse(new)))
    }

    /// Both judgements at once: the later start and the surer loss (errs on the long
    /// side).
    fn worse(self, other: Self) -> Self {
        Self {
            since: self.since.max(other.since),
            loss: self.loss.max(other.loss),
        }
    }
}

/// What a replay acquisition doubts of each node of its client, judged once per attempt
/// from every node's [`Continuity`].
#[derive(Debug)]
pub(crate) struct Doubts {
    each: Vec<Option<Continuity>>,
    /// When the oldest node's data began (`None`: before the client's clock can say).
    oldest: Option<Instant>,
}

impl Doubts {
    /// The doubts about nodes whose judgements are `each` (`None`: not judged yet).
    pub(crate) fn judge(each: Vec<Option<Continuity>>) -> Self {
        let oldest = each.iter().flatten().map(|c| c.since).min().flatten();
        Self { each, oldest }
    }

    /// Whether node `i`'s grant may hide a record it lost: the round then hears every
    /// node, since another's record is what makes a possible loss count.
    pub(crate) fn doubted(&self, i: usize) -> bool {
        let Some(Some(c)) = self.each.get(i) else {
            return false;
        };
        match c.loss {
            Loss::Whole => false,
            Loss::Seen => true,
            Loss::Possible => match (c.since, self.oldest) {
                (Some(since), Some(oldest)) => since > crate::quorum::later(oldest, PEER_SLACK),
                (Some(_), None) => true,
                (None, _) => false,
            },
        }
    }

    /// How long until node `i` vouches that a name without a record on it has none
    /// written within `retention` (zero: it does now), given whether another node
    /// answered with the name's record (`evidence`).
    pub(crate) fn vouches_in(
        &self,
        i: usize,
        retention: Duration,
        evidence: bool,
        now: Instant,
    ) -> Duration {
        let Some(Some(c)) = self.each.get(i) else {
            return Duration::ZERO;
        };
        if !self.doubted(i) || (c.loss == Loss::Possible && !evidence) {
            return Duration::ZERO;
        }
        c.since.map_or(Duration::ZERO, |since| {
            crate::quorum::later(since, retention).saturating_duration_since(now)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;
    const DAY: Duration = Duration::from_secs(86_400);

    fn info(run_id: &str, uptime: u64, replid: &str, persistent: bool) -> ServerInfo {
        ServerInfo {
            run_id: run_id.into(),
            uptime: S(uptime),
            replid: replid.into(),
            persistent,
            ..ServerInfo::default()
        }
    }

    fn known(run_id: &str, replid: &str) -> Identity {
        Identity {
            run_id: run_id.into(),
            replid: replid.into(),
        }
    }

    /// An instant far enough from the clock's origin that the uptimes below fit.
    fn now() -> Instant {
        Instant::now() + 10 * DAY
    }

    /// The judgement of a first contact with `info`.
    fn met(info: &ServerInfo, now: Instant) -> Option<Continuity> {
        Continuity::after_connect(None, None, info, S(0), now)
    }

    #[test]
    fn a_restart_seen_without_persistence_vouches_for_nothing_before_its_start() {
        let now = now();
        let old = met(&info("a", 5 * 86_400, "r", false), now);
        let c = Continuity::after_connect(
            old,
            Some(&known("a", "r")),
            &info("b", 60, "r", false),
            S(0),
            now,
        );
        let doubts = Doubts::judge(vec![c, old]);
        assert_eq!(
            c.map(|c| (c.loss, c.since)),
            Some((Loss::Seen, Some(now - S(60))))
        );
        assert!(doubts.doubted(0) && !doubts.doubted(1));
        // Evidence or not, it vouches once the retention has passed since its start.
        assert_eq!(doubts.vouches_in(0, S(3600), false, now), S(3540));
        assert_eq!(doubts.vouches_in(0, S(3600), true, now), S(3540));
        assert_eq!(doubts.vouches_in(0, S(60), false, now), S(0));
        assert_eq!(doubts.vouches_in(1, S(3600), true, now), S(0));
        // Alone (one node), too: the client saw it.
        assert_eq!(
            Doubts::judge(vec![c]).vouches_in(0, S(3600), false, now),
            S(3540)
        );
    }

    #[test]
    fn a_restart_with_an_append_only_file_is_only_a_doubt() {
        let now = now();
        let old = met(&info("a", 5 * 86_400, "r", true), now);
        assert_eq!(old.map(|c| c.loss), Some(Loss::Whole));
        let c = Continuity::after_connect(
            old,
            Some(&known("a", "r")),
            &info("b", 60, "r", true),
            S(0),
            now,
        );
        assert_eq!(c.map(|c| c.loss), Some(Loss::Possible));
        let doubts = Doubts::judge(vec![c, old]);
        assert_eq!(doubts.vouches_in(0, S(3600), false, now), S(0));
        assert_eq!(doubts.vouches_in(0, S(3600), true, now), S(3540));
    }

    /// Two of three nodes met younger than the third: doubted, and they vouch unless the
    /// third answers with a record. Nodes of one age (a new deployment) are not doubted.
    #[test]
    fn a_node_younger_than_its_peers_is_doubted_only_on_evidence() {
        let now = now();
        let (old, young) = (info("a", 3600, "r", false), info("b", 100, "r", false));
        let doubts = Doubts::judge(vec![met(&old, now), met(&young, now), met(&young, now)]);
        assert!(!doubts.doubted(0) && doubts.doubted(1) && doubts.doubted(2));
        assert_eq!(doubts.vouches_in(1, DAY, false, now), S(0));
        assert_eq!(doubts.vouches_in(1, DAY, true, now), DAY - S(100));
        assert_eq!(doubts.vouches_in(1, S(100), true, now), S(0));
        // Within 2 s of the oldest: the same age.
        let peers = info("c", 3600 - 2, "r", false);
        let doubts = Doubts::judge(vec![met(&old, now), met(&peers, now), met(&peers, now)]);
        assert!((0..3).all(|i| !doubts.doubted(i)));
        assert_eq!(doubts.vouches_in(1, DAY, true, now), S(0));
        // A node older than the clock can say is the oldest of all.
        let ancient = met(&info("d", u64::MAX, "r", false), now);
        assert_eq!(ancient.map(|c| c.since), Some(None));
        let doubts = Doubts::judge(vec![ancient, met(&old, now), None]);
        assert!(!doubts.doubted(0) && doubts.doubted(1) && !doubts.doubted(2));
    }

    #[test]
    fn a_promotion_doubts_what_came_before_it() {
        let now = now();
        let mut promoted = info("a", 5 * 86_400, "r2", true);
        promoted.promoted = true;
        let c = Continuity::after_connect(None, None, &promoted, S(30), now);
        assert_eq!(
            c.map(|c| (c.loss, c.since)),
            Some((Loss::Possible, Some(now - S(30))))
        );
        // Seen by this client: the same process under a new replication id.
        let c = Continuity::after_connect(None, Some(&known("a", "r1")), &promoted, S(0), now);
        assert_eq!(
            c.map(|c| (c.loss, c.since)),
            Some((Loss::Possible, Some(now)))
        );
    }

    /// A Sentinel failover: the address now reaches another process, a promoted replica.
    /// It has what replication carried: a doubt from its promotion, not a loss.
    #[test]
    fn a_failover_to_a_promoted_replica_is_a_doubt_not_a_loss() {
        let now = now();
        let old = met(&info("a", 5 * 86_400, "r1", false), now);
        let mut replica = info("b", 4 * 86_400, "r2", false);
        replica.promoted = true;
        let c = Continuity::after_connect(old, Some(&known("a", "r1")), &replica, S(5), now);
        assert_eq!(
            c.map(|c| (c.loss, c.since)),
            Some((Loss::Possible, Some(now - S(5))))
        );
        // Alone (one Sentinel-managed node): no peer to be younger than, no doubt.
        assert_eq!(Doubts::judge(vec![c]).vouches_in(0, DAY, true, now), S(0));
    }

    #[test]
    fn the_same_server_keeps_the_judgement_and_a_new_doubt_adds_to_it() {
        let now = now();
        let seen = Continuity {
            since: Some(now - S(500)),
            loss: Loss::Seen,
        };
        let same = info("a", 900, "r", false);
        assert_eq!(
            Continuity::after_connect(Some(seen), Some(&known("a", "r")), &same, S(0), now),
            Some(seen)
        );
        assert_eq!(
            Continuity::after_connect(Some(seen), None, &ServerInfo::default(), S(0), now),
            Some(seen),
            "no run id: nothing learned"
        );
        let again = Continuity::after_connect(
            Some(seen),
            Some(&known("a", "r")),
            &info("a", 900, "r9", false),
            S(0),
            now,
        );
        assert_eq!(
            again.map(|c| (c.loss, c.since)),
            Some((Loss::Seen, Some(now))),
            "the surer loss, the later start"
        );
    }
}
