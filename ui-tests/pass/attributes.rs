//! Attributes on the fn survive: doc comments, `#[cfg]`, `#[allow]`, inner attributes,
//! `#[tracing::instrument]` stacked above or below, visibility.
#![deny(warnings, missing_docs)]
//! Attribute forms.

use std::sync::LazyLock;

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// Charges a payment (documented: `missing_docs` is denied).
#[idempotent(store = STORE)]
#[allow(clippy::needless_return)]
pub fn documented(env: &Envelope) {
    let _ = env;
}

/// Compiled out: never referenced, yet no error.
#[cfg(any())]
#[idempotent(store = DOES_NOT_EXIST)]
pub fn compiled_out(env: &Envelope) {}

/// `#[cfg]` below the macro.
#[idempotent(store = STORE)]
#[cfg(all())]
pub fn compiled_in(env: &Envelope) {
    let _ = env;
}

/// An inner attribute at the top of the body.
#[idempotent(store = STORE)]
pub fn inner_attribute(env: &Envelope) {
    #![allow(unused_variables)]
    let unused = 1;
    let _ = env;
}

/// `#[tracing::instrument]` above `#[idempotent]`.
#[tracing::instrument(skip_all, fields(id = %env.meta.id))]
#[idempotent(store = STORE)]
pub async fn instrumented_above(env: &Envelope) -> Result<(), std::io::Error> {
    tracing::info!("charging");
    Ok(())
}

/// `#[tracing::instrument]` below `#[idempotent]`.
#[idempotent(store = STORE)]
#[tracing::instrument(skip(env))]
pub fn instrumented_below(env: &Envelope, gateway: &str) {
    let _ = env;
    tracing::info!(gateway, "charging");
}

pub(crate) mod inner {
    use super::*;

    /// Restricted visibility is kept.
    #[idempotent(store = STORE)]
    pub(crate) fn crate_visible(env: &Envelope) {
        let _ = env;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
    documented(&env);
    compiled_in(&env);
    inner_attribute(&env);
    instrumented_above(&env).await.unwrap();
    instrumented_below(&env, "stripe");
    inner::crate_visible(&env);
}
