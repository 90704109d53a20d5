//! What `#[idempotent(fingerprint)]` and `#[idempotent(transactional = tx)]` expand to.
//! You never use these items directly; they are public (and documented) because the
//! macro's compile errors name them: when one says that a trait of this module "is not
//! implemented", its message and note say what to change in your code.
//!
//! The same pattern as `macro_support`: one call per generated handler, every
//! requirement on the user's tokens a bound with a `#[diagnostic::on_unimplemented]`
//! message; the behaviour is in [`crate::fingerprint`] and the stores' transactional
//! methods.

use std::future::Future;
use std::time::Duration;

use crate::fingerprint::{AsyncFingerprintStore, Fingerprint, FingerprintStore, PayloadMismatch};
use crate::guard::{Guard, Guarded, HandlerResult};
use crate::macro_support::{IdempotentReturn, StoreErrorFits};
use crate::txn::{AsyncTransactionalStore, TransactionalStore};

/// Turns a guard's answer back into the handler's return value (`()` or
/// `Result<(), E>`), independently of how `macro_support` spells the same conversion.
pub trait GuardReturn: HandlerResult + Sized {
    /// The handler's value for the guard's answer.
    fn from_outcome(result: Result<Guarded, Self::Error>) -> Self;
}

impl GuardReturn for () {
    fn from_outcome(result: Result<Guarded, std::convert::Infallible>) -> Self {
        match result {
            Ok(_) => (),
            Err(never) => match never {},
        }
    }
}

impl<E> GuardReturn for Result<(), E> {
    fn from_outcome(result: Result<Guarded, E>) -> Self {
        result.map(|_| ())
    }
}

/// A handler error that can report a payload mismatch (`fingerprint`).
#[diagnostic::on_unimplemented(
    message = "with `fingerprint` the handler's error `{Self}` must be able to hold `babelqueue::PayloadMismatch`",
    label = "`{Self}` does not implement `From<babelqueue::PayloadMismatch>`",
    note = "a delivery whose payload differs from the first delivery of its key is refused with a `PayloadMismatch` error (dead-lettered as `failed`); add `impl From<babelqueue::PayloadMismatch> for {Self}` (or a `#[from] PayloadMismatch` variant)"
)]
pub trait AcceptsPayloadMismatch: From<PayloadMismatch> {}

#[diagnostic::do_not_recommend]
impl<E: From<PayloadMismatch>> AcceptsPayloadMismatch for E {}

/// The fingerprinting guard of a sync `#[idempotent(fingerprint)]` handler.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot store payload fingerprints for a sync handler",
    label = "this `store = ...` does not implement `babelqueue::fingerprint::FingerprintStore`",
    note = "`fingerprint` needs a store that keeps a digest with each id (`InMemoryStore`, the SQLite store for a sync fn; Redis, PostgreSQL for an `async fn`); remove `fingerprint` to use plain dedupe"
)]
pub trait SyncFingerprintGuard<R> {
    /// Runs `body` under the fingerprinting guard.
    fn guard<F: FnOnce() -> R>(
        &self,
        key: Option<String>,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        body: F,
    ) -> R;
}

impl<S, R> SyncFingerprintGuard<R> for S
where
    S: FingerprintStore + ?Sized,
    R: IdempotentReturn<Error: AcceptsPayloadMismatch> + GuardReturn,
    S::Error: StoreErrorFits<R::Kind>,
{
    fn guard<F: FnOnce() -> R>(
        &self,
        key: Option<String>,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        body: F,
    ) -> R {
        R::from_outcome(
            Guard::new(self)
                .ttl(ttl)
                .fingerprint(fingerprint)
                .run(key, body),
        )
    }
}

/// The fingerprinting guard of an async `#[idempotent(fingerprint)]` handler.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot store payload fingerprints for an async handler",
    label = "this `store = ...` does not implement `babelqueue::fingerprint::AsyncFingerprintStore`",
    note = "`fingerprint` needs a store that keeps a digest with each id (`InMemoryStore`, Redis, PostgreSQL, SQLite); remove `fingerprint` to use plain dedupe"
)]
pub trait AsyncFingerprintGuard<R> {
    /// Runs `body` under the fingerprinting guard.
    fn guard<Fut: Future<Output = R>>(
        &self,
        key: Option<String>,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        body: Fut,
    ) -> impl Future<Output = R>;
}

impl<S, R> AsyncFingerprintGuard<R> for S
where
    S: AsyncFingerprintStore + ?Sized,
    R: IdempotentReturn<Error: AcceptsPayloadMismatch> + GuardReturn,
    S::Error: StoreErrorFits<R::Kind>,
{
    async fn guard<Fut: Future<Output = R>>(
        &self,
        key: Option<String>,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        body: Fut,
    ) -> R {
        let guard = Guard::new(self).ttl(ttl).fingerprint(fingerprint);
        R::from_outcome(guard.run_async(key, body).await)
    }
}

/// The guard of a sync `#[idempotent(transactional)]` handler: `body` receives the
/// store's transaction.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a sync handler in a transaction with its id",
    label = "this `store = ...` does not implement `babelqueue::txn::TransactionalStore`",
    note = "`transactional` needs a database store: the SQLite store for a sync fn, the PostgreSQL store for an `async fn`"
)]
pub trait SyncTxGuard<R> {
    /// The transaction `body` receives.
    type Tx<'c>;

    /// Runs `body` in a transaction with the row of `key`.
    fn guard<F: FnOnce(&Self::Tx<'_>) -> R>(
        &self,
        key: Option<String>,
        ttl: Option<Duration>,
        body: F,
    ) -> R;

    /// [`guard`](Self::guard) storing and checking a payload fingerprint.
    fn guard_fingerprint<F: FnOnce(&Self::Tx<'_>) -> R>(
        &self,
        key: Option<String>,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        body: F,
    ) -> R
    where
        R: IdempotentReturn<Error: AcceptsPayloadMismatch>;
}

impl<S, R> SyncTxGuard<R> for S
where
    S: TransactionalStore + ?Sized,
    R: IdempotentReturn + GuardReturn,
    S::Error: StoreErrorFits<R::Kind>,
{
    type Tx<'c> = S::Tx<'c>;

    fn guard<F: FnOnce(&Self::Tx<'_>) -> R>(
        &self,
        key: Option<String>,
        ttl: Option<Duration>,
        body: F,
    ) -> R {
        R::from_outcome(Guard::new(self).ttl(ttl).transaction().run(key, body))
    }

    fn guard_fingerprint<F: FnOnce(&Self::Tx<'_>) -> R>(
        &self,
        key: Option<String>,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        body: F,
    ) -> R
    where
        R: IdempotentReturn<Error: AcceptsPayloadMismatch>,
    {
        let guard = Guard::new(self)
            .ttl(ttl)
            .fingerprint(fingerprint)
            .transaction();
        R::from_outcome(guard.run(key, body))
    }
}

/// The guard of an async `#[idempotent(transactional)]` handler: `body` is an async
/// closure receiving the store's transaction.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run an async handler in a transaction with its id",
    label = "this `store = ...` does not implement `babelqueue::txn::AsyncTransactionalStore`",
    note = "`transactional` needs a database store: the PostgreSQL store for an `async fn`, the SQLite store for a sync fn"
)]
pub trait AsyncTxGuard<R> {
    /// The transaction `body` receives.
    type Tx<'c>;

    /// Runs `body` in a transaction with the row of `key`.
    fn guard<F: AsyncFnOnce(&Self::Tx<'_>) -> R>(
        &self,
        key: Option<String>,
        ttl: Option<Duration>,
        body: F,
    ) -> impl Future<Output = R>;

    /// [`guard`](Self::guard) storing and checking a payload fingerprint.
    fn guard_fingerprint<F: AsyncFnOnce(&Self::Tx<'_>) -> R>(
        &self,
        key: Option<String>,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        body: F,
    ) -> impl Future<Output = R>
    where
        R: IdempotentReturn<Error: AcceptsPayloadMismatch>;
}

impl<S, R> AsyncTxGuard<R> for S
where
    S: AsyncTransactionalStore + ?Sized,
    R: IdempotentReturn + GuardReturn,
    S::Error: StoreErrorFits<R::Kind>,
{
    type Tx<'c> = S::Tx<'c>;

    async fn guard<F: AsyncFnOnce(&Self::Tx<'_>) -> R>(
        &self,
        key: Option<String>,
        ttl: Option<Duration>,
        body: F,
    ) -> R {
        R::from_outcome(
            Guard::new(self)
                .ttl(ttl)
                .transaction()
                .run_async(key, body)
                .await,
        )
    }

    async fn guard_fingerprint<F: AsyncFnOnce(&Self::Tx<'_>) -> R>(
        &self,
        key: Option<String>,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        body: F,
    ) -> R
    where
        R: IdempotentReturn<Error: AcceptsPayloadMismatch>,
    {
        let guard = Guard::new(self)
            .ttl(ttl)
            .fingerprint(fingerprint)
            .transaction();
        R::from_outcome(guard.run_async(key, body).await)
    }
}
