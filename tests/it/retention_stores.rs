//! Retention on every store: the documented default (7 days) is what each store writes,
//! `ttl` overrides it, `keep_forever` writes no expiry, and the PostgreSQL and SQLite
//! purgers delete expired rows in batches on a schedule without waiting on handlers.

use crate::idemp_support;

use std::time::Duration;

use babelqueue::redis::redis::AsyncCommands;
use babelqueue::sqlite::SqliteStore;
use babelqueue::{AsyncStore, InMemoryStore, Store, retention::DEFAULT_RETENTION};

use idemp_support::*;

const WEEK_S: f64 = 7.0 * 24.0 * 3600.0;

#[test]
fn the_default_is_seven_days() {
    assert_eq!(DEFAULT_RETENTION, Duration::from_secs(604_800));
}

#[test]
fn memory_store_default_override_and_forever() {
    assert_eq!(InMemoryStore::new().ttl(), Some(DEFAULT_RETENTION));
    assert_eq!(
        InMemoryStore::with_capacity(10).ttl(),
        Some(DEFAULT_RETENTION)
    );
    let short = InMemoryStore::builder()
        .ttl(Duration::from_millis(20))
        .build();
    Store::remember(&short, "a").unwrap();
    assert!(Store::seen(&short, "a").unwrap());
    std::thread::sleep(Duration::from_millis(40));
    assert!(!Store::seen(&short, "a").unwrap(), "expired after its ttl");
    let forever = InMemoryStore::builder()
        .ttl(Duration::from_millis(1))
        .keep_forever()
        .build();
    assert_eq!(forever.ttl(), None);
    Store::remember(&forever, "a").unwrap();
    std::thread::sleep(Duration::from_millis(10));
    assert!(Store::seen(&forever, "a").unwrap());
}

/// `(created_at, expires_at)` of a SQLite row, in Unix ms.
fn sqlite_row(store: &SqliteStore, id: &str) -> (i64, Option<i64>) {
    store
        .with_connection(|c| {
            c.query_row(
                &format!(
                    "SELECT created_at, expires_at FROM \"{}\" WHERE message_id = ?1",
                    store.table()
                ),
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap()
}

#[test]
fn sqlite_store_default_override_and_forever() {
    let db = TempDb::new("ret");
    let store = SqliteStore::open(&db.0).unwrap();
    assert_eq!(store.ttl(), Some(DEFAULT_RETENTION));
    Store::remember(&store, "default").unwrap();
    let (created, expires) = sqlite_row(&store, "default");
    assert_eq!(expires, Some(created + 604_800_000));
    Store::remember_for(&store, "override", Some(Duration::from_secs(60))).unwrap();
    let (created, expires) = sqlite_row(&store, "override");
    assert_eq!(expires, Some(created + 60_000));
    let forever = SqliteStore::builder(&db.0)
        .table("forever")
        .keep_forever()
        .open()
        .unwrap();
    Store::remember(&forever, "x").unwrap();
    assert_eq!(sqlite_row(&forever, "x").1, None);
}

#[test]
fn sqlite_purger_deletes_expired_rows_in_batches_and_keeps_the_rest() {
    let db = TempDb::new("purge");
    let store = SqliteStore::open(&db.0).unwrap();
    let forever = SqliteStore::builder(&db.0).keep_forever().open().unwrap();
    // 2,500 rows that expired a minute ago, 10 live ones, 5 kept forever.
    store
        .with_connection(|c| {
            let tx = c.transaction()?;
            {
                let mut ins = tx.prepare(
                    "INSERT INTO babelqueue_idempotency (message_id, created_at, expires_at) \
                     VALUES (?1, 0, (unixepoch('now') - 60) * 1000)",
                )?;
                for i in 0..2500 {
                    ins.execute([format!("old-{i}")])?;
                }
            }
            tx.commit()
        })
        .unwrap();
    for i in 0..10 {
        Store::remember(&store, &format!("live-{i}")).unwrap();
    }
    for i in 0..5 {
        Store::remember(&forever, &format!("forever-{i}")).unwrap();
    }
    assert_eq!(store.purge_expired_batch(100).unwrap(), 100, "one batch");
    let purger = store.spawn_purger_with(Duration::from_secs(3600), 1000);
    let report = purger.wait_for_passes(1);
    assert_eq!(report.deleted, 2400, "{report:?}");
    assert_eq!(report.last_error, None);
    purger.stop();
    let left: i64 = store
        .with_connection(|c| {
            c.query_row("SELECT count(*) FROM babelqueue_idempotency", [], |r| {
                r.get(0)
            })
        })
        .unwrap();
    assert_eq!(left, 15, "live and kept-forever rows stay");
    assert!(Store::seen(&store, "live-3").unwrap() && Store::seen(&store, "forever-4").unwrap());
}

#[test]
fn sqlite_purger_runs_on_its_schedule() {
    let db = TempDb::new("purge-sched");
    let store = SqliteStore::builder(&db.0)
        .ttl(Duration::from_millis(1))
        .open()
        .unwrap();
    let purger = store.spawn_purger(Duration::from_millis(10));
    purger.wait_for_passes(1);
    Store::remember(&store, "soon-gone").unwrap();
    std::thread::sleep(Duration::from_millis(5));
    // The ids expire within a millisecond; later passes delete them.
    let report = purger.wait_for_passes(5);
    assert!(report.passes >= 5);
    assert_eq!(report.deleted, 1, "{report:?}");
    drop(purger); // stops and joins the thread
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn redis_store_default_override_and_forever() {
    let store = redis_store("ret").await;
    assert_eq!(store.ttl(), Some(DEFAULT_RETENTION));
    let mut conn = raw_redis().await;
    AsyncStore::remember(&store, "default").await.unwrap();
    let pttl: i64 = conn.pttl(store.key("default")).await.unwrap();
    assert!(
        (604_800_000 - 60_000..=604_800_000).contains(&pttl),
        "PX 7 days: {pttl}"
    );
    AsyncStore::remember_for(&store, "override", Some(Duration::from_secs(60)))
        .await
        .unwrap();
    let pttl: i64 = conn.pttl(store.key("override")).await.unwrap();
    assert!((50_000..=60_000).contains(&pttl), "{pttl}");
    let forever = store.clone().with_ttl(None);
    AsyncStore::remember(&forever, "forever").await.unwrap();
    let pttl: i64 = conn.pttl(store.key("forever")).await.unwrap();
    assert_eq!(pttl, -1);
    let built = babelqueue::redis::RedisStore::builder(redis_url())
        .keep_forever()
        .connect()
        .await
        .unwrap();
    assert_eq!(built.ttl(), None);
    redis_cleanup(&store).await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn postgres_store_default_override_and_forever() {
    let store = pg_store("ret").await;
    let t = store.table().to_string();
    assert_eq!(store.ttl(), Some(DEFAULT_RETENTION));
    AsyncStore::remember(&store, "default").await.unwrap();
    AsyncStore::remember_for(&store, "override", Some(Duration::from_secs(60)))
        .await
        .unwrap();
    AsyncStore::remember(&store.clone().with_ttl(None), "forever")
        .await
        .unwrap();
    let c = raw_pg().await;
    let left = |id: &'static str| {
        let (c, t) = (&c, &t);
        async move {
            c.query_one(
                &format!(
                    "SELECT extract(epoch FROM expires_at - created_at)::float8 \
                     FROM \"{t}\" WHERE message_id = $1"
                ),
                &[&id],
            )
            .await
            .unwrap()
            .get::<_, Option<f64>>(0)
        }
    };
    assert_eq!(left("default").await, Some(WEEK_S));
    assert_eq!(left("override").await, Some(60.0));
    assert_eq!(left("forever").await, None);
    pg_drop(&t).await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn postgres_purger_deletes_in_batches_and_skips_rows_a_handler_holds() {
    let store = pg_store("purge").await;
    let t = store.table().to_string();
    let c = raw_pg().await;
    c.batch_execute(&format!(
        "INSERT INTO \"{t}\" (message_id, created_at, expires_at) \
           SELECT 'old-' || i, now() - interval '8 days', now() - interval '1 day' \
           FROM generate_series(1, 2500) AS i; \
         INSERT INTO \"{t}\" (message_id, expires_at) \
           SELECT 'live-' || i, now() + interval '7 days' FROM generate_series(1, 10) AS i; \
         INSERT INTO \"{t}\" (message_id, expires_at) \
           SELECT 'forever-' || i, NULL FROM generate_series(1, 5) AS i;"
    ))
    .await
    .unwrap();
    // A handler's transaction holds one expired row (as a transactional handler taking
    // an expired id over does): the purger must not wait for it.
    let mut holder = raw_pg().await;
    let held = holder.transaction().await.unwrap();
    held.execute(
        &format!("SELECT 1 FROM \"{t}\" WHERE message_id = 'old-7' FOR UPDATE"),
        &[],
    )
    .await
    .unwrap();

    assert_eq!(store.purge_expired_batch(100).await.unwrap(), 100);
    let purger = store.spawn_purger_with(Duration::from_millis(50), 1000);
    let report = tokio::time::timeout(Duration::from_secs(30), purger.wait_for_passes(1))
        .await
        .expect("a pass completes while a handler holds a row");
    assert_eq!(report.deleted, 2399, "{report:?}");
    assert_eq!(report.last_error, None);
    held.rollback().await.unwrap();
    // The next passes take the row the handler held.
    let report = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let r = purger.wait_for_passes(purger.report().passes + 1).await;
            if r.deleted >= 2400 {
                return r;
            }
        }
    })
    .await
    .expect("the held row is purged once released");
    assert_eq!(report.deleted, 2400);
    purger.stop();
    let left: i64 = c
        .query_one(&format!("SELECT count(*) FROM \"{t}\""), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 15, "live and kept-forever rows stay");
    pg_drop(&t).await;
}
