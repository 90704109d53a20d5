//! Generic fns, where-clauses and lifetimes: the signature is kept exactly as written.
#![deny(warnings)]

use std::fmt::Display;

use babelqueue::{Envelope, InMemoryStore, IntoHandlerError, Store, idempotent};

#[derive(Debug)]
pub struct NotifyError;

/// Generic over the store (a parameter) and the gateway; a where-clause on the store's
/// error.
#[idempotent(store = store)]
pub fn charge<'a, S, G>(store: &'a S, gateway: G, env: &'a Envelope) -> Result<(), NotifyError>
where
    S: Store + ?Sized,
    S::Error: IntoHandlerError<NotifyError>,
    G: Display,
{
    let _ = (gateway.to_string(), &env.meta.id);
    Ok(())
}

/// A lifetime tying the result of a borrow to the envelope.
#[idempotent(store = STORE)]
fn first_key<'e>(env: &'e Envelope, out: &mut Vec<&'e str>) {
    if let Some(k) = env.data.keys().next() {
        out.push(k.as_str());
    }
}

static STORE: std::sync::LazyLock<InMemoryStore> = std::sync::LazyLock::new(InMemoryStore::new);

/// An async generic fn with `impl Trait` in argument position.
#[idempotent(store = STORE)]
async fn notify<T>(env: &Envelope, sink: impl FnOnce(&str) -> T) -> Result<(), NotifyError>
where
    T: Into<u32>,
{
    let n: u32 = sink(&env.meta.id).into();
    if n == 0 {
        return Err(NotifyError);
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let store = InMemoryStore::new();
    let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"k": 1})).unwrap();
    charge(&store, "stripe", &env).unwrap();
    charge(&store, 42, &env).unwrap();
    let mut keys = Vec::new();
    first_key(&env, &mut keys);
    first_key(&env, &mut keys);
    assert_eq!(keys, ["k"]);
    let other = Envelope::new("urn:babel:payments:notify", serde_json::json!({})).unwrap();
    assert!(notify(&other, |_| 0u8).await.is_err(), "an error leaves the id unmarked");
    notify(&other, |_| 1u8).await.unwrap();
    notify(&other, |_| 0u8).await.unwrap();
}
