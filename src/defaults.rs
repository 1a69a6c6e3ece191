//! The defaults of every setting and the limits the builder checks them against.
//!
//! Each default is the value a [`RedlockBuilder`](crate::RedlockBuilder) starts from; the
//! builder method of the same name documents what the setting does.
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::Redlock;
//! use tower_redlock::defaults::{DEFAULT_TTL, MIN_TTL_TO_TIMEOUT_RATIO};
//!
//! assert_eq!(DEFAULT_TTL, Duration::from_secs(10));
//! // The longest per-node timeout the default TTL allows:
//! let longest = DEFAULT_TTL / MIN_TTL_TO_TIMEOUT_RATIO;
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).node_timeout(longest).build();
//! assert!(redlock.is_ok());
//! ```

use std::time::Duration;

/// The per-node timeout must be at most `TTL / MIN_TTL_TO_TIMEOUT_RATIO`, so that waiting
/// for a slow node can never use more than a tenth of a lock's validity.
pub const MIN_TTL_TO_TIMEOUT_RATIO: u32 = 10;

/// The longest TTL accepted: one day. Longer work should extend its lock.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Names longer than this many bytes are hashed with SHA-256 into a fixed-size key.
pub const MAX_NAME_LEN: usize = 256;

/// Bytes of CSPRNG output in every lock value (hex-encoded on the wire: twice as many
/// characters).
pub const VALUE_LEN: usize = 20;

/// Default TTL of a lock: 10 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Default per-node timeout: 50 ms.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Default clock drift factor: 1 % of the TTL.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// Default number of attempts made by [`Redlock::lock`](crate::Redlock::lock): 10.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// Default base delay between attempts: 50 ms.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(50);
/// Default random jitter added to the base delay: up to 100 ms.
pub const DEFAULT_RETRY_JITTER: Duration = Duration::from_millis(100);
/// Default key prefix: `redlock:`.
pub const DEFAULT_KEY_PREFIX: &str = "redlock:";
/// Default connect timeout (TCP, TLS, `INFO` and `SCRIPT LOAD`): 1 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default interval of the background check of each node's connection (its role, its
/// ledger: see [`RedlockBuilder::check_interval`](crate::RedlockBuilder::check_interval)):
/// 1 s.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Default number of consecutive timeouts after which a node's connection is rebuilt: 3.
pub const DEFAULT_RECONNECT_AFTER_TIMEOUTS: u32 = 3;
/// Default extension interval of a [`LockGuard`](crate::LockGuard), as a fraction of the
/// TTL: a third.
pub const DEFAULT_EXTEND_FRACTION: f64 = 1.0 / 3.0;
/// Fencing numbers are on by default: every acquisition carries one (see
/// [`crate::fencing`]), in the same round trip, for two more commands per node.
pub const DEFAULT_FENCING: bool = true;
/// Default retention of a name's fencing counter after its last fenced acquisition:
/// 24 hours, for every client (see
/// [`RedlockBuilder::fencing_retention`](crate::RedlockBuilder::fencing_retention)). A
/// fenced client whose TTL is above a tenth of it must set its retention explicitly.
pub const DEFAULT_FENCING_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// The fencing retention must be at least this many times the TTL of every fenced lock.
pub const MIN_RETENTION_TO_TTL_RATIO: u32 = 10;
/// Default bound on how far a fencing proposal may go above the nodes' own clocks: 1 s
/// (see
/// [`RedlockBuilder::fencing_clock_bound`](crate::RedlockBuilder::fencing_clock_bound)).
pub const DEFAULT_FENCING_CLOCK_BOUND: Duration = Duration::from_secs(1);
/// Nodes that may evict keys are refused by default (see
/// [`RedlockBuilder::allow_eviction`](crate::RedlockBuilder::allow_eviction)).
pub const DEFAULT_ALLOW_EVICTION: bool = false;
/// Restarted and recently started nodes are quarantined by default (see
/// [`RedlockBuilder::restart_quarantine`](crate::RedlockBuilder::restart_quarantine)).
pub const DEFAULT_RESTART_QUARANTINE: bool = true;
