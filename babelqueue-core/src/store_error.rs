//! Store errors the runtime must tell apart by type: [`StoreUnavailable`] (the store could
//! not answer, or not in time) and [`UnstorableId`] (the id
//! breaks [the one rule](crate::key::id_is_storable) for ids a store can hold).
//!
//! Every store of this project puts one of these two types in its error's
//! [`source`](std::error::Error::source) chain (its error has a variant wrapping it), so
//! code that only holds a boxed or converted error, such as the runtime holding a
//! handler's `BoxError`, can recognise them with [`find_unavailable`] and
//! [`find_unstorable_id`], never by comparing texts:
//!
//! * unavailable → the message is not at fault: put it back, count no attempt, back off;
//! * unstorable id → the message is at fault: dead-letter it as poison.
//!
//! ```
//! use babelqueue_core::store_error::{find_unavailable, StoreUnavailable, UnavailableKind};
//! use babelqueue_core::BoxError;
//!
//! let err: BoxError = Box::new(StoreUnavailable::new("postgres", "seen", UnavailableKind::Timeout));
//! let found = find_unavailable(&*err).expect("typed");
//! assert!(found.is_timeout());
//! ```

use std::error::Error;
use std::fmt;

use crate::key::UnstorableId;
use crate::outcome::BoxError;

/// Why a store could not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnavailableKind {
    /// The call did not finish within the store's per-call timeout (PostgreSQL
    /// `statement_timeout` or the client-side bound, SQLite's busy timeout, Redis' response
    /// timeout, a pool wait).
    Timeout,
    /// The server could not be reached or the connection broke.
    Connection,
    /// Injected by the fault kit (`babelqueue_testing::faults::FaultyStore`).
    Injected,
}

impl fmt::Display for UnavailableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnavailableKind::Timeout => "timed out",
            UnavailableKind::Connection => "connection failed",
            UnavailableKind::Injected => "injected fault",
        })
    }
}

/// The store could not answer a call (down, unreachable, or too slow): not the message's
/// fault. The runtime returns the message to the queue without counting an attempt.
///
/// Found in the source chain of every store error of this project that means this (see
/// [`find_unavailable`]); each store error also has an `is_unavailable()` /
/// `is_timeout()` method.
#[derive(Debug, thiserror::Error)]
#[error("{store} store: {operation} {kind}")]
pub struct StoreUnavailable {
    /// The backend (`redis`, `postgres`, `sqlite`, `memory`, or a name of yours).
    pub store: &'static str,
    /// The call (`seen`, `remember`, `forget`, `claim`, `complete`, `release`, `renew`,
    /// `connect`, …).
    pub operation: &'static str,
    /// Why.
    pub kind: UnavailableKind,
    /// The backend's own error, when there is one.
    #[source]
    pub source: Option<BoxError>,
}

impl StoreUnavailable {
    /// A marker without an underlying error.
    pub fn new(store: &'static str, operation: &'static str, kind: UnavailableKind) -> Self {
        StoreUnavailable {
            store,
            operation,
            kind,
            source: None,
        }
    }

    /// A marker wrapping the backend's error.
    pub fn with_source(
        store: &'static str,
        operation: &'static str,
        kind: UnavailableKind,
        source: impl Into<BoxError>,
    ) -> Self {
        StoreUnavailable {
            store,
            operation,
            kind,
            source: Some(source.into()),
        }
    }

    /// Whether the call timed out.
    pub fn is_timeout(&self) -> bool {
        self.kind == UnavailableKind::Timeout
    }
}

crate::handler_error_from!(StoreUnavailable, UnstorableId);

/// The first [`StoreUnavailable`] in `err` or its [`source`](Error::source) chain.
///
/// ```
/// use babelqueue_core::store_error::find_unavailable;
/// let plain = std::io::Error::other("handler bug");
/// assert!(find_unavailable(&plain).is_none());
/// ```
pub fn find_unavailable<'a>(err: &'a (dyn Error + 'static)) -> Option<&'a StoreUnavailable> {
    chain(err).find_map(|e| e.downcast_ref::<StoreUnavailable>())
}

/// Whether `err` (or its source chain) says the store was unavailable.
pub fn is_unavailable(err: &(dyn Error + 'static)) -> bool {
    find_unavailable(err).is_some()
}

/// The first [`UnstorableId`] in `err` or its source chain: the store refused the id
/// before any I/O because it breaks [`id_is_storable`](crate::key::id_is_storable).
///
/// ```
/// use babelqueue_core::key::{id_is_storable, UnstorableId};
/// use babelqueue_core::store_error::find_unstorable_id;
/// use babelqueue_core::BoxError;
/// let err: BoxError = Box::new(id_is_storable("a\0b").unwrap_err());
/// assert_eq!(find_unstorable_id(&*err), Some(&UnstorableId::Nul));
/// ```
pub fn find_unstorable_id<'a>(err: &'a (dyn Error + 'static)) -> Option<&'a UnstorableId> {
    chain(err).find_map(|e| e.downcast_ref::<UnstorableId>())
}

fn chain<'a>(err: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(err), |e: &&'a (dyn Error + 'static)| (*e).source())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("wrapper")]
    struct Wrapper(#[source] StoreUnavailable);

    #[test]
    fn found_through_a_chain_and_a_box() {
        let inner = StoreUnavailable::with_source(
            "x",
            "seen",
            UnavailableKind::Connection,
            std::io::Error::other("refused"),
        );
        let err: BoxError = Box::new(Wrapper(inner));
        let found = find_unavailable(&*err).expect("found");
        assert_eq!(found.kind, UnavailableKind::Connection);
        assert!(!found.is_timeout());
        assert_eq!(found.to_string(), "x store: seen connection failed");
        assert!(find_unstorable_id(&*err).is_none());
    }
}
