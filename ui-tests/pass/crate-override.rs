//! `crate = path`: the runtime named through a re-export, `babelqueue_runtime` directly
//! (what a crate depending on `babelqueue-runtime` without the facade gets without
//! writing it), or `babelqueue_core` for `#[idempotent]` alone (the guard's half).
#![deny(warnings)]

use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, handler, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// A crate re-exporting babelqueue under its own path.
mod platform {
    pub mod queue {
        pub use babelqueue as runtime;
    }
}

#[idempotent(store = STORE, crate = platform::queue::runtime)]
fn through_reexport(env: &Envelope) {
    let _ = env;
}

#[idempotent(store = STORE, crate = ::babelqueue_core)]
async fn through_core(env: &babelqueue_core::Envelope) {
    let _ = env;
}

#[handler("urn:babel:payments:charge", crate = ::babelqueue_runtime)]
#[idempotent(store = STORE, crate = ::babelqueue_runtime)]
fn core_handler(env: &Envelope) {
    let _ = env;
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
    through_reexport(&env);
    through_core(&env).await;
    core_handler(&env);
    let router = babelqueue_runtime::Router::new().register(core_handler {});
    assert!(router.get("urn:babel:payments:charge").is_some());
}
