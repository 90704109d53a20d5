//! Transactional idempotency and payload fingerprints on SQLite.

use std::future::Future;
use std::time::Duration;

use babelqueue_core::fingerprint::{
    self, AsyncFingerprintStore, Fingerprint, FingerprintStore, Lookup, PayloadMismatch,
};
use babelqueue_core::{DedupeKey, Outcome, guard::HandlerResult, store::IntoHandlerError, txn};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::{Inner, SqliteStore, SqliteStoreError, deadline, now_ms};

/// The statements of this module, rendered once for a validated table.
#[derive(Debug)]
pub(crate) struct Statements {
    /// `?1` id, `?2` now, `?3` expires_at or NULL, `?4` fingerprint or NULL: inserts, or
    /// takes over an expired row (clearing a stale lease).
    claim: String,
    /// `?1` id, `?2` now: `(expires_at, live fingerprint)` of the row.
    state: String,
    /// `?1` now, `?2` limit.
    pub(crate) purge_batch: String,
}

impl Statements {
    pub(crate) fn new(table: &str) -> Self {
        let t = format!("\"{table}\"");
        Statements {
            claim: format!(
                "INSERT INTO {t} (message_id, created_at, expires_at, fingerprint, fingerprint_at) \
                 VALUES (?1, ?2, ?3, ?4, CASE WHEN ?4 IS NULL THEN NULL ELSE ?2 END) \
                 ON CONFLICT (message_id) DO UPDATE \
                 SET created_at = excluded.created_at, expires_at = excluded.expires_at, \
                     fingerprint = excluded.fingerprint, fingerprint_at = excluded.fingerprint_at, \
                     lease_token = NULL, lease_expires_at = NULL \
                 WHERE {t}.expires_at IS NOT NULL AND {t}.expires_at <= ?2"
            ),
            state: format!(
                "SELECT expires_at, CASE WHEN fingerprint_at IS created_at THEN fingerprint END \
                 FROM {t} WHERE message_id = ?1"
            ),
            purge_batch: format!(
                "DELETE FROM {t} WHERE message_id IN ( \
                   SELECT message_id FROM {t} \
                   WHERE expires_at IS NOT NULL AND expires_at <= ?1 LIMIT ?2)"
            ),
        }
    }
}

/// Adds the fingerprint columns to a table created before they existed (SQLite has no
/// `ADD COLUMN IF NOT EXISTS`), in an `IMMEDIATE` transaction so two processes opening
/// the file at once do not both add them.
pub(crate) fn add_missing_columns(conn: &Connection, table: &str) -> Result<(), SqliteStoreError> {
    let has = |conn: &Connection| -> rusqlite::Result<(bool, bool)> {
        let mut stmt = conn.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
        let names: Vec<String> = stmt
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok((
            names.iter().any(|n| n == "fingerprint"),
            names.iter().any(|n| n == "fingerprint_at"),
        ))
    };
    if has(conn)? == (true, true) {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| -> rusqlite::Result<()> {
        let (fp, fp_at) = has(conn)?;
        if !fp {
            conn.execute_batch(&format!(
                "ALTER TABLE \"{table}\" ADD COLUMN fingerprint TEXT NULL"
            ))?;
        }
        if !fp_at {
            conn.execute_batch(&format!(
                "ALTER TABLE \"{table}\" ADD COLUMN fingerprint_at INTEGER NULL"
            ))?;
        }
        conn.execute_batch("COMMIT")
    })();
    if result.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    Ok(result?)
}

/// The row of `id` as seen at `now`.
fn state(conn: &Connection, sql: &Statements, id: &str, now: i64) -> rusqlite::Result<Lookup> {
    let row: Option<(Option<i64>, Option<String>)> = conn
        .prepare_cached(&sql.state)?
        .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(match row {
        Some((expires, fp)) if expires.is_none_or(|e| e > now) => Lookup::Seen {
            fingerprint: fp.as_deref().and_then(Fingerprint::parse),
        },
        _ => Lookup::Unseen,
    })
}

impl Inner {
    fn lookup(&self, id: &str) -> Result<Lookup, SqliteStoreError> {
        let now = now_ms();
        self.with_conn("lookup", id, |c| state(c, &self.ext, id, now))
    }

    fn remember_fingerprint(
        &self,
        id: &str,
        fp: &Fingerprint,
        ttl: Option<Duration>,
    ) -> Result<(), SqliteStoreError> {
        let now = now_ms();
        let expires = ttl.or(self.ttl).map(|t| deadline(now, t));
        let fp = fp.to_string();
        self.with_conn("remember_fingerprint", id, |c| {
            c.prepare_cached(&self.ext.claim)?
                .execute(params![id, now, expires, fp])
        })
        .map(|_| ())
    }

    pub(crate) fn purge_batch(&self, limit: usize) -> Result<usize, SqliteStoreError> {
        let now = now_ms();
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        // No id here: "" passes the id rule.
        self.with_conn("purge", "", |c| {
            c.prepare_cached(&self.ext.purge_batch)?
                .execute(params![now, limit])
        })
    }

    fn run<R, F>(
        &self,
        key: Option<&str>,
        ttl: Option<Duration>,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<TxEnd, Failure<R::Error>>
    where
        F: FnOnce(&Transaction<'_>) -> R,
        R: HandlerResult,
    {
        let mut conn = self.acquire();
        // Every store call goes through `txn::store_call_sync`: its failure is the
        // store's (busy past the timeout, disk), not the message's.
        let tx = txn::store_call_sync(key, || {
            conn.transaction_with_behavior(TransactionBehavior::Immediate)
        })
        .map_err(Failure::store)?;
        let now = now_ms();
        if let Some(key) = key {
            let found = txn::store_call_sync(Some(key), || {
                let found = state(&tx, &self.ext, key, now)?;
                if found == Lookup::Unseen {
                    let expires = ttl.or(self.ttl).map(|t| deadline(now, t));
                    let fp = fingerprint.map(|f| f.to_string());
                    tx.prepare_cached(&self.ext.claim)?
                        .execute(params![key, now, expires, fp])?;
                }
                Ok::<_, rusqlite::Error>(found)
            })
            .map_err(Failure::store)?;
            if let Lookup::Seen { fingerprint: found } = found {
                drop(tx); // rolls back: nothing was written
                if let Some(received) = fingerprint
                    && let Err(m) =
                        fingerprint::check(key, Lookup::Seen { fingerprint: found }, &received)
                {
                    return Ok(TxEnd::Mismatch(m));
                }
                return Ok(TxEnd::Done(txn::report_skipped(key)));
            }
        }
        match handler(&tx).into_result() {
            Ok(()) => {
                txn::store_call_sync(key, || tx.commit()).map_err(Failure::store)?;
                let outcome = if key.is_some() {
                    Outcome::Ran
                } else {
                    Outcome::RanWithoutKey
                };
                Ok(TxEnd::Done(txn::report(outcome)))
            }
            // Dropping the transaction rolls back the handler's writes and the row.
            Err(e) => Err(Failure::Handler(e)),
        }
    }
}

enum TxEnd {
    Done(Outcome),
    Mismatch(PayloadMismatch),
}

enum Failure<E> {
    Store(SqliteStoreError),
    Handler(E),
}

impl<E> Failure<E> {
    fn store(e: impl Into<SqliteStoreError>) -> Self {
        Failure::Store(e.into())
    }

    fn into_error(self) -> E
    where
        SqliteStoreError: IntoHandlerError<E>,
    {
        match self {
            Failure::Store(e) => e.into_handler_error(),
            Failure::Handler(e) => e,
        }
    }
}

impl SqliteStore {
    /// Runs `handler` at most once per `key`, **in one transaction with the id's row**
    /// (blocking): the handler's writes through the [`Transaction`] it receives and the
    /// row commit together, or neither does. Pass `&envelope` to key on `meta.id`.
    ///
    /// 1. `BEGIN IMMEDIATE`: the transaction takes the file's write lock first, so
    ///    deliveries of one id (threads or processes) run one after the other;
    /// 2. a live row for the key → roll back, skip ([`Outcome::Skipped`]);
    /// 3. otherwise insert the row (or take an expired one over), run the handler with
    ///    the transaction; `Ok` → `COMMIT`; `Err` → roll back, the error is returned and
    ///    the id stays unmarked.
    ///
    /// A process that dies before the commit leaves nothing behind (SQLite ignores an
    /// uncommitted write-ahead log tail). No usable key → the handler runs in a
    /// transaction without a row. The write lock is held for the whole handler: every
    /// other writer of the file waits (up to the busy timeout), so keep the handler's
    /// work to its database writes.
    ///
    /// ```
    /// use babelqueue_core::{Envelope, Outcome};
    /// use babelqueue_sqlite::{SqliteStore, SqliteStoreError};
    ///
    /// let path = std::env::temp_dir().join(format!("bq-doc-txn-{}.db", std::process::id()));
    /// let store = SqliteStore::open(&path)?;
    /// store.with_connection(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS ledger (payment_id TEXT, amount INTEGER)"))?;
    /// let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"payment_id": "pay_7f3a", "amount": 4200}))?;
    /// for _ in 0..2 {
    ///     store.transaction(&env, |tx| -> Result<(), SqliteStoreError> {
    ///         tx.execute("INSERT INTO ledger VALUES (?1, ?2)", ("pay_7f3a", 4200))?;
    ///         Ok(())
    ///     })?;
    /// }
    /// let rows: i64 = store.with_connection(|c| c.query_row("SELECT count(*) FROM ledger", [], |r| r.get(0)))?;
    /// assert_eq!(rows, 1);
    /// # drop(store);
    /// # for ext in ["", "-wal", "-shm"] { let _ = std::fs::remove_file(format!("{}{ext}", path.display())); }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn transaction<K, F, R>(&self, key: K, handler: F) -> Result<Outcome, R::Error>
    where
        K: DedupeKey,
        F: FnOnce(&Transaction<'_>) -> R,
        R: HandlerResult,
        SqliteStoreError: IntoHandlerError<R::Error>,
    {
        self.transaction_with(key, None, handler)
    }

    /// [`transaction`](Self::transaction) with a TTL for the id's row (`None`: the
    /// store's retention).
    pub fn transaction_with<K, F, R>(
        &self,
        key: K,
        ttl: Option<Duration>,
        handler: F,
    ) -> Result<Outcome, R::Error>
    where
        K: DedupeKey,
        F: FnOnce(&Transaction<'_>) -> R,
        R: HandlerResult,
        SqliteStoreError: IntoHandlerError<R::Error>,
    {
        let key = key.dedupe_key();
        match self.inner.run(key.as_deref(), ttl, None, handler) {
            Ok(TxEnd::Done(outcome)) => Ok(outcome),
            Ok(TxEnd::Mismatch(_)) => unreachable!("no fingerprint was given"),
            Err(f) => Err(f.into_error()),
        }
    }

    /// [`transaction_with`](Self::transaction_with) that also stores `fingerprint` in the
    /// id's row: a duplicate whose row holds a different fingerprint returns
    /// [`PayloadMismatch`] (converted into the handler's error) instead of being skipped.
    pub fn transaction_fingerprint<K, F, R>(
        &self,
        key: K,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        handler: F,
    ) -> Result<Outcome, R::Error>
    where
        K: DedupeKey,
        F: FnOnce(&Transaction<'_>) -> R,
        R: HandlerResult,
        SqliteStoreError: IntoHandlerError<R::Error>,
        R::Error: From<PayloadMismatch>,
    {
        let key = key.dedupe_key();
        match self
            .inner
            .run(key.as_deref(), ttl, Some(fingerprint), handler)
        {
            Ok(TxEnd::Done(outcome)) => Ok(outcome),
            Ok(TxEnd::Mismatch(m)) => Err(m.into()),
            Err(f) => Err(f.into_error()),
        }
    }

    /// [`transaction_with`](Self::transaction_with) for async code: the whole
    /// transaction (handler included) runs on tokio's blocking pool, so no worker thread
    /// waits on the file lock. The key is computed before.
    pub async fn transaction_async<K, F, R>(
        &self,
        key: K,
        ttl: Option<Duration>,
        handler: F,
    ) -> Result<Outcome, R::Error>
    where
        K: DedupeKey,
        F: FnOnce(&Transaction<'_>) -> R + Send + 'static,
        R: HandlerResult + Send + 'static,
        R::Error: Send + 'static,
        SqliteStoreError: IntoHandlerError<R::Error>,
    {
        match self.spawn_run(key, ttl, None, handler).await? {
            TxEnd::Done(outcome) => Ok(outcome),
            TxEnd::Mismatch(_) => unreachable!("no fingerprint was given"),
        }
    }

    /// [`transaction_async`](Self::transaction_async) storing and checking a payload
    /// fingerprint, as [`transaction_fingerprint`](Self::transaction_fingerprint) does.
    pub async fn transaction_async_fingerprint<K, F, R>(
        &self,
        key: K,
        fingerprint: Fingerprint,
        ttl: Option<Duration>,
        handler: F,
    ) -> Result<Outcome, R::Error>
    where
        K: DedupeKey,
        F: FnOnce(&Transaction<'_>) -> R + Send + 'static,
        R: HandlerResult + Send + 'static,
        R::Error: Send + 'static + From<PayloadMismatch>,
        SqliteStoreError: IntoHandlerError<R::Error>,
    {
        match self.spawn_run(key, ttl, Some(fingerprint), handler).await? {
            TxEnd::Done(outcome) => Ok(outcome),
            TxEnd::Mismatch(m) => Err(m.into()),
        }
    }

    async fn spawn_run<K, F, R>(
        &self,
        key: K,
        ttl: Option<Duration>,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<TxEnd, R::Error>
    where
        K: DedupeKey,
        F: FnOnce(&Transaction<'_>) -> R + Send + 'static,
        R: HandlerResult + Send + 'static,
        R::Error: Send + 'static,
        SqliteStoreError: IntoHandlerError<R::Error>,
    {
        let key = key.dedupe_key().map(std::borrow::Cow::into_owned);
        let inner = std::sync::Arc::clone(&self.inner);
        let joined = tokio::task::spawn_blocking(move || {
            inner.run(key.as_deref(), ttl, fingerprint, handler)
        })
        .await;
        match joined {
            // The outcome was recorded on the blocking thread; record it again here, in
            // the caller's task, for `capture_outcome`.
            Ok(Ok(TxEnd::Done(outcome))) => Ok(TxEnd::Done(txn::report(outcome))),
            Ok(Ok(mismatch)) => Ok(mismatch),
            Ok(Err(f)) => Err(f.into_error()),
            Err(e) => Err(SqliteStoreError::Task(e.to_string()).into_handler_error()),
        }
    }

    /// Runs `f` with one of the store's connections (blocking): to create the tables your
    /// transactional handlers write, or to read them.
    pub fn with_connection<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, SqliteStoreError> {
        self.inner.with_conn("with_connection", "", f)
    }
}

/// The uniform entry point of generated code (`#[idempotent(transactional)]`); see
/// [`SqliteStore::transaction`] for the behaviour.
impl babelqueue_core::txn::TransactionalStore for SqliteStore {
    type Error = SqliteStoreError;
    type Tx<'c> = Transaction<'c>;

    fn transaction_guard<F, R>(
        &self,
        key: Option<&str>,
        ttl: Option<Duration>,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<Result<Outcome, PayloadMismatch>, R::Error>
    where
        F: FnOnce(&Transaction<'_>) -> R,
        R: HandlerResult,
        SqliteStoreError: IntoHandlerError<R::Error>,
    {
        match self.inner.run(key, ttl, fingerprint, handler) {
            Ok(TxEnd::Done(outcome)) => Ok(Ok(outcome)),
            Ok(TxEnd::Mismatch(m)) => Ok(Err(m)),
            Err(f) => Err(f.into_error()),
        }
    }
}

/// Fingerprints (opt-in): the row's nullable `fingerprint` column holds `sha256:<hex>`.
impl FingerprintStore for SqliteStore {
    fn lookup(&self, id: &str) -> Result<Lookup, SqliteStoreError> {
        self.inner.lookup(id)
    }

    fn remember_fingerprint(
        &self,
        id: &str,
        fingerprint: &Fingerprint,
        ttl: Option<Duration>,
    ) -> Result<(), SqliteStoreError> {
        self.inner.remember_fingerprint(id, fingerprint, ttl)
    }
}

impl AsyncFingerprintStore for SqliteStore {
    fn lookup(&self, id: &str) -> impl Future<Output = Result<Lookup, SqliteStoreError>> + Send {
        let id = id.to_owned();
        self.blocking(move |s| s.lookup(&id))
    }

    fn remember_fingerprint(
        &self,
        id: &str,
        fingerprint: &Fingerprint,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<(), SqliteStoreError>> + Send {
        let (id, fp) = (id.to_owned(), *fingerprint);
        self.blocking(move |s| s.remember_fingerprint(&id, &fp, ttl))
    }
}
