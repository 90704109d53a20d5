//! Side by side with the upstream Python SDK (`babelqueue[amqp]==1.24.0`, its pika
//! transport) on one RabbitMQ queue, through `tests/interop/python_amqp.py`:
//!
//! - Python publishes 200 payments, each twice; the Rust consumer (an `App` with a guarded
//!   handler) charges 200 and skips 200;
//! - Rust publishes payments, each twice; the Python SDK's consumer (its handler wrapped by
//!   `idempotency.wrap`) charges each once; a raw pika read of a Rust-published message
//!   shows every property and header of the projection with native types.
//!
//! Both sides declare the queue (durable, no arguments): a mismatch would be refused by
//! RabbitMQ with PRECONDITION_FAILED. Ignored without a broker; the interpreter is
//! `BABELQUEUE_PYTHON` (default `/tmp/bqvenv/bin/python`, the venv `.ci/run` makes).

use crate::amqp_support;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use amqp_support::{delete_all, ready, ready_within, unique_queue, url};
use babelqueue::amqp::AmqpTransport;
use babelqueue::runtime::{App, Transport};
use babelqueue::{Envelope, Guard, InMemoryStore};
use serde_json::{Value, json};

const CHARGE: &str = "urn:babel:payments:charge";

fn python(mode: &str, queue: &str, envs: &[(&str, &str)]) -> String {
    let interpreter =
        std::env::var("BABELQUEUE_PYTHON").unwrap_or_else(|_| "/tmp/bqvenv/bin/python".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_amqp.py");
    let mut cmd = Command::new(&interpreter);
    cmd.arg(&script)
        .arg(mode)
        .env("BROKER_URL", url())
        .env("QUEUE", queue);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("run {interpreter} (BABELQUEUE_PYTHON, with babelqueue[amqp]==1.24.0): {e}")
    });
    assert!(
        out.status.success(),
        "python_amqp.py {mode} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[derive(Debug, thiserror::Error)]
#[error("unreachable")]
struct Never;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL) and the Python SDK (BABELQUEUE_PYTHON); CI runs it with --include-ignored"]
async fn python_publishes_each_payment_twice_and_rust_charges_each_once() {
    let queue = unique_queue("py-to-rust");
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
    // The SDK publishes without publisher confirms: its last messages may still be on
    // their way into the queue when the process has exited (CI once counted 275).
    assert_eq!(
        ready_within(&queue, 400, Duration::from_secs(20)).await,
        400
    );

    let store = Arc::new(InMemoryStore::new());
    let charged = Arc::new(Mutex::new(HashMap::<String, (usize, String, String)>::new()));
    let (st, ch) = (store.clone(), charged.clone());
    let app = App::new(AmqpTransport::open(&url()).await.unwrap())
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
    assert_eq!(ready(&queue).await, 0);
    delete_all(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL) and the Python SDK (BABELQUEUE_PYTHON); CI runs it with --include-ignored"]
async fn rust_publishes_and_the_python_sdk_consumer_handles_them() {
    let queue = unique_queue("rust-to-py");
    let t = AmqpTransport::open(&url()).await.unwrap();
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
    assert_eq!(ready(&queue).await, 0);
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL) and the Python SDK (BABELQUEUE_PYTHON); CI runs it with --include-ignored"]
async fn a_raw_pika_read_shows_the_projection_with_native_types() {
    let queue = unique_queue("pika-read");
    let t = AmqpTransport::open(&url()).await.unwrap();
    let mut env = Envelope::new(CHARGE, json!({"payment_id": "pay_7f3a", "amount": 4200})).unwrap();
    env.attempts = 2;
    env.meta.queue = queue.clone();
    let body = env.encode();
    t.publish_raw(&queue, body.clone()).await.unwrap();
    let out = python("raw-get", &queue, &[]);
    let got: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        got["body"].as_str().unwrap().as_bytes(),
        body,
        "byte for byte"
    );
    let p = &got["properties"];
    assert_eq!(p["type"], json!([CHARGE, "str"]));
    assert_eq!(p["correlation_id"], json!([env.trace_id, "str"]));
    assert_eq!(p["message_id"], json!([env.meta.id, "str"]));
    assert_eq!(p["app_id"], json!(["babelqueue", "str"]));
    assert_eq!(p["content_type"], json!(["application/json", "str"]));
    assert_eq!(p["content_encoding"], json!(["utf-8", "str"]));
    assert_eq!(p["delivery_mode"], json!([2, "int"]));
    let h = &got["headers"];
    assert_eq!(
        h["x-schema-version"],
        json!([1, "int"]),
        "an integer, not a string"
    );
    assert_eq!(h["x-source-lang"], json!(["rust", "str"]));
    assert_eq!(h["x-attempts"], json!([2, "int"]));
    assert_eq!(h.as_object().unwrap().len(), 3, "{h}");
    delete_all(&queue).await;
}
