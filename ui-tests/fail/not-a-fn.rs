use std::sync::LazyLock;

use babelqueue::{InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE)]
struct Charge {
    amount: u64,
}

fn main() {
    let _ = Charge { amount: 1 }.amount;
}
