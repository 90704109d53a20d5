//! The transactional outbox on PostgreSQL (ADR-0029): [`PostgresOutbox`].

use std::sync::Arc;
use std::time::Duration;

use babelqueue_core::Envelope;
use babelqueue_runtime::handler::BoxFuture;
use babelqueue_runtime::outbox::{OutboxError, OutboxRecord, OutboxStore};
use deadpool_postgres::Pool;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls, Transaction};

use crate::table::{InvalidTableName, TableName};

/// The default outbox table name.
pub const DEFAULT_OUTBOX_TABLE: &str = "babelqueue_outbox";

/// The DDL shipped in `sql/babelqueue_outbox.sql`, written for [`DEFAULT_OUTBOX_TABLE`].
pub const OUTBOX_DDL: &str = include_str!("../sql/babelqueue_outbox.sql");

#[derive(Debug)]
struct Sql {
    insert: String,
    claim: String,
    published: String,
    failed: String,
    release: String,
    purge: String,
    ddl: String,
}

impl Sql {
    fn new(table: &TableName) -> Self {
        let t = table.sql();
        let mut index = format!("{}_unpublished_idx", table.table());
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
            // The notification is delivered on commit only: a rolled-back write wakes no
            // relay.
            insert: format!(
                "WITH row AS (INSERT INTO {t} (queue, payload) VALUES ($1, $2) RETURNING id) \
                 SELECT id, pg_notify($3, '') FROM row"
            ),
            claim: format!(
                "UPDATE {t} SET claimed_until = now() + $2::bigint * interval '1 millisecond' \
                 WHERE id IN (SELECT id FROM {t} \
                   WHERE published_at IS NULL AND available_at <= now() \
                   AND (claimed_until IS NULL OR claimed_until <= now()) \
                   ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
                 RETURNING id, queue, payload, attempts"
            ),
            published: format!(
                "UPDATE {t} SET published_at = now(), claimed_until = NULL WHERE id = ANY($1)"
            ),
            failed: format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = $2, claimed_until = NULL, \
                 available_at = now() + $3::bigint * interval '1 millisecond' WHERE id = $1"
            ),
            release: format!(
                "UPDATE {t} SET claimed_until = NULL WHERE id = ANY($1) AND published_at IS NULL"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE published_at IS NOT NULL \
                 AND published_at < now() - $1::bigint * interval '1 millisecond'"
            ),
            ddl,
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Stops the `LISTEN` task when the last outbox clone is dropped.
#[derive(Debug)]
struct Listener {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A transactional outbox in a PostgreSQL table (layout: `sql/babelqueue_outbox.sql`,
/// described in ARCHITECTURE.md).
///
/// - [`save`](Self::save) writes an envelope **in your transaction** (a
///   `tokio_postgres::Transaction`, or the `deadpool_postgres::Transaction` the
///   transactional guard hands a handler, which derefs to one): it commits or rolls back
///   with your business write.
/// - As an [`OutboxStore`] it serves [`OutboxRelay`](babelqueue_runtime::outbox::OutboxRelay)s:
///   a claim is one `UPDATE … WHERE id IN (SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP
///   LOCKED)` that sets `claimed_until`, so several relays at once each take other rows,
///   and a crashed relay's rows are due again when its lease passes.
/// - New rows: every save sends `NOTIFY <table>` (delivered on commit); an outbox on which
///   [`listen`](Self::listen) was called wakes its relay on it, else the relay polls.
///
/// ```no_run
/// use std::sync::Arc;
/// use babelqueue_core::Envelope;
/// use babelqueue_runtime::outbox::OutboxRelay;
/// use babelqueue_runtime::InMemoryTransport;
/// use babelqueue_postgres::{PostgresOutbox, PostgresStore};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PostgresStore::connect("postgres://postgres@127.0.0.1/test").await?;
/// let outbox = PostgresOutbox::new(store.pool().clone());
/// outbox.migrate().await?;
///
/// let mut client = store.pool().get().await?;
/// let tx = client.transaction().await?;
/// tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&42i64]).await?;
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({"order_id": 42}))?
///     .with_queue("orders");
/// outbox.save(&tx, &env).await?;
/// tx.commit().await?;
///
/// let relay = OutboxRelay::new(outbox, Arc::new(InMemoryTransport::new()));
/// relay.drain().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresOutbox {
    pool: Pool,
    table: TableName,
    sql: Arc<Sql>,
    wake: Arc<Notify>,
    listener: Option<Arc<Listener>>,
    #[cfg(feature = "schema")]
    schemas: Option<Arc<babelqueue_core::schema::Schemas>>,
}

impl std::fmt::Debug for PostgresOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOutbox")
            .field("table", &self.table)
            .field("listening", &self.listener.is_some())
            .finish_non_exhaustive()
    }
}

impl PostgresOutbox {
    /// An outbox in the table [`DEFAULT_OUTBOX_TABLE`] over `pool` (the relay's claims and
    /// marks use it; saves use your transaction).
    pub fn new(pool: Pool) -> Self {
        Self::with_table_name(pool, TableName::parse(DEFAULT_OUTBOX_TABLE).expect("valid"))
    }

    /// An outbox in `table` (validated like the store's: `table` or `schema.table`).
    pub fn with_table(pool: Pool, table: &str) -> Result<Self, InvalidTableName> {
        Ok(Self::with_table_name(pool, TableName::parse(table)?))
    }

    fn with_table_name(pool: Pool, table: TableName) -> Self {
        PostgresOutbox {
            pool,
            sql: Arc::new(Sql::new(&table)),
            table,
            wake: Arc::new(Notify::new()),
            listener: None,
            #[cfg(feature = "schema")]
            schemas: None,
        }
    }

    /// Refuses to save an envelope whose data breaks its URN's schema
    /// ([`OutboxError::Schema`]), as [`App::publish`](babelqueue_runtime::App::publish)
    /// refuses to publish it.
    #[cfg(feature = "schema")]
    #[must_use]
    pub fn schemas(mut self, schemas: Arc<babelqueue_core::schema::Schemas>) -> Self {
        self.schemas = Some(schemas);
        self
    }

    /// The validated table name.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The `NOTIFY` channel of this table: its name (`table` or `schema.table`).
    pub fn channel(&self) -> String {
        self.table.to_string()
    }

    /// The DDL of this table ([`OUTBOX_DDL`] with the names substituted).
    pub fn ddl(&self) -> String {
        self.sql.ddl.clone()
    }

    /// Creates the table and its index if missing (idempotent; serialised between
    /// processes by a transaction-level advisory lock).
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        let err = |e| OutboxError::store("migrate", e);
        let mut client = self.pool.get().await.map_err(err)?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| OutboxError::store("migrate", e))?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[&format!("babelqueue:migrate:{}", self.table)],
        )
        .await
        .map_err(|e| OutboxError::store("migrate", e))?;
        tx.batch_execute(&self.sql.ddl)
            .await
            .map_err(|e| OutboxError::store("migrate", e))?;
        tx.commit()
            .await
            .map_err(|e| OutboxError::store("migrate", e))
    }

    /// Writes `envelope` into the outbox **in `tx`** (queue: `meta.queue`, else
    /// `default`); returns the row id. Nothing is visible to a relay until `tx` commits.
    pub async fn save(
        &self,
        tx: &Transaction<'_>,
        envelope: &Envelope,
    ) -> Result<i64, OutboxError> {
        #[cfg(feature = "schema")]
        let (bytes, queue) =
            babelqueue_runtime::outbox::encode_checked(envelope, self.schemas.as_deref())?;
        #[cfg(not(feature = "schema"))]
        let (bytes, queue) = (
            envelope.encode(),
            babelqueue_runtime::outbox::queue_of(envelope),
        );
        self.save_encoded(tx, &bytes, queue).await
    }

    /// Writes pre-encoded bytes (an envelope, or a header frame carrying one) for `queue`
    /// **in `tx`**; the relay publishes them byte for byte. Returns the row id.
    pub async fn save_encoded(
        &self,
        tx: &Transaction<'_>,
        encoded: &[u8],
        queue: &str,
    ) -> Result<i64, OutboxError> {
        let err = |e| OutboxError::store("save", e);
        let row = tx
            .query_one(&self.sql.insert, &[&queue, &encoded, &self.channel()])
            .await
            .map_err(err)?;
        row.try_get(0).map_err(err)
    }

    /// Deletes rows published more than `older_than` ago; returns how many.
    pub async fn purge_published(&self, older_than: Duration) -> Result<u64, OutboxError> {
        let err = |e| OutboxError::store("purge_published", e);
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| OutboxError::store("purge_published", e))?;
        client
            .execute(&self.sql.purge, &[&millis(older_than)])
            .await
            .map_err(err)
    }

    /// Rows not yet published (due or not).
    pub async fn pending(&self) -> Result<i64, OutboxError> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| OutboxError::store("pending", e))?;
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*) FROM {} WHERE published_at IS NULL",
                    self.table.sql()
                ),
                &[],
            )
            .await
            .map_err(|e| OutboxError::store("pending", e))?;
        row.try_get(0).map_err(|e| OutboxError::store("pending", e))
    }

    /// Wakes this outbox's relay on every committed save: a task holds a connection of
    /// its own to `url` (without TLS) in `LISTEN <table>` and reconnects every second
    /// while it cannot. The relay still polls (its
    /// [`poll_interval`](babelqueue_runtime::outbox::OutboxRelay::poll_interval)), so a lost
    /// notification only delays a row. Call it inside a tokio runtime; the task ends when
    /// the last clone of this outbox is dropped.
    #[must_use]
    pub fn listen(mut self, url: &str) -> Self {
        let task = tokio::spawn(listen_loop(
            url.to_owned(),
            self.channel(),
            self.wake.clone(),
        ));
        self.listener = Some(Arc::new(Listener { task }));
        self
    }
}

async fn listen_loop(url: String, channel: String, wake: Arc<Notify>) {
    let listen = format!("LISTEN \"{channel}\"");
    loop {
        match tokio_postgres::connect(&url, NoTls).await {
            Ok((client, mut connection)) => {
                let mut listening = std::pin::pin!(client.batch_execute(&listen));
                let mut subscribed = false;
                loop {
                    tokio::select! {
                        r = &mut listening, if !subscribed => {
                            if let Err(e) = r {
                                tracing::warn!(error = %e, "outbox LISTEN failed");
                                break;
                            }
                            subscribed = true;
                            // Rows saved while not listening are picked up at once.
                            wake.notify_one();
                        }
                        m = std::future::poll_fn(|cx| connection.poll_message(cx)) => match m {
                            Some(Ok(AsyncMessage::Notification(_))) => wake.notify_one(),
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "outbox LISTEN connection lost");
                                break;
                            }
                            None => break,
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "outbox LISTEN cannot connect"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl PostgresOutbox {
    async fn client(&self, op: &'static str) -> Result<deadpool_postgres::Object, OutboxError> {
        self.pool.get().await.map_err(|e| OutboxError::store(op, e))
    }
}

impl OutboxStore for PostgresOutbox {
    fn fetch_unpublished(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<OutboxRecord>, OutboxError>> {
        Box::pin(async move {
            let err = |e| OutboxError::store("fetch_unpublished", e);
            let client = self.client("fetch_unpublished").await?;
            let stmt = client.prepare_cached(&self.sql.claim).await.map_err(err)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = client
                .query(&stmt, &[&limit, &millis(lease)])
                .await
                .map_err(err)?;
            let mut out = rows
                .iter()
                .map(|r| {
                    let attempts: i32 = r.try_get(3)?;
                    Ok(OutboxRecord::new(
                        r.try_get(0)?,
                        r.try_get::<_, String>(1)?,
                        r.try_get(2)?,
                        u32::try_from(attempts).unwrap_or(0),
                    ))
                })
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()
                .map_err(err)?;
            out.sort_by_key(|r| r.id);
            Ok(out)
        })
    }

    fn mark_published<'a>(&'a self, ids: &'a [i64]) -> BoxFuture<'a, Result<(), OutboxError>> {
        Box::pin(async move {
            let err = |e| OutboxError::store("mark_published", e);
            let client = self.client("mark_published").await?;
            let stmt = client
                .prepare_cached(&self.sql.published)
                .await
                .map_err(err)?;
            client.execute(&stmt, &[&ids]).await.map_err(err)?;
            Ok(())
        })
    }

    fn mark_failed<'a>(
        &'a self,
        id: i64,
        reason: &'a str,
        retry_in: Duration,
    ) -> BoxFuture<'a, Result<(), OutboxError>> {
        Box::pin(async move {
            let err = |e| OutboxError::store("mark_failed", e);
            let client = self.client("mark_failed").await?;
            let stmt = client.prepare_cached(&self.sql.failed).await.map_err(err)?;
            client
                .execute(&stmt, &[&id, &reason, &millis(retry_in)])
                .await
                .map_err(err)?;
            Ok(())
        })
    }

    fn release<'a>(&'a self, ids: &'a [i64]) -> BoxFuture<'a, Result<(), OutboxError>> {
        Box::pin(async move {
            let err = |e| OutboxError::store("release", e);
            let client = self.client("release").await?;
            let stmt = client
                .prepare_cached(&self.sql.release)
                .await
                .map_err(err)?;
            client.execute(&stmt, &[&ids]).await.map_err(err)?;
            Ok(())
        })
    }

    fn wait_for_rows(&self, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if self.listener.is_some() {
                let _ = tokio::time::timeout(max, self.wake.notified()).await;
            } else {
                tokio::time::sleep(max).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool that never connects (building one opens no connection).
    fn idle_pool() -> Pool {
        let mut config = deadpool_postgres::Config::new();
        config.dbname = Some("unused".into());
        config
            .create_pool(None, NoTls)
            .expect("a pool without connections")
    }

    #[test]
    fn ddl_is_rendered_for_the_table() {
        let pool = idle_pool();
        let o = PostgresOutbox::with_table(pool, "Shop.Outbox").unwrap();
        let ddl = o.ddl();
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS \"shop\".\"outbox\" ("));
        assert!(ddl.contains("CREATE INDEX IF NOT EXISTS \"outbox_unpublished_idx\""));
        assert!(!ddl.contains("babelqueue_outbox"));
        assert_eq!(o.channel(), "shop.outbox");
    }

    #[test]
    fn invalid_table_names_are_refused() {
        let pool = idle_pool();
        assert!(PostgresOutbox::with_table(pool, "x; DROP TABLE y").is_err());
    }
}
