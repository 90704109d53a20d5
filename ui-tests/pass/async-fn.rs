//! An `async fn` with an async store; `?` and early `return` keep their meaning.
#![deny(warnings)]

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGES: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error("bad amount")]
    BadAmount(#[from] std::num::ParseIntError),
}

#[idempotent(store = STORE)]
async fn charge(env: Envelope) -> Result<(), ChargeError> {
    let amount: u32 = env.data["amount"].as_str().unwrap_or("x").parse()?;
    if amount == 0 {
        return Ok(());
    }
    tokio::task::yield_now().await;
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": "42"}))
        .unwrap();
    charge(env.clone()).await.unwrap();
    charge(env).await.unwrap();
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
    let bad = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": "x"}))
        .unwrap();
    assert!(charge(bad).await.is_err());
}
