//! `request.lock_token()` for tonic handlers (the `tonic` feature): the [`LockToken`] the
//! layer put into the request, or `INTERNAL` when the call did not go through a
//! [`RedlockLayer`](crate::RedlockLayer) that locked it.
//!
//! ```
//! use tower_redlock::layer::LockTokenExt;
//!
//! let request = tonic::Request::new(());
//! let status = request.lock_token().unwrap_err();
//! assert_eq!(status.code(), tonic::Code::Internal);
//! ```

use crate::token::LockToken;

/// Reads the layer's [`LockToken`] from a tonic request.
pub trait LockTokenExt {
    /// The token of the lock held for this call; `INTERNAL` if there is none (the call
    /// was passed through, or no layer is in front of the service).
    fn lock_token(&self) -> Result<LockToken, tonic::Status>;
}

#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl<T> LockTokenExt for tonic::Request<T> {
    fn lock_token(&self) -> Result<LockToken, tonic::Status> {
        self.extensions().get::<LockToken>().cloned().ok_or_else(|| {
            tonic::Status::internal(
                "no lock for this call: is it listed for the RedlockLayer in front of the service?",
            )
        })
    }
}
