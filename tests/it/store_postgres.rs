//! The generic store suite against the PostgreSQL store, over a real server, plus the
//! cross-SDK layout checks with a raw client (the Go SDK's exact statements).
//!
//! Every test needs PostgreSQL (`BABELQUEUE_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`) and fails when it is unreachable; they are
//! ignored by default and CI runs them with `--include-ignored`.

use std::time::{Duration, SystemTime};

use babelqueue::postgres::tokio_postgres::{self, NoTls};
use babelqueue::postgres::{PostgresStore, PostgresStoreError};
use babelqueue::testing::{StoreFactory, StoreSpec};
use babelqueue::{AsyncLeaseStore, AsyncStore, BoxError, Guard, Outcome, lease::Claim};

const NEEDS_PG: &str = "PostgreSQL must be reachable at BABELQUEUE_POSTGRES_URL \
                        (default postgres://postgres@127.0.0.1:5432/test)";

fn url() -> String {
    std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

async fn raw() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&url(), NoTls)
        .await
        .expect(NEEDS_PG);
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A migrated store on table `<namespace>`.
struct Postgres;

impl StoreFactory for Postgres {
    type Store = PostgresStore;

    async fn create(&self, spec: &StoreSpec) -> PostgresStore {
        let mut b = PostgresStore::builder(url()).table(&spec.namespace);
        if let Some(ttl) = spec.ttl {
            b = b.ttl(ttl);
        }
        let store = b.connect().await.expect(NEEDS_PG);
        store.migrate().await.expect(NEEDS_PG);
        store
    }

    fn claim_once<'a>(
        &'a self,
        store: &'a PostgresStore,
        id: &'a str,
    ) -> Option<babelqueue::BoxFuture<'a, bool>> {
        Some(Box::pin(async move {
            store.claim(id, None).await.expect("claim")
        }))
    }

    async fn cleanup(&self, spec: &StoreSpec) {
        raw()
            .await
            .batch_execute(&format!("DROP TABLE IF EXISTS \"{}\"", spec.namespace))
            .await
            .expect("DROP TABLE");
    }
}

babelqueue::store_suite! {
    #[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
    mod postgres_suite = Postgres;
    kinds = [async_store, async_lease];
}

#[test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
fn lease_across_two_processes() {
    babelqueue::testing::lease_across_processes(
        Postgres,
        "store_postgres::lease_across_two_processes",
    );
}

/// A fresh table name, dropped when the guard goes (on success and failure).
struct Table(String);

impl Table {
    fn new() -> Self {
        Table(StoreSpec::fresh().namespace)
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        let name = self.0.clone();
        // Dropping runs outside any runtime the test may have left.
        let _ = std::thread::spawn(move || {
            if let Ok(mut c) = postgres_sync(&url()) {
                let _ = c(&format!("DROP TABLE IF EXISTS \"{name}\""));
            }
        })
        .join();
    }
}

/// A tiny blocking executor for the drop guard.
fn postgres_sync(url: &str) -> Result<impl FnMut(&str) -> Result<(), String>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let (client, conn) = rt
        .block_on(tokio_postgres::connect(url, NoTls))
        .map_err(|e| e.to_string())?;
    rt.spawn(async move {
        let _ = conn.await;
    });
    Ok(move |sql: &str| {
        rt.block_on(client.batch_execute(sql))
            .map_err(|e| e.to_string())
    })
}

/// The Go SDK's statements, verbatim (babelqueue-go idempotency-postgres), for a table.
fn go_migrate(t: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (
	message_id  TEXT        NOT NULL PRIMARY KEY,
	created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
	expires_at  TIMESTAMPTZ NULL
);
CREATE INDEX IF NOT EXISTS {t}_expires_at_idx ON {t} (expires_at)"
    )
}

fn go_claim(t: &str) -> String {
    format!(
        "
INSERT INTO {t} (message_id, created_at, expires_at)
VALUES ($1, now(), $2)
ON CONFLICT (message_id) DO UPDATE
	SET created_at = now(),
	    expires_at = EXCLUDED.expires_at
	WHERE {t}.expires_at IS NOT NULL AND {t}.expires_at <= now()
RETURNING message_id"
    )
}

fn go_seen(t: &str) -> String {
    format!(
        "SELECT 1 FROM {t} WHERE message_id = $1 AND (expires_at IS NULL OR expires_at > now())"
    )
}

async fn go_claims(c: &tokio_postgres::Client, t: &str, id: &str, ttl: Option<Duration>) -> bool {
    let expires: Option<SystemTime> = ttl.map(|d| SystemTime::now() + d);
    !c.query(&go_claim(t), &[&id, &expires])
        .await
        .expect("the Go claim statement")
        .is_empty()
}

async fn go_sees(c: &tokio_postgres::Client, t: &str, id: &str) -> bool {
    !c.query(&go_seen(t), &[&id])
        .await
        .expect("the Go seen statement")
        .is_empty()
}

async fn store_on(table: &str) -> PostgresStore {
    // Kept forever, as the Go SDK writes by default: these tests pin its exact rows.
    let store = PostgresStore::builder(url())
        .table(table)
        .keep_forever()
        .connect()
        .await
        .expect(NEEDS_PG);
    store.migrate().await.expect(NEEDS_PG);
    store
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn migrate_creates_exactly_the_spec_table_concurrently_and_idempotently()
-> Result<(), PostgresStoreError> {
    let t = Table::new();
    let store = PostgresStore::builder(url()).table(&t.0).connect().await?;
    let runs: Vec<_> = (0..8)
        .map(|_| {
            let s = store.clone();
            tokio::spawn(async move { s.migrate().await })
        })
        .collect();
    for r in runs {
        r.await.expect("migrate task")?;
    }
    store.migrate().await?;
    let c = raw().await;
    let cols = c
        .query(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns \
             WHERE table_name = $1 ORDER BY ordinal_position",
            &[&t.0],
        )
        .await?;
    let cols: Vec<(String, String, String)> = cols
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let expect = [
        ("message_id", "text", "NO"),
        ("created_at", "timestamp with time zone", "NO"),
        ("expires_at", "timestamp with time zone", "YES"),
        ("lease_token", "text", "YES"),
        ("lease_expires_at", "timestamp with time zone", "YES"),
        ("fingerprint", "text", "YES"),
        ("fingerprint_at", "timestamp with time zone", "YES"),
    ];
    assert_eq!(
        cols,
        expect
            .iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect::<Vec<_>>()
    );
    let pk: String = c
        .query_one(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a \
             ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = to_regclass($1) AND i.indisprimary",
            &[&t.0],
        )
        .await?
        .get(0);
    assert_eq!(pk, "message_id");
    let index: Option<String> = c
        .query_one(
            "SELECT to_regclass($1)::text",
            &[&format!("{}_expires_at_idx", t.0)],
        )
        .await?
        .get(0);
    assert_eq!(index, Some(format!("{}_expires_at_idx", t.0)));
    let default: Option<String> = c
        .query_one(
            "SELECT column_default FROM information_schema.columns \
             WHERE table_name = $1 AND column_name = 'created_at'",
            &[&t.0],
        )
        .await?
        .get(0);
    assert_eq!(default.as_deref(), Some("now()"));
    Ok(())
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn migrate_extends_a_go_created_table_without_breaking_go() -> Result<(), PostgresStoreError>
{
    let t = Table::new();
    let c = raw().await;
    c.batch_execute(&go_migrate(&t.0)).await?;
    assert!(go_claims(&c, &t.0, "go-before", None).await);

    let store = store_on(&t.0).await;
    assert!(
        store.seen("go-before").await?,
        "a row from before the migration is seen"
    );
    // Go's statements still work on the extended table.
    assert!(go_claims(&c, &t.0, "go-after", Some(Duration::from_secs(60))).await);
    assert!(go_sees(&c, &t.0, "go-after").await);
    assert!(store.seen("go-after").await?);
    assert!(
        !go_claims(&c, &t.0, "go-after", None).await,
        "a live row is not claimed twice"
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn remember_writes_exactly_the_spec_row() -> Result<(), PostgresStoreError> {
    let t = Table::new();
    let store = store_on(&t.0).await;
    let c = raw().await;
    store.remember("plain").await?;
    store
        .remember_for("ttl", Some(Duration::from_secs(60)))
        .await?;
    let row = |id: &'static str| {
        let c = &c;
        let t = &t.0;
        async move {
            c.query_one(
                &format!(
                    "SELECT message_id, extract(epoch FROM now() - created_at)::float8, \
                     extract(epoch FROM expires_at - now())::float8, lease_token, \
                     lease_expires_at IS NULL FROM \"{t}\" WHERE message_id = $1"
                ),
                &[&id],
            )
            .await
        }
    };
    let r = row("plain").await?;
    assert_eq!(r.get::<_, String>(0), "plain");
    assert!(r.get::<_, f64>(1).abs() < 60.0, "created_at is now");
    assert_eq!(r.get::<_, Option<f64>>(2), None, "no TTL: expires_at NULL");
    assert_eq!(r.get::<_, Option<String>>(3), None);
    assert!(r.get::<_, bool>(4));
    let r = row("ttl").await?;
    let left = r.get::<_, Option<f64>>(2).expect("expires_at set");
    assert!(
        (55.0..=60.0).contains(&left),
        "expires_at = now() + 60 s: {left}"
    );
    let n: i64 = c
        .query_one(&format!("SELECT count(*) FROM \"{}\"", t.0), &[])
        .await?
        .get(0);
    assert_eq!(n, 2, "one row per id");
    Ok(())
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn rows_written_the_go_way_are_seen_and_go_sees_rust_rows() -> Result<(), PostgresStoreError>
{
    let t = Table::new();
    let store = store_on(&t.0).await;
    let c = raw().await;

    assert!(go_claims(&c, &t.0, "go-forever", None).await);
    assert!(go_claims(&c, &t.0, "go-ttl", Some(Duration::from_secs(60))).await);
    for id in ["go-forever", "go-ttl"] {
        assert!(store.seen(id).await?, "{id}: a Go row is seen");
        assert!(!store.claim(id, None).await?, "{id}: and not claimed again");
        assert_eq!(
            AsyncLeaseStore::claim(&store, id, Duration::from_secs(30)).await?,
            Claim::Completed,
            "{id}"
        );
    }
    // A Go row whose TTL passed is free again, for both.
    assert!(go_claims(&c, &t.0, "go-expired", Some(Duration::from_millis(200))).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!store.seen("go-expired").await?);
    assert!(store.claim("go-expired", None).await?);

    // Rust-remembered and Rust-completed ids: Go's seen query sees them, its claim loses.
    store.remember("rust-remembered").await?;
    let mut ran = false;
    let out = Guard::new(&store)
        .lease(Duration::from_secs(30))
        .run_async("rust-completed", async {
            ran = true;
            Ok::<(), BoxError>(())
        })
        .await
        .map(Outcome::from)
        .map_err(|e| e.to_string());
    assert_eq!((out, ran), (Ok(Outcome::Ran), true));
    for id in ["rust-remembered", "rust-completed"] {
        assert!(go_sees(&c, &t.0, id).await, "{id}: Go's seen query");
        assert!(!go_claims(&c, &t.0, id, None).await, "{id}: Go's claim");
    }
    Ok(())
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn in_flight_rows_as_the_go_sdk_sees_them() -> Result<(), PostgresStoreError> {
    let t = Table::new();
    let store = store_on(&t.0).await;
    let c = raw().await;

    // Held: Go sees it (and skips its copy) and cannot claim it; never beyond the lease.
    let Claim::Acquired(token) =
        AsyncLeaseStore::claim(&store, "held", Duration::from_millis(600)).await?
    else {
        panic!("a fresh id must be acquired")
    };
    let r = c
        .query_one(
            &format!(
                "SELECT lease_token, expires_at = lease_expires_at FROM \"{}\" WHERE message_id = 'held'",
                t.0
            ),
            &[],
        )
        .await?;
    assert_eq!(
        r.get::<_, Option<String>>(0).as_deref(),
        Some(token.as_str())
    );
    assert!(
        r.get::<_, bool>(1),
        "an in-flight row expires with its lease"
    );
    assert!(go_sees(&c, &t.0, "held").await);
    assert!(!go_claims(&c, &t.0, "held", None).await);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        !go_sees(&c, &t.0, "held").await,
        "an abandoned claim frees the id for Go too"
    );

    // A Go consumer takes the abandoned id over and completes it: Rust must see it
    // completed (not in flight forever, not free), and the old holder cannot finish.
    assert!(go_claims(&c, &t.0, "held", None).await);
    assert_eq!(
        AsyncLeaseStore::claim(&store, "held", Duration::from_secs(30)).await?,
        Claim::Completed
    );
    assert!(!store.complete("held", &token, None).await?);
    assert!(!store.release("held", &token).await?);
    assert!(store.seen("held").await?);

    // Completed by Rust: the lease columns are cleared, exactly a Go row.
    let Claim::Acquired(t2) =
        AsyncLeaseStore::claim(&store, "done", Duration::from_secs(30)).await?
    else {
        panic!("a fresh id must be acquired")
    };
    assert!(store.complete("done", &t2, None).await?);
    let r = c
        .query_one(
            &format!(
                "SELECT expires_at IS NULL, lease_token IS NULL, lease_expires_at IS NULL \
                 FROM \"{}\" WHERE message_id = 'done'",
                t.0
            ),
            &[],
        )
        .await?;
    assert_eq!(
        (
            r.get::<_, bool>(0),
            r.get::<_, bool>(1),
            r.get::<_, bool>(2)
        ),
        (true, true, true)
    );

    // Released: the row is gone and Go claims it.
    let Claim::Acquired(t3) =
        AsyncLeaseStore::claim(&store, "failed", Duration::from_secs(30)).await?
    else {
        panic!("a fresh id must be acquired")
    };
    assert!(store.release("failed", &t3).await?);
    assert!(go_claims(&c, &t.0, "failed", None).await);
    Ok(())
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn purge_expired_deletes_expired_rows_only() -> Result<(), PostgresStoreError> {
    let t = Table::new();
    let store = store_on(&t.0).await;
    store
        .remember_for("a", Some(Duration::from_millis(100)))
        .await?;
    store
        .remember_for("b", Some(Duration::from_millis(100)))
        .await?;
    store.remember("kept").await?;
    let _ = AsyncLeaseStore::claim(&store, "abandoned", Duration::from_millis(100)).await?;
    let _ = AsyncLeaseStore::claim(&store, "held", Duration::from_secs(30)).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.purge_expired().await?, 3);
    assert_eq!(store.purge_expired().await?, 0);
    assert!(store.seen("kept").await? && store.seen("held").await?);
    Ok(())
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn schema_qualified_tables_work() -> Result<(), PostgresStoreError> {
    let schema = StoreSpec::fresh().namespace;
    let c = raw().await;
    c.batch_execute(&format!("CREATE SCHEMA \"{schema}\""))
        .await?;
    let result = async {
        let store = store_on(&format!("{schema}.Idempotency")).await;
        assert_eq!(store.table().to_string(), format!("{schema}.idempotency"));
        store.remember("x").await?;
        let Claim::Acquired(tok) =
            AsyncLeaseStore::claim(&store, "y", Duration::from_secs(5)).await?
        else {
            panic!("a fresh id must be acquired")
        };
        assert!(store.complete("y", &tok, None).await?);
        let n: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM \"{schema}\".idempotency"),
                &[],
            )
            .await?
            .get(0);
        assert_eq!(n, 2);
        Ok::<(), PostgresStoreError>(())
    }
    .await;
    c.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await?;
    result
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn an_unusable_id_is_refused_before_any_io_and_nothing_runs() {
    // PostgreSQL's btree keeps index entries up to ~2.7 KB: a 4 KiB id could not be a
    // primary key. The id rule refuses it (and a NUL, which `text` cannot hold) before
    // any statement, with a typed error; the guard does not run the handler.
    let t = Table::new();
    let store = store_on(&t.0).await;
    let id: String = (0..128)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect();
    for bad in [id.as_str(), "nul\0inside"] {
        let err = store.remember(bad).await.expect_err("an unusable id");
        assert!(
            matches!(err, PostgresStoreError::UnstorableId(_)),
            "{err:?}"
        );
        let mut ran = false;
        let out = Guard::new(&store)
            .lease(Duration::from_secs(5))
            .run_async(bad, async {
                ran = true;
                Ok::<(), BoxError>(())
            })
            .await;
        let err = out.expect_err("refused");
        assert!(!ran);
        assert!(
            babelqueue::store_error::find_unstorable_id(&*err).is_some(),
            "{err:?}"
        );
    }
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_locked_table_answers_within_the_statement_timeout() -> Result<(), PostgresStoreError> {
    let t = Table::new();
    store_on(&t.0).await;
    let store = PostgresStore::builder(url())
        .table(&t.0)
        .statement_timeout(Duration::from_millis(500))
        .connect()
        .await?;
    // Another session holds the test's own table in ACCESS EXCLUSIVE mode.
    let mut locker = raw().await;
    let tx = locker.transaction().await?;
    tx.batch_execute(&format!("LOCK TABLE \"{}\" IN ACCESS EXCLUSIVE MODE", t.0))
        .await?;
    let started = std::time::Instant::now();
    let err = store
        .seen("locked-out")
        .await
        .expect_err("the table is locked");
    let took = started.elapsed();
    assert!(err.is_timeout(), "{err:?}");
    let boxed: BoxError = Box::new(err);
    let marker = babelqueue::store_error::find_unavailable(&*boxed).expect("typed marker");
    assert_eq!(marker.operation, "seen");
    // Configured 500 ms; generous margin for a loaded machine, far below "forever".
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    let err = store.remember("locked-out").await.expect_err("locked");
    assert!(err.is_timeout(), "{err:?}");
    tx.rollback().await?;
    store.remember("locked-out").await?;
    assert!(
        store.seen("locked-out").await?,
        "works again once the lock is gone"
    );
    Ok(())
}

#[test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
fn renewed_lease_across_two_processes() {
    babelqueue::testing::renewed_lease_across_processes(
        Postgres,
        "store_postgres::renewed_lease_across_two_processes",
    );
}

#[tokio::test]
async fn an_unreachable_server_is_an_error() {
    let store = PostgresStore::builder("postgres://postgres@127.0.0.1:1/test")
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("the pool is built lazily");
    let err = store
        .migrate()
        .await
        .expect_err("nothing listens on port 1");
    assert!(err.is_unavailable(), "{err:?}");
    let err = store
        .seen("x")
        .await
        .expect_err("nothing listens on port 1");
    assert!(err.is_unavailable(), "{err:?}");
}
