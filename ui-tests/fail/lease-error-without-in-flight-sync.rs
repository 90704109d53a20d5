use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[derive(Debug)]
pub enum ChargeError {
    Declined,
}

#[idempotent(store = STORE, lease = "30s")]
fn charge(env: &Envelope) -> Result<(), ChargeError> {
    let _ = env;
    Err(ChargeError::Declined)
}

fn main() {}
