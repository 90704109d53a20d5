use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE, ttl = std::time::Duration::from_secs(60))]
fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
