//! Payments over SQS (moto, an emulator of the SQS API; see `tests/sqs_support`):
//!
//! - the upstream Python SDK (`babelqueue[sqs]==1.24.0`, boto3) publishes 200 payments,
//!   each twice; the Rust consumer (an `App` with a guarded handler) charges 200 and skips
//!   200, deduplicated on the Python `meta.id`;
//! - Rust publishes 100 payments, each twice; the Python SDK's consumer charges each once;
//! - two Rust consumer processes (`test_children sqs-consumer`, a Redis
//!   guard, charges counted in Redis) share a queue with a 2 s visibility lease; one is
//!   SIGKILLed mid-run: its messages reappear when their visibility runs out, every payment
//!   is charged, a second charge only for what the killed one was handling.
//!
//! Ignored without moto; the Python tests also need `BABELQUEUE_PYTHON`, the fleet test
//! Redis at 127.0.0.1:6379 (`BABELQUEUE_REDIS_URL`).

use crate::sqs_support;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::runtime::{App, Transport};
use babelqueue::{Envelope, Guard, InMemoryStore};
use serde_json::{Value, json};
use sqs_support::{child_env, counts, delete_all, transport, unique_queue};

const CHARGE: &str = "urn:babel:payments:charge";

fn python(mode: &str, queue: &str, envs: &[(&str, &str)]) -> String {
    let interpreter =
        std::env::var("BABELQUEUE_PYTHON").unwrap_or_else(|_| "/tmp/bqvenv/bin/python".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_sqs.py");
    let mut cmd = Command::new(&interpreter);
    cmd.arg(&script).arg(mode).env("QUEUE", queue);
    for (k, v) in child_env() {
        cmd.env(k, v);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("run {interpreter} (BABELQUEUE_PYTHON, with babelqueue[sqs]==1.24.0): {e}")
    });
    assert!(
        out.status.success(),
        "python_sqs.py {mode} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[derive(Debug, thiserror::Error)]
#[error("unreachable")]
struct Never;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server and the Python SDK (BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn python_publishes_each_payment_twice_and_rust_charges_each_once() {
    let queue = unique_queue("py-to-rust");
    let t = transport();
    t.queue_url(&queue).await.unwrap(); // the Python SDK creates no queue
    let produced = python("produce", &queue, &[("N", "200")]);
    let ids: HashMap<String, String> = produced
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["payment_id"].as_str().unwrap().to_owned(),
                v["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(ids.len(), 200);
    assert_eq!(counts(&queue).await, (400, 0, 0));

    let store = Arc::new(InMemoryStore::new());
    let charged = Arc::new(Mutex::new(HashMap::<String, (usize, String, String)>::new()));
    let (st, ch) = (store.clone(), charged.clone());
    let app = App::new(t.clone())
        .queue(&queue)
        .concurrency(8)
        .route_async(CHARGE, move |env: Envelope| {
            let (st, ch) = (st.clone(), ch.clone());
            async move {
                Guard::new(&*st)
                    .run_async(&env, async {
                        let id = env.data["payment_id"].as_str().unwrap().to_owned();
                        let mut ch = ch.lock().unwrap();
                        let e =
                            ch.entry(id)
                                .or_insert((0, env.meta.id.clone(), env.meta.lang.clone()));
                        e.0 += 1;
                        assert_eq!(env.data["customer"], "Zoë Ångström");
                        Ok::<(), Never>(())
                    })
                    .await
                    .map(drop)
            }
        });
    let stats = app.drain().await.unwrap();
    let charged = charged.lock().unwrap().clone();
    assert_eq!((stats.succeeded, stats.skipped), (200, 200), "{stats:?}");
    assert_eq!(charged.len(), 200);
    for (payment, (count, meta_id, lang)) in &charged {
        assert_eq!(*count, 1, "{payment} charged once");
        assert_eq!(meta_id, &ids[payment], "deduplicated on the Python meta.id");
        assert_eq!(lang, "python");
    }
    assert_eq!(counts(&queue).await, (0, 0, 0));
    delete_all(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server and the Python SDK (BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn rust_publishes_and_the_python_sdk_consumer_handles_them() {
    let queue = unique_queue("rust-to-py");
    let t = transport();
    for i in 0..100 {
        let mut env = Envelope::new(
            CHARGE,
            json!({"payment_id": format!("pay_{i}"), "amount": i}),
        )
        .unwrap();
        env.meta.queue = queue.clone();
        let body = env.encode();
        t.publish_raw(&queue, body.clone()).await.unwrap();
        t.publish_raw(&queue, body).await.unwrap();
    }
    let out = python("consume", &queue, &[("TIMEOUT", "1.0")]);
    let got: Value = serde_json::from_str(out.trim()).unwrap();
    let charged = got["charged"].as_object().unwrap();
    assert_eq!(charged.len(), 100, "{got}");
    assert!(charged.values().all(|n| n == 1), "{got}");
    assert_eq!(got["skipped"], 100);
    assert_eq!(got["processed"], 200);
    assert_eq!(counts(&queue).await, (0, 0, 0));
    delete_all(&queue).await;
}

// --- the fleet: a consumer SIGKILLed mid-run ---------------------------------------------

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A consumer process; SIGKILLed on drop if still running.
struct Consumer(Option<Child>);

impl Consumer {
    fn start(queue: &str, prefix: &str) -> Self {
        let mut cmd = Command::new(crate::child_support::exe());
        cmd.arg("sqs-consumer")
            .env("BQ_QUEUE", queue)
            .env("BQ_PREFIX", prefix)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for (k, v) in child_env() {
            cmd.env(k, v);
        }
        // A 2 s lease: what the killed one held reappears quickly.
        cmd.env(
            "BROKER_URL",
            format!("{}&visibility_timeout=2", sqs_support::url()),
        );
        Consumer(Some(
            cmd.spawn()
                .expect("starting test_children (tests/children)"),
        ))
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

impl Drop for Consumer {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server and Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --ignored"]
async fn a_consumer_sigkilled_mid_run_loses_nothing() {
    const N: u64 = 200;
    let queue = unique_queue("fleet");
    let prefix = format!("bq-test:sqs-fleet:{}", uuid::Uuid::new_v4().simple());
    let mut effects = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let t = transport();
    let bodies: Vec<Vec<u8>> = (1..=N)
        .map(|i| {
            let mut env =
                Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i}"), "n": i})).unwrap();
            env.meta.queue = queue.clone();
            env.encode()
        })
        .collect();
    t.publish_batch(&queue, bodies).await.unwrap();
    assert_eq!(counts(&queue).await, (N, 0, 0));

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
            start.elapsed() < Duration::from_secs(90),
            "no progress: {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Mid-run: no shutdown, no delete of what it holds. SQS makes it visible again when
    // the 2 s lease runs out (no one extends it any more).
    a.kill();
    let killed_at = Instant::now();
    loop {
        let n: u64 = effects.scard(&charged_key).await.unwrap();
        if n >= N {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "only {n} of {N} charged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered_in = killed_at.elapsed();
    // Wait (with a deadline) until the survivor has deleted everything, then stop it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while counts(&queue).await != (0, 0, 0) {
        assert!(
            Instant::now() < deadline,
            "left: {:?}",
            counts(&queue).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
        "sqs-result: sigkill charged={N} doubles={doubles} done_after_kill_ms={}",
        recovered_in.as_millis()
    );
    // A second charge only for what the killed one was handling (concurrency 4).
    assert!(doubles <= 4, "{doubles} double charges");
    let redelivered: u64 = effects
        .get::<_, Option<u64>>(format!("{prefix}:redelivered"))
        .await
        .unwrap()
        .unwrap_or(0);
    println!("sqs-result: sigkill redelivered={redelivered}");
    assert!(
        redelivered >= 1,
        "what the killed consumer held came back when its visibility ran out"
    );
    let keys: Vec<String> = effects.keys(format!("{prefix}:*")).await.unwrap();
    if !keys.is_empty() {
        let _: () = effects.del(keys).await.unwrap();
    }
    delete_all(&queue).await;
}
