use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[derive(Debug)]
pub struct ChargeError;

#[idempotent(store = STORE)]
fn charge(env: &Envelope) -> Result<u64, ChargeError> {
    let _ = env;
    Ok(4200)
}

fn main() {}
