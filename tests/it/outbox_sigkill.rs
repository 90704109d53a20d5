//! A relay SIGKILLed between the publish and the mark, on PostgreSQL and on SQLite, over a
//! real Redis: the message is published at least once (twice here), and a guarded consumer
//! charges it once.
//!
//! The relay is a process of its own (`test_children outbox-relay`,
//! `tests/children/outbox_relay.rs`, with `BQ_OUTBOX_CHILD` naming the store): a real
//! [`OutboxRelay`] pass
//! whose transport, once Redis accepted the row, prints a mark and hangs, so the
//! parent kills it exactly in the window. Needs Redis (`BABELQUEUE_REDIS_URL`) and, for the
//! PostgreSQL case, PostgreSQL (`BABELQUEUE_POSTGRES_URL`); ignored by default, CI runs
//! them with `--include-ignored`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use babelqueue::handler::BoxError;
use babelqueue::outbox::{OutboxRelay, OutboxStore};
use babelqueue::postgres::{PostgresOutbox, PostgresStore};
use babelqueue::redis::keys::queue_keys;
use babelqueue::redis::{RedisTransport, redis};
use babelqueue::runtime::App;
use babelqueue::sqlite::SqliteOutbox;
use babelqueue::{Envelope, Guard, InMemoryStore};

const CHILD: &str = "BQ_OUTBOX_CHILD";
/// What the relay process prints once Redis accepted the row (libtest may print on the
/// same line, so it is searched for, not compared).
const MARK: &str = "BQ-OUTBOX-PUBLISHED";
const LEASE: Duration = Duration::from_secs(2);

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn pg_url() -> String {
    std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Runs the relay process on `which`, waits for its publish, SIGKILLs it.
fn kill_relay_after_publish(which: &str) {
    let mut child = Command::new(crate::child_support::exe())
        .arg("outbox-relay")
        .env(CHILD, which)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting test_children (tests/children)");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let found = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains(MARK));
        let _ = tx.send(found);
    });
    // Never wait forever on a relay that neither publishes nor ends.
    let published = rx.recv_timeout(Duration::from_secs(60)).unwrap_or(false);
    child.kill().unwrap(); // SIGKILL: no mark, no cleanup
    let status = child.wait().unwrap();
    assert!(
        published,
        "the relay process ended without publishing ({status})"
    );
}

/// Deletes the queue's keys at the end.
struct Queue(String);

impl Drop for Queue {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(redis_url())
            && let Ok(mut c) = client.get_connection()
        {
            let _: Result<(), _> = redis::cmd("DEL").arg(queue_keys(&self.0)).query(&mut c);
        }
    }
}

/// The part after the kill, for either backend: the row is still unpublished, Redis has it
/// once; after the lease a new relay publishes it again; a guarded consumer charges once.
async fn after_the_kill(outbox: Arc<dyn OutboxStore>, queue: &str, env: &Envelope) {
    let direct = RedisTransport::connect(&redis_url()).await.unwrap();
    let relay = OutboxRelay::new(outbox, Arc::new(direct.clone()));
    assert_eq!(
        relay.drain().await.unwrap().published,
        0,
        "the killed relay's claim holds until its lease ends"
    );
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    assert_eq!(relay.drain().await.unwrap().published, 1);
    assert_eq!(relay.drain().await.unwrap().published, 0, "marked now");

    let charged = Arc::new(AtomicU32::new(0));
    let store = Arc::new(InMemoryStore::new());
    let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let app = App::new(direct)
        .queue(queue)
        .poll_timeout(Duration::from_millis(50))
        .route_sync("urn:babel:payments:charge", {
            let (charged, store, bodies) = (charged.clone(), store.clone(), bodies.clone());
            move |e: &Envelope| {
                bodies.lock().unwrap().push(e.encode());
                Guard::new(&*store)
                    .run(e, || {
                        charged.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), BoxError>(())
                    })
                    .map(|_| ())
            }
        });
    let stats = app.drain().await.unwrap();
    assert_eq!(stats.acked, 2, "published twice: once by each relay");
    assert_eq!(charged.load(Ordering::SeqCst), 1, "charged once");
    assert_eq!(*bodies.lock().unwrap(), vec![env.encode(), env.encode()]);
}

fn charge(queue: &str) -> Envelope {
    Envelope::new(
        "urn:babel:payments:charge",
        serde_json::json!({"payment_id": "pay_1", "amount": 4200}),
    )
    .unwrap()
    .with_queue(queue)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn sqlite_relay_killed_between_publish_and_mark() {
    let queue = Queue(format!(
        "bq-test:outbox-kill:{}",
        uuid::Uuid::new_v4().simple()
    ));
    let dir = std::env::temp_dir().join(format!("bq-outbox-kill-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shop.db");
    let outbox = SqliteOutbox::open(&path).unwrap();
    let env = charge(&queue.0);
    let mut conn = babelqueue::sqlite::rusqlite::Connection::open(&path).unwrap();
    let tx = conn.transaction().unwrap();
    outbox.save(&tx, &env).unwrap();
    tx.commit().unwrap();

    kill_relay_after_publish(&format!("sqlite:{}", path.display()));
    assert_eq!(outbox.pending().unwrap(), 1, "killed before the mark");
    after_the_kill(Arc::new(outbox), &queue.0, &env).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis (BABELQUEUE_REDIS_URL) and PostgreSQL (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn postgres_relay_killed_between_publish_and_mark() {
    let queue = Queue(format!(
        "bq-test:outbox-kill:{}",
        uuid::Uuid::new_v4().simple()
    ));
    let table = format!("bq_outbox_kill_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::connect(&pg_url()).await.unwrap();
    let outbox = PostgresOutbox::with_table(store.pool().clone(), &table).unwrap();
    outbox.migrate().await.unwrap();
    let env = charge(&queue.0);
    let mut client = store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    outbox.save(&tx, &env).await.unwrap();
    tx.commit().await.unwrap();

    kill_relay_after_publish(&format!("postgres:{table}"));
    assert_eq!(outbox.pending().await.unwrap(), 1, "killed before the mark");
    after_the_kill(Arc::new(outbox), &queue.0, &env).await;
    client
        .batch_execute(&format!("DROP TABLE \"{table}\""))
        .await
        .unwrap();
}
