//! Redrive and replay-bypass across SDKs, over a real Redis, with the upstream Python SDK
//! (babelqueue 1.24.0), both ways through the header frame the two SDKs share:
//!
//! - the Rust runtime dead-letters; Python's `redrive(..., bypass=True)` puts the messages
//!   back; the Rust handler sees a replay;
//! - the Rust runtime dead-letters; the Rust `redrive` with bypass puts them back; the
//!   Python handler sees `is_replay()` and its `bypass_external_effects` skips the effect.
//!
//! The Python interpreter is `BABELQUEUE_PYTHON`, else `target/interop-venv/bin/python`
//! (`.ci/run` makes that venv). Ignored by default; CI runs them with `--ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use babelqueue::redis::RedisTransport;
use babelqueue::redis::keys::queue_keys;
use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::redrive::{RedriveOptions, redrive};
use babelqueue::replay::{self, Replay};
use babelqueue::runtime::{App, Permanent};
use babelqueue::{Envelope, FromEnvelope};
use serde_json::{Value, json};

const URN: &str = "urn:babel:payments:charge";

/// What the Rust handler saw: meta.id, `is_replay()`, the `Replay` argument, attempts.
type Seen = (String, bool, bool, u32);

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn python() -> PathBuf {
    match std::env::var_os("BABELQUEUE_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/interop-venv/bin/python"),
    }
}

/// Runs `tests/interop/python_redrive.py` with `args`; its stdout as JSON.
fn run_python(args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_redrive.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {} failed: {e}", python().display()));
    assert!(
        out.status.success(),
        "python {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "python printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A unique queue; its keys and its DLQ's (both SDKs' layouts) deleted at the end.
struct Queue(String);

impl Queue {
    fn new(tag: &str) -> Self {
        Queue(format!(
            "bq-test:redrive-py:{tag}:{}",
            uuid::Uuid::new_v4().simple()
        ))
    }
    fn dlq(&self) -> String {
        format!("{}.dlq", self.0)
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(redis_url())
            && let Ok(mut c) = client.get_connection()
        {
            let mut keys = Vec::new();
            for name in [self.0.clone(), self.dlq()] {
                keys.extend(queue_keys(&name));
                keys.push(format!("{name}:processing"));
                keys.push(format!("{name}:processing:deadlines"));
                let tagged: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{{{name}}}:*"))
                    .query(&mut c)
                    .unwrap_or_default();
                keys.extend(tagged);
            }
            let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut c);
        }
    }
}

/// Publishes `n` charges to `queue` and lets a Rust consumer whose handler declines them
/// permanently dead-letter them to `<queue>.dlq`. Their `meta.id`s.
async fn dead_lettered_by_rust(queue: &str, n: usize) -> Vec<String> {
    let app = App::new(RedisTransport::open(&redis_url()).unwrap())
        .queue(queue)
        .route_async(URN, |_env: Envelope| async {
            Err::<(), _>(Permanent::new("card declined"))
        });
    let mut ids = Vec::new();
    for i in 0..n {
        let env = Envelope::new(
            URN,
            json!({"payment_id": format!("pay_{i}"), "amount": 4200}),
        )
        .unwrap()
        .with_queue(queue);
        ids.push(env.meta.id.clone());
        app.publish_raw(env.encode()).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!(stats.dead_lettered, n as u64);
    let mut c = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let len: usize = c.llen(format!("{queue}.dlq")).await.unwrap();
    assert_eq!(len, n);
    ids
}

#[tokio::test]
#[ignore = "needs Redis and the Python SDK (BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn python_redrive_with_bypass_is_a_replay_for_the_rust_handler() {
    let q = Queue::new("py-to-rust");
    let mut ids = dead_lettered_by_rust(&q.0, 2).await;

    let out = run_python(&["redrive", &redis_url(), &q.dlq()]);
    assert_eq!(out["redriven"], 2, "{out}");
    for item in out["items"].as_array().unwrap() {
        assert_eq!(item["bypassed"], true, "{item}");
        assert_eq!(item["to"], q.0.as_str(), "{item}");
    }

    // The Rust consumer: the header reaches a sync handler (is_replay() in the body, on
    // the blocking pool) and the Replay extractor.
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let s = Arc::clone(&seen);
    let app = App::new(RedisTransport::open(&redis_url()).unwrap())
        .queue(&q.0)
        .route_sync(URN, move |env: &Envelope| {
            let Replay(flag) = Replay::from_envelope(env, &Default::default()).unwrap_or_default();
            s.lock()
                .unwrap()
                .push((env.meta.id.clone(), replay::is_replay(), flag, env.attempts));
        });
    let stats = app.drain().await.unwrap();
    assert_eq!(stats.succeeded, 2);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    ids.sort();
    assert_eq!(
        seen,
        ids.into_iter()
            .map(|id| (id, true, true, 0))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
#[ignore = "needs Redis and the Python SDK (BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn rust_redrive_with_bypass_is_a_replay_for_the_python_handler() {
    let q = Queue::new("rust-to-py");
    let mut ids = dead_lettered_by_rust(&q.0, 2).await;
    let t = RedisTransport::connect(&redis_url()).await.unwrap();
    let result = redrive(&t, &q.dlq(), &RedriveOptions::new().bypass(true))
        .await
        .unwrap();
    assert_eq!(result.redriven, 2);

    let out = run_python(&["consume", &redis_url(), &q.0, URN, "2"]);
    let mut got: Vec<(String, bool, bool)> = out
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["is_replay"].as_bool().unwrap(),
                m["effect_ran"].as_bool().unwrap(),
            )
        })
        .collect();
    got.sort();
    ids.sort();
    assert_eq!(
        got,
        ids.into_iter()
            .map(|id| (id, true, false))
            .collect::<Vec<_>>(),
        "the Python handler saw a replay and skipped its external effect"
    );
}
