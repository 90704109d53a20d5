//! `#[handler("urn:...")]`: sync and async, `&Envelope` and `Envelope`, stacked above and
//! below `#[idempotent]`; called directly, and registered on a `Router` by name.
#![deny(warnings, missing_docs)]
//! Handlers.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue::{Envelope, InMemoryStore, Outcome, Router, handler, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGED: AtomicU32 = AtomicU32::new(0);

/// A failed charge.
#[derive(Debug, thiserror::Error)]
#[error("card declined")]
pub struct Declined;

/// Charges a payment, once per `meta.id`.
#[handler("urn:babel:payments:charge")]
#[idempotent(store = STORE)]
pub async fn charge(env: &Envelope) -> Result<(), Declined> {
    if env.data.get("declined").is_some() {
        return Err(Declined);
    }
    CHARGED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Refunds a payment (sync; `#[idempotent]` above `#[handler]`).
#[idempotent(store = STORE)]
#[handler("urn:babel:payments:refund")]
pub fn refund(env: &Envelope) {
    let _ = env;
}

/// Takes the envelope by value.
#[handler("urn:babel:orders:created")]
pub fn order_created(env: Envelope) -> Result<(), Declined> {
    let _ = env;
    Ok(())
}

/// Async, by value, unguarded.
#[handler("urn:babel:orders:shipped")]
pub async fn order_shipped(env: Envelope) {
    let _ = env;
}

#[tokio::main]
async fn main() {
    let payment = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();

    // Called directly, as a unit test would.
    charge(&payment).await.unwrap();
    charge(&payment).await.unwrap();
    assert_eq!(CHARGED.load(Ordering::SeqCst), 1);
    refund(&payment);
    order_created(payment.clone()).unwrap();
    order_shipped(payment.clone()).await;

    // Registered by name: the router learns each URN from its handler.
    let router = Router::new()
        .register(charge {})
        .register(refund {})
        .register(order_created {})
        .register(order_shipped {});
    let mut urns: Vec<&str> = router.urns().collect();
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
    let fresh = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
    let first = router.dispatch(fresh.clone()).await.unwrap().unwrap();
    let second = router.dispatch(fresh).await.unwrap().unwrap();
    assert_eq!((first, second), (Some(Outcome::Ran), Some(Outcome::Skipped)));
    let declined =
        Envelope::new("urn:babel:payments:charge", serde_json::json!({"declined": true}))
            .unwrap();
    let err = router.dispatch(declined).await.unwrap().unwrap_err();
    assert!(err.type_name().ends_with("Declined"), "{}", err.type_name());
    let shipped = Envelope::new("urn:babel:orders:shipped", serde_json::json!({})).unwrap();
    assert_eq!(router.dispatch(shipped).await.unwrap().unwrap(), None);
}
