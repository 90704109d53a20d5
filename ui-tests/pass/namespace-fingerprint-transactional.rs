//! `namespace = "..."` / `namespace = none`, `fingerprint`, `transactional = tx` (sync on
//! SQLite, async on PostgreSQL), alone and together.
#![deny(warnings)]

use std::sync::LazyLock;

use babelqueue::postgres::{PostgresStore, PostgresStoreError};
use babelqueue::sqlite::{SqliteStore, SqliteStoreError};
use babelqueue::{Envelope, InMemoryStore, PayloadMismatch, Store, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Sqlite(#[from] SqliteStoreError),
    #[error(transparent)]
    Postgres(#[from] PostgresStoreError),
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

/// Namespaced by the handler's URN (the default).
#[idempotent(store = STORE, key = env.data.get("payment_id"))]
fn charge(env: &Envelope) {
    let _ = env;
}

/// An explicit namespace, shared on purpose; no envelope needed.
#[idempotent(store = STORE, key = payment_id, namespace = "billing")]
async fn bill(payment_id: &str) {
    let _ = payment_id;
}

/// The bare key, as other SDKs write it.
#[idempotent(store = STORE, key = env.data.get("payment_id"), namespace = none, ttl = "7d")]
fn audit(env: Envelope) {
    let _ = env;
}

/// Payload fingerprint on `meta.id`, async.
#[idempotent(store = STORE, fingerprint)]
async fn capture(env: &mut Envelope) -> Result<(), ChargeError> {
    let _ = env;
    Ok(())
}

/// The transaction as `tx`, sync (SQLite), with a fingerprint and a namespaced key.
#[idempotent(store = *db, key = env.data.get("payment_id"), transactional = tx, fingerprint)]
fn record(env: &Envelope, db: &SqliteStore) -> Result<(), ChargeError> {
    tx.execute("INSERT INTO ledger VALUES (?1)", [&env.meta.id])?;
    Ok(())
}

/// The transaction as `txn`, async (PostgreSQL); `?` and early `return` as usual.
#[idempotent(store = *db, transactional = txn, ttl = "30d")]
async fn record_pg(env: Envelope, db: &PostgresStore) -> Result<(), ChargeError> {
    if env.data.is_empty() {
        return Ok(());
    }
    txn.execute("INSERT INTO ledger VALUES ($1)", &[&env.meta.id]).await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let on = |urn: &str| {
        Envelope::new(urn, serde_json::json!({"payment_id": "pay_1"})).unwrap()
    };
    charge(&on("urn:babel:payments:charge"));
    bill("pay_1").await;
    audit(on("urn:babel:payments:audit"));
    capture(&mut on("urn:babel:payments:capture")).await.unwrap();
    let seen = |k: &str| Store::seen(&*STORE, k).unwrap_or_else(|e| match e {});
    assert!(seen("urn:babel:payments:charge#pay_1"));
    assert!(seen("billing#pay_1"));
    assert!(seen("pay_1"));

    let dir = std::env::temp_dir().join(format!("bq-ui-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = SqliteStore::open(dir.join("ledger.db")).unwrap();
    db.with_connection(|c| c.execute_batch("CREATE TABLE ledger (message_id TEXT NOT NULL)"))
        .unwrap();
    let env = on("urn:babel:payments:record");
    record(&env, &db).unwrap();
    record(&env, &db).unwrap();
    let rows: i64 = db
        .with_connection(|c| c.query_row("SELECT count(*) FROM ledger", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(rows, 1);
    let _ = std::fs::remove_dir_all(&dir);
    // `record_pg` needs a server: compiled, not run here.
    let _ = record_pg;
}
