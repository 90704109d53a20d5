//! Transactional idempotency on SQLite (`BEGIN IMMEDIATE`): the ledger write and the id's
//! row commit together or not at all; threads and processes serialize on the write lock.
//! Real crash: a child process (this test binary again) aborts after its ledger write and
//! before the commit; the restarted consumer handles the redelivery; one ledger row.

use crate::idemp_support;

use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use babelqueue::fingerprint::{Fingerprint, PayloadMismatch};
use babelqueue::sqlite::rusqlite::{self, Transaction};
use babelqueue::sqlite::{SqliteStore, SqliteStoreError};
use babelqueue::{
    BoxError, Envelope, Outcome, Store, guard::capture_outcome, guard::capture_outcome_sync,
};
use serde_json::json;

use idemp_support::*;

const CHARGE: &str = "urn:babel:payments:charge";

fn open(db: &TempDb) -> SqliteStore {
    let store = SqliteStore::open(&db.0).unwrap();
    store
        .with_connection(|c| {
            c.execute_batch(
                "CREATE TABLE IF NOT EXISTS ledger (payment_id TEXT NOT NULL, \
                   amount INTEGER NOT NULL, message_id TEXT NOT NULL)",
            )
        })
        .unwrap();
    store
}

fn rows(store: &SqliteStore, payment_id: &str) -> i64 {
    store
        .with_connection(|c| {
            c.query_row(
                "SELECT count(*) FROM ledger WHERE payment_id = ?1",
                [payment_id],
                |r| r.get(0),
            )
        })
        .unwrap()
}

fn payment(payment_id: &str) -> Envelope {
    Envelope::new(CHARGE, json!({"payment_id": payment_id, "amount": 4200})).unwrap()
}

fn write_ledger(tx: &Transaction<'_>, env: &Envelope) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO ledger (payment_id, amount, message_id) VALUES (?1, ?2, ?3)",
        (
            env.data["payment_id"].as_str(),
            env.data["amount"].as_i64(),
            &env.meta.id,
        ),
    )
    .map(drop)
}

#[test]
fn a_duplicate_is_skipped_and_a_failure_rolls_back_the_write_and_the_id() {
    let db = TempDb::new("txn");
    let store = open(&db);
    let env = payment("pay_dup");
    for expected in [Outcome::Ran, Outcome::Skipped] {
        let (out, captured) = capture_outcome_sync(|| {
            store.transaction(&env, |tx| -> Result<(), SqliteStoreError> {
                Ok(write_ledger(tx, &env)?)
            })
        });
        assert_eq!(out.unwrap(), expected);
        assert_eq!(captured, Some(expected));
    }
    assert_eq!(rows(&store, "pay_dup"), 1);
    assert!(store.seen(&env.meta.id).unwrap());

    let failing = payment("pay_fail");
    let err = store
        .transaction(&failing, |tx| -> Result<(), BoxError> {
            write_ledger(tx, &failing)?;
            Err("card declined".into())
        })
        .unwrap_err();
    assert_eq!(err.to_string(), "card declined");
    assert_eq!(rows(&store, "pay_fail"), 0, "the write was rolled back");
    assert!(!store.seen(&failing.meta.id).unwrap(), "and the id");
    let out = store
        .transaction(&failing, |tx| -> Result<(), SqliteStoreError> {
            Ok(write_ledger(tx, &failing)?)
        })
        .unwrap();
    assert_eq!(out, Outcome::Ran);
    assert_eq!(rows(&store, "pay_fail"), 1);

    // An expired row is taken over: the delivery runs again.
    let short = payment("pay_ttl");
    let run = || {
        store.transaction_with(&short, Some(Duration::from_millis(20)), |tx| {
            write_ledger(tx, &short).map_err(SqliteStoreError::from)
        })
    };
    assert_eq!(run().unwrap(), Outcome::Ran);
    assert_eq!(run().unwrap(), Outcome::Skipped);
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(run().unwrap(), Outcome::Ran);
    assert_eq!(rows(&store, "pay_ttl"), 2);
}

#[test]
fn concurrent_deliveries_from_threads_serialize_and_only_one_commits() {
    let db = TempDb::new("txn-conc");
    let store = open(&db);
    let env = Arc::new(payment("pay_conc"));
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (store, env, barrier) = (store.clone(), env.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                store.transaction(&*env, |tx| -> Result<(), SqliteStoreError> {
                    write_ledger(tx, &env)?;
                    std::thread::sleep(Duration::from_millis(20));
                    Ok(())
                })
            })
        })
        .collect();
    let outcomes: Vec<Outcome> = threads
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Ran).count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(rows(&store, "pay_conc"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_variant_runs_on_the_blocking_pool_and_reports_its_outcome() {
    let db = TempDb::new("txn-async");
    let store = open(&db);
    let env = payment("pay_async");
    for expected in [Outcome::Ran, Outcome::Skipped] {
        let e = env.clone();
        let (out, captured) = capture_outcome(store.transaction_async(&env, None, move |tx| {
            write_ledger(tx, &e).map_err(SqliteStoreError::from)
        }))
        .await;
        assert_eq!(out.unwrap(), expected);
        assert_eq!(captured, Some(expected));
    }
    assert_eq!(rows(&store, "pay_async"), 1);
}

#[test]
fn a_fingerprinted_transaction_refuses_another_payload() {
    let db = TempDb::new("txn-fp");
    let store = open(&db);
    let run = |env: &Envelope| {
        let key = babelqueue::namespace::handler_key(env, None, &env.data["payment_id"]);
        store.transaction_fingerprint(key, Fingerprint::of_envelope(env), None, |tx| {
            write_ledger(tx, env).map_err(BoxError::from)
        })
    };
    assert_eq!(run(&payment("pay_fp")).unwrap(), Outcome::Ran);
    assert_eq!(run(&payment("pay_fp")).unwrap(), Outcome::Skipped);
    let mut other = payment("pay_fp");
    other.data["amount"] = json!(9900);
    let err = run(&other).unwrap_err();
    assert!(err.is::<PayloadMismatch>(), "{err}");
    assert_eq!(rows(&store, "pay_fp"), 1);
}

const CHILD_ENV: &str = "BQ_TXN_SQLITE_CRASH_CHILD";

#[test]
fn a_consumer_killed_before_the_commit_leaves_one_ledger_row_after_the_redelivery() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        // The first consumer: writes its ledger row in the transaction, then dies.
        let (path, bytes) = spec.split_once('|').unwrap();
        let env = Envelope::decode(bytes.as_bytes()).unwrap();
        let store = SqliteStore::open(path).unwrap();
        let _ = store.transaction(&env, |tx| -> Result<(), SqliteStoreError> {
            write_ledger(tx, &env)?;
            eprintln!("child: ledger row written, aborting before the commit");
            std::process::abort();
        });
        unreachable!("the child aborts inside its handler");
    }
    let db = TempDb::new("txn-crash");
    let store = open(&db);
    let env = payment("pay_7f3a");
    let bytes = String::from_utf8(env.encode()).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "txn_sqlite::a_consumer_killed_before_the_commit_leaves_one_ledger_row_after_the_redelivery",
            "--exact",
            "--include-ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, format!("{}|{bytes}", db.0.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the child must die: {stderr}");
    assert!(
        stderr.contains("child: ledger row written, aborting before the commit"),
        "{stderr}"
    );
    // The restarted consumer: a new store on the same file.
    drop(store);
    let store = open(&db);
    assert_eq!(rows(&store, "pay_7f3a"), 0, "the uncommitted write is gone");
    assert!(!store.seen(&env.meta.id).unwrap(), "and so is the id");
    let redelivered = Envelope::decode(bytes.as_bytes()).unwrap();
    for expected in [Outcome::Ran, Outcome::Skipped] {
        let out = store
            .transaction(&redelivered, |tx| -> Result<(), SqliteStoreError> {
                Ok(write_ledger(tx, &redelivered)?)
            })
            .unwrap();
        assert_eq!(out, expected);
    }
    assert_eq!(rows(&store, "pay_7f3a"), 1, "exactly one ledger row");
}

#[test]
fn a_file_locked_past_the_busy_timeout_is_a_store_error_and_the_handler_does_not_run() {
    let db = TempDb::new("txn-busy");
    let store = SqliteStore::builder(&db.0)
        .busy_timeout(Duration::from_millis(50))
        .open()
        .unwrap();
    // Another process (here: another connection) holds the write lock.
    let other = rusqlite::Connection::open(&db.0).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let env = payment("pay_busy");
    let mut ran = false;
    let err = store
        .transaction(&env, |_tx| -> Result<(), SqliteStoreError> {
            ran = true;
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(err, SqliteStoreError::Sqlite(_)), "{err:?}");
    assert!(!ran);
    other.execute_batch("ROLLBACK").unwrap();
    // Once the lock is free, the delivery runs.
    let out = store
        .transaction(&env, |_tx| -> Result<(), SqliteStoreError> { Ok(()) })
        .unwrap();
    assert_eq!(out, Outcome::Ran);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_fingerprint_variant_refuses_another_payload() {
    let db = TempDb::new("txn-async-fp");
    let store = open(&db);
    let run = |env: Envelope| {
        let key = babelqueue::namespace::handler_key(&env, None, &env.data["payment_id"]);
        let fp = Fingerprint::of_envelope(&env);
        store.transaction_async_fingerprint(key, fp, None, move |tx| {
            write_ledger(tx, &env).map_err(BoxError::from)
        })
    };
    assert_eq!(run(payment("pay_afp")).await.unwrap(), Outcome::Ran);
    assert_eq!(run(payment("pay_afp")).await.unwrap(), Outcome::Skipped);
    let mut other = payment("pay_afp");
    other.data["amount"] = json!(1);
    assert!(run(other).await.unwrap_err().is::<PayloadMismatch>());
    assert_eq!(rows(&store, "pay_afp"), 1);
}
