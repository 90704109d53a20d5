use std::sync::LazyLock;

use babelqueue::{InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE)]
fn charge(payment_id: &str, amount: u64) {
    let _ = (payment_id, amount);
}

fn main() {}
