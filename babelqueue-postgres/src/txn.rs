//! Transactional idempotency and payload fingerprints on PostgreSQL.

use std::time::Duration;

use babelqueue_core::fingerprint::{
    self, AsyncFingerprintStore, Fingerprint, Lookup, PayloadMismatch,
};
use babelqueue_core::{DedupeKey, Outcome, guard::HandlerResult, store::IntoHandlerError, txn};
use deadpool_postgres::Transaction;

use crate::store::{PostgresStore, PostgresStoreError, millis};

fn lookup_of(rows: &[tokio_postgres::Row]) -> Result<Lookup, PostgresStoreError> {
    Ok(match rows.first() {
        None => Lookup::Unseen,
        Some(row) => {
            let text: Option<String> = row.try_get(0)?;
            Lookup::Seen {
                fingerprint: text.as_deref().and_then(Fingerprint::parse),
            }
        }
    })
}

/// Fingerprints (opt-in): the row's nullable `fingerprint` column holds `sha256:<hex>`;
/// a row written by another SDK (NULL) reads as "no fingerprint".
impl AsyncFingerprintStore for PostgresStore {
    async fn lookup(&self, id: &str) -> Result<Lookup, PostgresStoreError> {
        let rows = self.query("lookup", &self.ext.lookup, &[&id]).await?;
        lookup_of(&rows)
    }

    async fn remember_fingerprint(
        &self,
        id: &str,
        fingerprint: &Fingerprint,
        ttl: Option<Duration>,
    ) -> Result<(), PostgresStoreError> {
        let ttl_ms = ttl.or(self.ttl).map(millis);
        let fp = fingerprint.to_string();
        self.query(
            "remember_fingerprint",
            &self.ext.claim,
            &[&id, &ttl_ms, &fp],
        )
        .await
        .map(|_| ())
    }
}

/// What one transactional run decided, before the caller's error conversions.
enum TxEnd {
    Done(Outcome),
    Mismatch(PayloadMismatch),
}

fn store_err<E>(e: impl Into<PostgresStoreError>) -> E
where
    PostgresStoreError: IntoHandlerError<E>,
{
    e.into().into_handler_error()
}

impl PostgresStore {
    /// Runs `handler` exactly once per `key`, **in one transaction with the id's row**:
    /// the handler's writes (made through the transaction it receives) and the row commit
    /// together, or neither does. Pass `&envelope` to key on `meta.id`.
    ///
    /// 1. `BEGIN`; insert the id's row with the claim statement the other SDKs use
    ///    (`INSERT … ON CONFLICT (message_id) DO UPDATE … WHERE <expired>`);
    /// 2. a live row already there → roll back, skip ([`Outcome::Skipped`]); a delivery of
    ///    the same id in progress elsewhere holds the row's lock, so this one waits for it
    ///    and then skips (it committed) or runs (it rolled back);
    /// 3. otherwise run the handler with the transaction; `Ok` → `COMMIT` (a failing
    ///    commit is returned as the store's error: nothing happened, retry); `Err` →
    ///    `ROLLBACK`, the error is returned and the id stays unmarked.
    ///
    /// A process that dies before the commit leaves nothing behind: PostgreSQL rolls the
    /// transaction back with the connection. No usable key → the handler still runs in a
    /// transaction, without a row ([`Outcome::RanWithoutKey`]). The row expires after
    /// the store's retention (`ttl` of [`transaction_with`](Self::transaction_with)
    /// overrides it).
    ///
    /// The transaction runs at the pool's default isolation (READ COMMITTED unless the
    /// server is configured otherwise); it holds one pooled connection for the whole
    /// handler, and a delivery waiting on the row of a running one holds one too (size
    /// the pool for it). A row held in flight by a lease-mode handler counts as seen
    /// (skipped), as it does for every seen-set reader of the table.
    ///
    /// ```no_run
    /// use babelqueue_core::{Envelope, Outcome};
    /// use babelqueue_postgres::{PostgresStore, PostgresStoreError};
    ///
    /// # async fn demo(store: PostgresStore, env: Envelope) -> Result<(), PostgresStoreError> {
    /// let outcome = store
    ///     .transaction(&env, async |tx| {
    ///         tx.execute(
    ///             "INSERT INTO ledger (payment_id, amount) VALUES ($1, $2)",
    ///             &[&env.data["payment_id"].as_str(), &env.data["amount"].as_i64()],
    ///         )
    ///         .await?;
    ///         Ok::<(), PostgresStoreError>(())
    ///     })
    ///     .await?;
    /// if outcome == Outcome::Skipped {
    ///     println!("duplicate: already in the ledger");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn transaction<K, F, R>(&self, key: K, handler: F) -> Result<Outcome, R::Error>
    where
        K: DedupeKey,
        F: AsyncFnOnce(&Transaction<'_>) -> R,
        R: HandlerResult,
        PostgresStoreError: IntoHandlerError<R::Error>,
    {
        match self.run(key, None, None, handler).await? {
            TxEnd::Done(outcome) => Ok(outcome),
            TxEnd::Mismatch(_) => unreachable!("no fingerprint was given"),
        }
    }

    /// [`transaction`](Self::transaction) with a TTL for the id's row (`None`: the store's
    /// retention).
    pub async fn transaction_with<K, F, R>(
        &self,
        key: K,
        ttl: Option<Duration>,
        handler: F,
    ) -> Result<Outcome, R::Error>
    where
        K: DedupeKey,
        F: AsyncFnOnce(&Transaction<'_>) -> R,
        R: HandlerResult,
        PostgresStoreError: IntoHandlerError<R::Error>,
    {
        match self.run(key, ttl, None, handler).await? {
            TxEnd::Done(outcome) => Ok(outcome),
            TxEnd::Mismatch(_) => unreachable!("no fingerprint was given"),
        }
    }

    /// [`transaction_with`](Self::transaction_with) that also stores `fingerprint` (see
    /// [`babelqueue_core::fingerprint`]) in the id's row: a duplicate whose row holds a
    /// different fingerprint returns [`PayloadMismatch`] (converted into the handler's
    /// error) instead of being skipped.
    pub async fn transaction_fingerprint<K, F, R>(
        &self,
        key: K,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        handler: F,
    ) -> Result<Outcome, R::Error>
    where
        K: DedupeKey,
        F: AsyncFnOnce(&Transaction<'_>) -> R,
        R: HandlerResult,
        PostgresStoreError: IntoHandlerError<R::Error>,
        R::Error: From<PayloadMismatch>,
    {
        match self.run(key, ttl, Some(fingerprint), handler).await? {
            TxEnd::Done(outcome) => Ok(outcome),
            TxEnd::Mismatch(m) => Err(m.into()),
        }
    }

    async fn run<K, F, R>(
        &self,
        key: K,
        ttl: Option<Duration>,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<TxEnd, R::Error>
    where
        K: DedupeKey,
        F: AsyncFnOnce(&Transaction<'_>) -> R,
        R: HandlerResult,
        PostgresStoreError: IntoHandlerError<R::Error>,
    {
        let key = key.dedupe_key();
        let k = key.as_deref();
        // Every store call goes through `txn::store_call`: its failure is the store's,
        // not the message's.
        let mut client = txn::store_call(k, async {
            Ok::<_, PostgresStoreError>(self.pool.get().await?)
        })
        .await
        .map_err(store_err)?;
        let tx = txn::store_call(k, async {
            Ok::<_, PostgresStoreError>(client.transaction().await?)
        })
        .await
        .map_err(store_err)?;
        let outcome = match k {
            None => Outcome::RanWithoutKey,
            Some(key) => {
                // `None`: this transaction claimed the row; `Some(lookup)`: a duplicate.
                let duplicate = txn::store_call(k, async {
                    let ttl_ms = ttl.or(self.ttl).map(millis);
                    let fp_text = fingerprint.map(|f| f.to_string());
                    let claim = tx.prepare_cached(&self.ext.claim).await?;
                    if !tx
                        .query(&claim, &[&key, &ttl_ms, &fp_text])
                        .await?
                        .is_empty()
                    {
                        return Ok::<_, PostgresStoreError>(None);
                    }
                    if fingerprint.is_none() {
                        return Ok(Some(Lookup::Seen { fingerprint: None }));
                    }
                    let lookup = tx.prepare_cached(&self.ext.lookup).await?;
                    Ok(Some(lookup_of(&tx.query(&lookup, &[&key]).await?)?))
                })
                .await
                .map_err(store_err)?;
                if let Some(found) = duplicate {
                    let _ = tx.rollback().await;
                    if let Some(received) = fingerprint
                        && let Err(m) = fingerprint::check(key, found, &received)
                    {
                        return Ok(TxEnd::Mismatch(m));
                    }
                    return Ok(TxEnd::Done(txn::report_skipped(key)));
                }
                Outcome::Ran
            }
        };
        match handler(&tx).await.into_result() {
            Ok(()) => {
                txn::store_call(k, async { Ok::<_, PostgresStoreError>(tx.commit().await?) })
                    .await
                    .map_err(store_err)?;
                Ok(TxEnd::Done(txn::report(outcome)))
            }
            Err(e) => {
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }
}

/// The uniform entry point of generated code (`#[idempotent(transactional)]`); see
/// [`PostgresStore::transaction`] for the behaviour.
impl babelqueue_core::txn::AsyncTransactionalStore for PostgresStore {
    type Error = PostgresStoreError;
    type Tx<'c> = Transaction<'c>;

    async fn transaction_guard<F, R>(
        &self,
        key: Option<&str>,
        ttl: Option<Duration>,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<Result<Outcome, PayloadMismatch>, R::Error>
    where
        F: AsyncFnOnce(&Transaction<'_>) -> R,
        R: HandlerResult,
        PostgresStoreError: IntoHandlerError<R::Error>,
    {
        Ok(match self.run(key, ttl, fingerprint, handler).await? {
            TxEnd::Done(outcome) => Ok(outcome),
            TxEnd::Mismatch(m) => Err(m),
        })
    }
}
