//! [`RedisStore`]: the shared seen-set on Redis, in the layout every BabelQueue SDK uses.
//!
//! # Layout (shared with the Go, Python, PHP, Java, Node and .NET SDKs)
//!
//! | state | key | value | expiry |
//! | --- | --- | --- | --- |
//! | completed (remembered) | `<prefix><meta.id>` (default prefix `bq:idemp:`) | `1` | `PX <ttl>` (default 7 days), or none |
//! | completed with a payload fingerprint (Rust, opt-in) | the same key | `sha256:<hex>` | as above |
//! | in flight (lease mode, Rust only) | the same key | `lease:<token>` | `PX <lease>` |
//! | fencing counter (lease mode, Rust only) | [`fence_key`]: `{<key>}\0fence` | an integer, `INCR`ed by each claim | `PX` [`FENCE_RETENTION`] (7 days) after the last claim or renewal |
//!
//! * seen-set mode: `seen` = `EXISTS key`, `remember` = `SET key 1 NX [PX ttl]`,
//!   `forget` = `DEL key`. A completed id is byte for byte what the Go SDK writes, and a key
//!   the Go SDK wrote is seen here.
//! * lease mode: `claim`, `complete`, `release` and `renew` are Lua scripts ([`redis::Script`], so
//!   `EVALSHA`), each one round trip and atomic on the server; `complete` and `release`
//!   only act when the key still holds `lease:<token>` (compare-and-set /
//!   compare-and-delete). Any value other than `lease:…` counts as completed, so an id
//!   remembered by another SDK is never claimed again.
//!
//! `claim` also increments the id's fencing counter (the claim's fencing token,
//! [`LeaseToken::fence`]); `renew` extends the lease (and the counter's expiry) only while
//! the key still holds `lease:<token>`. Every call is bounded by the response timeout; a
//! timeout or a lost connection is [`RedisStoreError::Unavailable`].
//!
//! **What another SDK sees while a Rust lease holder processes an id**: the key exists,
//! so its `seen` (`EXISTS`) is true and it skips (and acks) its copy of the message, for
//! at most the lease; its `remember` (`SET NX`) is a no-op. When the holder completes, the
//! value becomes `1` (exactly a Go-remembered id); when it fails, the key is deleted and
//! every SDK runs the next delivery; when it dies, the key expires with the lease.
//! The single key keeps every operation atomic on one key (no cross-slot scripts).
//!
//! # Round trips per message
//!
//! seen-set mode: `EXISTS` + `SET NX` = **2** for a new id, **1** for a duplicate.
//! lease mode: `EVALSHA claim` + `EVALSHA complete` = **2** for a new id, **1** for a
//! duplicate (plus, once per script and server, `NOSCRIPT` → `SCRIPT LOAD` → `EVALSHA`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use babelqueue_core::fingerprint::{AsyncFingerprintStore, Fingerprint, Lookup};
use babelqueue_core::key::{UnstorableId, id_is_storable};
use babelqueue_core::pipelined::PipelinedWrite;
use babelqueue_core::store_error::{StoreUnavailable, UnavailableKind};
use babelqueue_core::{
    AsyncLeaseStore, AsyncStore, lease::Claim, lease::LeaseToken, retention::DEFAULT_RETENTION,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script};

use crate::conn::RedisConnection;

/// The key prefix every BabelQueue SDK uses by default: keys are `bq:idemp:<meta.id>`.
pub const DEFAULT_PREFIX: &str = "bq:idemp:";

/// The value prefix of an in-flight claim (lease mode): `lease:<token>`.
pub const LEASE_VALUE_PREFIX: &str = "lease:";

/// Default connection and response timeouts of [`RedisStore::connect`].
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default connection retries of [`RedisStore::connect`].
const DEFAULT_RETRIES: usize = 2;

/// How long a fencing counter outlives the last claim or renewal of its id: fencing
/// tokens of one id keep increasing as long as its claims are less than this apart.
pub const FENCE_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// `KEYS[1]` = key, `KEYS[2]` = its fencing counter, `ARGV[1]` = token, `ARGV[2]` = lease
/// in ms, `ARGV[3]` = how long the counter is kept (ms).
/// Returns {1, fence} = acquired, {2} = in flight, {0} = completed.
const CLAIM_LUA: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  redis.call('SET', KEYS[1], 'lease:' .. ARGV[1], 'PX', ARGV[2])
  return {1, fence}
end
if string.sub(v, 1, 6) == 'lease:' then
  return {2}
end
return {0}
";

/// `KEYS[1]` = key, `KEYS[2]` = its fencing counter, `ARGV[1]` = token, `ARGV[2]` = lease
/// in ms, `ARGV[3]` = how long the counter is kept (ms). Extends the lease only if the
/// token holds the key (its lease has not ended). Returns 1 if it did, else 0.
const RENEW_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= 'lease:' .. ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
";

/// `KEYS[1]` = key, `ARGV[1]` = token, `ARGV[2]` = TTL in ms (0 = no expiry).
/// Returns 1 when the token held the key and it is now `1`, else 0.
const COMPLETE_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= 'lease:' .. ARGV[1] then
  return 0
end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('SET', KEYS[1], '1', 'PX', ttl)
else
  redis.call('SET', KEYS[1], '1')
end
return 1
";

/// `KEYS[1]` = key, `ARGV[1]` = token. Deletes the key only if the token holds it.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == 'lease:' .. ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// What can go wrong talking to Redis.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The URL could not be parsed, the connection failed, or a command failed.
    #[error("redis store: command failed")]
    Redis(#[from] redis::RedisError),
    /// A script answered something this store never returns (another program wrote
    /// a script with the same SHA, or the server is not Redis-compatible).
    #[error("redis store: unexpected reply from the {script} script: {reply}")]
    UnexpectedReply {
        /// `claim`, `complete` or `release`.
        script: &'static str,
        /// The reply received.
        reply: i64,
    },
    /// Redis could not answer, or not within the response timeout (connection refused
    /// or dropped, timeout, loading, failover): not the message's fault. Also found by
    /// [`babelqueue_core::store_error::find_unavailable`].
    #[error("redis store unavailable")]
    Unavailable(#[from] StoreUnavailable),
    /// The id breaks the rule every store applies ([`id_is_storable`]): refused before
    /// any I/O.
    #[error("redis store: unusable id")]
    UnstorableId(#[from] UnstorableId),
}

impl RedisStoreError {
    /// Whether the store was unavailable (down, unreachable, or too slow).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, RedisStoreError::Unavailable(_))
    }

    /// Whether a call timed out (the response timeout, or a connection attempt's).
    pub fn is_timeout(&self) -> bool {
        matches!(self, RedisStoreError::Unavailable(u) if u.is_timeout())
    }
}

/// Classifies a client error: a timeout, a refused or broken connection, or a server that
/// cannot serve right now (loading, failover, cluster down) is [`StoreUnavailable`];
/// anything else (a wrong password, an untrusted certificate, a script error) stays
/// [`RedisStoreError::Redis`].
pub(crate) fn redis_error(operation: &'static str, e: redis::RedisError) -> RedisStoreError {
    use redis::{ErrorKind, ServerErrorKind};
    let kind = if e.is_timeout() {
        Some(UnavailableKind::Timeout)
    } else if e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        )
    {
        Some(UnavailableKind::Connection)
    } else {
        None
    };
    match kind {
        Some(kind) => StoreUnavailable::with_source("redis", operation, kind, e).into(),
        None => RedisStoreError::Redis(e),
    }
}

/// A broken connection (not a slow one): worth one immediate retry through the
/// reconnecting manager.
fn is_stale(e: &redis::RedisError) -> bool {
    !e.is_timeout() && (e.is_connection_dropped() || e.is_connection_refusal() || e.is_io_error())
}

babelqueue_core::handler_error_from!(RedisStoreError);

/// The shared seen-set on Redis (async; implements [`AsyncStore`] and
/// [`AsyncLeaseStore`]). Cheap to clone: clones share one multiplexed, auto-reconnecting
/// connection ([`ConnectionManager`]).
///
/// ```no_run
/// use std::time::Duration;
/// use babelqueue_core::{Guard, AsyncStore, Envelope};
/// use babelqueue_redis::RedisStore;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let store = RedisStore::builder("redis://:secret@127.0.0.1:6379/0")
///     .prefix("payments:bq:idemp:")
///     .ttl(Duration::from_secs(7 * 24 * 3600))
///     .connect()
///     .await?;
/// let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
/// Guard::new(&store).run_async(&env, async { Ok::<(), babelqueue_redis::RedisStoreError>(()) }).await?;
/// assert!(store.seen(env.meta.id.as_str()).await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: RedisConnection,
    prefix: String,
    ttl: Option<Duration>,
    /// `host:port/db`, when known (opened from a URL or a client): a transport on the
    /// same server then sends this store's `remember` with its ack.
    server: Option<Arc<str>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisStore`]: prefix, default TTL, timeouts.
///
/// ```no_run
/// # async fn demo() -> Result<(), babelqueue_redis::RedisStoreError> {
/// let store = babelqueue_redis::RedisStore::builder("rediss://:secret@redis.example:6380/0")
///     .prefix("billing:bq:idemp:")
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    ttl: Option<Duration>,
    connection_timeout: Duration,
    response_timeout: Duration,
    retries: usize,
    nodelay: bool,
}

impl RedisStoreBuilder {
    /// The key prefix (default [`DEFAULT_PREFIX`], `bq:idemp:`). Use one per app on a
    /// shared Redis; every SDK of one app must use the same.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a remembered id stays seen (default [`DEFAULT_RETENTION`], 7 days).
    /// `remember_for` and the guard's TTL override it per id.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Remembered ids never expire (`SET key 1 NX` without `PX`).
    #[must_use]
    pub fn keep_forever(mut self) -> Self {
        self.ttl = None;
        self
    }

    /// How long one connection attempt may take (default 5 s).
    #[must_use]
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long one command may wait for its reply before failing (default 5 s), so a
    /// stuck server surfaces as an error (the message is retried) instead of a hang.
    #[must_use]
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How many times a failed connection attempt is retried, about 1 s apart
    /// (default 2), on the first connect and on every reconnect. A store that cannot
    /// reach Redis fails fast: the guard returns the error and the message is retried
    /// later, rather than a worker hanging in a long backoff.
    #[must_use]
    pub fn retries(mut self, retries: usize) -> Self {
        self.retries = retries;
        self
    }

    /// Sets `TCP_NODELAY` on the store's connection (default: off, as in the redis
    /// crate). Off, Nagle's algorithm merges the small commands of concurrent workers
    /// into fewer packets (see `RedisTransport::tcp_nodelay` for what was measured).
    ///
    /// ```
    /// let builder = babelqueue_redis::RedisStore::builder("redis://127.0.0.1/0").tcp_nodelay(true);
    /// ```
    #[must_use]
    pub fn tcp_nodelay(mut self, nodelay: bool) -> Self {
        self.nodelay = nodelay;
        self
    }

    /// Parses the URL (`redis://[user][:password@]host[:port][/db]`, or `rediss://` for
    /// TLS with the `rustls` feature) and connects.
    pub async fn connect(self) -> Result<RedisStore, RedisStoreError> {
        let client = crate::conn::client_for(&self.url, self.nodelay)?;
        let server = crate::conn::server_identity(client.get_connection_info());
        let config = manager_config(self.connection_timeout, self.response_timeout, self.retries);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| redis_error("connect", e))?;
        let mut store = RedisStore::from_manager(conn).with_prefix(self.prefix);
        store.ttl = self.ttl;
        store.server = Some(server.into());
        Ok(store)
    }
}

impl RedisStoreBuilder {
    /// Like [`connect`](Self::connect), but without connecting: only the URL is checked
    /// here, and the connection is made by the first call (and remade after a loss, as
    /// always). For a consumer started while its store is down: it starts, its guard's
    /// calls fail as unavailable (typed: the runtime puts the messages back without
    /// counting an attempt and reports itself not ready) until the server answers.
    /// Call it inside a tokio runtime.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// // Nothing listens there: the store is built anyway; its calls fail as unavailable.
    /// let store = babelqueue_redis::RedisStore::builder("redis://127.0.0.1:1/0")
    ///     .retries(0)
    ///     .connect_lazy()
    ///     .unwrap();
    /// let answer = babelqueue_core::AsyncStore::seen(&store, "id").await;
    /// assert!(answer.is_err_and(|e| e.is_unavailable()));
    /// # });
    /// ```
    pub fn connect_lazy(self) -> Result<RedisStore, RedisStoreError> {
        let client = crate::conn::client_for(&self.url, self.nodelay)?;
        let server = crate::conn::server_identity(client.get_connection_info());
        let config = manager_config(self.connection_timeout, self.response_timeout, self.retries);
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| redis_error("connect", e))?;
        let mut store = RedisStore::from_manager(conn).with_prefix(self.prefix);
        store.ttl = self.ttl;
        store.server = Some(server.into());
        Ok(store)
    }
}

/// The connection manager's retries: about 1 s apart (with jitter). (The redis crate's
/// default multiplies a 1 s delay by 100 per attempt, capped at a minute, six times:
/// minutes before an unreachable server is reported.)
fn manager_config(
    connection_timeout: Duration,
    response_timeout: Duration,
    retries: usize,
) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connection_timeout))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(retries)
        .set_min_delay(Duration::from_millis(2))
        .set_exponent_base(2.0)
        .set_max_delay(Duration::from_secs(1))
}

fn millis(d: Duration) -> u64 {
    // PX takes whole, positive milliseconds: round up so a sub-millisecond duration
    // still expires rather than failing the command.
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisStore {
    /// Connects to `url` with the default prefix (`bq:idemp:`) and retention
    /// ([`DEFAULT_RETENTION`], 7 days).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), babelqueue_redis::RedisStoreError> {
    /// let store = babelqueue_redis::RedisStore::connect("redis://127.0.0.1:6379/0").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, RedisStoreError> {
        Self::builder(url).connect().await
    }

    /// A builder for a store at `url`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            ttl: Some(DEFAULT_RETENTION),
            connection_timeout: DEFAULT_TIMEOUT,
            response_timeout: DEFAULT_TIMEOUT,
            retries: DEFAULT_RETRIES,
            nodelay: false,
        }
    }

    /// A store over an existing [`Client`] (custom TLS certificates, RESP3, …), with
    /// the default prefix and timeouts.
    pub async fn from_client(client: Client) -> Result<Self, RedisStoreError> {
        crate::conn::install_crypto_provider();
        let server = crate::conn::server_identity(client.get_connection_info());
        let config = manager_config(DEFAULT_TIMEOUT, DEFAULT_TIMEOUT, DEFAULT_RETRIES);
        let mut store = Self::from_manager(
            ConnectionManager::new_with_config(client, config)
                .await
                .map_err(|e| redis_error("connect", e))?,
        );
        store.server = Some(server.into());
        Ok(store)
    }

    /// A store sharing an existing [`ConnectionManager`] (e.g. the transport's), with
    /// the default prefix and retention ([`DEFAULT_RETENTION`]).
    pub fn from_manager(conn: ConnectionManager) -> Self {
        Self::from_connection(conn)
    }

    /// A store over any [`RedisConnection`] (e.g. a Redis Cluster connection: every
    /// store operation touches one key), with the default prefix and no TTL.
    pub fn from_connection(conn: impl Into<RedisConnection>) -> Self {
        RedisStore {
            conn: conn.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            ttl: Some(DEFAULT_RETENTION),
            server: None,
        }
    }

    /// The same store with another key prefix.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The same store with a default TTL for remembered ids (`None`: forever).
    #[must_use]
    pub fn with_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl;
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The default TTL of remembered ids.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The Redis key of `id`: `<prefix><id>`.
    pub fn key(&self, id: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + id.len());
        key.push_str(&self.prefix);
        key.push_str(id);
        key
    }

    /// `name <key of id>` as a command with room for `more` short arguments, the key
    /// written into the command in place (no `String` of it).
    fn key_cmd(&self, name: &str, id: &str, more: usize) -> redis::Cmd {
        use redis::RedisWrite as _;
        use std::io::Write as _;
        let mut cmd = redis::Cmd::with_capacity(
            2 + more,
            name.len() + self.prefix.len() + id.len() + 16 * more,
        );
        cmd.arg(name);
        let mut key = cmd.writer_for_next_arg();
        // Writes into a `Vec<u8>`, which cannot fail.
        let _ = key.write_all(self.prefix.as_bytes());
        let _ = key.write_all(id.as_bytes());
        drop(key);
        cmd
    }

    /// The underlying connection (a cheap clone), for commands of your own.
    pub fn connection(&self) -> RedisConnection {
        self.conn.clone()
    }

    /// Remembers `id` (`SET key 1 NX [PX ttl]`, `ttl` `None` = the store default) and
    /// returns whether this caller added it: `true` for exactly one of any number of
    /// concurrent callers, `false` if the id was already remembered or in flight.
    ///
    /// ```no_run
    /// # async fn demo(store: babelqueue_redis::RedisStore) -> Result<(), babelqueue_redis::RedisStoreError> {
    /// if store.claim("f1e2d3c4-b5a6-4789-90ab-cdef01234567", None).await? {
    ///     // first delivery: this worker processes it
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn claim(&self, id: &str, ttl: Option<Duration>) -> Result<bool, RedisStoreError> {
        self.set_nx(id, "1", ttl).await
    }

    async fn set_nx(
        &self,
        id: &str,
        value: &str,
        ttl: Option<Duration>,
    ) -> Result<bool, RedisStoreError> {
        id_is_storable(id)?;
        let mut cmd = self.key_cmd("SET", id, 4);
        cmd.arg(value).arg("NX");
        if let Some(ttl) = ttl.or(self.ttl) {
            cmd.arg("PX").arg(millis(ttl));
        }
        let reply: Option<String> = self.query("remember", &cmd).await?;
        Ok(reply.is_some())
    }

    /// Runs `cmd`; when the connection was found broken (dropped or refused, not a
    /// timeout) it is run once more at once: the connection manager reconnects on that
    /// error, so the first call after the server is back succeeds instead of failing with
    /// the outage's stale error (and costing the consumer one more store backoff). Every
    /// command and script of this store is safe to repeat.
    async fn query<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T, RedisStoreError> {
        match cmd.query_async(&mut self.conn.clone()).await {
            Err(e) if is_stale(&e) => cmd.query_async(&mut self.conn.clone()).await,
            r => r,
        }
        .map_err(|e| redis_error(operation, e))
    }

    /// [`query`](Self::query) for a script.
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, RedisStoreError> {
        match invocation.invoke_async(&mut self.conn.clone()).await {
            Err(e) if is_stale(&e) => invocation.invoke_async(&mut self.conn.clone()).await,
            r => r,
        }
        .map_err(|e| redis_error(operation, e))
    }

    async fn exists(&self, id: &str) -> Result<bool, RedisStoreError> {
        id_is_storable(id)?;
        let n: i64 = self.query("seen", &self.key_cmd("EXISTS", id, 0)).await?;
        Ok(n > 0)
    }

    async fn del(&self, id: &str) -> Result<(), RedisStoreError> {
        id_is_storable(id)?;
        let _: i64 = self.query("forget", &self.key_cmd("DEL", id, 0)).await?;
        Ok(())
    }

    /// The key of `id`'s fencing counter (see [`fence_key`]).
    pub fn fence_key(&self, id: &str) -> String {
        fence_key(&self.key(id))
    }

    async fn lease_claim(&self, id: &str, lease: Duration) -> Result<Claim, RedisStoreError> {
        id_is_storable(id)?;
        let token = LeaseToken::new();
        let key = self.key(id);
        let mut invocation = script(&CLAIM);
        invocation
            .key(&key)
            .key(fence_key(&key))
            .arg(token.as_str())
            .arg(millis(lease))
            .arg(fence_keep(lease));
        let reply: Vec<i64> = self.invoke("claim", &invocation).await?;
        match reply[..] {
            [1, fence] => Ok(Claim::Acquired(token.with_fence(fence.unsigned_abs()))),
            [2] => Ok(Claim::InFlight),
            [0] => Ok(Claim::Completed),
            _ => Err(RedisStoreError::UnexpectedReply {
                script: "claim",
                reply: reply.first().copied().unwrap_or(-1),
            }),
        }
    }

    async fn lease_renew(
        &self,
        id: &str,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<bool, RedisStoreError> {
        id_is_storable(id)?;
        let key = self.key(id);
        let mut invocation = script(&RENEW);
        invocation
            .key(&key)
            .key(fence_key(&key))
            .arg(token.as_str())
            .arg(millis(lease))
            .arg(fence_keep(lease));
        let reply: i64 = self.invoke("renew", &invocation).await?;
        flag(reply, "renew")
    }

    async fn lease_complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Result<bool, RedisStoreError> {
        id_is_storable(id)?;
        let ttl_ms = ttl.or(self.ttl).map_or(0, millis);
        let mut invocation = script(&COMPLETE);
        invocation.key(self.key(id)).arg(token.as_str()).arg(ttl_ms);
        let reply: i64 = self.invoke("complete", &invocation).await?;
        flag(reply, "complete")
    }

    async fn lease_release(&self, id: &str, token: &LeaseToken) -> Result<bool, RedisStoreError> {
        id_is_storable(id)?;
        let mut invocation = script(&RELEASE);
        invocation.key(self.key(id)).arg(token.as_str());
        let reply: i64 = self.invoke("release", &invocation).await?;
        flag(reply, "release")
    }
}

fn flag(reply: i64, script: &'static str) -> Result<bool, RedisStoreError> {
    match reply {
        0 => Ok(false),
        1 => Ok(true),
        reply => Err(RedisStoreError::UnexpectedReply { script, reply }),
    }
}

static CLAIM: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| Script::new(CLAIM_LUA));
static COMPLETE: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(COMPLETE_LUA));
static RELEASE: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| Script::new(RELEASE_LUA));
static RENEW: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| Script::new(RENEW_LUA));

/// How long the fencing counter is kept after a claim or renewal (ms).
fn fence_keep(lease: Duration) -> u64 {
    millis(FENCE_RETENTION.max(lease.saturating_mul(2)))
}

/// The key of the fencing counter of the dedupe key `key`: `key` + `"\0fence"`, with
/// `key` wrapped in `{…}` when it has no Redis Cluster hash tag of its own, so the counter
/// lives in the same cluster slot as the key (the claim script touches both).
///
/// It can never be another id's key: ids cannot contain NUL
/// ([`id_is_storable`](babelqueue_core::key::id_is_storable)). (A key containing `}` but
/// no valid hash tag cannot be co-located; on a Redis Cluster its claim fails with
/// `CROSSSLOT`, on a single server it works.)
///
/// ```
/// use babelqueue_redis::fence_key;
/// assert_eq!(fence_key("bq:idemp:pay_7f3a"), "{bq:idemp:pay_7f3a}\0fence");
/// assert_eq!(fence_key("{payments}:idemp:pay_7f3a"), "{payments}:idemp:pay_7f3a\0fence");
/// ```
pub fn fence_key(key: &str) -> String {
    if has_hash_tag(key) || key.contains('}') {
        format!("{key}\0fence")
    } else {
        format!("{{{key}}}\0fence")
    }
}

/// Whether Redis Cluster hashes `key` by a `{…}` tag (a `{` followed later by a `}` with
/// at least one byte between the first such pair).
fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

fn script(s: &'static Script) -> redis::ScriptInvocation<'static> {
    s.prepare_invoke()
}

impl AsyncStore for RedisStore {
    type Error = RedisStoreError;

    fn seen(&self, id: &str) -> impl Future<Output = Result<bool, RedisStoreError>> + Send {
        self.exists(id)
    }

    fn remember(&self, id: &str) -> impl Future<Output = Result<(), RedisStoreError>> + Send {
        self.remember_for(id, None)
    }

    async fn remember_for(&self, id: &str, ttl: Option<Duration>) -> Result<(), RedisStoreError> {
        self.claim(id, ttl).await.map(|_| ())
    }

    fn forget(&self, id: &str) -> impl Future<Output = Result<(), RedisStoreError>> + Send {
        self.del(id)
    }

    /// `SET <prefix><id> 1 NX [PX ttl]` (exactly `remember_for`), when this store was
    /// opened on `server` (`host:port/db`; a store built from a bare connection does not
    /// know its server and always writes itself).
    fn pipelined_remember(
        &self,
        id: &str,
        ttl: Option<Duration>,
        server: &str,
    ) -> Option<PipelinedWrite> {
        let own = self.server.as_ref().filter(|own| &***own == server)?;
        if id_is_storable(id).is_err() {
            return None;
        }
        let key = self.key(id);
        // The store's own `Arc` of the server's name: no new one per write.
        let server = Arc::clone(own);
        Some(match ttl.or(self.ttl) {
            Some(ttl) => PipelinedWrite::new(
                server,
                [
                    "SET",
                    key.as_str(),
                    "1",
                    "NX",
                    "PX",
                    millis(ttl).to_string().as_str(),
                ],
            ),
            None => PipelinedWrite::new(server, ["SET", key.as_str(), "1", "NX"]),
        })
    }
}

/// Fingerprints (opt-in): the key's value is `sha256:<hex>` instead of `1` (other SDKs
/// only test the key's existence, so they still see the id as seen); a value that is
/// not a fingerprint (`1`, `lease:…`) reads as "no fingerprint".
impl AsyncFingerprintStore for RedisStore {
    async fn lookup(&self, id: &str) -> Result<Lookup, RedisStoreError> {
        let value: Option<String> = redis::cmd("GET")
            .arg(self.key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(match value {
            None => Lookup::Unseen,
            Some(v) => Lookup::Seen {
                fingerprint: Fingerprint::parse(&v),
            },
        })
    }

    async fn remember_fingerprint(
        &self,
        id: &str,
        fingerprint: &Fingerprint,
        ttl: Option<Duration>,
    ) -> Result<(), RedisStoreError> {
        self.set_nx(id, &fingerprint.to_string(), ttl)
            .await
            .map(|_| ())
    }
}

impl AsyncLeaseStore for RedisStore {
    fn claim(
        &self,
        id: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, RedisStoreError>> + Send {
        self.lease_claim(id, lease)
    }

    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<bool, RedisStoreError>> + Send {
        self.lease_complete(id, token, ttl)
    }

    fn release(
        &self,
        id: &str,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool, RedisStoreError>> + Send {
        self.lease_release(id, token)
    }

    fn renew(
        &self,
        id: &str,
        token: &LeaseToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, RedisStoreError>> + Send {
        self.lease_renew(id, token, lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_rounds_up_to_one() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_secs(30)), 30_000);
    }

    #[test]
    fn lease_prefix_matches_the_scripts() {
        for lua in [CLAIM_LUA, COMPLETE_LUA, RELEASE_LUA, RENEW_LUA] {
            assert!(lua.contains(&format!("'{LEASE_VALUE_PREFIX}'")));
        }
        assert!(CLAIM_LUA.contains(&format!("1, {})", LEASE_VALUE_PREFIX.len())));
    }

    #[test]
    fn fence_keys_share_the_slot_and_never_collide() {
        assert!(has_hash_tag("{a}b") && has_hash_tag("x{a}") && !has_hash_tag("{}a"));
        assert!(!has_hash_tag("a{b") && !has_hash_tag("plain"));
        assert_eq!(fence_key("a{b"), "{a{b}\0fence");
        assert_eq!(fence_key("{}a"), "{}a\0fence");
        assert_eq!(fence_key("x{a}y"), "x{a}y\0fence");
        for id in ["pay_1", "a{b", "{t}x"] {
            assert!(fence_key(id).contains('\0'));
        }
    }

    #[test]
    fn bad_url_is_an_error_not_a_panic() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt
            .block_on(RedisStore::connect("not a url"))
            .expect_err("must not connect");
        assert!(matches!(err, RedisStoreError::Redis(_)), "{err:?}");
    }
}
