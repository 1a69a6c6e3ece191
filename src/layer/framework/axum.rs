//! [`LockToken`] as an axum extractor (the `axum` feature).
//!
//! `async fn h(token: LockToken)` takes the token the layer put into the request, and
//! rejects the request with [`MissingLockToken`] (500) when there is none;
//! `Option<LockToken>` fits routes where the extractor may pass requests through.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use tower_redlock::{LockToken, Redlock, RedlockLayer};
//! use tower_redlock::layer::Header;
//!
//! async fn handler(token: LockToken) -> String {
//!     format!("holding {}", String::from_utf8_lossy(token.name()))
//! }
//!
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let app: Router = Router::new()
//!     .route("/jobs", post(handler))
//!     .route_layer(RedlockLayer::new(redlock, Header::new("idempotency-key").required()));
//! # Ok(()) }
//! ```

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

#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
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

#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> OptionalFromRequestParts<S> for LockToken {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<LockToken>().cloned())
    }
}
