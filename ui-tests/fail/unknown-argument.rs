use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE, tll = "24h")]
fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
