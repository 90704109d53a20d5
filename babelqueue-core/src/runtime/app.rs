//! The consumer: [`App`].

use std::collections::HashSet;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tracing::Instrument;
use tracing::field::Empty;

use super::dead_letter::{self, Block};
use super::transport::{Delivery, Transport, TransportError};
use crate::envelope::{DeadLetterReason, DecodeError, Envelope, EnvelopeError};
use crate::guard::{HandlerResult, Outcome};
use crate::handler::{
    BoxError, BoxFuture, Handler, HandlerError, HandlerOutput, Router, UnknownUrn,
};
use crate::lease::InFlight;

/// What to do with a message whose URN has no registered handler (SPEC section 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownUrnStrategy {
    /// Treat it as a handler failure: retried up to `max_attempts`, then dead-lettered
    /// with reason `unknown_urn` (the default).
    #[default]
    Fail,
    /// Ack and drop it.
    Delete,
    /// Republish it unchanged (for a consumer that knows the URN) and ack this copy.
    Release,
    /// Dead-letter it at once with reason `unknown_urn`.
    DeadLetter,
}

/// What the runtime did with one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// The handler ran and succeeded.
    Succeeded,
    /// The idempotency guard skipped a duplicate: the handler did not run.
    Skipped,
    /// The handler failed; the message was republished with `attempts` incremented.
    Retried {
        /// The new `attempts` value.
        attempts: u32,
    },
    /// The message was published to the dead-letter queue.
    DeadLettered {
        /// Why.
        reason: DeadLetterReason,
    },
    /// The message was dropped: failed at the limit with dead-lettering off, or an unknown
    /// URN under [`UnknownUrnStrategy::Delete`].
    Dropped,
    /// Unknown URN under [`UnknownUrnStrategy::Release`]: republished unchanged.
    Released,
    /// Its id is in flight on another worker (lease mode, [`InFlight`]): republished
    /// unchanged after [`App::in_flight_delay`], without counting an attempt.
    Deferred,
    /// Republishing or dead-lettering failed on the transport: the message was not acked
    /// and stays in the processing list (see [`Transport::requeue_processing`]).
    Stranded,
}

/// One delivery's outcome, given to the [`App::on_delivery`] observer.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Report {
    /// The queue it was consumed from.
    pub queue: String,
    /// The decoded envelope (`None` for a poison body).
    pub envelope: Option<Envelope>,
    /// What happened.
    pub disposition: Disposition,
    /// Whether the original delivery was acked.
    pub acked: bool,
    /// Whether a handler failed (an error, a panic, or an unknown URN under
    /// [`UnknownUrnStrategy::Fail`]).
    pub failed: bool,
    /// Whether no handler was registered for its URN.
    pub unknown_urn: bool,
    /// The error, if any.
    pub error: Option<String>,
}

/// Counts of what a [`drain`](App::drain) or [`run`](App::run_until) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Deliveries reserved and handled.
    pub processed: u64,
    /// Handler ran and succeeded.
    pub succeeded: u64,
    /// Duplicates skipped by the idempotency guard (acked, handler not run).
    pub skipped: u64,
    /// Handler failures (errors, panics, unknown URNs under `Fail`).
    pub failed: u64,
    /// Republished with `attempts + 1`.
    pub retried: u64,
    /// Published to the dead-letter queue (every reason).
    pub dead_lettered: u64,
    /// Of which poison bodies.
    pub poison: u64,
    /// Deliveries whose URN had no handler (whatever the strategy).
    pub unknown_urn: u64,
    /// Dropped (failed at the limit without dead-lettering, unknown URN deleted).
    pub dropped: u64,
    /// Unknown URNs released.
    pub released: u64,
    /// Deferred because their id was in flight elsewhere.
    pub deferred: u64,
    /// Deliveries acked.
    pub acked: u64,
    /// Deliveries left in the processing list after a transport failure.
    pub unacked: u64,
    /// Transport errors seen by the reserve loop (each followed by a backoff).
    pub transport_errors: u64,
}

impl Stats {
    fn merge(&mut self, o: &Stats) {
        self.processed += o.processed;
        self.succeeded += o.succeeded;
        self.skipped += o.skipped;
        self.failed += o.failed;
        self.retried += o.retried;
        self.dead_lettered += o.dead_lettered;
        self.poison += o.poison;
        self.unknown_urn += o.unknown_urn;
        self.dropped += o.dropped;
        self.released += o.released;
        self.deferred += o.deferred;
        self.acked += o.acked;
        self.unacked += o.unacked;
        self.transport_errors += o.transport_errors;
    }

    fn record(&mut self, r: &Report) {
        self.processed += 1;
        match &r.disposition {
            Disposition::Succeeded => self.succeeded += 1,
            Disposition::Skipped => self.skipped += 1,
            Disposition::Retried { .. } => self.retried += 1,
            Disposition::DeadLettered { reason } => {
                self.dead_lettered += 1;
                if *reason == DeadLetterReason::Poison {
                    self.poison += 1;
                }
            }
            Disposition::Dropped => self.dropped += 1,
            Disposition::Released => self.released += 1,
            Disposition::Deferred => self.deferred += 1,
            Disposition::Stranded => {}
        }
        if r.failed {
            self.failed += 1;
        }
        if r.unknown_urn {
            self.unknown_urn += 1;
        }
        if r.acked {
            self.acked += 1;
        } else {
            self.unacked += 1;
        }
    }
}

/// [`App::drain`] gave up: the transport kept failing for longer than
/// [`App::give_up_after`]. In-flight messages were finished first.
#[derive(Debug, thiserror::Error)]
#[error("drain gave up after repeated transport failures: {error}")]
pub struct DrainError {
    /// The last transport error.
    #[source]
    pub error: TransportError,
    /// What was done before giving up.
    pub stats: Stats,
}

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
}

type Observer = Arc<dyn Fn(&Report) + Send + Sync>;

#[derive(Debug, Clone)]
struct Config {
    queue: String,
    concurrency: usize,
    max_attempts: u32,
    unknown_urn: UnknownUrnStrategy,
    dead_letter: bool,
    dead_letter_queue: Option<String>,
    dead_letter_suffix: String,
    poll_timeout: Duration,
    in_flight_delay: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    give_up_after: Duration,
    transport_retries: u32,
}

/// A consumer over a [`Transport`]: reserves messages from one queue and, per message,
/// decodes → routes by URN → runs the handler → acks, exactly as SPEC section 4 says.
///
/// - **Decode**: [`Envelope::decode`] of the element (a Redis header frame is unwrapped
///   first). A body that is not JSON or not accepted is `poison`: dead-lettered with its
///   bytes intact (see [`poison_body`](super::poison_body)) and acked.
/// - **Route**: the [`Router`]; no handler → the [`UnknownUrnStrategy`].
/// - **Handler ok** → ack. A duplicate skipped by the idempotency guard is acked too
///   (counted in [`Stats::skipped`]).
/// - **Handler error or panic** → `attempts + 1`; below [`max_attempts`](Self::max_attempts)
///   (default 3) the updated envelope is republished to the same queue and the original
///   acked; at the limit it is dead-lettered to `<queue>.dlq` (or dropped when
///   dead-lettering is off). Retried and dead-lettered bodies are edited at the JSON level:
///   every field of the original, known or not, survives.
/// - **[`InFlight`]** (lease mode: another worker holds the id) → not a failed attempt: the
///   message is republished unchanged after [`in_flight_delay`](Self::in_flight_delay).
///
/// [`concurrency`](Self::concurrency) workers (tokio tasks) each reserve and handle one
/// message at a time, so up to that many are in flight and their round trips to the
/// broker overlap. When the queue is empty one worker at a time blocks in the transport's
/// reserve. Transport failures never stop the loop: it backs off and reconnects.
///
/// ```
/// use babelqueue_core::runtime::{App, InMemoryTransport};
/// use babelqueue_core::{guard_async, Envelope, InMemoryStore};
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
///             guard_async(&*STORE, &env, async { c.fetch_add(1, Ordering::SeqCst); Ok::<(), std::io::Error>(()) })
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
    transport: Arc<dyn Transport>,
    router: Arc<Router>,
    config: Config,
    observer: Option<Observer>,
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
                queue: crate::envelope::DEFAULT_QUEUE.to_owned(),
                concurrency: 1,
                max_attempts: 3,
                unknown_urn: UnknownUrnStrategy::Fail,
                dead_letter: true,
                dead_letter_queue: None,
                dead_letter_suffix: ".dlq".to_owned(),
                poll_timeout: Duration::from_secs(1),
                in_flight_delay: Duration::from_millis(500),
                backoff_min: Duration::from_millis(50),
                backoff_max: Duration::from_secs(5),
                give_up_after: Duration::from_secs(30),
                transport_retries: 8,
            },
            observer: None,
        }
    }

    /// The queue to consume (and [`publish`](Self::publish) to). Default `default`.
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

    /// Registers a handler under the URN it declares (e.g. a `#[handler("urn:…")]` fn).
    #[must_use]
    pub fn register<H: Handler>(mut self, handler: H) -> Self {
        Arc::make_mut(&mut self.router).add(handler);
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

    /// Deliveries per message before it is dead-lettered (default 3; 0 is read as 1).
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.config.max_attempts = n.max(1);
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

    /// How long a message whose id is [`InFlight`] elsewhere waits before it is
    /// republished (default 500 ms).
    #[must_use]
    pub fn in_flight_delay(mut self, delay: Duration) -> Self {
        self.config.in_flight_delay = delay;
        self
    }

    /// Reconnect backoff: starts at `min`, doubles up to `max` (default 50 ms .. 5 s).
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

    /// The dead-letter queue: the configured one, else `<queue><suffix>`.
    pub fn dead_letter_queue_name(&self) -> String {
        self.config
            .dead_letter_queue
            .clone()
            .unwrap_or_else(|| format!("{}{}", self.config.queue, self.config.dead_letter_suffix))
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// Builds an envelope for `urn` carrying `payload` (`meta.queue` = this queue) and
    /// publishes it. Returns the envelope sent.
    pub async fn publish<T: Serialize + ?Sized>(
        &self,
        urn: &str,
        payload: &T,
    ) -> Result<Envelope, PublishError> {
        let env = Envelope::from_payload(urn, payload)?.with_queue(self.config.queue.clone());
        self.transport.publish(&self.config.queue, &env).await?;
        Ok(env)
    }

    /// Publishes an envelope as is to this queue.
    pub async fn publish_envelope(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.transport.publish(&self.config.queue, envelope).await
    }

    /// Publishes pre-encoded bytes as is to this queue (how a redelivery of the same
    /// message is simulated, or a foreign producer's bytes are replayed).
    pub async fn publish_raw(&self, element: impl Into<Vec<u8>>) -> Result<(), TransportError> {
        self.transport
            .publish_raw(&self.config.queue, element.into())
            .await
    }

    /// Moves messages stranded in this queue's processing list (a crashed worker) back
    /// to the queue; see [`Transport::requeue_processing`]. Call it at startup, before
    /// any worker of this queue is running.
    pub async fn requeue_processing(&self) -> Result<usize, TransportError> {
        self.transport.requeue_processing(&self.config.queue).await
    }

    /// Processes messages until the queue is empty (or holds only messages this drain
    /// put back: released unknown URNs, ids in flight elsewhere) and nothing is in
    /// flight; returns the counts. For tests and one-shot jobs.
    pub async fn drain(&self) -> Result<Stats, DrainError> {
        self.consume(Mode::Drain, std::future::pending()).await
    }

    /// Consumes until `shutdown` completes, then stops reserving, lets the messages in
    /// flight finish (and be acked), and returns the counts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use babelqueue_core::runtime::{App, InMemoryTransport};
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
    pub async fn run_until<S>(&self, shutdown: S) -> Stats
    where
        S: Future<Output = ()> + Send,
    {
        match self.consume(Mode::Run, shutdown).await {
            Ok(stats) => stats,
            Err(e) => e.stats,
        }
    }

    /// Consumes until Ctrl-C (or SIGTERM on Unix), then shuts down gracefully (see
    /// [`run_until`](Self::run_until)).
    pub async fn run(&self) -> Stats {
        self.run_until(shutdown_signal()).await
    }

    async fn consume<S>(&self, mode: Mode, shutdown: S) -> Result<Stats, DrainError>
    where
        S: Future<Output = ()> + Send,
    {
        let shared = Arc::new(Shared {
            ctx: Ctx {
                transport: Arc::clone(&self.transport),
                router: Arc::clone(&self.router),
                dlq: self.dead_letter_queue_name(),
                config: self.config.clone(),
                observer: self.observer.clone(),
            },
            mode,
            stop: AtomicBool::new(false),
            wake: Notify::new(),
            busy: AtomicUsize::new(self.config.concurrency),
            blocking: tokio::sync::Mutex::new(()),
            parked: Mutex::new(Parked::default()),
            gave_up: Mutex::new(None),
        });
        let mut workers = JoinSet::new();
        for _ in 0..self.config.concurrency {
            workers.spawn(worker(Arc::clone(&shared)));
        }
        let mut stats = Stats::default();
        let mut merge = |done: Result<Stats, tokio::task::JoinError>| match done {
            Ok(s) => stats.merge(&s),
            Err(e) => {
                // A bug, not a handler failure (those are caught): stop rather than let a
                // drain wait for the lost worker. Its message stays in processing.
                tracing::error!(error = %e, "consumer worker failed; stopping");
                shared.halt();
            }
        };
        tokio::select! {
            biased;
            () = shutdown => {
                tracing::info!(queue = %self.config.queue, "shutting down: finishing in-flight messages");
                shared.halt();
            }
            () = async {
                while let Some(done) = workers.join_next().await {
                    merge(done);
                }
            } => {}
        }
        while let Some(done) = workers.join_next().await {
            merge(done);
        }
        let gave_up = lock(&shared.gave_up).take();
        match gave_up {
            Some(error) => Err(DrainError { error, stats }),
            None => Ok(stats),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Drain only: elements this drain put back (released / deferred), and how many of them
/// were reserved in a row (once that covers them all, only they remain: stop).
#[derive(Default)]
struct Parked {
    hashes: HashSet<u64>,
    streak: usize,
}

/// What the workers of one drain / run share.
struct Shared {
    ctx: Ctx,
    mode: Mode,
    stop: AtomicBool,
    /// Notified when a message was handled (it may have republished one) and on stop.
    wake: Notify,
    /// Workers reserving or handling (drain: the last one to find the queue empty ends it).
    busy: AtomicUsize,
    /// One blocking reserve at a time (a `BLMOVE` holds its connection).
    blocking: tokio::sync::Mutex<()>,
    parked: Mutex<Parked>,
    gave_up: Mutex<Option<TransportError>>,
}

impl Shared {
    fn halt(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Completes once [`halt`](Self::halt) was called.
    async fn stopped(&self) {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.stopping() {
                return;
            }
            notified.await;
        }
    }

    /// Drain: whether `hash` completes a lap over only parked elements.
    fn last_lap(&self, hash: u64) -> bool {
        if self.mode != Mode::Drain {
            return false;
        }
        let mut p = lock(&self.parked);
        if p.hashes.contains(&hash) {
            p.streak += 1;
            p.streak > p.hashes.len()
        } else {
            p.streak = 0;
            false
        }
    }

    async fn reserve(&self) -> Result<Option<Delivery>, TransportError> {
        let queue = &self.ctx.config.queue;
        let got = self.ctx.transport.reserve(queue, Duration::ZERO).await?;
        if got.is_some() || self.mode == Mode::Drain {
            return Ok(got);
        }
        // Nothing waiting: block, one worker at a time, until a message arrives or the
        // poll timeout ends (never cancelled halfway, so nothing is stranded).
        let _turn = tokio::select! {
            biased;
            () = self.stopped() => return Ok(None),
            turn = self.blocking.lock() => turn,
        };
        if self.stopping() {
            return Ok(None);
        }
        self.ctx
            .transport
            .reserve(queue, self.ctx.config.poll_timeout)
            .await
    }

    async fn handle(&self, delivery: Delivery, stats: &mut Stats) {
        let hash = element_hash(delivery.element());
        let last_lap = self.last_lap(hash);
        let span = tracing::info_span!(
            "babelqueue.message",
            queue = %self.ctx.config.queue,
            urn = Empty,
            "meta.id" = Empty,
            trace_id = Empty,
            attempts = Empty,
        );
        let report = process(&self.ctx, delivery).instrument(span).await;
        if let Some(observer) = &self.ctx.observer
            && std::panic::catch_unwind(AssertUnwindSafe(|| observer(&report))).is_err()
        {
            tracing::error!("the on_delivery observer panicked");
        }
        if matches!(
            report.disposition,
            Disposition::Released | Disposition::Deferred
        ) {
            lock(&self.parked).hashes.insert(hash);
        }
        stats.record(&report);
        if last_lap {
            tracing::debug!(queue = %self.ctx.config.queue, "drain: only messages put back by this drain remain");
            self.halt();
        } else {
            self.wake.notify_waiters();
        }
    }
}

/// One consumer loop; `concurrency` of them run at once. Returns what it did.
async fn worker(shared: Arc<Shared>) -> Stats {
    let config = &shared.ctx.config;
    let mut stats = Stats::default();
    let mut backoff = config.backoff_min;
    let mut failing_since: Option<Instant> = None;
    while !shared.stopping() {
        match shared.reserve().await {
            Ok(Some(delivery)) => {
                backoff = config.backoff_min;
                failing_since = None;
                shared.handle(delivery, &mut stats).await;
            }
            Ok(None) => {
                backoff = config.backoff_min;
                failing_since = None;
                if shared.mode == Mode::Run {
                    continue;
                }
                // Drain: the queue looked empty. Wait while another worker is still busy
                // (its message may come back as a retry); the last one to go idle ends it.
                let notified = shared.wake.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if shared.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
                    shared.halt();
                    break;
                }
                notified.await;
                shared.busy.fetch_add(1, Ordering::SeqCst);
            }
            Err(error) => {
                stats.transport_errors += 1;
                let since = *failing_since.get_or_insert_with(Instant::now);
                tracing::warn!(
                    queue = %config.queue,
                    %error,
                    retry_in_ms = backoff.as_millis() as u64,
                    "reserve failed; reconnecting"
                );
                if shared.mode == Mode::Drain && since.elapsed() >= config.give_up_after {
                    lock(&shared.gave_up).get_or_insert(error);
                    shared.halt();
                    break;
                }
                tokio::select! {
                    biased;
                    () = shared.stopped() => {}
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(config.backoff_max);
            }
        }
    }
    stats
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Drain,
    Run,
}

fn element_hash(element: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    element.hash(&mut h);
    h.finish()
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

struct Ctx {
    transport: Arc<dyn Transport>,
    router: Arc<Router>,
    dlq: String,
    config: Config,
    observer: Option<Observer>,
}

/// A handler's future with panics turned into a failure.
struct CatchUnwind(BoxFuture<'static, HandlerOutput>);

impl Future for CatchUnwind {
    type Output = HandlerOutput;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<HandlerOutput> {
        let fut = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(poll) => poll,
            Err(payload) => Poll::Ready(Err(panic_error(payload.as_ref()))),
        }
    }
}

fn panic_error(payload: &(dyn std::any::Any + Send)) -> HandlerError {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned());
    HandlerError::with_type_name(format!("handler panicked: {msg}").into(), "panic")
}

async fn call(handler: &dyn Handler, env: Envelope) -> HandlerOutput {
    match std::panic::catch_unwind(AssertUnwindSafe(|| handler.call(env))) {
        Ok(fut) => CatchUnwind(fut).await,
        Err(payload) => Err(panic_error(payload.as_ref())),
    }
}

/// Whether the error is the lease guard's [`InFlight`] for `id`: an `InFlight` anywhere
/// in the source chain, or an error displaying exactly as `InFlight { id }` does (what an
/// `#[error(transparent)]` wrapper shows, since it hides the inner error from `source()`).
fn is_in_flight(err: &HandlerError, id: &str) -> bool {
    let expected = InFlight { id: id.to_owned() }.to_string();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err.error());
    while let Some(e) = cur {
        if e.is::<InFlight>() || (!id.is_empty() && e.to_string() == expected) {
            return true;
        }
        cur = e.source();
    }
    false
}

struct Failure {
    reason: DeadLetterReason,
    error: String,
    exception: String,
}

impl Ctx {
    async fn retrying<T, F, Fut>(&self, what: &'static str, mut op: F) -> Result<T, TransportError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TransportError>>,
    {
        let mut delay = self.config.backoff_min;
        let mut tries = 1;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(error) if error.is_connection() && tries < self.config.transport_retries => {
                    tracing::warn!(%error, op = what, retry_in_ms = delay.as_millis() as u64, "transport failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.config.backoff_max);
                    tries += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn publish(
        &self,
        queue: &str,
        body: &[u8],
        delivery: &Delivery,
    ) -> Result<(), TransportError> {
        let headers = delivery.headers();
        self.retrying("publish", || {
            self.transport.publish_with_headers(queue, body, headers)
        })
        .await
    }

    async fn ack(&self, delivery: &Delivery) -> bool {
        match self.retrying("ack", || self.transport.ack(delivery)).await {
            Ok(()) => {
                tracing::debug!("acked");
                true
            }
            Err(error) => {
                tracing::error!(%error, "ack failed; the message stays in the processing list");
                false
            }
        }
    }

    /// Acks and builds the report for `disposition`.
    async fn finish(
        &self,
        delivery: &Delivery,
        envelope: Option<Envelope>,
        disposition: Disposition,
        failed: bool,
        error: Option<String>,
    ) -> Report {
        let acked = self.ack(delivery).await;
        Report {
            queue: delivery.queue().to_owned(),
            envelope,
            disposition,
            acked,
            failed,
            unknown_urn: false,
            error,
        }
    }

    fn stranded(
        &self,
        delivery: &Delivery,
        envelope: Option<Envelope>,
        error: TransportError,
        failed: bool,
    ) -> Report {
        tracing::error!(%error, "publishing failed; the message stays in the processing list");
        Report {
            queue: delivery.queue().to_owned(),
            envelope,
            disposition: Disposition::Stranded,
            acked: false,
            failed,
            unknown_urn: false,
            error: Some(error.to_string()),
        }
    }

    async fn dead_letter_body(
        &self,
        delivery: &Delivery,
        envelope: Option<Envelope>,
        body: Vec<u8>,
        reason: DeadLetterReason,
        failed: bool,
        error: String,
    ) -> Report {
        if !self.config.dead_letter {
            tracing::error!(reason = reason.as_str(), %error, "dead-lettering is off: message dropped");
            return self
                .finish(
                    delivery,
                    envelope,
                    Disposition::Dropped,
                    failed,
                    Some(error),
                )
                .await;
        }
        if let Err(e) = self.publish(&self.dlq, &body, delivery).await {
            return self.stranded(delivery, envelope, e, failed);
        }
        tracing::error!(dead_letter_queue = %self.dlq, reason = reason.as_str(), %error, "dead-lettered");
        self.finish(
            delivery,
            envelope,
            Disposition::DeadLettered { reason },
            failed,
            Some(error),
        )
        .await
    }

    async fn poison(&self, delivery: &Delivery, error: DecodeError) -> Report {
        tracing::warn!(%error, bytes = delivery.body().len(), "poison message");
        let body = dead_letter::poison_body(delivery.body(), &error, delivery.queue());
        self.dead_letter_body(
            delivery,
            None,
            body,
            DeadLetterReason::Poison,
            false,
            error.to_string(),
        )
        .await
    }

    /// A failed attempt: retry below the limit, else dead-letter (or drop).
    async fn fail(&self, delivery: &Delivery, envelope: Envelope, f: Failure) -> Report {
        let next = envelope.attempts.saturating_add(1);
        let envelope = self.observer.is_some().then_some(envelope);
        if next < self.config.max_attempts {
            let Some(body) = dead_letter::with_attempts(delivery.body(), u64::from(next)) else {
                return self.stranded(
                    delivery,
                    envelope,
                    TransportError::backend("the body is not a JSON object"),
                    true,
                );
            };
            if let Err(e) = self.publish(delivery.queue(), &body, delivery).await {
                return self.stranded(delivery, envelope, e, true);
            }
            tracing::warn!(error = %f.error, exception = %f.exception, attempts = next, "handler failed; retrying");
            return self
                .finish(
                    delivery,
                    envelope,
                    Disposition::Retried { attempts: next },
                    true,
                    Some(f.error),
                )
                .await;
        }
        let block = Block {
            reason: f.reason.as_str(),
            error: Some(f.error.clone()),
            exception: Some(&f.exception),
            attempts: u64::from(next),
        };
        let Some(body) =
            dead_letter::dead_lettered(delivery.body(), delivery.queue(), true, &block)
        else {
            return self.stranded(
                delivery,
                envelope,
                TransportError::backend("the body is not a JSON object"),
                true,
            );
        };
        self.dead_letter_body(delivery, envelope, body, f.reason, true, f.error)
            .await
    }

    async fn unknown(&self, delivery: &Delivery, envelope: Envelope) -> Report {
        let mut report = self.unknown_strategy(delivery, envelope).await;
        report.unknown_urn = true;
        report
    }

    async fn unknown_strategy(&self, delivery: &Delivery, envelope: Envelope) -> Report {
        let err = UnknownUrn(envelope.job.clone());
        let error = err.to_string();
        tracing::warn!(strategy = ?self.config.unknown_urn, "{error}");
        match self.config.unknown_urn {
            UnknownUrnStrategy::Fail => {
                let f = Failure {
                    reason: DeadLetterReason::UnknownUrn,
                    error,
                    exception: std::any::type_name::<UnknownUrn>().to_owned(),
                };
                self.fail(delivery, envelope, f).await
            }
            UnknownUrnStrategy::Delete => {
                let envelope = self.observer.is_some().then_some(envelope);
                self.finish(delivery, envelope, Disposition::Dropped, false, Some(error))
                    .await
            }
            UnknownUrnStrategy::Release => {
                let envelope = self.observer.is_some().then_some(envelope);
                let element = delivery.element().to_vec();
                let queue = delivery.queue();
                let r = self
                    .retrying("publish", || {
                        self.transport.publish_raw(queue, element.clone())
                    })
                    .await;
                if let Err(e) = r {
                    return self.stranded(delivery, envelope, e, false);
                }
                self.finish(
                    delivery,
                    envelope,
                    Disposition::Released,
                    false,
                    Some(error),
                )
                .await
            }
            UnknownUrnStrategy::DeadLetter => {
                let block = Block {
                    reason: DeadLetterReason::UnknownUrn.as_str(),
                    error: Some(error.clone()),
                    exception: Some(std::any::type_name::<UnknownUrn>()),
                    attempts: u64::from(envelope.attempts),
                };
                let envelope = self.observer.is_some().then_some(envelope);
                let Some(body) =
                    dead_letter::dead_lettered(delivery.body(), delivery.queue(), false, &block)
                else {
                    return self.stranded(
                        delivery,
                        envelope,
                        TransportError::backend("the body is not a JSON object"),
                        false,
                    );
                };
                self.dead_letter_body(
                    delivery,
                    envelope,
                    body,
                    DeadLetterReason::UnknownUrn,
                    false,
                    error,
                )
                .await
            }
        }
    }

    async fn defer(&self, delivery: &Delivery, envelope: Envelope, error: String) -> Report {
        tracing::info!(%error, delay_ms = self.config.in_flight_delay.as_millis() as u64, "in flight on another worker; deferring");
        tokio::time::sleep(self.config.in_flight_delay).await;
        let envelope = self.observer.is_some().then_some(envelope);
        let element = delivery.element().to_vec();
        let queue = delivery.queue();
        let r = self
            .retrying("publish", || {
                self.transport.publish_raw(queue, element.clone())
            })
            .await;
        if let Err(e) = r {
            return self.stranded(delivery, envelope, e, false);
        }
        self.finish(
            delivery,
            envelope,
            Disposition::Deferred,
            false,
            Some(error),
        )
        .await
    }
}

async fn process(ctx: &Ctx, delivery: Delivery) -> Report {
    let envelope = match Envelope::decode(delivery.body()) {
        Ok(env) => env,
        Err(error) => return ctx.poison(&delivery, error).await,
    };
    let span = tracing::Span::current();
    span.record("urn", envelope.urn());
    span.record("meta.id", envelope.meta.id.as_str());
    span.record("trace_id", envelope.trace_id.as_str());
    span.record("attempts", envelope.attempts);

    let Some(handler) = ctx.router.get(envelope.urn()).cloned() else {
        return ctx.unknown(&delivery, envelope).await;
    };
    // The handler takes the envelope by value; keep a copy only if it is needed after.
    let keep = envelope.clone();
    match call(handler.as_ref(), envelope).await {
        Ok(Some(Outcome::Skipped)) => {
            tracing::info!("duplicate skipped by the idempotency guard; acking");
            let env = ctx.observer.is_some().then_some(keep);
            ctx.finish(&delivery, env, Disposition::Skipped, false, None)
                .await
        }
        Ok(_) => {
            let env = ctx.observer.is_some().then_some(keep);
            ctx.finish(&delivery, env, Disposition::Succeeded, false, None)
                .await
        }
        Err(e) if is_in_flight(&e, &keep.meta.id) => {
            ctx.defer(&delivery, keep, e.to_string()).await
        }
        Err(e) => {
            let f = Failure {
                reason: DeadLetterReason::Failed,
                error: e.to_string(),
                exception: e.type_name().to_owned(),
            };
            ctx.fail(&delivery, keep, f).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum MyError {
        #[error(transparent)]
        Busy(#[from] InFlight),
        #[error("charge failed")]
        Wrapped(#[source] InFlight),
        #[error("boom")]
        Boom,
    }

    #[test]
    fn in_flight_is_found_through_the_source_chain_or_a_transparent_wrapper() {
        let busy = || InFlight { id: "x".into() };
        assert!(is_in_flight(&HandlerError::new(busy()), "x"));
        assert!(is_in_flight(
            &HandlerError::new(MyError::Wrapped(busy())),
            "x"
        ));
        assert!(is_in_flight(&HandlerError::new(MyError::Busy(busy())), "x"));
        // A transparent wrapper is recognised only by the id of the message at hand.
        assert!(!is_in_flight(
            &HandlerError::new(MyError::Busy(busy())),
            "y"
        ));
        assert!(!is_in_flight(&HandlerError::new(MyError::Boom), "x"));
    }

    #[tokio::test]
    async fn panics_become_failures() {
        struct Panicky;
        impl Handler for Panicky {
            fn urn(&self) -> &str {
                "urn:x"
            }
            fn call(&self, _: Envelope) -> BoxFuture<'static, HandlerOutput> {
                Box::pin(async { panic!("kaboom") })
            }
        }
        let env = Envelope::new("urn:x", serde_json::json!({})).unwrap();
        let err = call(&Panicky, env).await.unwrap_err();
        assert_eq!(err.type_name(), "panic");
        assert!(err.to_string().contains("kaboom"));
    }
}
