use std::sync::{Arc, LazyLock, Mutex};

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<Arc<Mutex<InMemoryStore>>> =
    LazyLock::new(|| Arc::new(Mutex::new(InMemoryStore::new())));

#[idempotent(store = STORE)]
async fn charge(env: &Envelope) -> Result<(), String> {
    let _ = env;
    Ok(())
}

fn main() {}
