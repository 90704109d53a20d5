//! The transactional outbox (ADR-0029): the encoded envelope is written in the caller's own
//! database transaction beside the business write, and an [`OutboxRelay`] publishes the
//! stored bytes unchanged, marking them published only after the broker accepted them.
//!
//! A producer that commits and then publishes has a dual write: a crash in between loses
//! the message (or, publishing first, sends a phantom one for a rolled-back write). With
//! the outbox the message row commits or rolls back with the business row; the relay then
//! delivers it **at least once** (a crash after the publish and before the mark publishes
//! it again: the consumer's idempotency guard absorbs the duplicate).
//!
//! - The **write** takes the backend's transaction type, so it lives on the backend:
//!   `babelqueue_postgres::PostgresOutbox::save` (a `tokio_postgres::Transaction`) and
//!   `babelqueue_sqlite::SqliteOutbox::save` (a `rusqlite::Transaction`). It is the Go
//!   SDK's `Save(encoded, queue) → id`; the queue is `meta.queue`, else `default`.
//! - The **relay side** is the [`OutboxStore`] trait: [`fetch_unpublished`]
//!   (claiming due rows for a lease so concurrent relays skip them),
//!   [`mark_published`], [`mark_failed`] (attempt count, reason, next try) and
//!   [`release`] — the Go SDK's `FetchUnpublished` / `MarkPublished` / `MarkFailed`.
//! - [`OutboxRelay`] runs passes over any [`Transport`]: claim a batch (oldest first),
//!   [`publish_raw`](Transport::publish_raw) each row's bytes to its queue in id order, mark
//!   the published ones; on a failure, record it on that row (retried after an exponential
//!   backoff) and hand the rest of the batch back unpublished.
//!
//! [`fetch_unpublished`]: OutboxStore::fetch_unpublished
//! [`mark_published`]: OutboxStore::mark_published
//! [`mark_failed`]: OutboxStore::mark_failed
//! [`release`]: OutboxStore::release
//!
//! ```
//! use std::sync::Arc;
//! use babelqueue_core::Envelope;
//! use babelqueue_runtime::outbox::{InMemoryOutbox, OutboxRelay};
//! use babelqueue_runtime::{InMemoryTransport, Transport};
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let outbox = Arc::new(InMemoryOutbox::new());
//! let env = Envelope::new("urn:babel:orders:created", serde_json::json!({"order_id": 7}))?
//!     .with_queue("orders");
//! outbox.save_envelope(&env);
//!
//! let transport = InMemoryTransport::new();
//! let relay = OutboxRelay::new(outbox.clone(), Arc::new(transport.clone()));
//! let stats = relay.drain().await?;
//! assert_eq!(stats.published, 1);
//! assert_eq!(transport.len("orders"), 1);
//! assert_eq!(outbox.pending(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::Transport;
use crate::handler::{BoxError, BoxFuture};
use babelqueue_core::envelope::{DEFAULT_QUEUE, Envelope};

/// An outbox operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The database failed (`op` names the operation: `save`, `fetch_unpublished`, …).
    #[error("outbox {op} failed")]
    Store {
        /// The operation.
        op: &'static str,
        /// The database error.
        #[source]
        source: BoxError,
    },
    /// The envelope's data breaks the schema registered for its URN (or that schema could
    /// not be loaded): nothing was written.
    #[cfg(feature = "schema")]
    #[error(transparent)]
    Schema(#[from] babelqueue_core::schema::SchemaError),
}

impl OutboxError {
    /// A database failure of `op`.
    pub fn store(op: &'static str, source: impl Into<BoxError>) -> Self {
        OutboxError::Store {
            op,
            source: source.into(),
        }
    }
}

/// One claimed outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxRecord {
    /// The row id (increasing in write order).
    pub id: i64,
    /// The queue to publish to.
    pub queue: String,
    /// The element to publish, byte for byte as it was saved.
    pub payload: Vec<u8>,
    /// Failed publish attempts so far.
    pub attempts: u32,
}

impl OutboxRecord {
    /// A record (the struct is `#[non_exhaustive]`, so store implementations build it here).
    pub fn new(id: i64, queue: impl Into<String>, payload: Vec<u8>, attempts: u32) -> Self {
        OutboxRecord {
            id,
            queue: queue.into(),
            payload,
            attempts,
        }
    }
}

/// The queue of an outbox row for `envelope`: its `meta.queue`, else `default` (SPEC §8).
pub fn queue_of(envelope: &Envelope) -> &str {
    if envelope.meta.queue.is_empty() {
        DEFAULT_QUEUE
    } else {
        &envelope.meta.queue
    }
}

/// Encodes `envelope` for an outbox row: `(bytes, queue)`, after checking its data
/// against `schemas` when given (the outbox write refuses what [`App::publish`] would).
///
/// [`App::publish`]: crate::App::publish
#[cfg(feature = "schema")]
pub fn encode_checked<'e>(
    envelope: &'e Envelope,
    schemas: Option<&babelqueue_core::schema::Schemas>,
) -> Result<(Vec<u8>, &'e str), OutboxError> {
    if let Some(schemas) = schemas {
        schemas.check(envelope)?;
    }
    Ok((envelope.encode(), queue_of(envelope)))
}

/// The relay's side of an outbox table (writes go through the backend's transaction).
///
/// Contract:
/// - [`fetch_unpublished`](Self::fetch_unpublished) claims rows atomically: of several
///   relays calling it at once, each due row goes to at most one of them until its `lease`
///   runs out (PostgreSQL: `FOR UPDATE SKIP LOCKED`; SQLite: an `IMMEDIATE` transaction);
/// - a claimed row not marked within its lease is due again (its relay crashed);
/// - a failed row is due again after the delay given to [`mark_failed`](Self::mark_failed).
pub trait OutboxStore: Send + Sync + 'static {
    /// Claims up to `limit` rows that are unpublished, due and unclaimed (or whose claim
    /// expired), oldest id first, for `lease`.
    fn fetch_unpublished(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<OutboxRecord>, OutboxError>>;

    /// Marks rows published (the broker accepted them).
    fn mark_published<'a>(&'a self, ids: &'a [i64]) -> BoxFuture<'a, Result<(), OutboxError>>;

    /// Records a failed publish of row `id`: one more attempt, `reason`, due again after
    /// `retry_in`, claim released.
    fn mark_failed<'a>(
        &'a self,
        id: i64,
        reason: &'a str,
        retry_in: Duration,
    ) -> BoxFuture<'a, Result<(), OutboxError>>;

    /// Releases claimed rows that were not attempted (due again at once, attempts
    /// unchanged).
    fn release<'a>(&'a self, ids: &'a [i64]) -> BoxFuture<'a, Result<(), OutboxError>>;

    /// Waits until new rows may be due, for at most `max`. The default sleeps `max` (a
    /// poll); a store that hears of new rows (PostgreSQL `LISTEN`) returns earlier.
    fn wait_for_rows(&self, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(max))
    }
}

impl<S: OutboxStore + ?Sized> OutboxStore for Arc<S> {
    fn fetch_unpublished(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<OutboxRecord>, OutboxError>> {
        (**self).fetch_unpublished(limit, lease)
    }
    fn mark_published<'a>(&'a self, ids: &'a [i64]) -> BoxFuture<'a, Result<(), OutboxError>> {
        (**self).mark_published(ids)
    }
    fn mark_failed<'a>(
        &'a self,
        id: i64,
        reason: &'a str,
        retry_in: Duration,
    ) -> BoxFuture<'a, Result<(), OutboxError>> {
        (**self).mark_failed(id, reason, retry_in)
    }
    fn release<'a>(&'a self, ids: &'a [i64]) -> BoxFuture<'a, Result<(), OutboxError>> {
        (**self).release(ids)
    }
    fn wait_for_rows(&self, max: Duration) -> BoxFuture<'_, ()> {
        (**self).wait_for_rows(max)
    }
}

/// What one [`OutboxRelay::relay_once`] pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayPass {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows published and marked.
    pub published: usize,
    /// Rows whose publish failed (recorded with [`OutboxStore::mark_failed`]).
    pub failed: usize,
}

/// Totals of a relay's passes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Passes run.
    pub passes: u64,
    /// Rows published and marked.
    pub published: u64,
    /// Failed publishes recorded.
    pub failed: u64,
    /// Passes that failed on the store (retried after a backoff).
    pub store_errors: u64,
}

impl RelayStats {
    fn add(&mut self, pass: RelayPass) {
        self.passes += 1;
        self.published += pass.published as u64;
        self.failed += pass.failed as u64;
    }
}

/// Publishes an outbox's rows through a [`Transport`]; see the [module docs](self).
///
/// It notices new rows through [`OutboxStore::wait_for_rows`]: PostgreSQL's
/// `LISTEN/NOTIFY` when the outbox listens (every save notifies on commit), else a poll
/// every [`poll_interval`](Self::poll_interval) (default 200 ms). A full batch is followed
/// by the next pass at once.
#[derive(Clone)]
pub struct OutboxRelay {
    store: Arc<dyn OutboxStore>,
    transport: Arc<dyn Transport>,
    batch_size: usize,
    lease: Duration,
    poll_interval: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
}

impl std::fmt::Debug for OutboxRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxRelay")
            .field("batch_size", &self.batch_size)
            .field("lease", &self.lease)
            .field("poll_interval", &self.poll_interval)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .finish_non_exhaustive()
    }
}

impl OutboxRelay {
    /// A relay of `store` onto `transport`: batches of 100, a 30 s claim lease, a 200 ms
    /// poll, failed rows retried after 1 s, 2 s, 4 s, … up to 5 min.
    pub fn new(store: impl OutboxStore, transport: Arc<dyn Transport>) -> Self {
        OutboxRelay {
            store: Arc::new(store),
            transport,
            batch_size: 100,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(200),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
        }
    }

    /// Rows claimed per pass (default 100, at least 1). A relay killed between its
    /// publishes and its mark republishes at most one batch.
    #[must_use]
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }

    /// How long a claim keeps other relays off the claimed rows (default 30 s): longer than
    /// a batch takes to publish, or a slow relay's rows are published twice.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The longest wait between passes when the outbox is empty (default 200 ms).
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The retry delay after a failed publish: `min` after the first failure, doubling
    /// per failure up to `max` (defaults 1 s and 5 min). Also the wait after a store error.
    #[must_use]
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max.max(min);
        self
    }

    /// The delay before the next try of a row that has failed `attempts` times.
    pub fn retry_delay(&self, attempts: u32) -> Duration {
        let factor = 1u32 << attempts.saturating_sub(1).min(20);
        self.backoff_min
            .saturating_mul(factor)
            .min(self.backoff_max)
    }

    /// One pass: claims a batch, publishes its rows in id order, marks the published ones.
    /// On a publish failure the row is recorded failed (due again after
    /// [`retry_delay`](Self::retry_delay)) and the rest of the batch is released
    /// unattempted, so a relay keeps its rows in order while the broker accepts them.
    pub async fn relay_once(&self) -> Result<RelayPass, OutboxError> {
        let mut rows = self
            .store
            .fetch_unpublished(self.batch_size, self.lease)
            .await?;
        rows.sort_by_key(|r| r.id);
        let mut pass = RelayPass {
            claimed: rows.len(),
            ..RelayPass::default()
        };
        let mut published = Vec::with_capacity(rows.len());
        let mut failure = None;
        for (i, row) in rows.iter().enumerate() {
            // Tracing: a PRODUCER span per row (`publish_raw` without one).
            match crate::publish_traced(&*self.transport, &row.queue, row.payload.clone()).await {
                Ok(()) => published.push(row.id),
                Err(e) => {
                    failure = Some((i, reason(&e)));
                    break;
                }
            }
        }
        if !published.is_empty() {
            self.store.mark_published(&published).await?;
            pass.published = published.len();
        }
        if let Some((i, why)) = failure {
            let row = &rows[i];
            let delay = self.retry_delay(row.attempts.saturating_add(1));
            tracing::warn!(id = row.id, queue = %row.queue, attempts = row.attempts + 1,
                retry_in = ?delay, reason = %why, "outbox publish failed");
            self.store.mark_failed(row.id, &why, delay).await?;
            pass.failed = 1;
            let rest: Vec<i64> = rows[i + 1..].iter().map(|r| r.id).collect();
            if !rest.is_empty() {
                self.store.release(&rest).await?;
            }
        }
        Ok(pass)
    }

    /// Runs passes until no row is due (a pass claims nothing), returning the totals. A
    /// store error ends it. For tests and one-shot jobs: rows failing again and again keep
    /// it running only while their retry delays pass.
    pub async fn drain(&self) -> Result<RelayStats, OutboxError> {
        let mut stats = RelayStats::default();
        loop {
            let pass = self.relay_once().await?;
            stats.add(pass);
            if pass.claimed == 0 {
                return Ok(stats);
            }
            if pass.failed > 0 && pass.published == 0 {
                // Nothing got through: the failed row is not due again yet.
                return Ok(stats);
            }
        }
    }

    /// Relays until `shutdown` completes, then returns the totals. A pass in progress is
    /// finished first (never cut between a publish and its mark). After a pass that failed
    /// on the store, or whose publishes all failed (the broker is down), it waits the
    /// [`backoff`](Self::backoff) (growing with each such pass) instead of the poll; it
    /// never gives up.
    pub async fn run<S>(&self, shutdown: S) -> RelayStats
    where
        S: Future<Output = ()> + Send,
    {
        let mut stats = RelayStats::default();
        let mut shutdown = std::pin::pin!(shutdown);
        // Consecutive passes that failed on the store, or published nothing because the
        // broker refused: the relay backs off instead of polling.
        let mut failing_passes: u32 = 0;
        loop {
            let wait = match self.relay_once().await {
                Ok(pass) => {
                    stats.add(pass);
                    if pass.failed > 0 && pass.published == 0 {
                        failing_passes = failing_passes.saturating_add(1);
                        Wait::Backoff
                    } else {
                        failing_passes = 0;
                        if pass.claimed == self.batch_size && pass.failed == 0 {
                            Wait::None
                        } else {
                            Wait::Poll
                        }
                    }
                }
                Err(e) => {
                    failing_passes = failing_passes.saturating_add(1);
                    stats.store_errors += 1;
                    tracing::warn!(error = %error_chain(&e), "outbox relay pass failed");
                    Wait::Backoff
                }
            };
            let deadline_wait = async {
                match wait {
                    Wait::None => tokio::task::yield_now().await,
                    Wait::Poll => self.store.wait_for_rows(self.poll_interval).await,
                    Wait::Backoff => tokio::time::sleep(self.retry_delay(failing_passes)).await,
                }
            };
            tokio::select! {
                biased;
                () = &mut shutdown => return stats,
                () = deadline_wait => {}
            }
        }
    }
}

enum Wait {
    None,
    Poll,
    Backoff,
}

fn reason(e: &dyn std::error::Error) -> String {
    error_chain(e)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

#[derive(Debug)]
struct MemRow {
    queue: String,
    payload: Vec<u8>,
    attempts: u32,
    last_error: Option<String>,
    due: Instant,
    claimed_until: Option<Instant>,
    published: bool,
}

/// An outbox in memory, for tests and examples: [`save`](Self::save) stands for the
/// transactional write (there is no transaction), and it implements [`OutboxStore`] with
/// the same claim rules as the database outboxes (times from tokio's clock, so paused time
/// drives leases and retries).
#[derive(Debug, Default)]
pub struct InMemoryOutbox {
    rows: Mutex<BTreeMap<i64, MemRow>>,
    next_id: Mutex<i64>,
}

impl InMemoryOutbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `encoded` for `queue`; returns its id.
    pub fn save(&self, encoded: impl Into<Vec<u8>>, queue: impl Into<String>) -> i64 {
        let id = {
            let mut next = self.next_id.lock().unwrap_or_else(|p| p.into_inner());
            *next += 1;
            *next
        };
        self.lock().insert(
            id,
            MemRow {
                queue: queue.into(),
                payload: encoded.into(),
                attempts: 0,
                last_error: None,
                due: Instant::now(),
                claimed_until: None,
                published: false,
            },
        );
        id
    }

    /// Stores an envelope (queue: `meta.queue`, else `default`); returns its id.
    pub fn save_envelope(&self, envelope: &Envelope) -> i64 {
        self.save(envelope.encode(), queue_of(envelope))
    }

    /// Rows not yet published.
    pub fn pending(&self) -> usize {
        self.lock().values().filter(|r| !r.published).count()
    }

    /// The failed attempts and the last failure of row `id`.
    pub fn failures_of(&self, id: i64) -> Option<(u32, Option<String>)> {
        self.lock()
            .get(&id)
            .map(|r| (r.attempts, r.last_error.clone()))
    }

    /// Whether row `id` is marked published.
    pub fn is_published(&self, id: i64) -> bool {
        self.lock().get(&id).is_some_and(|r| r.published)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, MemRow>> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl OutboxStore for InMemoryOutbox {
    fn fetch_unpublished(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<OutboxRecord>, OutboxError>> {
        let now = Instant::now();
        let mut rows = self.lock();
        let claimed = rows
            .iter_mut()
            .filter(|(_, r)| {
                !r.published && r.due <= now && r.claimed_until.is_none_or(|c| c <= now)
            })
            .take(limit)
            .map(|(id, r)| {
                r.claimed_until = Some(now + lease);
                OutboxRecord::new(*id, r.queue.clone(), r.payload.clone(), r.attempts)
            })
            .collect();
        Box::pin(std::future::ready(Ok(claimed)))
    }

    fn mark_published<'a>(&'a self, ids: &'a [i64]) -> BoxFuture<'a, Result<(), OutboxError>> {
        let mut rows = self.lock();
        for id in ids {
            if let Some(r) = rows.get_mut(id) {
                r.published = true;
                r.claimed_until = None;
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn mark_failed<'a>(
        &'a self,
        id: i64,
        reason: &'a str,
        retry_in: Duration,
    ) -> BoxFuture<'a, Result<(), OutboxError>> {
        if let Some(r) = self.lock().get_mut(&id) {
            r.attempts = r.attempts.saturating_add(1);
            r.last_error = Some(reason.to_owned());
            r.due = Instant::now() + retry_in;
            r.claimed_until = None;
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn release<'a>(&'a self, ids: &'a [i64]) -> BoxFuture<'a, Result<(), OutboxError>> {
        let mut rows = self.lock();
        for id in ids {
            if let Some(r) = rows.get_mut(id) {
                r.claimed_until = None;
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Delivery, InMemoryTransport, TransportError};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A transport that refuses publishes while `down` is set.
    #[derive(Clone)]
    struct Flaky {
        inner: InMemoryTransport,
        down: Arc<AtomicBool>,
    }

    impl Transport for Flaky {
        fn publish_raw<'a>(
            &'a self,
            queue: &'a str,
            element: Vec<u8>,
        ) -> BoxFuture<'a, Result<(), TransportError>> {
            if self.down.load(Ordering::SeqCst) {
                return Box::pin(async {
                    Err(TransportError::connection(std::io::Error::other(
                        "broker down",
                    )))
                });
            }
            self.inner.publish_raw(queue, element)
        }
        fn reserve<'a>(
            &'a self,
            queue: &'a str,
            timeout: Duration,
        ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
            self.inner.reserve(queue, timeout)
        }
        fn ack<'a>(&'a self, d: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
            self.inner.ack(d)
        }
    }

    async fn drain_queue(t: &InMemoryTransport, queue: &str) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(d) = t.reserve(queue, Duration::ZERO).await.unwrap() {
            out.push(d.element().to_vec());
            t.ack(&d).await.unwrap();
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn publishes_bytes_unchanged_in_order_and_marks_them() {
        let outbox = Arc::new(InMemoryOutbox::new());
        let t = InMemoryTransport::new();
        let ids: Vec<i64> = (0..5)
            .map(|i| outbox.save(format!("raw-{i}").into_bytes(), "q"))
            .collect();
        let relay = OutboxRelay::new(outbox.clone(), Arc::new(t.clone())).batch_size(2);
        let stats = relay.drain().await.unwrap();
        assert_eq!((stats.published, stats.failed), (5, 0));
        assert!(ids.iter().all(|id| outbox.is_published(*id)));
        let got = drain_queue(&t, "q").await;
        let want: Vec<Vec<u8>> = (0..5).map(|i| format!("raw-{i}").into_bytes()).collect();
        assert_eq!(got, want);
        // Nothing is published twice.
        assert_eq!(relay.drain().await.unwrap().published, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_recorded_and_retried_after_the_backoff() {
        let outbox = Arc::new(InMemoryOutbox::new());
        let inner = InMemoryTransport::new();
        let down = Arc::new(AtomicBool::new(true));
        let t = Flaky {
            inner: inner.clone(),
            down: down.clone(),
        };
        let a = outbox.save(b"a".to_vec(), "q");
        let b = outbox.save(b"b".to_vec(), "q");
        let relay = OutboxRelay::new(outbox.clone(), Arc::new(t))
            .backoff(Duration::from_secs(1), Duration::from_secs(8));

        let pass = relay.relay_once().await.unwrap();
        assert_eq!((pass.claimed, pass.published, pass.failed), (2, 0, 1));
        let (attempts, why) = outbox.failures_of(a).unwrap();
        assert_eq!(attempts, 1);
        assert!(why.unwrap().contains("broker down"));
        // `b` was released unattempted, so it is due at once; `a` waits for its backoff.
        assert_eq!(outbox.failures_of(b).unwrap().0, 0);
        let pass = relay.relay_once().await.unwrap();
        assert_eq!((pass.claimed, pass.failed), (1, 1));
        assert_eq!(outbox.failures_of(b).unwrap().0, 1);
        assert_eq!(relay.relay_once().await.unwrap().claimed, 0);

        down.store(false, Ordering::SeqCst);
        tokio::time::advance(Duration::from_millis(1001)).await;
        let stats = relay.drain().await.unwrap();
        assert_eq!(stats.published, 2);
        assert_eq!(
            drain_queue(&inner, "q").await,
            [b"a".to_vec(), b"b".to_vec()]
        );
        assert_eq!(outbox.pending(), 0);
    }

    #[test]
    fn retry_delays_double_up_to_the_cap() {
        let relay = OutboxRelay::new(InMemoryOutbox::new(), Arc::new(InMemoryTransport::new()))
            .backoff(Duration::from_millis(100), Duration::from_secs(1));
        let d: Vec<u128> = (1..7).map(|a| relay.retry_delay(a).as_millis()).collect();
        assert_eq!(d, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(relay.retry_delay(u32::MAX).as_millis(), 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_claim_is_claimed_again() {
        let outbox = InMemoryOutbox::new();
        outbox.save(b"x".to_vec(), "q");
        let first = outbox
            .fetch_unpublished(10, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(first.len(), 1);
        assert!(
            outbox
                .fetch_unpublished(10, Duration::from_secs(5))
                .await
                .unwrap()
                .is_empty()
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            outbox
                .fetch_unpublished(10, Duration::from_secs(5))
                .await
                .unwrap(),
            first
        );
    }

    #[tokio::test(start_paused = true)]
    async fn run_relays_rows_written_while_it_runs_and_stops_on_shutdown() {
        let outbox = Arc::new(InMemoryOutbox::new());
        let t = InMemoryTransport::new();
        let relay = OutboxRelay::new(outbox.clone(), Arc::new(t.clone()))
            .poll_interval(Duration::from_millis(50));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn({
            let relay = relay.clone();
            async move {
                relay
                    .run(async {
                        let _ = rx.await;
                    })
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(120)).await;
        outbox.save(b"late".to_vec(), "q");
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(t.len("q"), 1);
        tx.send(()).unwrap();
        let stats = task.await.unwrap();
        assert_eq!(stats.published, 1);
        assert!(stats.passes >= 2);
    }
}
