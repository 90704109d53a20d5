//! [`InMemoryTransport`]: the in-process, embedded transport (no server).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use super::transport::{Delivery, Transport, TransportError};
use crate::handler::BoxFuture;

#[derive(Default)]
struct QueueState {
    ready: VecDeque<Vec<u8>>,
    /// In-flight messages by delivery tag (ordered by reservation).
    processing: BTreeMap<u64, Vec<u8>>,
}

#[derive(Default)]
struct Inner {
    queues: Mutex<HashMap<String, QueueState>>,
    notify: Notify,
    next_tag: AtomicU64,
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
/// ```
/// use babelqueue_core::runtime::{App, InMemoryTransport};
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
            .map(|q| q.ready.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// A copy of the in-flight elements of `queue`, oldest reservation first.
    pub fn processing(&self, queue: &str) -> Vec<Vec<u8>> {
        self.lock()
            .get(queue)
            .map(|q| q.processing.values().cloned().collect())
            .unwrap_or_default()
    }

    fn try_reserve(&self, queue: &str) -> Option<Delivery> {
        let mut queues = self.lock();
        let q = queues.get_mut(queue)?;
        let element = q.ready.pop_front()?;
        let tag = self.inner.next_tag.fetch_add(1, Ordering::Relaxed) + 1;
        q.processing.insert(tag, element.clone());
        Some(Delivery::new(queue, element, tag))
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
            .push_back(element);
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
                if timeout.is_zero() || tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return Ok(self.try_reserve(queue));
                }
            }
        })
    }

    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        if let Some(q) = self.lock().get_mut(delivery.queue()) {
            q.processing.remove(&delivery.tag());
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn requeue_processing<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        let n = match self.lock().get_mut(queue) {
            Some(q) => {
                let stranded = std::mem::take(&mut q.processing);
                let n = stranded.len();
                for element in stranded.into_values().rev() {
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
