use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Replay(#[from] babelqueue::PayloadMismatch),
    #[error(transparent)]
    Busy(#[from] babelqueue::InFlight),
}

#[idempotent(store = STORE, lease = "30s", fingerprint)]
fn charge(env: &Envelope) -> Result<(), ChargeError> {
    let _ = env;
    Ok(())
}

fn main() {}
