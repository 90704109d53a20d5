//! The transactional outbox on SQLite files in a temporary directory (no server needed).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use babelqueue_core::{Envelope, Outcome};
use babelqueue_runtime::handler::{BoxError, BoxFuture};
use babelqueue_runtime::outbox::{OutboxRelay, OutboxStore};
use babelqueue_runtime::{Delivery, InMemoryTransport, Transport, TransportError};
use babelqueue_sqlite::{SqliteOutbox, SqliteStore};
use rusqlite::Connection;

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A database file of its own with an `orders` table; removed on drop.
struct Db {
    dir: PathBuf,
    path: PathBuf,
}

impl Db {
    fn new() -> Db {
        let dir = std::env::temp_dir().join(format!(
            "bq-sqlite-outbox-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("shop.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
            .unwrap();
        Db { dir, path }
    }

    fn conn(&self) -> Connection {
        let conn = Connection::open(&self.path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn
    }

    fn orders(&self) -> i64 {
        self.conn()
            .query_row("SELECT count(*) FROM orders", [], |r| r.get(0))
            .unwrap()
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn order(id: i64) -> Envelope {
    Envelope::new(
        "urn:babel:orders:created",
        serde_json::json!({"order_id": id}),
    )
    .unwrap()
    .with_queue("orders")
}

async fn drain_queue(t: &InMemoryTransport, queue: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(d) = t.reserve(queue, Duration::ZERO).await.unwrap() {
        out.push(d.element().to_vec());
        t.ack(&d).await.unwrap();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_write_leaves_no_message() {
    let db = Db::new();
    let outbox = SqliteOutbox::open(&db.path).unwrap();
    let mut conn = db.conn();
    let tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", []).unwrap();
    outbox.save(&tx, &order(1)).unwrap();
    tx.rollback().unwrap();

    let t = InMemoryTransport::new();
    let relay = OutboxRelay::new(outbox.clone(), Arc::new(t.clone()));
    assert_eq!(relay.drain().await.unwrap().published, 0);
    assert_eq!(t.len("orders"), 0);
    assert_eq!(outbox.pending().unwrap(), 0);
    assert_eq!(db.orders(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_write_is_relayed_once_byte_identical() {
    let db = Db::new();
    let outbox = SqliteOutbox::open(&db.path).unwrap();
    let env = order(7);
    let mut conn = db.conn();
    let tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES (7)", []).unwrap();
    let id = outbox.save(&tx, &env).unwrap();
    tx.commit().unwrap();

    let t = InMemoryTransport::new();
    let relay = OutboxRelay::new(outbox.clone(), Arc::new(t.clone()));
    let stats = relay.drain().await.unwrap();
    assert_eq!((stats.published, stats.failed), (1, 0));
    assert_eq!(drain_queue(&t, "orders").await, vec![env.encode()]);
    assert_eq!(relay.drain().await.unwrap().published, 0);
    assert_eq!(outbox.pending().unwrap(), 0);
    assert_eq!(db.orders(), 1);
    let (published, attempts): (Option<i64>, i64) = conn
        .query_row(
            "SELECT published_at, attempts FROM babelqueue_outbox WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(published.is_some());
    assert_eq!(attempts, 0);
    assert_eq!(outbox.purge_published(Duration::from_secs(60)).unwrap(), 0);
    assert_eq!(outbox.purge_published(Duration::ZERO).unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_handler_writes_remembers_and_enqueues_atomically() {
    let db = Db::new();
    let outbox = SqliteOutbox::open(&db.path).unwrap();
    let store = SqliteStore::open(&db.path).unwrap();
    let incoming = order(1);
    for round in 0..2 {
        let outcome = store
            .transaction(&incoming, |tx| {
                tx.execute("INSERT INTO orders VALUES (100)", [])?;
                outbox.save(tx, &order(100).continuing(&incoming))?;
                Ok::<(), BoxError>(())
            })
            .unwrap();
        assert_eq!(
            outcome,
            if round == 0 {
                Outcome::Ran
            } else {
                Outcome::Skipped
            }
        );
    }
    let err = store
        .transaction(order(2), |tx| {
            outbox.save(tx, &order(200))?;
            Err::<(), BoxError>("payment declined".into())
        })
        .unwrap_err();
    assert_eq!(err.to_string(), "payment declined");

    let t = InMemoryTransport::new();
    let relay = OutboxRelay::new(outbox.clone(), Arc::new(t.clone()));
    assert_eq!(relay.drain().await.unwrap().published, 1);
    let sent = drain_queue(&t, "orders").await;
    let env = Envelope::decode(&sent[0]).unwrap();
    assert_eq!(env.data["order_id"], 100);
    assert_eq!(env.trace_id, incoming.trace_id);
    assert_eq!(db.orders(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn three_relays_publish_each_of_5000_rows_once() {
    const ROWS: usize = 5000;
    let db = Db::new();
    let writer = SqliteOutbox::open(&db.path).unwrap();
    let mut conn = db.conn();
    let tx = conn.transaction().unwrap();
    for n in 0..ROWS {
        writer
            .save_encoded(&tx, format!("row-{n:05}").as_bytes(), "bulk")
            .unwrap();
    }
    tx.commit().unwrap();

    // Three relays, each with a connection of its own to the file.
    let transports: Vec<InMemoryTransport> = (0..3).map(|_| InMemoryTransport::new()).collect();
    let tasks: Vec<_> = transports
        .iter()
        .map(|t| {
            let outbox = SqliteOutbox::open(&db.path).unwrap();
            let relay = OutboxRelay::new(outbox, Arc::new(t.clone())).batch_size(50);
            tokio::spawn(async move { relay.drain().await.unwrap() })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap().published;
    }
    assert_eq!(total, ROWS as u64);

    let mut seen = HashSet::new();
    let mut relays_that_published = 0;
    for t in &transports {
        let got = drain_queue(t, "bulk").await;
        relays_that_published += usize::from(!got.is_empty());
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "a relay reordered rows"
        );
        for row in got {
            assert!(seen.insert(row), "a row was published twice");
        }
    }
    assert_eq!(seen.len(), ROWS);
    assert!(
        relays_that_published >= 2,
        "the relays did not run concurrently"
    );
    assert_eq!(writer.pending().unwrap(), 0);
}

/// Refuses every publish while `down` is set.
#[derive(Clone)]
struct Switchable {
    inner: InMemoryTransport,
    down: Arc<AtomicBool>,
}

impl Transport for Switchable {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(async {
                Err(TransportError::connection(std::io::Error::other(
                    "broker unreachable",
                )))
            });
        }
        self.inner.publish_raw(queue, element)
    }
    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        self.inner.reserve(queue, timeout)
    }
    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        self.inner.ack(delivery)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_loses_nothing_and_the_relay_resumes() {
    let db = Db::new();
    let outbox = SqliteOutbox::open(&db.path).unwrap();
    let inner = InMemoryTransport::new();
    let down = Arc::new(AtomicBool::new(true));
    let transport = Switchable {
        inner: inner.clone(),
        down: down.clone(),
    };
    let relay = OutboxRelay::new(outbox.clone(), Arc::new(transport))
        .poll_interval(Duration::from_millis(20))
        .backoff(Duration::from_millis(50), Duration::from_millis(200));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
        }
    });
    let envs: Vec<Envelope> = (1..=10).map(order).collect();
    let mut conn = db.conn();
    let tx = conn.transaction().unwrap();
    for env in &envs {
        outbox.save(&tx, env).unwrap();
    }
    tx.commit().unwrap();

    let reason = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let (attempts, reason): (i64, Option<String>) = conn
                .query_row(
                    "SELECT attempts, last_error FROM babelqueue_outbox ORDER BY id LIMIT 1",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap();
            if attempts >= 2 {
                return reason;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("failures recorded");
    assert!(reason.unwrap().contains("broker unreachable"));
    assert_eq!(outbox.pending().unwrap(), 10);
    assert_eq!(inner.len("orders"), 0);

    down.store(false, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), async {
        while outbox.pending().unwrap() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the relay resumed");
    stop.send(()).unwrap();
    let stats = running.await.unwrap();
    assert_eq!(stats.published, 10);
    assert!(stats.failed >= 2);
    let mut sent = drain_queue(&inner, "orders").await;
    let mut want: Vec<Vec<u8>> = envs.iter().map(Envelope::encode).collect();
    sent.sort();
    want.sort();
    assert_eq!(sent, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_claim_is_relayed_by_another_relay() {
    let db = Db::new();
    let outbox = SqliteOutbox::open(&db.path).unwrap();
    let mut conn = db.conn();
    let env = order(9);
    let tx = conn.transaction().unwrap();
    outbox.save(&tx, &env).unwrap();
    tx.commit().unwrap();
    let claimed = outbox
        .fetch_unpublished(10, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].queue, "orders");
    assert_eq!(claimed[0].payload, env.encode());
    let other = SqliteOutbox::open(&db.path).unwrap();
    let t = InMemoryTransport::new();
    let relay = OutboxRelay::new(other, Arc::new(t.clone()));
    assert_eq!(
        relay.drain().await.unwrap().published,
        0,
        "claimed rows are skipped"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(relay.drain().await.unwrap().published, 1);
    assert_eq!(t.len("orders"), 1);
}

#[test]
fn migrate_creates_the_table_on_a_callers_connection() {
    let db = Db::new();
    let outbox = SqliteOutbox::open_table(&db.path, "shop_outbox").unwrap();
    let other = db.dir.join("other.db");
    let conn = Connection::open(&other).unwrap();
    outbox.migrate(&conn).unwrap();
    outbox.migrate(&conn).unwrap();
    let n: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name IN ('shop_outbox', 'shop_outbox_unpublished_idx')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 2);
}

#[cfg(feature = "schema")]
#[test]
fn the_outbox_write_refuses_data_that_breaks_its_schema() {
    use babelqueue_core::schema::{InMemoryProvider, Schemas};
    use babelqueue_runtime::outbox::OutboxError;
    let db = Db::new();
    let schemas = Schemas::new(InMemoryProvider::new().with(
        "urn:babel:orders:created",
        serde_json::json!({"type": "object", "required": ["order_id"],
            "properties": {"order_id": {"type": "integer", "minimum": 1}}}),
    ));
    let outbox = SqliteOutbox::open(&db.path)
        .unwrap()
        .schemas(Arc::new(schemas));
    let mut conn = db.conn();
    let tx = conn.transaction().unwrap();
    let err = outbox.save(&tx, &order(0)).unwrap_err();
    let OutboxError::Schema(e) = &err else {
        panic!("not a schema error: {err}")
    };
    assert_eq!(e.violation().unwrap().rule(), "minimum");
    outbox.save(&tx, &order(1)).unwrap();
    tx.commit().unwrap();
    assert_eq!(outbox.pending().unwrap(), 1);
}
