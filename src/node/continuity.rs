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
//! this client saw a new run_id, no AOF   -> Seen since its start: never vouches within the retention
//! first met younger than the retention   -> Possible since its start: vouches unless another
//!   (or promoted, or restarted with AOF)      node answered with the name's record
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

/// What a node's data may lack: writes made before `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Continuity {
    /// Writes made before this instant may be missing from the node.
    pub(crate) since: Instant,
    pub(crate) loss: Loss,
}

/// How the client knows a node may have lost writes. The order is the severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Loss {
    /// It may have: the client met it first younger than a retention (a node started
    /// empty is new to the deployment as often as restarted), it was promoted, or it
    /// restarted with an append-only file. Another node's record for the name is the
    /// evidence that makes the doubt count.
    Possible,
    /// It did: this client saw it restart (a new `run_id`) without an append-only file,
    /// so everything written before its start is gone.
    Seen,
}

impl Continuity {
    /// The judgement after a connect at `now` where the server said `info` (with `master_for`,
    /// how long it has been a master at least), given who answered there before
    /// (`known`) and the judgement before (`previous`). A server that tells no `run_id`
    /// (a cluster, `INFO` refused) leaves the judgement as it was.
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
        let promoted = || Self {
            since: now.checked_sub(master_for).unwrap_or(now),
            loss: Loss::Possible,
        };
        let new = match known {
            Some(k) if k.run_id != info.run_id => Some(Self {
                // Restarted: nothing before its start, whatever it said before.
                since: started.unwrap_or(now),
                loss: if info.persistent {
                    Loss::Possible
                } else {
                    Loss::Seen
                },
            }),
            Some(k)
                if !k.replid.is_empty() && !info.replid.is_empty() && k.replid != info.replid =>
            {
                Some(promoted())
            }
            Some(_) => None,
            None => {
                // Older than the client's clock can say: whole for any retention.
                let young = started.filter(|_| !info.persistent).map(|since| Self {
                    since,
                    loss: Loss::Possible,
                });
                let promoted = info.promoted.then(promoted);
                young.into_iter().chain(promoted).reduce(Self::worse)
            }
        };
        match (previous, new) {
            (Some(p), Some(n)) => Some(p.worse(n)),
            (p, n) => n.or(p),
        }
    }

    /// Both doubts at once: the later start and the surer loss (errs on the long side).
    fn worse(self, other: Self) -> Self {
        Self {
            since: self.since.max(other.since),
            loss: self.loss.max(other.loss),
        }
    }

    /// How long until the node vouches that a name without a record on it has none
    /// written within `retention` (zero: it does now), given whether another node
    /// answered with the name's record (`evidence`).
    pub(crate) fn vouches_in(&self, retention: Duration, evidence: bool, now: Instant) -> Duration {
        if self.loss == Loss::Possible && !evidence {
            return Duration::ZERO;
        }
        crate::quorum::later(self.since, retention).saturating_duration_since(now)
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

    #[test]
    fn a_restart_seen_without_persistence_vouches_for_nothing_before_its_start() {
        let now = now();
        let c = Continuity::after_connect(
            None,
            Some(&known("a", "r")),
            &info("b", 60, "r", false),
            S(0),
            now,
        )
        .expect("a restart is judged");
        assert_eq!(c.loss, Loss::Seen);
        assert_eq!(c.since, now - S(60));
        // Evidence or not, it vouches once the retention has passed since its start.
        assert_eq!(c.vouches_in(S(3600), false, now), S(3540));
        assert_eq!(c.vouches_in(S(3600), true, now), S(3540));
        assert_eq!(c.vouches_in(S(60), false, now), S(0));
        assert_eq!(c.vouches_in(S(30), false, now), S(0));
    }

    #[test]
    fn a_restart_with_an_append_only_file_is_only_a_doubt() {
        let now = now();
        let c = Continuity::after_connect(
            None,
            Some(&known("a", "r")),
            &info("b", 60, "r", true),
            S(0),
            now,
        )
        .expect("a restart is judged");
        assert_eq!(c.loss, Loss::Possible);
        assert_eq!(c.vouches_in(S(3600), false, now), S(0));
        assert_eq!(c.vouches_in(S(3600), true, now), S(3540));
    }

    #[test]
    fn first_contact_doubts_a_node_younger_than_the_retention_only_on_evidence() {
        let now = now();
        let c = Continuity::after_connect(None, None, &info("a", 100, "r", false), S(0), now)
            .expect("judged");
        assert_eq!((c.loss, c.since), (Loss::Possible, now - S(100)));
        assert_eq!(c.vouches_in(DAY, false, now), S(0));
        assert_eq!(c.vouches_in(DAY, true, now), DAY - S(100));
        assert_eq!(c.vouches_in(S(100), true, now), S(0));
        // Persistent and never promoted: no doubt at all.
        assert_eq!(
            Continuity::after_connect(None, None, &info("a", 100, "r", true), S(0), now),
            None
        );
    }

    #[test]
    fn a_promotion_doubts_what_came_before_it() {
        let now = now();
        let mut promoted = info("a", 5 * 86_400, "r2", true);
        promoted.promoted = true;
        let c = Continuity::after_connect(None, None, &promoted, S(30), now).expect("judged");
        assert_eq!((c.loss, c.since), (Loss::Possible, now - S(30)));
        // Seen by this client: the same process under a new replication id.
        let c = Continuity::after_connect(None, Some(&known("a", "r1")), &promoted, S(0), now)
            .expect("judged");
        assert_eq!((c.loss, c.since), (Loss::Possible, now));
    }

    #[test]
    fn the_same_server_keeps_the_judgement_and_a_new_doubt_adds_to_it() {
        let now = now();
        let seen = Continuity {
            since: now - S(500),
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
        )
        .expect("judged");
        assert_eq!(
            (again.loss, again.since),
            (Loss::Seen, now),
            "the surer loss, the later start"
        );
    }
}
