//! Transactional idempotency on PostgreSQL: the handler's ledger write and the id's row
//! commit together or not at all. Real crashes: a child process (this test binary, run
//! again) aborts after its ledger write and before the commit; the restarted consumer
//! handles the redelivery; the ledger has exactly one row.

use crate::idemp_support;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use babelqueue::fingerprint::{Fingerprint, PayloadMismatch};
use babelqueue::postgres::{PostgresStore, PostgresStoreError};
use babelqueue::{AsyncStore, BoxError, Envelope, Outcome, guard::capture_outcome};
use serde_json::json;

use idemp_support::*;

const CHARGE: &str = "urn:babel:payments:charge";

/// A fresh store table plus a ledger table, both dropped by `cleanup`.
struct Fixture {
    store: PostgresStore,
    ledger: String,
}

impl Fixture {
    async fn new(tag: &str) -> Self {
        let store = pg_store(tag).await;
        let ledger = format!("{}_ledger", store.table());
        raw_pg()
            .await
            .batch_execute(&format!(
                "CREATE TABLE \"{ledger}\" (payment_id TEXT NOT NULL, amount BIGINT NOT NULL, \
                   message_id TEXT NOT NULL)"
            ))
            .await
            .expect(NEEDS_PG);
        Fixture { store, ledger }
    }

    async fn rows(&self, payment_id: &str) -> i64 {
        raw_pg()
            .await
            .query_one(
                &format!(
                    "SELECT count(*) FROM \"{}\" WHERE payment_id = $1",
                    self.ledger
                ),
                &[&payment_id],
            )
            .await
            .unwrap()
            .get(0)
    }

    async fn cleanup(self) {
        pg_drop(&self.ledger).await;
        pg_drop(&self.store.table().to_string()).await;
    }
}

fn payment(payment_id: &str) -> Envelope {
    Envelope::new(CHARGE, json!({"payment_id": payment_id, "amount": 4200})).unwrap()
}

/// The ledger write every test's handler makes, through the store's transaction.
async fn write_ledger(
    tx: &babelqueue::postgres::deadpool_postgres::Transaction<'_>,
    ledger: &str,
    env: &Envelope,
) -> Result<(), PostgresStoreError> {
    tx.execute(
        &format!("INSERT INTO \"{ledger}\" (payment_id, amount, message_id) VALUES ($1, $2, $3)"),
        &[
            &env.data["payment_id"].as_str(),
            &env.data["amount"].as_i64(),
            &env.meta.id,
        ],
    )
    .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_duplicate_is_skipped_and_a_failure_rolls_back_the_write_and_the_id() {
    let fx = Fixture::new("txn").await;
    let (store, ledger) = (&fx.store, fx.ledger.as_str());
    let env = payment("pay_dup");
    for expected in [Outcome::Ran, Outcome::Skipped, Outcome::Skipped] {
        let (out, captured) = capture_outcome(
            store.transaction(&env, async |tx| write_ledger(tx, ledger, &env).await),
        )
        .await;
        assert_eq!(out.unwrap(), expected);
        assert_eq!(captured, Some(expected), "the runtime learns the outcome");
    }
    assert_eq!(fx.rows("pay_dup").await, 1);
    // Other SDKs see the committed id, by their own query.
    let go_seen = raw_pg()
        .await
        .query(
            &format!(
                "SELECT 1 FROM \"{}\" WHERE message_id = $1 \
                 AND (expires_at IS NULL OR expires_at > now())",
                store.table()
            ),
            &[&env.meta.id],
        )
        .await
        .unwrap();
    assert_eq!(go_seen.len(), 1);

    // A handler that writes and then fails: both its write and the id are rolled back.
    let failing = payment("pay_fail");
    let err = store
        .transaction(&failing, async |tx| {
            write_ledger(tx, ledger, &failing).await?;
            Err::<(), BoxError>("card declined".into())
        })
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "card declined");
    assert_eq!(fx.rows("pay_fail").await, 0, "the write was rolled back");
    assert!(!store.seen(&failing.meta.id).await.unwrap(), "the id too");
    // The retry runs, once.
    let out = store
        .transaction(&failing, async |tx| {
            write_ledger(tx, ledger, &failing).await
        })
        .await
        .unwrap();
    assert_eq!(out, Outcome::Ran);
    assert_eq!(fx.rows("pay_fail").await, 1);

    // No usable id: the handler runs in a transaction, nothing is remembered.
    let mut anonymous = payment("pay_anon");
    anonymous.meta.id.clear();
    for _ in 0..2 {
        let out = store
            .transaction(&anonymous, async |tx| {
                write_ledger(tx, ledger, &anonymous).await
            })
            .await
            .unwrap();
        assert_eq!(out, Outcome::RanWithoutKey);
    }
    assert_eq!(fx.rows("pay_anon").await, 2, "fail open");
    fx.cleanup().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn concurrent_deliveries_of_one_id_serialize_and_only_one_commits() {
    let fx = Fixture::new("txn_conc").await;
    let env = Arc::new(payment("pay_conc"));
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (store, ledger, env, barrier) = (
                fx.store.clone(),
                fx.ledger.clone(),
                env.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .transaction(&*env, async |tx| {
                        write_ledger(tx, &ledger, &env).await?;
                        // Hold the row while the others queue up behind it.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<(), PostgresStoreError>(())
                    })
                    .await
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap().unwrap());
    }
    let ran = outcomes.iter().filter(|o| **o == Outcome::Ran).count();
    assert_eq!(ran, 1, "{outcomes:?}");
    assert_eq!(fx.rows("pay_conc").await, 1);
    fx.cleanup().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_delivery_waiting_on_a_failing_one_runs_after_its_rollback() {
    let fx = Fixture::new("txn_wait").await;
    let env = Arc::new(payment("pay_wait"));
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (store, ledger, env) = (fx.store.clone(), fx.ledger.clone(), env.clone());
        tokio::spawn(async move {
            store
                .transaction(&*env, async |tx| {
                    write_ledger(tx, &ledger, &env).await?;
                    let _ = claimed_tx.send(());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Err::<(), BoxError>("first delivery fails".into())
                })
                .await
        })
    };
    claimed_rx.await.unwrap(); // the first holds the row now
    let second = fx
        .store
        .transaction(&*env, async |tx| write_ledger(tx, &fx.ledger, &env).await)
        .await
        .unwrap();
    assert!(first.await.unwrap().is_err());
    assert_eq!(
        second,
        Outcome::Ran,
        "it waited, then ran after the rollback"
    );
    assert_eq!(fx.rows("pay_wait").await, 1);
    fx.cleanup().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_fingerprinted_transaction_refuses_another_payload() {
    let fx = Fixture::new("txn_fp").await;
    let (store, ledger) = (&fx.store, fx.ledger.as_str());
    let first = payment("pay_fp");
    let mut other = payment("pay_fp");
    other.data["amount"] = json!(9900);
    let key =
        |env: &Envelope| babelqueue::namespace::handler_key(env, None, &env.data["payment_id"]);
    let run = async |env: &Envelope| {
        store
            .transaction_fingerprint(key(env), Fingerprint::of_envelope(env), None, async |tx| {
                write_ledger(tx, ledger, env).await.map_err(BoxError::from)
            })
            .await
    };
    assert_eq!(run(&first).await.unwrap(), Outcome::Ran);
    assert_eq!(run(&payment("pay_fp")).await.unwrap(), Outcome::Skipped);
    let err = run(&other).await.unwrap_err();
    let m = err
        .downcast_ref::<PayloadMismatch>()
        .expect("a PayloadMismatch");
    assert_eq!(m.key, format!("{CHARGE}#pay_fp"));
    assert_eq!(fx.rows("pay_fp").await, 1);
    fx.cleanup().await;
}

const CHILD_ENV: &str = "BQ_TXN_PG_CRASH_CHILD";

/// One consumer process: handles `env` transactionally and aborts after the ledger write,
/// before the commit.
async fn crashing_consumer(table: &str, ledger: &str, env: &Envelope) -> ! {
    let store = PostgresStore::builder(pg_url())
        .table(table)
        .connect()
        .await
        .expect(NEEDS_PG);
    let _ = store
        .transaction(env, async |tx| {
            write_ledger(tx, ledger, env).await?;
            eprintln!("child: ledger row written, aborting before the commit");
            std::process::abort();
            #[allow(unreachable_code)]
            Ok::<(), PostgresStoreError>(())
        })
        .await;
    unreachable!("the child aborts inside its handler")
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_consumer_killed_before_the_commit_leaves_one_ledger_row_after_the_redelivery() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (table, rest) = spec.split_once('|').unwrap();
        let (ledger, bytes) = rest.split_once('|').unwrap();
        let env = Envelope::decode(bytes.as_bytes()).unwrap();
        crashing_consumer(table, ledger, &env).await;
    }
    let fx = Fixture::new("txn_crash").await;
    let env = payment("pay_7f3a");
    let bytes = String::from_utf8(env.encode()).unwrap();
    // The first consumer: this test binary again, in the child role.
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "txn_postgres::a_consumer_killed_before_the_commit_leaves_one_ledger_row_after_the_redelivery",
            "--exact",
            "--include-ignored",
            "--nocapture",
        ])
        .env(
            CHILD_ENV,
            format!("{}|{}|{bytes}", fx.store.table(), fx.ledger),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the child must die: {stderr}");
    assert!(
        stderr.contains("child: ledger row written, aborting before the commit"),
        "the child wrote its ledger row before dying: {stderr}"
    );
    assert_eq!(
        fx.rows("pay_7f3a").await,
        0,
        "the uncommitted write is gone"
    );
    assert!(
        !fx.store.seen(&env.meta.id).await.unwrap(),
        "and so is the id"
    );

    // The restarted consumer handles the redelivery (the same bytes), then a duplicate.
    let redelivered = Envelope::decode(bytes.as_bytes()).unwrap();
    for expected in [Outcome::Ran, Outcome::Skipped] {
        let out = fx
            .store
            .transaction(&redelivered, async |tx| {
                write_ledger(tx, &fx.ledger, &redelivered).await
            })
            .await
            .unwrap();
        assert_eq!(out, expected);
    }
    assert_eq!(fx.rows("pay_7f3a").await, 1, "exactly one ledger row");
    fx.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_store_error_and_the_handler_does_not_run() {
    let store = PostgresStore::builder("postgres://postgres@127.0.0.1:1/test")
        .timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let env = payment("pay_down");
    let mut ran = false;
    let err = store
        .transaction(&env, async |_tx| {
            ran = true;
            Ok::<(), PostgresStoreError>(())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, PostgresStoreError::Pool(_)), "{err:?}");
    assert!(!ran, "no transaction, no handler");
}
