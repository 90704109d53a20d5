use babelqueue::sqlite::{SqliteStore, SqliteStoreError};
use babelqueue::{Envelope, idempotent};

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Store(#[from] SqliteStoreError),
}

#[idempotent(store = *store, transactional = &mut tx)]
fn charge(env: &Envelope, store: &SqliteStore) -> Result<(), ChargeError> {
    let _ = (env, store);
    Ok(())
}

fn main() {}
