//! Typed arguments: `Json<T>` (also destructured), `State<T>`, `Attempts`, `Meta`, the
//! envelope by reference, by `&mut` and by value, in any order; no argument at all;
//! `#[idempotent(store = store)]` on a `State<S>` argument (a store picked at start-up,
//! no `static`), above and below `#[handler]`; sync and async.
#![deny(warnings, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue::{
    Attempts, Envelope, InMemoryStore, Json, Meta, Outcome, Router, State, handler, idempotent,
};

/// A payment.
#[derive(Debug, serde::Deserialize)]
pub struct Payment {
    /// Cents.
    pub amount: u64,
}

/// Counts charges (shared state).
#[derive(Default)]
pub struct Ledger {
    charged: AtomicU32,
}

/// A failed charge.
#[derive(Debug, thiserror::Error)]
#[error("card declined")]
pub struct Declined;

/// Payload first, state, then the envelope and the attempt count; guarded by the store
/// in the router's state.
#[handler("urn:babel:payments:charge")]
#[idempotent(store = store)]
pub async fn charge(
    Json(payment): Json<Payment>,
    ledger: State<Ledger>,
    store: State<InMemoryStore>,
    env: &Envelope,
    attempts: Attempts,
) -> Result<(), Declined> {
    if payment.amount == 0 {
        return Err(Declined);
    }
    let _ = (&env.meta.id, attempts.0);
    ledger.charged.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Sync; `#[idempotent]` above; the envelope by value last, the payload unwrapped with
/// `Deref`.
#[idempotent(store = store)]
#[handler("urn:babel:payments:refund")]
pub fn refund(store: State<Arc<InMemoryStore>>, payment: Json<Payment>, env: Envelope) {
    let _ = (payment.amount, env.meta.id);
}

/// No argument at all.
#[handler("urn:babel:system:ping")]
pub async fn ping() {}

/// `&mut Envelope` and `Meta`.
#[handler("urn:babel:orders:created")]
pub fn order_created(meta: Meta, env: &mut Envelope) -> Result<(), Declined> {
    env.attempts += meta.id.len() as u32;
    Ok(())
}

#[tokio::main]
async fn main() {
    // Direct calls: the fns are plain fns.
    ping().await;
    let mut env = Envelope::new("urn:babel:orders:created", serde_json::json!({})).unwrap();
    order_created(env.meta.clone(), &mut env).unwrap();

    // The store is chosen at start-up and reaches the handlers through the router.
    let store = InMemoryStore::new();
    let router = Router::new()
        .register(charge {})
        .register(refund {})
        .register(ping {})
        .register(order_created {})
        .state(Ledger::default())
        .state(store)
        .state(Arc::new(InMemoryStore::new()));
    let pay = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))
        .unwrap();
    assert_eq!(router.dispatch(pay.clone()).await.unwrap().unwrap(), Some(Outcome::Ran));
    assert_eq!(router.dispatch(pay).await.unwrap().unwrap(), Some(Outcome::Skipped));
    let ledger = router.state_map().get::<Ledger>().unwrap();
    assert_eq!(ledger.charged.load(Ordering::SeqCst), 1);

    let refund = Envelope::new("urn:babel:payments:refund", serde_json::json!({"amount": 1}))
        .unwrap();
    assert_eq!(router.dispatch(refund.clone()).await.unwrap().unwrap(), Some(Outcome::Ran));
    assert_eq!(router.dispatch(refund).await.unwrap().unwrap(), Some(Outcome::Skipped));

    let ping = Envelope::new("urn:babel:system:ping", serde_json::json!({})).unwrap();
    assert_eq!(router.dispatch(ping).await.unwrap().unwrap(), None);
}
