//! [`extract_fn`]: a lock name from your own function over the request head, for names
//! no stock extractor gives (a query parameter, a combination of headers).
//!
//! ```
//! use http::Request;
//! use tower_redlock::layer::{ExtractLockName, extract_fn};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tenant = extract_fn(|head| Ok(head.headers.get("x-tenant").map(|v| v.as_bytes().to_vec())));
//! let req = Request::get("/").header("x-tenant", "acme").body(())?;
//! assert_eq!(tenant.extract(&req)?, Some(b"acme".to_vec()));
//! # Ok(()) }
//! ```

use std::fmt;

use http::Request;

use super::{ExtractError, ExtractLockName, RequestHead};

/// An extractor from a closure over the [`RequestHead`]; see [`extract_fn`].
#[derive(Clone)]
pub struct ExtractFn<F> {
    f: F,
}

impl<F> fmt::Debug for ExtractFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtractFn").finish_non_exhaustive()
    }
}

/// An extractor from a closure over the request head.
///
/// **Two layers with closure extractors share a namespace** (`fn`, the default of
/// [`ExtractLockName::namespace`]): the same name from both is one lock, and with replay
/// one record. Unless that is what you want, name each layer with
/// [`RedlockLayer::namespace`](crate::RedlockLayer::namespace).
///
/// ```
/// use http::Request;
/// use tower_redlock::layer::{ExtractLockName, extract_fn};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // The name is in the query: `?account=42` locks account 42.
/// let account = extract_fn(|head| {
///     let query = head.uri.query().unwrap_or_default();
///     let id = query.split('&').find_map(|pair| pair.strip_prefix("account="));
///     Ok(id.map(|id| id.as_bytes().to_vec()))
/// });
/// let req = Request::post("/transfers?account=42&amount=5").body(())?;
/// assert_eq!(account.extract(&req)?, Some(b"42".to_vec()));
/// assert_eq!(ExtractLockName::<()>::namespace(&account), "fn");
/// # Ok(()) }
/// ```
pub fn extract_fn<F>(f: F) -> ExtractFn<F>
where
    F: Fn(&RequestHead<'_>) -> Result<Option<Vec<u8>>, ExtractError>,
{
    ExtractFn { f }
}

impl<B, F> ExtractLockName<B> for ExtractFn<F>
where
    F: Fn(&RequestHead<'_>) -> Result<Option<Vec<u8>>, ExtractError>,
{
    fn extract(&self, request: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
        (self.f)(&RequestHead::of(request))
    }
}
