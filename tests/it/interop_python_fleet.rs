//! A mixed fleet: the upstream Python SDK (babelqueue 1.24.0, from a venv that `.ci/run`
//! makes) and the Rust consumer on the same queue, deduplicating through one Redis store of
//! the Go layout (`<prefix><meta.id>` = `1`, `EXISTS` / `SET NX`). Sequential duplicates are
//! charged once across the two, whichever SDK gets the original or the copy.
//!
//! The Python interpreter is `BABELQUEUE_PYTHON`, else `target/interop-venv/bin/python`
//! (`python3 -m venv target/interop-venv && target/interop-venv/bin/pip install
//! babelqueue==1.24.0 redis`).

use crate::fleet_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::redis::{RedisStore, RedisStoreError, RedisTransport};
use babelqueue::{App, Envelope, Guard};
use fleet_support::{QueueGuard, raw, shared_url};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";

fn python() -> PathBuf {
    match std::env::var_os("BABELQUEUE_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/interop-venv/bin/python"),
    }
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("the dedupe store failed")]
    Store(#[from] RedisStoreError),
    #[error("the effects counter failed")]
    Effects(#[from] redis::RedisError),
}

/// Runs the Python SDK consumer until it handled `max` messages or the queue stayed empty.
fn python_consume(queue: &str, fx: &str, store_prefix: &str, max: usize) -> String {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_fleet_consumer.py");
    let py = python();
    let out = Command::new(&py)
        .arg(&script)
        .env("BROKER_URL", shared_url())
        .env("QUEUE", queue)
        .env("FX", fx)
        .env("STORE_PREFIX", store_prefix)
        .env("MAX_MESSAGES", max.to_string())
        .env("TIMEOUT", "1.0")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "the Python SDK venv is missing ({}: {e}); make it with: python3 -m venv target/interop-venv && target/interop-venv/bin/pip install babelqueue==1.24.0 redis",
                py.display()
            )
        });
    assert!(
        out.status.success(),
        "python consumer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts the Python SDK consumer as a long-running process (until SIGTERM).
fn python_consumer_process(queue: &str, fx: &str, store_prefix: &str) -> std::process::Child {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_fleet_consumer.py");
    Command::new(python())
        .arg(&script)
        .env("BROKER_URL", shared_url())
        .env("QUEUE", queue)
        .env("FX", fx)
        .env("STORE_PREFIX", store_prefix)
        .env("TIMEOUT", "0.05")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the Python SDK venv (target/interop-venv)")
}

fn rust_app(
    transport: RedisTransport,
    queue: &str,
    store: RedisStore,
    fx: &str,
    deliveries: Arc<AtomicUsize>,
    effects: redis::aio::MultiplexedConnection,
    delay: Duration,
) -> App {
    let fx = fx.to_owned();
    App::new(transport)
        .queue(queue)
        .poll_timeout(Duration::from_millis(100))
        .route_async(CHARGE, move |env: Envelope| {
            let (store, fx, d) = (store.clone(), fx.clone(), deliveries.clone());
            let mut effects = effects.clone();
            async move {
                d.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                let pid = env.data["payment_id"].as_str().unwrap_or("?").to_owned();
                Guard::new(&store)
                    .run_async(&env, async {
                        redis::pipe()
                            .incr(format!("{fx}:charges:{pid}"), 1)
                            .ignore()
                            .sadd(format!("{fx}:charged"), &pid)
                            .ignore()
                            .query_async::<()>(&mut effects)
                            .await?;
                        Ok::<(), ChargeError>(())
                    })
                    .await?;
                Ok::<(), ChargeError>(())
            }
        })
}

fn payment(queue: &str, pid: &str) -> Vec<u8> {
    Envelope::new(
        CHARGE,
        json!({"payment_id": pid, "amount": 4200, "currency": "EUR"}),
    )
    .unwrap()
    .with_queue(queue)
    .encode()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 and the Python SDK venv (target/interop-venv, made by .ci/run); CI runs it with --ignored"]
async fn python_and_rust_consumers_charge_sequential_duplicates_once() {
    let url = shared_url();
    let q = QueueGuard::new("mixed", &url);
    let fx = format!("{}:fx", q.name);
    let store_prefix = format!("{}:idemp:", q.name);
    let store = RedisStore::builder(&url)
        .prefix(&store_prefix)
        .connect()
        .await
        .unwrap();
    let mut c = raw(&url).await;
    let transport = RedisTransport::connect(&url).await.unwrap();
    let rust_deliveries = Arc::new(AtomicUsize::new(0));
    let app = rust_app(
        transport.clone(),
        &q.name,
        store.clone(),
        &fx,
        rust_deliveries.clone(),
        c.clone(),
        Duration::ZERO,
    );
    let n = 40;
    let copies: Vec<Vec<u8>> = (0..2 * n)
        .map(|i| payment(&q.name, &format!("pay_{i:04}")))
        .collect();

    // 1. Python charges originals, then Rust gets the copies: all skipped.
    for e in &copies[..n] {
        let _: () = c.rpush(&q.name, e).await.unwrap();
    }
    let out = python_consume(&q.name, &fx, &store_prefix, n);
    assert!(out.contains(&format!("processed={n}")), "{out}");
    for e in &copies[..n] {
        let _: () = c.rpush(&q.name, e).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!((stats.succeeded, stats.skipped), (0, n as u64), "{stats:?}");

    // 2. Rust charges originals, then Python gets the copies: all skipped by the SDK's wrap.
    for e in &copies[n..] {
        let _: () = c.rpush(&q.name, e).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!(stats.succeeded, n as u64, "{stats:?}");
    for e in &copies[n..] {
        let _: () = c.rpush(&q.name, e).await.unwrap();
    }
    let out = python_consume(&q.name, &fx, &store_prefix, n);
    assert!(out.contains(&format!("processed={n}")), "{out}");
    let handler_runs: usize = c
        .get::<_, Option<usize>>(format!("{fx}:deliveries:python-handler"))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(
        handler_runs, n,
        "the Python handler ran only for phase 1's originals"
    );

    // 3. Both running at once, over batches: ten originals, and once all ten are charged,
    //    their ten copies. Each consumer takes some of each batch (the Rust handler takes
    //    20 ms, so the Python loop's polls get their share).
    let fresh: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            let pid = format!("pay_mix_{i:04}");
            let e = payment(&q.name, &pid);
            (pid, e)
        })
        .collect();
    let slow_app = rust_app(
        transport.clone(),
        &q.name,
        store.clone(),
        &fx,
        rust_deliveries.clone(),
        c.clone(),
        Duration::from_millis(20),
    );
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn(async move {
        slow_app
            .run_until(async {
                let _ = rx.await;
            })
            .await
    });
    let py = python_consumer_process(&q.name, &fx, &store_prefix);
    let deliveries = |c: redis::aio::MultiplexedConnection| {
        let fx = fx.clone();
        let rd = rust_deliveries.clone();
        async move {
            let mut c = c;
            let p: usize = c
                .get::<_, Option<usize>>(format!("{fx}:deliveries:python"))
                .await
                .unwrap()
                .unwrap_or(0);
            p + rd.load(Ordering::SeqCst)
        }
    };
    let base = deliveries(c.clone()).await;
    let mut sent = 0;
    for batch in fresh.chunks(10) {
        for (_, e) in batch {
            let _: () = c.rpush(&q.name, e).await.unwrap();
        }
        sent += batch.len();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut all = true;
            for (pid, _) in batch {
                all &= c
                    .sismember::<_, _, bool>(format!("{fx}:charged"), pid)
                    .await
                    .unwrap();
            }
            if all && deliveries(c.clone()).await >= base + sent {
                break;
            }
            assert!(Instant::now() < deadline, "a batch was never charged");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Every original was handled and remembered (the guard remembers before the ack);
        // now their byte-identical copies.
        for (_, e) in batch {
            let _: () = c.rpush(&q.name, e).await.unwrap();
        }
        sent += batch.len();
        while deliveries(c.clone()).await < base + sent {
            assert!(Instant::now() < deadline, "copies never delivered");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let status = Command::new("kill")
        .args(["-TERM", &py.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let py_out = tokio::task::spawn_blocking(move || {
        let out = py.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .unwrap();
    stop.send(()).unwrap();
    runner.await.unwrap();

    let python_deliveries: usize = c
        .get::<_, Option<usize>>(format!("{fx}:deliveries:python"))
        .await
        .unwrap()
        .unwrap_or(0);
    let charged: usize = c.scard(format!("{fx}:charged")).await.unwrap();
    let keys: Vec<String> = c.keys(format!("{fx}:charges:*")).await.unwrap();
    let counts: Vec<usize> = c.mget(&keys).await.unwrap();
    let doubles = counts.iter().filter(|&&n| n > 1).count();
    let legacy: usize = c.llen(format!("{}:processing", q.name)).await.unwrap();
    let deadlines: usize = c
        .zcard(format!("{}:processing:deadlines", q.name))
        .await
        .unwrap();
    println!(
        "fleet-result: mixed-python-rust payments={} charged={charged} double_effects={doubles} python_deliveries={python_deliveries} rust_deliveries={} python_out={}",
        3 * n,
        rust_deliveries.load(Ordering::SeqCst),
        py_out.trim()
    );
    let mut cleanup: Vec<String> = keys;
    cleanup.extend(c.keys::<_, Vec<String>>(format!("{fx}:*")).await.unwrap());
    cleanup.extend(
        c.keys::<_, Vec<String>>(format!("{store_prefix}*"))
            .await
            .unwrap(),
    );
    cleanup.push(format!("{}:processing:deadlines", q.name));
    let _: () = c.del(cleanup).await.unwrap();

    assert_eq!(charged, 3 * n);
    assert_eq!(
        doubles, 0,
        "sequential duplicates are charged once across the two SDKs"
    );
    assert!(
        python_deliveries > 2 * n,
        "the Python consumer took part in phase 3"
    );
    assert_eq!(transport.processing_len(&q.name).await.unwrap(), 0);
    assert_eq!(
        (legacy, deadlines),
        (0, 0),
        "the Python SDK's lists are empty"
    );
    assert_eq!(transport.len(&q.name).await.unwrap(), 0);
}
