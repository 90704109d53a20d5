use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, handler, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

// One error per fn, #[idempotent]'s, in either order: #[handler] does not report the
// return type a second time.
#[handler("urn:babel:payments:charge")]
#[idempotent(store = STORE)]
async fn charge(env: &Envelope) -> bool {
    let _ = env;
    true
}

#[idempotent(store = STORE)]
#[handler("urn:babel:payments:refund")]
fn refund(env: &Envelope) -> bool {
    let _ = env;
    true
}

fn main() {}
