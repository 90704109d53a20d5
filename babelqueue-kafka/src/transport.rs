//! [`KafkaTransport`]: the runtime's [`Transport`] on Apache Kafka, on `rdkafka`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use babelqueue_core::binding::BrokerUrl;
use babelqueue_core::binding::kafka::{self as binding, retry};
use babelqueue_runtime::handler::BoxFuture;
use babelqueue_runtime::{
    ConsumerEvent, ConsumerOptions, Delivery, EventSink, QueueDepth, Republish, Transport,
    TransportError,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use tokio::sync::watch;

use crate::headers::{out_of_band, record_meta};
use crate::offsets::PartitionOffsets;

/// The longest [`Transport::next_due`] answers while something is on its way (a record
/// parked on a retry tier, a consumer not yet assigned, or records not yet fetched).
const DUE_POLL: Duration = Duration::from_millis(100);

/// How long a broker query of the drain's lag check (watermarks, committed offsets) waits.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// The records of each partition of `topic` that the group has not committed:
/// `(partition, from, high watermark)` with `from` the committed offset (else the low
/// watermark), for the partitions where `from < high`, in partition order (blocking: broker
/// round trips).
fn uncommitted(
    c: &BaseConsumer,
    topic: &str,
    committed: &[(i32, i64)],
) -> Result<Vec<(i32, i64, i64)>, KafkaError> {
    let md = c.fetch_metadata(Some(topic), QUERY_TIMEOUT)?;
    let mut ranges = Vec::new();
    for t in md.topics() {
        for p in t.partitions() {
            let (low, high) = c.fetch_watermarks(topic, p.id(), QUERY_TIMEOUT)?;
            let from = committed
                .iter()
                .find(|(id, _)| *id == p.id())
                .map_or(low, |(_, o)| *o)
                .max(low);
            if from < high {
                ranges.push((p.id(), from, high));
            }
        }
    }
    ranges.sort_unstable();
    Ok(ranges)
}

/// How many offsets `from..high` holds.
fn span(from: i64, high: i64) -> u64 {
    u64::try_from(high - from).unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Maps a client error: a broker that cannot be reached or did not answer in time is
/// [`TransportError::Connection`] (the runtime backs off and tries again); anything else
/// (a refused request, a bad configuration) is [`TransportError::Backend`].
fn map_err(e: KafkaError) -> TransportError {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(
            C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::MessageTimedOut
            | C::RequestTimedOut
            | C::OperationTimedOut
            | C::NetworkException
            | C::Resolve
            | C::LeaderNotAvailable
            | C::NotLeaderForPartition
            | C::CoordinatorNotAvailable
            | C::NotCoordinator
            | C::UnknownTopicOrPartition
            | C::UnknownPartition
            | C::UnknownTopic,
        ) => TransportError::connection(e),
        _ => TransportError::backend(e),
    }
}

/// Settings shared by every client a [`KafkaTransport`] creates.
#[derive(Debug, Clone)]
struct Settings {
    brokers: String,
    group: String,
    partitions: i32,
    replication: i32,
    tiers: retry::Tiers,
    reinject: bool,
    create_topics: bool,
    commit_interval: Duration,
    delivery_timeout: Duration,
    config: Vec<(String, String)>,
}

impl Settings {
    fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        c
    }

    fn apply(&self, mut c: ClientConfig) -> ClientConfig {
        for (k, v) in &self.config {
            c.set(k, v);
        }
        c
    }

    fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut c = self.client();
        c.set("group.id", group)
            .set("auto.offset.reset", "earliest")
            // Offsets are stored by the transport only over a settled prefix of each
            // partition (`PartitionOffsets`); librdkafka commits what is stored every
            // `commit_interval`, on a revoke and on close.
            .set("enable.auto.offset.store", "false")
            .set("enable.auto.commit", "true")
            .set(
                "auto.commit.interval.ms",
                self.commit_interval.as_millis().max(1).to_string(),
            );
        self.apply(c)
    }
}

/// Builds a [`KafkaTransport`]: [`KafkaTransport::builder`].
///
/// ```no_run
/// use std::time::Duration;
/// use babelqueue_kafka::KafkaTransport;
/// use babelqueue_core::binding::kafka::retry::Tiers;
///
/// let t = KafkaTransport::builder("kafka://127.0.0.1:9092")?
///     .group("payments-workers")
///     .partitions(6)
///     .retry_tiers(Tiers::new(vec![1_000, 10_000, 60_000]).expect("ascending"))
///     .commit_interval(Duration::from_millis(500))
///     .set("session.timeout.ms", "10000")
///     .build()?;
/// # Ok::<(), babelqueue_runtime::TransportError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct KafkaBuilder {
    settings: Settings,
}

impl KafkaBuilder {
    /// The consumer group (default: the URL's `?group=`, else `babelqueue`, as in every SDK
    /// of the family).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.settings.group = group.into();
        self
    }

    /// Partitions of the topics this transport creates (default 1; a topic that exists is
    /// left as it is).
    pub fn partitions(mut self, n: i32) -> Self {
        self.settings.partitions = n.max(1);
        self
    }

    /// Replication factor of the topics this transport creates (default 1).
    pub fn replication_factor(mut self, n: i32) -> Self {
        self.settings.replication = n.max(1);
        self
    }

    /// The retry tiers (default [`retry::DEFAULT_TIERS_MS`]: 5 s, 30 s, 5 min, 30 min).
    pub fn retry_tiers(mut self, tiers: retry::Tiers) -> Self {
        self.settings.tiers = tiers;
        self
    }

    /// Whether a consumer also runs the re-inject consumer of its queue's retry tiers
    /// (default `true`; turn it off when a separate process, of this SDK or another,
    /// re-injects).
    pub fn reinject(mut self, on: bool) -> Self {
        self.settings.reinject = on;
        self
    }

    /// Whether the transport creates the topics it writes to and reads from (default
    /// `true`, with [`partitions`](Self::partitions) and
    /// [`replication_factor`](Self::replication_factor); an existing topic is not changed).
    pub fn create_topics(mut self, on: bool) -> Self {
        self.settings.create_topics = on;
        self
    }

    /// How often the offsets settled so far are committed (default 1 s; they are also
    /// committed on a rebalance and when the consumer leaves). A crash redelivers what
    /// settled after the last commit; the idempotency guard absorbs it.
    pub fn commit_interval(mut self, every: Duration) -> Self {
        self.settings.commit_interval = every;
        self
    }

    /// How long a produce may wait for the broker's acknowledgement (`message.timeout.ms`,
    /// default 30 s, as the Python SDK's `delivery_timeout`).
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.settings.delivery_timeout = timeout;
        self
    }

    /// Sets a librdkafka property on every client (producer, consumers, admin), after the
    /// transport's own: e.g. `security.protocol`, `sasl.*`, `session.timeout.ms`.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.config.push((key.into(), value.into()));
        self
    }

    /// Creates the producer and the admin client (no connection is made yet: the first
    /// call connects).
    pub fn build(self) -> Result<KafkaTransport, TransportError> {
        let s = self.settings;
        let mut p = s.client();
        p.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "1")
            .set(
                "message.timeout.ms",
                s.delivery_timeout.as_millis().max(1).to_string(),
            );
        let producer: FutureProducer = s.apply(p).create().map_err(TransportError::backend)?;
        let admin: AdminClient<DefaultClientContext> = s
            .apply(s.client())
            .create()
            .map_err(TransportError::backend)?;
        Ok(KafkaTransport {
            inner: Arc::new(Inner {
                settings: s,
                producer,
                admin,
                created: Mutex::new(HashSet::new()),
                consumers: Mutex::new(HashMap::new()),
                starting: tokio::sync::Mutex::new(()),
                next_tag: AtomicU64::new(1),
                parked: AtomicUsize::new(0),
            }),
        })
    }
}

/// The runtime's [`Transport`] on Apache Kafka: topic = queue, the envelope as the record
/// value byte for byte, the binding's headers and record timestamp
/// ([`babelqueue_core::binding::kafka`]); a consumer group per queue with offsets committed
/// only over settled messages; retries parked on the family's retry tier topics; dead
/// letters on `<queue>.dlq`. See the crate docs.
///
/// Cheap to clone (one producer, one admin client and the queues' consumers, shared).
#[derive(Clone)]
pub struct KafkaTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("brokers", &self.inner.settings.brokers)
            .field("group", &self.inner.settings.group)
            .finish_non_exhaustive()
    }
}

struct Inner {
    settings: Settings,
    producer: FutureProducer,
    admin: AdminClient<DefaultClientContext>,
    /// Topics this transport created or found.
    created: Mutex<HashSet<String>>,
    consumers: Mutex<HashMap<String, Arc<QueueConsumer>>>,
    /// Serializes creating consumers.
    starting: tokio::sync::Mutex<()>,
    next_tag: AtomicU64,
    /// Records this transport parked on a retry tier and its re-inject consumers have not
    /// moved back yet (what [`Transport::next_due`] waits for).
    parked: AtomicUsize,
}

/// One message handed out and not settled yet.
struct Held {
    partition: i32,
    offset: i64,
    /// The assignment of the partition it came from (its acks count only in that one).
    epoch: u64,
    attempts: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
}

#[derive(Default)]
struct State {
    /// The assigned partitions: the epoch of their assignment and what is in flight.
    partitions: HashMap<i32, (u64, PartitionOffsets)>,
    in_flight: HashMap<u64, Held>,
    /// A first assignment arrived (possibly empty).
    assigned: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    epochs: AtomicU64,
}

/// The consumer's context: keeps [`State::partitions`] in step with the group's
/// assignment. A revoked partition's trackers are dropped, so the acks of messages still
/// running from it store nothing (its new owner reads from the last commit; the guard
/// absorbs the redelivery).
struct Ctx {
    shared: Arc<Shared>,
}

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut s = lock(&self.shared.state);
            for e in tpl.elements() {
                s.partitions.remove(&e.partition());
            }
            tracing::debug!(partitions = tpl.count(), "kafka: partitions revoked");
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let mut s = lock(&self.shared.state);
            s.assigned = true;
            for e in tpl.elements() {
                let epoch = self.shared.epochs.fetch_add(1, Ordering::Relaxed) + 1;
                s.partitions
                    .insert(e.partition(), (epoch, PartitionOffsets::default()));
            }
            tracing::debug!(partitions = tpl.count(), "kafka: partitions assigned");
        }
    }
}

/// The consumer of one queue (topic) and its re-inject task.
struct QueueConsumer {
    topic: String,
    consumer: StreamConsumer<Ctx>,
    shared: Arc<Shared>,
    reinjector: Mutex<Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)>>,
    /// Held by the one worker taking a record and entering it in [`State`]: records are
    /// then entered in the order the partition hands them out. Without it, a worker
    /// (thread) that took a record and was preempted before entering it let the others
    /// take, settle and store the offsets after it, so the commit passed a record still
    /// running and then went back (seen: 375 entered after 376..399, committed 376).
    receiving: tokio::sync::Mutex<()>,
}

impl QueueConsumer {
    fn tpl(&self, partition: i32, offset: Offset) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        let _ = tpl.add_partition_offset(&self.topic, partition, offset);
        tpl
    }

    /// Whether an assigned partition has records this consumer has not taken yet
    /// (blocking: broker round trips).
    fn lagging(&self, partitions: &[i32]) -> Result<bool, KafkaError> {
        let position = self.consumer.position()?;
        for &p in partitions {
            let (low, high) = self
                .consumer
                .fetch_watermarks(&self.topic, p, QUERY_TIMEOUT)?;
            let pos = match position.find_partition(&self.topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => {
                    let committed = self
                        .consumer
                        .committed_offsets(self.tpl(p, Offset::Invalid), QUERY_TIMEOUT)?;
                    match committed.find_partition(&self.topic, p).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => o,
                        _ => low,
                    }
                }
            };
            if pos < high {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl KafkaTransport {
    /// A builder for `url` (`kafka://host:port[,host:port][?group=…]`, the form every SDK
    /// of the family reads from `BROKER_URL`).
    ///
    /// ```
    /// use babelqueue_kafka::KafkaTransport;
    /// assert!(KafkaTransport::builder("kafka://127.0.0.1:9092").is_ok());
    /// assert!(KafkaTransport::builder("amqp://127.0.0.1").is_err());
    /// ```
    pub fn builder(url: &str) -> Result<KafkaBuilder, TransportError> {
        let k = match BrokerUrl::parse(url).map_err(TransportError::backend)? {
            BrokerUrl::Kafka(k) => k,
            other => {
                return Err(TransportError::backend(format!(
                    "a Kafka transport needs a kafka:// URL, not {}://",
                    other.broker()
                )));
            }
        };
        Ok(KafkaBuilder {
            settings: Settings {
                brokers: k.bootstrap_servers(),
                group: k.group,
                partitions: 1,
                replication: 1,
                tiers: retry::Tiers::new(retry::DEFAULT_TIERS_MS.to_vec())
                    .expect("the default tiers are valid"),
                reinject: true,
                create_topics: true,
                commit_interval: Duration::from_secs(1),
                delivery_timeout: Duration::from_secs(30),
                config: Vec::new(),
            },
        })
    }

    /// A transport for `url` with the defaults (see [`builder`](Self::builder)).
    ///
    /// ```no_run
    /// use babelqueue_kafka::KafkaTransport;
    /// use babelqueue_runtime::Transport;
    /// # async fn demo() -> Result<(), babelqueue_runtime::TransportError> {
    /// let t = KafkaTransport::new("kafka://127.0.0.1:9092")?;
    /// t.publish_raw("jobs", br#"{"job":"urn:babel:jobs:run","data":{}}"#.to_vec()).await?;
    /// # Ok(()) }
    /// ```
    pub fn new(url: &str) -> Result<Self, TransportError> {
        Self::builder(url)?.build()
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.inner.settings.group
    }

    /// The retry tiers.
    pub fn retry_tiers(&self) -> &retry::Tiers {
        &self.inner.settings.tiers
    }

    /// Creates `topic` when this transport creates topics and has not tried yet (an
    /// existing topic is left as it is). A refused or unanswered creation is logged once
    /// and not an error: the topic may exist already, or the broker may create it on first
    /// use (`auto.create.topics.enable`); a produce to a topic that cannot exist fails by
    /// itself.
    pub async fn ensure_topic(&self, topic: &str) -> Result<(), TransportError> {
        let s = &self.inner.settings;
        if !s.create_topics || !lock(&self.inner.created).insert(topic.to_owned()) {
            return Ok(());
        }
        let new = NewTopic::new(topic, s.partitions, TopicReplication::Fixed(s.replication));
        let opts = AdminOptions::new().operation_timeout(Some(Timeout::After(QUERY_TIMEOUT)));
        match self.inner.admin.create_topics([&new], &opts).await {
            Ok(results) => {
                for r in results {
                    match r {
                        Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                        Err((name, code)) => {
                            tracing::warn!(topic = %name, error = %code, "kafka: creating the topic failed; relying on it existing or being created by the broker");
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(topic, error = %e, "kafka: creating the topic failed; relying on it existing or being created by the broker");
            }
        }
        Ok(())
    }

    /// The offsets the group has committed on `topic`'s partitions (`(partition,
    /// offset)`; a partition without a commit is left out). A broker round trip.
    pub async fn committed(&self, topic: &str) -> Result<Vec<(i32, i64)>, TransportError> {
        let s = self.inner.settings.clone();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || -> Result<Vec<(i32, i64)>, KafkaError> {
            let c: BaseConsumer = s.consumer_config(&s.group).create()?;
            let md = c.fetch_metadata(Some(&topic), QUERY_TIMEOUT)?;
            let mut tpl = TopicPartitionList::new();
            for t in md.topics() {
                for p in t.partitions() {
                    tpl.add_partition(&topic, p.id());
                }
            }
            let got = c.committed_offsets(tpl, QUERY_TIMEOUT)?;
            let mut out: Vec<(i32, i64)> = got
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some((e.partition(), o)),
                    _ => None,
                })
                .collect();
            out.sort_unstable();
            Ok(out)
        })
        .await
        .map_err(TransportError::backend)?
        .map_err(map_err)
    }

    /// Reads up to `limit` records of `topic` that the group has not committed yet (from
    /// each partition's committed offset, else its first record, up to its end), without
    /// joining the group and without committing anything: what `babelqueue dlq list` shows
    /// of a dead-letter topic. Returns how many uncommitted records the topic holds in
    /// all, and the values read, partition by partition in offset order. Broker round
    /// trips; a record without a value reads as an empty body.
    pub async fn peek(
        &self,
        topic: &str,
        limit: usize,
    ) -> Result<(u64, Vec<Vec<u8>>), TransportError> {
        let committed = self.committed(topic).await?;
        let s = self.inner.settings.clone();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || -> Result<(u64, Vec<Vec<u8>>), KafkaError> {
            let mut config = s.consumer_config(&s.group);
            config
                .set("enable.auto.commit", "false")
                .set("enable.partition.eof", "false");
            let c: BaseConsumer = config.create()?;
            let ranges = uncommitted(&c, &topic, &committed)?;
            let total = ranges.iter().map(|&(_, from, high)| span(from, high)).sum();
            let mut out = Vec::new();
            for (partition, from, high) in ranges {
                if out.len() >= limit {
                    break;
                }
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(&topic, partition, Offset::Offset(from))?;
                c.assign(&tpl)?;
                let mut next = from;
                let deadline = std::time::Instant::now() + QUERY_TIMEOUT;
                while next < high && out.len() < limit {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(KafkaError::MessageConsumption(
                            RDKafkaErrorCode::RequestTimedOut,
                        ));
                    }
                    match c.poll(left) {
                        Some(Ok(m)) if m.partition() == partition => {
                            next = m.offset() + 1;
                            out.push(m.payload().map(<[u8]>::to_vec).unwrap_or_default());
                        }
                        Some(Ok(_)) | None => {}
                        Some(Err(e)) => return Err(e),
                    }
                }
            }
            Ok((total, out))
        })
        .await
        .map_err(TransportError::backend)?
        .map_err(map_err)
    }

    async fn produce(
        &self,
        topic: &str,
        value: &[u8],
        headers: OwnedHeaders,
        key: Option<&[u8]>,
        timestamp_ms: Option<i64>,
    ) -> Result<(), TransportError> {
        self.ensure_topic(topic).await?;
        let mut record = FutureRecord::<[u8], [u8]>::to(topic)
            .payload(value)
            .headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(ts) = timestamp_ms {
            record = record.timestamp(ts);
        }
        self.inner
            .producer
            .send(record, Timeout::After(self.inner.settings.delivery_timeout))
            .await
            .map(drop)
            .map_err(|(e, _)| map_err(e))
    }

    fn owned_headers(headers: &[(String, String)]) -> OwnedHeaders {
        headers.iter().fold(
            OwnedHeaders::new_with_capacity(headers.len()),
            |h, (k, v)| {
                h.insert(Header {
                    key: k,
                    value: Some(v.as_str()),
                })
            },
        )
    }

    fn consumer_of(&self, queue: &str) -> Option<Arc<QueueConsumer>> {
        lock(&self.inner.consumers).get(queue).cloned()
    }

    /// The consumer of `queue`, created (and its topic) on first use.
    async fn consumer(&self, queue: &str) -> Result<Arc<QueueConsumer>, TransportError> {
        if let Some(c) = self.consumer_of(queue) {
            return Ok(c);
        }
        let _turn = self.inner.starting.lock().await;
        if let Some(c) = self.consumer_of(queue) {
            return Ok(c);
        }
        // Subscribing to a topic that does not exist yet would wait for the next metadata
        // refresh (minutes): create it first.
        self.ensure_topic(queue).await?;
        let s = &self.inner.settings;
        let shared = Arc::new(Shared::default());
        let consumer: StreamConsumer<Ctx> = s
            .consumer_config(&s.group)
            .create_with_context(Ctx {
                shared: shared.clone(),
            })
            .map_err(TransportError::backend)?;
        consumer.subscribe(&[queue]).map_err(map_err)?;
        let c = Arc::new(QueueConsumer {
            topic: queue.to_owned(),
            consumer,
            shared,
            reinjector: Mutex::new(None),
            receiving: tokio::sync::Mutex::new(()),
        });
        lock(&self.inner.consumers).insert(queue.to_owned(), c.clone());
        Ok(c)
    }

    async fn reserve_impl(
        &self,
        queue: &str,
        timeout: Duration,
    ) -> Result<Option<Delivery>, TransportError> {
        let c = self.consumer(queue).await?;
        // The turn is held until the record is entered below (no await in between).
        let taken = tokio::time::timeout(timeout, async {
            let turn = c.receiving.lock().await;
            (turn, c.consumer.recv().await)
        })
        .await;
        let (_turn, msg) = match taken {
            Err(_) => return Ok(None),
            Ok((_, Err(e))) => return Err(map_err(e)),
            Ok((turn, Ok(m))) => (turn, m),
        };
        let tag = self.inner.next_tag.fetch_add(1, Ordering::Relaxed);
        let body = msg.payload().map(<[u8]>::to_vec).unwrap_or_default();
        let mut attempts = None;
        let mut pairs = Vec::new();
        if let Some(h) = msg.headers() {
            for header in h.iter() {
                if header.key == binding::ATTEMPTS && attempts.is_none() {
                    attempts = Some(header.value.unwrap_or_default().to_vec());
                }
                pairs.push((header.key, header.value));
            }
        }
        let headers = out_of_band(pairs);
        let (partition, offset) = (msg.partition(), msg.offset());
        let key = msg.key().map(<[u8]>::to_vec);
        {
            let mut s = lock(&c.shared.state);
            let epoch = match s.partitions.get_mut(&partition) {
                Some((epoch, p)) => {
                    p.received(offset);
                    *epoch
                }
                None => {
                    // Served before its assignment was seen (should not happen): track it
                    // under a fresh epoch.
                    let epoch = c.shared.epochs.fetch_add(1, Ordering::Relaxed) + 1;
                    let mut p = PartitionOffsets::default();
                    p.received(offset);
                    s.partitions.insert(partition, (epoch, p));
                    epoch
                }
            };
            s.in_flight.insert(
                tag,
                Held {
                    partition,
                    offset,
                    epoch,
                    attempts,
                    key,
                },
            );
        }
        Ok(Some(Delivery::native(queue, body, headers, tag)))
    }

    /// Settles a delivery: when it completes a settled prefix of its partition, the offset
    /// after that prefix is stored (and committed by librdkafka with the next commit).
    fn settle(&self, delivery: &Delivery) {
        let Some(c) = self.consumer_of(delivery.queue()) else {
            return;
        };
        let mut s = lock(&c.shared.state);
        let Some(held) = s.in_flight.remove(&delivery.tag()) else {
            return;
        };
        let Some((epoch, p)) = s.partitions.get_mut(&held.partition) else {
            return; // revoked: its new owner reads it again from the last commit
        };
        if *epoch != held.epoch {
            return;
        }
        if let Some(next) = p.settle(held.offset) {
            // Under the lock, so stores of one partition never go backwards.
            if let Err(e) = c
                .consumer
                .store_offsets(&c.tpl(held.partition, Offset::Offset(next)))
            {
                tracing::warn!(error = %e, topic = %c.topic, partition = held.partition, "kafka: storing the offset failed (a rebalance?); the records after the last commit are read again");
            }
        }
    }

    fn held_key(&self, delivery: &Delivery) -> Option<Vec<u8>> {
        let c = self.consumer_of(delivery.queue())?;
        let s = lock(&c.shared.state);
        s.in_flight.get(&delivery.tag())?.key.clone()
    }

    async fn publish_impl(
        &self,
        queue: &str,
        body: &[u8],
        extra: Option<&babelqueue_runtime::Headers>,
        key: Option<&[u8]>,
    ) -> Result<(), TransportError> {
        let meta = record_meta(body, extra);
        self.produce(
            queue,
            body,
            Self::owned_headers(&meta.headers),
            key,
            meta.timestamp_ms,
        )
        .await
    }

    async fn requeue_impl(
        &self,
        delivery: &Delivery,
        republish: Republish,
        delay: Duration,
    ) -> Result<(), TransportError> {
        let key = self.held_key(delivery);
        let body = republish.body(delivery);
        let extra = republish.headers(delivery);
        let queue = delivery.queue();
        if delay.is_zero() {
            self.publish_impl(queue, body, extra, key.as_deref())
                .await?;
        } else {
            let tiers = &self.inner.settings.tiers;
            let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            let (n, _) = tiers.for_delay(ms).unwrap_or_else(|| {
                let last = *tiers.as_slice().last().expect("tiers are never empty");
                tracing::warn!(delay_ms = ms, largest_tier_ms = last, "kafka: the delay is longer than the largest retry tier; parked on that tier (it comes back earlier than asked)");
                (tiers.len(), last)
            });
            let meta = record_meta(body, extra);
            let headers = retry::tier_headers(meta.headers, queue, ms, None);
            // Counted before the produce: a re-inject that outruns this task must not
            // find the count at zero.
            self.inner.parked.fetch_add(1, Ordering::SeqCst);
            // Stamped with the time it is parked, so the tier's whole delay holds
            // (`retry::target_time` clamps the due time into [now, now + tier]).
            let parked = self
                .produce(
                    &retry::retry_topic(queue, n),
                    body,
                    Self::owned_headers(&headers),
                    key.as_deref(),
                    Some(now_ms()),
                )
                .await;
            if let Err(e) = parked {
                let _ = self
                    .inner
                    .parked
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
                return Err(e);
            }
        }
        self.settle(delivery);
        Ok(())
    }

    async fn start_consumer_impl(
        &self,
        queue: &str,
        options: &ConsumerOptions,
    ) -> Result<(), TransportError> {
        let s = &self.inner.settings;
        for topic in s.tiers.topics(&[queue]) {
            self.ensure_topic(&topic).await?;
        }
        self.ensure_topic(&binding::dead_letter_topic(queue))
            .await?;
        let c = self.consumer(queue).await?;
        if !s.reinject {
            return Ok(());
        }
        let mut slot = lock(&c.reinjector);
        if slot.as_ref().is_some_and(|(_, task)| !task.is_finished()) {
            return Ok(());
        }
        let consumer: StreamConsumer<ReinjectCtx> = s
            .consumer_config(retry::REINJECT_GROUP)
            .set("enable.auto.commit", "false")
            .create_with_context(ReinjectCtx::default())
            .map_err(TransportError::backend)?;
        let topics = s.tiers.topics(&[queue]);
        let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&refs).map_err(map_err)?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(reinject_loop(
            self.clone(),
            consumer,
            stop_rx,
            options.events().clone(),
        ));
        *slot = Some((stop_tx, task));
        Ok(())
    }

    async fn next_due_impl(&self, queue: &str) -> Result<Option<Duration>, TransportError> {
        if self.inner.parked.load(Ordering::SeqCst) > 0 {
            return Ok(Some(DUE_POLL));
        }
        let Some(c) = self.consumer_of(queue) else {
            return Ok(None);
        };
        let (assigned, partitions) = {
            let s = lock(&c.shared.state);
            (s.assigned, s.partitions.keys().copied().collect::<Vec<_>>())
        };
        if !assigned {
            return Ok(Some(DUE_POLL));
        }
        let lagging = tokio::task::spawn_blocking(move || c.lagging(&partitions))
            .await
            .map_err(TransportError::backend)?
            .map_err(map_err)?;
        Ok(lagging.then_some(DUE_POLL / 4))
    }

    async fn leave_impl(&self, queue: &str) -> Result<(), TransportError> {
        let Some(c) = lock(&self.inner.consumers).remove(queue) else {
            return Ok(());
        };
        let reinjector = lock(&c.reinjector).take();
        if let Some((stop, task)) = reinjector {
            let _ = stop.send(true);
            let _ = task.await;
        }
        // Commit what is stored, then leave the group (close), off the async threads.
        tokio::task::spawn_blocking(move || {
            match c.consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
                Err(e) => tracing::warn!(error = %e, "kafka: the last commit failed"),
            }
            c.consumer.unsubscribe();
            drop(c);
        })
        .await
        .map_err(TransportError::backend)
    }

    async fn depth_impl(&self, queue: &str) -> Result<QueueDepth, TransportError> {
        let s = self.inner.settings.clone();
        let topic = queue.to_owned();
        let committed = self.committed(queue).await?;
        let ready = tokio::task::spawn_blocking(move || -> Result<u64, KafkaError> {
            let c: BaseConsumer = s.consumer_config(&s.group).create()?;
            let ranges = uncommitted(&c, &topic, &committed)?;
            Ok(ranges.iter().map(|&(_, from, high)| span(from, high)).sum())
        })
        .await
        .map_err(TransportError::backend)?
        .map_err(map_err)?;
        let in_flight = self
            .consumer_of(queue)
            .map_or(0, |c| lock(&c.shared.state).in_flight.len() as u64);
        let parked = self.inner.parked.load(Ordering::SeqCst) as u64;
        Ok(QueueDepth::new(
            ready.saturating_sub(in_flight),
            parked,
            in_flight,
        ))
    }
}

/// The re-inject consumer's context: records revoked partitions, whose held records are
/// then dropped (their new owner reads them again).
#[derive(Default)]
struct ReinjectCtx {
    revoked: Mutex<Vec<(String, i32)>>,
}

impl ClientContext for ReinjectCtx {}

impl ConsumerContext for ReinjectCtx {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            lock(&self.revoked).extend(
                tpl.elements()
                    .iter()
                    .map(|e| (e.topic().to_owned(), e.partition())),
            );
        }
    }
}

type Parked = HashMap<(String, i32), VecDeque<(OwnedMessage, i64)>>;

/// The re-inject consumer (group [`retry::REINJECT_GROUP`], as the Python SDK's
/// `RetryReinjector`): reads the queue's tier topics and moves each record back to its
/// work topic once `retry::target_time` has passed. A record not due yet is held in memory
/// and its partition paused (the loop keeps polling, so the consumer stays in its group
/// however long the tier); records behind it on that partition wait behind it.
async fn reinject_loop(
    t: KafkaTransport,
    consumer: StreamConsumer<ReinjectCtx>,
    mut stop: watch::Receiver<bool>,
    events: EventSink,
) {
    let tiers = t.inner.settings.tiers.clone();
    let mut held: Parked = HashMap::new();
    let mut backoff = Duration::from_millis(100);
    loop {
        for tp in std::mem::take(&mut *lock(&consumer.context().revoked)) {
            held.remove(&tp);
        }
        // Release what is due, oldest first per partition.
        let now = now_ms();
        let mut failed = false;
        for ((topic, partition), queue) in &mut held {
            while let Some((m, due)) = queue.front() {
                if *due > now {
                    break;
                }
                if let Err(e) = reinject(&t, &consumer, m).await {
                    tracing::warn!(error = %e, topic = %topic, partition, "kafka: re-injecting a parked record failed; retrying");
                    events.send(ConsumerEvent::Error(e));
                    failed = true;
                    break;
                }
                queue.pop_front();
            }
            if queue.is_empty() {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(topic, *partition);
                if let Err(e) = consumer.resume(&tpl) {
                    tracing::warn!(error = %e, "kafka: resuming a retry tier partition failed");
                }
            }
        }
        held.retain(|_, q| !q.is_empty());
        let wait = if failed {
            backoff = (backoff * 2).min(Duration::from_secs(5));
            backoff
        } else {
            backoff = Duration::from_millis(100);
            let next = held
                .values()
                .filter_map(|q| q.front().map(|(_, d)| *d))
                .min();
            next.map_or(Duration::from_secs(1), |due| {
                Duration::from_millis(u64::try_from(due - now_ms()).unwrap_or(0))
                    .min(Duration::from_secs(1))
            })
        };
        let got = tokio::select! {
            _ = stop.changed() => break,
            got = tokio::time::timeout(wait, consumer.recv()) => got,
        };
        let m = match got {
            Err(_) => continue,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "kafka: the re-inject consumer reported an error");
                continue;
            }
            Ok(Ok(m)) => m.detach(),
        };
        let key = (m.topic().to_owned(), m.partition());
        let Some(tier_ms) = tiers.tier_ms_of_topic(m.topic()) else {
            tracing::error!(topic = %m.topic(), "kafka: a record on a topic that is no configured retry tier; skipped");
            commit(&consumer, &m);
            continue;
        };
        let due = retry::target_time(m.timestamp().to_millis(), tier_ms, now_ms());
        if let Some(q) = held.get_mut(&key) {
            q.push_back((m, due));
            continue;
        }
        if due <= now_ms() && reinject(&t, &consumer, &m).await.is_ok() {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&key.0, key.1);
        if let Err(e) = consumer.pause(&tpl) {
            tracing::warn!(error = %e, "kafka: pausing a retry tier partition failed");
        }
        held.entry(key).or_default().push_back((m, due));
    }
    // Records still held are not committed: the next re-inject consumer reads them again.
}

fn commit(consumer: &StreamConsumer<ReinjectCtx>, m: &OwnedMessage) {
    let mut tpl = TopicPartitionList::new();
    let _ = tpl.add_partition_offset(m.topic(), m.partition(), Offset::Offset(m.offset() + 1));
    if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
        tracing::warn!(error = %e, "kafka: committing a re-injected record failed (it may be re-injected twice)");
    }
}

/// Moves one parked record back to its work topic: value and key byte for byte, every
/// header but `bq-delay` and `bq-original-topic`, the record timestamp = the body's
/// `created_at` (the binding's rule for a work topic); then commits it.
async fn reinject(
    t: &KafkaTransport,
    consumer: &StreamConsumer<ReinjectCtx>,
    m: &OwnedMessage,
) -> Result<(), TransportError> {
    let mut original = None;
    let mut pairs: Vec<(String, Option<Vec<u8>>)> = Vec::new();
    if let Some(h) = m.headers() {
        for header in h.iter() {
            if header.key == retry::ORIGINAL_TOPIC_HEADER && original.is_none() {
                original = header.value.map(<[u8]>::to_vec);
            }
            pairs.push((header.key.to_owned(), header.value.map(<[u8]>::to_vec)));
        }
    }
    let target = retry::reinject_target(m.topic(), original.as_deref());
    let headers = retry::reinject_headers(pairs)
        .iter()
        .fold(OwnedHeaders::new(), |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: v.as_deref(),
            })
        });
    let value = m.payload().unwrap_or_default();
    let ts = record_meta(value, None).timestamp_ms;
    t.produce(&target, value, headers, m.key(), ts).await?;
    let _ = t
        .inner
        .parked
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    commit(consumer, m);
    Ok(())
}

impl Transport for KafkaTransport {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move { self.publish_impl(queue, &element, None, None).await })
    }

    fn publish_with_headers<'a>(
        &'a self,
        queue: &'a str,
        body: &'a [u8],
        headers: Option<&'a babelqueue_runtime::Headers>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move { self.publish_impl(queue, body, headers, None).await })
    }

    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        Box::pin(self.reserve_impl(queue, timeout))
    }

    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        self.settle(delivery);
        Box::pin(std::future::ready(Ok(())))
    }

    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        republish: Republish,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.requeue_impl(delivery, republish, delay))
    }

    fn attempts(&self, body_attempts: u32, delivery: &Delivery) -> u32 {
        let header = self.consumer_of(delivery.queue()).and_then(|c| {
            lock(&c.shared.state)
                .in_flight
                .get(&delivery.tag())
                .and_then(|h| h.attempts.clone())
        });
        binding::reconcile_attempts(body_attempts, header.as_deref())
    }

    fn start_consumer<'a>(
        &'a self,
        queue: &'a str,
        options: &'a ConsumerOptions,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(self.start_consumer_impl(queue, options))
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
    fn bad_urls_are_errors() {
        assert!(KafkaTransport::builder("redis://127.0.0.1").is_err());
        assert!(KafkaTransport::builder("kafka://:9092").is_err());
        let b = KafkaTransport::builder("kafka://a:1,b?group=g").unwrap();
        assert_eq!(b.settings.brokers, "a:1,b:9092");
        assert_eq!(b.settings.group, "g");
    }

    #[tokio::test]
    async fn an_unreachable_broker_is_a_connection_error() {
        // Nothing listens on port 1: the produce times out as a connection error.
        let t = KafkaTransport::builder("kafka://127.0.0.1:1")
            .unwrap()
            .create_topics(false)
            .delivery_timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let err = t.publish_raw("q", b"{}".to_vec()).await.unwrap_err();
        assert!(err.is_connection(), "{err:?}");
    }
}
