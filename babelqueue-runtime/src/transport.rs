//! The [`Transport`] trait a broker binding implements, the reserved [`Delivery`], and the
//! header frame shared by the list-based transports.

use std::sync::Arc;
use std::time::Duration;

use super::depth::QueueDepth;
use crate::handler::{BoxError, BoxFuture};
use babelqueue_core::envelope::Envelope;
use babelqueue_core::pipelined::PipelinedWrite;

pub use babelqueue_core::binding::redis::{
    FRAME_KEY, FrameError, Headers, encode_element, is_frame_object, may_be_frame, unframe,
};

/// A transport operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The connection to the broker failed or was lost. The runtime backs off and
    /// reconnects; the operation may or may not have reached the broker.
    #[error("broker connection failed")]
    Connection(#[source] BoxError),
    /// The broker answered with an error, or the transport failed otherwise.
    #[error("broker error")]
    Backend(#[source] BoxError),
    /// A body given to a framing publish is not UTF-8 (a frame carries it as a string).
    #[error("a framed body must be UTF-8 (the frame carries it as a JSON string)")]
    BodyNotUtf8,
    /// The transport does not implement this operation.
    #[error("this transport does not support `{0}`")]
    Unsupported(&'static str),
}

impl From<FrameError> for TransportError {
    fn from(err: FrameError) -> Self {
        match err {
            FrameError::BodyNotUtf8 => TransportError::BodyNotUtf8,
            other => TransportError::Backend(other.into()),
        }
    }
}

impl TransportError {
    /// A connection failure (the runtime reconnects with backoff).
    pub fn connection(err: impl Into<BoxError>) -> Self {
        TransportError::Connection(err.into())
    }

    /// Any other broker failure.
    pub fn backend(err: impl Into<BoxError>) -> Self {
        TransportError::Backend(err.into())
    }

    /// Whether this is a lost or refused connection.
    pub fn is_connection(&self) -> bool {
        matches!(self, TransportError::Connection(_))
    }
}

/// One reserved message: the exact element the broker handed out (what [`Transport::ack`]
/// removes), the queue it came from, and — when the element is a header frame — the
/// unwrapped envelope body and headers.
///
/// ```
/// use babelqueue_runtime::Delivery;
/// let framed = br#"{"__bq_frame":1,"headers":{"traceparent":"00-ab"},"body":"{\"job\":\"x\"}"}"#;
/// let d = Delivery::new("orders", framed.to_vec(), 0);
/// assert_eq!(d.body(), br#"{"job":"x"}"#);
/// assert_eq!(d.headers().unwrap()["traceparent"], "00-ab");
/// assert_eq!(d.element(), framed);
///
/// let bare = Delivery::new("orders", b"{\"job\":\"x\"}".to_vec(), 0);
/// assert_eq!(bare.body(), bare.element());
/// assert!(bare.headers().is_none());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    queue: String,
    element: Arc<Vec<u8>>,
    tag: u64,
    frame: Option<(Headers, Vec<u8>)>,
    /// What a broker with native message metadata hands out beside the body (boxed: the
    /// list transports' deliveries stay as small as they were).
    native: Option<Box<Native>>,
}

/// Native metadata of a delivery from a broker that has headers and counters of its own.
#[derive(Debug, Clone, PartialEq, Default)]
struct Native {
    headers: Headers,
    delivery_count: Option<u32>,
    receipt: Option<String>,
}

impl Delivery {
    /// Wraps a reserved element. `tag` is a transport-specific receipt (e.g. a delivery
    /// tag); list transports that ack by element use `0`. A header frame is unwrapped.
    pub fn new(queue: impl Into<String>, element: Vec<u8>, tag: u64) -> Self {
        Self::from_shared(queue, Arc::new(element), tag)
    }

    /// Like [`new`](Self::new), sharing the element's buffer with the caller (an in-process
    /// transport keeps its in-flight copy without duplicating a large body).
    pub fn from_shared(queue: impl Into<String>, element: Arc<Vec<u8>>, tag: u64) -> Self {
        let frame = unframe(&element);
        Delivery {
            queue: queue.into(),
            element,
            tag,
            frame,
            native: None,
        }
    }

    /// A delivery from a broker with native headers (AMQP, SQS, Kafka, …): `body` is the
    /// message body byte for byte (it is also the [`element`](Self::element); it is never
    /// unwrapped as a frame) and `headers` its out-of-band headers, already taken from the
    /// broker's own header table (the contract's projection headers left out).
    /// [`headers`](Self::headers) is `None` when `headers` is empty.
    ///
    /// ```
    /// use babelqueue_runtime::{Delivery, Headers};
    /// let mut h = Headers::new();
    /// h.insert("traceparent".into(), "00-ab".into());
    /// let d = Delivery::native("orders", b"{\"job\":\"x\"}".to_vec(), h, 7)
    ///     .with_delivery_count(2)
    ///     .with_receipt("AQEB…");
    /// assert_eq!(d.body(), d.element());
    /// assert_eq!(d.headers().unwrap()["traceparent"], "00-ab");
    /// assert_eq!((d.tag(), d.delivery_count(), d.receipt()), (7, Some(2), Some("AQEB…")));
    ///
    /// // A body that looks like a frame is still just a body on such a broker.
    /// let framed = br#"{"__bq_frame":1,"headers":{},"body":"{}"}"#.to_vec();
    /// let d = Delivery::native("orders", framed.clone(), Headers::new(), 1);
    /// assert_eq!(d.body(), &framed[..]);
    /// assert!(d.headers().is_none());
    /// ```
    pub fn native(queue: impl Into<String>, body: Vec<u8>, headers: Headers, tag: u64) -> Self {
        Delivery {
            queue: queue.into(),
            element: Arc::new(body),
            tag,
            frame: None,
            native: Some(Box::new(Native {
                headers,
                ..Native::default()
            })),
        }
    }

    fn native_mut(&mut self) -> &mut Native {
        self.native.get_or_insert_with(Box::default)
    }

    /// Sets the broker's own delivery counter as the broker reports it (SQS
    /// `ApproximateReceiveCount`, ASB `DeliveryCount`, Pulsar `RedeliveryCount`, …); the
    /// transport's [`Transport::attempts`] reconciles it with the body's `attempts`.
    pub fn with_delivery_count(mut self, count: u32) -> Self {
        self.native_mut().delivery_count = Some(count);
        self
    }

    /// The broker's own delivery counter, where it has one.
    pub fn delivery_count(&self) -> Option<u32> {
        self.native.as_ref().and_then(|n| n.delivery_count)
    }

    /// Sets a string receipt that settles this delivery (an SQS receipt handle, …), for
    /// brokers whose handle is not a number like [`tag`](Self::tag).
    pub fn with_receipt(mut self, receipt: impl Into<String>) -> Self {
        self.native_mut().receipt = Some(receipt.into());
        self
    }

    /// The string receipt, when the transport set one.
    pub fn receipt(&self) -> Option<&str> {
        self.native.as_ref().and_then(|n| n.receipt.as_deref())
    }

    /// Whether the headers came from the broker's native header table (not a frame).
    pub fn has_native_headers(&self) -> bool {
        self.native.is_some()
    }

    /// The element's shared buffer.
    pub fn shared_element(&self) -> &Arc<Vec<u8>> {
        &self.element
    }

    /// The queue the message was reserved from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The element exactly as the broker stored it (a bare envelope or a frame).
    pub fn element(&self) -> &[u8] {
        &self.element
    }

    /// The transport's receipt for this delivery.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The envelope bytes: the frame's `body`, or the whole element when it is not a frame.
    pub fn body(&self) -> &[u8] {
        match &self.frame {
            Some((_, body)) => body,
            None => &self.element,
        }
    }

    /// The out-of-band headers: the frame's, when the element was a header frame, or the
    /// broker's native ones (see [`native`](Self::native)); `None` when there are none.
    pub fn headers(&self) -> Option<&Headers> {
        match (&self.frame, &self.native) {
            (Some((h, _)), _) => Some(h),
            (None, Some(n)) if !n.headers.is_empty() => Some(&n.headers),
            _ => None,
        }
    }
}

/// What a [`Transport::requeue`] puts back on the queue: the delivery as it arrived, or
/// with a new body (a retry: the envelope with `attempts + 1`) and/or new out-of-band
/// headers (a release: its count header raised). The transport writes it its own way: a
/// list transport as an element (a header frame when there are headers), a broker with
/// native headers as body plus headers.
///
/// ```
/// use babelqueue_runtime::{Delivery, Headers, Republish};
/// let d = Delivery::new("orders", b"{\"attempts\":0}".to_vec(), 0);
/// let same = Republish::unchanged();
/// assert!(same.is_unchanged());
/// assert_eq!(same.element(&d)?, d.element());
///
/// let retry = Republish::with_body(b"{\"attempts\":1}".to_vec());
/// assert_eq!(retry.body(&d), b"{\"attempts\":1}");
/// assert!(retry.headers(&d).is_none());
///
/// let mut h = Headers::new();
/// h.insert("x-babelqueue-releases".into(), 1.into());
/// let release = Republish::with_headers(h);
/// assert_eq!(
///     release.element(&d)?,
///     br#"{"__bq_frame":1,"headers":{"x-babelqueue-releases":1},"body":"{\"attempts\":0}"}"#
/// );
/// # Ok::<(), babelqueue_runtime::TransportError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Republish {
    body: Option<Vec<u8>>,
    headers: Option<Headers>,
}

impl Republish {
    /// The delivery exactly as it arrived (a put-back: deferred, or the store was down).
    pub fn unchanged() -> Self {
        Self::default()
    }

    /// A new body, with the delivery's headers.
    pub fn with_body(body: Vec<u8>) -> Self {
        Republish {
            body: Some(body),
            headers: None,
        }
    }

    /// The delivery's body, with these headers instead of its own.
    pub fn with_headers(headers: Headers) -> Self {
        Republish {
            body: None,
            headers: Some(headers),
        }
    }

    /// Whether nothing changes: the delivery goes back as it arrived.
    pub fn is_unchanged(&self) -> bool {
        self.body.is_none() && self.headers.is_none()
    }

    /// The body to put back.
    pub fn body<'a>(&'a self, delivery: &'a Delivery) -> &'a [u8] {
        self.body.as_deref().unwrap_or_else(|| delivery.body())
    }

    /// The headers to put back (`None`: none).
    pub fn headers<'a>(&'a self, delivery: &'a Delivery) -> Option<&'a Headers> {
        match &self.headers {
            Some(h) => Some(h).filter(|h| !h.is_empty()),
            None => delivery.headers(),
        }
    }

    /// The list element to store: the delivery's own element, byte for byte, when
    /// nothing changed; else [`encode_element`] of the body and headers.
    pub fn element(&self, delivery: &Delivery) -> Result<Vec<u8>, TransportError> {
        if self.is_unchanged() {
            return Ok(delivery.element().to_vec());
        }
        Ok(encode_element(self.body(delivery), self.headers(delivery))?)
    }

    /// The element as a shared buffer (no copy when nothing changed).
    pub fn shared_element(&self, delivery: &Delivery) -> Result<Arc<Vec<u8>>, TransportError> {
        if self.is_unchanged() {
            return Ok(Arc::clone(delivery.shared_element()));
        }
        Ok(encode_element(self.body(delivery), self.headers(delivery)).map(Arc::new)?)
    }
}

/// A delivery the runtime settles with [`Transport::settle_and_reserve`]: the store
/// writes its guards handed over (sent first, in order), then its ack.
#[derive(Debug, Clone, Copy)]
pub struct Settled<'a> {
    /// The delivery to acknowledge.
    pub delivery: &'a Delivery,
    /// Store commands for [`Transport::pipeline_server`], sent before the ack.
    pub writes: &'a [PipelinedWrite],
}

impl<'a> Settled<'a> {
    /// An ack with no writes before it.
    pub fn ack(delivery: &'a Delivery) -> Self {
        Settled {
            delivery,
            writes: &[],
        }
    }
}

/// How a consumer is run, handed to [`Transport::start_consumer`]: the runtime's settings
/// a transport's own background work needs, and where it reports what the runtime must act
/// on.
///
/// ```
/// use std::time::Duration;
/// use babelqueue_runtime::ConsumerOptions;
/// let o = ConsumerOptions::new(8).heartbeat(Duration::from_secs(2), Duration::from_secs(10));
/// assert_eq!((o.concurrency(), o.heartbeat_ttl()), (8, Duration::from_secs(10)));
/// o.events().send(babelqueue_runtime::ConsumerEvent::Ready); // no receiver: ignored
/// ```
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    concurrency: usize,
    heartbeat_interval: Duration,
    heartbeat_ttl: Duration,
    recovery_interval: Duration,
    max_recoveries: u32,
    backoff_max: Duration,
    events: EventSink,
}

impl ConsumerOptions {
    /// Options for `concurrency` workers, with the runtime's defaults: heartbeat every 2 s
    /// valid 10 s, recovery every 5 s, 3 recoveries at most, backoff up to 5 s, and no
    /// event receiver.
    pub fn new(concurrency: usize) -> Self {
        ConsumerOptions {
            concurrency: concurrency.max(1),
            heartbeat_interval: Duration::from_secs(2),
            heartbeat_ttl: Duration::from_secs(10),
            recovery_interval: Duration::from_secs(5),
            max_recoveries: 3,
            backoff_max: Duration::from_secs(5),
            events: EventSink::default(),
        }
    }

    /// How often a consumer renews its liveness, and how long one renewal is valid.
    pub fn heartbeat(mut self, interval: Duration, ttl: Duration) -> Self {
        self.heartbeat_interval = interval;
        self.heartbeat_ttl = ttl;
        self
    }

    /// How often dead consumers' messages are looked for, and how many times one message
    /// may be recovered before it is handed to the runtime as
    /// [`ConsumerEvent::Exhausted`].
    pub fn recovery(mut self, interval: Duration, max_recoveries: u32) -> Self {
        self.recovery_interval = interval;
        self.max_recoveries = max_recoveries;
        self
    }

    /// The longest pause after a failed background operation.
    pub fn backoff_max(mut self, max: Duration) -> Self {
        self.backoff_max = max;
        self
    }

    /// Where the transport reports events.
    pub fn with_events(mut self, events: EventSink) -> Self {
        self.events = events;
        self
    }

    /// Workers handling messages at once (a prefetch for brokers that push).
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// Heartbeat renewal interval.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
    }

    /// How long one heartbeat is valid.
    pub fn heartbeat_ttl(&self) -> Duration {
        self.heartbeat_ttl
    }

    /// How often dead consumers' messages are recovered.
    pub fn recovery_interval(&self) -> Duration {
        self.recovery_interval
    }

    /// Recoveries of one message before it is exhausted.
    pub fn max_recoveries(&self) -> u32 {
        self.max_recoveries
    }

    /// The longest pause after a failed background operation.
    pub fn backoff_max_delay(&self) -> Duration {
        self.backoff_max
    }

    /// Where to report events.
    pub fn events(&self) -> &EventSink {
        &self.events
    }
}

/// What a transport's background work tells the runtime.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConsumerEvent {
    /// Messages became ready (promoted from a delayed set, recovered): idle workers look
    /// again.
    Ready,
    /// This many in-flight messages of dead consumers were put back on the queue.
    Recovered(usize),
    /// A message recovered from dead consumers too many times, now held by this
    /// consumer: the runtime dead-letters it (reason `failed`) and acks it. The `u32` is
    /// the limit it reached.
    Exhausted(Delivery, u32),
    /// A background operation failed (it is retried by the transport).
    Error(TransportError),
}

/// The sending side of a consumer's events (cheap to clone). Sending never blocks and
/// never fails: with no receiver, or one that is gone, an event is dropped.
#[derive(Debug, Clone, Default)]
pub struct EventSink(Option<tokio::sync::mpsc::UnboundedSender<ConsumerEvent>>);

impl EventSink {
    /// A sink and the receiver of its events.
    pub fn channel() -> (Self, tokio::sync::mpsc::UnboundedReceiver<ConsumerEvent>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (EventSink(Some(tx)), rx)
    }

    /// Reports `event`.
    pub fn send(&self, event: ConsumerEvent) {
        if let Some(tx) = &self.0 {
            let _ = tx.send(event);
        }
    }
}

/// A message broker binding: publish elements to a queue, reserve them into an in-flight
/// state that survives a worker crash, and ack the exact reserved message.
///
/// Implemented by [`InMemoryTransport`](super::InMemoryTransport) and by
/// `babelqueue_redis::RedisTransport` (the reliable-queue list pattern). The methods return
/// boxed futures so the trait is object safe: the [`App`](super::App) holds an
/// `Arc<dyn Transport>` and another broker can be plugged in without generics.
///
/// Contract for an implementation:
/// - [`publish_raw`](Self::publish_raw) stores `element` as is (no wrapping, no added
///   fields): what a consumer reserves is byte-identical;
/// - [`reserve`](Self::reserve) waits up to `timeout` (a zero timeout must not block) and
///   moves the message into an in-flight state from which only [`ack`](Self::ack) removes
///   it (so a crashed worker never loses it);
/// - connection failures are reported as [`TransportError::Connection`] and the next call
///   reconnects.
///
/// ```
/// use std::time::Duration;
/// use babelqueue_runtime::{InMemoryTransport, Transport};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let t = InMemoryTransport::new();
/// t.publish_raw("jobs", b"hello".to_vec()).await?;
/// let d = t.reserve("jobs", Duration::ZERO).await?.expect("one message");
/// assert_eq!(d.element(), b"hello");
/// assert_eq!(t.processing_len("jobs"), 1);
/// t.ack(&d).await?;
/// assert_eq!(t.processing_len("jobs"), 0);
/// # Ok::<(), babelqueue_runtime::TransportError>(())
/// # }).unwrap();
/// ```
pub trait Transport: Send + Sync + 'static {
    /// Appends `element` to `queue`, byte for byte.
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Reserves the next message of `queue`, waiting up to `timeout` (zero: do not wait).
    /// `Ok(None)` when none arrived in time.
    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>>;

    /// Acknowledges a reserved message: removes exactly that message from the in-flight
    /// state.
    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Moves every message left in flight on `queue` (e.g. by a crashed worker) back to
    /// the head of the queue, returning how many. Only safe when no live worker is
    /// consuming `queue` (a live worker's in-flight message would be delivered twice; the
    /// idempotency guard absorbs that). Default: unsupported.
    fn requeue_processing<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        let _ = queue;
        Box::pin(async { Err(TransportError::Unsupported("requeue_processing")) })
    }

    /// Settles a reserved message by putting it back: atomically where the broker allows,
    /// removes `delivery` from the in-flight state AND makes `republish` (the delivery as
    /// it arrived, or with a new body or new headers) deliverable again on
    /// [`delivery.queue()`](Delivery::queue) after `delay` ([`Duration::ZERO`]: now, at
    /// the tail of the queue), **without holding the caller** for the delay where the
    /// broker can delay natively.
    ///
    /// The runtime uses it for retries (the envelope with `attempts + 1`), deferrals of an
    /// id in flight elsewhere, dedupe-store outages and unknown URNs under
    /// [`Release`](super::UnknownUrnStrategy::Release).
    ///
    /// Each broker does it its own way: Redis runs one script (`LREM` of its own
    /// processing list + `ZADD {<queue>}:delayed` scored by the due time, or `RPUSH` when
    /// the delay is zero); RabbitMQ publishes to a delay queue that dead-letters back to
    /// the queue, then acks. The default publishes with
    /// [`publish_with_headers`](Self::publish_with_headers) **after sleeping `delay`** (so
    /// the caller's task waits; a crash in between leaves the message in flight for the
    /// broker's redelivery, never lost), then [`ack`](Self::ack)s the delivery; a crash
    /// between the two delivers it twice (the idempotency guard absorbs that).
    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        republish: Republish,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            self.publish_with_headers(
                delivery.queue(),
                republish.body(delivery),
                republish.headers(delivery),
            )
            .await?;
            self.ack(delivery).await
        })
    }

    /// The delivery's `attempts` as the runtime counts it: the binding's rule reconciling
    /// the body's own `attempts` with the broker's delivery counter
    /// ([`Delivery::delivery_count`]) or an attempts header. SQS: `max(body,
    /// ApproximateReceiveCount - 1)`; Kafka: the `bq-attempts` header; Redis and RabbitMQ
    /// (App runtimes republish with `attempts + 1`): the body's, the default.
    fn attempts(&self, body_attempts: u32, delivery: &Delivery) -> u32 {
        let _ = delivery;
        body_attempts
    }

    /// The dead-letter queue of `queue` on this broker, given the App's configured suffix
    /// (`.dlq` unless changed), when the broker names it otherwise; `None` (the default):
    /// `<queue><suffix>`. SQS allows no `.` in a queue name, so its transport answers the
    /// family's `<queue>-dlq` (`<queue>-dlq.fifo` for a FIFO queue). An explicit
    /// [`App::dead_letter_queue`](super::App::dead_letter_queue) always wins.
    fn dead_letter_queue(&self, queue: &str, suffix: &str) -> Option<String> {
        let _ = (queue, suffix);
        None
    }

    /// A consumer of `queue` starts (the runtime calls it once per consume, before the
    /// first [`reserve`](Self::reserve)). What only this broker needs beside the message
    /// loop starts here, as the transport's own background work: the Redis transport
    /// registers a heartbeat, recovers the in-flight messages of dead consumers and
    /// promotes due delayed messages (see [`maintain`](super::maintain)); RabbitMQ starts
    /// its consumer with a prefetch of [`ConsumerOptions::concurrency`]. What it finds
    /// that the runtime must act on goes to [`ConsumerOptions::events`]. Stopped by
    /// [`leave`](Self::leave). Default: nothing to start.
    fn start_consumer<'a>(
        &'a self,
        queue: &'a str,
        options: &'a ConsumerOptions,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = (queue, options);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Moves up to `limit` delayed messages of `queue` whose due time has passed back to the
    /// tail of `queue`, atomically: safe when every consumer of the queue runs it at once
    /// (nothing moved twice, nothing lost). Returns how many moved.
    ///
    /// Default (no delayed set: [`requeue`](Self::requeue) waits in the caller): `Ok(0)`.
    fn promote_due<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        let _ = (queue, limit);
        Box::pin(std::future::ready(Ok(0)))
    }

    /// The time until the earliest delayed message of `queue` is due ([`Duration::ZERO`]
    /// if one is overdue); `None` when none is delayed. [`App::drain`](super::App::drain)
    /// uses it to end only when the queue, its delayed messages and its own in-flight
    /// messages are all empty.
    ///
    /// Default: `Ok(None)`.
    fn next_due<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Option<Duration>, TransportError>> {
        let _ = queue;
        Box::pin(std::future::ready(Ok(None)))
    }

    /// What the *other* consumers of `queue` hold in their own in-flight lists (only the
    /// non-empty ones), with the time left on each one's heartbeat: a one-shot drain
    /// that found the queue empty waits for those of consumers whose heartbeat has not
    /// expired (a killed consumer's list is recovered once it expires) before it ends,
    /// and reports what it left when the wait ran out. Default: `Ok(vec![])` (a broker
    /// that puts a dead consumer's messages back by itself).
    fn held_elsewhere<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Vec<super::depth::HeldElsewhere>, TransportError>> {
        let _ = queue;
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Graceful stop of the consumer [`start_consumer`](Self::start_consumer) started on
    /// `queue`: its background work ends (Redis: the heartbeat is deregistered; in-flight
    /// messages it still holds, if any, stay where they are for the other consumers'
    /// recovery). Default: `Ok(())`.
    fn leave<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = queue;
        Box::pin(std::future::ready(Ok(())))
    }

    /// How many messages `queue` holds: ready, delayed and in flight (every consumer).
    /// The runtime samples it for the `babelqueue_queue_depth` gauge (feature `metrics`).
    /// Default: [`TransportError::Unsupported`] (the gauge is then not reported).
    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueDepth, TransportError>> {
        let _ = queue;
        Box::pin(std::future::ready(Err(TransportError::Unsupported(
            "depth",
        ))))
    }

    /// The server this transport's acks go to, as an identity a store on the same server
    /// produces too (Redis: `host:port/db`): a guard's `remember` for a store there is
    /// then handed to [`ack_and_reserve`](Self::ack_and_reserve) and sent with the ack
    /// (see [`pipelined`](babelqueue_core::pipelined)). Default: `None` (stores write themselves).
    fn pipeline_server(&self) -> Option<&str> {
        None
    }

    /// Whether [`ack_and_reserve`](Self::ack_and_reserve) does the ack and the reserve in
    /// one round trip: the runtime then sends a worker's ack with its next reserve.
    /// Default: `false` (acks are sent at once).
    fn combines_ack_and_reserve(&self) -> bool {
        false
    }

    /// Sends `writes` (store commands for [`pipeline_server`](Self::pipeline_server), in
    /// order), then acks `delivery`, then — when `next` names a queue — reserves its next
    /// message without waiting; in one round trip where the broker allows. The writes
    /// reach the server before the ack: a message never leaves the in-flight state
    /// before its id is remembered.
    ///
    /// An error leaves it unknown which parts were done: the caller retries the writes and
    /// the ack (each is idempotent) with `next: None`. A transport that reserves here must
    /// also make sure a message it moved without the reply arriving is not stranded (the
    /// Redis transport returns such orphans to the queue on its next reserve).
    ///
    /// Default: [`TransportError::Unsupported`] if `writes` is not empty, else
    /// [`ack`](Self::ack) then [`reserve`](Self::reserve) with a zero timeout.
    fn ack_and_reserve<'a>(
        &'a self,
        delivery: &'a Delivery,
        writes: &'a [PipelinedWrite],
        next: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        Box::pin(async move {
            if !writes.is_empty() {
                return Err(TransportError::Unsupported("pipelined writes"));
            }
            self.ack(delivery).await?;
            match next {
                Some(queue) => self.reserve(queue, Duration::ZERO).await,
                None => Ok(None),
            }
        })
    }

    /// Sends `writes` (store commands for [`pipeline_server`](Self::pipeline_server), in
    /// order) on their own: a delivery settled otherwise than by an ack (a handler that
    /// failed after a guard inside it succeeded). Default: [`TransportError::Unsupported`]
    /// if `writes` is not empty.
    fn apply_writes<'a>(
        &'a self,
        writes: &'a [PipelinedWrite],
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if writes.is_empty() {
                Ok(())
            } else {
                Err(TransportError::Unsupported("pipelined writes"))
            }
        })
    }

    /// How many messages one worker of the runtime may hold at once when it reserves
    /// and settles them in batches ([`settle_and_reserve`](Self::settle_and_reserve)),
    /// unless [`App::batch`](super::App::batch) says otherwise: `1` (the default) means
    /// no batches, one worker per message. The Redis transport answers 16.
    fn batch_hint(&self) -> usize {
        1
    }

    /// Settles a batch and refills it, in one round trip where the broker allows: for each
    /// of `settled` in order, its `writes` (store commands for
    /// [`pipeline_server`](Self::pipeline_server)) then its ack; then, when `next` is
    /// `Some((queue, n))`, reserves up to `n` messages of `queue` without waiting (fewer,
    /// or none, when fewer are ready). Each delivery's writes reach the server before its
    /// ack, as in [`ack_and_reserve`](Self::ack_and_reserve).
    ///
    /// An error leaves it unknown which parts were done: the caller retries each settled
    /// delivery's writes and ack on its own (each is idempotent). A transport that
    /// reserves here must make sure messages it moved without the reply arriving are not
    /// stranded (the Redis transport returns such orphans to the queue on its next
    /// reserve).
    ///
    /// Default: [`ack_and_reserve`](Self::ack_and_reserve) of each settled delivery with
    /// no next queue, then [`reserve`](Self::reserve) with a zero timeout until `n`
    /// arrived or the queue had none.
    ///
    /// ```
    /// use std::time::Duration;
    /// use babelqueue_runtime::{InMemoryTransport, Settled, Transport};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let t = InMemoryTransport::new();
    /// for body in [&b"a"[..], b"b", b"c"] {
    ///     t.publish_raw("jobs", body.to_vec()).await?;
    /// }
    /// let first = t.settle_and_reserve(&[], Some(("jobs", 2))).await?;
    /// assert_eq!(first.len(), 2);
    /// let acks: Vec<Settled<'_>> = first.iter().map(Settled::ack).collect();
    /// let rest = t.settle_and_reserve(&acks, Some(("jobs", 2))).await?;
    /// assert_eq!(rest.len(), 1, "only one was left");
    /// assert_eq!(t.processing_len("jobs"), 1);
    /// # Ok::<(), babelqueue_runtime::TransportError>(())
    /// # }).unwrap();
    /// ```
    fn settle_and_reserve<'a>(
        &'a self,
        settled: &'a [Settled<'a>],
        next: Option<(&'a str, usize)>,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            for s in settled {
                self.ack_and_reserve(s.delivery, s.writes, None).await?;
            }
            let mut got = Vec::new();
            if let Some((queue, n)) = next {
                while got.len() < n {
                    match self.reserve(queue, Duration::ZERO).await? {
                        Some(d) => got.push(d),
                        None => break,
                    }
                }
            }
            Ok(got)
        })
    }

    /// Publishes an envelope body with out-of-band headers. The default writes a header
    /// frame when `headers` is non-empty (the list transports' convention); a broker with
    /// native headers overrides it.
    fn publish_with_headers<'a>(
        &'a self,
        queue: &'a str,
        body: &'a [u8],
        headers: Option<&'a Headers>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let element = encode_element(body, headers)?;
            self.publish_raw(queue, element).await
        })
    }

    /// Publishes an envelope (its canonical encoding) to `queue`.
    fn publish<'a>(
        &'a self,
        queue: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move { self.publish_raw(queue, envelope.encode()).await })
    }
}

impl<T: Transport + ?Sized> Transport for std::sync::Arc<T> {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::publish_raw(self, queue, element)
    }
    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        T::reserve(self, queue, timeout)
    }
    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        T::ack(self, delivery)
    }
    fn requeue_processing<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        T::requeue_processing(self, queue)
    }
    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        republish: Republish,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::requeue(self, delivery, republish, delay)
    }
    fn attempts(&self, body_attempts: u32, delivery: &Delivery) -> u32 {
        T::attempts(self, body_attempts, delivery)
    }
    fn dead_letter_queue(&self, queue: &str, suffix: &str) -> Option<String> {
        T::dead_letter_queue(self, queue, suffix)
    }
    fn start_consumer<'a>(
        &'a self,
        queue: &'a str,
        options: &'a ConsumerOptions,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::start_consumer(self, queue, options)
    }
    fn promote_due<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        T::promote_due(self, queue, limit)
    }
    fn next_due<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Option<Duration>, TransportError>> {
        T::next_due(self, queue)
    }
    fn leave<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(), TransportError>> {
        T::leave(self, queue)
    }
    fn held_elsewhere<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Vec<super::depth::HeldElsewhere>, TransportError>> {
        T::held_elsewhere(self, queue)
    }
    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueDepth, TransportError>> {
        T::depth(self, queue)
    }
    fn publish_with_headers<'a>(
        &'a self,
        queue: &'a str,
        body: &'a [u8],
        headers: Option<&'a Headers>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::publish_with_headers(self, queue, body, headers)
    }
    fn pipeline_server(&self) -> Option<&str> {
        T::pipeline_server(self)
    }
    fn combines_ack_and_reserve(&self) -> bool {
        T::combines_ack_and_reserve(self)
    }
    fn ack_and_reserve<'a>(
        &'a self,
        delivery: &'a Delivery,
        writes: &'a [PipelinedWrite],
        next: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        T::ack_and_reserve(self, delivery, writes, next)
    }
    fn apply_writes<'a>(
        &'a self,
        writes: &'a [PipelinedWrite],
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::apply_writes(self, writes)
    }
    fn batch_hint(&self) -> usize {
        T::batch_hint(self)
    }
    fn settle_and_reserve<'a>(
        &'a self,
        settled: &'a [Settled<'a>],
        next: Option<(&'a str, usize)>,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, TransportError>> {
        T::settle_and_reserve(self, settled, next)
    }
    fn publish<'a>(
        &'a self,
        queue: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::publish(self, queue, envelope)
    }
}
