//! [`BodyMode`]: what a [`RedlockLayer`](crate::RedlockLayer) does with request bodies,
//! as its type says: hands them on as they are ([`NoBodyFingerprint`]), or reads the start
//! of each locked request's body into the replay fingerprint ([`BodyFingerprintLayer`],
//! the default once replay is on).
//!
//! ```
//! use std::time::Duration;
//! use tower_redlock::layer::{BodyFingerprintLayer, Header, NoBodyFingerprint};
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let plain: RedlockLayer<Header, NoBodyFingerprint> =
//!     RedlockLayer::new(redlock, Header::new("Idempotency-Key"));
//! let replaying: RedlockLayer<Header, BodyFingerprintLayer> =
//!     plain.replay(Duration::from_secs(3600));
//! # let _ = replaying; Ok(()) }
//! ```

use super::body_fingerprint::{
    BodyFingerprintLayer, DEFAULT_BODY_FINGERPRINT_LIMIT, NoBodyFingerprint,
};

/// What a [`RedlockLayer`](crate::RedlockLayer) does with request bodies: [`NoBodyFingerprint`] or
/// [`BodyFingerprintLayer`]. Sealed.
pub trait BodyMode: sealed::Sealed + Clone {
    /// The body fingerprinting that replay turns on: this one, or the default.
    #[doc(hidden)]
    fn fingerprinting(self) -> BodyFingerprintLayer;
}

impl BodyMode for NoBodyFingerprint {
    fn fingerprinting(self) -> BodyFingerprintLayer {
        BodyFingerprintLayer::new(DEFAULT_BODY_FINGERPRINT_LIMIT)
    }
}

impl BodyMode for BodyFingerprintLayer {
    fn fingerprinting(self) -> BodyFingerprintLayer {
        self
    }
}

mod sealed {
    /// Seals [`BodyMode`](super::BodyMode).
    pub trait Sealed {}
    impl Sealed for super::NoBodyFingerprint {}
    impl Sealed for super::BodyFingerprintLayer {}
}
