//! The runtime's side of pipelining, over a transport that declares it (the in-process
//! one wrapped): the guard hands its `remember` over, the runtime sends it before the
//! ack with the worker's next reserve, and the turn on the key is held until then. Paused
//! tokio time and explicit gates; no server needed.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babelqueue::handler::BoxFuture;
use babelqueue::pipelined::PipelinedWrite;
use babelqueue::runtime::{
    App, ConsumerOptions, Delivery, InMemoryTransport, Permanent, Republish, Settled, Transport,
    TransportError,
};
use babelqueue::{AsyncStore, Envelope, Guard, InMemoryStore};
use serde_json::json;
use tokio::sync::Semaphore;

const CHARGE: &str = "urn:babel:payments:charge";
const SERVER: &str = "test-server";

/// A dedupe store "on" [`SERVER`]: its `remember` can be handed over as `SET <id>`.
#[derive(Clone, Default)]
struct Store {
    inner: Arc<InMemoryStore>,
    own_remembers: Arc<AtomicUsize>,
}

impl AsyncStore for Store {
    type Error = std::convert::Infallible;
    fn seen(&self, id: &str) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        AsyncStore::seen(&*self.inner, id)
    }
    fn remember(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.own_remembers.fetch_add(1, Ordering::SeqCst);
        AsyncStore::remember(&*self.inner, id)
    }
    fn remember_for(
        &self,
        id: &str,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.own_remembers.fetch_add(1, Ordering::SeqCst);
        AsyncStore::remember_for(&*self.inner, id, ttl)
    }
    fn forget(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        AsyncStore::forget(&*self.inner, id)
    }
    fn pipelined_remember(
        &self,
        id: &str,
        _ttl: Option<Duration>,
        server: &str,
    ) -> Option<PipelinedWrite> {
        (server == SERVER).then(|| PipelinedWrite::new(SERVER, ["SET", id]))
    }
}

/// The in-process transport, declaring [`SERVER`]: writes are applied to the store, and
/// every combined ack waits for a permit of `gate` (so a test can hold it).
struct Piped {
    inner: InMemoryTransport,
    store: Store,
    gate: Arc<Semaphore>,
    /// Everything sent, in order: `SET <id>` / `ACK` / `WRITE <id>`.
    log: Arc<Mutex<Vec<String>>>,
    /// Combined acks to fail (as a lost connection would) before doing anything.
    fail_combined: AtomicUsize,
}

impl Piped {
    async fn apply(&self, writes: &[PipelinedWrite], tag: &str) {
        for w in writes {
            let id = String::from_utf8(w.args()[1].clone()).unwrap();
            self.log.lock().unwrap().push(format!("{tag} {id}"));
            AsyncStore::remember(&*self.store.inner, &id).await.unwrap();
        }
    }
}

impl Transport for Piped {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        self.inner.publish_raw(queue, element)
    }
    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        self.inner.reserve(queue, timeout)
    }
    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        self.log.lock().unwrap().push("ACK".into());
        self.inner.ack(delivery)
    }
    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        republish: Republish,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        self.inner.requeue(delivery, republish, delay)
    }
    fn start_consumer<'a>(
        &'a self,
        queue: &'a str,
        options: &'a ConsumerOptions,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        self.inner.start_consumer(queue, options)
    }
    fn leave<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(), TransportError>> {
        self.inner.leave(queue)
    }
    fn promote_due<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        self.inner.promote_due(queue, limit)
    }
    fn next_due<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Option<Duration>, TransportError>> {
        self.inner.next_due(queue)
    }
    fn pipeline_server(&self) -> Option<&str> {
        Some(SERVER)
    }
    fn combines_ack_and_reserve(&self) -> bool {
        true
    }
    fn ack_and_reserve<'a>(
        &'a self,
        delivery: &'a Delivery,
        writes: &'a [PipelinedWrite],
        next: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        Box::pin(async move {
            self.gate.acquire().await.unwrap().forget();
            if next.is_some()
                && self
                    .fail_combined
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                return Err(TransportError::connection("connection reset"));
            }
            self.apply(writes, "SET").await;
            self.ack(delivery).await?;
            match next {
                Some(q) => self.inner.reserve(q, Duration::ZERO).await,
                None => Ok(None),
            }
        })
    }
    fn apply_writes<'a>(
        &'a self,
        writes: &'a [PipelinedWrite],
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.apply(writes, "WRITE").await;
            Ok(())
        })
    }
    fn settle_and_reserve<'a>(
        &'a self,
        settled: &'a [Settled<'a>],
        next: Option<(&'a str, usize)>,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            self.gate.acquire().await.unwrap().forget();
            if next.is_some()
                && self
                    .fail_combined
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                return Err(TransportError::connection("connection reset"));
            }
            for s in settled {
                self.apply(s.writes, "SET").await;
                let id = Envelope::decode(s.delivery.body()).unwrap().meta.id;
                self.log.lock().unwrap().push(format!("ACK {id}"));
                self.inner.ack(s.delivery).await?;
            }
            let mut got = Vec::new();
            if let Some((q, n)) = next {
                while got.len() < n {
                    match self.inner.reserve(q, Duration::ZERO).await? {
                        Some(d) => got.push(d),
                        None => break,
                    }
                }
            }
            self.log.lock().unwrap().push(format!(
                "BATCH acks={} reserved={}",
                settled.len(),
                got.len()
            ));
            Ok(got)
        })
    }
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("declined")]
    Declined(#[source] Permanent),
}
babelqueue::handler_error_from!(ChargeError);
impl From<std::convert::Infallible> for ChargeError {
    fn from(e: std::convert::Infallible) -> Self {
        match e {}
    }
}

fn app(t: Arc<Piped>, store: Store, effects: Arc<AtomicUsize>, fail_after: bool) -> App {
    App::new(t)
        .queue("payments")
        .concurrency(2)
        .route_async(CHARGE, move |env: Envelope| {
            let (st, fx) = (store.clone(), effects.clone());
            async move {
                Guard::new(&st)
                    .run_async(&env, async {
                        fx.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), ChargeError>(())
                    })
                    .await?;
                if fail_after {
                    return Err(ChargeError::Declined(Permanent::new("declined")));
                }
                Ok(())
            }
        })
}

fn piped(gate: usize) -> (Arc<Piped>, Store) {
    let store = Store::default();
    let t = Arc::new(Piped {
        inner: InMemoryTransport::new(),
        store: store.clone(),
        gate: Arc::new(Semaphore::new(gate)),
        log: Arc::default(),
        fail_combined: AtomicUsize::new(0),
    });
    (t, store)
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_waits_for_the_handed_over_remember_then_is_skipped() {
    let (t, store) = piped(0);
    let effects = Arc::new(AtomicUsize::new(0));
    let app = app(t.clone(), store.clone(), effects.clone(), false);
    let env = Envelope::new(CHARGE, json!({"payment_id": "pay_1"}))
        .unwrap()
        .with_queue("payments");
    // The original and its byte-identical copy: the two workers take one each.
    app.publish_raw(env.encode()).await.unwrap();
    app.publish_raw(env.encode()).await.unwrap();
    let drain = tokio::spawn(async move { app.drain().await });
    // Every task is idle: the first ack (with the remember) is held at the gate.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the copy did not run");
    assert!(
        !AsyncStore::seen(&*store.inner, &env.meta.id).await.unwrap(),
        "the remember waits with the ack"
    );
    assert!(t.log.lock().unwrap().is_empty());
    // Let the combined acks through.
    t.gate.add_permits(100);
    let stats = drain.await.unwrap().unwrap();
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!((stats.succeeded, stats.skipped, stats.acked), (1, 1, 2));
    assert_eq!(store.own_remembers.load(Ordering::SeqCst), 0);
    let log = t.log.lock().unwrap().clone();
    assert_eq!(
        log,
        [format!("SET {}", env.meta.id), "ACK".into(), "ACK".into()],
        "the write goes before its ack"
    );
    assert_eq!(
        (t.inner.len("payments"), t.inner.processing_len("payments")),
        (0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_fails_after_its_guard_has_the_id_written_before_the_dead_letter() {
    let (t, store) = piped(100);
    let effects = Arc::new(AtomicUsize::new(0));
    let app = app(t.clone(), store.clone(), effects.clone(), true);
    let env = Envelope::new(CHARGE, json!({"payment_id": "pay_2"}))
        .unwrap()
        .with_queue("payments");
    app.publish_raw(env.encode()).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!(stats.dead_lettered, 1);
    assert!(AsyncStore::seen(&*store.inner, &env.meta.id).await.unwrap());
    assert_eq!(
        t.log.lock().unwrap().first().cloned(),
        Some(format!("WRITE {}", env.meta.id))
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_guard_called_by_hand_remembers_itself() {
    let store = Store::default();
    let env = Envelope::new(CHARGE, json!({})).unwrap();
    Guard::new(&store)
        .run_async(&env, async { Ok::<(), ChargeError>(()) })
        .await
        .unwrap();
    assert_eq!(store.own_remembers.load(Ordering::SeqCst), 1);
    assert!(AsyncStore::seen(&store, &env.meta.id).await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_failed_ack_with_reserve_is_sent_again_on_its_own_and_nothing_is_lost() {
    let (t, store) = piped(1000);
    t.fail_combined.store(1, Ordering::SeqCst);
    let effects = Arc::new(AtomicUsize::new(0));
    let app = app(t.clone(), store.clone(), effects.clone(), false);
    let mut ids = Vec::new();
    for i in 0..3 {
        let env = Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i}")}))
            .unwrap()
            .with_queue("payments");
        ids.push(env.meta.id.clone());
        app.publish_raw(env.encode()).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!(
        t.fail_combined.load(Ordering::SeqCst),
        0,
        "the failure happened"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 3);
    assert_eq!((stats.succeeded, stats.acked, stats.unacked), (3, 3, 0));
    assert!(stats.transport_errors >= 1, "{stats:?}");
    for id in &ids {
        assert!(AsyncStore::seen(&*store.inner, id).await.unwrap());
    }
    assert_eq!(
        (t.inner.len("payments"), t.inner.processing_len("payments")),
        (0, 0)
    );
}

/// Ids in the log: `SET <id>` lines and `ACK <id>` lines, and the batches' sizes.
fn batches(log: &[String]) -> Vec<(usize, usize)> {
    log.iter()
        .filter_map(|l| l.strip_prefix("BATCH acks="))
        .map(|l| {
            let (acks, reserved) = l.split_once(" reserved=").unwrap();
            (acks.parse().unwrap(), reserved.parse().unwrap())
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_batch_worker_settles_together_and_every_write_goes_before_its_ack() {
    let (t, store) = piped(10_000);
    let effects = Arc::new(AtomicUsize::new(0));
    let app = app(t.clone(), store.clone(), effects.clone(), false)
        .concurrency(8)
        .batch(8);
    // Eight payments, each followed at once by its byte-identical copy: a copy is in the
    // same batch as its original, and waits for the original's remember.
    let mut ids = Vec::new();
    for i in 0..8 {
        let env = Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i}")}))
            .unwrap()
            .with_queue("payments");
        ids.push(env.meta.id.clone());
        app.publish_raw(env.encode()).await.unwrap();
        app.publish_raw(env.encode()).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!(
        effects.load(Ordering::SeqCst),
        8,
        "each payment charged once"
    );
    assert_eq!(
        (stats.succeeded, stats.skipped, stats.acked, stats.unacked),
        (8, 8, 16, 0)
    );
    assert_eq!(
        store.own_remembers.load(Ordering::SeqCst),
        0,
        "all handed over"
    );
    let log = t.log.lock().unwrap().clone();
    for id in &ids {
        let set = log.iter().position(|l| *l == format!("SET {id}"));
        let first_ack = log.iter().position(|l| *l == format!("ACK {id}"));
        assert!(
            matches!((set, first_ack), (Some(s), Some(a)) if s < a),
            "the remember of {id} goes before its acks: {log:?}"
        );
        assert_eq!(log.iter().filter(|l| **l == format!("ACK {id}")).count(), 2);
    }
    let sizes = batches(&log);
    assert_eq!(
        sizes.first(),
        Some(&(0, 8)),
        "the first refill takes 8 at once"
    );
    assert!(
        sizes.iter().any(|(acks, _)| *acks >= 2),
        "acks leave together: {sizes:?}"
    );
    assert_eq!(sizes.iter().map(|(a, _)| a).sum::<usize>(), 16);
    assert_eq!(
        (t.inner.len("payments"), t.inner.processing_len("payments")),
        (0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_is_settled_again_one_by_one_and_nothing_is_lost() {
    let (t, store) = piped(10_000);
    // The first refill (no acks yet) and the first settle with acks both fail.
    t.fail_combined.store(2, Ordering::SeqCst);
    let effects = Arc::new(AtomicUsize::new(0));
    let app = app(t.clone(), store.clone(), effects.clone(), false)
        .concurrency(4)
        .batch(4);
    let mut ids = Vec::new();
    for i in 0..6 {
        let env = Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i}")}))
            .unwrap()
            .with_queue("payments");
        ids.push(env.meta.id.clone());
        app.publish_raw(env.encode()).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!(
        t.fail_combined.load(Ordering::SeqCst),
        0,
        "both failures happened"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 6);
    assert_eq!((stats.succeeded, stats.acked, stats.unacked), (6, 6, 0));
    assert!(stats.transport_errors >= 2, "{stats:?}");
    for id in &ids {
        assert!(AsyncStore::seen(&*store.inner, id).await.unwrap());
    }
    assert_eq!(
        (t.inner.len("payments"), t.inner.processing_len("payments")),
        (0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn batches_of_one_are_the_one_message_worker() {
    let (t, store) = piped(10_000);
    let effects = Arc::new(AtomicUsize::new(0));
    let app = app(t.clone(), store.clone(), effects.clone(), false)
        .concurrency(4)
        .batch(1);
    for i in 0..3 {
        let env = Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i}")}))
            .unwrap()
            .with_queue("payments");
        app.publish_raw(env.encode()).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!((stats.succeeded, stats.acked), (3, 3));
    assert!(
        batches(&t.log.lock().unwrap()).is_empty(),
        "no batch was settled"
    );
}
