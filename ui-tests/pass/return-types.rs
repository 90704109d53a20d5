//! `()` with a store that cannot fail; `Result<(), E>` where the store's error converts
//! into `E`; `?` and early `return` behave as before.
#![deny(warnings)]

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use babelqueue::{AsyncStore, Envelope, InMemoryStore, Store, idempotent};

static MEMORY: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// A store that can fail, as a networked store does.
pub struct FlakyStore {
    down: AtomicBool,
    inner: InMemoryStore,
}

#[derive(Debug, thiserror::Error)]
#[error("store unavailable")]
pub struct StoreDown;

impl Store for FlakyStore {
    type Error = StoreDown;
    fn seen(&self, id: &str) -> Result<bool, StoreDown> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreDown);
        }
        Ok(Store::seen(&self.inner, id).unwrap_or_else(|e| match e {}))
    }
    fn remember(&self, id: &str) -> Result<(), StoreDown> {
        Store::remember(&self.inner, id).map_err(|e| match e {})
    }
    fn forget(&self, id: &str) -> Result<(), StoreDown> {
        Store::forget(&self.inner, id).map_err(|e| match e {})
    }
}

impl AsyncStore for FlakyStore {
    type Error = StoreDown;
    async fn seen(&self, id: &str) -> Result<bool, StoreDown> {
        Store::seen(self, id)
    }
    async fn remember(&self, id: &str) -> Result<(), StoreDown> {
        Store::remember(self, id)
    }
    async fn forget(&self, id: &str) -> Result<(), StoreDown> {
        Store::forget(self, id)
    }
}

babelqueue::handler_error_from!(StoreDown);

static FLAKY: LazyLock<FlakyStore> = LazyLock::new(|| FlakyStore {
    down: AtomicBool::new(false),
    inner: InMemoryStore::new(),
});

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Store(#[from] StoreDown),
    #[error("bad amount: {0}")]
    Amount(#[from] std::num::ParseIntError),
}

#[idempotent(store = MEMORY)]
fn unit(env: &Envelope) {
    if env.data.is_empty() {
        return;
    }
}

#[idempotent(store = FLAKY)]
fn fallible(env: &Envelope) -> Result<(), ChargeError> {
    let amount: u64 = env.data["amount"].as_str().unwrap_or_default().parse()?;
    if amount == 0 {
        return Ok(());
    }
    Ok(())
}

#[idempotent(store = FLAKY)]
async fn fallible_async(env: &Envelope) -> Result<(), ChargeError> {
    let amount: u64 = env.data["amount"].as_str().unwrap_or_default().parse()?;
    tokio::task::yield_now().await;
    if amount == 0 {
        return Ok(());
    }
    Ok(())
}

#[idempotent(store = FLAKY)]
fn boxed(env: &Envelope) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let _ = env;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let env = |amount: &str| {
        Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": amount}))
            .unwrap()
    };
    unit(&env("1"));
    let bad = env("x");
    assert!(matches!(fallible(&bad), Err(ChargeError::Amount(_))), "`?` returns the error");
    assert!(matches!(fallible_async(&bad).await, Err(ChargeError::Amount(_))));
    fallible(&env("0")).unwrap();
    fallible_async(&env("5")).await.unwrap();
    FLAKY.down.store(true, Ordering::SeqCst);
    assert!(matches!(fallible(&env("5")), Err(ChargeError::Store(StoreDown))), "seen failed");
    assert!(boxed(&env("5")).is_err());
}
