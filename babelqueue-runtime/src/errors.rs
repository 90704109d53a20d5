//! Typed error markers a handler (or the runtime itself) uses to say what kind of failure
//! happened. The runtime finds them **by type** anywhere in the error's source chain,
//! never by the error's text.

use std::time::Duration;

use crate::handler::BoxError;

/// A handler error that retrying cannot fix (a declined card, a malformed order): the
/// message is dead-lettered at once (reason `failed`) instead of being retried.
///
/// Return it (boxed), or keep it in your error's source chain (`#[source]` / `#[from]`
/// on a field; an `#[error(transparent)]` wrapper hides it, since its `source()` skips the
/// wrapped error).
///
/// ```
/// use babelqueue_runtime::Permanent;
/// let err = Permanent::new(std::io::Error::other("card declined"));
/// assert_eq!(err.to_string(), "card declined");
/// ```
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Permanent(BoxError);

impl Permanent {
    /// Marks `error` as permanent.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Permanent(error.into())
    }

    /// The wrapped error.
    pub fn into_inner(self) -> BoxError {
        self.0
    }
}

/// An infrastructure failure that is not the message's fault (a store or downstream
/// service that cannot answer): no attempt is counted, the message is put back on the
/// queue after a delay and the consumer backs off while it lasts.
///
/// The idempotency guard already reports a failing dedupe store this way (by a typed
/// marker, whatever the handler's error type); wrap your own infrastructure errors in it
/// when they should be treated the same.
///
/// ```
/// use babelqueue_runtime::StoreUnavailable;
/// let err = StoreUnavailable::new(std::io::Error::other("connection refused"));
/// assert_eq!(err.to_string(), "connection refused");
/// ```
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StoreUnavailable(BoxError);

impl StoreUnavailable {
    /// Marks `error` as an infrastructure failure.
    pub fn new(error: impl Into<BoxError>) -> Self {
        StoreUnavailable(error.into())
    }

    /// The wrapped error.
    pub fn into_inner(self) -> BoxError {
        self.0
    }
}

/// The handler ran longer than [`App::handler_timeout`](super::App::handler_timeout): a
/// handler failure (retried with backoff, then dead-lettered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the handler did not finish within {0:?}")]
pub struct HandlerTimeout(pub Duration);

/// A store call did not answer within [`App::store_timeout`](super::App::store_timeout):
/// treated as the store being unavailable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the dedupe store did not answer within {0:?}")]
pub struct StoreTimeout(pub Duration);

/// Whether an error of type `T` is anywhere in `err`'s source chain.
pub(crate) fn in_chain<T: std::error::Error + 'static>(
    err: &(dyn std::error::Error + 'static),
) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<T>() {
            return true;
        }
        cur = e.source();
    }
    false
}
