//! A layer's namespace: what comes before every lock name the layer takes, so that two
//! layers on one client never lock the same names unless they are told to.
//!
//! A layer locks `"{namespace} {name}"`, where `name` is what its extractor gave and
//! `namespace` is, unless [`RedlockLayer::namespace`](crate::RedlockLayer::namespace)
//! names it, the extractor's [`namespace`](super::ExtractLockName::namespace)
//! (`header:idempotency-key`, `path:/accounts/{id}/credit#id`, ...). Spaces and `%` in
//! the namespace are percent-encoded (`%20`, `%25`), so the first space of a lock name
//! ends its namespace: two different namespaces never give one lock name, whatever the
//! names. The empty namespace adds nothing: the lock name is the extractor's name.
//!
//! ```
//! # #[cfg(feature = "testing")] {
//! use tower_redlock::RedlockLayer;
//! use tower_redlock::layer::{Header, PathParam};
//! use tower_redlock::testing::InMemoryLock;
//!
//! let lock = InMemoryLock::new();
//! let accounts = RedlockLayer::new(lock.clone(), PathParam::new("/accounts/{id}/credit", "id"));
//! assert_eq!(accounts.lock_name_for::<()>("46"), b"path:/accounts/{id}/credit#id 46");
//! let hooks = RedlockLayer::new(lock, Header::new("x-delivery-id")).namespace("web hooks");
//! assert_eq!(hooks.lock_name_for::<()>("46"), b"web%20hooks 46");
//! # }
//! ```

use std::fmt;
use std::sync::OnceLock;

use super::ExtractLockName;

/// A layer's namespace, as the prefix of its lock names: the namespace, escaped, and a
/// space (empty for the empty namespace). Built once per layer, so that naming a request's
/// lock costs one allocation and two copies.
#[derive(Clone)]
pub(crate) enum Namespace {
    /// The extractor's namespace, built at the layer's first request (or first
    /// [`lock_name_for`](crate::RedlockLayer::lock_name_for)): only then is the request
    /// body type, and so the extractor's implementation, known.
    FromExtractor(OnceLock<Box<[u8]>>),
    /// The namespace the layer was given.
    Named(Box<[u8]>),
}

impl Namespace {
    /// The namespace of a layer whose extractor names it.
    pub(crate) fn from_extractor() -> Self {
        Self::FromExtractor(OnceLock::new())
    }

    /// The namespace `namespace`.
    pub(crate) fn named(namespace: &str) -> Self {
        Self::Named(prefix(namespace))
    }

    /// The prefix of the layer's lock names, `extractor` the layer's.
    fn prefix<B, E: ExtractLockName<B>>(&self, extractor: &E) -> &[u8] {
        match self {
            Self::Named(prefix) => prefix,
            Self::FromExtractor(once) => once.get_or_init(|| prefix(&extractor.namespace())),
        }
    }

    /// The lock name of `name`, a name `extractor` (the layer's) gave. An empty name stays
    /// empty, so the lock refuses it as before (400 / `INVALID_ARGUMENT`).
    pub(crate) fn lock_name<B, E: ExtractLockName<B>>(
        &self,
        extractor: &E,
        name: Vec<u8>,
    ) -> Vec<u8> {
        let prefix = self.prefix(extractor);
        if prefix.is_empty() || name.is_empty() {
            return name;
        }
        let mut out = Vec::with_capacity(prefix.len() + name.len());
        out.extend_from_slice(prefix);
        out.extend_from_slice(&name);
        out
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |prefix: &[u8]| {
            String::from_utf8_lossy(prefix.strip_suffix(b" ").unwrap_or(prefix)).into_owned()
        };
        match self {
            Self::FromExtractor(once) => match once.get() {
                Some(prefix) => write!(f, "{:?} (the extractor's)", shown(prefix)),
                None => f.write_str("the extractor's"),
            },
            Self::Named(prefix) => write!(f, "{:?}", shown(prefix)),
        }
    }
}

/// The prefix of namespace `namespace`: percent-encoded spaces and `%`, then a space;
/// nothing for the empty namespace.
fn prefix(namespace: &str) -> Box<[u8]> {
    if namespace.is_empty() {
        return Box::default();
    }
    let mut out = Vec::with_capacity(namespace.len() + 1);
    for &b in namespace.as_bytes() {
        match b {
            b' ' => out.extend_from_slice(b"%20"),
            b'%' => out.extend_from_slice(b"%25"),
            b => out.push(b),
        }
    }
    out.push(b' ');
    out.into_boxed_slice()
}

#[cfg(test)]
#[path = "namespace_tests.rs"]
mod tests;
