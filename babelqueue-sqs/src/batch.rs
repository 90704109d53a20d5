//! Coalescing of concurrent calls into SQS batch calls, without delaying any of them.
//!
//! The first item submitted while no batch is on its way is sent at once (alone); items
//! submitted while a batch is on its way wait for it and go together in the next one (up
//! to SQS's 10 entries and the payload cap). A lone caller never waits for company, and
//! under load each round trip carries up to 10 items.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use babelqueue_runtime::TransportError;
use babelqueue_runtime::handler::BoxFuture;
use tokio::sync::oneshot;

/// SQS's cap on the entries of one batch call.
pub const MAX_ENTRIES: usize = 10;

/// Sends one batch; answers one result per item, in order.
pub type Flush<T> =
    Arc<dyn Fn(Vec<T>) -> BoxFuture<'static, Vec<Result<(), TransportError>>> + Send + Sync>;

type Waiter = oneshot::Sender<Result<(), TransportError>>;

struct State<T> {
    pending: VecDeque<(T, usize, Waiter)>,
    running: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A batcher for one queue and one kind of call.
pub struct Batcher<T> {
    state: Arc<Mutex<State<T>>>,
    flush: Flush<T>,
    max_bytes: usize,
}

impl<T: Send + 'static> Batcher<T> {
    /// Batches of at most [`MAX_ENTRIES`] items whose weights sum to at most `max_bytes`
    /// (a heavier item goes alone).
    pub fn new(flush: Flush<T>, max_bytes: usize) -> Self {
        Batcher {
            state: Arc::new(Mutex::new(State {
                pending: VecDeque::new(),
                running: false,
            })),
            flush,
            max_bytes,
        }
    }

    /// Sends `item` (of `weight` bytes) in the next batch and waits for its result.
    pub async fn submit(&self, item: T, weight: usize) -> Result<(), TransportError> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut s = lock(&self.state);
            s.pending.push_back((item, weight, tx));
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            tokio::spawn(run(
                Arc::clone(&self.state),
                Arc::clone(&self.flush),
                self.max_bytes,
            ));
        }
        rx.await
            .unwrap_or_else(|_| Err(TransportError::backend("the SQS batch sender stopped")))
    }
}

/// Marks the sender stopped, and fails what is left, however `run` ends (a panic in a
/// flush included): a later submit starts a new sender.
struct Stop<T>(Arc<Mutex<State<T>>>);

impl<T> Drop for Stop<T> {
    fn drop(&mut self) {
        let mut s = lock(&self.0);
        if std::thread::panicking() || s.running {
            for (_, _, tx) in s.pending.drain(..) {
                let _ = tx.send(Err(TransportError::backend("the SQS batch sender stopped")));
            }
            s.running = false;
        }
    }
}

async fn run<T>(state: Arc<Mutex<State<T>>>, flush: Flush<T>, max_bytes: usize) {
    let _stop = Stop(Arc::clone(&state));
    loop {
        let (items, waiters): (Vec<T>, Vec<Waiter>) = {
            let mut s = lock(&state);
            if s.pending.is_empty() {
                s.running = false;
                return;
            }
            let mut total = 0;
            let mut batch = Vec::new();
            while let Some((_, w, _)) = s.pending.front() {
                if batch.len() == MAX_ENTRIES || (!batch.is_empty() && total + w > max_bytes) {
                    break;
                }
                total += w;
                let (item, _, tx) = s.pending.pop_front().expect("front exists");
                batch.push((item, tx));
            }
            batch.into_iter().unzip()
        };
        let n = items.len();
        let mut results = flush(items).await.into_iter();
        for tx in waiters {
            let r = results.next().unwrap_or_else(|| {
                Err(TransportError::backend(format!(
                    "the SQS batch call answered fewer than {n} results"
                )))
            });
            let _ = tx.send(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_items_share_batches_and_a_lone_one_goes_at_once() {
        let calls = Arc::new(Mutex::new(Vec::<usize>::new()));
        let c = Arc::clone(&calls);
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let g = Arc::clone(&gate);
        let flush: Flush<u32> = Arc::new(move |items: Vec<u32>| {
            let c = Arc::clone(&c);
            let g = Arc::clone(&g);
            Box::pin(async move {
                lock(&c).push(items.len());
                g.acquire().await.unwrap().forget();
                items
                    .into_iter()
                    .map(|i| {
                        if i == 13 {
                            Err(TransportError::backend("thirteen"))
                        } else {
                            Ok(())
                        }
                    })
                    .collect()
            })
        });
        let b = Arc::new(Batcher::new(flush, 1000));
        let mut tasks = Vec::new();
        for i in 0..25u32 {
            let b = Arc::clone(&b);
            tasks.push(tokio::spawn(async move { b.submit(i, 10).await }));
            tokio::task::yield_now().await;
        }
        // Wait until the first (lone) call is on its way with the others queued behind it.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while lock(&calls).is_empty() {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::task::yield_now().await;
        }
        gate.add_permits(100);
        let mut errors = 0;
        for t in tasks {
            if t.await.unwrap().is_err() {
                errors += 1;
            }
        }
        assert_eq!(errors, 1, "only item 13 failed");
        let calls = lock(&calls).clone();
        assert_eq!(calls.iter().sum::<usize>(), 25);
        assert!(calls.iter().all(|&n| n <= MAX_ENTRIES), "{calls:?}");
        assert!(calls.len() < 25, "concurrent items were batched: {calls:?}");
        // Alone again: sent at once, in a batch of one.
        assert!(b.submit(1, 10).await.is_ok());
    }

    #[tokio::test]
    async fn weights_cap_a_batch() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&sizes);
        let started = Arc::new(AtomicUsize::new(0));
        let st = Arc::clone(&started);
        let flush: Flush<u32> = Arc::new(move |items: Vec<u32>| {
            lock(&s).push(items.len());
            st.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { items.into_iter().map(|_| Ok(())).collect() })
        });
        let b = Arc::new(Batcher::new(flush, 100));
        let futs: Vec<_> = (0..6)
            .map(|i| {
                let b = Arc::clone(&b);
                async move { b.submit(i, 60).await }
            })
            .collect();
        for r in futures_join(futs).await {
            r.unwrap();
        }
        assert!(lock(&sizes).iter().all(|&n| n == 1), "{:?}", lock(&sizes));
    }

    async fn futures_join<F>(futs: Vec<F>) -> Vec<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    }
}
