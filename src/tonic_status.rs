//! `tonic::Status` from [`LockError`] (the `tonic` feature), with the layer's gRPC mapping:
//! busy is `ABORTED`, no quorum `UNAVAILABLE`, a bad name `INVALID_ARGUMENT`.
//!
//! ```
//! use tower_redlock::LockError;
//!
//! let busy = LockError::InvalidName { reason: "the name is empty" };
//! let status = tonic::Status::from(busy);
//! assert_eq!(status.code(), tonic::Code::InvalidArgument);
//! ```

use crate::error::LockError;
use crate::layer::reject::{Protocol, Rejection};

#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl From<LockError> for tonic::Status {
    fn from(e: LockError) -> Self {
        let rejection = Rejection::from_lock_error(e, Protocol::Grpc);
        tonic::Status::new(
            tonic::Code::from(i32::from(rejection.grpc_code())),
            rejection.message(),
        )
    }
}
