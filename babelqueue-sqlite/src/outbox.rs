//! The transactional outbox on SQLite (ADR-0029): [`SqliteOutbox`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babelqueue_core::Envelope;
use babelqueue_runtime::handler::BoxFuture;
use babelqueue_runtime::outbox::{OutboxError, OutboxRecord, OutboxStore};
use rusqlite::{Connection, Transaction, TransactionBehavior, params};

use crate::{SqliteStoreError, deadline, now_ms, open_connection, validate_table};

/// The default outbox table name.
pub const DEFAULT_OUTBOX_TABLE: &str = "babelqueue_outbox";

/// The DDL shipped in `sql/babelqueue_outbox.sql`, written for [`DEFAULT_OUTBOX_TABLE`].
pub const OUTBOX_DDL: &str = include_str!("../sql/babelqueue_outbox.sql");

#[derive(Debug)]
struct Sql {
    ddl: String,
    insert: String,
    claim: String,
    published: String,
    failed: String,
    release: String,
    pending: String,
    purge: String,
}

impl Sql {
    fn new(table: &str) -> Self {
        let t = format!("\"{table}\"");
        let mut index = format!("{table}_unpublished_idx");
        index.truncate(63);
        let default_index = format!("{DEFAULT_OUTBOX_TABLE}_unpublished_idx");
        let ddl = babelqueue_core::sql::rename_identifiers(OUTBOX_DDL, |word| {
            if word == DEFAULT_OUTBOX_TABLE {
                Some(t.clone())
            } else if word == default_index {
                Some(format!("\"{index}\""))
            } else {
                None
            }
        });
        Sql {
            ddl,
            insert: format!(
                "INSERT INTO {t} (queue, payload, created_at, available_at) VALUES (?1, ?2, ?3, ?3)"
            ),
            // Run in an IMMEDIATE transaction: claimers are serialised by SQLite's write
            // lock, so two relays never claim one row.
            claim: format!(
                "UPDATE {t} SET claimed_until = ?3 \
                 WHERE id IN (SELECT id FROM {t} \
                   WHERE published_at IS NULL AND available_at <= ?1 \
                   AND (claimed_until IS NULL OR claimed_until <= ?1) \
                   ORDER BY id LIMIT ?2) \
                 RETURNING id, queue, payload, attempts"
            ),
            published: format!(
                "UPDATE {t} SET published_at = ?2, claimed_until = NULL WHERE id = ?1"
            ),
            failed: format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = ?2, claimed_until = NULL, \
                 available_at = ?3 WHERE id = ?1"
            ),
            release: format!(
                "UPDATE {t} SET claimed_until = NULL WHERE id = ?1 AND published_at IS NULL"
            ),
            pending: format!("SELECT count(*) FROM {t} WHERE published_at IS NULL"),
            purge: format!("DELETE FROM {t} WHERE published_at IS NOT NULL AND published_at < ?1"),
        }
    }
}

/// A transactional outbox in a SQLite table (layout: `sql/babelqueue_outbox.sql`).
///
/// - [`save`](Self::save) writes an envelope **in your `rusqlite::Transaction`** (on the
///   same database file), so it commits or rolls back with your business write; the table
///   must exist in that database ([`open`](Self::open) creates it, or call
///   [`migrate`](Self::migrate) on your connection).
/// - As an [`OutboxStore`] it serves
///   [`OutboxRelay`](babelqueue_runtime::outbox::OutboxRelay)s through a connection of its
///   own. The claim scheme: SQLite has no row locks, so a claim is one `UPDATE … SET
///   claimed_until = now + lease WHERE id IN (SELECT … ORDER BY id LIMIT n) RETURNING …`
///   inside a `BEGIN IMMEDIATE` transaction: the database's single write lock serialises
///   claimers (several relays, in one process or several, each take other rows), and a
///   crashed relay's rows are due again when its lease passes.
/// - New rows are noticed by polling (SQLite has no cross-connection notification); the
///   relay's [`poll_interval`](babelqueue_runtime::outbox::OutboxRelay::poll_interval).
///
/// ```
/// use std::sync::Arc;
/// use babelqueue_core::Envelope;
/// use babelqueue_runtime::outbox::OutboxRelay;
/// use babelqueue_runtime::InMemoryTransport;
/// use babelqueue_sqlite::SqliteOutbox;
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let dir = std::env::temp_dir().join(format!("bq-doc-outbox-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("shop.db");
/// let outbox = SqliteOutbox::open(&path)?;
///
/// let mut conn = rusqlite::Connection::open(&path)?;
/// conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")?;
/// let tx = conn.transaction()?;
/// tx.execute("INSERT INTO orders (id) VALUES (42)", [])?;
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({"order_id": 42}))?
///     .with_queue("orders");
/// outbox.save(&tx, &env)?;
/// tx.commit()?;
///
/// let transport = InMemoryTransport::new();
/// let relay = OutboxRelay::new(outbox, Arc::new(transport.clone()));
/// assert_eq!(relay.drain().await?.published, 1);
/// assert_eq!(transport.len("orders"), 1);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct SqliteOutbox {
    path: PathBuf,
    table: String,
    sql: Arc<Sql>,
    conn: Arc<Mutex<Connection>>,
    #[cfg(feature = "schema")]
    schemas: Option<Arc<babelqueue_core::schema::Schemas>>,
}

impl std::fmt::Debug for SqliteOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOutbox")
            .field("path", &self.path)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

fn store_err(op: &'static str) -> impl Fn(rusqlite::Error) -> OutboxError {
    move |e| OutboxError::store(op, e)
}

impl SqliteOutbox {
    /// Opens the database file at `path` (WAL mode, 5 s busy timeout) and creates the
    /// table [`DEFAULT_OUTBOX_TABLE`] if missing.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, OutboxError> {
        Self::open_table(path, DEFAULT_OUTBOX_TABLE)
    }

    /// Like [`open`](Self::open), with the table `table` (a plain identifier).
    pub fn open_table(path: impl AsRef<Path>, table: &str) -> Result<Self, OutboxError> {
        let table = validate_table(table).map_err(|e| OutboxError::store("open", e))?;
        let path = path.as_ref().to_path_buf();
        let conn = open_connection(&path, Duration::from_secs(5), false)
            .map_err(|e| OutboxError::store("open", e))?;
        let sql = Sql::new(&table);
        conn.execute_batch(&sql.ddl).map_err(store_err("migrate"))?;
        Ok(SqliteOutbox {
            path,
            table,
            sql: Arc::new(sql),
            conn: Arc::new(Mutex::new(conn)),
            #[cfg(feature = "schema")]
            schemas: None,
        })
    }

    /// Refuses to save an envelope whose data breaks its URN's schema
    /// ([`OutboxError::Schema`]).
    #[cfg(feature = "schema")]
    #[must_use]
    pub fn schemas(mut self, schemas: Arc<babelqueue_core::schema::Schemas>) -> Self {
        self.schemas = Some(schemas);
        self
    }

    /// Creates this outbox's table in the database of `conn` if missing (idempotent).
    pub fn migrate(&self, conn: &Connection) -> Result<(), OutboxError> {
        conn.execute_batch(&self.sql.ddl)
            .map_err(store_err("migrate"))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The DDL of this table ([`OUTBOX_DDL`] with the names substituted).
    pub fn ddl(&self) -> &str {
        &self.sql.ddl
    }

    /// Writes `envelope` into the outbox **in `tx`** (queue: `meta.queue`, else
    /// `default`); returns the row id. Nothing is visible to a relay until `tx` commits.
    pub fn save(&self, tx: &Transaction<'_>, envelope: &Envelope) -> Result<i64, OutboxError> {
        #[cfg(feature = "schema")]
        let (bytes, queue) =
            babelqueue_runtime::outbox::encode_checked(envelope, self.schemas.as_deref())?;
        #[cfg(not(feature = "schema"))]
        let (bytes, queue) = (
            envelope.encode(),
            babelqueue_runtime::outbox::queue_of(envelope),
        );
        self.save_encoded(tx, &bytes, queue)
    }

    /// Writes pre-encoded bytes for `queue` **in `tx`**; the relay publishes them byte for
    /// byte. Returns the row id.
    pub fn save_encoded(
        &self,
        tx: &Transaction<'_>,
        encoded: &[u8],
        queue: &str,
    ) -> Result<i64, OutboxError> {
        tx.prepare_cached(&self.sql.insert)
            .and_then(|mut stmt| stmt.execute(params![queue, encoded, now_ms()]))
            .map_err(store_err("save"))?;
        Ok(tx.last_insert_rowid())
    }

    /// Rows not yet published (due or not). Blocking.
    pub fn pending(&self) -> Result<i64, OutboxError> {
        let conn = self.lock();
        conn.query_row(&self.sql.pending, [], |r| r.get(0))
            .map_err(store_err("pending"))
    }

    /// Deletes rows published more than `older_than` ago; returns how many. Blocking.
    pub fn purge_published(&self, older_than: Duration) -> Result<usize, OutboxError> {
        let cutoff =
            now_ms().saturating_sub(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX));
        self.lock()
            .execute(&self.sql.purge, [cutoff])
            .map_err(store_err("purge_published"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the relay connection on tokio's blocking pool.
    fn blocking<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Connection, &Sql) -> rusqlite::Result<T> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, OutboxError>> {
        let conn = self.conn.clone();
        let sql = self.sql.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                f(&mut conn, &sql)
            })
            .await
            .map_err(|e| OutboxError::store(op, SqliteStoreError::Task(e.to_string())))?
            .map_err(store_err(op))
        })
    }
}

impl OutboxStore for SqliteOutbox {
    fn fetch_unpublished(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<OutboxRecord>, OutboxError>> {
        self.blocking("fetch_unpublished", move |conn, sql| {
            let now = now_ms();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut out = {
                let mut stmt = tx.prepare_cached(&sql.claim)?;
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                stmt.query_map(params![now, limit, deadline(now, lease)], |r| {
                    Ok(OutboxRecord::new(
                        r.get(0)?,
                        r.get::<_, String>(1)?,
                        r.get(2)?,
                        r.get(3)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?
            };
            tx.commit()?;
            out.sort_by_key(|r| r.id);
            Ok(out)
        })
    }

    fn mark_published<'a>(&'a self, ids: &'a [i64]) -> BoxFuture<'a, Result<(), OutboxError>> {
        let ids = ids.to_vec();
        self.blocking("mark_published", move |conn, sql| {
            let now = now_ms();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut stmt = tx.prepare_cached(&sql.published)?;
                for id in ids {
                    stmt.execute(params![id, now])?;
                }
            }
            tx.commit()
        })
    }

    fn mark_failed<'a>(
        &'a self,
        id: i64,
        reason: &'a str,
        retry_in: Duration,
    ) -> BoxFuture<'a, Result<(), OutboxError>> {
        let reason = reason.to_owned();
        self.blocking("mark_failed", move |conn, sql| {
            let due = deadline(now_ms(), retry_in);
            conn.prepare_cached(&sql.failed)?
                .execute(params![id, reason, due])
                .map(|_| ())
        })
    }

    fn release<'a>(&'a self, ids: &'a [i64]) -> BoxFuture<'a, Result<(), OutboxError>> {
        let ids = ids.to_vec();
        self.blocking("release", move |conn, sql| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut stmt = tx.prepare_cached(&sql.release)?;
                for id in ids {
                    stmt.execute([id])?;
                }
            }
            tx.commit()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ddl_is_rendered_for_the_table_and_bad_names_refused() {
        let sql = Sql::new("shop_outbox");
        assert!(
            sql.ddl
                .contains("CREATE TABLE IF NOT EXISTS \"shop_outbox\" (")
        );
        assert!(sql.ddl.contains("\"shop_outbox_unpublished_idx\""));
        assert!(!sql.ddl.contains("babelqueue_outbox"));
        let dir = std::env::temp_dir().join(format!("bq-outbox-name-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(SqliteOutbox::open_table(dir.join("x.db"), "a;b").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
