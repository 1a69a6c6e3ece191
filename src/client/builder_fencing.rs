//! The builder's keep-alive and fencing setters: how a guard keeps its lock alive
//! (extension fraction, longest hold, number of extensions), and fencing numbers (on or
//! off, the counters' retention, the bound on proposals above the nodes' clocks).
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"])
//!     .extend_fraction(0.25) // extended every quarter of the TTL
//!     .max_hold(Some(Duration::from_secs(600)))
//!     .fencing(true)
//!     .build()?;
//! assert!(redlock.fencing());
//! # Ok::<(), tower_redlock::ConfigError>(())
//! ```

use std::time::Duration;

use super::builder::RedlockBuilder;

impl RedlockBuilder {
    /// How often a [`LockGuard`](crate::LockGuard) extends its lock, as a fraction of the TTL
    /// ([`DEFAULT_EXTEND_FRACTION`](crate::defaults::DEFAULT_EXTEND_FRACTION), a third), in `(0, 1)`. The rest of the validity is
    /// room to retry a failed extension before the lock is declared lost.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{ConfigError, Redlock};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // A lossy network: extend every quarter of the TTL (2 s), leaving 6 s for retries.
    /// let redlock = Redlock::builder(nodes)
    ///     .ttl(Duration::from_secs(8))
    ///     .extend_fraction(0.25)
    ///     .build()?;
    /// let never = Redlock::builder(nodes).extend_fraction(1.0).build();
    /// assert!(matches!(never, Err(ConfigError::ExtendFractionOutOfRange { .. })));
    /// # Ok(()) }
    /// ```
    pub fn extend_fraction(mut self, fraction: f64) -> Self {
        self.extend_fraction = fraction;
        self
    }

    /// The longest a [`LockGuard`](crate::LockGuard) keeps extending its lock (none by default); then it
    /// releases it and reports [`LostReason::MaxHoldReached`](crate::LostReason::MaxHoldReached).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // A stuck worker keeps the others out for 10 minutes at most.
    /// let redlock = Redlock::builder(nodes)
    ///     .max_hold(Some(Duration::from_secs(600)))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn max_hold(mut self, max: Option<Duration>) -> Self {
        self.max_hold = max;
        self
    }

    /// The most extensions a [`LockGuard`](crate::LockGuard) makes (none by default); then the lock runs out
    /// and the guard reports [`LostReason::MaxExtensionsReached`](crate::LostReason::MaxExtensionsReached).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // A 9 s TTL extended every 3 s: 30 extensions hold it for about 1.5 minutes at most.
    /// let redlock = Redlock::builder(nodes)
    ///     .ttl(Duration::from_secs(9))
    ///     .max_extensions(Some(30))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn max_extensions(mut self, max: Option<u32>) -> Self {
        self.max_extensions = max;
        self
    }

    /// Whether every acquisition gets a fencing number ([`DEFAULT_FENCING`](crate::defaults::DEFAULT_FENCING): on): a number
    /// that strictly increases with each new holder of a name, for a downstream store to
    /// reject writes from holders whose lock expired. It usually costs no extra round trip:
    /// the proposed number's `ZADD GT CH` is pipelined behind the `SET NX PX` of the
    /// acquisition; only when too few nodes accept the proposal (a client whose clock is
    /// behind the names' last numbers) do two more round trips follow, a read of the
    /// counters and phase 2. On every node it keeps one counter per hash slot (at most
    /// 16,384 per key prefix, whatever the names) for the
    /// [retention](Self::fencing_retention), and costs the node's CPU for the `ZADD`; see
    /// [`crate::fencing`]. [`Redlock::with_fencing`](crate::Redlock::with_fencing) and
    /// [`RedlockLayer::fencing`](crate::RedlockLayer::fencing) switch it per use.
    ///
    /// ```
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Names unique per job run: no later holder to fence, so skip the numbers.
    /// let redlock = Redlock::builder(nodes).fencing(false).build()?;
    /// assert!(!redlock.fencing());
    /// assert!(redlock.with_fencing(true).fencing()); // on again for one handle
    /// # Ok(()) }
    /// ```
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// How long the fencing counters live on after the last fenced acquisition on a node
    /// (default: [`DEFAULT_FENCING_RETENTION`](crate::defaults::DEFAULT_FENCING_RETENTION),
    /// 24 hours, whatever the TTL, so that every client of the same nodes keeps the same
    /// retention unless told otherwise). At least
    /// [`MIN_RETENTION_TO_TTL_RATIO`](crate::defaults::MIN_RETENTION_TO_TTL_RATIO) times
    /// the TTL of every fenced lock: a fenced client whose TTL is longer than a tenth of
    /// the default (2.4 hours) must set the retention itself, or `build` fails with
    /// [`ConfigError::FencingRetentionNeeded`](crate::ConfigError::FencingRetentionNeeded).
    ///
    /// A name's counter is shared with the names of its hash slot, so a node holds at most
    /// 16,384 counters per key prefix (about 1.6 MB) whatever the names; they sit in one
    /// sorted set (one per slot with a Redis Cluster node), whose expiry each client renews
    /// once per quarter retention. Once no client has locked anything fenced for a
    /// retention and more, the counters are gone, and a name locked again gets a number
    /// from the client's clock, which is above every earlier number as long as the clients'
    /// clocks agree to within about half the retention; see [`crate::fencing`] for the
    /// exact condition. 24 hours leaves room for clocks that drift for hours without NTP,
    /// and for outages and maintenance windows. A retention over 100 years
    /// (`Duration::MAX`, say) keeps counters 100 years (an expiry far enough in the future
    /// is refused by the nodes). Clients that share a key prefix on the same nodes should
    /// share the retention too: the set's expiry is the last renewal's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{ConfigError, Redlock};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Nodes kept in sync by NTP: counters gone 2 hours after the last acquisition.
    /// let redlock = Redlock::builder(nodes)
    ///     .fencing_retention(Duration::from_secs(2 * 3600))
    ///     .build()?;
    /// // Under 10 times the (default, 10 s) TTL:
    /// let short = Redlock::builder(nodes).fencing_retention(Duration::from_secs(60)).build();
    /// assert!(matches!(short, Err(ConfigError::FencingRetentionTooShort { .. })));
    /// // A 3-hour TTL needs at least 30 hours: the default (24 h) is not taken silently.
    /// let long = Redlock::builder(nodes).ttl(Duration::from_secs(3 * 3600)).build();
    /// assert!(matches!(long, Err(ConfigError::FencingRetentionNeeded { .. })));
    /// # Ok(()) }
    /// ```
    pub fn fencing_retention(mut self, retention: Duration) -> Self {
        self.fencing_retention = Some(retention);
        self
    }

    /// How far above the nodes' own clocks a fencing proposal may go
    /// ([`DEFAULT_FENCING_CLOCK_BOUND`](crate::defaults::DEFAULT_FENCING_CLOCK_BOUND): 1 s).
    ///
    /// A fenced acquisition proposes its number from this client's wall clock (see
    /// [`crate::fencing`]); a client whose clock is far ahead would drag every counter it
    /// touches forward, and every other client would then pay phase 2 until real time
    /// caught up. So each node's handshake also reads the node's clock (`INFO server`'s
    /// `server_time_usec`, Redis 5 and later, Valkey) and the client keeps an estimate
    /// of it; a proposal is never above the clock a quorum of nodes is at or above, plus
    /// this bound. A client whose wall clock is beyond that proposes the cap instead and
    /// logs a warning once (fix its clock: NTP). Until a quorum of nodes has given an
    /// estimate (the first acquisition waits for the connects under way; nodes that
    /// refuse `INFO`, or a Redis Cluster with the restart quarantine off, give none),
    /// proposals are the wall clock as before.
    ///
    /// The bound also absorbs the estimate's error (at most half a handshake's round
    /// trip) and how far the nodes' clocks are from one another; a bound of a few
    /// milliseconds or less makes clients in sync with the nodes propose the cap and warn.
    /// Zero is allowed (proposals at most the nodes' clock); `Duration::MAX` turns the
    /// cap off.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let nodes = ["redis://redis-1:6379", "redis://redis-2:6379", "redis://redis-3:6379"];
    /// // Clients and nodes in sync by NTP to a few ms: numbers at most 100 ms ahead.
    /// let redlock = Redlock::builder(nodes)
    ///     .fencing_clock_bound(Duration::from_millis(100))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn fencing_clock_bound(mut self, bound: Duration) -> Self {
        self.fencing_clock_bound = bound;
        self
    }
}
