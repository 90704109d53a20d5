use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

type Count = u32;

#[idempotent(store = STORE)]
fn charge(env: &Envelope) -> Count {
    let _ = env;
    1
}

fn main() {}
