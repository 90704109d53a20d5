//! The payments example end to end (SPEC section 6), and the cross-SDK story: a payment
//! produced by a Python producer (built the way the Python SDK builds envelopes) is
//! charged once by the Rust consumer. The Redis tests are ignored without a server; CI
//! runs them with `--include-ignored`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::redis::{RedisStore, RedisTransport, processing_list};
use babelqueue::runtime::App;
use babelqueue::{Envelope, Guard};

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn unique_queue(tag: &str) -> String {
    format!("bq-test:payments-{tag}:{}", uuid::Uuid::new_v4().simple())
}

/// The example binary, built by the same cargo (same target dir and profile) as this
/// test, so it is never stale.
fn example() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // <target>/<profile>/deps/<this test>
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

fn run_example(args: &[&str], envs: &[(&str, &str)]) -> (Output, String) {
    let mut cmd = Command::new(example());
    cmd.args(args).env("BROKER_URL", redis_url());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the payments example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, stdout)
}

fn lines_starting(stdout: &str, prefix: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis must be reachable for this test")
}

async fn drop_queue(queue: &str) {
    let _: () = raw()
        .await
        .del(&[
            queue.to_owned(),
            processing_list(queue),
            format!("{queue}.dlq"),
        ])
        .await
        .unwrap();
}

/// Runs tests/interop/python_producer.py: the same Python-built envelope RPUSHed twice.
fn python_produce(queue: &str) -> Envelope {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_producer.py");
    let out = Command::new("python3")
        .arg(&script)
        .env("BROKER_URL", redis_url())
        .env("QUEUE", queue)
        .output()
        .expect("python3 must be installed");
    assert!(
        out.status.success(),
        "python producer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    Envelope::decode(line.trim_end().as_bytes()).expect("the Python envelope is accepted")
}

fn the_three_lines(stdout: &str, meta_id: Option<&str>) {
    let charged = lines_starting(
        stdout,
        "[rust] charged  payment_id=pay_7f3a amount=4200 EUR  meta.id=",
    );
    let skipped = lines_starting(stdout, "[rust] skipped  payment_id=pay_7f3a  meta.id=");
    assert_eq!(charged.len(), 1, "charged once:\n{stdout}");
    assert_eq!(skipped.len(), 1, "skipped once:\n{stdout}");
    assert!(charged[0].ends_with("(charged once)"));
    assert!(skipped[0].ends_with("(duplicate, not charged again)"));
    if let Some(id) = meta_id {
        assert!(charged[0].contains(&format!("meta.id={id} ")), "{stdout}");
        assert!(skipped[0].contains(&format!("meta.id={id} ")), "{stdout}");
    }
    assert_eq!(
        lines_starting(stdout, "[rust] handled"),
        vec!["[rust] handled 2 deliveries: charged exactly once, no double charge.".to_owned()],
        "{stdout}"
    );
}

#[test]
fn embedded_mode_charges_once_and_exits_zero() {
    let (out, stdout) = run_example(&[], &[]);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    the_three_lines(&stdout, None);
}

#[test]
fn a_bad_command_line_exits_non_zero() {
    let (out, _) = run_example(&["consume", "--store", "floppy-disk"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown store `floppy-disk`"));
    let (out, _) = run_example(&["launch"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn produce_then_consume_through_redis_charges_once() {
    let queue = unique_queue("example");
    let (out, stdout) = run_example(&["produce"], &[("QUEUE", &queue)]);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Two identical elements on the wire.
    let elements: Vec<Vec<u8>> = raw().await.lrange(&queue, 0, -1).await.unwrap();
    assert_eq!(elements.len(), 2);
    assert_eq!(elements[0], elements[1]);
    let id = Envelope::decode(&elements[0]).unwrap().meta.id;

    let (out, stdout) = run_example(&["consume"], &[("QUEUE", &queue)]);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    the_three_lines(&stdout, Some(&id));
    let left: usize = raw().await.llen(&queue).await.unwrap();
    let in_flight: usize = raw().await.llen(processing_list(&queue)).await.unwrap();
    assert_eq!((left, in_flight), (0, 0));
    // The default store is Redis, in the layout every SDK shares.
    let mark: Option<String> = raw().await.get(format!("bq:idemp:{id}")).await.unwrap();
    assert_eq!(mark.as_deref(), Some("1"));
    let _: () = raw().await.del(format!("bq:idemp:{id}")).await.unwrap();
    drop_queue(&queue).await;
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn consume_with_the_memory_and_embedded_stores() {
    let dir = std::env::temp_dir().join(format!("bq-payments-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store.sqlite3");
    for store in ["memory", "embedded"] {
        let queue = unique_queue(store);
        let (out, _) = run_example(&["produce"], &[("QUEUE", &queue)]);
        assert!(out.status.success());
        let (out, stdout) = run_example(
            &["consume", "--store", store],
            &[("QUEUE", &queue), ("STORE_PATH", path.to_str().unwrap())],
        );
        assert!(out.status.success(), "{store}: {stdout}");
        the_three_lines(&stdout, None);
        drop_queue(&queue).await;
    }
    assert!(path.exists(), "the embedded store is a file at STORE_PATH");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 and PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_REDIS_URL, POSTGRES_URL); CI runs it with --include-ignored"]
async fn consume_with_the_postgres_store() {
    let queue = unique_queue("pg");
    let pg = std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let (out, _) = run_example(&["produce"], &[("QUEUE", &queue)]);
    assert!(out.status.success());
    let (out, stdout) = run_example(
        &["consume", "--store", "postgres"],
        &[("QUEUE", &queue), ("POSTGRES_URL", &pg)],
    );
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    the_three_lines(&stdout, None);
    drop_queue(&queue).await;
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_python_produced_duplicate_is_charged_once_by_the_example_consumer() {
    let queue = unique_queue("python");
    let env = python_produce(&queue);
    assert_eq!(env.meta.lang, "python");
    let elements: Vec<Vec<u8>> = raw().await.lrange(&queue, 0, -1).await.unwrap();
    assert_eq!(elements.len(), 2);
    assert_eq!(elements[0], elements[1], "the same bytes twice");
    // json.dumps(..., ensure_ascii=False): UTF-8 on the wire, not \u escapes.
    assert!(
        String::from_utf8(elements[0].clone())
            .unwrap()
            .contains("Zoë Ångström")
    );

    let (out, stdout) = run_example(&["consume"], &[("QUEUE", &queue)]);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    the_three_lines(&stdout, Some(&env.meta.id));
    let _: () = raw()
        .await
        .del(format!("bq:idemp:{}", env.meta.id))
        .await
        .unwrap();
    drop_queue(&queue).await;
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_payment_another_sdk_already_charged_is_not_charged_again() {
    // A Python producer sends the payment; a consumer of another SDK (Go, say) sharing the
    // Redis store charged it and remembered it the SPEC way: SET bq:idemp:<meta.id> 1.
    let queue = unique_queue("shared-store");
    let env = python_produce(&queue);
    let _: () = raw()
        .await
        .set(format!("bq:idemp:{}", env.meta.id), "1")
        .await
        .unwrap();
    let (out, stdout) = run_example(&["consume"], &[("QUEUE", &queue)]);
    assert!(out.status.success(), "{stdout}");
    assert!(
        lines_starting(&stdout, "[rust] charged").is_empty(),
        "{stdout}"
    );
    assert_eq!(
        lines_starting(&stdout, "[rust] skipped").len(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("[rust] handled 2 deliveries: nothing charged, no double charge."));
    let _: () = raw()
        .await
        .del(format!("bq:idemp:{}", env.meta.id))
        .await
        .unwrap();
    drop_queue(&queue).await;
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct StoreDown(#[from] babelqueue::redis::RedisStoreError);

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_python_produced_duplicate_is_charged_once_in_process() {
    let queue = unique_queue("python-inproc");
    let sent = python_produce(&queue);
    let prefix = format!("bq-test:idemp:{}:", uuid::Uuid::new_v4().simple());
    let store = Arc::new(
        RedisStore::builder(redis_url())
            .prefix(&prefix)
            .connect()
            .await
            .unwrap(),
    );
    let charges = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (st, ch, se) = (store.clone(), charges.clone(), seen.clone());
    let app = App::new(RedisTransport::connect(&redis_url()).await.unwrap())
        .queue(&queue)
        .route_async("urn:babel:payments:charge", move |env: Envelope| {
            let (st, ch, se) = (st.clone(), ch.clone(), se.clone());
            async move {
                Guard::new(&*st)
                    .run_async(&env, async {
                        ch.fetch_add(1, Ordering::SeqCst);
                        se.lock().unwrap().push(env.clone());
                        Ok::<(), StoreDown>(())
                    })
                    .await
                    .map(drop)
            }
        });
    let stats = app.drain().await.unwrap();
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    assert_eq!((stats.succeeded, stats.skipped, stats.acked), (1, 1, 2));
    let got = seen.lock().unwrap()[0].clone();
    assert_eq!(got, sent);
    assert_eq!(got.data["customer"], "Zoë Ångström");
    let _: () = raw()
        .await
        .del(format!("{prefix}{}", sent.meta.id))
        .await
        .unwrap();
    drop_queue(&queue).await;
}
