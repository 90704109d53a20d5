//! Key namespaces on every store: a custom key is scoped to its handler's URN (so `charge`
//! and `refund` keyed on one `payment_id` do not skip each other), an explicit namespace
//! is shared on purpose, and `meta.id` keys stay bare (the layout every SDK reads).

use crate::idemp_support;

use babelqueue::Guard;
use babelqueue::namespace::{Namespace, handler_key};
use babelqueue::redis::redis::AsyncCommands;
use babelqueue::{AsyncStore, BoxError, Envelope, InMemoryStore, Outcome, store::IntoHandlerError};
use serde_json::json;
use std::time::Duration;

use idemp_support::*;

const CHARGE: &str = "urn:babel:payments:charge";
const REFUND: &str = "urn:babel:payments:refund";

async fn run<S>(store: &S, key: Option<String>) -> Outcome
where
    S: AsyncStore,
    S::Error: IntoHandlerError<BoxError>,
{
    Guard::new(store)
        .run_async(key, async { Ok::<(), BoxError>(()) })
        .await
        .expect("the store answers")
        .outcome
}

/// The story on one store; returns the payment id and the charge envelope it used.
async fn charge_and_refund<S>(store: &S) -> (String, Envelope)
where
    S: AsyncStore,
    S::Error: IntoHandlerError<BoxError>,
{
    let payment = format!("pay_{}", unique());
    let data = json!({"payment_id": payment, "amount": 4200});
    let charge = Envelope::new(CHARGE, data.clone()).unwrap();
    let refund = Envelope::new(REFUND, data.clone()).unwrap();
    let key = |env: &Envelope| handler_key(env, None, &env.data["payment_id"]);

    assert_eq!(
        key(&charge).as_deref(),
        Some(format!("{CHARGE}#{payment}").as_str())
    );
    assert_eq!(run(store, key(&charge)).await, Outcome::Ran);
    assert_eq!(
        run(store, key(&refund)).await,
        Outcome::Ran,
        "refund keyed on the same payment_id is not skipped after charge"
    );
    // A second charge of the same payment (another message, same business key): skipped.
    let again = Envelope::new(CHARGE, data.clone()).unwrap();
    assert_eq!(run(store, key(&again)).await, Outcome::Skipped);
    assert_eq!(run(store, key(&refund)).await, Outcome::Skipped);

    // An explicit namespace shared by both handlers: they dedupe each other.
    let shared = Namespace::new(format!("payments-{}", unique())).unwrap();
    let in_shared = |env: &Envelope| handler_key(env, Some(&shared), &env.data["payment_id"]);
    assert_eq!(run(store, in_shared(&charge)).await, Outcome::Ran);
    assert_eq!(run(store, in_shared(&refund)).await, Outcome::Skipped);

    // meta.id stays bare: the stored key is the id itself.
    let out = Guard::new(store)
        .run_async(&charge, async { Ok::<(), BoxError>(()) })
        .await
        .unwrap();
    assert_eq!(out, Outcome::Ran);
    assert!(store.seen(&charge.meta.id).await.unwrap());
    assert!(
        !store
            .seen(&format!("{CHARGE}#{}", charge.meta.id))
            .await
            .unwrap()
    );
    (payment, charge)
}

#[tokio::test]
async fn memory_store_scopes_custom_keys_per_handler() {
    charge_and_refund(&InMemoryStore::new()).await;
}

#[tokio::test]
async fn sqlite_store_scopes_custom_keys_per_handler() {
    let db = TempDb::new("ns");
    let store = babelqueue::sqlite::SqliteStore::open(&db.0).unwrap();
    let (payment, _) = charge_and_refund(&store).await;
    let stored: Vec<String> = store
        .with_connection(|c| {
            let mut s = c.prepare(
                "SELECT message_id FROM babelqueue_idempotency WHERE message_id LIKE 'urn:%#' || ?1",
            )?;
            s.query_map([&payment], |r| r.get(0))?.collect()
        })
        .unwrap();
    let mut stored = stored;
    stored.sort();
    assert_eq!(
        stored,
        vec![format!("{CHARGE}#{payment}"), format!("{REFUND}#{payment}")]
    );
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn redis_store_scopes_custom_keys_per_handler() {
    // The default prefix, as every SDK uses it (ids are unique, and expire in a minute).
    let store = babelqueue::redis::RedisStore::builder(redis_url())
        .ttl(Duration::from_secs(60))
        .connect()
        .await
        .expect(NEEDS_REDIS);
    let (payment, charge) = charge_and_refund(&store).await;
    let mut conn = raw_redis().await;
    for key in [
        format!("bq:idemp:{CHARGE}#{payment}"),
        format!("bq:idemp:{REFUND}#{payment}"),
        format!("bq:idemp:{}", charge.meta.id),
    ] {
        let value: Option<String> = conn.get(&key).await.unwrap();
        assert_eq!(value.as_deref(), Some("1"), "{key}");
    }
    // A Go consumer of the same fleet (bare meta.id) sees the Rust-handled message.
    let exists: bool = conn
        .exists(format!("bq:idemp:{}", charge.meta.id))
        .await
        .unwrap();
    assert!(exists);
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn postgres_store_scopes_custom_keys_per_handler() {
    let store = pg_store("ns").await;
    let (payment, charge) = charge_and_refund(&store).await;
    let c = raw_pg().await;
    let t = store.table().to_string();
    let rows = c
        .query(
            &format!("SELECT message_id FROM \"{t}\" ORDER BY message_id"),
            &[],
        )
        .await
        .unwrap();
    let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert!(ids.contains(&format!("{CHARGE}#{payment}")), "{ids:?}");
    assert!(ids.contains(&format!("{REFUND}#{payment}")), "{ids:?}");
    assert!(
        ids.contains(&charge.meta.id),
        "meta.id row is bare: {ids:?}"
    );
    pg_drop(&t).await;
}

#[tokio::test]
async fn a_ttl_applies_to_namespaced_keys_too() {
    let store = InMemoryStore::new();
    let env = Envelope::new(CHARGE, json!({"payment_id": "p"})).unwrap();
    let key = handler_key(&env, None, "p");
    let out = Guard::new(&store)
        .ttl(Duration::from_millis(20))
        .run_async(key.clone(), async { Ok::<(), BoxError>(()) })
        .await
        .unwrap();
    assert_eq!(out, Outcome::Ran);
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(run(&store, key).await, Outcome::Ran, "expired: runs again");
}
