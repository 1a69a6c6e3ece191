//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade, with the `metrics`
//! feature: install any recorder (Prometheus exporter, StatsD, ...) and the client and
//! the layer report these. Without the feature nothing is recorded and nothing is
//! compiled in.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `redlock_acquire_total` | counter | `outcome`: `acquired`, `busy`, `no_quorum`, `validity_exhausted`, `unverifiable` (a replay no quorum of nodes can answer for after restarts), `replayed`, `error` | acquisitions (`lock`, `try_lock`, the layer), by outcome |
//! | `redlock_acquire_seconds` | histogram | | time to acquire (or give up), retries and waiting included |
//! | `redlock_released_total` | counter | | locks released with `unlock` (guards and the layer included) |
//! | `redlock_hold_seconds` | histogram | | from acquisition to release |
//! | `redlock_lost_total` | counter | `reason`: `extend_failed`, `max_hold`, `max_extensions`, `keep_alive_stopped`, `expired`, `body_stalled` | guarded locks lost before their release |
//! | `redlock_replayed_total` | counter | | requests the layer answered from a completion record |
//! | `redlock_replay_restored_total` | counter | | replay acquisitions that found the key's record on fewer than a quorum of nodes (the others lost it) and restored it onto the nodes that granted, then replayed it |
//! | `redlock_replay_unverified_total` | counter | | replay acquisitions that ran although nodes that granted may have lost the key's record ([`AfterLoss::Run`](crate::layer::AfterLoss::Run)) |
//! | `redlock_replay_record_bytes` | histogram | | the size of each completion record stored (each is kept on a quorum of nodes for the retention: its sum over the retention is the records' memory per node, before Redis's own overhead of about 100 bytes a key) |
//! | `redlock_layer_rejections_total` | counter | `kind`: `busy`, `unavailable`, `bad_request`, `internal`, `key_reused`, `response_not_kept`, `body_too_large` | requests the layer rejected (also those a rejection hook answered), by [`RejectionKind`](crate::layer::RejectionKind) |
//! | `redlock_fenced_total` | counter | `rounds`: `1` (a quorum accepted the proposal: the acquire round trip only), `2` (phase 2 ran: a read of the counters and phase 2, two more round trips) | fenced acquisitions that got their number, by the way they got it |
//! | `redlock_held_locks` | gauge | | guarded locks held now (guards, and the layer's locks) |
//! | `redlock_waiting` | gauge | | lock calls waiting in a queue for a busy name |
//! | `redlock_quarantined_nodes` | gauge | | nodes in the restart quarantine (as last seen by a call) |
//! | `redlock_nodes_near_maxmemory` | gauge | | nodes whose `used_memory` was at 90 % of their `maxmemory` at their last connect or check: replay records are kept without their response meanwhile |
//! | `redlock_nodes_without_aof` | gauge | | nodes whose `INFO persistence` said `aof_enabled:0` at their last connect or check: a restart loses their lock keys and replay records |
//!
//! Lock names and values are never labels.
//!
//! ```no_run
//! # #[cfg(feature = "metrics")]
//! # fn demo() {
//! // With any `metrics` recorder installed, for example a Prometheus exporter:
//! metrics::describe_counter!("redlock_acquire_total", "Redlock acquisitions by outcome");
//! # }
//! ```

/// Counts an acquisition with `outcome`, and how long it took.
pub(crate) fn acquired(outcome: &'static str, seconds: f64) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("redlock_acquire_total", "outcome" => outcome).increment(1);
        metrics::histogram!("redlock_acquire_seconds").record(seconds);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (outcome, seconds);
}

/// Counts a release of a lock held for `seconds`.
pub(crate) fn released(seconds: f64) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("redlock_released_total").increment(1);
        metrics::histogram!("redlock_hold_seconds").record(seconds);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = seconds;
}

/// Counts a guarded lock lost for `reason`.
pub(crate) fn lost(reason: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlock_lost_total", "reason" => reason).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// Counts a fenced acquisition that got its number in the acquire round (`"1"`) or after
/// the read and phase 2 (`"2"`).
pub(crate) fn fenced(rounds: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlock_fenced_total", "rounds" => rounds).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = rounds;
}

/// Counts a request answered from a completion record.
pub(crate) fn replayed() {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlock_replayed_total").increment(1);
}

/// Counts a replay acquisition that found the key's record on fewer than a quorum of nodes
/// and restored it onto the nodes that granted.
pub(crate) fn replay_restored() {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlock_replay_restored_total").increment(1);
}

/// Counts a replay acquisition that ran although nodes that granted may have lost the
/// key's record ([`AfterLoss::Run`](crate::layer::AfterLoss::Run)).
pub(crate) fn replay_unverified() {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlock_replay_unverified_total").increment(1);
}

/// Records the size of a completion record about to be stored (on each node that holds
/// the lock, for the retention).
pub(crate) fn record_bytes(bytes: usize) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("redlock_replay_record_bytes").record(bytes as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = bytes;
}

/// Counts a request the layer rejected, by its kind (`RejectionKind::as_str`).
pub(crate) fn rejected(kind: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlock_layer_rejections_total", "kind" => kind).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// A gauge moved by one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Gauge {
    HeldLocks,
    Waiting,
    QuarantinedNodes,
    NodesWithoutAof,
    NodesNearMaxmemory,
}

/// Which way a gauge moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Move {
    Up,
    Down,
}

/// Moves `gauge` up or down by one.
pub(crate) fn gauge(gauge: Gauge, to: Move) {
    #[cfg(feature = "metrics")]
    {
        let name = match gauge {
            Gauge::HeldLocks => "redlock_held_locks",
            Gauge::Waiting => "redlock_waiting",
            Gauge::QuarantinedNodes => "redlock_quarantined_nodes",
            Gauge::NodesWithoutAof => "redlock_nodes_without_aof",
            Gauge::NodesNearMaxmemory => "redlock_nodes_near_maxmemory",
        };
        match to {
            Move::Up => metrics::gauge!(name).increment(1.0),
            Move::Down => metrics::gauge!(name).decrement(1.0),
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (gauge, to);
}
