//! # babelqueue-sqlite
//!
//! The embedded persistent backend of BabelQueue for Rust: [`SqliteStore`], a seen-set in
//! one SQLite file (bundled SQLite, no server) for a single machine. Unlike the
//! in-memory store it survives a restart; it is safe from many threads and from several
//! processes sharing the file (WAL mode, a busy timeout, and every write a single
//! statement or an `IMMEDIATE` transaction). It implements the blocking [`Store`] and
//! [`LeaseStore`] and, by moving each call onto tokio's blocking pool, [`AsyncStore`] and
//! [`AsyncLeaseStore`], so an async handler never blocks a worker thread on disk.
//!
//! ```
//! use babelqueue_core::{Guard, Store};
//! use babelqueue_sqlite::SqliteStore;
//!
//! let dir = std::env::temp_dir().join(format!("bq-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("dedupe.db");
//!
//! let store = SqliteStore::open(&path)?;
//! let mut charged = 0;
//! for _ in 0..2 {
//!     Guard::new(&store).run("pay_7f3a", || -> Result<(), babelqueue_sqlite::SqliteStoreError> {
//!         charged += 1;
//!         Ok(())
//!     })?;
//! }
//! assert_eq!(charged, 1);
//! drop(store);
//!
//! // A restart: a new store on the same file still knows the id.
//! let store = SqliteStore::open(&path)?;
//! assert!(store.seen("pay_7f3a")?);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use babelqueue_core::key::{UnstorableId, id_is_storable};
use babelqueue_core::store_error::{StoreUnavailable, UnavailableKind};
use babelqueue_core::{
    AsyncLeaseStore, AsyncStore, LeaseStore, Store, lease::Claim, lease::LeaseToken,
    retention::DEFAULT_RETENTION,
};
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

mod outbox;
mod purge;
mod txn;

pub use outbox::{DEFAULT_OUTBOX_TABLE, OUTBOX_DDL, SqliteOutbox};
pub use purge::{DEFAULT_PURGE_BATCH, PurgeReport, Purger};

/// The default table name (the PostgreSQL table's name).
pub const DEFAULT_TABLE: &str = "babelqueue_idempotency";

/// The DDL shipped in `sql/babelqueue_idempotency.sql`, written for [`DEFAULT_TABLE`].
pub const DDL: &str = include_str!("../sql/babelqueue_idempotency.sql");

/// Default number of pooled connections (see [`SqliteStoreBuilder::connections`]).
///
/// Chosen by measurement (`cargo bench --bench stores`, 4 threads doing `seen` +
/// `remember` on a 2-core machine, two interleaved rounds): 1 connection 5.2k / 4.4k
/// messages/s, 2: 7.9k / 6.8k, 4: 9.3k / 6.9k, 8: 8.7k / 5.3k. Serialising writes on an
/// in-process mutex in front of SQLite's own lock measured slower (4.8k / 3.5k with 4
/// connections), so writers simply wait in SQLite's busy handler.
pub const DEFAULT_CONNECTIONS: usize = 4;

/// Default busy timeout: how long a statement waits for another connection or process
/// holding the write lock.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// What can go wrong with the SQLite store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteStoreError {
    /// Opening the file or a statement failed (including `SQLITE_BUSY` after the busy
    /// timeout).
    #[error("sqlite store: SQLite call failed")]
    Sqlite(#[from] rusqlite::Error),
    /// The table name is not a plain SQL identifier.
    #[error(
        "sqlite store: invalid table name {name:?}: {reason} (allowed: [A-Za-z_][A-Za-z0-9_]*, at most 63 bytes)"
    )]
    InvalidTableName {
        /// The rejected name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The blocking task running the call panicked or was cancelled.
    #[error("sqlite store: blocking task failed: {0}")]
    Task(String),
    /// The file stayed locked by another connection or process past the busy timeout
    /// (`SQLITE_BUSY` / `SQLITE_LOCKED`): not the message's fault. Also found by
    /// [`babelqueue_core::store_error::find_unavailable`].
    #[error("sqlite store unavailable")]
    Unavailable(#[from] StoreUnavailable),
    /// The id breaks the rule every store applies ([`id_is_storable`]): refused before
    /// any I/O.
    #[error("sqlite store: unusable id")]
    UnstorableId(#[from] UnstorableId),
}

impl SqliteStoreError {
    /// Whether the store was unavailable (locked past the busy timeout).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, SqliteStoreError::Unavailable(_))
    }

    /// Whether a call timed out waiting for a lock (the busy timeout).
    pub fn is_timeout(&self) -> bool {
        matches!(self, SqliteStoreError::Unavailable(u) if u.is_timeout())
    }
}

/// `SQLITE_BUSY` / `SQLITE_LOCKED` after the busy timeout is [`StoreUnavailable`];
/// anything else stays [`SqliteStoreError::Sqlite`].
fn sqlite_error(operation: &'static str, e: rusqlite::Error) -> SqliteStoreError {
    if is_busy(&e) {
        StoreUnavailable::with_source("sqlite", operation, UnavailableKind::Timeout, e).into()
    } else {
        SqliteStoreError::Sqlite(e)
    }
}

babelqueue_core::handler_error_from!(SqliteStoreError);

/// The `rusqlite` crate this backend is built on (to inspect the file yourself).
pub use rusqlite;

fn validate_table(name: &str) -> Result<String, SqliteStoreError> {
    let bad = |reason| SqliteStoreError::InvalidTableName {
        name: name.to_owned(),
        reason,
    };
    let mut chars = name.chars();
    match chars.next() {
        None => return Err(bad("empty")),
        Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
            return Err(bad("must start with a letter or `_`"));
        }
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(bad("only ASCII letters, digits and `_` are allowed"));
    }
    if name.len() > 63 {
        return Err(bad("at most 63 bytes"));
    }
    if name.to_ascii_lowercase().starts_with("sqlite_") {
        return Err(bad("names starting with `sqlite_` are reserved by SQLite"));
    }
    Ok(name.to_owned())
}

/// The shipped DDL with the table and index identifiers replaced (whole tokens only).
fn render_ddl(table: &str) -> String {
    let index = format!("{DEFAULT_TABLE}_expires_at_idx");
    let fence = format!("{DEFAULT_TABLE}_fence");
    babelqueue_core::sql::rename_identifiers(DDL, |word| {
        if word == DEFAULT_TABLE {
            Some(format!("\"{table}\""))
        } else if word == index {
            Some(format!("\"{table}_expires_at_idx\""))
        } else if word == fence {
            Some(format!("\"{table}_fence\""))
        } else {
            None
        }
    })
}

#[derive(Debug)]
struct Statements {
    seen: String,
    remember: String,
    forget: String,
    select_state: String,
    take: String,
    complete: String,
    release: String,
    renew: String,
    next_fence: String,
    purge: String,
}

impl Statements {
    fn new(table: &str) -> Self {
        let t = format!("\"{table}\"");
        Statements {
            // ?2 = now (ms)
            seen: format!(
                "SELECT EXISTS (SELECT 1 FROM {t} WHERE message_id = ?1 \
                 AND (expires_at IS NULL OR expires_at > ?2))"
            ),
            // ?2 = now, ?3 = expires_at or NULL. Inserts, or takes over an expired row.
            remember: format!(
                "INSERT INTO {t} (message_id, created_at, expires_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (message_id) DO UPDATE \
                 SET created_at = excluded.created_at, expires_at = excluded.expires_at, \
                     lease_token = NULL, lease_expires_at = NULL \
                 WHERE {t}.expires_at IS NOT NULL AND {t}.expires_at <= ?2"
            ),
            forget: format!("DELETE FROM {t} WHERE message_id = ?1"),
            select_state: format!("SELECT expires_at, lease_token FROM {t} WHERE message_id = ?1"),
            // ?2 = now, ?3 = lease deadline, ?4 = token.
            take: format!(
                "INSERT INTO {t} (message_id, created_at, expires_at, lease_token, lease_expires_at) \
                 VALUES (?1, ?2, ?3, ?4, ?3) \
                 ON CONFLICT (message_id) DO UPDATE \
                 SET created_at = excluded.created_at, expires_at = excluded.expires_at, \
                     lease_token = excluded.lease_token, lease_expires_at = excluded.lease_expires_at"
            ),
            // ?2 = token, ?3 = now, ?4 = expires_at or NULL.
            complete: format!(
                "UPDATE {t} SET created_at = ?3, expires_at = ?4, lease_token = NULL, \
                 lease_expires_at = NULL \
                 WHERE message_id = ?1 AND lease_token = ?2 AND expires_at > ?3"
            ),
            release: format!(
                "DELETE FROM {t} WHERE message_id = ?1 AND lease_token = ?2 AND expires_at > ?3"
            ),
            // ?2 = token, ?3 = now, ?4 = the new lease deadline.
            renew: format!(
                "UPDATE {t} SET expires_at = ?4, lease_expires_at = ?4 \
                 WHERE message_id = ?1 AND lease_token = ?2 AND expires_at > ?3"
            ),
            next_fence: format!(
                "INSERT INTO \"{table}_fence\" (id, value) VALUES (1, 1) \
                 ON CONFLICT (id) DO UPDATE SET value = value + 1 RETURNING value"
            ),
            purge: format!("DELETE FROM {t} WHERE expires_at IS NOT NULL AND expires_at <= ?1"),
        }
    }
}

struct Inner {
    conns: Box<[Mutex<Connection>]>,
    next: AtomicUsize,
    sql: Statements,
    /// Statements of transactional mode, fingerprints and batched purges.
    ext: txn::Statements,
    table: String,
    path: PathBuf,
    ttl: Option<Duration>,
}

/// The embedded persistent seen-set: one SQLite file, WAL mode, a small pool of
/// connections. Cheap to clone (clones share the pool).
///
/// * `seen` = a live row (`expires_at IS NULL OR expires_at > now`), `remember` =
///   `INSERT … ON CONFLICT DO UPDATE … WHERE <expired>` (the PostgreSQL claim), `forget` =
///   `DELETE`, TTL via `expires_at` (Unix ms), [`purge_expired`](Self::purge_expired) for
///   housekeeping.
/// * lease mode: an in-flight row carries `lease_token` and `expires_at` = the lease
///   deadline (so `seen` is true while it is held, as on Redis and PostgreSQL); `claim`
///   runs in an `IMMEDIATE` transaction, `complete` / `release` are conditional on the
///   token.
/// * Concurrency: every connection has a busy timeout (default 5 s); writes are single
///   statements or `IMMEDIATE` transactions, so two threads or two processes never
///   deadlock on a lock upgrade. A call takes a free pooled connection (default
///   [`DEFAULT_CONNECTIONS`]) so readers run in parallel under WAL.
/// * Durability: `synchronous = NORMAL` by default (a committed id survives a process
///   crash; a power loss may drop the last few, which then run again: the usual
///   at-least-once window); [`SqliteStoreBuilder::synchronous_full`] for `FULL`.
///
/// ```
/// use std::time::Duration;
/// use babelqueue_core::Store;
/// use babelqueue_sqlite::SqliteStore;
///
/// let path = std::env::temp_dir().join(format!("bq-doc-b-{}.db", std::process::id()));
/// let store = SqliteStore::builder(&path)
///     .table("payments_dedupe")
///     .ttl(Duration::from_secs(7 * 24 * 3600))
///     .open()?;
/// assert!(store.claim("id-A", None)?);
/// assert!(!store.claim("id-A", None)?);
/// assert!(store.seen("id-A")?);
/// # drop(store);
/// # for ext in ["", "-wal", "-shm"] { let _ = std::fs::remove_file(format!("{}{ext}", path.display())); }
/// # Ok::<(), babelqueue_sqlite::SqliteStoreError>(())
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("table", &self.inner.table)
            .field("connections", &self.inner.conns.len())
            .field("ttl", &self.inner.ttl)
            .finish()
    }
}

/// Builds a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    table: String,
    ttl: Option<Duration>,
    connections: usize,
    busy_timeout: Duration,
    synchronous_full: bool,
}

impl SqliteStoreBuilder {
    /// The table name (default `babelqueue_idempotency`), a plain identifier. Several
    /// tables in one file are independent stores.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How long a remembered id stays seen (default [`DEFAULT_RETENTION`], 7 days).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Remembered ids never expire (`expires_at` NULL).
    #[must_use]
    pub fn keep_forever(mut self) -> Self {
        self.ttl = None;
        self
    }

    /// How many connections the store pools (default [`DEFAULT_CONNECTIONS`], at least
    /// 1). More lets reads run in parallel; writes are serialised by SQLite anyway.
    #[must_use]
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n.max(1);
        self
    }

    /// How long a statement waits for the write lock held by another connection or
    /// process before failing with `SQLITE_BUSY` (default 5 s).
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// `PRAGMA synchronous = FULL` instead of `NORMAL`: every commit is fsynced, so a
    /// remembered id survives a power loss too, at the cost of slower writes.
    #[must_use]
    pub fn synchronous_full(mut self, full: bool) -> Self {
        self.synchronous_full = full;
        self
    }

    /// Opens (creating if needed) the file and the table.
    pub fn open(self) -> Result<SqliteStore, SqliteStoreError> {
        let table = validate_table(&self.table)?;
        let mut conns = Vec::with_capacity(self.connections);
        for i in 0..self.connections {
            let conn = open_connection(&self.path, self.busy_timeout, self.synchronous_full)?;
            if i == 0 {
                conn.execute_batch(&format!("BEGIN IMMEDIATE; {} COMMIT;", render_ddl(&table)))
                    .inspect_err(|_| {
                        let _ = conn.execute_batch("ROLLBACK");
                    })?;
                txn::add_missing_columns(&conn, &table)?;
            }
            conns.push(Mutex::new(conn));
        }
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                conns: conns.into_boxed_slice(),
                next: AtomicUsize::new(0),
                sql: Statements::new(&table),
                ext: txn::Statements::new(&table),
                table,
                path: self.path,
                ttl: self.ttl,
            }),
        })
    }
}

fn open_connection(
    path: &Path,
    busy_timeout: Duration,
    synchronous_full: bool,
) -> Result<Connection, SqliteStoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )?;
    conn.busy_timeout(busy_timeout)?;
    // Switching to WAL needs a moment of exclusive access: when another process is
    // opening the same new file at the same time, wait for it like any other lock.
    let deadline = std::time::Instant::now() + busy_timeout;
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)) {
            Ok(mode) => {
                if !mode.eq_ignore_ascii_case("wal") {
                    tracing::warn!(%mode, path = %path.display(), "SQLite refused WAL mode");
                }
                break;
            }
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
    conn.pragma_update(
        None,
        "synchronous",
        if synchronous_full { "FULL" } else { "NORMAL" },
    )?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn deadline(now: i64, d: Duration) -> i64 {
    now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic while holding a connection cannot leave a transaction open (rusqlite
    // rolls back on drop), so a poisoned connection is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// A pooled connection: a free one if any, else waits for one.
    fn acquire(&self) -> MutexGuard<'_, Connection> {
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        for i in 0..n {
            match self.conns[(start + i) % n].try_lock() {
                Ok(c) => return c,
                Err(TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        lock(&self.conns[start])
    }

    /// Runs `f` on a free pooled connection, after checking `id` against the id rule.
    fn with_conn<T>(
        &self,
        operation: &'static str,
        id: &str,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, SqliteStoreError> {
        id_is_storable(id)?;
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let result = 'found: {
            for i in 0..n {
                match self.conns[(start + i) % n].try_lock() {
                    Ok(mut c) => break 'found f(&mut c),
                    Err(TryLockError::Poisoned(p)) => break 'found f(&mut p.into_inner()),
                    Err(TryLockError::WouldBlock) => {}
                }
            }
            f(&mut lock(&self.conns[start]))
        };
        result.map_err(|e| sqlite_error(operation, e))
    }

    fn seen(&self, id: &str) -> Result<bool, SqliteStoreError> {
        let now = now_ms();
        self.with_conn("seen", id, |c| {
            c.prepare_cached(&self.sql.seen)?
                .query_row(params![id, now], |r| r.get(0))
        })
    }

    fn claim_once(&self, id: &str, ttl: Option<Duration>) -> Result<bool, SqliteStoreError> {
        let now = now_ms();
        let expires = ttl.or(self.ttl).map(|t| deadline(now, t));
        self.with_conn("remember", id, |c| {
            Ok(c.prepare_cached(&self.sql.remember)?
                .execute(params![id, now, expires])?
                == 1)
        })
    }

    fn forget(&self, id: &str) -> Result<(), SqliteStoreError> {
        self.with_conn("forget", id, |c| {
            c.prepare_cached(&self.sql.forget)?.execute(params![id])
        })
        .map(|_| ())
    }

    fn purge_expired(&self) -> Result<usize, SqliteStoreError> {
        let now = now_ms();
        self.with_conn("purge", "", |c| {
            c.prepare_cached(&self.sql.purge)?.execute(params![now])
        })
    }

    fn lease_claim(&self, id: &str, lease: Duration) -> Result<Claim, SqliteStoreError> {
        let now = now_ms();
        let until = deadline(now, lease);
        self.with_conn("claim", id, |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let state: Option<(Option<i64>, Option<String>)> = tx
                .prepare_cached(&self.sql.select_state)?
                .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if let Some((expires, token)) = state
                && expires.is_none_or(|e| e > now)
            {
                // Nothing written: dropping the transaction rolls it back.
                return Ok(if token.is_some() {
                    Claim::InFlight
                } else {
                    Claim::Completed
                });
            }
            let fence: i64 = tx
                .prepare_cached(&self.sql.next_fence)?
                .query_row([], |r| r.get(0))?;
            let token = LeaseToken::new().with_fence(fence.unsigned_abs());
            tx.prepare_cached(&self.sql.take)?
                .execute(params![id, now, until, token.as_str()])?;
            tx.commit()?;
            Ok(Claim::Acquired(token))
        })
    }

    fn lease_complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Result<bool, SqliteStoreError> {
        let now = now_ms();
        let expires = ttl.or(self.ttl).map(|t| deadline(now, t));
        self.with_conn("complete", id, |c| {
            Ok(c.prepare_cached(&self.sql.complete)?.execute(params![
                id,
                token.as_str(),
                now,
                expires
            ])? == 1)
        })
    }

    fn lease_renew(
        &self,
        id: &str,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<bool, SqliteStoreError> {
        let now = now_ms();
        let until = deadline(now, lease);
        self.with_conn("renew", id, |c| {
            Ok(c.prepare_cached(&self.sql.renew)?.execute(params![
                id,
                token.as_str(),
                now,
                until
            ])? == 1)
        })
    }

    fn lease_release(&self, id: &str, token: &LeaseToken) -> Result<bool, SqliteStoreError> {
        let now = now_ms();
        self.with_conn("release", id, |c| {
            Ok(c.prepare_cached(&self.sql.release)?
                .execute(params![id, token.as_str(), now])?
                == 1)
        })
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path` with the default table, the
    /// default retention ([`DEFAULT_RETENTION`], 7 days) and [`DEFAULT_CONNECTIONS`]
    /// connections.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SqliteStoreError> {
        Self::builder(path).open()
    }

    /// A builder for a store at `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.as_ref().to_path_buf(),
            table: DEFAULT_TABLE.to_owned(),
            ttl: Some(DEFAULT_RETENTION),
            connections: DEFAULT_CONNECTIONS,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            synchronous_full: false,
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The default TTL of remembered ids.
    pub fn ttl(&self) -> Option<Duration> {
        self.inner.ttl
    }

    /// Remembers `id` (`ttl` `None` = the store default) and returns whether this call
    /// wrote it: `true` for exactly one of any number of concurrent callers (threads or
    /// processes), `false` when a live row (remembered or in flight) exists. Blocking.
    pub fn claim(&self, id: &str, ttl: Option<Duration>) -> Result<bool, SqliteStoreError> {
        self.inner.claim_once(id, ttl)
    }

    /// [`claim`](Self::claim) on tokio's blocking pool.
    pub async fn claim_async(
        &self,
        id: &str,
        ttl: Option<Duration>,
    ) -> Result<bool, SqliteStoreError> {
        let id = id.to_owned();
        self.blocking(move |s| s.claim_once(&id, ttl)).await
    }

    /// Deletes every expired row (remembered ids past their TTL, abandoned leases) and
    /// returns how many. Blocking.
    pub fn purge_expired(&self) -> Result<usize, SqliteStoreError> {
        self.inner.purge_expired()
    }

    /// Runs `f` on tokio's blocking pool when a tokio runtime is present, inline
    /// otherwise.
    fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, SqliteStoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, SqliteStoreError>> + Send + 'static {
        let inner = Arc::clone(&self.inner);
        async move {
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle
                    .spawn_blocking(move || f(&inner))
                    .await
                    .map_err(|e| SqliteStoreError::Task(e.to_string()))?,
                Err(_) => f(&inner),
            }
        }
    }
}

impl Store for SqliteStore {
    type Error = SqliteStoreError;

    fn seen(&self, id: &str) -> Result<bool, SqliteStoreError> {
        self.inner.seen(id)
    }

    fn remember(&self, id: &str) -> Result<(), SqliteStoreError> {
        self.inner.claim_once(id, None).map(|_| ())
    }

    fn remember_for(&self, id: &str, ttl: Option<Duration>) -> Result<(), SqliteStoreError> {
        self.inner.claim_once(id, ttl).map(|_| ())
    }

    fn forget(&self, id: &str) -> Result<(), SqliteStoreError> {
        self.inner.forget(id)
    }
}

impl AsyncStore for SqliteStore {
    type Error = SqliteStoreError;

    fn seen(&self, id: &str) -> impl Future<Output = Result<bool, SqliteStoreError>> + Send {
        let id = id.to_owned();
        self.blocking(move |s| s.seen(&id))
    }

    fn remember(&self, id: &str) -> impl Future<Output = Result<(), SqliteStoreError>> + Send {
        AsyncStore::remember_for(self, id, None)
    }

    fn remember_for(
        &self,
        id: &str,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<(), SqliteStoreError>> + Send {
        let id = id.to_owned();
        self.blocking(move |s| s.claim_once(&id, ttl).map(|_| ()))
    }

    fn forget(&self, id: &str) -> impl Future<Output = Result<(), SqliteStoreError>> + Send {
        let id = id.to_owned();
        self.blocking(move |s| s.forget(&id))
    }
}

impl LeaseStore for SqliteStore {
    fn claim(&self, id: &str, lease: Duration) -> Result<Claim, SqliteStoreError> {
        self.inner.lease_claim(id, lease)
    }

    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Result<bool, SqliteStoreError> {
        self.inner.lease_complete(id, token, ttl)
    }

    fn release(&self, id: &str, token: &LeaseToken) -> Result<bool, SqliteStoreError> {
        self.inner.lease_release(id, token)
    }

    fn renew(
        &self,
        id: &str,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<bool, SqliteStoreError> {
        self.inner.lease_renew(id, token, lease)
    }
}

impl AsyncLeaseStore for SqliteStore {
    fn claim(
        &self,
        id: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, SqliteStoreError>> + Send {
        let id = id.to_owned();
        self.blocking(move |s| s.lease_claim(&id, lease))
    }

    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<bool, SqliteStoreError>> + Send {
        let (id, token) = (id.to_owned(), token.clone());
        self.blocking(move |s| s.lease_complete(&id, &token, ttl))
    }

    fn release(
        &self,
        id: &str,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool, SqliteStoreError>> + Send {
        let (id, token) = (id.to_owned(), token.clone());
        self.blocking(move |s| s.lease_release(&id, &token))
    }

    fn renew(
        &self,
        id: &str,
        token: &LeaseToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, SqliteStoreError>> + Send {
        let (id, token) = (id.to_owned(), token.clone());
        self.blocking(move |s| s.lease_renew(&id, &token, lease))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_validated() {
        for bad in ["", "1a", "a-b", "a b", "a\"b", "a.b", "sqlite_master", "é"] {
            assert!(
                SqliteStore::builder("unused.db").table(bad).open().is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(validate_table("Bq_1").unwrap(), "Bq_1");
    }

    #[test]
    fn ddl_substitutes_whole_identifiers() {
        let ddl = render_ddl("t1");
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS \"t1\" ("));
        assert!(ddl.contains("CREATE INDEX IF NOT EXISTS \"t1_expires_at_idx\""));
        assert!(!ddl.contains(DEFAULT_TABLE));
    }

    #[test]
    fn bad_path_is_an_error() {
        let err = SqliteStore::open("/nonexistent-dir-bq/x/y.db").unwrap_err();
        assert!(matches!(err, SqliteStoreError::Sqlite(_)), "{err:?}");
    }
}
