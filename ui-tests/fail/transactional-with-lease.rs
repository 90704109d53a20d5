use babelqueue::sqlite::{SqliteStore, SqliteStoreError};
use babelqueue::{Envelope, idempotent};

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Store(#[from] SqliteStoreError),
    #[error(transparent)]
    Busy(#[from] babelqueue::InFlight),
}

#[idempotent(store = *store, transactional = tx, lease = "30s")]
fn charge(env: &Envelope, store: &SqliteStore) -> Result<(), ChargeError> {
    let _ = (env, store);
    Ok(())
}

fn main() {}
