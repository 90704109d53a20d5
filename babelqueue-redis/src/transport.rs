//! [`RedisTransport`]: the reliable-queue list pattern shared by every BabelQueue SDK
//! (SPEC section 5).
//!
//! | operation | command |
//! | --- | --- |
//! | produce | `RPUSH <queue> <element>` — the element IS the envelope, byte for byte |
//! | reserve | `BLMOVE <queue> <queue>:processing LEFT RIGHT <timeout>` (`LMOVE` for a zero timeout) |
//! | ack | `LREM <queue>:processing 1 <exact element>` |
//! | recover | `LMOVE <queue>:processing <queue> RIGHT LEFT` until empty ([`requeue_processing`](babelqueue_core::runtime::Transport::requeue_processing)) |
//!
//! Headers (trace context) travel in a frame `{"__bq_frame":1,"headers":{…},"body":"…"}`
//! only when headers are sent; reserved frames are unwrapped by
//! [`Delivery`](babelqueue_core::runtime::Delivery).
//!
//! Connections are opened lazily and reopened after a failure: a lost connection is
//! reported as [`TransportError::Connection`] and the next call reconnects (the
//! [`App`](babelqueue_core::runtime::App) backs off between attempts). Blocking reserves
//! use a connection of their own (one at a time), so a `BLMOVE` never delays publishes
//! and acks. Needs Redis 6.2 or later (`LMOVE` / `BLMOVE`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use babelqueue_core::handler::BoxFuture;
use babelqueue_core::runtime::{Delivery, Transport, TransportError};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError};
use tokio::sync::Mutex;

/// The processing list of `queue`: `<queue>:processing`.
///
/// ```
/// assert_eq!(babelqueue_redis::processing_list("payments"), "payments:processing");
/// ```
pub fn processing_list(queue: &str) -> String {
    format!("{queue}:processing")
}

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
}

/// A lazily (re)opened multiplexed connection.
struct Slot {
    conn: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    config: AsyncConnectionConfig,
}

impl Slot {
    fn new(config: AsyncConnectionConfig) -> Self {
        Slot {
            conn: Mutex::new(None),
            generation: AtomicU64::new(0),
            config,
        }
    }

    async fn get(&self, client: &Client) -> Result<(u64, MultiplexedConnection), TransportError> {
        let mut guard = self.conn.lock().await;
        if let Some((generation, conn)) = &*guard {
            return Ok((*generation, conn.clone()));
        }
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
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

struct Inner {
    client: Client,
    commands: Slot,
    blocking: Slot,
    /// A `BLMOVE` holds its connection: one blocking reserve at a time.
    blocking_turn: Mutex<()>,
    response_timeout: Duration,
}

/// A [`Transport`] over Redis lists (SPEC section 5). Cheap to clone; clones share the
/// connections.
///
/// URLs: `redis://[user][:password@]host[:port][/db]`, and `rediss://` for TLS (feature `rustls`).
///
/// ```no_run
/// use babelqueue_core::runtime::App;
/// use babelqueue_redis::RedisTransport;
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let transport = RedisTransport::connect("redis://localhost:6379/0").await?;
/// let app = App::new(transport).queue("payments");
/// app.publish("urn:babel:payments:charge", &serde_json::json!({"amount": 4200})).await?;
/// let stats = app.drain().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let info = self.inner.client.get_connection_info();
        f.debug_struct("RedisTransport")
            .field("addr", info.addr())
            .field("db", &info.redis_settings().db())
            .finish_non_exhaustive()
    }
}

impl RedisTransport {
    /// Parses `url` (no connection is opened yet; see [`connect`](Self::connect)).
    /// Connect timeout 5 s, response timeout 10 s.
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
        Ok(Self::with_client(
            client,
            Duration::from_secs(5),
            Duration::from_secs(10),
        ))
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
        Self::with_client(self.inner.client.clone(), connect, response)
    }

    fn with_client(client: Client, connect: Duration, response: Duration) -> Self {
        let commands = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(response));
        // Blocking commands are bounded per call instead (their own timeout + `response`).
        // (redis 1.x defaults to a 500 ms response timeout, which would cut a blocking
        // reserve short.)
        let blocking = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(None);
        RedisTransport {
            inner: Arc::new(Inner {
                client,
                commands: Slot::new(commands),
                blocking: Slot::new(blocking),
                blocking_turn: Mutex::new(()),
                response_timeout: response,
            }),
        }
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        slot: &Slot,
        cmd: &redis::Cmd,
    ) -> Result<T, TransportError> {
        let (generation, mut conn) = slot.get(&self.inner.client).await?;
        match cmd.query_async::<T>(&mut conn).await {
            Ok(v) => Ok(v),
            Err(e) => {
                if is_connection_error(&e) {
                    slot.reset(generation).await;
                }
                Err(map_err(e))
            }
        }
    }

    /// `PING`.
    pub async fn ping(&self) -> Result<(), TransportError> {
        self.run::<String>(&self.inner.commands, &redis::cmd("PING"))
            .await
            .map(drop)
    }

    /// Messages waiting in `queue` (`LLEN <queue>`).
    pub async fn len(&self, queue: &str) -> Result<usize, TransportError> {
        self.run(&self.inner.commands, redis::cmd("LLEN").arg(queue))
            .await
    }

    /// Messages of `queue` reserved and not acked (`LLEN <queue>:processing`).
    pub async fn processing_len(&self, queue: &str) -> Result<usize, TransportError> {
        self.run(
            &self.inner.commands,
            redis::cmd("LLEN").arg(processing_list(queue)),
        )
        .await
    }

    async fn reserve_nonblocking(&self, queue: &str) -> Result<Option<Vec<u8>>, TransportError> {
        self.run(
            &self.inner.commands,
            redis::cmd("LMOVE")
                .arg(queue)
                .arg(processing_list(queue))
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
        let deadline = tokio::time::Instant::now() + timeout;
        let _turn = self.inner.blocking_turn.lock().await;
        // Waiting for the turn counts against the caller's timeout.
        let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
        if timeout < Duration::from_millis(1) {
            return self.reserve_nonblocking(queue).await;
        }
        let slot = &self.inner.blocking;
        let (generation, mut conn) = slot.get(&self.inner.client).await?;
        let mut cmd = redis::cmd("BLMOVE");
        cmd.arg(queue)
            .arg(processing_list(queue))
            .arg("LEFT")
            .arg("RIGHT")
            .arg(format!("{:.3}", timeout.as_secs_f64()));
        let bound = timeout + self.inner.response_timeout;
        match tokio::time::timeout(bound, cmd.query_async::<Option<Vec<u8>>>(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if is_connection_error(&e) {
                    slot.reset(generation).await;
                }
                Err(map_err(e))
            }
            Err(_) => {
                // No answer in time: the connection is presumed dead. If the server did
                // move an element, it waits in the processing list (requeue_processing).
                slot.reset(generation).await;
                Err(TransportError::connection(format!(
                    "BLMOVE got no reply within {bound:?}"
                )))
            }
        }
    }
}

impl Transport for RedisTransport {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.run::<i64>(
                &self.inner.commands,
                redis::cmd("RPUSH").arg(queue).arg(element),
            )
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
            // BLMOVE's timeout has millisecond resolution and 0 means "forever".
            let element = if timeout < Duration::from_millis(1) {
                self.reserve_nonblocking(queue).await?
            } else {
                self.reserve_blocking(queue, timeout).await?
            };
            Ok(element.map(|e| Delivery::new(queue, e, 0)))
        })
    }

    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let removed: i64 = self
                .run(
                    &self.inner.commands,
                    redis::cmd("LREM")
                        .arg(processing_list(delivery.queue()))
                        .arg(1)
                        .arg(delivery.element()),
                )
                .await?;
            if removed == 0 {
                tracing::warn!(
                    queue = delivery.queue(),
                    "ack found no such element in the processing list (already acked or requeued)"
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
            loop {
                // Newest reservation first, each pushed to the head: the oldest ends first.
                let element: Option<Vec<u8>> = self
                    .run(
                        &self.inner.commands,
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
                    "requeued messages stranded in the processing list"
                );
            }
            Ok(moved)
        })
    }
}
