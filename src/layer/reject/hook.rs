//! What a rejection hook ([`RedlockLayer::on_rejection`](crate::RedlockLayer::on_rejection))
//! may return, and how its answer becomes the layer's response body.
//!
//! With the `axum` feature a hook returns anything that implements axum's `IntoResponse`
//! (the [`Rejection`] itself included, for the default answer); without it, an
//! `http::Response<B>` whose body yields `Bytes` (such as `Response<String>`, or tonic's
//! body), or the [`Rejection`].
//!
//! ```
//! use http::{Response, StatusCode};
//! use tower_redlock::layer::{Rejection, RejectionKind};
//!
//! // Fits with and without the axum feature: an http::Response with a String body.
//! fn answer(rejection: Rejection, head: &http::request::Parts) -> Response<String> {
//!     match rejection.kind() {
//!         RejectionKind::Busy { .. } => {
//!             let mut res = Response::new(format!("{} is being processed\n", head.uri.path()));
//!             *res.status_mut() = StatusCode::ACCEPTED;
//!             res
//!         }
//!         _ => rejection.into_response(),
//!     }
//! }
//! # let _ = answer;
//! ```

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http::request::Parts;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::Rejection;

/// A boxed error, as in tower and axum: the error type of
/// [`ResponseBody`](crate::layer::ResponseBody) (the inner body's error, boxed, or
/// [`NotRecorded`](crate::layer::NotRecorded)) and of a hook's body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A hook's body, boxed.
pub(crate) type BoxBody = Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send>>;

/// A rejection's answer: the default (or a replayed) body, or a hook's. Public only so
/// that the sealed trait can name it; this module is private.
pub enum Answer {
    /// A body in one piece.
    Data(Bytes),
    /// A hook's body.
    Boxed(BoxBody),
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Data(data) => f.debug_tuple("Data").field(&data.len()).finish(),
            Answer::Boxed(_) => f.write_str("Boxed"),
        }
    }
}

/// The rejection hook, its answer converted.
pub(crate) type RejectionHook = Arc<dyn Fn(Rejection, &Parts) -> Response<Answer> + Send + Sync>;

/// Wraps `hook` so that its answer becomes the layer's.
pub(crate) fn hook<F, R>(hook: F) -> RejectionHook
where
    F: Fn(Rejection, &Parts) -> R + Send + Sync + 'static,
    R: IntoRejectionResponse,
{
    Arc::new(move |rejection, head| hook(rejection, head).into_answer())
}

mod sealed {
    /// Seals [`IntoRejectionResponse`](super::IntoRejectionResponse): its impls change
    /// with the `axum` feature.
    pub trait Sealed {
        fn into_answer(self) -> http::Response<super::Answer>;
    }
}

/// What a rejection hook may return. With the `axum` feature: anything that implements
/// `axum::response::IntoResponse` (such as `(StatusCode, Json<T>)`, `Result<T, Rejection>`
/// or the [`Rejection`] itself). Without it: `http::Response<B>` for a body `B` with `Bytes`
/// data (such as `String`), or the [`Rejection`] (its default answer). Every type accepted
/// without the feature is accepted with it.
pub trait IntoRejectionResponse: sealed::Sealed {}

impl<T: sealed::Sealed> IntoRejectionResponse for T {}

#[cfg(not(feature = "axum"))]
impl<B> sealed::Sealed for Response<B>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    fn into_answer(self) -> Response<Answer> {
        self.map(boxed)
    }
}

#[cfg(not(feature = "axum"))]
impl sealed::Sealed for Rejection {
    fn into_answer(self) -> Response<Answer> {
        self.into_response()
            .map(|body| Answer::Data(Bytes::from(body)))
    }
}

#[cfg(feature = "axum")]
impl<T: axum::response::IntoResponse> sealed::Sealed for T {
    fn into_answer(self) -> Response<Answer> {
        axum::response::IntoResponse::into_response(self).map(boxed)
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum::response::IntoResponse for Rejection {
    fn into_response(self) -> axum::response::Response {
        Rejection::into_response(self).map(axum::body::Body::from)
    }
}

/// Boxes a hook's body.
fn boxed<B>(body: B) -> Answer
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    Answer::Boxed(Box::pin(ErrInto { body }))
}

pin_project! {
    /// A body with its errors boxed.
    struct ErrInto<B> {
        #[pin]
        body: B,
    }
}

impl<B> Body for ErrInto<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.project()
            .body
            .poll_frame(cx)
            .map(|frame| frame.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
