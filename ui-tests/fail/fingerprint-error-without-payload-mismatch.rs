use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[derive(Debug, thiserror::Error)]
#[error("card declined")]
pub struct ChargeError;

#[idempotent(store = STORE, fingerprint)]
fn charge(env: &Envelope) -> Result<(), ChargeError> {
    let _ = env;
    Ok(())
}

fn main() {}
