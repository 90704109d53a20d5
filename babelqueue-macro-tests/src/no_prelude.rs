//! Handlers in a module without the implicit prelude: every name the expansions write is
//! a full path.
#![no_implicit_prelude]

use ::babelqueue::{Envelope, InMemoryStore, Router, handler, idempotent};
use ::std::sync::LazyLock;

use crate::Runs;

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// Runs of the sync handler.
pub static SYNC: Runs = Runs::new();
/// Runs of the async handler.
pub static ASYNC: Runs = Runs::new();

#[handler("urn:babel:macro-tests:no-prelude-sync")]
#[idempotent(store = STORE, ttl = "1h")]
fn sync_handler(env: &Envelope) -> ::core::result::Result<(), ::std::io::Error> {
    let _ = env;
    SYNC.hit();
    ::core::result::Result::Ok(())
}

#[handler("urn:babel:macro-tests:no-prelude-async")]
#[idempotent(store = STORE, key = env.data["order"])]
async fn async_handler(env: &Envelope) {
    let _ = env;
    ASYNC.hit();
}

/// Calls the sync handler directly.
///
/// # Errors
///
/// The handler's error (it has none).
pub fn call_sync(env: &Envelope) -> ::core::result::Result<(), ::std::io::Error> {
    sync_handler(env)
}

/// A router with both handlers.
#[must_use]
pub fn router() -> Router {
    Router::new()
        .register(sync_handler {})
        .register(async_handler {})
}
