//! Payload fingerprints on every store: the same key with the same payload is skipped, with
//! a different payload it is refused with `PayloadMismatch`, and a key written without a
//! fingerprint (another SDK: Redis value `1`, a NULL column) is honoured as "no
//! fingerprint". Plus the runtime: a mismatch is dead-lettered as `failed`.

use crate::idemp_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use babelqueue::fingerprint::{AsyncFingerprintStore, Fingerprint, Lookup, PayloadMismatch};
use babelqueue::namespace::handler_key;
use babelqueue::redis::redis::AsyncCommands;
use babelqueue::runtime::{App, InMemoryTransport};
use babelqueue::sqlite::SqliteStore;
use babelqueue::{
    AsyncStore, BoxError, Envelope, Guard, InMemoryStore, Outcome, store::IntoHandlerError,
};
use serde_json::json;

use idemp_support::*;

const CHARGE: &str = "urn:babel:payments:charge";

fn fp(amount: i64) -> Fingerprint {
    Fingerprint::of_data(&json!({"payment_id": "pay_7f3a", "amount": amount}))
}

/// Runs the fingerprinting guard; returns the outcome or the mismatch.
async fn deliver<S>(
    store: &S,
    key: &str,
    fingerprint: Fingerprint,
    runs: &AtomicUsize,
) -> Result<Outcome, PayloadMismatch>
where
    S: AsyncFingerprintStore,
    S::Error: IntoHandlerError<BoxError>,
{
    let out = Guard::new(store)
        .fingerprint(fingerprint)
        .run_async(key, async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<(), BoxError>(())
        })
        .await;
    match out {
        Ok(o) => Ok(o.outcome),
        Err(e) => Err(e
            .downcast_ref::<PayloadMismatch>()
            .cloned()
            .unwrap_or_else(|| panic!("not a mismatch: {e}"))),
    }
}

/// The cases every store must pass; `key_prefix` keeps runs apart.
async fn scenario<S>(store: &S, key_prefix: &str) -> String
where
    S: AsyncFingerprintStore,
    S::Error: IntoHandlerError<BoxError> + std::fmt::Debug,
{
    let runs = AtomicUsize::new(0);
    let k1 = format!("{key_prefix}k1");
    assert_eq!(deliver(store, &k1, fp(4200), &runs).await, Ok(Outcome::Ran));
    assert_eq!(
        deliver(store, &k1, fp(4200), &runs).await,
        Ok(Outcome::Skipped)
    );
    let m = deliver(store, &k1, fp(9900), &runs).await.unwrap_err();
    assert_eq!(
        (m.key.as_str(), m.stored, m.received),
        (k1.as_str(), fp(4200), fp(9900))
    );
    assert!(
        m.to_string()
            .contains("differs from the first delivery of that key"),
        "{m}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the mismatch did not run");
    assert_eq!(
        store.lookup(&k1).await.unwrap(),
        Lookup::Seen {
            fingerprint: Some(fp(4200))
        }
    );
    // Remembered without a fingerprint (a handler without `fingerprint`): honoured.
    let k2 = format!("{key_prefix}k2");
    AsyncStore::remember(store, &k2).await.unwrap();
    assert_eq!(
        deliver(store, &k2, fp(9900), &runs).await,
        Ok(Outcome::Skipped)
    );
    // Forgotten: the next delivery runs and writes its own fingerprint.
    AsyncStore::forget(store, &k1).await.unwrap();
    assert_eq!(store.lookup(&k1).await.unwrap(), Lookup::Unseen);
    assert_eq!(deliver(store, &k1, fp(9900), &runs).await, Ok(Outcome::Ran));
    assert_eq!(
        deliver(store, &k1, fp(4200), &runs)
            .await
            .unwrap_err()
            .stored,
        fp(9900)
    );
    // Expiry takes the fingerprint with it. The TTL leaves a loaded machine time for the
    // lookup before it ends (the in-memory store runs on paused time, where it is exact).
    let k3 = format!("{key_prefix}k3");
    store
        .remember_fingerprint(&k3, &fp(1), Some(Duration::from_millis(500)))
        .await
        .unwrap();
    assert!(matches!(
        store.lookup(&k3).await.unwrap(),
        Lookup::Seen { fingerprint: Some(f) } if f == fp(1)
    ));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(store.lookup(&k3).await.unwrap(), Lookup::Unseen);
    assert_eq!(deliver(store, &k3, fp(2), &runs).await, Ok(Outcome::Ran));
    k1
}

// Paused time: the store, built on it, follows tokio's clock (`StoreClock::Auto`), so its
// TTL ends exactly when the test's sleep has advanced past it, whatever the machine's load.
#[tokio::test(start_paused = true)]
async fn memory_store_fingerprints() {
    let store = InMemoryStore::new();
    assert_eq!(store.clock(), babelqueue::memory::StoreClock::Tokio);
    scenario(&store, "").await;
}

#[test]
fn memory_store_fingerprints_blocking_guard() {
    let store = InMemoryStore::new();
    let run = |amount| {
        Guard::new(&store)
            .fingerprint(fp(amount))
            .run("k", || Ok::<(), BoxError>(()))
    };
    assert_eq!(run(1).unwrap(), Outcome::Ran);
    assert_eq!(run(1).unwrap(), Outcome::Skipped);
    assert!(run(2).unwrap_err().is::<PayloadMismatch>());
}

#[tokio::test]
async fn sqlite_store_fingerprints() {
    let db = TempDb::new("fp");
    let store = SqliteStore::open(&db.0).unwrap();
    let k1 = scenario(&store, "").await;
    let stored: Option<String> = store
        .with_connection(|c| {
            c.query_row(
                "SELECT fingerprint FROM babelqueue_idempotency WHERE message_id = ?1",
                [&k1],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert_eq!(stored, Some(fp(9900).to_string()));
}

#[tokio::test]
async fn sqlite_file_from_before_fingerprints_gains_the_columns() {
    let db = TempDb::new("fp-old");
    {
        let c = babelqueue::sqlite::rusqlite::Connection::open(&db.0).unwrap();
        c.execute_batch(
            "CREATE TABLE babelqueue_idempotency (
                message_id TEXT NOT NULL PRIMARY KEY, created_at INTEGER NOT NULL,
                expires_at INTEGER NULL, lease_token TEXT NULL, lease_expires_at INTEGER NULL
             ) WITHOUT ROWID;
             INSERT INTO babelqueue_idempotency VALUES ('old', 1, NULL, NULL, NULL);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&db.0).unwrap();
    assert_eq!(
        AsyncFingerprintStore::lookup(&store, "old").await.unwrap(),
        Lookup::Seen { fingerprint: None }
    );
    scenario(&store, "new-").await;
    // Opening again (another process, a restart) changes nothing.
    drop(store);
    let again = SqliteStore::open(&db.0).unwrap();
    assert!(AsyncStore::seen(&again, "old").await.unwrap());
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn redis_store_fingerprints() {
    let store = redis_store("fp").await;
    let k1 = scenario(&store, "").await;
    let mut conn = raw_redis().await;
    let value: Option<String> = conn.get(store.key(&k1)).await.unwrap();
    assert_eq!(
        value,
        Some(fp(9900).to_string()),
        "the value is the fingerprint"
    );
    // What the Go SDK writes: `1`. Honoured as "no fingerprint".
    let _: () = conn.set(store.key("go"), "1").await.unwrap();
    let runs = AtomicUsize::new(0);
    assert_eq!(
        deliver(&store, "go", fp(5), &runs).await,
        Ok(Outcome::Skipped)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // And a fingerprinted key is still seen by the Go SDK's EXISTS.
    let exists: bool = conn.exists(store.key(&k1)).await.unwrap();
    assert!(exists);
    redis_cleanup(&store).await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn postgres_store_fingerprints() {
    let store = pg_store("fp").await;
    let t = store.table().to_string();
    let k1 = scenario(&store, "").await;
    let c = raw_pg().await;
    let row = c
        .query_one(
            &format!("SELECT fingerprint FROM \"{t}\" WHERE message_id = $1"),
            &[&k1],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0), Some(fp(9900).to_string()));
    pg_drop(&t).await;
}

/// The Go SDK's claim statement (SPEC section 3).
fn go_claim(t: &str) -> String {
    format!(
        "INSERT INTO \"{t}\" (message_id, created_at, expires_at) VALUES ($1, now(), NULL) \
         ON CONFLICT (message_id) DO UPDATE SET created_at = now(), expires_at = EXCLUDED.expires_at \
         WHERE \"{t}\".expires_at IS NOT NULL AND \"{t}\".expires_at <= now() RETURNING message_id"
    )
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn postgres_go_layout_table_gains_nullable_columns_and_go_rows_have_no_fingerprint() {
    let t = format!("bqt_fp_go_{}", unique());
    let c = raw_pg().await;
    // The Go SDK's table, with one of its rows.
    c.batch_execute(&format!(
        "CREATE TABLE \"{t}\" (message_id TEXT PRIMARY KEY, \
           created_at TIMESTAMPTZ NOT NULL DEFAULT now(), expires_at TIMESTAMPTZ NULL); \
         CREATE INDEX \"{t}_expires_at_idx\" ON \"{t}\" (expires_at);"
    ))
    .await
    .unwrap();
    assert_eq!(c.query(&go_claim(&t), &[&"go-id"]).await.unwrap().len(), 1);
    let store = babelqueue::postgres::PostgresStore::builder(pg_url())
        .table(&t)
        .connect()
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let nullable: Vec<(String, String)> = c
        .query(
            "SELECT column_name, is_nullable FROM information_schema.columns \
             WHERE table_name = $1 AND column_name LIKE 'fingerprint%' ORDER BY 1",
            &[&t],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        nullable,
        vec![
            ("fingerprint".to_owned(), "YES".to_owned()),
            ("fingerprint_at".to_owned(), "YES".to_owned())
        ]
    );
    let runs = AtomicUsize::new(0);
    assert_eq!(
        deliver(&store, "go-id", fp(1), &runs).await,
        Ok(Outcome::Skipped),
        "a Go row reads as no fingerprint"
    );

    // A Rust row with a fingerprint expires; the Go SDK takes it over (its statement does
    // not know the column): the stale fingerprint must not count.
    store
        .remember_fingerprint("taken", &fp(1), Some(Duration::from_millis(20)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(c.query(&go_claim(&t), &[&"taken"]).await.unwrap().len(), 1);
    assert_eq!(
        store.lookup("taken").await.unwrap(),
        Lookup::Seen { fingerprint: None }
    );
    assert_eq!(
        deliver(&store, "taken", fp(2), &runs).await,
        Ok(Outcome::Skipped)
    );
    // A fingerprinted Rust row is seen by the Go SDK's query.
    assert_eq!(
        deliver(&store, "rust", fp(3), &runs).await,
        Ok(Outcome::Ran)
    );
    let go_seen = c
        .query(
            &format!(
                "SELECT 1 FROM \"{t}\" WHERE message_id = $1 \
                 AND (expires_at IS NULL OR expires_at > now())"
            ),
            &[&"rust"],
        )
        .await
        .unwrap();
    assert_eq!(go_seen.len(), 1);
    pg_drop(&t).await;
}

/// A mismatch goes through the runtime as a handler failure: retried, then dead-lettered
/// with reason `failed` and the mismatch in `dead_letter.error`.
#[tokio::test]
async fn the_runtime_dead_letters_a_mismatch_as_failed() {
    let t = InMemoryTransport::new();
    let store = Arc::new(InMemoryStore::new());
    let charges = Arc::new(AtomicUsize::new(0));
    let (st, ch) = (store.clone(), charges.clone());
    let app = App::new(t.clone())
        .queue("payments")
        .route_async(CHARGE, move |env: Envelope| {
            let (st, ch) = (st.clone(), ch.clone());
            async move {
                let key = handler_key(&env, None, &env.data["payment_id"]);
                Guard::new(&*st)
                    .fingerprint(Fingerprint::of_envelope(&env))
                    .run_async(key, async {
                        ch.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), BoxError>(())
                    })
                    .await
                    .map(drop)
            }
        });
    let first = Envelope::new(CHARGE, json!({"payment_id": "pay_7f3a", "amount": 4200}))
        .unwrap()
        .with_queue("payments");
    // Same data, keys in another order, another message: the same payload, skipped.
    let reordered = Envelope::new(CHARGE, json!({"amount": 4200, "payment_id": "pay_7f3a"}))
        .unwrap()
        .with_queue("payments");
    let replay_bug = Envelope::new(CHARGE, json!({"payment_id": "pay_7f3a", "amount": 9900}))
        .unwrap()
        .with_queue("payments");
    for env in [&first, &reordered, &replay_bug] {
        app.publish_raw(env.encode()).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    assert_eq!((stats.skipped, stats.dead_lettered), (1, 1));
    let dlq = t.messages("payments.dlq");
    assert_eq!(dlq.len(), 1);
    let dead: serde_json::Value = serde_json::from_slice(&dlq[0]).unwrap();
    assert_eq!(dead["meta"]["id"], replay_bug.meta.id.as_str());
    assert_eq!(dead["dead_letter"]["reason"], "failed");
    let error = dead["dead_letter"]["error"].as_str().unwrap();
    assert!(
        error.contains("differs from the first delivery of that key"),
        "{error}"
    );
    assert!(error.contains(&format!("{CHARGE}#pay_7f3a")), "{error}");
}
