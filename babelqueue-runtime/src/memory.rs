//! [`InMemoryTransport`]: the in-process, embedded transport (no server).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::depth::QueueDepth;
use super::maintain::{ListMaintenance, Maintenance, Recovered};
use super::transport::{ConsumerOptions, Delivery, Republish, Transport, TransportError};
use crate::handler::BoxFuture;

/// Elements are shared with the deliveries handed out, so a large body is not copied.
type Elem = Arc<Vec<u8>>;

#[derive(Default)]
struct QueueState {
    ready: VecDeque<Elem>,
    /// In-flight messages by delivery tag (ordered by reservation), with their consumer.
    processing: BTreeMap<u64, (u64, Elem)>,
    /// Delayed messages by (due time, sequence).
    delayed: BTreeMap<(Instant, u64), Elem>,
    /// Heartbeat expiry per consumer id.
    heartbeats: HashMap<u64, Instant>,
    /// How many times an element was recovered from dead consumers.
    recoveries: HashMap<Elem, u32>,
}

impl QueueState {
    /// Moves up to `limit` due delayed messages to the tail of `ready`.
    fn promote(&mut self, now: Instant, limit: usize) -> usize {
        let mut moved = 0;
        while moved < limit {
            match self.delayed.first_key_value() {
                Some((&(due, _), _)) if due <= now => {
                    let (_, element) = self.delayed.pop_first().expect("checked above");
                    self.ready.push_back(element);
                    moved += 1;
                }
                _ => break,
            }
        }
        moved
    }

    fn next_due(&self, now: Instant) -> Option<Duration> {
        self.delayed
            .first_key_value()
            .map(|(&(due, _), _)| due.saturating_duration_since(now))
    }
}

#[derive(Default)]
struct Inner {
    queues: Mutex<HashMap<String, QueueState>>,
    notify: Notify,
    next_tag: AtomicU64,
    next_consumer: AtomicU64,
    /// The running consumers' background work, by (consumer, queue).
    maintenance: Mutex<HashMap<(u64, String), Maintenance>>,
}

/// An in-process transport with the same semantics as the Redis reliable-queue pattern:
/// each queue is a list of elements plus a processing list; [`reserve`](Transport::reserve)
/// moves the head into processing, [`ack`](Transport::ack) removes it from there. Elements
/// are stored byte for byte.
///
/// Cloning is cheap and every clone shares the same queues, so a test can keep one to
/// inspect [`len`](Self::len) / [`processing_len`](Self::processing_len) while an
/// [`App`](super::App) consumes.
///
/// Delayed messages ([`requeue`](Transport::requeue) with a delay) wait in a per-queue set
/// ordered by due time on tokio's clock (so `tokio::time::pause()` tests work); a reserve
/// promotes those that are due. A clone is the same consumer; [`consumer`](Self::consumer)
/// gives another consumer over the same queues, with its own in-flight messages and
/// heartbeat, so crash recovery ([`ListMaintenance::recover`], run by the background work
/// that [`Transport::start_consumer`] starts) can be exercised in process.
///
/// ```
/// use babelqueue_runtime::{App, InMemoryTransport};
/// use babelqueue_core::Envelope;
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let transport = InMemoryTransport::new();
/// let app = App::new(transport.clone())
///     .queue("orders")
///     .route_sync("urn:babel:orders:created", |_env: &Envelope| ());
/// app.publish("urn:babel:orders:created", &serde_json::json!({"order_id": 1042})).await?;
/// assert_eq!(transport.len("orders"), 1);
/// let stats = app.drain().await?;
/// assert_eq!((stats.succeeded, transport.len("orders"), transport.processing_len("orders")), (1, 0, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Default)]
pub struct InMemoryTransport {
    inner: Arc<Inner>,
    consumer: u64,
}

impl std::fmt::Debug for InMemoryTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queues = self.lock();
        let mut names: Vec<_> = queues
            .iter()
            .map(|(k, q)| (k.clone(), q.ready.len(), q.processing.len()))
            .collect();
        names.sort();
        f.debug_struct("InMemoryTransport")
            .field("queues (name, ready, processing)", &names)
            .finish()
    }
}

impl InMemoryTransport {
    /// An empty transport.
    pub fn new() -> Self {
        Self::default()
    }

    /// Another consumer over the same queues: its reservations are its own in-flight
    /// messages, recovered by the others once its heartbeat expires (a clone, by contrast,
    /// is the same consumer).
    pub fn consumer(&self) -> Self {
        InMemoryTransport {
            inner: self.inner.clone(),
            consumer: self.inner.next_consumer.fetch_add(1, Ordering::Relaxed) + 1,
        }
    }

    /// Messages of `queue` waiting for their delay to pass.
    pub fn delayed_len(&self, queue: &str) -> usize {
        self.lock().get(queue).map_or(0, |q| q.delayed.len())
    }

    /// A copy of the delayed elements of `queue`, earliest due first.
    pub fn delayed(&self, queue: &str) -> Vec<Vec<u8>> {
        self.lock()
            .get(queue)
            .map(|q| q.delayed.values().map(|e| e.to_vec()).collect())
            .unwrap_or_default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, QueueState>> {
        // No code path panics while holding the lock; recover the data if one ever did.
        self.inner
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Messages waiting in `queue` (not reserved).
    pub fn len(&self, queue: &str) -> usize {
        self.lock().get(queue).map_or(0, |q| q.ready.len())
    }

    /// Whether `queue` has no waiting message.
    pub fn is_empty(&self, queue: &str) -> bool {
        self.len(queue) == 0
    }

    /// Messages of `queue` reserved and not yet acked.
    pub fn processing_len(&self, queue: &str) -> usize {
        self.lock().get(queue).map_or(0, |q| q.processing.len())
    }

    /// A copy of the waiting elements of `queue`, head first.
    pub fn messages(&self, queue: &str) -> Vec<Vec<u8>> {
        self.lock()
            .get(queue)
            .map(|q| q.ready.iter().map(|e| e.to_vec()).collect())
            .unwrap_or_default()
    }

    /// A copy of the in-flight elements of `queue`, oldest reservation first.
    pub fn processing(&self, queue: &str) -> Vec<Vec<u8>> {
        self.lock()
            .get(queue)
            .map(|q| q.processing.values().map(|(_, e)| e.to_vec()).collect())
            .unwrap_or_default()
    }

    fn try_reserve(&self, queue: &str) -> Option<Delivery> {
        let mut queues = self.lock();
        let q = queues.get_mut(queue)?;
        q.promote(Instant::now(), usize::MAX);
        let element = q.ready.pop_front()?;
        let tag = self.inner.next_tag.fetch_add(1, Ordering::Relaxed) + 1;
        q.processing
            .insert(tag, (self.consumer, Arc::clone(&element)));
        Some(Delivery::from_shared(queue, element, tag))
    }

    fn wake_maintenance(&self, queue: &str) {
        let key = (self.consumer, queue.to_owned());
        if let Some(m) = self
            .inner
            .maintenance
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            m.wake();
        }
    }

    fn next_due_now(&self, queue: &str) -> Option<Duration> {
        self.lock()
            .get(queue)
            .and_then(|q| q.next_due(Instant::now()))
    }
}

impl Transport for InMemoryTransport {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        self.lock()
            .entry(queue.to_owned())
            .or_default()
            .ready
            .push_back(Arc::new(element));
        self.inner.notify.notify_waiters();
        Box::pin(std::future::ready(Ok(())))
    }

    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let notified = self.inner.notify.notified();
                tokio::pin!(notified);
                // Register interest before looking, so a publish in between is not missed.
                notified.as_mut().enable();
                if let Some(d) = self.try_reserve(queue) {
                    return Ok(Some(d));
                }
                if timeout.is_zero() {
                    return Ok(None);
                }
                // Wake up when a delayed message becomes due, too.
                let wake = match self.next_due_now(queue) {
                    Some(due) => deadline.min(Instant::now() + due),
                    None => deadline,
                };
                if tokio::time::timeout_at(wake, notified).await.is_err() && wake >= deadline {
                    return Ok(self.try_reserve(queue));
                }
            }
        })
    }

    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        if let Some(q) = self.lock().get_mut(delivery.queue())
            && let Some((_, element)) = q.processing.remove(&delivery.tag())
            && !q.recoveries.is_empty()
        {
            q.recoveries.remove(&element);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        republish: Republish,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        let element = match republish.shared_element(delivery) {
            Ok(e) => e,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        {
            let mut queues = self.lock();
            let q = queues.entry(delivery.queue().to_owned()).or_default();
            q.processing.remove(&delivery.tag());
            if delay.is_zero() {
                q.ready.push_back(element);
            } else {
                let seq = self.inner.next_tag.fetch_add(1, Ordering::Relaxed) + 1;
                q.delayed.insert((Instant::now() + delay, seq), element);
            }
        }
        if !delay.is_zero() {
            self.wake_maintenance(delivery.queue());
        }
        // Wake blocked reserves: either to take the message, or to re-arm their timer on
        // the new earliest due time.
        self.inner.notify.notify_waiters();
        Box::pin(std::future::ready(Ok(())))
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
                .insert((self.consumer, queue.to_owned()), m);
            if let Some(old) = old {
                old.stop().await;
            }
            Ok(())
        })
    }

    fn promote_due<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        let n = self
            .lock()
            .get_mut(queue)
            .map_or(0, |q| q.promote(Instant::now(), limit));
        if n > 0 {
            self.inner.notify.notify_waiters();
        }
        Box::pin(std::future::ready(Ok(n)))
    }

    fn next_due<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Option<Duration>, TransportError>> {
        Box::pin(std::future::ready(Ok(self.next_due_now(queue))))
    }

    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueDepth, TransportError>> {
        let depth = self
            .lock()
            .get(queue)
            .map_or_else(QueueDepth::default, |q| {
                QueueDepth::new(
                    q.ready.len() as u64,
                    q.delayed.len() as u64,
                    q.processing.len() as u64,
                )
            });
        Box::pin(std::future::ready(Ok(depth)))
    }

    fn leave<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let m = self
                .inner
                .maintenance
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&(self.consumer, queue.to_owned()));
            if let Some(m) = m {
                m.stop().await;
            }
            if let Some(q) = self.lock().get_mut(queue) {
                q.heartbeats.remove(&self.consumer);
            }
            Ok(())
        })
    }

    fn requeue_processing<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        let n = match self.lock().get_mut(queue) {
            Some(q) => {
                let stranded = std::mem::take(&mut q.processing);
                let n = stranded.len();
                for (_, element) in stranded.into_values().rev() {
                    q.ready.push_front(element);
                }
                n
            }
            None => 0,
        };
        if n > 0 {
            self.inner.notify.notify_waiters();
        }
        Box::pin(std::future::ready(Ok(n)))
    }
}

impl ListMaintenance for InMemoryTransport {
    fn heartbeat<'a>(
        &'a self,
        queue: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        self.lock()
            .entry(queue.to_owned())
            .or_default()
            .heartbeats
            .insert(self.consumer, Instant::now() + ttl);
        Box::pin(std::future::ready(Ok(())))
    }

    fn recover<'a>(
        &'a self,
        queue: &'a str,
        max_recoveries: u32,
    ) -> BoxFuture<'a, Result<Recovered, TransportError>> {
        let mut out = Recovered::default();
        if let Some(q) = self.lock().get_mut(queue) {
            let now = Instant::now();
            let me = self.consumer;
            let alive = |c: u64, hb: &HashMap<u64, Instant>| {
                c == me || hb.get(&c).is_some_and(|&until| until > now)
            };
            let dead: Vec<u64> = q
                .processing
                .iter()
                .filter(|(_, (c, _))| !alive(*c, &q.heartbeats))
                .map(|(&tag, _)| tag)
                .collect();
            for tag in dead {
                let Some((_, element)) = q.processing.remove(&tag) else {
                    continue;
                };
                let count = q.recoveries.entry(Arc::clone(&element)).or_insert(0);
                if *count >= max_recoveries {
                    q.processing.insert(tag, (me, Arc::clone(&element)));
                    out.exhausted
                        .push(Delivery::from_shared(queue, element, tag));
                } else {
                    *count += 1;
                    q.ready.push_back(element);
                    out.requeued += 1;
                }
            }
        }
        if out.requeued > 0 {
            self.inner.notify.notify_waiters();
        }
        Box::pin(std::future::ready(Ok(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reserve_moves_to_processing_and_ack_removes_exactly_it() {
        let t = InMemoryTransport::new();
        t.publish_raw("q", b"a".to_vec()).await.unwrap();
        t.publish_raw("q", b"a".to_vec()).await.unwrap();
        let d1 = t.reserve("q", Duration::ZERO).await.unwrap().unwrap();
        let d2 = t.reserve("q", Duration::ZERO).await.unwrap().unwrap();
        assert_eq!(t.processing_len("q"), 2);
        assert!(t.reserve("q", Duration::ZERO).await.unwrap().is_none());
        t.ack(&d1).await.unwrap();
        assert_eq!(t.processing_len("q"), 1);
        t.ack(&d1).await.unwrap();
        assert_eq!(t.processing_len("q"), 1);
        t.ack(&d2).await.unwrap();
        assert_eq!(t.processing_len("q"), 0);
    }

    #[tokio::test]
    async fn blocking_reserve_wakes_on_publish() {
        let t = InMemoryTransport::new();
        let t2 = t.clone();
        let waiter =
            tokio::spawn(async move { t2.reserve("q", Duration::from_secs(10)).await.unwrap() });
        tokio::task::yield_now().await;
        t.publish_raw("q", b"x".to_vec()).await.unwrap();
        let got = waiter.await.unwrap().unwrap();
        assert_eq!(got.element(), b"x");
    }

    #[tokio::test]
    async fn blocking_reserve_times_out() {
        let t = InMemoryTransport::new();
        assert!(
            t.reserve("q", Duration::from_millis(50))
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_with_delay_waits_on_tokio_clock_and_wakes_a_blocked_reserve() {
        let t = InMemoryTransport::new();
        t.publish_raw("q", b"m".to_vec()).await.unwrap();
        let d = t.reserve("q", Duration::ZERO).await.unwrap().unwrap();
        t.requeue(
            &d,
            Republish::with_body(b"m2".to_vec()),
            Duration::from_millis(300),
        )
        .await
        .unwrap();
        assert_eq!(
            (t.processing_len("q"), t.delayed_len("q"), t.len("q")),
            (0, 1, 0)
        );
        assert_eq!(
            t.next_due("q").await.unwrap(),
            Some(Duration::from_millis(300))
        );
        assert!(t.reserve("q", Duration::ZERO).await.unwrap().is_none());
        let start = Instant::now();
        let got = t
            .reserve("q", Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.element(), b"m2");
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        assert_eq!(t.next_due("q").await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn promote_due_moves_only_due_messages_to_the_tail() {
        let t = InMemoryTransport::new();
        for b in [b"a", b"b", b"c"] {
            t.publish_raw("q", b.to_vec()).await.unwrap();
        }
        let a = t.reserve("q", Duration::ZERO).await.unwrap().unwrap();
        let b = t.reserve("q", Duration::ZERO).await.unwrap().unwrap();
        t.requeue(
            &a,
            Republish::with_body(b"a".to_vec()),
            Duration::from_millis(100),
        )
        .await
        .unwrap();
        t.requeue(
            &b,
            Republish::with_body(b"b".to_vec()),
            Duration::from_millis(200),
        )
        .await
        .unwrap();
        assert_eq!(t.promote_due("q", 10).await.unwrap(), 0);
        tokio::time::advance(Duration::from_millis(150)).await;
        assert_eq!(t.promote_due("q", 10).await.unwrap(), 1);
        assert_eq!(t.messages("q"), vec![b"c".to_vec(), b"a".to_vec()]);
        assert_eq!(
            t.next_due("q").await.unwrap(),
            Some(Duration::from_millis(50))
        );
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(t.next_due("q").await.unwrap(), Some(Duration::ZERO));
        assert_eq!(t.promote_due("q", 10).await.unwrap(), 1);
        assert_eq!(t.delayed_len("q"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn recover_takes_only_dead_consumers_messages_and_exhausts_after_the_limit() {
        let live = InMemoryTransport::new();
        live.publish_raw("q", b"x".to_vec()).await.unwrap();
        live.publish_raw("q", b"y".to_vec()).await.unwrap();
        let alive = live.consumer();
        alive.heartbeat("q", Duration::from_secs(10)).await.unwrap();
        let _held = alive.reserve("q", Duration::ZERO).await.unwrap().unwrap();
        for round in 0..3 {
            let dead = live.consumer();
            dead.heartbeat("q", Duration::from_secs(1)).await.unwrap();
            let _d = dead.reserve("q", Duration::ZERO).await.unwrap().unwrap();
            // Alive until its heartbeat expires.
            assert_eq!(live.recover("q", 2).await.unwrap().requeued, 0);
            tokio::time::advance(Duration::from_secs(2)).await;
            alive.heartbeat("q", Duration::from_secs(10)).await.unwrap();
            let r = live.recover("q", 2).await.unwrap();
            if round < 2 {
                assert_eq!((r.requeued, r.exhausted.len()), (1, 0));
            } else {
                assert_eq!((r.requeued, r.exhausted.len()), (0, 1));
                assert_eq!(r.exhausted[0].element(), b"y");
                // Now in the recovering consumer's in flight: its ack removes it.
                live.ack(&r.exhausted[0]).await.unwrap();
            }
        }
        // The live consumer's message was never touched.
        assert_eq!(live.processing("q"), vec![b"x".to_vec()]);
        assert_eq!(live.len("q"), 0);
    }

    #[tokio::test]
    async fn requeue_processing_restores_order_at_the_head() {
        let t = InMemoryTransport::new();
        for b in [b"1", b"2", b"3"] {
            t.publish_raw("q", b.to_vec()).await.unwrap();
        }
        let _a = t.reserve("q", Duration::ZERO).await.unwrap().unwrap();
        let _b = t.reserve("q", Duration::ZERO).await.unwrap().unwrap();
        assert_eq!(t.requeue_processing("q").await.unwrap(), 2);
        assert_eq!(
            t.messages("q"),
            vec![b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]
        );
        assert_eq!(t.processing_len("q"), 0);
    }
}
