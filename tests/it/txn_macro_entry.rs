//! The entry points `#[idempotent(transactional | fingerprint | key = …)]` is to expand to
//! (`babelqueue::__private`), called exactly the way generated code calls them: from
//! handlers the runtime spawns (so their futures must be `Send`), with the user's own
//! error type.

use crate::idemp_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use babelqueue::__private::{
    AsyncFingerprintGuard, AsyncTxGuard, Fingerprint, KeySource, PayloadMismatch, SyncTxGuard,
    scoped_key,
};
use babelqueue::postgres::PostgresStore;
use babelqueue::postgres::PostgresStoreError;
use babelqueue::runtime::{App, InMemoryTransport};
use babelqueue::sqlite::{SqliteStore, SqliteStoreError};
use babelqueue::{Envelope, InMemoryStore, idempotent};
use serde_json::json;

use idemp_support::*;

const CHARGE: &str = "urn:babel:payments:charge";

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error(transparent)]
    Postgres(#[from] PostgresStoreError),
    #[error(transparent)]
    Sqlite(#[from] SqliteStoreError),
    #[error(transparent)]
    Replay(#[from] PayloadMismatch),
    #[error("card declined")]
    Declined,
}

impl From<babelqueue::sqlite::rusqlite::Error> for ChargeError {
    fn from(e: babelqueue::sqlite::rusqlite::Error) -> Self {
        ChargeError::Sqlite(e.into())
    }
}

impl From<babelqueue::postgres::tokio_postgres::Error> for ChargeError {
    fn from(e: babelqueue::postgres::tokio_postgres::Error) -> Self {
        ChargeError::Postgres(e.into())
    }
}

type Ret = Result<(), ChargeError>;

fn twice(app: &App, env: &Envelope) -> impl Future<Output = ()> {
    let bytes = env.encode();
    let app = app.clone();
    async move {
        app.publish_raw(bytes.clone()).await.unwrap();
        app.publish_raw(bytes).await.unwrap();
    }
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn async_transactional_entry_point_in_the_runtime() {
    let store = pg_store("entry").await;
    let ledger = format!("{}_ledger", store.table());
    raw_pg()
        .await
        .batch_execute(&format!(
            "CREATE TABLE \"{ledger}\" (message_id TEXT NOT NULL)"
        ))
        .await
        .unwrap();
    let t = InMemoryTransport::new();
    let (s, l) = (store.clone(), ledger.clone());
    let app = App::new(t.clone())
        .queue("q")
        .route_async(CHARGE, move |env: Envelope| {
            let (store, ledger) = (s.clone(), l.clone());
            async move {
                // What `#[idempotent(store = STORE, transactional = tx)]` expands to.
                let key = KeySource::owned_key(&env);
                AsyncTxGuard::<Ret>::guard(&store, key, None, async |tx| -> Ret {
                    tx.execute(
                        &format!("INSERT INTO \"{ledger}\" VALUES ($1)"),
                        &[&env.meta.id],
                    )
                    .await?;
                    Ok(())
                })
                .await
            }
        });
    let env = Envelope::new(CHARGE, json!({"payment_id": "p"}))
        .unwrap()
        .with_queue("q");
    twice(&app, &env).await;
    let stats = app.drain().await.unwrap();
    assert_eq!((stats.succeeded, stats.skipped), (1, 1));
    let rows: i64 = raw_pg()
        .await
        .query_one(&format!("SELECT count(*) FROM \"{ledger}\""), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
    // The fingerprinting variant: the first delivery was remembered without a
    // fingerprint, which is honoured (skipped, the body does not run); a fresh key with a
    // fingerprint then refuses another payload.
    let mut other = env.clone();
    other.data.insert("amount".into(), json!(1));
    let ran = AtomicUsize::new(0);
    let run = async |env: &Envelope, key: Option<String>| {
        AsyncTxGuard::<Ret>::guard_fingerprint(
            &store,
            key,
            Fingerprint::of_envelope(env),
            None,
            async |_tx| -> Ret {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
        )
        .await
    };
    run(&other, KeySource::owned_key(&other)).await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let key = || Some(format!("fp-{}", env.meta.id));
    run(&env, key()).await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let err = run(&other, key()).await.unwrap_err();
    assert!(matches!(err, ChargeError::Replay(_)), "{err:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    pg_drop(&ledger).await;
    pg_drop(&store.table().to_string()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_transactional_entry_point_in_the_runtime() {
    let db = TempDb::new("entry");
    let store = SqliteStore::open(&db.0).unwrap();
    store
        .with_connection(|c| c.execute_batch("CREATE TABLE ledger (message_id TEXT NOT NULL)"))
        .unwrap();
    let t = InMemoryTransport::new();
    let s = store.clone();
    let app = App::new(t.clone())
        .queue("q")
        .route_sync(CHARGE, move |env: &Envelope| {
            // What `#[idempotent(store = STORE, transactional = tx)]` on a sync fn expands
            // to, with a custom key scoped to the handler's URN.
            let key = scoped_key(&env.job, KeySource::owned_key(&env.data["payment_id"]));
            SyncTxGuard::<Ret>::guard_fingerprint(
                &s,
                key,
                Fingerprint::of_envelope(env),
                None,
                |tx| -> Ret {
                    tx.execute("INSERT INTO ledger VALUES (?1)", [&env.meta.id])?;
                    Ok(())
                },
            )
        });
    let first = Envelope::new(CHARGE, json!({"payment_id": "p", "amount": 1}))
        .unwrap()
        .with_queue("q");
    let replay = Envelope::new(CHARGE, json!({"payment_id": "p", "amount": 2}))
        .unwrap()
        .with_queue("q");
    twice(&app, &first).await;
    app.publish_raw(replay.encode()).await.unwrap();
    let stats = app.max_attempts(1).drain().await.unwrap();
    assert_eq!(
        (stats.succeeded, stats.skipped, stats.dead_lettered),
        (1, 1, 1)
    );
    let rows: i64 = store
        .with_connection(|c| c.query_row("SELECT count(*) FROM ledger", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(rows, 1);
    let dead: serde_json::Value = serde_json::from_slice(&t.messages("q.dlq")[0]).unwrap();
    assert_eq!(dead["meta"]["id"], replay.meta.id.as_str());
    assert!(
        dead["dead_letter"]["error"]
            .as_str()
            .unwrap()
            .contains("differs from the first delivery")
    );
}

#[tokio::test]
async fn async_fingerprint_entry_point_in_the_runtime() {
    let store = Arc::new(InMemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let t = InMemoryTransport::new();
    let (s, r) = (store.clone(), runs.clone());
    let app =
        App::new(t.clone())
            .queue("q")
            .max_attempts(1)
            .route_async(CHARGE, move |env: Envelope| {
                let (store, runs) = (s.clone(), r.clone());
                async move {
                    // `#[idempotent(store = STORE, key = env.data["payment_id"], fingerprint)]`
                    let key = scoped_key(&env.job, KeySource::owned_key(&env.data["payment_id"]));
                    AsyncFingerprintGuard::<Ret>::guard(
                        &*store,
                        key,
                        Fingerprint::of_envelope(&env),
                        None,
                        async {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        },
                    )
                    .await
                }
            });
    for amount in [1, 1, 2] {
        let env = Envelope::new(CHARGE, json!({"payment_id": "p", "amount": amount}))
            .unwrap()
            .with_queue("q");
        app.publish_raw(env.encode()).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        (stats.succeeded, stats.skipped, stats.dead_lettered),
        (1, 1, 1)
    );
}

// ---- `#[idempotent(transactional = tx)]` itself ---------------------------------------------

/// The ledger write and the id's row commit together; `fail` rolls both back.
#[idempotent(store = *store, key = env.data.get("payment_id"), transactional = tx)]
fn record_sync(env: &Envelope, store: &SqliteStore) -> Ret {
    tx.execute("INSERT INTO ledger VALUES (?1)", [&env.meta.id])?;
    if env.data.contains_key("fail") {
        return Err(ChargeError::Declined);
    }
    Ok(())
}

/// With a fingerprint: a replay of the key with another payload is refused.
#[idempotent(store = *store, key = env.data.get("payment_id"), transactional = tx, fingerprint)]
fn record_checked(env: &Envelope, store: &SqliteStore) -> Ret {
    tx.execute("INSERT INTO ledger VALUES (?1)", [&env.meta.id])?;
    Ok(())
}

fn ledger_rows(store: &SqliteStore) -> i64 {
    store
        .with_connection(|c| c.query_row("SELECT count(*) FROM ledger", [], |r| r.get(0)))
        .unwrap()
}

#[test]
fn sync_transactional_attribute_commits_the_write_with_the_id() {
    let db = TempDb::new("attr");
    let store = SqliteStore::open(&db.0).unwrap();
    store
        .with_connection(|c| c.execute_batch("CREATE TABLE ledger (message_id TEXT NOT NULL)"))
        .unwrap();
    let charge = |data| Envelope::new(CHARGE, data).unwrap();

    // A failure rolls back the write and leaves the key open for the retry.
    let failing = charge(json!({"payment_id": "p1", "fail": true}));
    assert!(matches!(
        record_sync(&failing, &store),
        Err(ChargeError::Declined)
    ));
    assert_eq!(ledger_rows(&store), 0, "the write was rolled back");
    record_sync(&charge(json!({"payment_id": "p1"})), &store).unwrap();
    record_sync(&charge(json!({"payment_id": "p1"})), &store).unwrap();
    assert_eq!(
        ledger_rows(&store),
        1,
        "the retry ran once, the duplicate skipped"
    );
    // The key was stored in the handler's namespace (its URN).
    let seen = babelqueue::Store::seen(&store, &format!("{CHARGE}#p1")).unwrap();
    assert!(seen);

    let amount = |n: u32| charge(json!({"payment_id": "p2", "amount": n}));
    record_checked(&amount(1), &store).unwrap();
    record_checked(&amount(1), &store).unwrap();
    assert!(matches!(
        record_checked(&amount(2), &store),
        Err(ChargeError::Replay(_))
    ));
    assert_eq!(ledger_rows(&store), 2, "one row per payment");
}

#[idempotent(store = *store, transactional = tx)]
async fn record_async(env: &Envelope, store: &PostgresStore, ledger: &str) -> Ret {
    tx.execute(
        &format!("INSERT INTO \"{ledger}\" VALUES ($1)"),
        &[&env.meta.id],
    )
    .await?;
    if env.data.contains_key("fail") {
        return Err(ChargeError::Declined);
    }
    Ok(())
}

#[idempotent(store = *store, key = env.data.get("payment_id"), transactional = tx, fingerprint)]
async fn record_async_checked(env: Envelope, store: &PostgresStore, ledger: &str) -> Ret {
    tx.execute(
        &format!("INSERT INTO \"{ledger}\" VALUES ($1)"),
        &[&env.meta.id],
    )
    .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn async_transactional_attribute_commits_the_write_with_the_id() {
    let store = pg_store("attr").await;
    let ledger = format!("{}_ledger", store.table());
    raw_pg()
        .await
        .batch_execute(&format!(
            "CREATE TABLE \"{ledger}\" (message_id TEXT NOT NULL)"
        ))
        .await
        .unwrap();
    let rows = async || -> i64 {
        raw_pg()
            .await
            .query_one(&format!("SELECT count(*) FROM \"{ledger}\""), &[])
            .await
            .unwrap()
            .get(0)
    };
    let env = Envelope::new(CHARGE, json!({"payment_id": "p"})).unwrap();
    let mut failing = env.clone();
    failing.data.insert("fail".into(), json!(true));
    assert!(matches!(
        record_async(&failing, &store, &ledger).await,
        Err(ChargeError::Declined)
    ));
    assert_eq!(rows().await, 0, "the write was rolled back with the id");
    record_async(&env, &store, &ledger).await.unwrap();
    record_async(&env, &store, &ledger).await.unwrap();
    assert_eq!(rows().await, 1);

    let amount = |n: u32| Envelope::new(CHARGE, json!({"payment_id": "p", "amount": n})).unwrap();
    record_async_checked(amount(1), &store, &ledger)
        .await
        .unwrap();
    record_async_checked(amount(1), &store, &ledger)
        .await
        .unwrap();
    assert!(matches!(
        record_async_checked(amount(2), &store, &ledger).await,
        Err(ChargeError::Replay(_))
    ));
    assert_eq!(rows().await, 2);
    pg_drop(&ledger).await;
    pg_drop(&store.table().to_string()).await;
}

/// `#[handler]` over `#[idempotent(transactional = tx, fingerprint)]`: the router spawns
/// it, so the generated future must be `Send`; the store comes from the router's state.
#[babelqueue::handler("urn:babel:payments:charge")]
#[idempotent(store = *store, key = env.data.get("payment_id"), transactional = tx, fingerprint)]
async fn routed_charge(
    env: &Envelope,
    store: babelqueue::State<PostgresStore>,
    ledger: babelqueue::State<String>,
) -> Ret {
    tx.execute(
        &format!("INSERT INTO \"{}\" VALUES ($1)", &*ledger),
        &[&env.meta.id],
    )
    .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn transactional_attribute_under_handler_in_the_runtime() {
    let store = pg_store("routed").await;
    let ledger = format!("{}_ledger", store.table());
    raw_pg()
        .await
        .batch_execute(&format!(
            "CREATE TABLE \"{ledger}\" (message_id TEXT NOT NULL)"
        ))
        .await
        .unwrap();
    let t = InMemoryTransport::new();
    let router = babelqueue::Router::new()
        .state(store.clone())
        .state(ledger.clone())
        .register(routed_charge {});
    let app = App::new(t.clone())
        .queue("q")
        .max_attempts(1)
        .router(router);
    let pay = |amount: u32| {
        Envelope::new(CHARGE, json!({"payment_id": "p", "amount": amount}))
            .unwrap()
            .with_queue("q")
    };
    for env in [pay(1), pay(1), pay(2)] {
        app.publish_raw(env.encode()).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!(
        (stats.succeeded, stats.skipped, stats.dead_lettered),
        (1, 1, 1),
        "one charge, one duplicate skipped, one replay with another payload refused"
    );
    let rows: i64 = raw_pg()
        .await
        .query_one(&format!("SELECT count(*) FROM \"{ledger}\""), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
    pg_drop(&ledger).await;
    pg_drop(&store.table().to_string()).await;
}
