//! The consumer: [`App`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::config::{Config, Observer};
use super::ctx::Ctx;
use super::observe;
pub use super::report::DrainError;
use super::report::{Report, Stats};
use super::settle::RetryPolicy;
pub use super::settle::UnknownUrnStrategy;
use super::transport::{Transport, TransportError};
use super::worker::{Mode, consume};
use crate::extract::MissingState;
use crate::handler::{BoxError, Router, TypedHandler};
use babelqueue_core::envelope::{Envelope, EnvelopeError};
use babelqueue_core::guard::HandlerResult;

/// Publishing a new message failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The envelope could not be built (empty URN, payload not an object).
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// The transport failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The queue name was refused by the builder ([`App::queue`]); nothing was published.
    #[error(transparent)]
    Queue(#[from] EmptyQueueName),
    // Payload schemas (`babelqueue_core::schema`): the one variant of this file they add.
    /// The payload breaks the schema registered for its URN, or that schema could not be
    /// loaded (see [`App::schemas`]); nothing was published.
    #[cfg(feature = "schema")]
    #[error(transparent)]
    Schema(#[from] babelqueue_core::schema::SchemaError),
}

/// The builder was given an empty queue name ([`App::queue`]`("")`). Every key of a queue
/// is built from its name (on Redis `{<queue>}:…`, in the queue's hash slot), so a queue
/// needs one: the app refuses to publish or consume until it has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the queue name is empty: give `App::queue` a non-empty name")]
#[non_exhaustive]
pub struct EmptyQueueName;

/// A consumer over a [`Transport`]: reserves messages from one queue and, per message,
/// decodes → routes by URN → runs the handler → settles it, whatever failed.
///
/// - **Bounds**: a body over [`max_body_size`](Self::max_body_size) (default 4 MiB) is
///   `poison` without being decoded; so is a `meta.id` no store can hold
///   ([`id_is_storable`](babelqueue_core::key::id_is_storable)).
/// - **Decode**: [`Envelope::decode`] of the element (a header frame is unwrapped first).
///   A body that is not JSON or not accepted is `poison`: dead-lettered with its bytes
///   intact (see [`poison_body`](super::poison_body)).
/// - **Route**: the [`Router`]; no handler → the [`UnknownUrnStrategy`].
/// - **Handler ok** → ack. A duplicate skipped by the idempotency guard is acked too
///   (counted in [`Stats::skipped`]).
/// - **Handler error, panic or [timeout](Self::handler_timeout)** → `attempts + 1`; below
///   the [`RetryPolicy`]'s `max_attempts` (default 3) the updated envelope is put back on
///   the queue after an exponential backoff with jitter; at the limit, or at once for an
///   error marked [`Permanent`](super::Permanent), it is dead-lettered to `<queue>.dlq`
///   (or dropped when dead-lettering is off). Retried and dead-lettered bodies are edited
///   at the JSON level: every field of the original, known or not, survives.
/// - **The dedupe store cannot answer** (an error in the guard's `seen` / `claim`, or no
///   answer within [`store_timeout`](Self::store_timeout)) → not the message's fault: no
///   attempt counted, never dead-lettered for it; the message goes back to the queue after
///   the [store backoff](Self::store_backoff), and every worker pauses while the store
///   stays down.
/// - **The store write a successful handler owes** (`remember` / `complete`) fails or
///   hangs → kept with the message: retried after the store backoff until the store
///   answers, then the ack goes. The message stays unacked meanwhile and a duplicate in
///   this process waits for the id's turn; only a shutdown past its grace period (or a
///   crash) leaves it, unacked, for recovery.
/// - **[`InFlight`](babelqueue_core::InFlight)** (lease mode: another worker holds the id) → put back
///   unchanged after [`in_flight_delay`](Self::in_flight_delay), no attempt counted.
/// - **The broker fails** while settling (ack, requeue, dead-letter publish) → retried with
///   backoff until it succeeds; at shutdown, after the grace period, the message is left
///   in flight for recovery, never dropped.
///
/// Beside the message loop, a maintenance task renews this consumer's heartbeat, recovers
/// the in-flight messages of dead consumers, and moves delayed messages that are due back
/// to the queue: none of it adds a round trip per message.
///
/// Two deliveries of one id handled by two workers of this process never run the handler
/// at the same time: the guard gives each key one turn at a time, so the second waits and
/// then takes the normal path (skipped once the first remembered it).
///
/// Up to [`concurrency`](Self::concurrency) messages are in flight at once and their
/// round trips to the broker overlap: one worker (a tokio task) per message, or, where the
/// transport batches ([`batch`](Self::batch): Redis by default), fewer workers that each
/// hold several, settle them and take more in one round trip. When the queue is empty one
/// worker at a time blocks in the transport's reserve. Transport failures never stop the
/// loop: it backs off and reconnects.
///
/// ```
/// use babelqueue_runtime::{App, InMemoryTransport};
/// use babelqueue_core::{Guard, Envelope, InMemoryStore};
/// use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// static STORE: std::sync::LazyLock<InMemoryStore> = std::sync::LazyLock::new(InMemoryStore::new);
/// let charged = Arc::new(AtomicU32::new(0));
/// let c = charged.clone();
/// let app = App::new(InMemoryTransport::new())
///     .queue("payments")
///     .route_async("urn:babel:payments:charge", move |env: Envelope| {
///         let c = c.clone();
///         async move {
///             Guard::new(&*STORE).run_async(&env, async { c.fetch_add(1, Ordering::SeqCst); Ok::<(), std::io::Error>(()) })
///                 .await
///                 .map(|_| ())
///         }
///     });
/// let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?
///     .with_queue("payments");
/// app.publish_raw(env.encode()).await?;
/// app.publish_raw(env.encode()).await?; // a redelivery: the same bytes
/// let stats = app.drain().await?;
/// assert_eq!((stats.succeeded, stats.skipped, stats.acked), (1, 1, 2));
/// assert_eq!(charged.load(Ordering::SeqCst), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct App {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) router: Arc<Router>,
    pub(crate) config: Config,
    pub(crate) observer: Option<Observer>,
    // Payload schemas: set by `App::schemas` (in `babelqueue_core::schema`).
    #[cfg(feature = "schema")]
    pub(crate) schemas: Option<Arc<babelqueue_core::schema::Schemas>>,
    pub(crate) readiness: Arc<super::ctx::ReadinessState>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("router", &self.router)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl App {
    /// A consumer of the queue `default` on `transport`, with no handlers yet.
    pub fn new(transport: impl Transport) -> Self {
        Self::from_arc(Arc::new(transport))
    }

    /// Like [`new`](Self::new), for a shared transport.
    pub fn from_arc(transport: Arc<dyn Transport>) -> Self {
        App {
            transport,
            router: Arc::new(Router::new()),
            config: Config {
                queue: babelqueue_core::envelope::DEFAULT_QUEUE.to_owned(),
                concurrency: 1,
                batch: None,
                retry: RetryPolicy::default(),
                unknown_urn: UnknownUrnStrategy::Fail,
                dead_letter: true,
                dead_letter_queue: None,
                dead_letter_suffix: ".dlq".to_owned(),
                poll_timeout: Duration::from_secs(1),
                in_flight_delay: Duration::from_millis(500),
                release_delay: Duration::from_secs(1),
                max_releases: 5,
                backoff_min: Duration::from_millis(50),
                backoff_max: Duration::from_secs(5),
                store_backoff_min: Duration::from_millis(100),
                store_backoff_max: Duration::from_secs(5),
                give_up_after: Duration::from_secs(30),
                max_body_size: 4 * 1024 * 1024,
                handler_timeout: None,
                store_timeout: Duration::from_secs(10),
                shutdown_grace: Duration::from_secs(30),
                heartbeat_interval: Duration::from_secs(2),
                heartbeat_ttl: Duration::from_secs(10),
                recovery_interval: Duration::from_secs(5),
                max_recoveries: 3,
                #[cfg(feature = "schema")]
                consume_schemas: None,
                #[cfg(feature = "schema")]
                validate_on_consume: false,
            },
            observer: None,
            #[cfg(feature = "schema")]
            schemas: None,
            readiness: Arc::default(),
        }
    }

    /// The queue to consume (and [`publish`](Self::publish) to). Default `default`.
    ///
    /// An empty name is refused: [`check_config`](Self::check_config) reports it, and
    /// publishing, [`drain`](Self::drain) and [`run_until`](Self::run_until) return (or
    /// log) [`EmptyQueueName`] without touching the broker.
    ///
    /// ```
    /// use babelqueue_runtime::{App, EmptyQueueName, InMemoryTransport};
    /// let app = App::new(InMemoryTransport::new()).queue("");
    /// let err: EmptyQueueName = app.check_config().unwrap_err();
    /// assert!(err.to_string().contains("queue name is empty"));
    /// ```
    #[must_use]
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.config.queue = queue.into();
        self
    }

    /// Replaces the router.
    #[must_use]
    pub fn router(mut self, router: Router) -> Self {
        self.router = Arc::new(router);
        self
    }

    /// Registers a handler under the URN it declares: for a `#[handler("urn:…")] fn charge`,
    /// the same-named type the attribute adds, written `charge {}`.
    #[must_use]
    pub fn register<H: TypedHandler>(mut self, handler: H) -> Self {
        Arc::make_mut(&mut self.router).add(handler);
        self
    }

    /// Adds shared state to the router, injected by type into handlers that take a
    /// [`State<T>`](crate::extract::State) argument (see [`Router::state`]).
    ///
    /// ```
    /// use babelqueue_runtime::{App, InMemoryTransport};
    /// struct Gateway { fee: u32 }
    /// let app = App::new(InMemoryTransport::new()).state(Gateway { fee: 30 });
    /// # let _ = app;
    /// ```
    #[must_use]
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        Arc::make_mut(&mut self.router).add_state(value);
        self
    }

    /// Adds shared state you already hold in an `Arc`, read by handlers as
    /// [`State<T>`](crate::extract::State) (see [`Router::state_arc`]): you keep a handle
    /// to the same `T` the handlers see.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use babelqueue_runtime::{App, InMemoryTransport};
    /// struct Ledger { fee: u32 }
    /// let ledger = Arc::new(Ledger { fee: 30 });
    /// let app = App::new(InMemoryTransport::new()).state_arc(Arc::clone(&ledger));
    /// # let _ = (app, ledger.fee);
    /// ```
    #[must_use]
    pub fn state_arc<T: Send + Sync + 'static>(mut self, value: Arc<T>) -> Self {
        Arc::make_mut(&mut self.router).add_state_arc(value);
        self
    }

    /// Routes `urn` to a blocking closure (see [`Router::route_sync`]).
    #[must_use]
    pub fn route_sync<F, R>(mut self, urn: impl Into<String>, f: F) -> Self
    where
        F: Fn(&Envelope) -> R + Send + Sync + 'static,
        R: HandlerResult + 'static,
        R::Error: Into<BoxError>,
    {
        let router = std::mem::take(Arc::make_mut(&mut self.router));
        self.router = Arc::new(router.route_sync(urn, f));
        self
    }

    /// Routes `urn` to an async closure (see [`Router::route_async`]).
    #[must_use]
    pub fn route_async<F, Fut, R>(mut self, urn: impl Into<String>, f: F) -> Self
    where
        F: Fn(Envelope) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: HandlerResult,
        R::Error: Into<BoxError>,
    {
        let router = std::mem::take(Arc::make_mut(&mut self.router));
        self.router = Arc::new(router.route_async(urn, f));
        self
    }

    /// Up to `n` messages handled at once, by `n` workers (default 1; 0 is read as 1).
    /// With 1, messages are handled one after the other in queue order.
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.concurrency = n.max(1);
        self
    }

    /// Up to `k` of the [`concurrency`](Self::concurrency) messages are held by one
    /// worker, which reserves them, asks the store about them and settles them in batches:
    /// the messages it settled (their store writes, then their acks) and the refill of its
    /// free places go to the broker together, in one round trip where the transport
    /// allows ([`Transport::settle_and_reserve`]), and the handlers of one worker run in
    /// one task, so their store calls leave together too. A batch is never waited for:
    /// a worker settles what is done as soon as it is done and takes what is ready, so a
    /// lone message is served as fast as without batches.
    ///
    /// With `concurrency` `c`, `ceil(c / k)` workers share the `c` places. Every
    /// guarantee is the same as with one message per worker: each message's writes reach
    /// the store before its ack, two deliveries of one id take turns, recovery, drain and
    /// shutdown are unchanged.
    ///
    /// Default: the transport's [`batch_hint`](Transport::batch_hint) (16 on Redis with
    /// pipelining, 1 elsewhere: one message per worker), and at most an eighth of
    /// `concurrency`, so that at least eight workers overlap their round trips: below
    /// `concurrency(16)` one message per worker, `concurrency(16)` on Redis 8 workers of 2,
    /// `concurrency(32)` 8 of 4. Fewer, larger workers measured slower (at
    /// `concurrency(8)`, 2 workers of 4 drained 0.57× of 8 single ones; at 32, 2 of 16
    /// 0.75× of 8 of 4). `1` turns batches off. Never more than `concurrency`, so
    /// `concurrency(1)` handles messages one at a time, in order.
    ///
    /// ```
    /// use babelqueue_runtime::{App, InMemoryTransport};
    /// let app = App::new(InMemoryTransport::new())
    ///     .queue("payments")
    ///     .concurrency(32)
    ///     .batch(8); // 4 workers of 8 places each
    /// # drop(app);
    /// ```
    #[must_use]
    pub fn batch(mut self, k: usize) -> Self {
        self.config.batch = Some(k.max(1));
        self
    }

    /// Deliveries per message before it is dead-lettered (default 3; 0 is read as 1). The
    /// same as setting [`RetryPolicy::max_attempts`] through [`retry`](Self::retry).
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.config.retry.max_attempts = n.max(1);
        self
    }

    /// How failed handlers are retried (default [`RetryPolicy::default`]: 1 s, × 2, up to
    /// 5 min, 3 attempts, 20 % jitter). A retry is put back on the queue with
    /// `attempts + 1` and becomes deliverable after the backoff (through the transport's
    /// delayed set, so no worker waits for it).
    #[must_use]
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        let max = policy.max_attempts.max(1);
        self.config.retry = policy;
        self.config.retry.max_attempts = max;
        self
    }

    /// Unknown URNs under [`UnknownUrnStrategy::Release`]: how long a released message
    /// waits before it is deliverable again (default 1 s).
    #[must_use]
    pub fn release_delay(mut self, delay: Duration) -> Self {
        self.config.release_delay = delay;
        self
    }

    /// Unknown URNs under [`UnknownUrnStrategy::Release`]: how many times one message is
    /// released before it is dead-lettered as `unknown_urn` (default 5). The count travels
    /// with the message, in the header frame (`x-babelqueue-releases`).
    #[must_use]
    pub fn max_releases(mut self, n: u32) -> Self {
        self.config.max_releases = n;
        self
    }

    /// The dedupe store's outage backoff: after the store failed `n` times in a row, the
    /// message is put back (no attempt counted) and every worker pauses for
    /// `min(min × 2^(n-1), max)` before reserving again (default 100 ms .. 5 s). The first
    /// store answer resets it.
    #[must_use]
    pub fn store_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.config.store_backoff_min = min;
        self.config.store_backoff_max = max.max(min);
        self
    }

    /// The largest body handled (default 4 MiB). A larger one is dead-lettered as
    /// `poison` before it is decoded, its bytes intact.
    #[must_use]
    pub fn max_body_size(mut self, bytes: usize) -> Self {
        self.config.max_body_size = bytes;
        self
    }

    /// How long a handler may run (default: no limit). A handler still running then is
    /// cancelled (its future dropped; a sync handler's thread cannot be stopped and runs
    /// to its end) and counted as a failed attempt. Time spent waiting on the dedupe store
    /// or for another task of this process handling the same id does not count.
    #[must_use]
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.config.handler_timeout = Some(timeout);
        self
    }

    /// How long one call to the dedupe store inside the guard may take (default 10 s).
    /// A `seen` / `claim` that has not answered by then (a lost connection, a table lock)
    /// is cut and treated as the store being unavailable: the message goes back to the
    /// queue, no attempt counted. A `remember` / `complete` owed after the handler
    /// succeeded that fails or hangs is cut too, and tried again after the
    /// [store backoff](Self::store_backoff) until the store answers: the message stays
    /// unacked and the id's turn held meanwhile, so the write is never dropped while the
    /// consumer lives. Async guards only: a sync store call cannot be cut (a sync guard's
    /// failed write is retried the same way).
    #[must_use]
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.config.store_timeout = timeout;
        self
    }

    /// On shutdown, how long messages in flight may take to finish and be settled
    /// (default 30 s). Those still running then are left in flight, never lost: another
    /// consumer recovers them once this one is gone.
    #[must_use]
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.config.shutdown_grace = grace;
        self
    }

    /// How often this consumer renews its heartbeat (default 2 s), and how long one
    /// heartbeat is valid (`ttl`, default 10 s): a consumer whose heartbeat expired is dead
    /// and its in-flight messages are recovered by the others.
    #[must_use]
    pub fn heartbeat(mut self, interval: Duration, ttl: Duration) -> Self {
        self.config.heartbeat_interval = interval.max(Duration::from_millis(1));
        self.config.heartbeat_ttl = ttl.max(interval);
        self
    }

    /// How often this consumer recovers the in-flight messages of dead consumers (default
    /// 5 s; also once at start).
    #[must_use]
    pub fn recovery_interval(mut self, interval: Duration) -> Self {
        self.config.recovery_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// How many times a message may be recovered from consumers that died handling it
    /// before it is dead-lettered (reason `failed`) instead (default 3: it may be what
    /// kills them).
    #[must_use]
    pub fn max_recoveries(mut self, n: u32) -> Self {
        self.config.max_recoveries = n;
        self
    }

    /// The unknown-URN strategy (default [`UnknownUrnStrategy::Fail`]).
    #[must_use]
    pub fn unknown_urn(mut self, strategy: UnknownUrnStrategy) -> Self {
        self.config.unknown_urn = strategy;
        self
    }

    /// Whether failed messages are dead-lettered (default `true`); when off, a message
    /// failing its last attempt is dropped (logged at error level). Poison and unknown-URN
    /// messages that would be dead-lettered are dropped too.
    #[must_use]
    pub fn dead_letter(mut self, enabled: bool) -> Self {
        self.config.dead_letter = enabled;
        self
    }

    /// Dead-letter to this queue instead of `<queue><suffix>`.
    #[must_use]
    pub fn dead_letter_queue(mut self, queue: impl Into<String>) -> Self {
        self.config.dead_letter_queue = Some(queue.into());
        self
    }

    /// The dead-letter queue suffix (default `.dlq`).
    #[must_use]
    pub fn dead_letter_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.config.dead_letter_suffix = suffix.into();
        self
    }

    /// How long one reserve waits in [`run_until`](Self::run_until) (default 1 s). It also
    /// bounds how long a shutdown waits for the reserve in progress: a reserve is never
    /// cancelled halfway, so no message is left stranded by a shutdown.
    #[must_use]
    pub fn poll_timeout(mut self, timeout: Duration) -> Self {
        self.config.poll_timeout = timeout;
        self
    }

    /// How long a message whose id is [`InFlight`](babelqueue_core::InFlight) elsewhere waits before
    /// it is deliverable again (default 500 ms).
    #[must_use]
    pub fn in_flight_delay(mut self, delay: Duration) -> Self {
        self.config.in_flight_delay = delay;
        self
    }

    /// Broker backoff: after a failed reserve, ack, requeue or dead-letter publish, wait
    /// `min`, doubling up to `max` (default 50 ms .. 5 s), and try again. Settling a
    /// message is retried until it succeeds (or the shutdown grace period ends).
    #[must_use]
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.config.backoff_min = min;
        self.config.backoff_max = max.max(min);
        self
    }

    /// How long [`drain`](Self::drain) keeps retrying a failing transport before it
    /// returns a [`DrainError`] (default 30 s). [`run_until`](Self::run_until) never gives
    /// up.
    #[must_use]
    pub fn give_up_after(mut self, after: Duration) -> Self {
        self.config.give_up_after = after;
        self
    }

    /// Calls `observer` with a [`Report`] after every delivery (from the message's task).
    #[must_use]
    pub fn on_delivery(mut self, observer: impl Fn(&Report) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// The consumed queue.
    pub fn queue_name(&self) -> &str {
        &self.config.queue
    }

    /// The dead-letter queue: the configured one, else the transport's name for it
    /// ([`Transport::dead_letter_queue`]: SQS `<queue>-dlq`), else `<queue><suffix>`.
    pub fn dead_letter_queue_name(&self) -> String {
        self.config.dead_letter_queue.clone().unwrap_or_else(|| {
            self.transport
                .dead_letter_queue(&self.config.queue, &self.config.dead_letter_suffix)
                .unwrap_or_else(|| {
                    format!("{}{}", self.config.queue, self.config.dead_letter_suffix)
                })
        })
    }

    /// What every worker of one consume shares.
    pub(crate) fn ctx(&self) -> Ctx {
        #[allow(unused_mut)]
        let mut config = self.config.clone();
        #[cfg(feature = "schema")]
        if config.validate_on_consume {
            config.consume_schemas = self.schemas.clone();
        }
        Ctx::new(
            Arc::clone(&self.transport),
            Arc::clone(&self.router),
            self.dead_letter_queue_name(),
            config,
            self.observer.clone(),
            Arc::clone(&self.readiness),
        )
    }

    /// Whether this app is ready to work, for a readiness probe: consuming (a
    /// [`run`](Self::run_until) or [`drain`](Self::drain) of it or of a clone is under
    /// way) and its dedupe store answering. A consumer started while its store is down
    /// starts anyway, reports itself not ready (here, with a `tracing` warning, and in the
    /// `babelqueue_ready` gauge with feature `metrics`), puts back what it cannot check
    /// without counting an attempt, and begins work when the store answers.
    ///
    /// ```
    /// use babelqueue_runtime::{App, InMemoryTransport};
    /// let app = App::new(InMemoryTransport::new());
    /// assert!(!app.readiness().is_ready(), "not consuming yet");
    /// assert!(app.readiness().store_available);
    /// ```
    pub fn readiness(&self) -> super::report::Readiness {
        self.readiness.get()
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// Builds an envelope for `urn` carrying `payload` (`meta.queue` = this queue) and
    /// publishes it. Returns the envelope sent.
    ///
    /// It is published in a PRODUCER span `publish <urn>`; with the `opentelemetry`
    /// feature and an OpenTelemetry context, the span's W3C `traceparent` rides beside the
    /// envelope as a transport header, and when a trace is active (a handler's span, a
    /// span of yours) the envelope's `trace_id` is that trace's id as a UUID (see
    /// the `runtime::otel` module). Without one, the bytes are what they are without the
    /// feature.
    pub async fn publish<T: Serialize + ?Sized>(
        &self,
        urn: &str,
        payload: &T,
    ) -> Result<Envelope, PublishError> {
        self.check_config()?;
        let mut env = Envelope::from_payload(urn, payload)?.with_queue(self.config.queue.clone());
        // Refuse data that breaks its URN's schema (`App::schemas`).
        #[cfg(feature = "schema")]
        self.check_schema(&env)?;
        // Tracing: the PRODUCER span and its `traceparent` header.
        if let Some(trace_id) =
            observe::publish_envelope(&*self.transport, &self.config.queue, &env, true).await?
        {
            env.trace_id = trace_id;
        }
        Ok(env)
    }

    /// Publishes an envelope as is to this queue (in a PRODUCER span, like
    /// [`publish`](Self::publish); its `trace_id` is never changed).
    pub async fn publish_envelope(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.check_config().map_err(TransportError::backend)?;
        // Tracing: `fresh = false`: sent as is.
        observe::publish_envelope(&*self.transport, &self.config.queue, envelope, false)
            .await
            .map(|_| ())
    }

    /// Publishes pre-encoded bytes as is to this queue (how a redelivery of the same
    /// message is simulated, or a foreign producer's bytes are replayed), in a PRODUCER
    /// span: see [`publish_traced`](super::publish_traced) for what the `opentelemetry`
    /// feature adds beside the bytes.
    pub async fn publish_raw(&self, element: impl Into<Vec<u8>>) -> Result<(), TransportError> {
        self.check_config().map_err(TransportError::backend)?;
        // Tracing: the PRODUCER span and its `traceparent` header.
        observe::publish_traced(&*self.transport, &self.config.queue, element.into()).await
    }

    /// Moves messages stranded in this queue's processing list (a crashed worker) back
    /// to the queue; see [`Transport::requeue_processing`]. Call it at startup, before
    /// any worker of this queue is running.
    pub async fn requeue_processing(&self) -> Result<usize, TransportError> {
        self.check_config().map_err(TransportError::backend)?;
        self.transport.requeue_processing(&self.config.queue).await
    }

    /// Processes messages until the queue is empty, none of its messages is delayed
    /// (retries, deferrals, releases waiting for their time) and nothing is in flight in
    /// this consumer; returns the counts. For tests and one-shot jobs.
    ///
    /// Messages another consumer holds in its own in-flight list
    /// ([`Transport::held_elsewhere`]; Redis) are waited for too: a consumer killed while
    /// holding them is recovered once its heartbeat expires, and the drain then handles
    /// them. The wait is bounded: the longest heartbeat time left when first seen, plus
    /// two [recovery intervals](Self::recovery_interval). A consumer still renewing its
    /// heartbeat past that (alive, or stuck) keeps its messages: the drain ends, logs a
    /// warning per consumer and lists them in [`Stats::left_in_flight`] (consumer id and
    /// count; a consumer running once the heartbeat expires recovers them).
    ///
    /// First it checks that the router holds every handler's shared state
    /// ([`check_state`](Self::check_state)); if not, it returns at once, with nothing
    /// reserved ([`DrainError::missing_state`] says what is missing).
    pub async fn drain(&self) -> Result<Stats, DrainError> {
        if let Err(e) = self.check_config() {
            return Err(DrainError {
                error: TransportError::backend(e),
                stats: Stats::default(),
            });
        }
        if let Err(missing) = self.check_state() {
            return Err(DrainError {
                error: TransportError::backend(missing),
                stats: Stats::default(),
            });
        }
        consume(self.ctx(), Mode::Drain, std::future::pending()).await
    }

    /// Checks the builder's settings: the queue name is not empty ([`queue`](Self::queue)).
    pub fn check_config(&self) -> Result<(), EmptyQueueName> {
        if self.config.queue.is_empty() {
            return Err(EmptyQueueName);
        }
        Ok(())
    }

    /// Checks that the router holds the shared state every handler needs (each
    /// `State<T>` argument of a `#[handler]` fn, a `T`; see [`Router::check_state`]).
    /// [`drain`](Self::drain) and [`run_until`](Self::run_until) call it before
    /// reserving anything; call it yourself to fail at start-up with your own message.
    pub fn check_state(&self) -> Result<(), MissingState> {
        self.router.check_state()
    }

    /// Consumes until `shutdown` completes, then stops reserving, lets the messages in
    /// flight finish and be settled (for up to [`shutdown_grace`](Self::shutdown_grace);
    /// those still running then are left in flight for recovery), leaves the consumer
    /// registry, and returns the counts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use babelqueue_runtime::{App, InMemoryTransport};
    /// use babelqueue_core::Envelope;
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let app = App::new(InMemoryTransport::new())
    ///     .poll_timeout(Duration::from_millis(20))
    ///     .route_sync("urn:babel:orders:created", |_: &Envelope| ());
    /// app.publish("urn:babel:orders:created", &serde_json::json!({})).await?;
    /// let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    /// let worker = tokio::spawn({
    ///     let app = app.clone();
    ///     async move { app.run_until(async { let _ = rx.await; }).await }
    /// });
    /// tokio::time::sleep(Duration::from_millis(50)).await;
    /// tx.send(()).unwrap();
    /// assert_eq!(worker.await?.succeeded, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// It first checks the router's state ([`check_state`](Self::check_state)): when a
    /// handler needs state the router lacks, it logs the error naming the type and the
    /// handler and returns at once, with nothing reserved.
    pub async fn run_until<S>(&self, shutdown: S) -> Stats
    where
        S: Future<Output = ()> + Send,
    {
        if let Err(e) = self.check_config() {
            tracing::error!(error = %e, "consumer not started");
            return Stats::default();
        }
        if let Err(missing) = self.check_state() {
            tracing::error!(error = %missing, queue = %self.config.queue, "consumer not started");
            return Stats::default();
        }
        match consume(self.ctx(), Mode::Run, shutdown).await {
            Ok(stats) => stats,
            Err(e) => e.stats,
        }
    }

    /// Consumes until Ctrl-C (or SIGTERM on Unix), then shuts down gracefully (see
    /// [`run_until`](Self::run_until)).
    pub async fn run(&self) -> Stats {
        self.run_until(shutdown_signal()).await
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    r = tokio::signal::ctrl_c() => if let Err(e) = r {
                        tracing::warn!(error = %e, "cannot listen for Ctrl-C");
                        let _ = term.recv().await;
                    },
                    _ = term.recv() => {}
                }
                return;
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGTERM"),
        }
    }
    if let Err(e) = tokio::signal::ctrl_c().await {
        tracing::warn!(error = %e, "cannot listen for Ctrl-C; run until the process is killed");
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InMemoryTransport;

    #[tokio::test]
    async fn an_empty_queue_name_is_refused_before_the_broker_is_touched() {
        let t = InMemoryTransport::new();
        let app = App::new(t.clone())
            .queue("")
            .route_sync("urn:x", |_: &Envelope| ());
        assert_eq!(app.check_config(), Err(EmptyQueueName));
        let err = app
            .publish("urn:x", &serde_json::json!({}))
            .await
            .unwrap_err();
        assert!(matches!(err, PublishError::Queue(EmptyQueueName)), "{err}");
        assert!(err.to_string().contains("queue name is empty"), "{err}");
        let env = Envelope::new("urn:x", serde_json::json!({})).unwrap();
        assert!(app.publish_envelope(&env).await.is_err());
        assert!(app.publish_raw(env.encode()).await.is_err());
        assert!(app.requeue_processing().await.is_err());
        let drained = app.drain().await.unwrap_err();
        let mut chain = String::new();
        let mut e: Option<&dyn std::error::Error> = Some(&drained);
        while let Some(x) = e {
            chain.push_str(&x.to_string());
            e = x.source();
        }
        assert!(chain.contains("queue name is empty"), "{chain}");
        assert_eq!(app.run_until(async {}).await, Stats::default());
        assert_eq!(
            t.reserve("", Duration::ZERO).await.unwrap().map(|_| ()),
            None
        );
        assert_eq!(App::new(t).queue("q").check_config(), Ok(()));
    }
}
