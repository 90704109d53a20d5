//! The entry points `#[idempotent(transactional | fingerprint | key = …)]` is to expand to
//! (`babelqueue::__private`), called exactly the way generated code calls them: from
//! handlers the runtime spawns (so their futures must be `Send`), with the user's own
//! error type.

mod idemp_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use babelqueue::__private::{
    AsyncFingerprintGuard, AsyncTxGuard, Fingerprint, KeySource, PayloadMismatch, SyncTxGuard,
    scoped_key,
};
use babelqueue::postgres::PostgresStoreError;
use babelqueue::runtime::{App, InMemoryTransport};
use babelqueue::sqlite::{SqliteStore, SqliteStoreError};
use babelqueue::{Envelope, InMemoryStore};
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
