//! The envelope parameter spelled other than `&Envelope`, and the typed form keyed on a
//! payload field.

use std::sync::{Arc, LazyLock};

use babelqueue::{Envelope, InMemoryStore, Json, Router, handler, idempotent};

use crate::Runs;

/// The store of these handlers (public so the tests can look at the stored keys).
pub static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// Runs of the `Arc<Envelope>` handler (`shared`).
pub static SHARED: Runs = Runs::new();
/// Runs of the aliased-envelope handler.
pub static ALIASED: Runs = Runs::new();
/// Runs of the typed charge handler.
pub static CHARGES: Runs = Runs::new();

/// An alias of the envelope type.
pub type Message = Envelope;

/// A payment, as the typed handler receives it.
#[derive(Debug, serde::Deserialize)]
pub struct Payment {
    /// The key the charge is deduplicated on.
    pub payment_id: String,
    /// In cents.
    pub amount: u64,
}

/// The envelope as an `Arc`, keyed on its `meta.id`.
#[handler("urn:babel:macro-tests:shared")]
#[idempotent(store = STORE)]
#[allow(clippy::needless_pass_by_value)]
async fn shared_handler(env: Arc<Envelope>) -> Result<(), std::io::Error> {
    let _ = env.meta.id.len();
    SHARED.hit();
    Ok(())
}

/// The envelope through a type alias, keyed on its `meta.id`.
#[handler("urn:babel:macro-tests:aliased")]
#[idempotent(store = STORE)]
fn aliased(env: &Message) {
    let _ = env.meta.id.len();
    ALIASED.hit();
}

/// The README's typed form: keyed on a payload field, namespaced by the handler's URN.
#[handler("urn:babel:payments:charge")]
#[idempotent(store = STORE, key = payment.payment_id)]
async fn charge(Json(payment): Json<Payment>) -> Result<(), std::io::Error> {
    let _ = payment.amount;
    CHARGES.hit();
    Ok(())
}

/// The same with `#[idempotent]` written first.
#[idempotent(store = STORE, key = payment.payment_id)]
#[handler("urn:babel:payments:refund")]
async fn refund(Json(payment): Json<Payment>) -> Result<(), std::io::Error> {
    let _ = payment.amount;
    CHARGES.hit();
    Ok(())
}

/// Calls the `Arc<Envelope>` handler directly.
///
/// # Errors
///
/// The handler's error (it has none).
pub async fn call_shared(env: Arc<Envelope>) -> Result<(), std::io::Error> {
    shared_handler(env).await
}

/// A router with every handler of this module.
#[must_use]
pub fn router() -> Router {
    Router::new()
        .register(shared_handler {})
        .register(aliased {})
        .register(charge {})
        .register(refund {})
}
