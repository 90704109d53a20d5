//! `#[handler("urn:...")]`: direct calls still work, and a `Router` learns each URN from
//! its handler and dispatches envelopes to the right sync or async handler.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue::{
    Envelope, InMemoryStore, Outcome, Router, TypedHandler, handler, handler::UnknownUrn,
    idempotent,
};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGED: AtomicU32 = AtomicU32::new(0);
static REFUNDED: AtomicU32 = AtomicU32::new(0);
static CREATED: AtomicU32 = AtomicU32::new(0);
static SHIPPED: AtomicU32 = AtomicU32::new(0);

/// The tests share the handlers' counters: they take turns.
static COUNTERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Debug, thiserror::Error)]
#[error("card declined for {0}")]
pub struct Declined(String);

/// Async, guarded, `&Envelope`.
#[handler("urn:babel:payments:charge")]
#[idempotent(store = STORE)]
async fn charge(env: &Envelope) -> Result<(), Declined> {
    tokio::task::yield_now().await;
    if env.data.get("declined").is_some() {
        return Err(Declined(env.meta.id.clone()));
    }
    CHARGED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Sync, guarded (the other stacking order), `&Envelope`.
#[idempotent(store = STORE)]
#[handler("urn:babel:payments:refund")]
fn refund(env: &Envelope) {
    let _ = env;
    REFUNDED.fetch_add(1, Ordering::SeqCst);
}

/// Sync, unguarded, by value.
#[handler("urn:babel:orders:created")]
fn order_created(env: Envelope) -> Result<(), Declined> {
    let _ = env;
    CREATED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Async, unguarded, by value.
#[handler("urn:babel:orders:shipped")]
async fn order_shipped(env: Envelope) {
    let _ = env;
    SHIPPED.fetch_add(1, Ordering::SeqCst);
}

fn envelope(urn: &str, data: serde_json::Value) -> Envelope {
    Envelope::new(urn, data).expect("valid envelope")
}

fn router() -> Router {
    Router::new()
        .register(charge {})
        .register(refund {})
        .register(order_created {})
        .register(order_shipped {})
}

#[test]
fn each_handler_carries_its_urn() {
    assert_eq!(charge {}.serves(), "urn:babel:payments:charge");
    assert_eq!(refund {}.serves(), "urn:babel:payments:refund");
    assert_eq!(order_created {}.serves(), "urn:babel:orders:created");
    assert_eq!(order_shipped {}.serves(), "urn:babel:orders:shipped");
    let mut urns: Vec<&str> = Vec::new();
    let r = router();
    urns.extend(r.urns());
    urns.sort_unstable();
    assert_eq!(
        urns,
        [
            "urn:babel:orders:created",
            "urn:babel:orders:shipped",
            "urn:babel:payments:charge",
            "urn:babel:payments:refund",
        ]
    );
}

#[tokio::test]
async fn direct_calls_still_work() {
    let _turn = COUNTERS.lock().await;
    let before = CREATED.load(Ordering::SeqCst);
    order_created(envelope("urn:babel:orders:created", serde_json::json!({}))).unwrap();
    assert_eq!(CREATED.load(Ordering::SeqCst), before + 1);

    let before = SHIPPED.load(Ordering::SeqCst);
    order_shipped(envelope("urn:babel:orders:shipped", serde_json::json!({}))).await;
    assert_eq!(SHIPPED.load(Ordering::SeqCst), before + 1);

    // Guarded handlers called directly dedupe as well.
    let env = envelope("urn:babel:payments:refund", serde_json::json!({}));
    let before = REFUNDED.load(Ordering::SeqCst);
    refund(&env);
    refund(&env);
    assert_eq!(REFUNDED.load(Ordering::SeqCst), before + 1);

    let env = envelope("urn:babel:payments:charge", serde_json::json!({}));
    let before = CHARGED.load(Ordering::SeqCst);
    charge(&env).await.unwrap();
    charge(&env).await.unwrap();
    assert_eq!(CHARGED.load(Ordering::SeqCst), before + 1);

    // The handler stays a plain fn (coerces to a fn pointer).
    let f: fn(&Envelope) = refund;
    f(&envelope(
        "urn:babel:payments:refund",
        serde_json::json!({}),
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_dispatches_to_sync_and_async_handlers() {
    let _turn = COUNTERS.lock().await;
    let r = router();

    // Async, guarded: ran, then skipped as a duplicate.
    let env = envelope("urn:babel:payments:charge", serde_json::json!({}));
    let before = CHARGED.load(Ordering::SeqCst);
    let first = r.dispatch(env.clone()).await.unwrap().unwrap();
    let second = r.dispatch(env).await.unwrap().unwrap();
    assert_eq!(
        (first, second),
        (Some(Outcome::Ran), Some(Outcome::Skipped))
    );
    assert_eq!(CHARGED.load(Ordering::SeqCst), before + 1);

    // Sync, guarded, on the blocking pool.
    let env = envelope("urn:babel:payments:refund", serde_json::json!({}));
    let before = REFUNDED.load(Ordering::SeqCst);
    assert_eq!(
        r.dispatch(env.clone()).await.unwrap().unwrap(),
        Some(Outcome::Ran)
    );
    assert_eq!(
        r.dispatch(env).await.unwrap().unwrap(),
        Some(Outcome::Skipped)
    );
    assert_eq!(REFUNDED.load(Ordering::SeqCst), before + 1);

    // Unguarded handlers report no outcome.
    let before = (
        CREATED.load(Ordering::SeqCst),
        SHIPPED.load(Ordering::SeqCst),
    );
    let created = envelope("urn:babel:orders:created", serde_json::json!({}));
    let shipped = envelope("urn:babel:orders:shipped", serde_json::json!({}));
    assert_eq!(r.dispatch(created).await.unwrap().unwrap(), None);
    assert_eq!(r.dispatch(shipped).await.unwrap().unwrap(), None);
    assert_eq!(
        (
            CREATED.load(Ordering::SeqCst),
            SHIPPED.load(Ordering::SeqCst)
        ),
        (before.0 + 1, before.1 + 1)
    );
}

#[tokio::test]
async fn handler_errors_and_unknown_urns_reach_the_caller() {
    let _turn = COUNTERS.lock().await;
    let r = router();
    let declined = envelope(
        "urn:babel:payments:charge",
        serde_json::json!({"declined": true}),
    );
    let err = r.dispatch(declined.clone()).await.unwrap().unwrap_err();
    assert!(err.type_name().ends_with("Declined"), "{}", err.type_name());
    assert_eq!(
        err.to_string(),
        format!("card declined for {}", declined.meta.id)
    );

    let unknown = envelope("urn:babel:payments:unknown", serde_json::json!({}));
    assert_eq!(
        r.dispatch(unknown).await.unwrap_err(),
        UnknownUrn("urn:babel:payments:unknown".to_owned())
    );
}
