use std::convert::Infallible;
use std::sync::LazyLock;

use babelqueue::{Envelope, Store, idempotent};

/// A blocking store: it implements `Store` only.
pub struct BlockingStore;

impl Store for BlockingStore {
    type Error = Infallible;
    fn seen(&self, _id: &str) -> Result<bool, Infallible> {
        Ok(false)
    }
    fn remember(&self, _id: &str) -> Result<(), Infallible> {
        Ok(())
    }
    fn forget(&self, _id: &str) -> Result<(), Infallible> {
        Ok(())
    }
}

static STORE: LazyLock<BlockingStore> = LazyLock::new(|| BlockingStore);

#[idempotent(store = STORE)]
async fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
