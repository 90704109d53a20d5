//! RabbitMQ on a bad day: consumer processes SIGKILLed mid-run, and the broker restarted
//! mid-drain. Crash recovery is the broker's own (the unacked deliveries of a closed
//! connection go back to the queue); the transport reconnects by itself.
//!
//! - Two consumer processes (`test_children amqp-consumer`, an
//!   [`App`] over [`AmqpTransport`] with a [`RedisStore`] guard, charges counted in Redis)
//!   share a queue on the shared broker; one is SIGKILLed mid-run: every payment is
//!   charged, a second charge only for what the killed one held, and the queue and its
//!   delay queues end empty.
//! - A drain against a RabbitMQ node of the test's own, stopped (`rabbitmqctl stop`) and
//!   started again mid-drain: every payment charged exactly once, nothing left in the
//!   queue or the delay queues.
//!
//! Slow and server-bound: ignored by default, run by CI with `--include-ignored`.

use crate::amqp_support;

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use amqp_support::{
    OwnNode, delayed_at, delete_all, delete_all_at, ready, ready_at, unique_queue, url,
};
use babelqueue::amqp::AmqpTransport;
use babelqueue::redis::RedisStoreError;
use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::runtime::{RetryPolicy, Transport};
use babelqueue::{App, Envelope, Guard, InMemoryStore};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("the dedupe store failed")]
    Store(#[from] RedisStoreError),
    #[error("the effects counter failed")]
    Effects(#[from] redis::RedisError),
    #[error("the gateway hiccuped (first attempt of every tenth payment)")]
    Hiccup,
}

/// Every tenth payment fails its first attempt: retried through a delay queue.
fn hiccups(env: &Envelope) -> bool {
    let n: u64 = env.data["n"].as_u64().unwrap_or(1);
    n.is_multiple_of(10) && env.attempts == 0
}

/// A consumer process; SIGKILLed on drop if still running.
struct Consumer(Option<Child>);

impl Consumer {
    fn start(queue: &str, prefix: &str) -> Self {
        let child = Command::new(crate::child_support::exe())
            .arg("amqp-consumer")
            .env("BQ_QUEUE", queue)
            .env("BQ_PREFIX", prefix)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting test_children (tests/children)");
        Consumer(Some(child))
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    fn terminate(&mut self) {
        if let Some(mut c) = self.0.take() {
            Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status()
                .unwrap();
            let status = c.wait().unwrap();
            assert!(status.success(), "a clean stop: {status}");
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn publish_payments(t: &AmqpTransport, queue: &str, n: u64) {
    for i in 1..=n {
        let mut env =
            Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i}"), "n": i})).unwrap();
        env.meta.queue = queue.to_owned();
        t.publish(queue, &env).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL) and Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_consumer_sigkilled_mid_run_loses_nothing() {
    const N: u64 = 300;
    let queue = unique_queue("fleet");
    let prefix = format!("bq-test:amqp-fleet:{}", uuid::Uuid::new_v4().simple());
    let mut effects = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let t = AmqpTransport::open(&url()).await.unwrap();
    publish_payments(&t, &queue, N).await;

    let mut a = Consumer::start(&queue, &prefix);
    let mut b = Consumer::start(&queue, &prefix);
    let charged_key = format!("{prefix}:charged");
    let start = Instant::now();
    loop {
        let n: u64 = effects.scard(&charged_key).await.unwrap();
        if n >= N / 4 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no progress: {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Mid-run: no shutdown, no ack of what it holds. The broker puts that back.
    a.kill();
    let killed_at = Instant::now();
    loop {
        let n: u64 = effects.scard(&charged_key).await.unwrap();
        if n >= N {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "only {n} of {N} charged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered_in = killed_at.elapsed();
    // Let the survivor settle the last acks, then stop it cleanly.
    tokio::time::sleep(Duration::from_millis(500)).await;
    b.terminate();

    let mut doubles = 0;
    for i in 1..=N {
        let c: u64 = effects
            .get(format!("{prefix}:charges:pay_{i}"))
            .await
            .unwrap();
        assert!(c >= 1, "pay_{i} charged");
        doubles += c - 1;
    }
    println!(
        "amqp-result: sigkill charged={N} doubles={doubles} done_after_kill_ms={}",
        recovered_in.as_millis()
    );
    // A second charge only for what the killed one was handling: at most its concurrency
    // of 4 (its prefetch of 8 also held messages it had not started, which are not charged).
    assert!(doubles <= 4, "{doubles} double charges");
    assert_eq!(ready(&queue).await, 0, "the queue is empty");
    assert_eq!(
        delayed_at(&url(), &queue).await,
        0,
        "the delay queues are empty"
    );
    let keys: Vec<String> = effects.keys(format!("{prefix}:*")).await.unwrap();
    if !keys.is_empty() {
        let _: () = effects.del(keys).await.unwrap();
    }
    delete_all(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "starts and restarts a RabbitMQ node of its own (rabbitmq-server in BABELQUEUE_RABBITMQ_BIN, default /usr/lib/rabbitmq/bin); CI runs it with --include-ignored"]
async fn the_broker_restarted_mid_drain_loses_and_strands_nothing() {
    const N: u64 = 300;
    let mut node = tokio::task::spawn_blocking(OwnNode::start).await.unwrap();
    let broker = node.url();
    let queue = unique_queue("restart");
    let t = AmqpTransport::open(&broker).await.unwrap();
    publish_payments(&t, &queue, N).await;
    assert_eq!(ready_at(&broker, &queue).await, N as u32);

    let store = Arc::new(InMemoryStore::new());
    let charged = Arc::new(Mutex::new(Vec::<String>::new()));
    let progress = Arc::new(AtomicU64::new(0));
    // Past a quarter of the work the handlers wait for the broker to be stopped: the drain
    // cannot end before the restart, however slow the machine is.
    let stopped_flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (st, ch, pr) = (store.clone(), charged.clone(), progress.clone());
    let sf = stopped_flag.clone();
    let app = App::new(t.clone())
        .queue(&queue)
        .concurrency(4)
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(300))
                .jitter(0.0)
                .max_attempts(5),
        )
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .give_up_after(Duration::from_secs(120))
        .route_async(CHARGE, move |env: Envelope| {
            let (st, ch, pr, sf) = (st.clone(), ch.clone(), pr.clone(), sf.clone());
            async move {
                Guard::new(&*st)
                    .run_async(&env, async {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        while pr.load(Ordering::SeqCst) >= N / 4 && !sf.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        if hiccups(&env) {
                            return Err(ChargeError::Hiccup);
                        }
                        ch.lock()
                            .unwrap()
                            .push(env.data["payment_id"].as_str().unwrap().to_owned());
                        pr.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), ChargeError>(())
                    })
                    .await
                    .map(drop)
            }
        });
    let drain = tokio::spawn({
        let app = app.clone();
        async move { app.drain().await }
    });
    // 300 × 50 ms over 4 workers: close to 4 s of work, the restart lands inside it.
    while progress.load(Ordering::SeqCst) < N / 5 {
        assert!(!drain.is_finished(), "the drain ended early");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The broker goes away mid-drain (with messages ready, in flight, and waiting in
    // delay queues), and comes back on the same data.
    let stopped = Instant::now();
    node = tokio::task::spawn_blocking(move || {
        node.stop();
        node
    })
    .await
    .unwrap();
    stopped_flag.store(true, Ordering::SeqCst);
    assert!(
        !drain.is_finished(),
        "the broker went away before the drain ended (the handlers past a quarter wait for it)"
    );
    node = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(500));
        node.boot();
        node
    })
    .await
    .unwrap();
    let down_for = stopped.elapsed();
    let stats = drain
        .await
        .unwrap()
        .expect("the drain finishes after the restart");
    let charged = charged.lock().unwrap().clone();
    let unique: HashSet<&String> = charged.iter().collect();
    println!(
        "amqp-result: restart charged={} unique={} down_ms={} stats={stats:?}",
        charged.len(),
        unique.len(),
        down_for.as_millis()
    );
    assert_eq!(unique.len() as u64, N, "nothing lost");
    assert_eq!(
        charged.len() as u64,
        N,
        "each charged once (the guard absorbs redeliveries)"
    );
    assert!(
        stats.transport_errors > 0,
        "the restart was seen: {stats:?}"
    );
    assert_eq!(
        ready_at(&broker, &queue).await,
        0,
        "nothing stranded in the queue"
    );
    assert_eq!(
        delayed_at(&broker, &queue).await,
        0,
        "nor in the delay queues"
    );
    delete_all_at(&broker, &queue).await;
    tokio::task::spawn_blocking(move || drop(node))
        .await
        .unwrap();
}
