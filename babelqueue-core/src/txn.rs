//! Transactional idempotency: the handler's database writes and the id's row commit
//! together, or neither does.
//!
//! The seen-set guard leaves one window open (as every BabelQueue SDK and AWS Lambda
//! Powertools do): the effect happens, the process dies before `remember`, and the
//! redelivery runs the effect again. When the effect is a write to the same database as
//! the store, the window closes: the store opens a transaction, inserts the id's row in
//! it, hands the transaction to the handler, and commits once the handler succeeds.
//!
//! * A crash before the commit rolls back both the effect and the id: the redelivery
//!   runs, once.
//! * A handler error rolls back both: the retry runs.
//! * A duplicate finds the committed row and is skipped, without calling the handler.
//! * Two concurrent deliveries of one id serialize on the row (its primary key): the
//!   second waits until the first commits (then skips) or rolls back (then runs).
//!
//! The stores offering it: `PostgresStore::transaction` (async; the handler gets the
//! `tokio_postgres` transaction) and `SqliteStore::transaction` (blocking, `BEGIN
//! IMMEDIATE`; the handler gets the `rusqlite` transaction). The id rows keep the shared
//! table layout, so other SDKs sharing the table still see the id as seen.
//!
//! **Does not**: make effects outside that database (an HTTP call, a message published
//! to a broker, a write to another database) atomic with the id; they run again after a
//! crash before the commit. A commit that fails ambiguously (the connection drops during
//! `COMMIT`) returns an error and the message is retried: if the commit did happen, the
//! retry sees the row and is skipped.
//!
//! This module holds what the stores' implementations share: recording the guard's
//! [`Outcome`] so that the runtime's [`capture_outcome`](crate::guard::capture_outcome) tells a
//! skipped duplicate from a run.

use crate::outcome::Outcome;

/// Records `outcome` for [`capture_outcome`](crate::guard::capture_outcome) /
/// [`capture_outcome_sync`](crate::guard::capture_outcome_sync) and returns it. For store
/// implementations of a transactional guard (the seen-set guards record theirs).
pub fn report(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Skipped => crate::outcome::skipped("(transactional)"),
        other => crate::outcome::done(other),
    }
}

/// Records a skipped duplicate of `key` (logged at debug level) and returns
/// [`Outcome::Skipped`].
pub fn report_skipped(key: &str) -> Outcome {
    crate::outcome::skipped(key)
}

/// A store that can run a handler in one transaction with the id's row, blocking (the
/// SQLite store). The uniform entry point generated code and generic code call; users
/// call the store's own `transaction*` methods.
pub trait TransactionalStore {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// What the handler receives: the open transaction.
    type Tx<'c>;

    /// Runs `handler` in a transaction with the row of `key` (`None`: no usable key, run
    /// it without a row), keeping the row for `ttl` (`None`: the store's retention) and
    /// storing `fingerprint` with it if given. `Ok(Err(mismatch))`: a duplicate whose
    /// stored fingerprint differs (the handler did not run).
    #[allow(clippy::type_complexity)]
    fn transaction_guard<F, R>(
        &self,
        key: Option<&str>,
        ttl: Option<std::time::Duration>,
        fingerprint: Option<crate::fingerprint::Fingerprint>,
        handler: F,
    ) -> Result<Result<Outcome, crate::fingerprint::PayloadMismatch>, R::Error>
    where
        F: FnOnce(&Self::Tx<'_>) -> R,
        R: crate::outcome::HandlerResult,
        Self::Error: crate::store::IntoHandlerError<R::Error>;
}

/// The async counterpart of [`TransactionalStore`] (the PostgreSQL store): the handler is
/// an async closure receiving the transaction.
pub trait AsyncTransactionalStore: Send + Sync {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// What the handler receives: the open transaction.
    type Tx<'c>;

    /// See [`TransactionalStore::transaction_guard`].
    #[allow(clippy::type_complexity)]
    fn transaction_guard<F, R>(
        &self,
        key: Option<&str>,
        ttl: Option<std::time::Duration>,
        fingerprint: Option<crate::fingerprint::Fingerprint>,
        handler: F,
    ) -> impl std::future::Future<
        Output = Result<Result<Outcome, crate::fingerprint::PayloadMismatch>, R::Error>,
    >
    where
        F: AsyncFnOnce(&Self::Tx<'_>) -> R,
        R: crate::outcome::HandlerResult,
        Self::Error: crate::store::IntoHandlerError<R::Error>;
}

/// Runs one store call of a transactional guard (`BEGIN`, the id's claim, `COMMIT`): the
/// single place where such a call's failure is told apart from the handler's own failure.
/// A failure here is the store's (unreachable, timed out), not the message's: the
/// runtime should put the message back without counting an attempt. For store
/// implementations of [`TransactionalStore`] / [`AsyncTransactionalStore`].
///
/// (Today it only runs `fut`; the consume runtime's typed store-unavailable marker hooks
/// in here, as it does in the seen-set guards.)
pub async fn store_call<T, E, F>(key: Option<&str>, fut: F) -> Result<T, E>
where
    F: std::future::Future<Output = Result<T, E>>,
{
    // Through the runtime's probe: a failed begin/claim/commit is the store's failure
    // (requeued without counting an attempt), not the handler's.
    let out = crate::hooks::store_before(key.unwrap_or(""), fut).await;
    if out.is_err() {
        tracing::debug!(
            key = key.unwrap_or(""),
            "transactional guard: store call failed"
        );
    }
    out
}

/// The blocking counterpart of [`store_call`].
pub fn store_call_sync<T, E>(key: Option<&str>, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    let out = crate::hooks::store_before_sync(key.unwrap_or(""), f);
    if out.is_err() {
        tracing::debug!(
            key = key.unwrap_or(""),
            "transactional guard: store call failed"
        );
    }
    out
}
