//! Framework conveniences behind the `axum` and `tonic` features.
//!
//! - `axum`: [`LockToken`](crate::LockToken) is an extractor (`async fn h(token: LockToken)`,
//!   or `Option<LockToken>` on routes where the layer may pass requests through);
//!   [`PerRoute`](crate::layer::PerRoute) uses axum's `MatchedPath`.
//! - `tonic`: `tonic::Status::from(LockError)` with the layer's gRPC mapping.

#[cfg(feature = "axum")]
mod axum_impl {
    use axum::extract::{FromRequestParts, OptionalFromRequestParts};
    use axum::response::{IntoResponse, Response};
    use http::StatusCode;
    use http::request::Parts;

    use crate::token::LockToken;

    /// The rejection of the `LockToken` axum extractor: the request carries no token,
    /// because no [`RedlockLayer`](crate::RedlockLayer) runs in front of the handler or it
    /// passed the request through.
    #[derive(Debug, Clone, Copy)]
    pub struct MissingLockToken;

    impl std::fmt::Display for MissingLockToken {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(
                "no LockToken in the request: install RedlockLayer in front of this handler, \
                 or take Option<LockToken> where the extractor may pass requests through",
            )
        }
    }

    impl std::error::Error for MissingLockToken {}

    impl IntoResponse for MissingLockToken {
        fn into_response(self) -> Response {
            (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for LockToken {
        type Rejection = MissingLockToken;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            parts
                .extensions
                .get::<LockToken>()
                .cloned()
                .ok_or(MissingLockToken)
        }
    }

    impl<S: Send + Sync> OptionalFromRequestParts<S> for LockToken {
        type Rejection = std::convert::Infallible;

        async fn from_request_parts(
            parts: &mut Parts,
            _: &S,
        ) -> Result<Option<Self>, Self::Rejection> {
            Ok(parts.extensions.get::<LockToken>().cloned())
        }
    }
}

#[cfg(feature = "axum")]
pub use axum_impl::MissingLockToken;

#[cfg(feature = "tonic")]
impl From<crate::error::LockError> for tonic::Status {
    fn from(e: crate::error::LockError) -> Self {
        let rejection = crate::layer::Rejection::from_lock_error(e, true);
        tonic::Status::new(
            tonic::Code::from(i32::from(rejection.grpc_code())),
            rejection.message(),
        )
    }
}
