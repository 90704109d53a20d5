//! What compiles without the macros compiles with them: return-type coercions in async
//! bodies, parameters named like generated locals, a handler named `envelope` beside
//! others, the fn's own name (type name, fn pointer, `#[tracing::instrument]`),
//! `#[must_use]`, `#[deprecated]` at call sites only, a raw identifier as a handler's
//! name, and a generic store bound with
//! `IntoHandlerError`.
#![deny(warnings, missing_docs)]

use std::error::Error;
use std::sync::LazyLock;

use babelqueue::{
    Envelope, InMemoryStore, IntoHandlerError, Router, Store, TypedHandler, handler, idempotent,
};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// `return Err(Box::new(io))` coerces to `Box<dyn Error + Send + Sync>`.
#[idempotent(store = STORE)]
pub async fn boxed(env: &Envelope) -> Result<(), Box<dyn Error + Send + Sync>> {
    if env.data.contains_key("fail") {
        return Err(Box::new(std::io::Error::other("boom")));
    }
    Ok(())
}

/// A tail `Err(&String)` coerces to `Err(&str)`.
#[idempotent(store = STORE)]
pub async fn borrowed<'a>(env: &'a Envelope, reason: &'a String) -> Result<(), &'a str> {
    if env.data.contains_key("fail") {
        return Err(reason);
    }
    Ok(())
}

/// A parameter named like a generated local.
#[idempotent(store = STORE)]
pub fn shadowing(env: &Envelope, __babelqueue_key: u32, __babelqueue_guard: &mut u32) {
    let _ = env;
    *__babelqueue_guard = __babelqueue_key;
}

/// A handler named like the router's own envelope local.
#[handler("urn:babel:system:envelope")]
pub fn envelope(env: &Envelope) {
    let _ = env;
}

/// A second handler in the same module (the first must not break it).
#[handler("urn:babel:system:other")]
#[must_use = "the count is the point"]
pub fn other(env: &Envelope) -> Result<(), std::io::Error> {
    let _ = env;
    Ok(())
}

/// Deprecated: warns where it is called or registered, not where it is defined.
#[handler("urn:babel:system:old")]
#[deprecated = "use `envelope`"]
pub fn old(env: &Envelope) {
    let _ = env;
}

/// A raw identifier as the name.
#[handler("urn:babel:system:type")]
pub fn r#type(env: &Envelope) {
    let _ = env;
}

/// Traced under its own name.
#[handler("urn:babel:system:traced")]
#[tracing::instrument(skip_all)]
pub async fn traced(env: &Envelope) {
    let _ = env;
}

/// Generic over the store, with the bound the guard needs.
#[idempotent(store = store)]
pub fn generic<S, E>(store: &S, env: &Envelope) -> Result<(), E>
where
    S: Store,
    S::Error: IntoHandlerError<E>,
{
    let _ = env;
    Ok(())
}

#[tokio::main]
async fn main() {
    let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"fail": 1})).unwrap();
    let err = boxed(&env).await.unwrap_err();
    assert_eq!(err.to_string(), "boom");
    let why = String::from("declined");
    assert_eq!(borrowed(&env, &why).await, Err("declined"));
    let fresh = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
    let mut out = 0;
    shadowing(&fresh, 7, &mut out);
    assert_eq!(out, 7);
    envelope(&env);
    other(&env).unwrap();
    #[allow(deprecated)]
    old(&env);
    traced(&env).await;
    generic::<_, std::io::Error>(&InMemoryStore::new(), &env).unwrap();

    // The fn keeps its name: as a fn item, and through a fn pointer.
    let f: fn(&Envelope) = envelope;
    f(&env);
    assert!(std::any::type_name_of_val(&envelope).ends_with("::envelope"));
    assert!(!std::any::type_name_of_val(&other).contains("__babelqueue"));

    #[allow(deprecated)]
    let router = Router::new()
        .register(envelope {})
        .register(other {})
        .register(old {})
        .register(traced {})
        .register(r#type {});
    assert_eq!(router.urns().count(), 5);
    r#type(&env);
    assert_eq!(envelope {}.serves(), "urn:babel:system:envelope");
}
