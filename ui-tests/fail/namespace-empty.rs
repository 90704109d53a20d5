use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE, key = env.data.get("payment_id"), namespace = "")]
fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
