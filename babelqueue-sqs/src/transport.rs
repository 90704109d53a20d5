//! [`SqsTransport`]: the runtime's [`Transport`] on Amazon SQS, on the official AWS SDK.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use babelqueue_core::binding::sqs;
use babelqueue_core::binding::{BrokerUrl, SqsUrl};
use babelqueue_runtime::handler::BoxFuture;
use babelqueue_runtime::{
    ConsumerOptions, Delivery, Headers, QueueDepth, Republish, Transport, TransportError,
};
use tokio::time::Instant;

use crate::attributes::{message_attributes, out_of_band};
use crate::batch::{Batcher, Flush, MAX_ENTRIES};
use crate::names::{dead_letter_queue, validate_queue_name};

/// SQS's longest `DelaySeconds`: 15 minutes.
pub const MAX_DELAY: Duration = Duration::from_secs(900);

/// SQS's longest total visibility of one receive: 12 hours.
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// The in-flight lease when neither the URL (`visibility_timeout=`) nor
/// [`SqsTransport::visibility_timeout`] sets one: SQS's own default, 30 s.
pub const DEFAULT_VISIBILITY: Duration = Duration::from_secs(30);

/// SQS's longest long-poll wait.
pub const MAX_WAIT: Duration = Duration::from_secs(20);

/// The message attribute that carries the due time (Unix ms) of a retry delayed past
/// [`MAX_DELAY`]: the copy is published with the maximum `DelaySeconds`, and a consumer of
/// this transport that receives it early hides it again (visibility) until it is due.
pub const NOT_BEFORE: &str = "bq-not-before";

/// SQS's cap on a message (and on a batch call's payload): 256 KiB.
const MAX_PAYLOAD: usize = 256 * 1024;

/// The longest [`Transport::next_due`] answers while messages are delayed.
const DUE_POLL: Duration = Duration::from_millis(200);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Whole seconds, rounded up (SQS counts delays and visibility in seconds; a retry is
/// never due early).
fn ceil_secs(d: Duration) -> i32 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(s).unwrap_or(i32::MAX)
}

/// An SDK error as a [`TransportError`]: a request that did not get an answer (dispatch,
/// timeout, an unreadable response) is [`TransportError::Connection`]; SQS's refusals are
/// [`TransportError::Backend`]. The message names the operation and the queue.
fn sdk_err<E, R>(op: &str, queue: &str, e: SdkError<E, R>) -> TransportError
where
    E: std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let msg = format!("SQS {op} on `{queue}`: {}", DisplayErrorContext(&e));
    match e {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            TransportError::connection(msg)
        }
        _ => TransportError::backend(msg),
    }
}

fn code_of<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> Option<String> {
    e.as_service_error()
        .and_then(|s| s.code())
        .map(str::to_owned)
}

/// Codes SQS answers for a receipt that no longer settles anything: the message was
/// deleted, or its visibility ran out and it was (or will be) received again.
fn receipt_gone(code: &str) -> bool {
    matches!(
        code,
        "ReceiptHandleIsInvalid"
            | "AWS.SimpleQueueService.ReceiptHandleIsInvalid"
            | "MessageNotInflight"
            | "AWS.SimpleQueueService.MessageNotInflight"
            | "InvalidParameterValue"
    )
}

/// One message to send.
struct Outgoing {
    body: String,
    attributes: HashMap<String, MessageAttributeValue>,
    delay: i32,
    group: Option<String>,
    dedup: Option<String>,
}

/// A queue this transport talks to: its URL, what is received and not yet handed out,
/// and its batchers.
struct Queue {
    name: String,
    url: String,
    fifo: bool,
    buffer: tokio::sync::Mutex<VecDeque<Delivery>>,
    sends: Batcher<Outgoing>,
    deletes: Batcher<String>,
}

/// A received message not settled yet: its visibility is extended while it is held.
struct Held {
    queue: Arc<Queue>,
    receipt: String,
    received: Instant,
    visible_until: Instant,
}

struct Inner {
    client: Client,
    url: SqsUrl,
    lease: Mutex<Duration>,
    receive_max: AtomicUsize,
    extend: AtomicBool,
    create: AtomicBool,
    queues: Mutex<HashMap<String, Arc<Queue>>>,
    resolving: tokio::sync::Mutex<()>,
    held: Mutex<HashMap<u64, Held>>,
    next_tag: AtomicU64,
    extender: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Per queue: when the last retry this transport hid by visibility becomes visible.
    hidden_until: Mutex<HashMap<String, Instant>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(h) = lock(&self.extender).take() {
            h.abort();
        }
    }
}

/// The Amazon SQS transport: the family's SQS binding for the runtime's
/// [`App`](babelqueue_runtime::App).
///
/// - **Publish**: `SendMessage` with the envelope as the body, byte for byte (SQS bodies
///   are text: a body that is not UTF-8 is an error), and the binding's
///   `MessageAttributes` (`bq-job`, `bq-trace-id`, `bq-message-id`, `bq-schema-version`,
///   `bq-source-lang`, `bq-created-at`; `babelqueue_core::binding::sqs`) followed by the
///   out-of-band headers as `String` attributes, up to SQS's 10. Publishes that are
///   concurrent (the runtime's retries and dead letters from several workers, an outbox
///   relay, [`publish_batch`](Self::publish_batch)) go out as one `SendMessageBatch` of up
///   to 10; a lone publish is sent at once, never held back to wait for company. A FIFO
///   queue (`….fifo`) gets `MessageGroupId` = the URL's `group_id` or the queue name, and
///   `MessageDeduplicationId` = `meta.id` unless `content_dedup=1`.
/// - **Queues** are addressed by name: the URL comes from `GetQueueUrl` once per queue
///   (cached; `prefix=` in the URL skips the call), and a queue that does not exist is
///   created (`CreateQueue`, with `FifoQueue` for a `.fifo` name; no other attributes),
///   unless [`create_queues(false)`](Self::create_queues) (the Python SDK creates none).
///   Names are checked first: SQS allows only letters, digits, `-`, `_` (and a `.fifo`
///   suffix), so a `.` or `:` is a clear error ([`validate_queue_name`](crate::validate_queue_name)).
/// - **Consume**: `ReceiveMessage` long-polls (up to 20 s, or the reserve's timeout) for
///   up to 10 messages with `VisibilityTimeout` = the in-flight lease; they are buffered
///   and handed out one per reserve. A delivery's body is the SQS body, its out-of-band
///   headers the attributes outside the projection, its delivery count
///   `ApproximateReceiveCount`: [`attempts`](Transport::attempts) is the binding's
///   `max(body, ApproximateReceiveCount − 1)`.
/// - **The visibility timeout is the in-flight lease** (URL `visibility_timeout=`, or
///   [`visibility_timeout`](Self::visibility_timeout), default 30 s). While a message is
///   held (buffered or being handled) a background task of the transport extends it with
///   `ChangeMessageVisibilityBatch` whenever half of it is left, like the lease renewal
///   of the stores. A crashed consumer stops extending: its messages reappear when their
///   visibility runs out and the idempotency guard absorbs the redelivery. SQS caps one
///   receive's visibility at 12 hours; a handler running longer loses its message to
///   another consumer.
/// - **Ack**: `DeleteMessage`; acks that are concurrent share a `DeleteMessageBatch` (a
///   lone ack is sent at once). A receipt SQS no longer knows (the visibility ran out and
///   the message went to another consumer) is logged and counts as done: the redelivery
///   is a duplicate the guard absorbs.
/// - **Retry after a delay without holding a worker**: the new copy (the envelope with
///   `attempts + 1`, or the put-back unchanged) is re-published with `DelaySeconds` =
///   the delay rounded up to whole seconds, then the original is deleted. Chosen over
///   setting the original's visibility to the delay because the new copy carries the
///   runtime's own count in its body (the family's rule for every broker), a put-back
///   that must not count an attempt (a dedupe-store outage, an id in flight elsewhere)
///   does not raise `ApproximateReceiveCount`, a release's header count travels with it,
///   and a queue's own redrive policy (`maxReceiveCount`) is not walked towards by retries
///   the runtime already counts. (The Python SDK 1.24 releases by visibility instead and
///   reads `ApproximateReceiveCount`; the binding's `max` rule makes both agree on
///   `attempts` in a mixed fleet.) A crash between the publish and the delete delivers the
///   message twice (the guard absorbs it). **Past 15 minutes** (SQS's `DelaySeconds`
///   maximum) the copy is published with 900 s and the attribute `bq-not-before` (the due
///   time, Unix ms); when a consumer of this transport receives it early, it hides it again
///   with `ChangeMessageVisibility` for the time left (at most 12 h per receive) and does
///   not hand it out (consumers of other SDKs ignore the attribute and run it after 15
///   minutes). On a **FIFO queue**, where `DelaySeconds` is per queue only, a retry sets
///   the original's visibility to the delay instead: its `attempts` then come from
///   `ApproximateReceiveCount`, and the body is unchanged.
/// - **Dead letters** go to the family's `<queue>-dlq` (`<queue>-dlq.fifo`), created on
///   first use, with the family's `dead_letter` block (the runtime builds it). A queue's
///   own SQS `RedrivePolicy` is left as it is and still applies: a message received
///   `maxReceiveCount` times without being deleted (a consumer crashing on it every time)
///   is moved by SQS to its `deadLetterTargetArn`, without the family's block. The
///   runtime's retries re-publish, so they do not count towards it.
///
/// ```no_run
/// use babelqueue_sqs::SqsTransport;
/// use babelqueue_runtime::App;
/// use babelqueue_core::Envelope;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let transport = SqsTransport::connect("sqs://us-east-1?endpoint=http://127.0.0.1:4566").await?;
/// let app = App::new(transport)
///     .queue("orders")
///     .route_sync("urn:babel:orders:created", |_env: &Envelope| ());
/// assert_eq!(app.dead_letter_queue_name(), "orders-dlq");
/// app.publish("urn:babel:orders:created", &serde_json::json!({"order_id": 1042})).await?;
/// let stats = app.drain().await?;
/// assert_eq!(stats.succeeded, 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqsTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SqsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsTransport")
            .field("region", &self.inner.url.region)
            .field("endpoint", &self.inner.url.endpoint)
            .field("lease", &*lock(&self.inner.lease))
            .finish_non_exhaustive()
    }
}

impl SqsTransport {
    /// Connects to SQS as `url` says: `sqs://<region>?endpoint=<url>&…` (the form every
    /// SDK of the family reads; see [`SqsUrl`]). Credentials come from the AWS default
    /// chain (environment, profile, instance role, …). No call is made yet: a wrong
    /// endpoint or missing credentials fail the first operation.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), babelqueue_runtime::TransportError> {
    /// let t = babelqueue_sqs::SqsTransport::connect("sqs://eu-west-1").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        let parsed = match BrokerUrl::parse(url) {
            Ok(BrokerUrl::Sqs(u)) => u,
            Ok(other) => {
                return Err(TransportError::backend(format!(
                    "not an sqs:// URL: {other}"
                )));
            }
            Err(e) => return Err(TransportError::backend(e)),
        };
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(r) = &parsed.region {
            loader = loader.region(aws_config::Region::new(r.clone()));
        }
        if let Some(e) = &parsed.endpoint {
            loader = loader.endpoint_url(e.clone());
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(TransportError::backend(
                "no AWS region: write it in the URL (sqs://us-east-1) or set AWS_REGION",
            ));
        }
        Ok(Self::from_client(Client::new(&config), parsed))
    }

    /// A transport on a client you configured yourself, with the options of `url` (FIFO
    /// group, long-poll wait, visibility, URL prefix; its region and endpoint are the
    /// client's business).
    pub fn from_client(client: Client, url: SqsUrl) -> Self {
        let lease = url
            .visibility_timeout
            .map(|s| Duration::from_secs(u64::from(s.max(1))))
            .unwrap_or(DEFAULT_VISIBILITY);
        SqsTransport {
            inner: Arc::new(Inner {
                client,
                url,
                lease: Mutex::new(lease),
                receive_max: AtomicUsize::new(MAX_ENTRIES),
                extend: AtomicBool::new(true),
                create: AtomicBool::new(true),
                queues: Mutex::new(HashMap::new()),
                resolving: tokio::sync::Mutex::new(()),
                held: Mutex::new(HashMap::new()),
                next_tag: AtomicU64::new(1),
                extender: Mutex::new(None),
                hidden_until: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The in-flight lease: the `VisibilityTimeout` of every receive, renewed while a
    /// message is held (whole seconds, at least 1 s). Clones share it.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), babelqueue_runtime::TransportError> {
    /// use std::time::Duration;
    /// let t = babelqueue_sqs::SqsTransport::connect("sqs://us-east-1").await?
    ///     .visibility_timeout(Duration::from_secs(60));
    /// assert_eq!(t.lease(), Duration::from_secs(60));
    /// # Ok(()) }
    /// ```
    pub fn visibility_timeout(self, lease: Duration) -> Self {
        let secs = ceil_secs(lease).max(1) as u64;
        *lock(&self.inner.lease) = Duration::from_secs(secs).min(MAX_VISIBILITY);
        self
    }

    /// The in-flight lease (see [`visibility_timeout`](Self::visibility_timeout)).
    pub fn lease(&self) -> Duration {
        *lock(&self.inner.lease)
    }

    /// How many messages one receive asks for (1 to 10, default 10).
    pub fn receive_max(self, n: usize) -> Self {
        self.inner
            .receive_max
            .store(n.clamp(1, MAX_ENTRIES), Ordering::Relaxed);
        self
    }

    /// Whether held messages have their visibility extended (default `true`). Turned off,
    /// a message whose handler runs longer than the lease reappears for other consumers
    /// (tests use it to let a lease run out).
    pub fn extend_visibility(self, on: bool) -> Self {
        self.inner.extend.store(on, Ordering::Relaxed);
        self
    }

    /// Whether a queue that does not exist is created on first use (default `true`, as
    /// the RabbitMQ transport declares its queues). `false` is the Python SDK's behaviour:
    /// queues are made by the operator, and a missing one is an error (a dead letter to a
    /// missing `<queue>-dlq` is then retried by the runtime until the queue exists).
    pub fn create_queues(self, on: bool) -> Self {
        self.inner.create.store(on, Ordering::Relaxed);
        self
    }

    /// The AWS SDK client (to inspect queues or messages yourself).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The URL of `queue` (resolved with `GetQueueUrl` and cached; created when missing).
    pub async fn queue_url(&self, queue: &str) -> Result<String, TransportError> {
        Ok(self.queue(queue).await?.url.clone())
    }

    /// Publishes several bodies to `queue` as `SendMessageBatch` calls of up to 10
    /// (each with its attributes); fails with the first failed entry's error.
    pub async fn publish_batch(
        &self,
        queue: &str,
        bodies: Vec<Vec<u8>>,
    ) -> Result<(), TransportError> {
        let q = self.queue(queue).await?;
        let sends: Vec<_> = bodies
            .into_iter()
            .map(|b| {
                let q = Arc::clone(&q);
                let this = self.clone();
                async move { this.send(&q, &b, None, 0, None).await }
            })
            .collect();
        let handles: Vec<_> = sends.into_iter().map(tokio::spawn).collect();
        let mut first = Ok(());
        for h in handles {
            let r = h
                .await
                .unwrap_or_else(|e| Err(TransportError::backend(e.to_string())));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// The queue named `queue`, its URL resolved (and the queue created) once.
    async fn queue(&self, queue: &str) -> Result<Arc<Queue>, TransportError> {
        if let Some(q) = lock(&self.inner.queues).get(queue) {
            return Ok(Arc::clone(q));
        }
        validate_queue_name(queue)?;
        let _one = self.inner.resolving.lock().await;
        if let Some(q) = lock(&self.inner.queues).get(queue) {
            return Ok(Arc::clone(q));
        }
        let url = match &self.inner.url.prefix {
            Some(prefix) => format!("{}/{queue}", prefix.trim_end_matches('/')),
            None => self.resolve(queue).await?,
        };
        let q = Arc::new(self.new_queue(queue, url));
        lock(&self.inner.queues).insert(queue.to_owned(), Arc::clone(&q));
        Ok(q)
    }

    async fn resolve(&self, queue: &str) -> Result<String, TransportError> {
        let client = &self.inner.client;
        match client.get_queue_url().queue_name(queue).send().await {
            Ok(out) => {
                return out.queue_url().map(str::to_owned).ok_or_else(|| {
                    TransportError::backend(format!("SQS GetQueueUrl on `{queue}`: no URL"))
                });
            }
            Err(e)
                if self.inner.create.load(Ordering::Relaxed)
                    && e.as_service_error()
                        .is_some_and(|s| s.is_queue_does_not_exist()) => {}
            Err(e) => return Err(sdk_err("GetQueueUrl", queue, e)),
        }
        let mut create = client.create_queue().queue_name(queue);
        if sqs::is_fifo(queue) {
            create = create.attributes(QueueAttributeName::FifoQueue, "true");
            if self.inner.url.content_dedup {
                create = create.attributes(QueueAttributeName::ContentBasedDeduplication, "true");
            }
        }
        let out = create
            .send()
            .await
            .map_err(|e| sdk_err("CreateQueue", queue, e))?;
        tracing::info!(queue, "created the SQS queue");
        out.queue_url()
            .map(str::to_owned)
            .ok_or_else(|| TransportError::backend(format!("SQS CreateQueue on `{queue}`: no URL")))
    }

    fn new_queue(&self, name: &str, url: String) -> Queue {
        let client = self.inner.client.clone();
        let (qurl, qname) = (url.clone(), name.to_owned());
        let sends: Flush<Outgoing> = Arc::new(move |items: Vec<Outgoing>| {
            let (client, qurl, qname) = (client.clone(), qurl.clone(), qname.clone());
            Box::pin(async move { send_flush(&client, &qurl, &qname, items).await })
        });
        let client = self.inner.client.clone();
        let (qurl, qname) = (url.clone(), name.to_owned());
        let deletes: Flush<String> = Arc::new(move |items: Vec<String>| {
            let (client, qurl, qname) = (client.clone(), qurl.clone(), qname.clone());
            Box::pin(async move { delete_flush(&client, &qurl, &qname, items).await })
        });
        Queue {
            name: name.to_owned(),
            url,
            fifo: sqs::is_fifo(name),
            buffer: tokio::sync::Mutex::new(VecDeque::new()),
            sends: Batcher::new(sends, MAX_PAYLOAD),
            deletes: Batcher::new(deletes, usize::MAX),
        }
    }

    /// Sends `body` with its attributes (and `headers`) to `q` after `delay` seconds.
    async fn send(
        &self,
        q: &Queue,
        body: &[u8],
        headers: Option<&Headers>,
        delay: i32,
        not_before: Option<u128>,
    ) -> Result<(), TransportError> {
        let text = std::str::from_utf8(body).map_err(|_| {
            TransportError::backend(format!(
                "SQS message bodies are text: a body for `{}` is not UTF-8",
                q.name
            ))
        })?;
        let mut extra = headers.cloned().unwrap_or_default();
        if let Some(at) = not_before {
            // First among the out-of-band attributes: it must fit under the cap of 10.
            let mut h = Headers::new();
            h.insert(NOT_BEFORE.to_owned(), at.to_string().into());
            h.extend(extra.into_iter().filter(|(k, _)| k != NOT_BEFORE));
            extra = h;
        }
        let attributes = message_attributes(body, Some(&extra).filter(|h| !h.is_empty()))?;
        let weight = text.len()
            + attributes
                .iter()
                .map(|(k, v)| k.len() + v.data_type().len() + v.string_value().map_or(0, str::len))
                .sum::<usize>();
        let (group, dedup) = if q.fifo {
            let group = self
                .inner
                .url
                .group_id
                .clone()
                .unwrap_or_else(|| q.name.clone());
            let dedup = if self.inner.url.content_dedup {
                None
            } else {
                Some(
                    meta_id(body)
                        .map(|id| id.chars().take(128).collect())
                        .unwrap_or_else(|| format!("{:x}", fnv(body))),
                )
            };
            (Some(group), dedup)
        } else {
            (None, None)
        };
        let out = Outgoing {
            body: text.to_owned(),
            attributes,
            delay: if q.fifo { 0 } else { delay },
            group,
            dedup,
        };
        q.sends.submit(out, weight).await
    }

    fn register(&self, q: &Arc<Queue>, receipt: &str, lease: Duration) -> u64 {
        let tag = self.inner.next_tag.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        lock(&self.inner.held).insert(
            tag,
            Held {
                queue: Arc::clone(q),
                receipt: receipt.to_owned(),
                received: now,
                visible_until: now + lease,
            },
        );
        tag
    }

    fn ensure_extender(&self) {
        let mut slot = lock(&self.inner.extender);
        if slot.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        *slot = Some(tokio::spawn(extend_loop(weak)));
    }

    /// One `ReceiveMessage` into the buffer of `q`, waiting up to `wait`.
    async fn receive(
        &self,
        q: &Arc<Queue>,
        buffer: &mut VecDeque<Delivery>,
        wait: Duration,
    ) -> Result<(), TransportError> {
        let lease = self.lease();
        let wait_cap = self
            .inner
            .url
            .wait_time
            .map_or(MAX_WAIT, |s| Duration::from_secs(u64::from(s)))
            .min(MAX_WAIT);
        let out = self
            .inner
            .client
            .receive_message()
            .queue_url(&q.url)
            .max_number_of_messages(self.inner.receive_max.load(Ordering::Relaxed) as i32)
            .wait_time_seconds(ceil_secs(wait.min(wait_cap)))
            .visibility_timeout(ceil_secs(lease))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| sdk_err("ReceiveMessage", &q.name, e))?;
        let now = now_ms();
        for m in out.messages() {
            let (Some(receipt), body) = (m.receipt_handle(), m.body().unwrap_or_default()) else {
                continue;
            };
            let attrs = m.message_attributes();
            if let Some(due) = attrs
                .and_then(|a| a.get(NOT_BEFORE))
                .and_then(|v| v.string_value())
                .and_then(|v| v.trim().parse::<u128>().ok())
                .filter(|due| *due > now + 1000)
            {
                let left = Duration::from_millis(u64::try_from(due - now).unwrap_or(u64::MAX));
                if let Err(error) = self.hide_until(q, receipt, left).await {
                    // Not handed out either way: it reappears when this receive's
                    // visibility runs out, and is hidden again then.
                    tracing::warn!(queue = %q.name, %error, "hiding an early retry failed");
                }
                continue;
            }
            let count = m
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                .and_then(|c| c.trim().parse::<u32>().ok());
            let mut headers = out_of_band(attrs);
            headers.shift_remove(NOT_BEFORE);
            let tag = self.register(q, receipt, lease);
            let mut d = Delivery::native(&q.name, body.as_bytes().to_vec(), headers, tag)
                .with_receipt(receipt);
            if let Some(c) = count {
                d = d.with_delivery_count(c);
            }
            buffer.push_back(d);
        }
        if !buffer.is_empty() && self.inner.extend.load(Ordering::Relaxed) {
            self.ensure_extender();
        }
        Ok(())
    }

    /// Sets the visibility of a received message to `delay` (capped at 12 h), so it
    /// reappears then; remembered for [`next_due`](Transport::next_due).
    async fn hide_until(
        &self,
        q: &Queue,
        receipt: &str,
        delay: Duration,
    ) -> Result<(), TransportError> {
        let delay = delay.min(MAX_VISIBILITY - Duration::from_secs(60));
        match self
            .inner
            .client
            .change_message_visibility()
            .queue_url(&q.url)
            .receipt_handle(receipt)
            .visibility_timeout(ceil_secs(delay))
            .send()
            .await
        {
            Ok(_) => {}
            Err(e) if code_of(&e).as_deref().is_some_and(receipt_gone) => {
                tracing::warn!(queue = %q.name, "the message to hide is gone already");
            }
            Err(e) => return Err(sdk_err("ChangeMessageVisibility", &q.name, e)),
        }
        let due = Instant::now() + delay;
        let mut hidden = lock(&self.inner.hidden_until);
        let at = hidden.entry(q.name.clone()).or_insert(due);
        *at = (*at).max(due);
        Ok(())
    }

    async fn reserve_impl(
        &self,
        queue: &str,
        timeout: Duration,
    ) -> Result<Option<Delivery>, TransportError> {
        let q = self.queue(queue).await?;
        let deadline = Instant::now() + timeout;
        let mut buffer = if timeout.is_zero() {
            match q.buffer.try_lock() {
                Ok(b) => b,
                Err(_) => return Ok(None),
            }
        } else {
            match tokio::time::timeout_at(deadline, q.buffer.lock()).await {
                Ok(b) => b,
                Err(_) => return Ok(None),
            }
        };
        if let Some(d) = buffer.pop_front() {
            return Ok(Some(d));
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        self.receive(&q, &mut buffer, wait).await?;
        Ok(buffer.pop_front())
    }

    async fn ack_impl(&self, d: &Delivery) -> Result<(), TransportError> {
        let receipt = d.receipt().ok_or_else(|| {
            TransportError::backend("an SQS ack needs a delivery received by an SqsTransport")
        })?;
        let q = self.queue(d.queue()).await?;
        q.deletes.submit(receipt.to_owned(), 0).await?;
        lock(&self.inner.held).remove(&d.tag());
        Ok(())
    }

    async fn requeue_impl(
        &self,
        d: &Delivery,
        republish: &Republish,
        delay: Duration,
    ) -> Result<(), TransportError> {
        let q = self.queue(d.queue()).await?;
        let receipt = d.receipt().ok_or_else(|| {
            TransportError::backend("an SQS requeue needs a delivery received by an SqsTransport")
        })?;
        if q.fifo {
            // FIFO queues have no per-message delay: the original becomes visible again
            // after `delay` (its attempts then come from ApproximateReceiveCount).
            self.hide_until(&q, receipt, delay).await?;
            lock(&self.inner.held).remove(&d.tag());
            return Ok(());
        }
        let (seconds, not_before) = if delay > MAX_DELAY {
            (ceil_secs(MAX_DELAY), Some(now_ms() + delay.as_millis()))
        } else {
            (ceil_secs(delay), None)
        };
        self.send(
            &q,
            republish.body(d),
            republish.headers(d),
            seconds,
            not_before,
        )
        .await?;
        if let Some(due) = delay.checked_sub(Duration::ZERO).filter(|d| !d.is_zero()) {
            let due = Instant::now() + due;
            let mut hidden = lock(&self.inner.hidden_until);
            let at = hidden.entry(q.name.clone()).or_insert(due);
            *at = (*at).max(due);
        }
        q.deletes.submit(receipt.to_owned(), 0).await?;
        lock(&self.inner.held).remove(&d.tag());
        Ok(())
    }

    async fn attributes_of(&self, q: &Queue) -> Result<(u64, u64, u64), TransportError> {
        let out = self
            .inner
            .client
            .get_queue_attributes()
            .queue_url(&q.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| sdk_err("GetQueueAttributes", &q.name, e))?;
        let get = |name: QueueAttributeName| {
            out.attributes()
                .and_then(|a| a.get(&name))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok((
            get(QueueAttributeName::ApproximateNumberOfMessages),
            get(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
            get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        ))
    }

    async fn next_due_impl(&self, queue: &str) -> Result<Option<Duration>, TransportError> {
        let q = self.queue(queue).await?;
        match q.buffer.try_lock() {
            Ok(b) if !b.is_empty() => return Ok(Some(Duration::ZERO)),
            Ok(_) => {}
            // A reserve is receiving right now.
            Err(_) => return Ok(Some(Duration::ZERO)),
        }
        let (ready, delayed, _) = self.attributes_of(&q).await?;
        if ready > 0 {
            return Ok(Some(Duration::ZERO));
        }
        let hidden = lock(&self.inner.hidden_until)
            .get(queue)
            .map(|at| at.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero());
        if delayed > 0 || hidden.is_some() {
            return Ok(Some(hidden.unwrap_or(DUE_POLL).min(DUE_POLL)));
        }
        Ok(None)
    }

    async fn depth_impl(&self, queue: &str) -> Result<QueueDepth, TransportError> {
        let q = self.queue(queue).await?;
        let (ready, delayed, not_visible) = self.attributes_of(&q).await?;
        Ok(QueueDepth::new(ready, delayed, not_visible))
    }

    /// Stops extending the messages of `queue` this transport holds, and makes those
    /// received but not handed out visible again at once.
    async fn leave_impl(&self, queue: &str) -> Result<(), TransportError> {
        let Some(q) = lock(&self.inner.queues).get(queue).cloned() else {
            return Ok(());
        };
        let buffered: Vec<Delivery> = q.buffer.lock().await.drain(..).collect();
        lock(&self.inner.held).retain(|_, h| h.queue.name != queue);
        for chunk in buffered.chunks(MAX_ENTRIES) {
            let entries: Vec<_> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, d)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(d.receipt()?)
                        .visibility_timeout(0)
                        .build()
                        .ok()
                })
                .collect();
            self.inner
                .client
                .change_message_visibility_batch()
                .queue_url(&q.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| sdk_err("ChangeMessageVisibilityBatch", queue, e))?;
        }
        Ok(())
    }
}

/// `meta.id` of a body (a string, or a number as its decimal text), if non-empty.
fn meta_id(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    match v.get("meta")?.get("id")? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A stable hash of a body: the deduplication id of a FIFO message without `meta.id`.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

async fn send_flush(
    client: &Client,
    url: &str,
    queue: &str,
    items: Vec<Outgoing>,
) -> Vec<Result<(), TransportError>> {
    if items.len() == 1 {
        let o = items.into_iter().next().expect("one item");
        let r = client
            .send_message()
            .queue_url(url)
            .message_body(o.body)
            .set_message_attributes(Some(o.attributes).filter(|a| !a.is_empty()))
            .set_delay_seconds(Some(o.delay).filter(|d| *d > 0))
            .set_message_group_id(o.group)
            .set_message_deduplication_id(o.dedup)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_err("SendMessage", queue, e));
        return vec![r];
    }
    let n = items.len();
    let entries: Result<Vec<_>, _> = items
        .into_iter()
        .enumerate()
        .map(|(i, o)| {
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(o.body)
                .set_message_attributes(Some(o.attributes).filter(|a| !a.is_empty()))
                .set_delay_seconds(Some(o.delay).filter(|d| *d > 0))
                .set_message_group_id(o.group)
                .set_message_deduplication_id(o.dedup)
                .build()
        })
        .collect();
    let entries = match entries {
        Ok(e) => e,
        Err(e) => {
            let msg = format!("SQS SendMessageBatch on `{queue}`: {e}");
            return (0..n)
                .map(|_| Err(TransportError::backend(msg.clone())))
                .collect();
        }
    };
    match client
        .send_message_batch()
        .queue_url(url)
        .set_entries(Some(entries))
        .send()
        .await
    {
        Ok(out) => {
            let mut results: Vec<Result<(), TransportError>> = (0..n)
                .map(|_| {
                    Err(TransportError::backend(format!(
                        "SQS SendMessageBatch on `{queue}`: no answer for the entry"
                    )))
                })
                .collect();
            for ok in out.successful() {
                if let Some(r) = ok
                    .id()
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| results.get_mut(i))
                {
                    *r = Ok(());
                }
            }
            for f in out.failed() {
                if let Some(r) = f
                    .id()
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| results.get_mut(i))
                {
                    *r = Err(TransportError::backend(format!(
                        "SQS SendMessageBatch on `{queue}`: {} ({})",
                        f.message().unwrap_or_default(),
                        f.code()
                    )));
                }
            }
            results
        }
        Err(e) => {
            let connection = matches!(
                e,
                SdkError::DispatchFailure(_)
                    | SdkError::TimeoutError(_)
                    | SdkError::ResponseError(_)
            );
            let msg = format!(
                "SQS SendMessageBatch on `{queue}`: {}",
                DisplayErrorContext(&e)
            );
            (0..n)
                .map(|_| {
                    if connection {
                        Err(TransportError::connection(msg.clone()))
                    } else {
                        Err(TransportError::backend(msg.clone()))
                    }
                })
                .collect()
        }
    }
}

async fn delete_flush(
    client: &Client,
    url: &str,
    queue: &str,
    receipts: Vec<String>,
) -> Vec<Result<(), TransportError>> {
    let gone = |code: &str| {
        tracing::warn!(
            queue,
            code,
            "ack: SQS no longer knows the receipt (the visibility ran out, so the message is delivered again; the guard absorbs the duplicate)"
        );
    };
    if receipts.len() == 1 {
        let receipt = receipts.into_iter().next().expect("one receipt");
        let r = match client
            .delete_message()
            .queue_url(url)
            .receipt_handle(receipt)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if code_of(&e).as_deref().is_some_and(receipt_gone) => {
                gone(code_of(&e).as_deref().unwrap_or_default());
                Ok(())
            }
            Err(e) => Err(sdk_err("DeleteMessage", queue, e)),
        };
        return vec![r];
    }
    let n = receipts.len();
    let entries: Vec<_> = receipts
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(r)
                .build()
                .ok()
        })
        .collect();
    match client
        .delete_message_batch()
        .queue_url(url)
        .set_entries(Some(entries))
        .send()
        .await
    {
        Ok(out) => {
            let mut results: Vec<Result<(), TransportError>> = (0..n).map(|_| Ok(())).collect();
            for f in out.failed() {
                if receipt_gone(f.code()) {
                    gone(f.code());
                    continue;
                }
                if let Some(r) = f
                    .id()
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| results.get_mut(i))
                {
                    *r = Err(TransportError::backend(format!(
                        "SQS DeleteMessageBatch on `{queue}`: {} ({})",
                        f.message().unwrap_or_default(),
                        f.code()
                    )));
                }
            }
            results
        }
        Err(e) => {
            let err = sdk_err("DeleteMessageBatch", queue, e);
            let connection = err.is_connection();
            let msg = format!("{:?}", err);
            (0..n)
                .map(|_| {
                    if connection {
                        Err(TransportError::connection(msg.clone()))
                    } else {
                        Err(TransportError::backend(msg.clone()))
                    }
                })
                .collect()
        }
    }
}

/// The background task that extends the visibility of held messages: wakes every third of
/// the lease, and renews (to a full lease) every message with half of it or less left.
async fn extend_loop(weak: Weak<Inner>) {
    loop {
        let period = match weak.upgrade() {
            Some(inner) => (*lock(&inner.lease) / 3).max(Duration::from_millis(100)),
            None => return,
        };
        tokio::time::sleep(period).await;
        let Some(inner) = weak.upgrade() else { return };
        if !inner.extend.load(Ordering::Relaxed) {
            continue;
        }
        extend_due(&inner).await;
    }
}

async fn extend_due(inner: &Inner) {
    let lease = *lock(&inner.lease);
    let now = Instant::now();
    // Per queue URL: the queue and its (tag, receipt) pairs to renew.
    type Due = HashMap<String, (Arc<Queue>, Vec<(u64, String)>)>;
    let mut due: Due = HashMap::new();
    {
        let mut held = lock(&inner.held);
        held.retain(|_, h| {
            let keep = now.duration_since(h.received) + lease < MAX_VISIBILITY;
            if !keep {
                tracing::warn!(queue = %h.queue.name, "a message held for 12 hours can no longer be extended; it reappears when its visibility runs out");
            }
            keep
        });
        for (tag, h) in held.iter() {
            if h.visible_until.saturating_duration_since(now) <= lease / 2 {
                due.entry(h.queue.url.clone())
                    .or_insert_with(|| (Arc::clone(&h.queue), Vec::new()))
                    .1
                    .push((*tag, h.receipt.clone()));
            }
        }
    }
    let secs = ceil_secs(lease);
    for (_, (q, list)) in due {
        for chunk in list.chunks(MAX_ENTRIES) {
            let entries: Vec<_> = chunk
                .iter()
                .filter_map(|(tag, receipt)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(tag.to_string())
                        .receipt_handle(receipt)
                        .visibility_timeout(secs)
                        .build()
                        .ok()
                })
                .collect();
            let sent = Instant::now();
            match inner
                .client
                .change_message_visibility_batch()
                .queue_url(&q.url)
                .set_entries(Some(entries))
                .send()
                .await
            {
                Ok(out) => {
                    let mut held = lock(&inner.held);
                    for ok in out.successful() {
                        if let Some(h) = ok.id().parse::<u64>().ok().and_then(|t| held.get_mut(&t))
                        {
                            h.visible_until = sent + lease;
                        }
                    }
                    for f in out.failed() {
                        tracing::warn!(queue = %q.name, code = f.code(), "extending a message's visibility failed");
                        if receipt_gone(f.code())
                            && let Ok(t) = f.id().parse::<u64>()
                        {
                            held.remove(&t);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(queue = %q.name, error = %DisplayErrorContext(&e), "extending visibility failed; retried on the next tick");
                }
            }
        }
    }
}

impl Transport for SqsTransport {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let q = self.queue(queue).await?;
            self.send(&q, &element, None, 0, None).await
        })
    }

    fn publish_with_headers<'a>(
        &'a self,
        queue: &'a str,
        body: &'a [u8],
        headers: Option<&'a Headers>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let q = self.queue(queue).await?;
            self.send(&q, body, headers, 0, None).await
        })
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

    fn attempts(&self, body_attempts: u32, delivery: &Delivery) -> u32 {
        let count = delivery.delivery_count().map(|c| c.to_string());
        sqs::reconcile_attempts(body_attempts, count.as_deref())
    }

    fn dead_letter_queue(&self, queue: &str, suffix: &str) -> Option<String> {
        Some(dead_letter_queue(queue, suffix))
    }

    fn start_consumer<'a>(
        &'a self,
        queue: &'a str,
        options: &'a ConsumerOptions,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = options;
        Box::pin(async move {
            self.queue(queue).await?;
            if self.inner.extend.load(Ordering::Relaxed) {
                self.ensure_extender();
            }
            Ok(())
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
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1001)), 2);
    }

    #[tokio::test]
    async fn bad_urls_and_names_are_clear_errors() {
        let err = SqsTransport::connect("redis://localhost")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("broker error"), "{err}");
        let t = SqsTransport::connect("sqs://us-east-1?endpoint=http://127.0.0.1:1")
            .await
            .unwrap();
        let err = t
            .publish_raw("orders.dlq", b"{}".to_vec())
            .await
            .unwrap_err();
        let chain = std::error::Error::source(&err).unwrap().to_string();
        assert!(chain.contains("not a valid SQS queue name"), "{chain}");
        assert_eq!(
            t.dead_letter_queue("orders.fifo", ".dlq").as_deref(),
            Some("orders-dlq.fifo")
        );
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_a_connection_error() {
        let t = SqsTransport::connect("sqs://us-east-1?endpoint=http://127.0.0.1:1")
            .await
            .unwrap();
        let err = t
            .reserve("orders", Duration::ZERO)
            .await
            .expect_err("nothing listens on port 1");
        assert!(err.is_connection(), "{err:?}");
    }
}
