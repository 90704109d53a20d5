use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE, key = env.data.keys().collect::<Vec<_>>())]
fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
