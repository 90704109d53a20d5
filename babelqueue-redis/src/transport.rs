//! [`RedisTransport`]: the reliable-queue list pattern shared by every BabelQueue SDK, with
//! one processing list per consumer, heartbeats, crash recovery and a delayed set.
//!
//! | operation | Redis |
//! | --- | --- |
//! | produce | `RPUSH <queue> <element>` — the element IS the envelope, byte for byte |
//! | reserve | `BLMOVE <queue> {<queue>}:processing:<consumer-id> LEFT RIGHT <timeout>` (`LMOVE` for a zero timeout) |
//! | ack | one script: `LREM {<queue>}:processing:<consumer-id> 1 <element>` (+ `HDEL` of its recovery counter when the queue has any) |
//! | settle a batch, refill it | one pipeline: the handed-over store writes, one script acking every element (`LREM` each), one script moving up to `n` messages into the own list (`LRANGE`, `LTRIM`, `RPUSH`) ([`settle_and_reserve`](Transport::settle_and_reserve)) |
//! | requeue | one script: `LREM` own list + `ZADD {<queue>}:delayed <due ms> <token><element>`, or `RPUSH <queue>` when the delay is zero |
//! | promote due | one script: `ZRANGEBYSCORE … LIMIT`, `ZREM`, `RPUSH <queue>` |
//! | heartbeat | one script: `SET {<queue>}:heartbeat:<id> 1 PX <ttl>` + `ZADD {<queue>}:consumers <expiry> <id>` |
//! | recover | one script per consumer whose heartbeat expired: its list back to the head of `<queue>` |
//! | legacy recover | `LMOVE <queue>:processing <queue> RIGHT LEFT` until empty ([`requeue_processing`](Transport::requeue_processing)) |
//!
//! Every key besides `<queue>` is hash-tagged `{<queue>}` (see [`crate::keys`]), so each
//! script touches one Redis Cluster slot.
//!
//! Headers (trace context) travel in a frame `{"__bq_frame":1,"headers":{…},"body":"…"}`
//! only when headers are sent; reserved frames are unwrapped by
//! [`Delivery`](babelqueue_runtime::Delivery).
//!
//! Connections are opened lazily and reopened after a failure: a lost connection is
//! reported as [`TransportError::Connection`] and the next call reconnects (the
//! [`App`](babelqueue_runtime::App) backs off between attempts). Blocking reserves
//! use a connection of their own (one at a time), so a `BLMOVE` never delays publishes
//! and acks. Needs Redis 6.2 or later (`LMOVE` / `BLMOVE`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use babelqueue_core::pipelined::PipelinedWrite;
use babelqueue_runtime::handler::BoxFuture;
use babelqueue_runtime::{
    ConsumerOptions, Delivery, HeldElsewhere, ListMaintenance, Maintenance, QueueDepth, Recovered,
    Republish, Settled, Transport, TransportError,
};
use redis::{Client, RedisError, Value};
use tokio::sync::{Mutex, RwLock};
use tokio::time::Instant;

use crate::conn::{Connector, RedisConnection};
use crate::keys::{
    consumer_processing_list, consumers_registry, delayed_set, heartbeat_key, processing_list,
    recoveries_hash,
};
use crate::scripts;

/// How long a cached "earliest delayed message" stays trusted before it is read again (so a
/// message another consumer delayed is promoted within about this long, even if that
/// consumer died).
const DUE_REFRESH: Duration = Duration::from_secs(1);

/// How many due messages one reserve promotes at most.
const PROMOTE_BATCH: usize = 256;

/// The most messages one batch reserve moves (the script unpacks them into one `RPUSH`,
/// and Lua's stack allows about 8,000).
const MAX_RESERVE_BATCH: usize = 1024;

/// Up to this many free places, a batch refill is one plain `LMOVE` per place; above it,
/// one call of the batch-reserve script (measured on the server: `INFO commandstats`).
const PLAIN_RESERVE_MAX: usize = 8;

/// Messages one worker holds at once by default (see [`Transport::batch_hint`]).
const BATCH_HINT: usize = 16;

fn map_err(e: RedisError) -> TransportError {
    if is_connection_error(&e) {
        TransportError::connection(e)
    } else {
        TransportError::backend(e)
    }
}

fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || e.is_cluster_error()
}

/// Appends the store writes handed over with an ack, each as one command.
fn add_writes(pipe: &mut redis::Pipeline, writes: &[PipelinedWrite]) {
    for w in writes {
        let bytes = w.args().iter().map(Vec::len).sum();
        let mut cmd = redis::Cmd::with_capacity(w.args().len(), bytes);
        for a in w.args() {
            cmd.arg(a.as_slice());
        }
        pipe.add_command(cmd);
    }
}

/// An element's 64-bit digest, for counting what this consumer holds in flight (a
/// collision could only keep an orphan in the own list until a later check; with 64 bits
/// and a few thousand elements in flight, far below one in 10¹² checks). foldhash's quality
/// hasher: a tenth of SipHash's cost on a payment's bytes, on the hot path twice per
/// delivery.
fn digest(element: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0x6261_6265_6c71_7565).hash_one(element)
}

/// A lazily (re)opened connection.
struct Slot {
    conn: Mutex<Option<(u64, RedisConnection)>>,
    generation: AtomicU64,
    response: Option<Duration>,
}

impl Slot {
    fn new(response: Option<Duration>) -> Self {
        Slot {
            conn: Mutex::new(None),
            generation: AtomicU64::new(0),
            response,
        }
    }

    async fn get(
        &self,
        connector: &Connector,
        connect: Duration,
    ) -> Result<(u64, RedisConnection), TransportError> {
        let mut guard = self.conn.lock().await;
        if let Some((generation, conn)) = &*guard {
            return Ok((*generation, conn.clone()));
        }
        let conn = connector
            .connect(connect, self.response)
            .await
            .map_err(TransportError::connection)?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!(generation, "redis transport connected");
        *guard = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// Drops the connection of `generation` (if still current) so the next call reconnects.
    async fn reset(&self, generation: u64) {
        let mut guard = self.conn.lock().await;
        if matches!(&*guard, Some((g, _)) if *g == generation) {
            *guard = None;
        }
    }
}

/// What this consumer knows locally about one queue.
#[derive(Default)]
struct QueueLocal {
    /// Registered in the consumer registry (first reserve or heartbeat done).
    registered: bool,
    /// Elements this consumer holds in flight (digest → count): what its own list should
    /// contain. Anything else there is an orphan (a reserve whose reply was lost).
    in_flight: foldhash::HashMap<u64, usize>,
    /// The own list may hold orphans (start-up, or a reserve failed mid-way).
    check_orphans: bool,
    /// When the earliest delayed message is due, as last read (None: none delayed), and
    /// when that was read.
    earliest_due: Option<Instant>,
    due_read_at: Option<Instant>,
    /// The queue had recovery counters at the last recovery pass.
    recoveries: bool,
}

impl QueueLocal {
    fn new() -> Self {
        QueueLocal {
            check_orphans: true,
            ..Default::default()
        }
    }

    fn hold(&mut self, element: &[u8]) {
        *self.in_flight.entry(digest(element)).or_insert(0) += 1;
    }

    fn release(&mut self, element: &[u8]) {
        let d = digest(element);
        if let Some(n) = self.in_flight.get_mut(&d) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&d);
            }
        }
    }

    /// The cached earliest due time, if the cache is fresh: `Some(None)` = none delayed.
    fn known_due(&self, now: Instant) -> Option<Option<Instant>> {
        match self.due_read_at {
            Some(at) if now.saturating_duration_since(at) < DUE_REFRESH => Some(self.earliest_due),
            _ => None,
        }
    }

    fn set_due(&mut self, now: Instant, ms: i64) {
        self.earliest_due = (ms >= 0).then(|| now + Duration::from_millis(ms as u64));
        self.due_read_at = Some(now);
    }
}

#[derive(Clone)]
struct Settings {
    connector: Connector,
    connect_timeout: Duration,
    response_timeout: Duration,
    consumer_id: String,
    registration_ttl: Duration,
    /// Send acks with the next reserve, and guarded stores' writes with the ack.
    pipelining: bool,
}

struct Inner {
    settings: Settings,
    /// `host:port/db` when pipelining is on and this is one server (not a Cluster).
    server: Option<String>,
    commands: Slot,
    blocking: Slot,
    /// A `BLMOVE` holds its connection: one blocking reserve at a time.
    blocking_turn: Mutex<()>,
    /// Reserves hold it shared; the orphan check holds it exclusively.
    reserve_gate: RwLock<()>,
    /// Serializes the orphan check and recovery (both change the own list).
    own_list: Mutex<()>,
    /// Per queue; looked up several times per batch, so hashed with foldhash.
    queues: std::sync::Mutex<foldhash::HashMap<String, QueueLocal>>,
    /// The background work (heartbeat, recovery, promotion) of each queue this consumer
    /// consumes, from `start_consumer` to `leave`.
    maintenance: std::sync::Mutex<HashMap<String, Maintenance>>,
}

/// A [`Transport`] over Redis lists. One instance is one consumer (clones share it, and
/// its connections): it reserves into its own list `{<queue>}:processing:<consumer-id>`,
/// keeps a heartbeat, and recovers the lists of consumers whose heartbeat expired.
///
/// URLs: `redis://[user][:password@]host[:port][/db]`, and `rediss://` for TLS (feature
/// `rustls`); a Redis Cluster with `open_cluster` (feature `cluster`).
///
/// ```no_run
/// use babelqueue_runtime::App;
/// use babelqueue_redis::RedisTransport;
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let transport = RedisTransport::connect("redis://localhost:6379/0").await?;
/// let app = App::new(transport).queue("payments");
/// app.publish("urn:babel:payments:charge", &serde_json::json!({"amount": 4200})).await?;
/// let stats = app.drain().await?;
/// # Ok(()) }
/// ```
///
/// # Operations are safe to retry
///
/// During a broker outage an ack or requeue may fail after it reached the server (the reply
/// was lost); the runtime retries it after reconnecting. An ack of an element no longer in
/// the own list removes nothing (it was acked). A requeue script adds the new element only
/// when its `LREM` removed the delivery, so a retry adds no second copy. (Limit: if this
/// consumer holds two byte-identical copies at once, a retried ack or requeue may remove the
/// other copy; the message was delivered, it is not lost.) A reserve whose reply was lost
/// leaves an element in the own list no task holds: the next reserve returns such orphans to
/// the head of the queue.
#[derive(Clone)]
pub struct RedisTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTransport")
            .field("server", &self.inner.settings.connector.describe())
            .field("consumer_id", &self.inner.settings.consumer_id)
            .finish_non_exhaustive()
    }
}

impl RedisTransport {
    /// Parses `url` (no connection is opened yet; see [`connect`](Self::connect)).
    /// Connect timeout 5 s, response timeout 10 s, a random (UUID v4) consumer id.
    ///
    /// ```
    /// use babelqueue_redis::RedisTransport;
    /// assert!(RedisTransport::open("redis://:secret@localhost:6379/2").is_ok());
    /// // `rediss://` (TLS) needs the `rustls` feature.
    /// # #[cfg(feature = "rustls")]
    /// assert!(RedisTransport::open("rediss://user:secret@redis.example:6380/0").is_ok());
    /// assert!(RedisTransport::open("http://localhost").is_err());
    /// ```
    pub fn open(url: &str) -> Result<Self, TransportError> {
        let client = Client::open(url).map_err(TransportError::backend)?;
        Ok(Self::from_client(client))
    }

    /// Sets `TCP_NODELAY` on the connections this transport opens (default: off, the
    /// redis crate's default, or the setting of the client given to
    /// [`from_client`](Self::from_client)). Off, Nagle's algorithm merges the small
    /// commands of concurrent workers into fewer packets: measured with `babelqueue-bench`
    /// (Redis on its own core), concurrency 8 ran about 30 % faster with it off, and
    /// concurrency 1 the same either way. No effect on a Cluster transport. Call before
    /// first use.
    ///
    /// ```
    /// use babelqueue_redis::RedisTransport;
    /// let t = RedisTransport::open("redis://localhost")?.tcp_nodelay(true);
    /// # Ok::<(), babelqueue_runtime::TransportError>(())
    /// ```
    #[must_use]
    pub fn tcp_nodelay(self, nodelay: bool) -> Self {
        let mut settings = self.inner.settings.clone();
        match &settings.connector {
            Connector::Single(client) => {
                let info = crate::conn::with_nodelay(client.get_connection_info().clone(), nodelay);
                match Client::open(info) {
                    Ok(client) => settings.connector = Connector::Single(Box::new(client)),
                    // Unreachable: the info came from a client that opened.
                    Err(err) => tracing::warn!(error = %err, "TCP_NODELAY left unchanged"),
                }
            }
            #[cfg(feature = "cluster")]
            Connector::Cluster(_) => {}
        }
        Self::from_settings(settings)
    }

    /// A transport on a [`redis::Client`] you built yourself (a private CA, client
    /// certificates, a custom connection info). No connection is opened yet; timeouts as
    /// for [`open`](Self::open).
    ///
    /// ```
    /// use babelqueue_redis::{RedisTransport, redis};
    /// let client = redis::Client::open("redis://127.0.0.1:6379/0")?;
    /// let transport = RedisTransport::from_client(client).consumer_id("worker-1");
    /// assert_eq!(transport.id(), "worker-1");
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn from_client(client: Client) -> Self {
        Self::from_settings(Settings {
            connector: Connector::Single(Box::new(client)),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            consumer_id: uuid::Uuid::new_v4().simple().to_string(),
            registration_ttl: Duration::from_secs(30),
            pipelining: true,
        })
    }

    /// A transport on a Redis Cluster, reached through any of `nodes` (`redis://host:port`
    /// URLs; the others are discovered). Every key of a queue shares the queue's hash slot,
    /// so every operation runs on the node owning that slot. Queue names must not contain
    /// `{` or `}`. Feature `cluster`.
    ///
    /// ```
    /// use babelqueue_redis::RedisTransport;
    /// assert!(RedisTransport::open_cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]).is_ok());
    /// ```
    #[cfg(feature = "cluster")]
    pub fn open_cluster<I, T>(nodes: I) -> Result<Self, TransportError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        let nodes = nodes
            .into_iter()
            .map(|n| n.into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(TransportError::backend)?;
        if nodes.is_empty() {
            return Err(TransportError::backend(
                "a cluster needs at least one node URL",
            ));
        }
        let mut t = Self::open("redis://127.0.0.1")?;
        let mut settings = t.inner.settings.clone();
        settings.connector = Connector::Cluster(nodes);
        t = Self::from_settings(settings);
        Ok(t)
    }

    /// Parses `url` and checks the server answers `PING`.
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        let t = Self::open(url)?;
        t.ping().await?;
        Ok(t)
    }

    /// Sets the connect and response timeouts (a blocking reserve waits its own timeout
    /// plus `response`). Call before first use.
    #[must_use]
    pub fn timeouts(self, connect: Duration, response: Duration) -> Self {
        let mut settings = self.inner.settings.clone();
        settings.connect_timeout = connect;
        settings.response_timeout = response;
        Self::from_settings(settings)
    }

    /// Sets this consumer's id (default: a random UUID). Ids must be unique among the live
    /// consumers of a queue. A stable id (e.g. a pod name) lets a restarted consumer take
    /// its own list back at once (its first reserve returns what its previous life left
    /// there to the queue) instead of waiting for the heartbeat to expire. Call before
    /// first use.
    ///
    /// ```
    /// use babelqueue_redis::RedisTransport;
    /// let t = RedisTransport::open("redis://localhost")?.consumer_id("worker-1");
    /// assert_eq!(t.id(), "worker-1");
    /// # Ok::<(), babelqueue_runtime::TransportError>(())
    /// ```
    #[must_use]
    pub fn consumer_id(self, id: impl Into<String>) -> Self {
        let mut settings = self.inner.settings.clone();
        settings.consumer_id = id.into();
        Self::from_settings(settings)
    }

    /// The heartbeat TTL written at this consumer's first reserve on a queue, before the
    /// runtime's first [`heartbeat`](babelqueue_runtime::ListMaintenance::heartbeat) (default 30 s). Call before
    /// first use.
    #[must_use]
    pub fn registration_ttl(self, ttl: Duration) -> Self {
        let mut settings = self.inner.settings.clone();
        settings.registration_ttl = ttl;
        Self::from_settings(settings)
    }

    fn is_cluster(&self) -> bool {
        match &self.inner.settings.connector {
            #[cfg(feature = "cluster")]
            Connector::Cluster(_) => true,
            _ => false,
        }
    }

    /// This consumer's id.
    pub fn id(&self) -> &str {
        &self.inner.settings.consumer_id
    }

    /// Whether the consume runtime may save round trips (default `true`): a worker's ack
    /// goes with its next reserve (`LREM` + `LMOVE` in one pipeline), and the guard's
    /// `remember` for a [`RedisStore`](crate::RedisStore) on the same server and database
    /// goes just before that ack (`SET … NX` + `LREM` + `LMOVE`). `false`: every
    /// operation is a round trip of its own, as in earlier releases.
    ///
    /// ```
    /// let t = babelqueue_redis::RedisTransport::open("redis://127.0.0.1:6379/0")?.pipelining(false);
    /// use babelqueue_runtime::Transport;
    /// assert!(!t.combines_ack_and_reserve());
    /// assert_eq!(t.pipeline_server(), None);
    /// # Ok::<(), babelqueue_runtime::TransportError>(())
    /// ```
    #[must_use]
    pub fn pipelining(self, on: bool) -> Self {
        let mut settings = self.inner.settings.clone();
        settings.pipelining = on;
        Self::from_settings(settings)
    }

    fn from_settings(settings: Settings) -> Self {
        let response = settings.response_timeout;
        let server = settings
            .pipelining
            .then(|| settings.connector.server_identity())
            .flatten();
        RedisTransport {
            inner: Arc::new(Inner {
                server,
                settings,
                commands: Slot::new(Some(response)),
                // Blocking commands are bounded per call instead (their own timeout +
                // `response`).
                blocking: Slot::new(None),
                blocking_turn: Mutex::new(()),
                reserve_gate: RwLock::new(()),
                own_list: Mutex::new(()),
                queues: std::sync::Mutex::new(foldhash::HashMap::default()),
                maintenance: std::sync::Mutex::new(HashMap::new()),
            }),
        }
    }

    /// A delayed message was added: the background work looks at the earliest due time.
    fn wake_maintenance(&self, queue: &str) {
        if let Some(m) = self
            .inner
            .maintenance
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(queue)
        {
            m.wake();
        }
    }

    fn local<R>(&self, queue: &str, f: impl FnOnce(&mut QueueLocal) -> R) -> R {
        let mut queues = self
            .inner
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !queues.contains_key(queue) {
            queues.insert(queue.to_owned(), QueueLocal::new());
        }
        f(queues.get_mut(queue).expect("inserted above"))
    }

    fn own_list(&self, queue: &str) -> String {
        consumer_processing_list(queue, self.id())
    }

    async fn conn(&self) -> Result<(u64, RedisConnection), TransportError> {
        self.inner
            .commands
            .get(
                &self.inner.settings.connector,
                self.inner.settings.connect_timeout,
            )
            .await
    }

    async fn after<T>(
        &self,
        generation: u64,
        r: Result<T, RedisError>,
    ) -> Result<T, TransportError> {
        match r {
            Ok(v) => Ok(v),
            Err(e) => {
                if is_connection_error(&e) {
                    self.inner.commands.reset(generation).await;
                }
                Err(map_err(e))
            }
        }
    }

    async fn run<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, TransportError> {
        let (generation, mut conn) = self.conn().await?;
        let r = cmd.query_async::<T>(&mut conn).await;
        self.after(generation, r).await
    }

    async fn script<T: redis::FromRedisValue>(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<T, TransportError> {
        let (generation, mut conn) = self.conn().await?;
        let r = invocation.invoke_async::<T>(&mut conn).await;
        self.after(generation, r).await
    }

    /// `PING`.
    pub async fn ping(&self) -> Result<(), TransportError> {
        self.run::<String>(&redis::cmd("PING")).await.map(drop)
    }

    /// Messages waiting in `queue` (`LLEN <queue>`).
    pub async fn len(&self, queue: &str) -> Result<usize, TransportError> {
        self.run(redis::cmd("LLEN").arg(queue)).await
    }

    /// Messages of `queue` this consumer reserved and did not settle (`LLEN` of its own
    /// list `{<queue>}:processing:<consumer-id>`).
    pub async fn processing_len(&self, queue: &str) -> Result<usize, TransportError> {
        self.run(redis::cmd("LLEN").arg(self.own_list(queue))).await
    }

    /// Messages of `queue` waiting for their delay (`ZCARD {<queue>}:delayed`).
    pub async fn delayed_len(&self, queue: &str) -> Result<usize, TransportError> {
        self.run(redis::cmd("ZCARD").arg(delayed_set(queue))).await
    }

    /// The consumers registered on `queue` (live, or dead and not yet recovered).
    pub async fn consumers(&self, queue: &str) -> Result<Vec<String>, TransportError> {
        self.run(
            redis::cmd("ZRANGE")
                .arg(consumers_registry(queue))
                .arg(0)
                .arg(-1),
        )
        .await
    }

    /// Messages of `queue` in flight at any consumer of this SDK (the sum of the registered
    /// consumers' lists) plus the shared legacy list `<queue>:processing`.
    pub async fn in_flight_len(&self, queue: &str) -> Result<usize, TransportError> {
        let mut total: usize = self
            .run(redis::cmd("LLEN").arg(processing_list(queue)))
            .await?;
        for id in self.consumers(queue).await? {
            total += self
                .run::<usize>(redis::cmd("LLEN").arg(consumer_processing_list(queue, &id)))
                .await?;
        }
        Ok(total)
    }

    async fn register(&self, queue: &str, ttl: Duration) -> Result<(), TransportError> {
        let ms = ttl.as_millis().max(1) as u64;
        let mut s = scripts::HEARTBEAT.prepare_invoke();
        s.key(heartbeat_key(queue, self.id()))
            .key(consumers_registry(queue))
            .arg(self.id())
            .arg(ms);
        self.script::<i64>(s).await?;
        self.local(queue, |q| q.registered = true);
        Ok(())
    }

    /// Promotes due delayed messages when the cache says some are due (or it is stale).
    async fn promote_if_due(&self, queue: &str, limit: usize) -> Result<usize, TransportError> {
        let now = Instant::now();
        if let Some(known) = self.local(queue, |q| q.known_due(now))
            && known.is_none_or(|due| due > now)
        {
            return Ok(0);
        }
        let mut s = scripts::PROMOTE.prepare_invoke();
        s.key(delayed_set(queue)).key(queue).arg(limit.max(1));
        let (moved, next): (usize, i64) = self.script(s).await?;
        self.local(queue, |q| q.set_due(now, next));
        if moved > 0 {
            tracing::debug!(queue, moved, "promoted due delayed messages");
        }
        Ok(moved)
    }

    /// Returns to the queue what the own list holds beyond what this consumer's tasks hold
    /// (a previous life's messages, or a reserve whose reply was lost).
    async fn return_orphans(&self, queue: &str) -> Result<(), TransportError> {
        let _gate = self.inner.reserve_gate.write().await;
        let _own = self.inner.own_list.lock().await;
        if !self.local(queue, |q| q.check_orphans) {
            return Ok(());
        }
        let own = self.own_list(queue);
        let elements: Vec<Vec<u8>> = self
            .run(redis::cmd("LRANGE").arg(&own).arg(0).arg(-1))
            .await?;
        let mut held = self.local(queue, |q| q.in_flight.clone());
        let mut returned = 0;
        // Newest first, each pushed to the head: the oldest ends first.
        for e in elements.into_iter().rev() {
            let d = digest(&e);
            match held.get_mut(&d) {
                Some(n) if *n > 0 => *n -= 1,
                _ => {
                    let mut s = scripts::RETURN_ORPHAN.prepare_invoke();
                    s.key(&own).key(queue).arg(&e);
                    returned += self.script::<usize>(s).await?;
                }
            }
        }
        if returned > 0 {
            tracing::info!(
                queue,
                returned,
                consumer = self.id(),
                "returned messages no task holds from the own processing list to the queue"
            );
        }
        self.local(queue, |q| q.check_orphans = false);
        Ok(())
    }

    async fn reserve_nonblocking(&self, queue: &str) -> Result<Option<Vec<u8>>, TransportError> {
        self.run(
            redis::cmd("LMOVE")
                .arg(queue)
                .arg(self.own_list(queue))
                .arg("LEFT")
                .arg("RIGHT"),
        )
        .await
    }

    async fn reserve_blocking(
        &self,
        queue: &str,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, TransportError> {
        let deadline = Instant::now() + timeout;
        let _turn = self.inner.blocking_turn.lock().await;
        // Waiting for the turn counts against the caller's timeout.
        let timeout = deadline.saturating_duration_since(Instant::now());
        if timeout < Duration::from_millis(1) {
            return self.reserve_nonblocking(queue).await;
        }
        let slot = &self.inner.blocking;
        let (generation, mut conn) = slot
            .get(
                &self.inner.settings.connector,
                self.inner.settings.connect_timeout,
            )
            .await?;
        let mut cmd = redis::cmd("BLMOVE");
        cmd.arg(queue)
            .arg(self.own_list(queue))
            .arg("LEFT")
            .arg("RIGHT")
            .arg(format!("{:.3}", timeout.as_secs_f64()));
        let bound = timeout + self.inner.settings.response_timeout;
        match tokio::time::timeout(bound, cmd.query_async::<Option<Vec<u8>>>(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if is_connection_error(&e) {
                    slot.reset(generation).await;
                }
                Err(map_err(e))
            }
            Err(_) => {
                slot.reset(generation).await;
                Err(TransportError::connection(format!(
                    "BLMOVE got no reply within {bound:?}"
                )))
            }
        }
    }

    /// What comes before a reserve: registration, the orphan check and promotion of due
    /// delayed messages (each a no-op on the hot path).
    async fn before_reserve(&self, queue: &str) -> Result<(), TransportError> {
        let (registered, orphans) = self.local(queue, |q| (q.registered, q.check_orphans));
        if !registered {
            self.register(queue, self.inner.settings.registration_ttl)
                .await?;
        }
        if orphans {
            self.return_orphans(queue).await?;
        }
        self.promote_if_due(queue, PROMOTE_BATCH).await?;
        Ok(())
    }

    /// Store writes, the ack and (with `next`) a non-blocking reserve in one pipeline.
    async fn pipelined_settle(
        &self,
        delivery: &Delivery,
        writes: &[PipelinedWrite],
        next: Option<&str>,
    ) -> Result<Option<Delivery>, TransportError> {
        let queue = delivery.queue();
        if let Some(next) = next {
            self.before_reserve(next).await?;
        }
        let recoveries = self.local(queue, |q| q.recoveries);
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        add_writes(&mut pipe, writes);
        if recoveries {
            // The ack also drops the element's recovery counter: the script, by `EVAL`
            // (in a pipeline, `EVALSHA` cannot fall back to loading it).
            pipe.cmd("EVAL")
                .arg(scripts::ACK_SOURCE)
                .arg(2)
                .arg(self.own_list(queue))
                .arg(recoveries_hash(queue))
                .arg(delivery.element());
        } else {
            pipe.cmd("LREM")
                .arg(self.own_list(queue))
                .arg(1)
                .arg(delivery.element());
        }
        let _gate = match next {
            Some(next) => {
                pipe.cmd("LMOVE")
                    .arg(next)
                    .arg(self.own_list(next))
                    .arg("LEFT")
                    .arg("RIGHT");
                Some(self.inner.reserve_gate.read().await)
            }
            None => None,
        };
        let (generation, mut conn) = self.conn().await?;
        let r = pipe
            .query_async::<Vec<redis::RedisResult<Value>>>(&mut conn)
            .await;
        let replies = match self.after(generation, r).await {
            Ok(replies) => replies,
            Err(e) => {
                if let Some(next) = next
                    && e.is_connection()
                {
                    // The move may have happened without our hearing of it.
                    self.local(next, |q| q.check_orphans = true);
                }
                return Err(e);
            }
        };
        let mut replies = replies.into_iter();
        for w in writes {
            if let Some(Err(e)) = replies.next() {
                tracing::warn!(
                    command = %String::from_utf8_lossy(w.args().first().map_or(&b""[..], |a| a)),
                    error = %e,
                    "a store write sent with the ack failed; a redelivery may run the handler again"
                );
            }
        }
        match replies.next() {
            Some(Ok(Value::Int(0))) => tracing::debug!(
                queue,
                "ack found no such element in the own processing list (already acked, or recovered by another consumer)"
            ),
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                // The reserve after the ack ran too, and its reply is not read: what it
                // moved is found by the orphan check before the next reserve.
                if let Some(next) = next {
                    self.local(next, |q| q.check_orphans = true);
                }
                return Err(map_err(e));
            }
            None => return Err(TransportError::backend("missing reply to the ack")),
        }
        self.local(queue, |q| q.release(delivery.element()));
        let Some(next) = next else {
            return Ok(None);
        };
        match replies.next() {
            Some(Ok(Value::Nil)) | None => Ok(None),
            Some(Ok(Value::BulkString(e))) => {
                self.local(next, |q| q.hold(&e));
                Ok(Some(Delivery::new(next, e, 0)))
            }
            Some(Ok(other)) => Err(TransportError::backend(format!(
                "unexpected reply to LMOVE: {other:?}"
            ))),
            Some(Err(e)) => Err(map_err(e)),
        }
    }

    /// Loads the batch scripts into the server's script cache (`SCRIPT LOAD`).
    async fn load_batch_scripts(&self) -> Result<(), TransportError> {
        for source in [scripts::ACK_MANY_SOURCE, scripts::RESERVE_MANY_SOURCE] {
            let _: String = self
                .run(redis::cmd("SCRIPT").arg("LOAD").arg(source))
                .await?;
        }
        Ok(())
    }

    /// A batch's store writes and acks, then (with `next`) up to `n` messages reserved,
    /// in one pipeline: every settled delivery's writes first (each delivery's before
    /// its ack), then the acks (plain `LREM`s, or one script per queue with recovery
    /// counters), then the refill (plain `LMOVE`s up to `PLAIN_RESERVE_MAX` places, else
    /// one script moving up to `n` messages into the own list).
    async fn settle_many(
        &self,
        settled: &[Settled<'_>],
        next: Option<(&str, usize)>,
    ) -> Result<Vec<Delivery>, TransportError> {
        // `None`: the server did not have the scripts (first use, or it restarted); they
        // did not run and are loaded now, and the store writes are idempotent: once more.
        match self.settle_many_once(settled, next).await? {
            Some(got) => Ok(got),
            None => self
                .settle_many_once(settled, next)
                .await?
                .ok_or_else(|| TransportError::backend("the batch scripts cannot be loaded")),
        }
    }

    /// One try of [`settle_many`](Self::settle_many); `None` when the scripts were missing.
    async fn settle_many_once(
        &self,
        settled: &[Settled<'_>],
        next: Option<(&str, usize)>,
    ) -> Result<Option<Vec<Delivery>>, TransportError> {
        let next = next
            .filter(|(_, n)| *n > 0)
            .map(|(q, n)| (q, n.min(MAX_RESERVE_BATCH)));
        if let Some((queue, _)) = next {
            self.before_reserve(queue).await?;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut writes = 0;
        for s in settled {
            add_writes(&mut pipe, s.writes);
            writes += s.writes.len();
        }
        // Plain commands when they do the whole job: one `LREM` per ack (no queue of the
        // batch has recovery counters to drop) and one `LMOVE` per free place (up to
        // `PLAIN_RESERVE_MAX`). A script call costs the server several times a plain
        // command (setting up the call, copying every body into Lua and back: about 6 us
        // more per call on the project's machine, `INFO commandstats`). Otherwise the
        // batch scripts, as before (a script missing on the server then leaves nothing
        // half done but what the plain commands beside it did).
        // Each queue of the batch (almost always one) and whether it has recovery counters.
        let mut queues: Vec<(&str, bool)> = Vec::new();
        for s in settled {
            let queue = s.delivery.queue();
            if !queues.iter().any(|(q, _)| *q == queue) {
                queues.push((queue, self.local(queue, |q| q.recoveries)));
            }
        }
        let plain = next.is_none_or(|(_, n)| n <= PLAIN_RESERVE_MAX)
            && queues.iter().all(|(_, counters)| !counters);
        // Each queue acked and how many replies its acks give.
        let mut acked: Vec<(&str, usize)> = Vec::with_capacity(queues.len());
        for &(queue, counters) in &queues {
            let mine = settled.iter().filter(|s| s.delivery.queue() == queue);
            let count = mine.clone().count();
            if plain || (count == 1 && !counters) {
                // Plain `LREM`s (one ack without recovery counters always was one), each
                // sized at once (a command grown to fit a body is copied on the way).
                let own = self.own_list(queue);
                for s in mine {
                    let element = s.delivery.element();
                    let mut cmd = redis::Cmd::with_capacity(4, 8 + own.len() + element.len());
                    cmd.arg("LREM").arg(&own).arg(1).arg(element);
                    pipe.add_command(cmd);
                }
                acked.push((queue, count));
                continue;
            }
            // Sized for its elements at once: they are whole bodies, and growing the
            // command to fit them would copy each batch several times over.
            let bytes = mine
                .clone()
                .map(|s| s.delivery.element().len())
                .sum::<usize>();
            let mut cmd = redis::Cmd::with_capacity(5 + count, 160 + 2 * queue.len() + bytes);
            cmd.arg("EVALSHA")
                .arg(scripts::ACK_MANY.get_hash())
                .arg(2)
                .arg(self.own_list(queue))
                .arg(recoveries_hash(queue));
            for s in mine {
                cmd.arg(s.delivery.element());
            }
            pipe.add_command(cmd);
            acked.push((queue, 1));
        }
        // The refill: one reply per plain `LMOVE`, or the script's one.
        let refills = match next {
            Some((queue, n)) if plain || n == 1 => {
                // One `LMOVE` per place, as a one-message worker reserves: each message
                // moves into the own list atomically, in queue order; an empty queue
                // answers nil.
                let own = self.own_list(queue);
                for _ in 0..n {
                    let mut cmd = redis::Cmd::with_capacity(5, 20 + queue.len() + own.len());
                    cmd.arg("LMOVE")
                        .arg(queue)
                        .arg(&own)
                        .arg("LEFT")
                        .arg("RIGHT");
                    pipe.add_command(cmd);
                }
                n
            }
            Some((queue, n)) => {
                pipe.cmd("EVALSHA")
                    .arg(scripts::RESERVE_MANY.get_hash())
                    .arg(2)
                    .arg(queue)
                    .arg(self.own_list(queue))
                    .arg(n);
                1
            }
            None => 0,
        };
        let _gate = match next {
            Some(_) => Some(self.inner.reserve_gate.read().await),
            None => None,
        };
        let (generation, mut conn) = self.conn().await?;
        let r = pipe
            .query_async::<Vec<redis::RedisResult<Value>>>(&mut conn)
            .await;
        let replies = match self.after(generation, r).await {
            Ok(replies) => replies,
            Err(e) => {
                if let Some((queue, _)) = next
                    && e.is_connection()
                {
                    // The move may have happened without our hearing of it.
                    self.local(queue, |q| q.check_orphans = true);
                }
                return Err(e);
            }
        };
        if replies
            .iter()
            .skip(writes)
            .any(|r| matches!(r, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)))
        {
            // The server's script cache is empty (a restart, `SCRIPT FLUSH`): the scripts
            // did not run, so nothing was acked or moved. Load them; the caller acks each
            // delivery on its own, and the next refill finds them. A plain `LMOVE` beside
            // a script did move its message: the orphan check returns it to the queue.
            if let Some((queue, _)) = next {
                self.local(queue, |q| q.check_orphans = true);
            }
            self.load_batch_scripts().await?;
            return Ok(None);
        }
        let mut replies = replies.into_iter();
        for reply in replies.by_ref().take(writes) {
            if let Err(e) = reply {
                tracing::warn!(
                    error = %e,
                    "a store write sent with the ack failed; a redelivery may run the handler again"
                );
            }
        }
        for &(queue, count) in &acked {
            let mut removed = 0i64;
            for _ in 0..count {
                let error = match replies.next() {
                    Some(Ok(Value::Int(n))) => {
                        removed += n;
                        continue;
                    }
                    Some(Ok(other)) => TransportError::backend(format!(
                        "unexpected reply to the batch ack: {other:?}"
                    )),
                    Some(Err(e)) => map_err(e),
                    None => TransportError::backend("missing reply to the batch ack"),
                };
                // The refill after the acks ran too, and its replies are not read: what it
                // moved is found by the orphan check before the next reserve.
                if let Some((queue, _)) = next {
                    self.local(queue, |q| q.check_orphans = true);
                }
                return Err(error);
            }
            let sent = settled.iter().filter(|s| s.delivery.queue() == queue);
            let count = sent.clone().count();
            if usize::try_from(removed).unwrap_or(0) < count {
                tracing::debug!(
                    queue,
                    acked = count,
                    removed,
                    "some acked elements were not in the own processing list (already acked, or recovered by another consumer)"
                );
            }
            self.local(queue, |q| {
                for s in sent {
                    q.release(s.delivery.element());
                }
            });
        }
        let Some((queue, n)) = next else {
            return Ok(Some(Vec::new()));
        };
        let mut got = Vec::with_capacity(n);
        for _ in 0..refills {
            match replies.next() {
                // A plain `LMOVE`'s element, or nil when the queue was empty.
                Some(Ok(Value::BulkString(e))) => got.push(e),
                Some(Ok(Value::Nil)) => {}
                // The script's elements.
                Some(Ok(Value::Array(elements))) => {
                    for e in elements {
                        match e {
                            Value::BulkString(e) => got.push(e),
                            other => {
                                self.local(queue, |q| {
                                    q.check_orphans = true;
                                    for e in &got {
                                        q.hold(e);
                                    }
                                });
                                return Err(TransportError::backend(format!(
                                    "unexpected element in the batch reserve's reply: {other:?}"
                                )));
                            }
                        }
                    }
                }
                other => {
                    // What was moved before it is held (and handled: the orphan check
                    // returns anything else to the queue).
                    self.local(queue, |q| {
                        q.check_orphans = true;
                        for e in &got {
                            q.hold(e);
                        }
                    });
                    return Err(match other {
                        Some(Err(e)) => map_err(e),
                        Some(Ok(other)) => TransportError::backend(format!(
                            "unexpected reply to the batch reserve: {other:?}"
                        )),
                        None => TransportError::backend("missing reply to the batch reserve"),
                    });
                }
            }
        }
        self.local(queue, |q| {
            for e in &got {
                q.hold(e);
            }
        });
        Ok(Some(
            got.into_iter()
                .map(|e| Delivery::new(queue, e, 0))
                .collect(),
        ))
    }

    /// Reserves, waiting up to `timeout`: a wait cut short to promote a delayed message
    /// that the server's clock did not yet see as due goes on until the deadline.
    async fn reserve_inner(
        &self,
        queue: &str,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, TransportError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let got = self.reserve_once(queue, left).await?;
            if got.is_some()
                || deadline.saturating_duration_since(Instant::now()) < Duration::from_millis(1)
            {
                return Ok(got);
            }
        }
    }

    async fn reserve_once(
        &self,
        queue: &str,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, TransportError> {
        self.before_reserve(queue).await?;
        // Wake up when the earliest delayed message is due, to promote it.
        let now = Instant::now();
        let timeout = match self.local(queue, |q| q.known_due(now)).flatten() {
            Some(due) => timeout.min(due.saturating_duration_since(now) + Duration::from_millis(1)),
            None => timeout.min(DUE_REFRESH),
        };
        let gate = self.inner.reserve_gate.read().await;
        // BLMOVE's timeout has millisecond resolution and 0 means "forever".
        let r = if timeout < Duration::from_millis(1) {
            self.reserve_nonblocking(queue).await
        } else {
            self.reserve_blocking(queue, timeout).await
        };
        match r {
            Ok(Some(e)) => {
                self.local(queue, |q| q.hold(&e));
                Ok(Some(e))
            }
            Ok(None) => {
                drop(gate);
                // Something may have become due while we waited.
                if self.promote_if_due(queue, PROMOTE_BATCH).await? > 0 {
                    let _gate = self.inner.reserve_gate.read().await;
                    if let Some(e) = self.reserve_nonblocking(queue).await? {
                        self.local(queue, |q| q.hold(&e));
                        return Ok(Some(e));
                    }
                }
                Ok(None)
            }
            Err(e) => {
                // The move may have happened without our hearing of it.
                if e.is_connection() {
                    self.local(queue, |q| q.check_orphans = true);
                }
                Err(e)
            }
        }
    }

    async fn recover_one(
        &self,
        queue: &str,
        dead: &str,
        max_recoveries: u32,
    ) -> Result<Option<(usize, Vec<Vec<u8>>)>, TransportError> {
        let mut s = scripts::RECOVER.prepare_invoke();
        s.key(queue)
            .key(consumer_processing_list(queue, dead))
            .key(heartbeat_key(queue, dead))
            .key(consumers_registry(queue))
            .key(recoveries_hash(queue))
            .key(self.own_list(queue))
            .arg(dead)
            .arg(max_recoveries);
        let reply: Vec<Value> = self.script(s).await?;
        let mut it = reply.into_iter();
        let requeued = match it.next() {
            Some(Value::Int(n)) if n < 0 => return Ok(None),
            Some(Value::Int(n)) => n as usize,
            other => {
                return Err(TransportError::backend(format!(
                    "unexpected reply from the recovery script: {other:?}"
                )));
            }
        };
        let exhausted = it
            .map(|v| match v {
                Value::BulkString(b) => Ok(b),
                other => Err(TransportError::backend(format!(
                    "unexpected element from the recovery script: {other:?}"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some((requeued, exhausted)))
    }
}

/// The Redis transport's own background work (see [`Maintenance`]): its heartbeat key
/// `{<queue>}:consumer:<id>` and registry, and the recovery of dead consumers' lists.
impl ListMaintenance for RedisTransport {
    fn heartbeat<'a>(
        &'a self,
        queue: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move { self.register(queue, ttl).await })
    }

    fn recover<'a>(
        &'a self,
        queue: &'a str,
        max_recoveries: u32,
    ) -> BoxFuture<'a, Result<Recovered, TransportError>> {
        Box::pin(async move {
            let mut s = scripts::EXPIRED.prepare_invoke();
            s.key(consumers_registry(queue)).key(recoveries_hash(queue));
            let reply: Vec<Value> = self.script(s).await?;
            let mut it = reply.into_iter();
            let counters = matches!(it.next(), Some(Value::Int(n)) if n > 0);
            let candidates: Vec<String> = it
                .filter_map(|v| match v {
                    Value::BulkString(b) => String::from_utf8(b).ok(),
                    _ => None,
                })
                .filter(|id| id != self.id())
                .collect();
            let mut requeued = 0;
            let mut exhausted = Vec::new();
            let _own = self.inner.own_list.lock().await;
            for id in candidates {
                if let Some((n, ex)) = self.recover_one(queue, &id, max_recoveries).await? {
                    if n > 0 || !ex.is_empty() {
                        tracing::warn!(
                            queue,
                            dead_consumer = %id,
                            requeued = n,
                            exhausted = ex.len(),
                            "recovered the messages of a consumer whose heartbeat expired"
                        );
                    }
                    requeued += n;
                    exhausted.extend(ex);
                }
            }
            self.local(queue, |q| {
                q.recoveries = counters || requeued > 0;
                for e in &exhausted {
                    q.hold(e);
                }
            });
            let exhausted = exhausted
                .into_iter()
                .map(|e| Delivery::new(queue, e, 0))
                .collect();
            Ok(Recovered::new(requeued, exhausted))
        })
    }
}

impl Transport for RedisTransport {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.run::<i64>(redis::cmd("RPUSH").arg(queue).arg(element))
                .await
                .map(drop)
        })
    }

    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        Box::pin(async move {
            let element = self.reserve_inner(queue, timeout).await?;
            Ok(element.map(|e| Delivery::new(queue, e, 0)))
        })
    }

    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let queue = delivery.queue();
            let removed: i64 = if self.local(queue, |q| q.recoveries) {
                let mut s = scripts::ACK.prepare_invoke();
                s.key(self.own_list(queue))
                    .key(recoveries_hash(queue))
                    .arg(delivery.element());
                self.script(s).await?
            } else {
                self.run(
                    redis::cmd("LREM")
                        .arg(self.own_list(queue))
                        .arg(1)
                        .arg(delivery.element()),
                )
                .await?
            };
            self.local(queue, |q| q.release(delivery.element()));
            if removed == 0 {
                tracing::debug!(
                    queue,
                    "ack found no such element in the own processing list (already acked, or recovered by another consumer)"
                );
            }
            Ok(())
        })
    }

    fn pipeline_server(&self) -> Option<&str> {
        self.inner.server.as_deref()
    }

    fn combines_ack_and_reserve(&self) -> bool {
        self.inner.settings.pipelining && !self.is_cluster()
    }

    fn ack_and_reserve<'a>(
        &'a self,
        delivery: &'a Delivery,
        writes: &'a [PipelinedWrite],
        next: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        Box::pin(async move {
            if !writes.is_empty() && self.pipeline_server().is_none() {
                return Err(TransportError::Unsupported("pipelined writes"));
            }
            if let Some(queue) = next
                && !self.combines_ack_and_reserve()
            {
                self.pipelined_settle(delivery, writes, None).await?;
                return self.reserve(queue, Duration::ZERO).await;
            }
            self.pipelined_settle(delivery, writes, next).await
        })
    }

    fn batch_hint(&self) -> usize {
        if self.inner.settings.pipelining {
            BATCH_HINT
        } else {
            1
        }
    }

    fn settle_and_reserve<'a>(
        &'a self,
        settled: &'a [Settled<'a>],
        next: Option<(&'a str, usize)>,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            if settled.iter().any(|s| !s.writes.is_empty()) && self.pipeline_server().is_none() {
                return Err(TransportError::Unsupported("pipelined writes"));
            }
            if self.is_cluster() && !settled.is_empty() && next.is_some() {
                // A Cluster's pipeline is not sent as one: settle, then reserve.
                self.settle_many(settled, None).await?;
                return self.settle_many(&[], next).await;
            }
            self.settle_many(settled, next).await
        })
    }

    fn apply_writes<'a>(
        &'a self,
        writes: &'a [PipelinedWrite],
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if writes.is_empty() {
                return Ok(());
            }
            if self.pipeline_server().is_none() {
                return Err(TransportError::Unsupported("pipelined writes"));
            }
            let mut pipe = redis::pipe();
            add_writes(&mut pipe, writes);
            let (generation, mut conn) = self.conn().await?;
            let r = pipe.query_async::<()>(&mut conn).await;
            self.after(generation, r).await
        })
    }

    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        republish: Republish,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let element = republish.element(delivery)?;
            let queue = delivery.queue();
            let now = Instant::now();
            let ms = if delay.is_zero() {
                0
            } else {
                delay.as_millis().max(1) as u64
            };
            // A token per message keeps byte-identical delayed messages apart in the set.
            let token = uuid::Uuid::new_v4().simple().to_string();
            let mut s = scripts::REQUEUE.prepare_invoke();
            s.key(self.own_list(queue))
                .key(queue)
                .key(delayed_set(queue))
                .key(recoveries_hash(queue))
                .arg(delivery.element())
                .arg(element)
                .arg(ms)
                .arg(token);
            let (removed, next): (i64, i64) = self.script(s).await?;
            self.local(queue, |q| {
                q.release(delivery.element());
                if removed > 0 && ms > 0 {
                    q.set_due(now, next);
                }
            });
            if removed > 0 && ms > 0 {
                self.wake_maintenance(queue);
            }
            if removed == 0 {
                tracing::debug!(
                    queue,
                    "requeue found no such element in the own processing list (already settled, or recovered by another consumer)"
                );
            }
            Ok(())
        })
    }

    fn promote_due<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move { self.promote_if_due(queue, limit).await })
    }

    fn next_due<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Option<Duration>, TransportError>> {
        Box::pin(async move {
            let now = Instant::now();
            let due = match self.local(queue, |q| q.known_due(now)) {
                Some(known) => known,
                None => {
                    let mut s = scripts::NEXT_DUE.prepare_invoke();
                    s.key(delayed_set(queue));
                    let ms: i64 = self.script(s).await?;
                    self.local(queue, |q| q.set_due(now, ms));
                    self.local(queue, |q| q.earliest_due)
                }
            };
            Ok(due.map(|d| d.saturating_duration_since(now)))
        })
    }

    fn start_consumer<'a>(
        &'a self,
        queue: &'a str,
        options: &'a ConsumerOptions,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let m = Maintenance::start(self.clone(), queue, options).await;
            let old = self
                .inner
                .maintenance
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(queue.to_owned(), m);
            if let Some(old) = old {
                old.stop().await;
            }
            Ok(())
        })
    }

    /// `LLEN <queue>`, `ZCARD {<queue>}:delayed`, and the in-flight messages of every
    /// registered consumer plus the legacy `<queue>:processing` (see
    /// [`in_flight_len`](RedisTransport::in_flight_len)). Sampled by the App's maintenance
    /// task for the `babelqueue_queue_depth` gauge, never per message.
    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueDepth, TransportError>> {
        Box::pin(async move {
            let ready = self.len(queue).await?;
            let delayed = self.delayed_len(queue).await?;
            let in_flight = self.in_flight_len(queue).await?;
            Ok(QueueDepth::new(
                ready as u64,
                delayed as u64,
                in_flight as u64,
            ))
        })
    }

    fn held_elsewhere<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Vec<HeldElsewhere>, TransportError>> {
        Box::pin(async move {
            let mut s = scripts::REGISTRY.prepare_invoke();
            s.key(consumers_registry(queue));
            let reply: Vec<Value> = self.script(s).await?;
            let mut it = reply.into_iter();
            let int = |v: Option<Value>| match v {
                Some(Value::Int(n)) => Some(n),
                _ => None,
            };
            let Some(now) = int(it.next()) else {
                return Err(TransportError::backend(
                    "unexpected reply of the registry script",
                ));
            };
            let mut held = Vec::new();
            while let (Some(id), expiry) = (it.next(), int(it.next())) {
                let Value::BulkString(id) = id else { continue };
                let Ok(id) = String::from_utf8(id) else {
                    continue;
                };
                if id == self.id() {
                    continue;
                }
                let n: u64 = self
                    .run(redis::cmd("LLEN").arg(consumer_processing_list(queue, &id)))
                    .await?;
                if n > 0 {
                    let left = expiry.unwrap_or(0).saturating_sub(now).max(0);
                    held.push(HeldElsewhere::new(
                        id,
                        n,
                        Duration::from_millis(u64::try_from(left).unwrap_or(0)),
                    ));
                }
            }
            Ok(held)
        })
    }

    fn leave<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let m = self
                .inner
                .maintenance
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(queue);
            if let Some(m) = m {
                m.stop().await;
            }
            let mut s = scripts::LEAVE.prepare_invoke();
            s.key(heartbeat_key(queue, self.id()))
                .key(consumers_registry(queue))
                .key(self.own_list(queue))
                .arg(self.id());
            let left: usize = self.script(s).await?;
            self.local(queue, |q| q.registered = false);
            if left > 0 {
                tracing::info!(
                    queue,
                    left,
                    "left with messages in flight: the other consumers recover them"
                );
            }
            Ok(())
        })
    }

    fn requeue_processing<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        Box::pin(async move {
            let mut moved = 0;
            if self.is_cluster() {
                // `<queue>:processing` has no hash tag: on a Cluster it is in another slot
                // than `<queue>`, so no single command moves between them. Copy, then
                // remove: a crash in between leaves a duplicate, never a loss.
                loop {
                    let element: Option<Vec<u8>> = self
                        .run(redis::cmd("LINDEX").arg(processing_list(queue)).arg(-1))
                        .await?;
                    let Some(element) = element else { break };
                    self.run::<i64>(redis::cmd("LPUSH").arg(queue).arg(&element))
                        .await?;
                    self.run::<i64>(
                        redis::cmd("LREM")
                            .arg(processing_list(queue))
                            .arg(-1)
                            .arg(&element),
                    )
                    .await?;
                    moved += 1;
                }
                return Ok(moved);
            }
            loop {
                // Newest reservation first, each pushed to the head: the oldest ends first.
                let element: Option<Vec<u8>> = self
                    .run(
                        redis::cmd("LMOVE")
                            .arg(processing_list(queue))
                            .arg(queue)
                            .arg("RIGHT")
                            .arg("LEFT"),
                    )
                    .await?;
                if element.is_none() {
                    break;
                }
                moved += 1;
            }
            if moved > 0 {
                tracing::info!(
                    queue,
                    moved,
                    "requeued messages stranded in the shared processing list"
                );
            }
            Ok(moved)
        })
    }
}
