use std::sync::LazyLock;

use babelqueue::{InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Replay(#[from] babelqueue::PayloadMismatch),
    #[error(transparent)]
    Busy(#[from] babelqueue::InFlight),
}

/// No envelope, so nothing to digest.
#[idempotent(store = STORE, key = order_id, namespace = "shipping", fingerprint)]
fn ship(order_id: u64) -> Result<(), ChargeError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
