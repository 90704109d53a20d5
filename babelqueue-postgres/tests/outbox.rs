//! The transactional outbox on a real PostgreSQL server (`BABELQUEUE_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`). Ignored by default; CI runs them with
//! `--include-ignored`. Every test uses tables of its own and drops them.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use babelqueue_core::{Envelope, Outcome};
use babelqueue_postgres::{PostgresOutbox, PostgresStore};
use babelqueue_runtime::handler::{BoxError, BoxFuture};
use babelqueue_runtime::outbox::{OutboxRelay, OutboxStore};
use babelqueue_runtime::{Delivery, InMemoryTransport, Transport, TransportError};

const NEEDS_PG: &str = "PostgreSQL must be reachable at BABELQUEUE_POSTGRES_URL \
                        (default postgres://postgres@127.0.0.1:5432/test)";

fn url() -> String {
    std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A migrated outbox on a table of its own, a business table `<name>_orders`, and the
/// store (whose pool they share).
struct Fixture {
    store: PostgresStore,
    outbox: PostgresOutbox,
    name: String,
}

impl Fixture {
    async fn new(tag: &str) -> Fixture {
        let name = format!(
            "bq_outbox_{tag}_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let store = PostgresStore::builder(url())
            .table(format!("{name}_seen"))
            .connect()
            .await
            .expect(NEEDS_PG);
        let outbox = PostgresOutbox::with_table(store.pool().clone(), &name).unwrap();
        outbox.migrate().await.expect(NEEDS_PG);
        // Migrating twice changes nothing.
        outbox.migrate().await.unwrap();
        let client = store.pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "CREATE TABLE \"{name}_orders\" (id BIGINT PRIMARY KEY)"
            ))
            .await
            .unwrap();
        Fixture {
            store,
            outbox,
            name,
        }
    }

    async fn orders(&self) -> i64 {
        let client = self.store.pool().get().await.unwrap();
        client
            .query_one(
                &format!("SELECT count(*) FROM \"{}_orders\"", self.name),
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    async fn cleanup(self) {
        let client = self.store.pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS \"{0}\"; DROP TABLE IF EXISTS \"{0}_orders\"; \
                 DROP TABLE IF EXISTS \"{0}_seen\"; DROP SEQUENCE IF EXISTS \"{0}_seen_fence_seq\";",
                self.name
            ))
            .await
            .unwrap();
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

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_rolled_back_write_leaves_no_message() {
    let f = Fixture::new("rb").await;
    let mut client = f.store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    tx.execute(
        &format!("INSERT INTO \"{}_orders\" VALUES (1)", f.name),
        &[],
    )
    .await
    .unwrap();
    f.outbox.save(&tx, &order(1)).await.unwrap();
    tx.rollback().await.unwrap();
    drop(client);

    let t = InMemoryTransport::new();
    let relay = OutboxRelay::new(f.outbox.clone(), Arc::new(t.clone()));
    assert_eq!(relay.drain().await.unwrap().published, 0);
    assert_eq!(t.len("orders"), 0);
    assert_eq!(f.outbox.pending().await.unwrap(), 0);
    assert_eq!(f.orders().await, 0);
    f.cleanup().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_committed_write_is_relayed_once_byte_identical() {
    let f = Fixture::new("commit").await;
    let env = order(7);
    let mut client = f.store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    tx.execute(
        &format!("INSERT INTO \"{}_orders\" VALUES (7)", f.name),
        &[],
    )
    .await
    .unwrap();
    let id = f.outbox.save(&tx, &env).await.unwrap();
    // Uncommitted: invisible to a relay.
    let t = InMemoryTransport::new();
    let relay = OutboxRelay::new(f.outbox.clone(), Arc::new(t.clone()));
    assert_eq!(relay.drain().await.unwrap().published, 0);
    tx.commit().await.unwrap();
    drop(client);

    let stats = relay.drain().await.unwrap();
    assert_eq!((stats.published, stats.failed), (1, 0));
    assert_eq!(drain_queue(&t, "orders").await, vec![env.encode()]);
    assert_eq!(relay.drain().await.unwrap().published, 0);
    assert_eq!(f.outbox.pending().await.unwrap(), 0);
    assert_eq!(f.orders().await, 1);

    let client = f.store.pool().get().await.unwrap();
    let row = client
        .query_one(
            &format!(
                "SELECT published_at IS NOT NULL, attempts, queue FROM \"{}\" WHERE id = $1",
                f.name
            ),
            &[&id],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
    assert_eq!(row.get::<_, i32>(1), 0);
    assert_eq!(row.get::<_, String>(2), "orders");
    drop(client);
    // Purging keeps rows published less than a minute ago, then removes them.
    assert_eq!(
        f.outbox
            .purge_published(Duration::from_secs(60))
            .await
            .unwrap(),
        0
    );
    assert_eq!(f.outbox.purge_published(Duration::ZERO).await.unwrap(), 1);
    f.cleanup().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_guarded_handler_writes_remembers_and_enqueues_atomically() {
    let f = Fixture::new("guard").await;
    f.store.migrate().await.unwrap();
    let incoming = order(1);
    let table = format!("{}_orders", f.name);
    for round in 0..2 {
        let outbox = f.outbox.clone();
        let table = table.clone();
        let outcome = f
            .store
            .transaction(&incoming, async |tx| {
                tx.execute(&format!("INSERT INTO \"{table}\" VALUES (100)"), &[])
                    .await?;
                outbox.save(tx, &order(100).continuing(&incoming)).await?;
                Ok::<(), BoxError>(())
            })
            .await
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
    // A handler that fails rolls its outbox row back with the rest.
    let failing = order(2);
    let outbox = f.outbox.clone();
    let err = f
        .store
        .transaction(&failing, async |tx| {
            outbox.save(tx, &order(200)).await?;
            Err::<(), BoxError>("payment declined".into())
        })
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "payment declined");

    let t = InMemoryTransport::new();
    let relay = OutboxRelay::new(f.outbox.clone(), Arc::new(t.clone()));
    assert_eq!(relay.drain().await.unwrap().published, 1);
    let sent = drain_queue(&t, "orders").await;
    let env = Envelope::decode(&sent[0]).unwrap();
    assert_eq!(env.data["order_id"], 100);
    assert_eq!(env.trace_id, incoming.trace_id);
    assert_eq!(f.orders().await, 1);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn three_relays_publish_each_of_5000_rows_once() {
    let f = Fixture::new("three").await;
    const ROWS: usize = 5000;
    let mut client = f.store.pool().get().await.unwrap();
    for chunk in 0..10 {
        let tx = client.transaction().await.unwrap();
        for i in 0..ROWS / 10 {
            let n = chunk * (ROWS / 10) + i;
            f.outbox
                .save_encoded(&tx, format!("row-{n:05}").as_bytes(), "bulk")
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }
    drop(client);

    let transports: Vec<InMemoryTransport> = (0..3).map(|_| InMemoryTransport::new()).collect();
    let tasks: Vec<_> = transports
        .iter()
        .map(|t| {
            let relay = OutboxRelay::new(f.outbox.clone(), Arc::new(t.clone())).batch_size(50);
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
        // Order per relay is kept: each relay's rows arrive in increasing id order.
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
    assert_eq!(f.outbox.pending().await.unwrap(), 0);
    f.cleanup().await;
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

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_broker_outage_loses_nothing_and_the_relay_resumes() {
    let f = Fixture::new("down").await;
    let inner = InMemoryTransport::new();
    let down = Arc::new(AtomicBool::new(true));
    let transport = Switchable {
        inner: inner.clone(),
        down: down.clone(),
    };
    let relay = OutboxRelay::new(f.outbox.clone(), Arc::new(transport))
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
    let mut client = f.store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    for env in &envs {
        f.outbox.save(&tx, env).await.unwrap();
    }
    tx.commit().await.unwrap();

    // While the broker is down the first row keeps failing: attempts and the reason are
    // recorded, and nothing is marked published.
    let failures = async {
        loop {
            let row = client
                .query_one(
                    &format!(
                        "SELECT attempts, last_error FROM \"{}\" ORDER BY id LIMIT 1",
                        f.name
                    ),
                    &[],
                )
                .await
                .unwrap();
            let attempts: i32 = row.get(0);
            if attempts >= 2 {
                return row.get::<_, Option<String>>(1);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let reason = tokio::time::timeout(Duration::from_secs(10), failures)
        .await
        .expect("failures recorded");
    assert!(reason.unwrap().contains("broker unreachable"));
    assert_eq!(f.outbox.pending().await.unwrap(), 10);
    assert_eq!(inner.len("orders"), 0);

    down.store(false, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), async {
        while f.outbox.pending().await.unwrap() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the relay resumed");
    stop.send(()).unwrap();
    let stats = running.await.unwrap();
    assert_eq!(stats.published, 10);
    assert!(stats.failed >= 2);
    // Every row once, byte for byte (a failed row is retried after its backoff, so the
    // order across the outage is not kept).
    let mut sent = drain_queue(&inner, "orders").await;
    let mut want: Vec<Vec<u8>> = envs.iter().map(Envelope::encode).collect();
    sent.sort();
    want.sort();
    assert_eq!(sent, want);
    drop(client);
    f.cleanup().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn listen_notify_wakes_the_relay_before_its_poll() {
    let f = Fixture::new("listen").await;
    let outbox = f.outbox.clone().listen(&url());
    let t = InMemoryTransport::new();
    // A poll so long that only a notification can deliver the row in time.
    let relay = OutboxRelay::new(outbox.clone(), Arc::new(t.clone()))
        .poll_interval(Duration::from_secs(60));
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
    // Let the relay's first pass find nothing and the listener subscribe.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut client = f.store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    f.outbox.save(&tx, &order(5)).await.unwrap();
    tx.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while t.len("orders") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the notification woke the relay");
    stop.send(()).unwrap();
    assert_eq!(running.await.unwrap().published, 1);
    drop(client);
    f.cleanup().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn an_expired_claim_is_relayed_by_another_relay() {
    let f = Fixture::new("lease").await;
    let mut client = f.store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    f.outbox.save(&tx, &order(9)).await.unwrap();
    tx.commit().await.unwrap();
    drop(client);
    // A relay claims the row and dies before publishing it.
    let claimed = f
        .outbox
        .fetch_unpublished(10, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let t = InMemoryTransport::new();
    let relay = OutboxRelay::new(f.outbox.clone(), Arc::new(t.clone()));
    assert_eq!(
        relay.drain().await.unwrap().published,
        0,
        "claimed rows are skipped"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(relay.drain().await.unwrap().published, 1);
    assert_eq!(t.len("orders"), 1);
    f.cleanup().await;
}

#[cfg(feature = "schema")]
#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn the_outbox_write_refuses_data_that_breaks_its_schema() {
    use babelqueue_core::schema::{InMemoryProvider, Schemas};
    use babelqueue_runtime::outbox::OutboxError;
    let f = Fixture::new("schema").await;
    let schemas = Schemas::new(InMemoryProvider::new().with(
        "urn:babel:orders:created",
        serde_json::json!({"type": "object", "properties": {"order_id": {"type": "integer", "minimum": 1}}}),
    ));
    let outbox = f.outbox.clone().schemas(Arc::new(schemas));
    let mut client = f.store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let err = outbox.save(&tx, &order(0)).await.unwrap_err();
    let OutboxError::Schema(e) = &err else {
        panic!("not a schema error: {err}")
    };
    let v = e.violation().unwrap();
    assert_eq!((v.path(), v.rule()), ("/order_id", "minimum"));
    outbox.save(&tx, &order(1)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(f.outbox.pending().await.unwrap(), 1);
    drop(client);
    f.cleanup().await;
}
