//! [`PostgresStore`]: the shared seen-set on PostgreSQL, in the layout every BabelQueue
//! SDK uses.

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use babelqueue_core::key::{UnstorableId, id_is_storable};
use babelqueue_core::store_error::{StoreUnavailable, UnavailableKind};
use babelqueue_core::{
    AsyncLeaseStore, AsyncStore, lease::Claim, lease::LeaseToken, retention::DEFAULT_RETENTION,
};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;

use crate::table::{InvalidTableName, TableName};

/// Default pool size of [`PostgresStore::connect`].
const DEFAULT_POOL_SIZE: usize = 16;
/// Default connect / pool wait timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default per-statement timeout (server-side `statement_timeout`).
const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much longer than the statement timeout the client waits for a whole call (pool
/// wait + statement) before giving up on its own: the server's cancellation normally
/// answers first.
const CLIENT_MARGIN: Duration = Duration::from_millis(500);

/// What can go wrong with the PostgreSQL store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresStoreError {
    /// The table name is not a plain SQL identifier.
    #[error("postgres store: invalid table name")]
    InvalidTableName(#[from] InvalidTableName),
    /// The connection URL could not be parsed.
    #[error("postgres store: invalid connection URL")]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// The pool could not be built.
    #[error("postgres store: building the pool failed")]
    Build(#[from] deadpool_postgres::BuildError),
    /// No connection could be had from the pool (server down, timeout).
    #[error("postgres store: no connection")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A statement failed.
    #[error("postgres store: statement failed")]
    Db(#[from] tokio_postgres::Error),
    /// The claim statement answered something it never returns.
    #[error("postgres store: unexpected claim state {0:?}")]
    UnexpectedClaimState(String),
    /// The TLS settings (`sslmode`, `sslrootcert`, roots) cannot be honoured.
    #[error("postgres store: TLS settings")]
    Tls(#[from] crate::tls::TlsError),
    /// The server could not answer, or not within the store's timeouts (statement
    /// timeout, pool wait, connection): not the message's fault. Also found by
    /// [`babelqueue_core::store_error::find_unavailable`].
    #[error("postgres store unavailable")]
    Unavailable(#[from] StoreUnavailable),
    /// The id breaks the rule every store applies ([`id_is_storable`]): refused before
    /// any I/O.
    #[error("postgres store: unusable id")]
    UnstorableId(#[from] UnstorableId),
}

impl PostgresStoreError {
    /// Whether the store was unavailable (down, unreachable, or too slow).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, PostgresStoreError::Unavailable(_))
    }

    /// Whether a call timed out (statement timeout, pool wait, client-side bound).
    pub fn is_timeout(&self) -> bool {
        matches!(self, PostgresStoreError::Unavailable(u) if u.is_timeout())
    }
}

/// Classifies a driver error: a cancelled statement (the statement timeout) or a broken
/// connection is [`StoreUnavailable`]; anything else stays [`PostgresStoreError::Db`].
fn db_error(operation: &'static str, e: tokio_postgres::Error) -> PostgresStoreError {
    use tokio_postgres::error::SqlState;
    let kind = match e.code() {
        Some(c) if *c == SqlState::QUERY_CANCELED || *c == SqlState::LOCK_NOT_AVAILABLE => {
            Some(UnavailableKind::Timeout)
        }
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::TOO_MANY_CONNECTIONS =>
        {
            Some(UnavailableKind::Connection)
        }
        Some(_) => None,
        None if e.is_closed() || e.as_db_error().is_none() => Some(UnavailableKind::Connection),
        None => None,
    };
    match kind {
        Some(kind) => StoreUnavailable::with_source("postgres", operation, kind, e).into(),
        None => PostgresStoreError::Db(e),
    }
}

/// Classifies a pool error: every failure to get a connection is unavailability.
fn pool_error(operation: &'static str, e: deadpool_postgres::PoolError) -> PostgresStoreError {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => db_error(operation, e),
        PoolError::Timeout(_) => {
            StoreUnavailable::with_source("postgres", operation, UnavailableKind::Timeout, e).into()
        }
        e => StoreUnavailable::with_source("postgres", operation, UnavailableKind::Connection, e)
            .into(),
    }
}

babelqueue_core::handler_error_from!(PostgresStoreError);

/// The SQL of one table, rendered once after the name was validated.
#[derive(Debug)]
struct Statements {
    seen: String,
    remember: String,
    forget: String,
    claim: String,
    complete: String,
    release: String,
    renew: String,
    purge: String,
}

/// `now() + <ms> milliseconds`; a NULL parameter gives NULL (= never expires).
const DEADLINE: &str = "now() + $2::bigint * interval '1 millisecond'";

/// A row is held in flight when it carries a lease token and its expiry is the lease
/// deadline. (A Go consumer re-remembering a row whose lease expired changes
/// `expires_at` but not the lease columns, which then no longer match: completed.)
fn in_flight(t: &str) -> String {
    format!(
        "({t}.lease_token IS NOT NULL AND {t}.expires_at IS NOT NULL \
         AND {t}.lease_expires_at IS NOT DISTINCT FROM {t}.expires_at)"
    )
}

impl Statements {
    fn new(table: &TableName) -> Self {
        let t = table.sql();
        let live = format!("({t}.expires_at IS NULL OR {t}.expires_at > now())");
        let held = in_flight(&t);
        // The sequence name is a validated identifier: safe inside the literal.
        let seq = table.fence_sequence_sql();
        Statements {
            seen: format!("SELECT EXISTS (SELECT 1 FROM {t} WHERE message_id = $1 AND {live})"),
            // Exactly the statement of SPEC section 3 (the Go SDK's Claim).
            remember: format!(
                "INSERT INTO {t} (message_id, created_at, expires_at) \
                 VALUES ($1, now(), {DEADLINE}) \
                 ON CONFLICT (message_id) DO UPDATE \
                 SET created_at = now(), expires_at = EXCLUDED.expires_at \
                 WHERE {t}.expires_at IS NOT NULL AND {t}.expires_at <= now() \
                 RETURNING message_id"
            ),
            forget: format!("DELETE FROM {t} WHERE message_id = $1"),
            // One round trip: the same INSERT … ON CONFLICT claim, writing the lease
            // columns; when it wrote nothing, say why from the row as this statement
            // sees it. Anything ambiguous (a row that appeared or vanished concurrently)
            // answers in_flight, which only makes the caller retry later.
            claim: format!(
                "WITH claimed AS ( \
                   INSERT INTO {t} (message_id, created_at, expires_at, lease_token, lease_expires_at) \
                   VALUES ($1, now(), {DEADLINE}, $3, {DEADLINE}) \
                   ON CONFLICT (message_id) DO UPDATE \
                   SET created_at = now(), expires_at = EXCLUDED.expires_at, \
                       lease_token = EXCLUDED.lease_token, lease_expires_at = EXCLUDED.lease_expires_at \
                   WHERE {t}.expires_at IS NOT NULL AND {t}.expires_at <= now() \
                   RETURNING 1 \
                 ) \
                 SELECT CASE \
                   WHEN EXISTS (SELECT 1 FROM claimed) THEN 'acquired' \
                   WHEN EXISTS (SELECT 1 FROM {t} WHERE message_id = $1 AND {live} AND NOT {held}) \
                     THEN 'completed' \
                   ELSE 'in_flight' \
                 END, (SELECT nextval('{seq}') FROM claimed)"
            ),
            complete: format!(
                "UPDATE {t} SET created_at = now(), expires_at = {DEADLINE}, \
                   lease_token = NULL, lease_expires_at = NULL \
                 WHERE message_id = $1 AND lease_token = $3 AND {held} AND {t}.expires_at > now()"
            ),
            release: format!(
                "DELETE FROM {t} \
                 WHERE message_id = $1 AND lease_token = $2 AND {held} AND {t}.expires_at > now()"
            ),
            // Extends a held, unexpired lease of the token: $2 = lease ms, $3 = token.
            renew: format!(
                "UPDATE {t} SET expires_at = {DEADLINE}, lease_expires_at = {DEADLINE} \
                 WHERE message_id = $1 AND lease_token = $3 AND {held} AND {t}.expires_at > now()"
            ),
            purge: format!("DELETE FROM {t} WHERE expires_at IS NOT NULL AND expires_at <= now()"),
        }
    }
}

/// The shared seen-set on PostgreSQL (async; implements [`AsyncStore`] and
/// [`AsyncLeaseStore`]), over a [`deadpool_postgres`] pool. Cheap to clone.
///
/// The table is exactly the one every BabelQueue SDK uses (`babelqueue_idempotency` by default,
/// shared with the other SDKs), plus two nullable lease columns that
/// [`migrate`](Self::migrate) adds. Ids are always bound as parameters; the table name
/// is validated ([`TableName`]) before it is written into any statement.
///
/// * `seen` = a live row exists (`expires_at IS NULL OR expires_at > now()`), the Go
///   SDK's query;
/// * `remember` / [`claim`](Self::claim) = the cross-SDK claim statement
///   `INSERT … ON CONFLICT (message_id) DO UPDATE … WHERE <expired> RETURNING message_id`;
/// * `forget` = `DELETE`; [`purge_expired`](Self::purge_expired) deletes expired rows.
///
/// **Lease mode**: an in-flight row has `lease_token` set and
/// `expires_at = lease_expires_at` = the lease deadline. Other SDKs therefore see it as
/// seen (and their claim as lost) until the lease ends, never longer; completing clears
/// the lease columns and sets `expires_at` to the TTL deadline or NULL, which is exactly
/// the row the Go SDK writes. `renew` moves both deadlines while the token holds the row;
/// each acquired claim takes the next value of the sequence `<table>_fence_seq` (created by
/// `migrate`) as its fencing token ([`LeaseToken::fence`]).
///
/// **Timeouts**: every pooled connection has a `statement_timeout` (builder
/// [`statement_timeout`](PostgresStoreBuilder::statement_timeout), default 5 s), and each
/// call is also bounded on the client; a timeout, a lost connection or a pool that cannot
/// give a connection is [`PostgresStoreError::Unavailable`].
///
/// ```no_run
/// use std::time::Duration;
/// use babelqueue_core::{Guard, Envelope};
/// use babelqueue_postgres::PostgresStore;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let store = PostgresStore::builder("postgres://postgres@127.0.0.1:5432/test")
///     .table("babelqueue_idempotency")
///     .ttl(Duration::from_secs(7 * 24 * 3600))
///     .connect()
///     .await?;
/// store.migrate().await?; // CREATE TABLE IF NOT EXISTS …, idempotent
/// let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
/// Guard::new(&store).run_async(&env, async { Ok::<(), babelqueue_postgres::PostgresStoreError>(()) }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) pool: Pool,
    table: TableName,
    sql: std::sync::Arc<Statements>,
    /// Statements of transactional mode, fingerprints and batched purges.
    pub(crate) ext: std::sync::Arc<crate::statements::Statements>,
    pub(crate) ttl: Option<Duration>,
    call_timeout: Duration,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.table.to_string())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Builds a [`PostgresStore`]: table, default TTL, pool size, timeouts.
#[derive(Debug, Clone)]
pub struct PostgresStoreBuilder {
    url: String,
    table: String,
    ttl: Option<Duration>,
    pool_size: usize,
    timeout: Duration,
    tls: crate::tls::TlsSettings,
    statement_timeout: Duration,
}

impl PostgresStoreBuilder {
    /// The table name (default `babelqueue_idempotency`), `table` or `schema.table`;
    /// validated by [`connect`](Self::connect).
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

    /// Remembered ids never expire (`expires_at` NULL, as the other SDKs write by
    /// default).
    #[must_use]
    pub fn keep_forever(mut self) -> Self {
        self.ttl = None;
        self
    }

    /// The most connections the pool opens (default 16).
    #[must_use]
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long connecting, or waiting for a free pooled connection, may take (default
    /// 5 s).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The TLS mode, overriding the URL's `sslmode` (libpq's meaning; see [`SslMode`]).
    ///
    /// [`SslMode`]: crate::SslMode
    #[must_use]
    pub fn ssl_mode(mut self, mode: crate::SslMode) -> Self {
        self.tls.mode = Some(mode);
        self
    }

    /// Trusts the PEM certificates in `pem` (one or more `BEGIN CERTIFICATE` blocks) as
    /// roots for the server certificate, in addition to the URL's `sslrootcert` file.
    /// With a root configured, every TLS mode verifies the chain (as libpq does);
    /// `verify-full` also checks the host name. Checked by [`connect`](Self::connect).
    ///
    /// ```no_run
    /// use babelqueue_postgres::{PostgresStore, SslMode};
    /// # async fn demo() -> Result<(), babelqueue_postgres::PostgresStoreError> {
    /// let ca = std::fs::read("/etc/ssl/my-db-ca.pem").expect("CA file");
    /// let store = PostgresStore::builder("postgres://app@db.internal:5432/app")
    ///     .ssl_mode(SslMode::VerifyFull)
    ///     .root_certificates_pem(ca)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
    #[must_use]
    pub fn root_certificates_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_pem.push(pem.into());
        self
    }

    /// Connects with this rustls configuration whenever TLS is used (client
    /// certificates, other roots, another crypto provider); `sslmode` still decides
    /// whether TLS is required, but the certificate checks are entirely the
    /// configuration's (`sslrootcert` and [`root_certificates_pem`](Self::root_certificates_pem)
    /// are then ignored).
    #[cfg(feature = "rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
    #[must_use]
    pub fn tls_config(mut self, config: rustls::ClientConfig) -> Self {
        self.tls.client_config = Some(std::sync::Arc::new(config));
        self
    }

    /// How long one statement may run on the server before it is cancelled (default 5 s):
    /// set as `statement_timeout` on every pooled connection, so a call blocked by a lock
    /// (another session's `LOCK TABLE`, a long transaction) fails with a timeout
    /// ([`PostgresStoreError::is_timeout`]) instead of waiting forever. The client also
    /// gives up on a whole call (pool wait + statement) 500 ms after it.
    #[must_use]
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Validates the table name, parses the URL (including `sslmode` and
    /// `sslrootcert`, see [`SslMode`](crate::SslMode)) and builds the pool. Connections
    /// are opened on first use; call [`PostgresStore::migrate`] (which also proves the
    /// server is reachable) before serving.
    pub async fn connect(self) -> Result<PostgresStore, PostgresStoreError> {
        let table = TableName::parse(&self.table)?;
        let (url, tls_params) = crate::tls::split_params(&self.url)?;
        let mut config =
            tokio_postgres::Config::from_str(&url).map_err(PostgresStoreError::InvalidUrl)?;
        let (ssl_mode, connector) = crate::tls::resolve(tls_params, &self.tls)?;
        config.ssl_mode(ssl_mode);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("babelqueue-rs");
        }
        with_statement_timeout(&mut config, self.statement_timeout);
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match connector {
            crate::tls::Connector::Plain => Manager::from_config(config, NoTls, manager_config),
            #[cfg(feature = "rustls")]
            crate::tls::Connector::Rustls(tls) => Manager::from_config(config, tls, manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(self.timeout))
            .create_timeout(Some(self.timeout))
            .build()?;
        Ok(PostgresStore::from_pool_and_table(pool, table)
            .with_ttl(self.ttl)
            .with_call_timeout(self.statement_timeout + CLIENT_MARGIN))
    }
}

/// Adds `-c statement_timeout=<ms>` to the connection's startup options (keeping any
/// options of the URL), so every pooled connection has it from the start.
fn with_statement_timeout(config: &mut tokio_postgres::Config, timeout: Duration) {
    let setting = format!("-c statement_timeout={}", millis(timeout).max(1));
    let options = match config.get_options() {
        Some(existing) if !existing.is_empty() => format!("{existing} {setting}"),
        _ => setting,
    };
    config.options(options);
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl PostgresStore {
    /// Connects to `url` (a `postgres://` URL or a `key=value` string) with the default
    /// table and retention ([`DEFAULT_RETENTION`], 7 days).
    pub async fn connect(url: &str) -> Result<Self, PostgresStoreError> {
        Self::builder(url).connect().await
    }

    /// A builder for a store at `url`.
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.into(),
            table: crate::DEFAULT_TABLE.to_owned(),
            ttl: Some(DEFAULT_RETENTION),
            pool_size: DEFAULT_POOL_SIZE,
            timeout: DEFAULT_TIMEOUT,
            tls: crate::tls::TlsSettings::default(),
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
        }
    }

    /// A store over a pool of your own (TLS connector, custom configuration), on
    /// `table` (validated), with the default retention. Its connections keep their own
    /// settings (set `statement_timeout` in them yourself); the client-side bound of a call
    /// is 5.5 s ([`with_call_timeout`](Self::with_call_timeout)).
    pub fn from_pool(pool: Pool, table: &str) -> Result<Self, PostgresStoreError> {
        Ok(Self::from_pool_and_table(pool, TableName::parse(table)?))
    }

    fn from_pool_and_table(pool: Pool, table: TableName) -> Self {
        PostgresStore {
            pool,
            sql: std::sync::Arc::new(Statements::new(&table)),
            ext: std::sync::Arc::new(crate::statements::Statements::new(&table)),
            table,
            ttl: Some(DEFAULT_RETENTION),
            call_timeout: DEFAULT_STATEMENT_TIMEOUT + CLIENT_MARGIN,
        }
    }

    /// The same store with another client-side bound on each call (pool wait + statement
    /// round trip); past it the call fails with a timeout
    /// ([`PostgresStoreError::is_timeout`]). The builder sets it to the statement timeout
    /// plus 500 ms.
    #[must_use]
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The client-side bound on each call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// The same store with a default TTL for remembered ids (`None`: forever).
    #[must_use]
    pub fn with_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl;
        self
    }

    /// The validated table name.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The default TTL of remembered ids.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The connection pool, for statements of your own.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Creates the table, its expiry index and the lease columns if missing, by running
    /// the shipped DDL (`sql/babelqueue_idempotency.sql`, [`TableName::ddl`]). Safe to
    /// call on every start and from many processes at once (it takes a transaction-level
    /// advisory lock, and skips the DDL, with its table lock, when everything exists).
    /// A table created by another SDK only gains the two nullable lease columns.
    pub async fn migrate(&self) -> Result<(), PostgresStoreError> {
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| pool_error("migrate", e))?;
        if self.is_migrated(&client).await? {
            return Ok(());
        }
        let tx = client
            .transaction()
            .await
            .map_err(|e| db_error("migrate", e))?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[&format!("babelqueue:migrate:{}", self.table)],
        )
        .await
        .map_err(|e| db_error("migrate", e))?;
        tx.batch_execute(&self.table.ddl())
            .await
            .map_err(|e| db_error("migrate", e))?;
        tx.commit().await.map_err(|e| db_error("migrate", e))?;
        tracing::debug!(table = %self.table, "babelqueue idempotency table migrated");
        Ok(())
    }

    async fn is_migrated(
        &self,
        client: &deadpool_postgres::Object,
    ) -> Result<bool, PostgresStoreError> {
        let row = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
                 AND to_regclass($3) IS NOT NULL \
                 AND (SELECT count(*) FROM pg_attribute \
                      WHERE attrelid = to_regclass($1) AND NOT attisdropped \
                      AND attname IN ('lease_token', 'lease_expires_at', \
                                      'fingerprint', 'fingerprint_at')) = 4",
                &[
                    &self.table.sql(),
                    &self.table.qualified_index_sql(),
                    &self.table.fence_sequence_sql(),
                ],
            )
            .await?;
        Ok(row.try_get(0)?)
    }

    /// Remembers `id` with the cross-SDK claim statement and returns whether this caller wrote the
    /// row: `true` for exactly one of any number of concurrent callers, `false` when a
    /// live row (remembered or in flight) already exists. `ttl` `None` = the store
    /// default.
    ///
    /// ```no_run
    /// # async fn demo(store: babelqueue_postgres::PostgresStore) -> Result<(), babelqueue_postgres::PostgresStoreError> {
    /// if store.claim("f1e2d3c4-b5a6-4789-90ab-cdef01234567", None).await? {
    ///     // first delivery
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn claim(&self, id: &str, ttl: Option<Duration>) -> Result<bool, PostgresStoreError> {
        id_is_storable(id)?;
        let ttl_ms = ttl.or(self.ttl).map(millis);
        let rows = self
            .query("remember", &self.sql.remember, &[&id, &ttl_ms])
            .await?;
        Ok(!rows.is_empty())
    }

    /// Deletes every expired row (remembered ids past their TTL, abandoned leases) and
    /// returns how many. Expired rows are already ignored; this only reclaims space.
    pub async fn purge_expired(&self) -> Result<u64, PostgresStoreError> {
        self.execute("purge", &self.sql.purge, &[]).await
    }

    /// Runs one call under the client-side bound.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, PostgresStoreError>>,
    ) -> Result<T, PostgresStoreError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(r) => r,
            Err(_) => {
                Err(StoreUnavailable::new("postgres", operation, UnavailableKind::Timeout).into())
            }
        }
    }

    pub(crate) async fn query(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, PostgresStoreError> {
        self.bounded(operation, async {
            let client = self
                .pool
                .get()
                .await
                .map_err(|e| pool_error(operation, e))?;
            let stmt = client
                .prepare_cached(sql)
                .await
                .map_err(|e| db_error(operation, e))?;
            client
                .query(&stmt, params)
                .await
                .map_err(|e| db_error(operation, e))
        })
        .await
    }

    pub(crate) async fn execute(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, PostgresStoreError> {
        self.bounded(operation, async {
            let client = self
                .pool
                .get()
                .await
                .map_err(|e| pool_error(operation, e))?;
            let stmt = client
                .prepare_cached(sql)
                .await
                .map_err(|e| db_error(operation, e))?;
            client
                .execute(&stmt, params)
                .await
                .map_err(|e| db_error(operation, e))
        })
        .await
    }

    async fn is_seen(&self, id: &str) -> Result<bool, PostgresStoreError> {
        id_is_storable(id)?;
        let rows = self.query("seen", &self.sql.seen, &[&id]).await?;
        match rows.first() {
            Some(row) => Ok(row.try_get(0)?),
            None => Ok(false),
        }
    }

    async fn lease_claim(&self, id: &str, lease: Duration) -> Result<Claim, PostgresStoreError> {
        id_is_storable(id)?;
        let token = LeaseToken::new();
        let rows = self
            .query(
                "claim",
                &self.sql.claim,
                &[&id, &Some(millis(lease)), &token.as_str()],
            )
            .await?;
        let (state, fence): (String, Option<i64>) = match rows.first() {
            Some(row) => (row.try_get(0)?, row.try_get(1)?),
            None => return Err(PostgresStoreError::UnexpectedClaimState(String::new())),
        };
        match state.as_str() {
            "acquired" => Ok(Claim::Acquired(match fence {
                Some(f) => token.with_fence(f.unsigned_abs()),
                None => token,
            })),
            "completed" => Ok(Claim::Completed),
            "in_flight" => Ok(Claim::InFlight),
            _ => Err(PostgresStoreError::UnexpectedClaimState(state)),
        }
    }

    async fn lease_complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Result<bool, PostgresStoreError> {
        id_is_storable(id)?;
        let ttl_ms = ttl.or(self.ttl).map(millis);
        let n = self
            .execute(
                "complete",
                &self.sql.complete,
                &[&id, &ttl_ms, &token.as_str()],
            )
            .await?;
        Ok(n == 1)
    }

    async fn lease_release(
        &self,
        id: &str,
        token: &LeaseToken,
    ) -> Result<bool, PostgresStoreError> {
        id_is_storable(id)?;
        let n = self
            .execute("release", &self.sql.release, &[&id, &token.as_str()])
            .await?;
        Ok(n == 1)
    }
}

impl PostgresStore {
    async fn lease_renew(
        &self,
        id: &str,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<bool, PostgresStoreError> {
        id_is_storable(id)?;
        let n = self
            .execute(
                "renew",
                &self.sql.renew,
                &[&id, &Some(millis(lease)), &token.as_str()],
            )
            .await?;
        Ok(n == 1)
    }
}

impl AsyncStore for PostgresStore {
    type Error = PostgresStoreError;

    fn seen(&self, id: &str) -> impl Future<Output = Result<bool, PostgresStoreError>> + Send {
        self.is_seen(id)
    }

    fn remember(&self, id: &str) -> impl Future<Output = Result<(), PostgresStoreError>> + Send {
        self.remember_for(id, None)
    }

    async fn remember_for(
        &self,
        id: &str,
        ttl: Option<Duration>,
    ) -> Result<(), PostgresStoreError> {
        self.claim(id, ttl).await.map(|_| ())
    }

    async fn forget(&self, id: &str) -> Result<(), PostgresStoreError> {
        id_is_storable(id)?;
        self.execute("forget", &self.sql.forget, &[&id])
            .await
            .map(|_| ())
    }
}

impl AsyncLeaseStore for PostgresStore {
    fn claim(
        &self,
        id: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, PostgresStoreError>> + Send {
        self.lease_claim(id, lease)
    }

    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<bool, PostgresStoreError>> + Send {
        self.lease_complete(id, token, ttl)
    }

    fn release(
        &self,
        id: &str,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool, PostgresStoreError>> + Send {
        self.lease_release(id, token)
    }

    fn renew(
        &self,
        id: &str,
        token: &LeaseToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, PostgresStoreError>> + Send {
        self.lease_renew(id, token, lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remember_is_the_spec_statement() {
        let sql = Statements::new(&TableName::default()).remember;
        let norm = sql.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(
            norm,
            "INSERT INTO \"babelqueue_idempotency\" (message_id, created_at, expires_at) \
             VALUES ($1, now(), now() + $2::bigint * interval '1 millisecond') \
             ON CONFLICT (message_id) DO UPDATE SET created_at = now(), expires_at = EXCLUDED.expires_at \
             WHERE \"babelqueue_idempotency\".expires_at IS NOT NULL \
             AND \"babelqueue_idempotency\".expires_at <= now() RETURNING message_id"
        );
    }

    #[test]
    fn ids_are_never_in_the_sql() {
        let s = Statements::new(&TableName::parse("app.t").unwrap());
        for sql in [
            &s.seen,
            &s.remember,
            &s.forget,
            &s.claim,
            &s.complete,
            &s.release,
            &s.renew,
        ] {
            assert!(
                sql.contains("message_id = $1") || sql.contains("VALUES ($1"),
                "{sql}"
            );
            assert!(sql.contains("\"app\".\"t\""));
        }
    }

    #[tokio::test]
    async fn invalid_table_and_url_are_typed_errors() {
        let err = PostgresStore::builder("postgres://localhost/x")
            .table("x; drop table y")
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(err, PostgresStoreError::InvalidTableName(_)),
            "{err:?}"
        );
        let err = PostgresStore::connect("postgres://127.0.0.1:notaport/db")
            .await
            .unwrap_err();
        assert!(matches!(err, PostgresStoreError::InvalidUrl(_)), "{err:?}");
    }
}
