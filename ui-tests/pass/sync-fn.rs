//! The basic form: a sync fn taking `&Envelope`, a `LazyLock` static store.
#![deny(warnings)]

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGES: AtomicU32 = AtomicU32::new(0);

#[derive(Debug)]
pub struct ChargeError;

/// Charges a payment, at most once per `meta.id`.
#[idempotent(store = STORE)]
fn charge(env: &Envelope) -> Result<(), ChargeError> {
    if env.data.is_empty() {
        return Err(ChargeError);
    }
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

fn main() {
    let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))
        .unwrap();
    charge(&env).unwrap();
    charge(&env).unwrap();
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
}
