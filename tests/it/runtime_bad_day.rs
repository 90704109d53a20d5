//! A bad day, in process: the handler, the dedupe store and the broker fail, and every
//! message is still settled right (no server needed; paused tokio time where it fits).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babelqueue::runtime::{
    App, ConsumerOptions, Delivery, Disposition, InMemoryTransport, ListMaintenance, Permanent,
    Report, Republish, RetryPolicy, Transport, TransportError, recover_poison,
};
use babelqueue::{AsyncStore, BoxFuture, DeadLetterReason, Envelope, Guard, InMemoryStore};
use serde_json::{Value, json};
use tokio::time::Instant;

const CHARGE: &str = "urn:babel:payments:charge";

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

fn payment(q: &str, i: usize) -> Envelope {
    Envelope::new(
        CHARGE,
        json!({"payment_id": format!("pay_{i:08}"), "amount": 4200}),
    )
    .unwrap()
    .with_queue(q)
}

/// An in-memory seen-set whose calls can fail (`down`) or hang (`hang`), counting calls.
#[derive(Default)]
struct FlakyStore {
    inner: InMemoryStore,
    down: AtomicBool,
    hang: AtomicBool,
    seen_calls: AtomicUsize,
}

impl FlakyStore {
    fn check(&self) -> Result<(), std::io::Error> {
        if self.down.load(Ordering::SeqCst) {
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "store down",
            ))
        } else {
            Ok(())
        }
    }
}

impl AsyncStore for FlakyStore {
    type Error = std::io::Error;
    fn seen(&self, id: &str) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        self.seen_calls.fetch_add(1, Ordering::SeqCst);
        let hang = self.hang.load(Ordering::SeqCst);
        let r = self
            .check()
            .map(|()| babelqueue::Store::seen(&self.inner, id).unwrap());
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            r
        }
    }
    fn remember(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let r = self
            .check()
            .map(|()| babelqueue::Store::remember(&self.inner, id).unwrap());
        std::future::ready(r)
    }
    fn forget(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let r = self.check().map(|()| {
            babelqueue::Store::forget(&self.inner, id).unwrap();
        });
        std::future::ready(r)
    }
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("dedupe store failed")]
    Store(#[from] std::io::Error),
    #[error("gateway hiccup")]
    Gateway,
    #[error("card declined")]
    Declined(#[source] Permanent),
}

/// Effects per payment id.
type Effects = Arc<Mutex<HashMap<String, u32>>>;

fn charge_app(
    t: &InMemoryTransport,
    store: Arc<FlakyStore>,
    effects: Effects,
    delay: Duration,
) -> App {
    App::new(t.clone())
        .queue("payments")
        .route_async(CHARGE, move |env: Envelope| {
            let (store, effects) = (store.clone(), effects.clone());
            async move {
                Guard::new(&*store)
                    .run_async(&env, async {
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        let id = env.data["payment_id"].as_str().unwrap().to_owned();
                        *effects.lock().unwrap().entry(id).or_insert(0) += 1;
                        Ok::<(), ChargeError>(())
                    })
                    .await
                    .map(drop)
            }
        })
}

#[tokio::test(start_paused = true)]
async fn retries_back_off_exponentially_and_do_not_block_a_worker() {
    let t = InMemoryTransport::new();
    let calls = Arc::new(Mutex::new(Vec::<(Instant, u32)>::new()));
    let c = calls.clone();
    let app = App::new(t.clone())
        .queue("q")
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(100))
                .factor(2.0)
                .jitter(0.0)
                .max_attempts(5),
        )
        .route_sync(CHARGE, move |env: &Envelope| {
            let mut c = c.lock().unwrap();
            c.push((Instant::now(), env.attempts));
            if c.len() <= 2 {
                Err(ChargeError::Gateway)
            } else {
                Ok(())
            }
        });
    app.publish(CHARGE, &json!({})).await.unwrap();
    let s = app.drain().await.unwrap();
    assert_eq!((s.retried, s.succeeded, s.dead_lettered), (2, 1, 0));
    let calls = calls.lock().unwrap();
    assert_eq!(calls.iter().map(|c| c.1).collect::<Vec<_>>(), vec![0, 1, 2]);
    let gap1 = calls[1].0 - calls[0].0;
    let gap2 = calls[2].0 - calls[1].0;
    assert!(gap1 >= Duration::from_millis(100), "{gap1:?}");
    assert!(gap2 >= Duration::from_millis(200), "{gap2:?}");
    // Nothing else delays them: the spacing is the backoff (paused clock: exact).
    assert!(gap1 < Duration::from_millis(110) && gap2 < Duration::from_millis(210));
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_retries_but_never_shortens_them() {
    let p = RetryPolicy::default()
        .initial(Duration::from_millis(100))
        .jitter(0.5);
    let t = InMemoryTransport::new();
    let firsts = Arc::new(Mutex::new(HashMap::<String, Instant>::new()));
    let gaps = Arc::new(Mutex::new(Vec::new()));
    let (f, g) = (firsts.clone(), gaps.clone());
    let app = App::new(t.clone())
        .queue("q")
        .concurrency(4)
        .retry(p)
        .route_sync(CHARGE, move |env: &Envelope| {
            let now = Instant::now();
            match f.lock().unwrap().insert(env.meta.id.clone(), now) {
                None => Err(ChargeError::Gateway),
                Some(first) => {
                    g.lock().unwrap().push(now - first);
                    Ok(())
                }
            }
        });
    for _ in 0..50 {
        app.publish(CHARGE, &json!({})).await.unwrap();
    }
    let s = app.drain().await.unwrap();
    assert_eq!((s.retried, s.succeeded), (50, 50));
    let gaps = gaps.lock().unwrap();
    assert!(gaps.iter().all(|g| *g >= Duration::from_millis(100)));
    assert!(gaps.iter().all(|g| *g <= Duration::from_millis(160)));
    let distinct: std::collections::HashSet<_> = gaps.iter().collect();
    assert!(distinct.len() > 10, "jittered: {distinct:?}");
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_is_dead_lettered_at_once() {
    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue("q")
        .max_attempts(5)
        .route_sync(CHARGE, |_: &Envelope| {
            Err(ChargeError::Declined(Permanent::new("insufficient funds")))
        });
    app.publish(CHARGE, &json!({})).await.unwrap();
    let s = app.drain().await.unwrap();
    assert_eq!((s.retried, s.dead_lettered, s.failed), (0, 1, 1));
    let dead = json_of(&t.messages("q.dlq")[0]);
    assert_eq!(dead["dead_letter"]["reason"], "failed");
    // The whole cause chain (the `Permanent` marker is transparent).
    assert_eq!(
        dead["dead_letter"]["error"],
        "card declined: insufficient funds"
    );
    assert_eq!(dead["attempts"], 1);
}

#[tokio::test(start_paused = true)]
async fn a_store_outage_counts_no_attempt_dead_letters_nothing_and_resumes() {
    let t = InMemoryTransport::new();
    let store = Arc::new(FlakyStore::default());
    let effects: Effects = Arc::default();
    let reports = Arc::new(Mutex::new(Vec::<Report>::new()));
    let r = reports.clone();
    let app = charge_app(&t, store.clone(), effects.clone(), Duration::ZERO)
        .max_attempts(2)
        .store_backoff(Duration::from_millis(100), Duration::from_secs(2))
        .on_delivery(move |rep| r.lock().unwrap().push(rep.clone()));
    for i in 0..20 {
        app.publish_envelope(&payment("payments", i)).await.unwrap();
    }
    store.down.store(true, Ordering::SeqCst);
    // The store comes back after 30 s.
    let s2 = store.clone();
    let back = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        s2.down.store(false, Ordering::SeqCst);
    });
    let started = Instant::now();
    let s = app.drain().await.unwrap();
    back.await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(30));
    assert_eq!(
        (s.succeeded, s.dead_lettered, s.failed, s.retried),
        (20, 0, 0, 0)
    );
    assert!(s.requeued >= 1, "{s:?}");
    // The consumer backed off: with a pause doubling up to 2 s, 30 s of outage cost a
    // few dozen store calls, not thousands.
    let calls = store.seen_calls.load(Ordering::SeqCst);
    assert!(calls < 20 + 60, "{calls} seen calls during the outage");
    // Each payment charged exactly once, and no attempt was counted.
    let effects = effects.lock().unwrap();
    assert_eq!(effects.len(), 20);
    assert!(effects.values().all(|&n| n == 1));
    assert!(
        reports
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.disposition == Disposition::Succeeded)
            .all(|r| r.envelope.as_ref().unwrap().attempts == 0)
    );
    assert_eq!(
        (
            t.len("payments"),
            t.processing_len("payments"),
            t.len("payments.dlq")
        ),
        (0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_call_is_cut_at_the_store_timeout() {
    let t = InMemoryTransport::new();
    let store = Arc::new(FlakyStore::default());
    let effects: Effects = Arc::default();
    let answered = Arc::new(Mutex::new(Vec::<(Instant, Disposition)>::new()));
    let a = answered.clone();
    let app = charge_app(&t, store.clone(), effects.clone(), Duration::ZERO)
        .store_timeout(Duration::from_secs(2))
        .store_backoff(Duration::from_millis(500), Duration::from_millis(500))
        .on_delivery(move |r| {
            a.lock()
                .unwrap()
                .push((Instant::now(), r.disposition.clone()))
        });
    app.publish_envelope(&payment("payments", 1)).await.unwrap();
    store.hang.store(true, Ordering::SeqCst);
    let s2 = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        s2.hang.store(false, Ordering::SeqCst);
    });
    let started = Instant::now();
    let s = app.drain().await.unwrap();
    let answered = answered.lock().unwrap();
    assert_eq!(answered[0].1, Disposition::Requeued);
    assert_eq!(
        answered[0].0 - started,
        Duration::from_secs(2),
        "cut at the timeout"
    );
    assert_eq!((s.succeeded, s.failed, s.dead_lettered), (1, 0, 0));
    assert!(s.requeued >= 2);
    assert_eq!(effects.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_handler_timeout_is_a_failed_attempt() {
    let t = InMemoryTransport::new();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let app = App::new(t.clone())
        .queue("q")
        .handler_timeout(Duration::from_secs(1))
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(10))
                .max_attempts(2),
        )
        .route_async(CHARGE, move |_env: Envelope| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok::<(), ChargeError>(())
            }
        });
    app.publish(CHARGE, &json!({})).await.unwrap();
    let started = Instant::now();
    let s = app.drain().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!((s.retried, s.dead_lettered, s.failed), (1, 1, 2));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let dead = json_of(&t.messages("q.dlq")[0]);
    assert!(
        dead["dead_letter"]["error"]
            .as_str()
            .unwrap()
            .contains("did not finish within 1s"),
        "{dead}"
    );
}

/// `n` distinct payments, each published `copies` times (back to back), handled at
/// `concurrency` with a charge that takes a moment: exactly one effect per payment.
async fn no_double_effect(concurrency: usize, n: usize, copies: usize, shuffle: bool) {
    let t = InMemoryTransport::new();
    let store = Arc::new(FlakyStore::default());
    let effects: Effects = Arc::default();
    let app =
        charge_app(&t, store, effects.clone(), Duration::from_micros(200)).concurrency(concurrency);
    let mut elements = Vec::new();
    for i in 0..n {
        let bytes = payment("payments", i).encode();
        for _ in 0..copies {
            elements.push(bytes.clone());
        }
    }
    if shuffle {
        // Deterministic shuffle (xorshift), so duplicates are spread and also adjacent.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in (1..elements.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            elements.swap(i, (x % (i as u64 + 1)) as usize);
        }
    }
    for e in elements {
        app.publish_raw(e).await.unwrap();
    }
    let s = app.drain().await.unwrap();
    let effects = effects.lock().unwrap();
    let doubles: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubles.is_empty(),
        "{} payments charged more than once, e.g. {:?}",
        doubles.len(),
        &doubles[..doubles.len().min(5)]
    );
    assert_eq!(effects.len(), n);
    assert_eq!(
        (s.succeeded, s.skipped),
        (n as u64, (n * (copies - 1)) as u64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_8_with_half_duplicates_has_one_effect_per_id() {
    no_double_effect(8, 2000, 2, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_32_with_half_duplicates_has_one_effect_per_id() {
    no_double_effect(32, 2000, 2, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_32_with_every_payment_delivered_twice_back_to_back() {
    no_double_effect(32, 2000, 2, false).await;
}

#[tokio::test(start_paused = true)]
async fn an_oversized_body_is_poison_with_its_bytes_and_an_unusable_id_too() {
    let t = InMemoryTransport::new();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let app = App::new(t.clone())
        .queue("q")
        .max_body_size(1024)
        .route_sync(CHARGE, move |_: &Envelope| {
            r.fetch_add(1, Ordering::SeqCst);
        });
    let big = Envelope::new(CHARGE, json!({"blob": "x".repeat(2000)}))
        .unwrap()
        .encode();
    app.publish_raw(big.clone()).await.unwrap();
    let mut long_id = Envelope::new(CHARGE, json!({})).unwrap();
    long_id.meta.id = "i".repeat(babelqueue::key::MAX_ID_LEN + 1);
    app.publish_envelope(&long_id).await.unwrap();
    let mut nul_id = Envelope::new(CHARGE, json!({})).unwrap();
    nul_id.meta.id = "pay\u{0}1".into();
    app.publish_envelope(&nul_id).await.unwrap();
    let ok = Envelope::new(CHARGE, json!({})).unwrap();
    app.publish_envelope(&ok).await.unwrap();

    let s = app.drain().await.unwrap();
    assert_eq!((s.poison, s.dead_lettered, s.succeeded), (3, 3, 1));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let dlq = t.messages("q.dlq");
    assert_eq!(recover_poison(&dlq[0]).unwrap(), big, "bytes intact");
    let block = &json_of(&dlq[0])["dead_letter"];
    assert_eq!(block["reason"], "poison");
    assert!(
        block["error"]
            .as_str()
            .unwrap()
            .contains("over the limit of 1024 bytes")
    );
    let long = json_of(&dlq[1]);
    assert_eq!(
        long["meta"]["id"].as_str().unwrap().len(),
        babelqueue::key::MAX_ID_LEN + 1
    );
    assert_eq!(long["dead_letter"]["reason"], "poison");
    assert!(
        long["dead_letter"]["error"]
            .as_str()
            .unwrap()
            .contains("over the limit of 512 bytes")
    );
    let nul = json_of(&dlq[2]);
    assert_eq!(nul["meta"]["id"], "pay\u{0}1");
    assert_eq!(
        nul["dead_letter"]["error"],
        "meta.id contains a NUL character"
    );
}

/// A transport whose acks and requeues fail while `down` is set (a broker outage).
#[derive(Clone)]
struct FlakyBroker {
    inner: InMemoryTransport,
    down: Arc<AtomicBool>,
    failures: Arc<AtomicUsize>,
}

impl FlakyBroker {
    fn fail(&self) -> Result<(), TransportError> {
        if self.down.load(Ordering::SeqCst) {
            self.failures.fetch_add(1, Ordering::SeqCst);
            Err(TransportError::connection(std::io::Error::other(
                "broker down",
            )))
        } else {
            Ok(())
        }
    }
}

impl Transport for FlakyBroker {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.fail()?;
            self.inner.publish_raw(queue, element).await
        })
    }
    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        self.inner.reserve(queue, timeout)
    }
    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.fail()?;
            self.inner.ack(delivery).await
        })
    }
    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        republish: Republish,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.fail()?;
            self.inner.requeue(delivery, republish, delay).await
        })
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
}

#[tokio::test(start_paused = true)]
async fn acks_and_requeues_are_kept_through_a_broker_outage() {
    let inner = InMemoryTransport::new();
    let broker = FlakyBroker {
        inner: inner.clone(),
        down: Arc::new(AtomicBool::new(false)),
        failures: Arc::default(),
    };
    let first = Arc::new(AtomicBool::new(true));
    let (f, down) = (first.clone(), broker.down.clone());
    let went_down = AtomicBool::new(false);
    let app = App::new(broker.clone())
        .queue("q")
        .backoff(Duration::from_millis(50), Duration::from_secs(1))
        .retry(RetryPolicy::default().initial(Duration::from_millis(10)))
        .route_sync(CHARGE, move |env: &Envelope| {
            // The broker goes down while the first handler runs (once).
            if !went_down.swap(true, Ordering::SeqCst) {
                down.store(true, Ordering::SeqCst);
            }
            if env.data["fail"] == true && f.swap(false, Ordering::SeqCst) {
                Err(ChargeError::Gateway)
            } else {
                Ok(())
            }
        });
    app.publish(CHARGE, &json!({"fail": true})).await.unwrap();
    app.publish(CHARGE, &json!({"fail": false})).await.unwrap();
    let d2 = broker.down.clone();
    tokio::spawn(async move {
        // Down for 20 s: far longer than the old retry window (~6 s).
        tokio::time::sleep(Duration::from_secs(20)).await;
        d2.store(false, Ordering::SeqCst);
    });
    let s = app.drain().await.unwrap();
    assert!(broker.failures.load(Ordering::SeqCst) >= 10);
    assert_eq!((s.succeeded, s.retried, s.unacked), (2, 1, 0), "{s:?}");
    assert_eq!(
        (
            inner.len("q"),
            inner.processing_len("q"),
            inner.delayed_len("q")
        ),
        (0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn after_the_shutdown_grace_a_stuck_message_is_left_for_recovery_and_recovered() {
    let t = InMemoryTransport::new();
    let stuck = Arc::new(AtomicBool::new(true));
    let s2 = stuck.clone();
    let handled = Arc::new(AtomicU32::new(0));
    let h = handled.clone();
    let app_for = |t: InMemoryTransport| {
        let (s2, h) = (s2.clone(), h.clone());
        App::new(t)
            .queue("q")
            .shutdown_grace(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(500), Duration::from_secs(2))
            .recovery_interval(Duration::from_secs(1))
            .route_async(CHARGE, move |_env: Envelope| {
                let (s2, h) = (s2.clone(), h.clone());
                async move {
                    if s2.load(Ordering::SeqCst) {
                        std::future::pending::<()>().await;
                    }
                    h.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), ChargeError>(())
                }
            })
    };
    let a = app_for(t.consumer());
    a.publish(CHARGE, &json!({})).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        a.run_until(async {
            let _ = rx.await;
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(t.processing_len("q"), 1);
    let stop_at = Instant::now();
    tx.send(()).unwrap();
    let s = run.await.unwrap();
    assert_eq!(
        stop_at.elapsed(),
        Duration::from_secs(3),
        "stopped at the grace period"
    );
    assert_eq!((s.processed, s.unacked, s.acked), (1, 1, 0));
    assert_eq!(t.processing_len("q"), 1, "left in flight, not lost");

    // Another consumer recovers it (the first left the registry) and handles it.
    stuck.store(false, Ordering::SeqCst);
    let b = app_for(t.consumer());
    let s = b.drain().await.unwrap();
    assert_eq!((s.recovered, s.succeeded), (1, 1));
    assert_eq!(handled.load(Ordering::SeqCst), 1);
    assert_eq!((t.len("q"), t.processing_len("q")), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_message_that_keeps_killing_consumers_is_dead_lettered() {
    let t = InMemoryTransport::new();
    t.publish_raw("q", payment("q", 7).encode()).await.unwrap();
    // Three consumers die holding it (no leave: their heartbeat just expires).
    for _ in 0..3 {
        let dying = t.consumer();
        dying.heartbeat("q", Duration::from_secs(1)).await.unwrap();
        let _d = dying.reserve("q", Duration::ZERO).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(t.recover("q", 3).await.unwrap().requeued, 1);
    }
    let dying = t.consumer();
    let _d = dying.reserve("q", Duration::ZERO).await.unwrap().unwrap();
    let app = App::new(t.consumer())
        .queue("q")
        .max_recoveries(3)
        .route_sync(CHARGE, |_: &Envelope| ());
    let s = app.drain().await.unwrap();
    assert_eq!((s.dead_lettered, s.succeeded), (1, 0));
    let dead = json_of(&t.messages("q.dlq")[0]);
    assert_eq!(dead["dead_letter"]["reason"], "failed");
    assert!(
        dead["dead_letter"]["error"]
            .as_str()
            .unwrap()
            .contains("recovered 3 times from consumers that died"),
        "{dead}"
    );
    assert_eq!((t.len("q"), t.processing_len("q")), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn release_is_capped_and_spaced_not_a_hot_loop() {
    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue("q")
        .unknown_urn(babelqueue::runtime::UnknownUrnStrategy::Release);
    app.publish("urn:babel:nobody:handles", &json!({}))
        .await
        .unwrap();
    let started = Instant::now();
    let s = app.drain().await.unwrap();
    // Defaults: 5 releases, 1 s apart, then dead-lettered as unknown_urn.
    assert_eq!((s.released, s.dead_lettered), (5, 1));
    assert!(started.elapsed() >= Duration::from_secs(5));
    let dead = babelqueue::runtime::unframe(&t.messages("q.dlq")[0])
        .unwrap()
        .1;
    assert_eq!(
        json_of(&dead)["dead_letter"]["reason"],
        DeadLetterReason::UnknownUrn.as_str()
    );
}
