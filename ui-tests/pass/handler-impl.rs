//! Handlers as associated fns: `#[handler]` on the `impl` block, `#[handler("urn:...")]`
//! on each handler fn inside it; each is registered as `name {}` like a free handler.
#![deny(warnings, missing_docs)]

use babelqueue::{Envelope, Json, Router, State, handler};

/// A payment.
#[derive(serde::Deserialize)]
pub struct Payment {
    /// Cents.
    pub amount: u64,
}

/// The payments service.
pub struct Payments;

/// A tax rate (shared state).
#[derive(Clone, Copy)]
pub struct Tax(pub u64);

#[handler]
impl Payments {
    /// Charges.
    #[handler("urn:babel:payments:charge")]
    pub async fn charge(Json(p): Json<Payment>, tax: State<Tax>) -> Result<(), std::io::Error> {
        let Tax(rate) = *tax;
        assert_eq!(p.amount + rate, 4230);
        Ok(())
    }

    /// Refunds (sync).
    #[handler("urn:babel:payments:refund")]
    pub fn refund(env: &Envelope) {
        let _ = env;
    }

    /// Not a handler: left alone.
    pub fn helper() -> u32 {
        7
    }
}

#[tokio::main]
async fn main() {
    assert_eq!(Payments::helper(), 7);
    Payments::refund(&Envelope::new("urn:babel:payments:refund", serde_json::json!({})).unwrap());
    let router = Router::new()
        .state(Tax(30))
        .register(charge {})
        .register(refund {});
    let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))
        .unwrap();
    assert_eq!(router.dispatch(env).await.unwrap().unwrap(), None);
}
