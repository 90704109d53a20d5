use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE)]
fn reconcile(charge: &Envelope, refund: &Envelope) {
    let _ = (charge, refund);
}

fn main() {}
