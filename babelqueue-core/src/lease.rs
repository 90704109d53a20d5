//! In-flight lease mode: atomic claims that stop two workers running the same id at once.
//!
//! The seen-set contract is post-success dedupe: two workers that both check `seen` before
//! either remembers both run the handler. A store that can claim atomically implements
//! [`LeaseStore`] / [`AsyncLeaseStore`], and [`guard_lease`](crate::guard_lease) /
//! [`guard_lease_async`](crate::guard_lease_async) (or `#[idempotent(lease = "30s")]`)
//! then:
//!
//! 1. claims the id as in flight, with a lease that expires by itself;
//! 2. an id already completed → skip (acked);
//! 3. an id in flight elsewhere → returns [`InFlight`] (do not run, do not ack: retry later);
//! 4. handler ok → [`complete`](LeaseStore::complete) (marks it seen, with the TTL if any);
//!    handler error → [`release`](LeaseStore::release) so the retry runs.
//!
//! Only the holder of the [`LeaseToken`] can complete or release a claim.

use std::future::Future;
use std::time::Duration;

use crate::store::{AsyncStore, Store};

/// An opaque token proving who holds a claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// A fresh random token (UUID v4).
    pub fn new() -> Self {
        LeaseToken(uuid::Uuid::new_v4().simple().to_string())
    }

    /// Wraps a token read back from a store.
    pub fn from_string(token: impl Into<String>) -> Self {
        LeaseToken(token.into())
    }

    /// The token as text (what a store writes).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for LeaseToken {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This caller holds the id until the lease ends; run the handler.
    Acquired(LeaseToken),
    /// The id was already processed: skip.
    Completed,
    /// Another worker holds an unexpired lease on the id.
    InFlight,
}

/// The id is being processed by another worker right now: do not run and do not ack;
/// the message should be retried later (the other worker may still fail).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message {id} is in flight on another worker (lease not expired); retry later")]
pub struct InFlight {
    /// The key that is in flight.
    pub id: String,
}

/// A blocking store that can claim ids atomically.
///
/// While a claim is held (not yet completed or released, lease not ended), `seen`
/// reports the id as seen, which is how the shared Redis and PostgreSQL layouts show it to
/// every SDK's seen-set consumer; `forget` drops a held claim (its holder can then no
/// longer complete it). `babelqueue_core::testing` (feature `testing`) checks all of this.
pub trait LeaseStore: Store {
    /// Atomically: completed → [`Claim::Completed`]; held under an unexpired lease →
    /// [`Claim::InFlight`]; otherwise claim it for `lease` → [`Claim::Acquired`].
    fn claim(&self, id: &str, lease: Duration) -> Result<Claim, Self::Error>;

    /// Marks a claimed id completed (seen, for `ttl` or the store default) if `token`
    /// still holds it. Returns whether it did.
    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Result<bool, Self::Error>;

    /// Releases a claim if `token` still holds it, so the next delivery runs. Returns
    /// whether it did.
    fn release(&self, id: &str, token: &LeaseToken) -> Result<bool, Self::Error>;
}

/// The async counterpart of [`LeaseStore`].
pub trait AsyncLeaseStore: AsyncStore {
    /// See [`LeaseStore::claim`].
    fn claim(
        &self,
        id: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, Self::Error>> + Send;

    /// See [`LeaseStore::complete`].
    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// See [`LeaseStore::release`].
    fn release(
        &self,
        id: &str,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;
}

macro_rules! forward_lease {
    ($(impl[$($g:tt)*] for $ty:ty;)*) => {$(
        impl<$($g)*> LeaseStore for $ty {
            fn claim(&self, id: &str, lease: Duration) -> Result<Claim, Self::Error> {
                S::claim(self, id, lease)
            }
            fn complete(&self, id: &str, token: &LeaseToken, ttl: Option<Duration>)
                -> Result<bool, Self::Error> {
                S::complete(self, id, token, ttl)
            }
            fn release(&self, id: &str, token: &LeaseToken) -> Result<bool, Self::Error> {
                S::release(self, id, token)
            }
        }
    )*};
}

macro_rules! forward_async_lease {
    ($(impl[$($g:tt)*] for $ty:ty;)*) => {$(
        impl<$($g)*> AsyncLeaseStore for $ty {
            fn claim(&self, id: &str, lease: Duration)
                -> impl Future<Output = Result<Claim, Self::Error>> + Send {
                S::claim(self, id, lease)
            }
            fn complete(&self, id: &str, token: &LeaseToken, ttl: Option<Duration>)
                -> impl Future<Output = Result<bool, Self::Error>> + Send {
                S::complete(self, id, token, ttl)
            }
            fn release(&self, id: &str, token: &LeaseToken)
                -> impl Future<Output = Result<bool, Self::Error>> + Send {
                S::release(self, id, token)
            }
        }
    )*};
}

forward_lease! {
    impl[S: LeaseStore + ?Sized] for &S;
    impl[S: LeaseStore + ?Sized] for Box<S>;
    impl[S: LeaseStore + ?Sized] for std::sync::Arc<S>;
    impl[S: LeaseStore, F: FnOnce() -> S] for std::sync::LazyLock<S, F>;
    impl[S: LeaseStore, F: FnOnce() -> S] for once_cell::sync::Lazy<S, F>;
}

forward_async_lease! {
    impl[S: AsyncLeaseStore + ?Sized] for &S;
    impl[S: AsyncLeaseStore + ?Sized] for Box<S>;
    impl[S: AsyncLeaseStore + ?Sized] for std::sync::Arc<S>;
    impl[S: AsyncLeaseStore, F: FnOnce() -> S + Send] for std::sync::LazyLock<S, F>;
    impl[S: AsyncLeaseStore, F: FnOnce() -> S + Send] for once_cell::sync::Lazy<S, F>;
}
