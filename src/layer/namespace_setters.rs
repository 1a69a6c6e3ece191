//! The namespace setters of [`RedlockLayer`]: [`namespace`](RedlockLayer::namespace) names
//! the namespace of the layer's lock names (by default its extractor's, see
//! [`ExtractLockName::namespace`]), and [`lock_name_for`](RedlockLayer::lock_name_for)
//! says which name the layer locks for an extractor's name.
//!
//! ```
//! use tower_redlock::layer::Header;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let layer = RedlockLayer::new(redlock, Header::new("x-delivery-id")).namespace("deliveries");
//! assert_eq!(layer.lock_name_for::<()>("46"), b"deliveries 46");
//! # Ok(()) }
//! ```

use super::extract::ExtractLockName;
use super::extract::namespace::Namespace;
use super::redlock_layer::RedlockLayer;
use crate::backend::LockBackend;

impl<E, F, L: LockBackend> RedlockLayer<E, F, L> {
    /// Names the layer's namespace: the layer locks `"{namespace} {name}"` for each name
    /// its extractor gives, instead of taking its extractor's
    /// [`namespace`](super::ExtractLockName::namespace) (`header:idempotency-key`,
    /// `path:/accounts/{id}/credit#id`, ...). Spaces and `%` in it are percent-encoded, so
    /// two namespaces never give one lock name.
    ///
    /// - Layers given the same namespace share their names on purpose: a request of one
    ///   is busy while a request of the other holds the same name, and with
    ///   [`replay`](Self::replay) finds its record (its key reused: 422 when the requests
    ///   differ).
    /// - Name the layers whose extractors are closures ([`extract_fn`](super::extract_fn)):
    ///   otherwise they all share the namespace `fn`.
    /// - `namespace("")` is no namespace: the lock name is exactly the extractor's name,
    ///   the name a background job locks with [`Redlock::lock`](crate::Redlock::lock) to
    ///   exclude the layer's requests, and the name layers locked before they had
    ///   namespaces.
    ///
    /// Like the names, a namespace must be the same in every instance of the application.
    /// Applications that share Redis servers are kept apart by the client's
    /// [`key_prefix`](crate::RedlockBuilder::key_prefix), not by namespaces.
    ///
    /// ```
    /// use tower_redlock::layer::{Header, PathParam};
    /// use tower_redlock::{Redlock, RedlockLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// // Two routes that change accounts, each with its own layer: one lock per account.
    /// let by_id = |route| PathParam::new(route, "id");
    /// let credit = RedlockLayer::new(redlock.clone(), by_id("/accounts/{id}/credit"))
    ///     .namespace("account");
    /// let debit = RedlockLayer::new(redlock.clone(), by_id("/accounts/{id}/debit"))
    ///     .namespace("account");
    /// assert_eq!(credit.lock_name_for::<()>("46"), b"account 46");
    /// assert_eq!(credit.lock_name_for::<()>("46"), debit.lock_name_for::<()>("46"));
    ///
    /// // By default each layer has its own: a delivery id 46 is not account 46.
    /// let hooks = RedlockLayer::new(redlock, Header::new("x-delivery-id"));
    /// assert_eq!(hooks.lock_name_for::<()>("46"), b"header:x-delivery-id 46");
    /// # Ok(()) }
    /// ```
    ///
    /// With no namespace, a job outside the layer locks the names the layer locks:
    ///
    /// ```no_run
    /// use tower_redlock::layer::{ExtractError, RequestHead, extract_fn};
    /// use tower_redlock::{Redlock, RedlockLayer};
    ///
    /// fn account(head: &RequestHead<'_>) -> Result<Option<Vec<u8>>, ExtractError> {
    ///     let id = head.uri.path().split('/').nth(2).unwrap_or_default();
    ///     Ok((!id.is_empty()).then(|| format!("account:{id}").into_bytes()))
    /// }
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let layer = RedlockLayer::new(redlock.clone(), extract_fn(account)).namespace("");
    /// // The nightly interest job: requests for account 42 wait while it holds the lock.
    /// let lock = redlock.lock("account:42").await?;
    /// # let _ = (layer, lock); Ok(()) }
    /// ```
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config().namespace = Namespace::named(&namespace.into());
        self
    }

    /// The lock name this layer takes for a request whose extractor gives `name`: its
    /// namespace (see [`namespace`](Self::namespace)), a space, then `name`. That is the
    /// name the handler's [`LockToken::name`](crate::LockToken::name) shows, and the name
    /// a test looks up in the in-memory lock of the `testing` feature. `B` is the request
    /// body type the layer serves (`()` fits the stock extractors, whatever the body).
    ///
    /// ```
    /// use tower_redlock::layer::{Header, PerRoute};
    /// use tower_redlock::{Redlock, RedlockLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let redlock = Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
    /// let layer = RedlockLayer::new(redlock.clone(), Header::new("Idempotency-Key"));
    /// assert_eq!(layer.lock_name_for::<()>("k-1"), b"header:idempotency-key k-1");
    /// // A scoped extractor's name keeps its scope, inside the namespace.
    /// let routed = RedlockLayer::new(redlock, PerRoute::new(Header::new("Idempotency-Key")));
    /// assert_eq!(
    ///     routed.lock_name_for::<()>("POST /orders k-1"),
    ///     b"header:idempotency-key POST /orders k-1"
    /// );
    /// # Ok(()) }
    /// ```
    pub fn lock_name_for<B>(&self, name: impl AsRef<[u8]>) -> Vec<u8>
    where
        E: ExtractLockName<B>,
    {
        self.config
            .namespace
            .lock_name(&self.extractor, name.as_ref().to_vec())
    }
}
