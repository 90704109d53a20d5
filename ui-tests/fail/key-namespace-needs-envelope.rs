use std::sync::LazyLock;

use babelqueue::{InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// The default namespace is the envelope's `job`, and there is no envelope.
#[idempotent(store = STORE, key = order_id)]
fn ship(order_id: u64) {
    let _ = order_id;
}

fn main() {}
