//! A consumer started while its dedupe store is down starts, reports
//! itself not ready, and begins work when the store answers, instead of exiting.
//!
//! - In process (no server): `App::readiness` while the store is down and after.
//! - The payments example as a process (ignored: needs the shared Redis as the broker and
//!   `redis-server` on the PATH): its Redis store on its own server, port 17461, started
//!   only after the consumer; the consumer waits for it and charges once.

use crate::fleet_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use babelqueue::runtime::{App, InMemoryTransport};
use babelqueue::testing::faults::{FaultyStore, StoreCall};
use babelqueue::{BoxError, Envelope, Guard, InMemoryStore};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";

/// Waits (paused time advances) until `cond` holds, checking every 10 ms.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..100_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test(start_paused = true)]
async fn a_consumer_started_while_its_store_is_down_is_not_ready_then_works() {
    let queue = "start-outage";
    let t = InMemoryTransport::new();
    let store = Arc::new(FaultyStore::new(InMemoryStore::new()));
    store.faults().set_down(true);
    let charges = Arc::new(AtomicUsize::new(0));
    let app = {
        let (store, charges) = (Arc::clone(&store), Arc::clone(&charges));
        App::new(t.clone())
            .queue(queue)
            .poll_timeout(Duration::from_millis(50))
            .route_async(CHARGE, move |env: Envelope| {
                let (store, charges) = (Arc::clone(&store), Arc::clone(&charges));
                async move {
                    Guard::new(&*store)
                        .run_async(&env, async {
                            charges.fetch_add(1, Ordering::SeqCst);
                            Ok::<(), BoxError>(())
                        })
                        .await
                        .map(drop)
                }
            })
    };
    assert!(!app.readiness().is_ready(), "not consuming yet");
    let env = Envelope::new(CHARGE, json!({"amount": 7}))
        .unwrap()
        .with_queue(queue);
    app.publish_raw(env.encode()).await.unwrap();
    app.publish_raw(env.encode()).await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let app = app.clone();
        async move {
            app.run_until(async move {
                let _ = stop_rx.await;
            })
            .await
        }
    });
    until("the store failure is seen", || {
        store.faults().injected(StoreCall::Seen) > 0
    })
    .await;
    let r = app.readiness();
    assert!(r.consuming, "started: {r:?}");
    assert!(
        !r.store_available && !r.is_ready(),
        "not ready while the store is down: {r:?}"
    );
    // A while later: still running, nothing charged, nothing lost.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!run.is_finished(), "the consumer did not exit");
    assert_eq!(charges.load(Ordering::SeqCst), 0);
    assert_eq!(
        t.len(queue) + t.delayed_len(queue) + t.processing_len(queue),
        2
    );
    // The store answers: work begins, the consumer is ready.
    store.faults().set_down(false);
    until("both deliveries settled", || {
        t.len(queue) + t.delayed_len(queue) + t.processing_len(queue) == 0
    })
    .await;
    assert!(app.readiness().is_ready(), "{:?}", app.readiness());
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    stop_tx.send(()).unwrap();
    let stats = run.await.unwrap();
    assert_eq!((stats.succeeded, stats.skipped), (1, 1), "{stats:?}");
    assert!(!app.readiness().consuming);
}

/// The example binary, built by the same cargo (same target dir and profile) as this test.
fn example() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test executable lives in <target>/<profile>/deps");
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "--quiet", "--example", "payments"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build --example payments");
        assert!(status.success(), "cargo build --example payments failed");
        profile_dir
            .join("examples")
            .join(format!("payments{}", std::env::consts::EXE_SUFFIX))
    })
}

#[test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL) and redis-server on the PATH (starts its own on port 17461)"]
fn the_payments_consumer_started_while_its_redis_store_is_down_waits_and_charges_once() {
    const PORT: u16 = 17461;
    let broker = fleet_support::shared_url();
    let q = fleet_support::QueueGuard::new("start-outage", &broker);
    let store_url = format!("redis://127.0.0.1:{PORT}/0");
    let run = |args: &[&str]| {
        let mut cmd = Command::new(example());
        cmd.args(args)
            .env("BROKER_URL", &broker)
            .env("STORE_URL", &store_url)
            .env("QUEUE", &q.name)
            .env("RUST_LOG", "warn");
        cmd
    };
    // One payment, published twice (the same bytes).
    let produced = run(&["produce", "--count", "1"]).output().expect("produce");
    assert!(produced.status.success(), "{produced:?}");
    // The store's server is not running yet.
    let mut consumer = run(&["consume", "--store", "redis"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("consume");
    std::thread::sleep(Duration::from_secs(3));
    if let Some(status) = consumer.try_wait().unwrap() {
        let out = consumer.wait_with_output().unwrap();
        panic!(
            "the consumer exited while its store was down ({status}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let server = fleet_support::RedisServer::start(PORT, &[]);
    // It begins work once the store answers, and the drain ends.
    let mut waited = 0;
    while consumer.try_wait().unwrap().is_none() {
        assert!(
            waited < 1200,
            "the consumer did not finish after the store came back"
        );
        std::thread::sleep(Duration::from_millis(100));
        waited += 1;
    }
    let out = consumer.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("not ready"),
        "the consumer said it was not ready: {stderr}"
    );
    let stats = stdout
        .lines()
        .find(|l| l.starts_with("[rust] stats:"))
        .expect("a stats line");
    assert!(
        stats.contains("succeeded=1") && stats.contains("skipped=1"),
        "charged once, the duplicate skipped: {stats}"
    );
    drop(server);
}
