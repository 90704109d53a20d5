use std::convert::Infallible;

use babelqueue::{AsyncStore, Envelope, idempotent};

/// A networked store: it implements `AsyncStore` only (as the Redis and PostgreSQL
/// stores do).
pub struct RemoteStore;

impl AsyncStore for RemoteStore {
    type Error = Infallible;
    async fn seen(&self, _id: &str) -> Result<bool, Infallible> {
        Ok(false)
    }
    async fn remember(&self, _id: &str) -> Result<(), Infallible> {
        Ok(())
    }
    async fn forget(&self, _id: &str) -> Result<(), Infallible> {
        Ok(())
    }
}

fn remote() -> RemoteStore {
    RemoteStore
}

#[idempotent(store = remote())]
fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
