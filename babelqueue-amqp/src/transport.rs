//! [`AmqpTransport`]: the runtime's [`Transport`] on RabbitMQ (AMQP 0-9-1), on `lapin`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use babelqueue_runtime::handler::BoxFuture;
use babelqueue_runtime::{
    ConsumerOptions, Delivery, Headers, QueueDepth, Republish, Transport, TransportError,
};
use futures_core::Stream;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use tokio::time::Instant;

use crate::acks::{AckBook, Frame};
use crate::headers::out_of_band;
use crate::names::{delay_bucket, delay_queue, delay_queue_expires, delay_queue_redeclare_after};
use crate::projection::properties;

/// Bits of a [`Delivery::tag`] that hold the AMQP delivery tag; the bits above hold the
/// id of the consumer channel that delivered it (an ack goes to that channel or nowhere).
const TAG_BITS: u32 = 40;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;

/// The prefetch (`basic.qos`) of a consumer an `App` starts, per worker of its
/// concurrency: one message being handled and one waiting behind it in the client, so
/// that an ack is not followed by a broker round trip before the next message. At most
/// `concurrency` messages are handled at once whatever the prefetch; the rest of the
/// window waits in the client (a crash or a shutdown puts it back on the queue, unacked).
/// [`AmqpTransport::with_prefetch`] sets a fixed prefetch instead.
pub const PREFETCH_PER_WORKER: u16 = 2;

/// How long opening a connection may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a zero-timeout reserve waits for the next delivery while the consumer's stream
/// is active (it delivered since its last wait ran out). A broker pushes deliveries: an
/// empty stash right after an ack usually means the next message is a round trip away, not
/// that the queue is empty (on Redis a zero-timeout reserve is that round trip). Once such
/// a wait runs out the stream counts as quiet, and zero-timeout reserves return at once
/// until it delivers again, so a drain's end costs one wait, not one per reserve.
const ACTIVE_GRACE: Duration = Duration::from_millis(10);

/// The longest [`Transport::next_due`] answers while a delay queue holds messages: the
/// drain looks again at least this often.
const DUE_POLL: Duration = Duration::from_millis(200);

/// A [`Delivery::tag`]: the consumer channel's id above [`TAG_BITS`], the AMQP delivery
/// tag below (a channel would need 2⁴⁰ deliveries to reach the id's bits).
fn pack_tag(consumer: u64, delivery_tag: u64) -> u64 {
    (consumer << TAG_BITS) | (delivery_tag & TAG_MASK)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Maps a client error: a channel-level refusal of the broker (`PRECONDITION_FAILED`,
/// `NOT_FOUND`, `ACCESS_REFUSED`, …) is [`TransportError::Backend`]; anything else (the
/// socket, a connection-level error, a channel or connection that is gone) is
/// [`TransportError::Connection`], and the next call reopens what was lost.
fn map_err(e: lapin::Error) -> TransportError {
    if e.is_amqp_soft_error() {
        TransportError::backend(e)
    } else {
        TransportError::connection(e)
    }
}

fn is_not_found(e: &lapin::Error) -> bool {
    matches!(e.kind(), ErrorKind::ProtocolError(p) if p.kind() == &AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
}

/// A name the broker accepts (a short string: at most 255 bytes).
fn short(name: &str) -> Result<ShortString, TransportError> {
    ShortString::try_new(name).map_err(|e| {
        TransportError::backend(format!(
            "`{}…` is not a valid AMQP name: {e}",
            name.chars().take(40).collect::<String>()
        ))
    })
}

/// Polls `stream` once without waiting.
fn poll_now<S: Stream + Unpin>(stream: &mut S) -> Poll<Option<S::Item>> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    Pin::new(stream).poll_next(&mut cx)
}

/// The next item of `stream`.
fn next<S: Stream + Unpin>(stream: &mut S) -> impl Future<Output = Option<S::Item>> + '_ {
    std::future::poll_fn(move |cx| Pin::new(&mut *stream).poll_next(cx))
}

/// What a consumer of one queue holds: its channel, its stream of deliveries and the
/// deliveries taken from the stream ahead of a reserve.
struct Consume {
    /// Unique among the consumer channels of this transport: the high bits of the tags.
    id: u64,
    channel: Channel,
    tag: ShortString,
    prefetch: Mutex<u16>,
    stream: tokio::sync::Mutex<Stash>,
    /// Taken by a reserve and not settled yet.
    outstanding: AtomicU64,
    /// The stream delivered nothing within [`ACTIVE_GRACE`] of the last zero-timeout
    /// reserve that waited (reset by every delivery).
    quiet: AtomicBool,
    /// The acks asked for and what has been sent ([`crate::acks`]).
    acks: Mutex<AckBook>,
    /// Held by whoever sends the book's frames, so they leave in the order planned.
    sending: tokio::sync::Mutex<()>,
}

impl Consume {
    /// Acks the delivery of AMQP tag `tag`: sent now, coalesced with the acks sent with
    /// it, or (above a gap, within the book's hold) left to ride with the multiple ack
    /// that closes the gap.
    async fn ack(&self, tag: u64) -> Result<(), TransportError> {
        lock(&self.acks).owe(tag);
        self.send_acks().await
    }

    /// `tag` was rejected by a frame of its own: the floor may now move over it.
    async fn rejected(&self, tag: u64) -> Result<(), TransportError> {
        lock(&self.acks).settled(tag);
        self.send_acks().await
    }

    /// Sends what the book has ready. When another caller is sending, it sends ours
    /// too (it plans again until nothing is ready, and looks once more after it lets go).
    async fn send_acks(&self) -> Result<(), TransportError> {
        loop {
            let Ok(sending) = self.sending.try_lock() else {
                return Ok(());
            };
            loop {
                let frames = lock(&self.acks).plan(false);
                if frames.is_empty() {
                    break;
                }
                self.send(frames).await?;
            }
            drop(sending);
            // An ack owed after the last plan, by a caller that found `sending` held.
            if !lock(&self.acks).ready(false) {
                return Ok(());
            }
        }
    }

    /// Sends every owed ack (the consumer stops): what waits above a gap goes singly.
    async fn flush_acks(&self) -> Result<(), TransportError> {
        let _sending = self.sending.lock().await;
        loop {
            let frames = lock(&self.acks).plan(true);
            if frames.is_empty() {
                return Ok(());
            }
            self.send(frames).await?;
        }
    }

    async fn send(&self, frames: Vec<Frame>) -> Result<(), TransportError> {
        for frame in frames {
            let (tag, multiple) = match frame {
                Frame::UpTo(tag) => (tag, true),
                Frame::One(tag) => (tag, false),
            };
            self.channel
                .basic_ack(tag, BasicAckOptions { multiple })
                .await
                .map_err(map_err)?;
        }
        Ok(())
    }
}

struct Stash {
    consumer: lapin::Consumer,
    ahead: std::collections::VecDeque<lapin::message::Delivery>,
    /// The stream ended (the channel closed, or the broker cancelled the consumer).
    ended: Option<String>,
}

impl Stash {
    /// Moves what the stream has ready into `ahead`, without waiting.
    fn fill(&mut self) {
        while self.ended.is_none() {
            match poll_now(&mut self.consumer) {
                Poll::Ready(Some(Ok(d))) => self.ahead.push_back(d),
                Poll::Ready(Some(Err(e))) => self.ended = Some(e.to_string()),
                Poll::Ready(None) => self.ended = Some("the broker cancelled the consumer".into()),
                Poll::Pending => break,
            }
        }
    }
}

/// The consumer of `queue` in `consumers`, if its channel is open.
fn live(consumers: &Mutex<HashMap<String, Arc<Consume>>>, queue: &str) -> Option<Arc<Consume>> {
    lock(consumers)
        .get(queue)
        .filter(|c| c.channel.status().connected())
        .cloned()
}

/// One connection and what lives on it.
struct Conn {
    connection: Connection,
    /// Publishes, in confirm mode.
    publisher: tokio::sync::Mutex<Channel>,
    /// Declarations and passive declarations (a refusal closes it; it is reopened).
    topology: tokio::sync::Mutex<Channel>,
    /// Queues declared on this connection, and when.
    declared: Mutex<HashMap<String, Instant>>,
    consumers: Mutex<HashMap<String, Arc<Consume>>>,
    /// Serializes starting consumers (a start declares and opens a channel).
    starting: tokio::sync::Mutex<()>,
}

impl Conn {
    fn alive(&self) -> bool {
        self.connection.status().connected()
    }

    async fn open_channel(&self, confirm: bool) -> Result<Channel, TransportError> {
        let ch = self.connection.create_channel().await.map_err(map_err)?;
        if confirm {
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(map_err)?;
        }
        Ok(ch)
    }

    async fn publisher(&self) -> Result<Channel, TransportError> {
        let mut ch = self.publisher.lock().await;
        if !ch.status().connected() {
            *ch = self.open_channel(true).await?;
        }
        Ok(ch.clone())
    }

    async fn topology(&self) -> Result<tokio::sync::MutexGuard<'_, Channel>, TransportError> {
        let mut ch = self.topology.lock().await;
        if !ch.status().connected() {
            *ch = self.open_channel(false).await?;
        }
        Ok(ch)
    }

    fn forget(&self, queue: &str) {
        lock(&self.declared).remove(queue);
    }

    /// Declares `queue` as the family does (durable, no arguments), once per connection.
    async fn declare(&self, queue: &str) -> Result<(), TransportError> {
        if lock(&self.declared).contains_key(queue) {
            return Ok(());
        }
        let name = short(queue)?;
        let ch = self.topology().await?;
        ch.queue_declare(name, QueueDeclareOptions::durable(), FieldTable::default())
            .await
            .map_err(|e| refused(queue, e))?;
        lock(&self.declared).insert(queue.to_owned(), Instant::now());
        Ok(())
    }

    /// Declares the delay queue of `queue` for `ttl`, again when the last declaration is
    /// old enough for `x-expires` to matter.
    async fn declare_delay(&self, queue: &str, ttl: Duration) -> Result<String, TransportError> {
        let name = delay_queue(queue, ttl);
        let fresh = lock(&self.declared)
            .get(&name)
            .is_some_and(|at| at.elapsed() < delay_queue_redeclare_after(ttl));
        if fresh {
            return Ok(name);
        }
        let short_name = short(&name)?;
        let mut args = FieldTable::default();
        args.insert(
            "x-message-ttl".into(),
            AMQPValue::LongLongInt(ttl.as_millis() as i64),
        );
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(LongString::from("")),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(LongString::from(queue.as_bytes())),
        );
        args.insert(
            "x-expires".into(),
            AMQPValue::LongLongInt(delay_queue_expires(ttl).as_millis() as i64),
        );
        let ch = self.topology().await?;
        ch.queue_declare(short_name, QueueDeclareOptions::durable(), args)
            .await
            .map_err(|e| refused(&name, e))?;
        lock(&self.declared).insert(name.clone(), Instant::now());
        Ok(name)
    }

    /// Ready messages of `queue`; `None` when it does not exist.
    async fn ready(&self, queue: &str) -> Result<Option<u32>, TransportError> {
        let name = short(queue)?;
        let ch = self.topology().await?;
        match ch
            .queue_declare(
                name,
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
        {
            Ok(q) => Ok(Some(q.message_count())),
            Err(e) if is_not_found(&e) => {
                self.forget(queue);
                Ok(None)
            }
            Err(e) => Err(map_err(e)),
        }
    }

    /// Publishes `body` to `routing_key` on the default exchange (mandatory) and waits for
    /// the broker's confirm.
    async fn publish(
        &self,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<(), TransportError> {
        let key = short(routing_key)?;
        let ch = self.publisher().await?;
        let confirm = ch
            .basic_publish(
                ShortString::from(""),
                key,
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                props,
            )
            .await
            .map_err(map_err)?;
        match confirm.await.map_err(map_err)? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) => {
                // Unroutable: the queue was deleted since it was declared.
                self.forget(routing_key);
                Err(TransportError::backend(format!(
                    "the broker returned a publish to `{routing_key}`: no such queue (it is declared again on the next publish)"
                )))
            }
            Confirmation::Nack(None) => Err(TransportError::backend(format!(
                "the broker nacked a publish to `{routing_key}`"
            ))),
            Confirmation::NotRequested => Err(TransportError::backend(
                "the publish channel is not in confirm mode",
            )),
        }
    }
}

fn refused(queue: &str, e: lapin::Error) -> TransportError {
    if e.is_amqp_soft_error() {
        TransportError::backend(format!(
            "declaring queue `{queue}` was refused ({e}); a queue of that name declared with other \
             arguments (the family declares durable=True with no arguments) must be deleted or renamed"
        ))
    } else {
        map_err(e)
    }
}

struct Inner {
    url: String,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    /// The current connection, readable without waiting for a reconnect in progress.
    current: Mutex<Option<Arc<Conn>>>,
    next_consumer: AtomicU64,
    /// Set by [`AmqpTransport::with_prefetch`] (0: not set): the prefetch of every
    /// consumer, instead of [`PREFETCH_PER_WORKER`] × the runtime's concurrency (or 1 for
    /// a consumer started by a plain reserve).
    fixed_prefetch: std::sync::atomic::AtomicU16,
    /// Prefetch per consumed queue, and how many acks may wait above a gap (the window's
    /// spare part, prefetch − concurrency; set by `start_consumer`).
    prefetch: Mutex<HashMap<String, (u16, usize)>>,
    /// Delay buckets used per queue (ms → last publish into it), kept across reconnects.
    delays: Mutex<HashMap<String, BTreeMap<u64, Instant>>>,
}

/// The RabbitMQ transport: the family's AMQP 0-9-1 binding for the runtime's
/// [`App`](babelqueue_runtime::App).
///
/// - **Publish**: on the default exchange with routing key = queue, persistent, with the
///   binding's projection (`type` = URN, `correlation_id` = trace_id, `message_id` =
///   meta.id, `app_id` = `babelqueue`, `content_type` = `application/json`, headers
///   `x-schema-version`, `x-source-lang`, `x-attempts` natively typed) and out-of-band
///   headers in the same table (the projection's win a collision). Every publish waits
///   for the broker's **publisher confirm**: it is done only when confirmed; a nack, or a
///   message returned as unroutable (publishes are mandatory), is an error.
/// - **Queues** are declared as the other SDKs declare them (`durable`, no arguments),
///   once per queue per connection, so a Rust and a Python consumer share a queue; the
///   dead-letter queue `<queue>.dlq` too.
/// - **Consume**: one channel per queue, manual ack, prefetch =
///   [`PREFETCH_PER_WORKER`] × the runtime's concurrency (or
///   [`with_prefetch`](Self::with_prefetch)): while each worker handles a message, the
///   next one is already in the client, so a worker that acks does not wait a broker
///   round trip for its next message. The consumer starts on the first reserve. A
///   delivery's body is the AMQP body byte for byte; its out-of-band headers are the AMQP
///   headers minus the projection's `x-*` headers and RabbitMQ's
///   dead-lettering headers (`x-death`, …).
/// - **Acks are coalesced**: RabbitMQ's cost is mostly per frame, so one
///   `basic.ack(tag, multiple = true)` settles every delivery up to `tag` whose ack the
///   runtime has asked for. An ack whose earlier deliveries are all settled goes out at
///   once (with any acks waiting behind it); an ack above a gap (an earlier delivery still
///   in a handler) waits for the gap to close, but only while at most prefetch −
///   concurrency acks wait (the window's spare part, so a slow handler never starves the
///   other workers): past that every waiting ack is sent singly, at once. Leaving the
///   queue sends what still waits. An ack that waits returns before its frame is sent: if
///   the process dies first, the broker redelivers that message and the guard absorbs the
///   duplicate, as after any crash between a handler and its ack.
/// - **Retries without holding a worker**: a requeue after a delay publishes the new copy
///   (confirmed) to a delay queue `<queue>.delay.<ms>` whose queue-level TTL dead-letters
///   it back to `<queue>` ([`delay_queue`](crate::delay_queue); one queue per delay
///   bucket, so the head of a delay queue always expires first), then acks the original.
///   Delays are rounded up to a bucket ([`delay_bucket`](crate::delay_bucket): at most
///   25 % longer). A crash between the publish and the ack delivers the message twice: the
///   idempotency guard absorbs it.
/// - **Crash recovery** is the broker's own: the unacked deliveries of a closed channel or
///   connection go back to the queue. No heartbeat or recovery of ours.
/// - **Reconnection**: a lost connection or channel is a [`TransportError::Connection`];
///   the next call reconnects (the runtime backs off and retries). A publish whose confirm
///   did not arrive is an error the runtime retries. An ack for a delivery of a channel
///   that is gone cannot be sent: the broker has put that message back already, so the
///   ack is skipped (with a warning) and the redelivery is absorbed by the guard.
///
/// ```no_run
/// use babelqueue_amqp::AmqpTransport;
/// use babelqueue_runtime::App;
/// use babelqueue_core::Envelope;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let transport = AmqpTransport::open("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// let app = App::new(transport)
///     .queue("orders")
///     .route_sync("urn:babel:orders:created", |_env: &Envelope| ());
/// app.publish("urn:babel:orders:created", &serde_json::json!({"order_id": 1042})).await?;
/// let stats = app.drain().await?;
/// assert_eq!(stats.succeeded, 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AmqpTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpTransport")
            .field("url", &redact(&self.inner.url))
            .field(
                "fixed_prefetch",
                &self.inner.fixed_prefetch.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

/// The URL without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

impl AmqpTransport {
    /// Connects to `url` (`amqp://user:pass@host:port/vhost`, the vhost URL-encoded:
    /// `%2f` is `/`; `amqps://` with the `rustls` feature). The connection is checked
    /// now: a bad URL or an unreachable broker is an error here.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), babelqueue_runtime::TransportError> {
    /// let t = babelqueue_amqp::AmqpTransport::open("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(url: &str) -> Result<Self, TransportError> {
        let t = Self::lazy(url)?;
        t.conn().await?;
        Ok(t)
    }

    /// Like [`open`](Self::open), without connecting: the first call connects. The URL is
    /// still checked now.
    ///
    /// ```
    /// let t = babelqueue_amqp::AmqpTransport::lazy("amqp://guest:guest@127.0.0.1:5672/%2f")?;
    /// assert!(babelqueue_amqp::AmqpTransport::lazy("http://nope").is_err());
    /// # Ok::<(), babelqueue_runtime::TransportError>(())
    /// ```
    pub fn lazy(url: &str) -> Result<Self, TransportError> {
        let parsed: lapin::uri::AMQPUri = url.parse().map_err(|e: String| {
            TransportError::backend(format!("invalid AMQP URL `{}`: {e}", redact(url)))
        })?;
        if parsed.scheme == lapin::uri::AMQPScheme::AMQPS && !cfg!(feature = "rustls") {
            return Err(TransportError::backend(
                "amqps:// needs the `rustls` feature of babelqueue-amqp",
            ));
        }
        Ok(AmqpTransport {
            inner: Arc::new(Inner {
                url: url.to_owned(),
                conn: tokio::sync::Mutex::new(None),
                current: Mutex::new(None),
                next_consumer: AtomicU64::new(0),
                fixed_prefetch: std::sync::atomic::AtomicU16::new(0),
                prefetch: Mutex::new(HashMap::new()),
                delays: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// A fixed prefetch (`basic.qos`) for every consumer of this transport and its clones,
    /// instead of the default: [`PREFETCH_PER_WORKER`] × the concurrency an `App` starts
    /// its consumer with ([`start_consumer`](Transport::start_consumer)), and 1 for a
    /// consumer started by a plain [`reserve`](Transport::reserve). Set it before the
    /// first reserve; 0 counts as 1.
    ///
    /// A smaller prefetch holds fewer messages away from other consumers of the queue; a
    /// prefetch equal to the concurrency makes each worker wait a broker round trip for
    /// its next message after each ack.
    ///
    /// ```
    /// let t = babelqueue_amqp::AmqpTransport::lazy("amqp://127.0.0.1")?.with_prefetch(16);
    /// # Ok::<(), babelqueue_runtime::TransportError>(())
    /// ```
    pub fn with_prefetch(self, prefetch: u16) -> Self {
        self.inner
            .fixed_prefetch
            .store(prefetch.max(1), Ordering::Relaxed);
        self
    }

    /// The prefetch a consumer started for `concurrency` workers gets: the fixed one of
    /// [`with_prefetch`](Self::with_prefetch), else [`PREFETCH_PER_WORKER`] ×
    /// `concurrency` (at most `u16::MAX`).
    ///
    /// ```
    /// use babelqueue_amqp::{AmqpTransport, PREFETCH_PER_WORKER};
    /// let t = AmqpTransport::lazy("amqp://127.0.0.1")?;
    /// assert_eq!(t.prefetch_for(8), 8 * PREFETCH_PER_WORKER);
    /// assert_eq!(t.prefetch_for(100_000), u16::MAX);
    /// assert_eq!(t.with_prefetch(8).prefetch_for(32), 8);
    /// # Ok::<(), babelqueue_runtime::TransportError>(())
    /// ```
    pub fn prefetch_for(&self, concurrency: usize) -> u16 {
        match self.inner.fixed_prefetch.load(Ordering::Relaxed) {
            0 => {}
            fixed => return fixed,
        }
        u16::try_from(
            concurrency
                .max(1)
                .saturating_mul(usize::from(PREFETCH_PER_WORKER)),
        )
        .unwrap_or(u16::MAX)
    }

    /// The current connection, opened (again) when there is none or it was lost.
    async fn conn(&self) -> Result<Arc<Conn>, TransportError> {
        if let Some(c) = lock(&self.inner.current).as_ref()
            && c.alive()
        {
            return Ok(Arc::clone(c));
        }
        let mut slot = self.inner.conn.lock().await;
        if let Some(c) = slot.as_ref()
            && c.alive()
        {
            return Ok(Arc::clone(c));
        }
        if slot.take().is_some() {
            tracing::warn!(url = %redact(&self.inner.url), "AMQP connection lost; reconnecting");
            *lock(&self.inner.current) = None;
        }
        let props =
            ConnectionProperties::default().with_connection_name(LongString::from("babelqueue-rs"));
        let connection =
            tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(&self.inner.url, props))
                .await
                .map_err(|_| TransportError::connection("connecting to the AMQP broker timed out"))?
                .map_err(TransportError::connection)?;
        let publisher = connection.create_channel().await.map_err(map_err)?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(map_err)?;
        let topology = connection.create_channel().await.map_err(map_err)?;
        let conn = Arc::new(Conn {
            connection,
            publisher: tokio::sync::Mutex::new(publisher),
            topology: tokio::sync::Mutex::new(topology),
            declared: Mutex::new(HashMap::new()),
            consumers: Mutex::new(HashMap::new()),
            starting: tokio::sync::Mutex::new(()),
        });
        *slot = Some(Arc::clone(&conn));
        *lock(&self.inner.current) = Some(Arc::clone(&conn));
        Ok(conn)
    }

    /// The prefetch of `queue`'s consumer and its ack hold (none for a consumer started by
    /// a plain reserve: one worker, nothing spare).
    fn prefetch_of(&self, queue: &str) -> (u16, usize) {
        lock(&self.inner.prefetch)
            .get(queue)
            .copied()
            .unwrap_or_else(|| (self.inner.fixed_prefetch.load(Ordering::Relaxed).max(1), 0))
    }

    /// The consumer of `queue` on `conn`, started when there is none (or its channel
    /// closed).
    async fn consumer(&self, conn: &Conn, queue: &str) -> Result<Arc<Consume>, TransportError> {
        if let Some(c) = live(&conn.consumers, queue) {
            return Ok(c);
        }
        let _starting = conn.starting.lock().await;
        if let Some(c) = live(&conn.consumers, queue) {
            return Ok(c);
        }
        lock(&conn.consumers).remove(queue);
        conn.declare(queue).await?;
        let (prefetch, hold) = self.prefetch_of(queue);
        let channel = conn.open_channel(false).await?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(map_err)?;
        let id = self.inner.next_consumer.fetch_add(1, Ordering::Relaxed) + 1;
        let tag = short(&format!("bq-rs-{}-{id}", uuid::Uuid::new_v4().simple()))?;
        let consumer = channel
            .basic_consume(
                short(queue)?,
                tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(map_err)?;
        let c = Arc::new(Consume {
            id,
            channel,
            tag,
            prefetch: Mutex::new(prefetch),
            stream: tokio::sync::Mutex::new(Stash {
                consumer,
                ahead: Default::default(),
                ended: None,
            }),
            outstanding: AtomicU64::new(0),
            quiet: AtomicBool::new(false),
            acks: Mutex::new(AckBook::new(hold)),
            sending: tokio::sync::Mutex::new(()),
        });
        lock(&conn.consumers).insert(queue.to_owned(), Arc::clone(&c));
        Ok(c)
    }

    /// Starts the consumer of `queue` with `prefetch` (or sets the prefetch of the running
    /// one).
    async fn start_consumer_impl(
        &self,
        queue: &str,
        prefetch: u16,
        workers: usize,
    ) -> Result<(), TransportError> {
        let hold = usize::from(prefetch).saturating_sub(workers);
        lock(&self.inner.prefetch).insert(queue.to_owned(), (prefetch, hold));
        let conn = self.conn().await?;
        let c = self.consumer(&conn, queue).await?;
        lock(&c.acks).set_hold(hold);
        let current = *lock(&c.prefetch);
        if current != prefetch {
            c.channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await
                .map_err(map_err)?;
            *lock(&c.prefetch) = prefetch;
        }
        Ok(())
    }

    /// The live consumer of `queue` that delivered `tag`, without reconnecting; `None`
    /// when that channel is gone (the broker has put its unacked messages back).
    async fn consumer_of(&self, queue: &str, tag: u64) -> Option<Arc<Consume>> {
        let conn = lock(&self.inner.current).clone()?;
        live(&conn.consumers, queue).filter(|c| c.id == tag >> TAG_BITS)
    }

    fn wrap(&self, c: &Consume, queue: &str, d: lapin::message::Delivery) -> Delivery {
        c.outstanding.fetch_add(1, Ordering::Relaxed);
        c.quiet.store(false, Ordering::Relaxed);
        let tag = pack_tag(c.id, d.delivery_tag);
        let headers = out_of_band(d.properties.headers().as_ref());
        Delivery::native(queue, d.data, headers, tag)
    }

    async fn reserve_impl(
        &self,
        queue: &str,
        timeout: Duration,
    ) -> Result<Option<Delivery>, TransportError> {
        let conn = self.conn().await?;
        let c = self.consumer(&conn, queue).await?;
        let deadline = Instant::now() + timeout;
        let active = timeout.is_zero() && !c.quiet.load(Ordering::Relaxed);
        let mut stash = if timeout.is_zero() {
            match c.stream.try_lock() {
                Ok(s) => s,
                // Another reserve is waiting on the stream: while it is active, queue
                // behind it (deliveries are on their way); otherwise it takes what arrives.
                Err(_) if active => match tokio::time::timeout(ACTIVE_GRACE, c.stream.lock()).await
                {
                    Ok(s) => s,
                    Err(_) => return Ok(None),
                },
                Err(_) => return Ok(None),
            }
        } else {
            match tokio::time::timeout_at(deadline, c.stream.lock()).await {
                Ok(s) => s,
                Err(_) => return Ok(None),
            }
        };
        stash.fill();
        if let Some(d) = stash.ahead.pop_front() {
            return Ok(Some(self.wrap(&c, queue, d)));
        }
        if let Some(why) = stash.ended.take() {
            drop(stash);
            self.drop_consumer(&conn, queue, c.id);
            return Err(TransportError::connection(format!(
                "the consumer of `{queue}` stopped: {why}"
            )));
        }
        let deadline = if timeout.is_zero() {
            if c.quiet.load(Ordering::Relaxed) {
                return Ok(None);
            }
            Instant::now() + ACTIVE_GRACE
        } else {
            deadline
        };
        match tokio::time::timeout_at(deadline, next(&mut stash.consumer)).await {
            Err(_) => {
                if timeout.is_zero() {
                    c.quiet.store(true, Ordering::Relaxed);
                }
                Ok(None)
            }
            Ok(Some(Ok(d))) => Ok(Some(self.wrap(&c, queue, d))),
            Ok(other) => {
                drop(stash);
                self.drop_consumer(&conn, queue, c.id);
                let why = match other {
                    Some(Err(e)) => e.to_string(),
                    _ => "the broker cancelled the consumer".to_owned(),
                };
                Err(TransportError::connection(format!(
                    "the consumer of `{queue}` stopped: {why}"
                )))
            }
        }
    }

    fn drop_consumer(&self, conn: &Conn, queue: &str, id: u64) {
        let mut consumers = lock(&conn.consumers);
        if consumers.get(queue).is_some_and(|c| c.id == id) {
            consumers.remove(queue);
        }
    }

    async fn ack_impl(&self, delivery: &Delivery) -> Result<(), TransportError> {
        let Some(c) = self.consumer_of(delivery.queue(), delivery.tag()).await else {
            tracing::warn!(
                queue = delivery.queue(),
                "ack skipped: the channel that delivered the message is closed, so the broker has put it back (its redelivery is a duplicate the guard absorbs)"
            );
            return Ok(());
        };
        c.ack(delivery.tag() & TAG_MASK).await?;
        let _ = c
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        Ok(())
    }

    /// Publishes `body` with out-of-band `headers` to `queue` (declared first), confirmed.
    async fn publish_impl(
        &self,
        queue: &str,
        body: &[u8],
        headers: Option<&Headers>,
    ) -> Result<(), TransportError> {
        let conn = self.conn().await?;
        conn.declare(queue).await?;
        conn.publish(queue, body, properties(body, headers)).await
    }

    async fn requeue_impl(
        &self,
        delivery: &Delivery,
        republish: &Republish,
        delay: Duration,
    ) -> Result<(), TransportError> {
        let unchanged = republish.is_unchanged();
        let body = republish.body(delivery);
        let headers = republish.headers(delivery);
        let queue = delivery.queue();
        let Some(c) = self.consumer_of(queue, delivery.tag()).await else {
            tracing::warn!(
                queue,
                "requeue skipped: the channel that delivered the message is closed, so the broker has put it back already"
            );
            return Ok(());
        };
        if unchanged && delay.is_zero() {
            // Put back where it was, natively.
            c.channel
                .basic_reject(
                    delivery.tag() & TAG_MASK,
                    BasicRejectOptions { requeue: true },
                )
                .await
                .map_err(map_err)?;
            c.rejected(delivery.tag() & TAG_MASK).await?;
        } else {
            let conn = self.conn().await?;
            let props = properties(body, headers);
            if delay.is_zero() {
                conn.declare(queue).await?;
                conn.publish(queue, body, props).await?;
            } else {
                let ttl = delay_bucket(delay);
                let name = conn.declare_delay(queue, ttl).await?;
                conn.publish(&name, body, props).await?;
                lock(&self.inner.delays)
                    .entry(queue.to_owned())
                    .or_default()
                    .insert(ttl.as_millis() as u64, Instant::now());
            }
            c.ack(delivery.tag() & TAG_MASK).await?;
        }
        let _ = c
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        Ok(())
    }

    /// Messages waiting in the delay queues of `queue` this transport used, and the time
    /// until the latest of them is due.
    async fn delayed(
        &self,
        conn: &Conn,
        queue: &str,
    ) -> Result<(u64, Option<Duration>), TransportError> {
        let buckets: Vec<(u64, Instant)> = lock(&self.inner.delays)
            .get(queue)
            .map(|b| b.iter().map(|(k, v)| (*k, *v)).collect())
            .unwrap_or_default();
        let mut total = 0u64;
        let mut due: Option<Duration> = None;
        for (ms, last) in buckets {
            let ttl = Duration::from_millis(ms);
            match conn.ready(&delay_queue(queue, ttl)).await? {
                Some(n) if n > 0 => {
                    total += u64::from(n);
                    let left = (last + ttl).saturating_duration_since(Instant::now());
                    due = Some(due.map_or(left, |d| d.min(left)));
                }
                Some(_) => {}
                None => {
                    // Expired (x-expires) and deleted: nothing waits there.
                    if let Some(b) = lock(&self.inner.delays).get_mut(queue)
                        && b.get(&ms) == Some(&last)
                    {
                        b.remove(&ms);
                    }
                }
            }
        }
        Ok((total, due))
    }

    async fn next_due_impl(&self, queue: &str) -> Result<Option<Duration>, TransportError> {
        let conn = self.conn().await?;
        let (delayed, due) = self.delayed(&conn, queue).await?;
        if delayed > 0 {
            return Ok(Some(due.unwrap_or(Duration::ZERO).min(DUE_POLL)));
        }
        // No delayed message: say "now" while `queue` still has work for a reserve (a
        // retry that just expired into it, or a delivery on its way to this consumer),
        // so a drain does not end before it.
        if conn.ready(queue).await?.unwrap_or(0) > 0 {
            return Ok(Some(Duration::ZERO));
        }
        let consumer = lock(&conn.consumers).get(queue).cloned();
        if let Some(c) = consumer
            && c.channel.status().connected()
        {
            // A delivery the queue handed out before the count above is on the wire
            // before the reply to a second round trip on the consumer's own channel.
            let name = short(queue)?;
            c.channel
                .queue_declare(
                    name,
                    QueueDeclareOptions::default().passive(),
                    FieldTable::default(),
                )
                .await
                .map_err(map_err)?;
            let prefetch = *lock(&c.prefetch);
            c.channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await
                .map_err(map_err)?;
            if let Ok(mut stash) = c.stream.try_lock() {
                stash.fill();
                if !stash.ahead.is_empty() {
                    c.quiet.store(false, Ordering::Relaxed);
                    return Ok(Some(Duration::ZERO));
                }
            } else {
                // A reserve is taking from the stream right now.
                return Ok(Some(Duration::ZERO));
            }
        }
        Ok(None)
    }

    async fn depth_impl(&self, queue: &str) -> Result<QueueDepth, TransportError> {
        let conn = self.conn().await?;
        let ready = conn.ready(queue).await?.unwrap_or(0);
        let (delayed, _) = self.delayed(&conn, queue).await?;
        let in_flight = match lock(&conn.consumers).get(queue) {
            Some(c) => c.outstanding.load(Ordering::Relaxed),
            None => 0,
        };
        Ok(QueueDepth::new(u64::from(ready), delayed, in_flight))
    }

    async fn leave_impl(&self, queue: &str) -> Result<(), TransportError> {
        let Some(conn) = lock(&self.inner.current).clone() else {
            return Ok(());
        };
        let removed = lock(&conn.consumers).remove(queue);
        let Some(c) = removed else {
            return Ok(());
        };
        if c.channel.status().connected() {
            // The acks still waiting above a gap go first, then stop deliveries and close
            // the channel: what it still holds unacked goes back to the queue.
            if let Err(error) = c.flush_acks().await {
                tracing::warn!(queue, %error, "acks not sent before leaving: the broker puts those messages back (their redeliveries are duplicates the guard absorbs)");
            }
            let _ = c
                .channel
                .basic_cancel(c.tag.clone(), BasicCancelOptions::default())
                .await;
            c.channel
                .close(200, ShortString::from("consumer left"))
                .await
                .map_err(map_err)?;
        }
        Ok(())
    }
}

impl Transport for AmqpTransport {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move { self.publish_impl(queue, &element, None).await })
    }

    fn publish_with_headers<'a>(
        &'a self,
        queue: &'a str,
        body: &'a [u8],
        headers: Option<&'a Headers>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move { self.publish_impl(queue, body, headers).await })
    }

    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        Box::pin(self.reserve_impl(queue, timeout))
    }

    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.ack_impl(delivery))
    }

    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        republish: Republish,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move { self.requeue_impl(delivery, &republish, delay).await })
    }

    fn start_consumer<'a>(
        &'a self,
        queue: &'a str,
        options: &'a ConsumerOptions,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let prefetch = self.prefetch_for(options.concurrency());
            self.start_consumer_impl(queue, prefetch, options.concurrency())
                .await
        })
    }

    fn next_due<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Option<Duration>, TransportError>> {
        Box::pin(self.next_due_impl(queue))
    }

    fn leave<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.leave_impl(queue))
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueDepth, TransportError>> {
        Box::pin(self.depth_impl(queue))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("amqp://127.0.0.1"), "amqp://127.0.0.1");
    }

    #[test]
    fn bad_urls_are_errors() {
        assert!(AmqpTransport::lazy("nope").is_err());
        assert!(AmqpTransport::lazy("amqp://guest:guest@127.0.0.1:5672/%2f").is_ok());
        let debug = format!(
            "{:?}",
            AmqpTransport::lazy("amqp://guest:pw@127.0.0.1:5672/%2f").unwrap()
        );
        assert!(!debug.contains("pw@"), "{debug}");
    }

    #[test]
    fn tags_carry_their_channel() {
        let tag = pack_tag(7, 123_456);
        assert_eq!(tag >> TAG_BITS, 7);
        assert_eq!(tag & TAG_MASK, 123_456);
        assert_ne!(
            pack_tag(8, 123_456),
            tag,
            "the same delivery tag of another channel"
        );
    }

    #[test]
    fn long_names_are_errors_not_panics() {
        assert!(short(&"q".repeat(255)).is_ok());
        assert!(short(&"q".repeat(256)).is_err());
    }

    #[tokio::test]
    async fn an_unreachable_broker_is_a_connection_error() {
        // Port 1 on loopback: refused at once.
        let err = AmqpTransport::open("amqp://guest:guest@127.0.0.1:1/%2f")
            .await
            .unwrap_err();
        assert!(err.is_connection(), "{err:?}");
    }
}
