//! Handlers called directly, registered, and both. Each fn is private: only the `pub` fns
//! below use it, so the type `#[handler]` adds beside a fn called directly is unused, and
//! must not warn.

use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, Router, handler, idempotent};

use crate::Runs;

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// Runs of the handler called directly (`direct`).
pub static DIRECT: Runs = Runs::new();
/// Runs of the registered-only handler.
pub static REGISTERED: Runs = Runs::new();
/// Runs of the handler both called and registered.
pub static BOTH: Runs = Runs::new();

#[handler("urn:babel:macro-tests:direct")]
#[idempotent(store = STORE)]
fn direct_handler(env: &Envelope) -> Result<(), std::io::Error> {
    let _ = env;
    DIRECT.hit();
    Ok(())
}

#[handler("urn:babel:macro-tests:registered")]
#[idempotent(store = STORE)]
async fn registered_handler(env: &Envelope) -> Result<(), std::io::Error> {
    let _ = env;
    REGISTERED.hit();
    Ok(())
}

#[handler("urn:babel:macro-tests:both")]
#[idempotent(store = STORE)]
fn both_handler(env: &Envelope) {
    let _ = env;
    BOTH.hit();
}

/// Calls the handler that is never registered.
///
/// # Errors
///
/// The handler's error (it has none).
pub fn direct(env: &Envelope) -> Result<(), std::io::Error> {
    direct_handler(env)
}

/// Calls the handler that is also registered.
pub fn both(env: &Envelope) {
    both_handler(env);
}

/// A router with the registered handlers.
#[must_use]
pub fn router() -> Router {
    Router::new()
        .register(registered_handler {})
        .register(both_handler {})
}
