//! The replay setters of [`RedlockLayer`]: [`replay`](RedlockLayer::replay) and
//! [`replay_policy`](RedlockLayer::replay_policy) make it an idempotency layer (see the
//! [`replay`](super::replay) room), [`body_fingerprint`](RedlockLayer::body_fingerprint)
//! and [`without_body_fingerprint`](RedlockLayer::without_body_fingerprint) say how much of
//! each request's body counts in its fingerprint.
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::layer::Header;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key").required())
//!     .replay(Duration::from_secs(24 * 3600))
//!     .body_fingerprint(64 << 10);
//! # let _ = layer; Ok(()) }
//! ```

use std::time::Duration;

use super::body_mode::BodyMode;
use super::redlock_layer::RedlockLayer;
use super::replay::body_fingerprint::{BodyFingerprintLayer, NoBodyFingerprint};
use crate::backend::LockBackend;

impl<E, F, L: LockBackend> RedlockLayer<E, F, L> {
    /// Makes the layer an idempotency layer: a response the handler finished with is kept
    /// under the lock name for `retention`, and a later request with the same name gets it
    /// back (marked `idempotent-replayed: true`) without running the handler. See
    /// [`ReplayPolicy`](super::ReplayPolicy) for what is kept (2xx and 4xx except
    /// 401/403/407/408/409/425/429, bodies up to 256 KiB byte for byte) and [`replay_policy`](Self::replay_policy) to
    /// change it. With an `Idempotency-Key` [`Header`](super::Header) this is the IETF
    /// Idempotency-Key draft's contract (the README has its table): the key is read as a
    /// structured-field string, and rejections are problem documents unless the client
    /// asks for text.
    ///
    /// The response is recorded as it streams: its body goes out frame by frame while a
    /// copy is kept, and once the body has ended the record is written on the nodes that
    /// hold the lock, while they hold it, and the lock released, before the last frame
    /// (or the end of the stream) goes out. So the lock is held until then (as with
    /// [`release_on_body_end`](Self::release_on_body_end)), and a client that has the
    /// whole response finds the record when it retries. A response over the policy's
    /// [`max_body`](super::ReplayPolicy::max_body) is recorded as "completed, not kept":
    /// its retries get 410 / `ALREADY_EXISTS` (or the hook's answer for
    /// [`RejectionKind::ResponseNotKept`](super::RejectionKind::ResponseNotKept)), never an
    /// empty success. A body that fails, a client that goes away before the body's end, a
    /// handler that panics, or a handler that outlived its lock (lost, or past its
    /// validity, as without [`auto_extend`](Self::auto_extend)) leaves no record: the lock
    /// is only released, and a retry runs the handler again. A failed body reaches the
    /// client as the failure it is.
    ///
    /// The lookup is part of the acquire round trip. A record written on a quorum is seen
    /// by every later acquirer (any quorum it can take shares a node with the record's).
    /// Only a record that a quorum of nodes hold, byte for byte, is replayed: a record
    /// found on fewer nodes next to a quorum of grants (nodes that lost it, or a completion
    /// that reached too few) is restored onto the granting nodes first; records that
    /// differ from node to node (two runs) count as the name being held, so the request is
    /// busy (409 / `ABORTED`) until they expire, or, if it takes the lock on a quorum,
    /// runs the handler and records anew. What a key gets when nodes that granted may have
    /// lost its record is the policy's [`after_loss`](super::ReplayPolicy::after_loss).
    ///
    /// **Records live as long as the nodes keep their data.** A node that restarts without
    /// persistence, or is flushed, forgets its records; what it lost is kept on the nodes
    /// (see [`RedlockBuilder::check_interval`](crate::RedlockBuilder::check_interval)), so
    /// every app instance answers alike: a record found on any node next to a quorum of
    /// grants is restored and replayed, and a key with no record anywhere runs once the
    /// restart quarantine ends (or, with
    /// [`AfterLoss::Refuse`](super::AfterLoss::Refuse), gets 503
    /// [`#replay-unverifiable`](super::problems#replay-unverifiable) until a quorum of the
    /// granting nodes have held their data for the retention). Persistent nodes
    /// (`appendonly yes`, `appendfsync always`) lose nothing; the README's replay section
    /// and `docs/reliability.md` give the rule and its limits.
    ///
    /// gRPC: a unary reply (one message, its status kept by
    /// [`ReplayPolicy::keeps_grpc`](super::ReplayPolicy::keeps_grpc)) is replayed with its
    /// message, `content-type`, `grpc-*` headers and trailers; its trailers wait until the
    /// record is stored. Streaming responses (more than one message) are not replayed.
    ///
    /// A later request with the same name but a different fingerprint (method, path,
    /// query, caller, and the first MiB of the body) is refused with 422 /
    /// `INVALID_ARGUMENT`. To count the body, the layer reads the start of each locked
    /// request's body before the lock is taken (see
    /// [`body_fingerprint`](RedlockLayer::body_fingerprint)), so the inner service gets a
    /// [`PrefixedBody`](super::PrefixedBody) (axum routers and tonic servers take it as
    /// they take any body); [`without_body_fingerprint`](RedlockLayer::without_body_fingerprint)
    /// keeps the request's own body type. The caller is the
    /// [`Principal`](super::Principal) your authentication middleware put into the request
    /// extensions, or the one the layer's [`caller`](Self::caller) source names (a session
    /// cookie, an API-key header), or else (a hash of) the `Authorization` header: another caller that
    /// sends the same key never gets the first caller's response. Wrap the extractor in
    /// [`PerPrincipal`](super::PerPrincipal) to scope keys to the caller instead (each
    /// caller then runs its own request).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::Header;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Clients retry a payment with the same key for up to a day: answer them from the record.
    /// let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key").required())
    ///     .replay(Duration::from_secs(24 * 3600));
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn replay(self, retention: Duration) -> RedlockLayer<E, BodyFingerprintLayer, L>
    where
        F: BodyMode,
    {
        self.replay_policy(super::ReplayPolicy::new(retention))
    }

    /// Like [`replay`](Self::replay), with the policy given.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::{Header, ReplayPolicy};
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Larger JSON answers, and only the headers clients read back.
    /// let policy = ReplayPolicy::new(Duration::from_secs(24 * 3600))
    ///     .max_body(64 * 1024)
    ///     .headers([http::header::CONTENT_TYPE, http::header::LOCATION]);
    /// let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
    ///     .replay_policy(policy);
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn replay_policy(
        mut self,
        policy: super::ReplayPolicy,
    ) -> RedlockLayer<E, BodyFingerprintLayer, L>
    where
        F: BodyMode,
    {
        self.config().replay = Some(policy);
        RedlockLayer {
            lock: self.lock,
            extractor: self.extractor,
            config: self.config,
            body: self.body.fingerprinting(),
        }
    }
}

impl<E, L> RedlockLayer<E, BodyFingerprintLayer, L> {
    /// How many bytes of each locked request's body count in its fingerprint (default
    /// [`DEFAULT_BODY_FINGERPRINT_LIMIT`](super::DEFAULT_BODY_FINGERPRINT_LIMIT), 1 MiB):
    /// the same key with a body that differs within them is refused with 422; bodies that
    /// differ only beyond them count as the same request. Up to this much of each body is
    /// held (not copied) until the handler reads it. `0` reads nothing (the body does not
    /// count), and the inner service still gets a [`PrefixedBody`](super::PrefixedBody).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::Header;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Uploads of up to 16 MiB, where any changed byte must count.
    /// let layer = RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
    ///     .replay(Duration::from_secs(3600))
    ///     .body_fingerprint(16 << 20);
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn body_fingerprint(mut self, limit: usize) -> Self {
        self.body = BodyFingerprintLayer::new(limit);
        self
    }

    /// Replays without reading request bodies: the inner service gets each request as
    /// it came (`Request<B>`, for services that need their own body type), and the same
    /// key sent with a different body gets the first request's response, unless your
    /// own [`RequestFingerprint`](super::RequestFingerprint) (or an outer
    /// [`BodyFingerprintLayer`]) counts the body.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use http::{Request, Response};
    /// use tower::{ServiceBuilder, service_fn};
    /// use tower_redlock::{Redlock, RedlockLayer};
    /// use tower_redlock::layer::Header;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // A service of `Request<String>`: its body type stays.
    /// let svc = ServiceBuilder::new()
    ///     .layer(
    ///         RedlockLayer::new(redlock, Header::new("Idempotency-Key"))
    ///             .replay(Duration::from_secs(3600))
    ///             .without_body_fingerprint(),
    ///     )
    ///     .service(service_fn(|req: Request<String>| async move {
    ///         Ok::<_, Infallible>(Response::new(req.into_body()))
    ///     }));
    /// # let _ = svc;
    /// # Ok(()) }
    /// ```
    pub fn without_body_fingerprint(self) -> RedlockLayer<E, NoBodyFingerprint, L> {
        RedlockLayer {
            lock: self.lock,
            extractor: self.extractor,
            config: self.config,
            body: NoBodyFingerprint,
        }
    }
}
