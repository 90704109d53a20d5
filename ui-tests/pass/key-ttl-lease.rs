//! `key =` (a business id), `ttl =`, `lease =`.
#![deny(warnings)]

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue::{Envelope, InFlight, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGES: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Busy(#[from] InFlight),
}

/// Keyed on the payment id: a client retry publishes a new `meta.id` for the same
/// payment.
#[idempotent(store = STORE, key = env.data.get("payment_id"), ttl = "7d")]
fn charge(env: &Envelope) {
    let _ = env;
    CHARGES.fetch_add(1, Ordering::SeqCst);
}

/// The key may come from any parameter; without an envelope, the namespace is named.
#[idempotent(store = STORE, key = order_id, namespace = "shipping", ttl = "1h30m")]
async fn ship(order_id: u64, note: &str) {
    let _ = note;
}

/// Lease mode: one worker at a time per id.
#[idempotent(store = STORE, lease = "30s", ttl = "24h")]
async fn refund(env: Envelope) -> Result<(), ChargeError> {
    let _ = env;
    Ok(())
}

#[idempotent(store = STORE, lease = "500ms")]
fn capture(env: &Envelope) -> Result<(), ChargeError> {
    let _ = env;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let payment = |id: &str| {
        Envelope::new("urn:babel:payments:charge", serde_json::json!({"payment_id": id})).unwrap()
    };
    charge(&payment("pay_1"));
    charge(&payment("pay_1"));
    charge(&payment("pay_2"));
    assert_eq!(CHARGES.load(Ordering::SeqCst), 2, "two payments, each charged once");
    ship(7, "fragile").await;
    refund(payment("pay_3")).await.unwrap();
    capture(&payment("pay_4")).unwrap();
}
