//! What every room of the layer asks of a request: who its caller is ([`Caller`], where
//! the identity comes from, and [`Principal`], the identity an authentication layer put
//! into the extensions), hashed, never kept; and the start of its body, read once before
//! the lock for a name in it and for replay's fingerprint (`body_prefix`); the request's
//! fingerprint ([`RequestFingerprint`]) and the layer that reads the body into it
//! ([`BodyFingerprintLayer`], chosen by the layer's [`BodyMode`]). Naming
//! ([`PerPrincipal`]), replay and the rejection hook all use them.
//!
//! ```
//! use tower_redlock::layer::Caller;
//!
//! // The caller of each request: its `x-api-key` header (hashed), when no Principal is set.
//! let caller = Caller::header(http::HeaderName::from_static("x-api-key"));
//! # let _ = caller;
//! ```
//!
//! [`Caller`]: crate::layer::Caller
//! [`Principal`]: crate::layer::Principal
//! [`PerPrincipal`]: crate::layer::PerPrincipal
//! [`RequestFingerprint`]: crate::layer::RequestFingerprint
//! [`BodyFingerprintLayer`]: crate::layer::BodyFingerprintLayer
//! [`BodyMode`]: crate::layer::BodyMode

pub(crate) mod body_fingerprint;
pub(crate) mod body_mode;
pub(crate) mod body_prefix;
pub(crate) mod caller;
pub(crate) mod fingerprint;
pub(crate) mod principal;
