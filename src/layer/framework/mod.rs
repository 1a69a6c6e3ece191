//! The framework conveniences of the layer: [`LockToken`](crate::LockToken) as an axum
//! extractor (feature `axum`, with [`MissingLockToken`](crate::MissingLockToken) when no
//! layer put one in), and `request.lock_token()` in tonic handlers (feature `tonic`,
//! `LockTokenExt`).
//!
//! ```
//! # #[cfg(feature = "axum")]
//! async fn handler(token: tower_redlock::LockToken) -> String {
//!     format!("holding {}", String::from_utf8_lossy(token.name()))
//! }
//! ```

#[cfg(feature = "axum")]
pub(crate) mod axum;
#[cfg(feature = "tonic")]
pub(crate) mod tonic;
