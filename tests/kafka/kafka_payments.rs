//! Payments over Kafka (`tansu`, one broker process per test on its own port, stopped by
//! pid), with the upstream Python SDK (`babelqueue[kafka]` 1.24.0 through
//! `tests/interop/python_kafka.py`, interpreter `BABELQUEUE_PYTHON`, default
//! `/tmp/bqvenv/bin/python`) on the other side:
//!
//! - the Python SDK produces 200 payments, each twice: the Rust consumer with the guard
//!   charges 200 and skips 200, and commits the whole topic;
//! - the Rust SDK produces them: the Python SDK's consumer charges 200 and skips 200;
//! - a failure past `max_attempts` lands in `<queue>.dlq` with the family's block;
//! - two consumer processes (`test_children kafka-consumer`, a Redis
//!   guard, charges counted in Redis) share a 3-partition topic; one is SIGKILLed mid-run,
//!   the group rebalances, every payment is charged, and a second charge happens only for
//!   what the killed one held.
//!
//! Run with `cargo test --features kafka --test kafka_payments -- --ignored`.

use crate::kafka_support;

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use babelqueue::binding::kafka::retry::Tiers;
use babelqueue::kafka::KafkaTransport;
use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::runtime::{RetryPolicy, Transport};
use babelqueue::{App, DeadLetterReason, Envelope, Guard, InMemoryStore};
use kafka_support::{Broker, high_watermarks, read_all, unique_topic};
use serde_json::{Value, json};

const CHARGE: &str = "urn:babel:payments:charge";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn python(mode: &str, broker: &Broker, queue: &str, envs: &[(&str, &str)]) -> String {
    let interpreter = env_or("BABELQUEUE_PYTHON", "/tmp/bqvenv/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_kafka.py");
    let out = Command::new(&interpreter)
        .arg(&script)
        .arg(mode)
        .env("BROKER_URL", broker.url())
        .env("QUEUE", queue)
        .envs(envs.iter().copied())
        .output()
        .unwrap_or_else(|e| {
            panic!("run {interpreter} (BABELQUEUE_PYTHON, with babelqueue[kafka]==1.24.0): {e}")
        });
    assert!(
        out.status.success(),
        "python_kafka.py {mode} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[derive(Debug, thiserror::Error)]
#[error("the gateway failed")]
struct Gateway;

fn guarded_app(t: KafkaTransport, queue: &str) -> (App, Arc<Mutex<HashMap<String, usize>>>) {
    let store = Arc::new(InMemoryStore::new());
    let charges = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let ch = charges.clone();
    let app = App::new(t)
        .queue(queue)
        .concurrency(8)
        .route_async(CHARGE, move |env: Envelope| {
            let (st, ch) = (store.clone(), ch.clone());
            async move {
                Guard::new(&*st)
                    .run_async(&env, async {
                        let id = env.data["payment_id"].as_str().unwrap().to_owned();
                        *ch.lock().unwrap().entry(id).or_default() += 1;
                        Ok::<(), Gateway>(())
                    })
                    .await
                    .map(drop)
            }
        });
    (app, charges)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the tansu broker (BABELQUEUE_TANSU or ~/.cargo/bin/tansu) and the Python SDK (BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn python_publishes_each_payment_twice_and_rust_charges_each_once() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let queue = unique_topic("py2rs");
    let t = KafkaTransport::new(&broker.url()).unwrap();
    t.ensure_topic(&queue).await.unwrap();
    // One record per produce batch: tansu 0.6 (memory engine) reports a partition's high
    // watermark as the base offset of its last batch + 1, not its last offset + 1, so after
    // confluent-kafka's default batching (400 records in a few batches) the watermark said
    // 338 and the drain, which reads the watermark to know what is left, stopped there.
    // A real Kafka broker reports the log end offset; the records themselves were all
    // readable (checked with a raw consumer). The Rust producer awaits each send.
    let produced = python(
        "produce",
        &broker,
        &queue,
        &[
            ("N", "200"),
            ("KAFKA_CONFIG", r#"{"batch.num.messages": 1}"#),
        ],
    );
    assert_eq!(produced.lines().count(), 200);
    // tansu's high watermark can trail the producer's acknowledgements briefly.
    let start = Instant::now();
    while high_watermarks(&broker.bootstrap(), &queue) != [(0, 400)] {
        assert!(start.elapsed() < Duration::from_secs(20), "the 400 records");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (app, charges) = guarded_app(t.clone(), &queue);
    let start = Instant::now();
    let stats = app.drain().await.unwrap();
    let elapsed = start.elapsed();
    let charges = charges.lock().unwrap().clone();
    assert_eq!(charges.len(), 200, "every payment charged");
    assert!(charges.values().all(|n| *n == 1), "none twice: {charges:?}");
    assert_eq!((stats.succeeded, stats.skipped), (200, 200), "{stats:?}");
    // The Python SDK's records carry its headers: lang python, attempts 0.
    let raw = read_all(&broker.bootstrap(), &queue, 1, Duration::from_secs(10));
    assert_eq!(raw[0].header("bq-source-lang").as_deref(), Some("python"));
    assert_eq!(raw[0].header("bq-attempts").as_deref(), Some("0"));
    t.leave(&queue).await.unwrap();
    assert_eq!(
        t.committed(&queue).await.unwrap(),
        [(0, 400)],
        "all committed"
    );
    println!(
        "kafka-result: py2rs 400 records drained in {} ms",
        elapsed.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the tansu broker (BABELQUEUE_TANSU or ~/.cargo/bin/tansu) and the Python SDK (BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn rust_publishes_each_payment_twice_and_the_python_sdk_charges_each_once() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let queue = unique_topic("rs2py");
    let t = KafkaTransport::new(&broker.url()).unwrap();
    for i in 0..200 {
        let mut env = Envelope::new(
            CHARGE,
            json!({"payment_id": format!("pay_{i}"), "amount": 100 + i}),
        )
        .unwrap();
        env.meta.queue = queue.clone();
        let body = env.encode();
        t.publish_raw(&queue, body.clone()).await.unwrap();
        t.publish_raw(&queue, body).await.unwrap();
    }
    let out = python("consume", &broker, &queue, &[("TIMEOUT", "10")]);
    let got: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let charged = got["charged"].as_object().unwrap();
    assert_eq!(charged.len(), 200, "{got}");
    assert!(charged.values().all(|n| n == 1), "{got}");
    assert_eq!(got["skipped"], 200, "{got}");
    assert_eq!(got["processed"], 400, "{got}");
    assert_eq!(t.committed(&queue).await.unwrap(), [(0, 400)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the tansu broker (BABELQUEUE_TANSU or ~/.cargo/bin/tansu); CI runs it with --ignored"]
async fn a_failure_past_max_attempts_lands_in_the_dlq_with_the_family_block() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let queue = unique_topic("dlq");
    let t = KafkaTransport::builder(&broker.url())
        .unwrap()
        .retry_tiers(Tiers::new(vec![100, 1_000]).unwrap())
        .build()
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::<u32>::new()));
    let c = calls.clone();
    let app = App::new(t.clone())
        .queue(&queue)
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(50))
                .jitter(0.0)
                .max_attempts(3),
        )
        .route_async(CHARGE, move |env: Envelope| {
            let c = c.clone();
            async move {
                c.lock().unwrap().push(env.attempts);
                Err::<(), _>(Gateway)
            }
        });
    let mut sent = Envelope::new(CHARGE, json!({"payment_id": "pay_dead", "amount": 1})).unwrap();
    sent.meta.queue = queue.clone();
    t.publish(&queue, &sent).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!(
        *calls.lock().unwrap(),
        [0, 1, 2],
        "attempts from bq-attempts"
    );
    assert_eq!(stats.dead_lettered, 1, "{stats:?}");

    let dead = read_all(
        &broker.bootstrap(),
        &format!("{queue}.dlq"),
        1,
        Duration::from_secs(10),
    );
    assert_eq!(dead.len(), 1);
    let env = Envelope::decode(&dead[0].value).unwrap();
    assert_eq!(env.meta.id, sent.meta.id, "the same message");
    let block = env.dead_letter.expect("the dead_letter block");
    assert_eq!(block.reason, DeadLetterReason::Failed);
    assert_eq!(block.original_queue, queue);
    assert_eq!(block.attempts, 3);
    assert_eq!(block.lang, "rust");
    // Projected like any record.
    assert_eq!(
        dead[0].header("bq-message-id").as_deref(),
        Some(sent.meta.id.as_str())
    );
    assert_eq!(dead[0].header("bq-job").as_deref(), Some(CHARGE));
    t.leave(&queue).await.unwrap();
    // 1 original + 2 re-injected retries, all committed.
    assert_eq!(t.committed(&queue).await.unwrap(), [(0, 3)]);
}

// --- a consumer SIGKILLed mid-run --------------------------------------------------------

fn redis_url() -> String {
    env_or("BABELQUEUE_REDIS_URL", "redis://127.0.0.1:6379/0")
}

/// A consumer process; SIGKILLed on drop if still running.
struct ConsumerProcess(Option<Child>);

impl ConsumerProcess {
    fn start(broker: &Broker, queue: &str, prefix: &str) -> Self {
        let child = Command::new(crate::child_support::exe())
            .arg("kafka-consumer")
            .env("BQ_BROKER", broker.url())
            .env("BQ_QUEUE", queue)
            .env("BQ_PREFIX", prefix)
            // 80 charges/s per process (concurrency 4): a partition of ~200 records lasts
            // seconds, so the one killed still has work on its partitions when it dies.
            .env("BQ_HANDLER_MS", "50")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting test_children (tests/children)");
        ConsumerProcess(Some(child))
    }

    fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            c.kill().unwrap(); // SIGKILL
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

impl Drop for ConsumerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the tansu broker (BABELQUEUE_TANSU or ~/.cargo/bin/tansu) and Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --ignored"]
async fn a_consumer_sigkilled_mid_run_loses_nothing_and_the_group_rebalances() {
    const N: u64 = 600;
    let Some(broker) = Broker::start() else {
        return;
    };
    let queue = unique_topic("fleet");
    let prefix = format!("bq-test:kafka-fleet:{}", uuid::Uuid::new_v4().simple());
    let mut effects = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let t = KafkaTransport::builder(&broker.url())
        .unwrap()
        .partitions(3)
        .build()
        .unwrap();
    for i in 1..=N {
        let mut env = Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i}")})).unwrap();
        env.meta.queue = queue.clone();
        t.publish(&queue, &env).await.unwrap();
    }

    let mut a = ConsumerProcess::start(&broker, &queue, &prefix);
    let mut b = ConsumerProcess::start(&broker, &queue, &prefix);
    let charged_key = format!("{prefix}:charged");
    let (by_a, by_b) = (
        format!("{prefix}:by:{}", a.pid()),
        format!("{prefix}:by:{}", b.pid()),
    );
    let start = Instant::now();
    // Both are in the group and working: kill one mid-run, while it is still taking new
    // records (more than 8 charges in the last 250 ms, twice its concurrency of 4: more than
    // what it had already reserved), so that it holds a partition with work left that only
    // a rebalance can hand to the survivor. Without this the test passed once against tansu
    // with no rebalance at all, 2.4 s after the kill: the member killed had no work left on
    // its partitions, and the survivor's own were all that remained.
    let mut a_history = VecDeque::<(Instant, u64)>::new();
    loop {
        let n: u64 = effects.scard(&charged_key).await.unwrap();
        let (na, nb): (u64, u64) = (
            effects.scard(&by_a).await.unwrap(),
            effects.scard(&by_b).await.unwrap(),
        );
        let now = Instant::now();
        a_history.push_back((now, na));
        while a_history
            .get(1)
            .is_some_and(|(t, _)| now.duration_since(*t) >= Duration::from_millis(250))
        {
            a_history.pop_front();
        }
        let window = a_history
            .front()
            .filter(|(t, _)| now.duration_since(*t) >= Duration::from_millis(250))
            .map(|(_, then)| na - then);
        if nb > 0 && n >= N / 5 && window.is_some_and(|recent| recent > 8) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "never both working (the one to kill still taking records): {n} charged (a {na}, \
             b {nb}, a in the last 250 ms {window:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.kill();
    let killed_at = Instant::now();
    let at_kill: u64 = effects.scard(&charged_key).await.unwrap();
    assert!(at_kill < N, "the kill came after the end ({at_kill})");
    loop {
        let n: u64 = effects.scard(&charged_key).await.unwrap();
        if n >= N {
            break;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(120),
            "only {n} of {N} charged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered_in = killed_at.elapsed();
    b.terminate(); // a clean stop commits what it settled

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
        "kafka-result: sigkill charged={N} at_kill={at_kill} doubles={doubles} done_after_kill_ms={}",
        recovered_in.as_millis()
    );
    // A second charge only for what the killed one held (concurrency 4): what it had
    // settled after its last commit is delivered again, and the guard skips it.
    assert!(doubles <= 4, "{doubles} double charges");
    let committed: i64 = t.committed(&queue).await.unwrap().iter().map(|c| c.1).sum();
    let high: i64 = high_watermarks(&broker.bootstrap(), &queue)
        .iter()
        .map(|h| h.1)
        .sum();
    assert_eq!(committed, high, "the survivor committed every partition");
    let keys: Vec<String> = effects.keys(format!("{prefix}:*")).await.unwrap();
    if !keys.is_empty() {
        let _: () = effects.del(keys).await.unwrap();
    }
}
