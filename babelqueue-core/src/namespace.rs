//! Key namespaces: a custom dedupe key is scoped to its handler.
//!
//! The default key, `meta.id`, identifies one message, so it is the same key for every
//! handler and every SDK of the fleet: it stays **bare** (`bq:idemp:<meta.id>` on Redis, the
//! `message_id` itself on PostgreSQL), and a Go consumer and a Rust consumer sharing one
//! store dedupe each other's deliveries.
//!
//! A custom key (`#[idempotent(key = ...)]`, e.g. a `payment_id`) identifies a business
//! object, which several handlers touch: `charge` and `refund` keyed on the same
//! `payment_id` must not skip each other. Such a key is therefore stored as
//! `<namespace>#<key>`, where the namespace is by default the handler's URN (the envelope's
//! `job`), or an explicit [`Namespace`] (shared on purpose by handlers that must dedupe each
//! other, or kept stable when a URN is renamed).
//!
//! `#` cannot appear in a URN's name (RFC 8141 reserves it for the fragment), so
//! `<urn>#<key>` never collides with another handler's keys; an explicit namespace is
//! checked for the same reason ([`Namespace::new`]).
//!
//! ```
//! use babelqueue_core::namespace::Namespace;
//! use babelqueue_core::{Guard, Envelope, InMemoryStore, Outcome};
//!
//! let store = InMemoryStore::new();
//! let charge = Envelope::new("urn:babel:payments:charge", serde_json::json!({"payment_id": "pay_7f3a"}))?;
//! let refund = Envelope::new("urn:babel:payments:refund", serde_json::json!({"payment_id": "pay_7f3a"}))?;
//!
//! // Keyed on payment_id, scoped per handler: the refund is not skipped after the charge.
//! let key = |env: &Envelope| Namespace::of_handler(env).key(env.data["payment_id"].clone());
//! assert_eq!(key(&charge).as_deref(), Some("urn:babel:payments:charge#pay_7f3a"));
//! assert_eq!(Guard::new(&store).run(key(&charge), || ())?, Outcome::Ran);
//! assert_eq!(Guard::new(&store).run(key(&refund), || ())?, Outcome::Ran);
//! assert_eq!(Guard::new(&store).run(key(&charge), || ())?, Outcome::Skipped);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Guarantees**: two handlers with different namespaces never share a custom key; the
//! same handler (same URN) on every Rust consumer computes the same stored key. **Does not**:
//! other SDKs have no namespaces, so a custom key is shared with them only when written
//! bare (pass the key itself to the guard, which is what a handler opting out of
//! namespacing does).

use std::borrow::Cow;
use std::fmt;

use crate::envelope::Envelope;
use crate::key::DedupeKey;

/// What separates a namespace from a key in a stored key: `<namespace>#<key>`.
pub const SEPARATOR: char = '#';

/// An explicit namespace that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid idempotency namespace {namespace:?}: {reason}")]
pub struct InvalidNamespace {
    /// The rejected namespace.
    pub namespace: String,
    /// Why it was rejected.
    pub reason: &'static str,
}

/// The scope of a custom dedupe key.
///
/// ```
/// use babelqueue_core::namespace::Namespace;
/// let billing = Namespace::new("billing")?;
/// assert_eq!(billing.key("pay_7f3a").as_deref(), Some("billing#pay_7f3a"));
/// assert_eq!(billing.key("").as_deref(), None, "no key: the guard fails open");
/// assert!(Namespace::new("a#b").is_err());
/// assert!(Namespace::new("").is_err());
/// # Ok::<(), babelqueue_core::namespace::InvalidNamespace>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespace<'a>(Cow<'a, str>);

impl<'a> Namespace<'a> {
    /// An explicit namespace: non-empty, without `#`.
    pub fn new(namespace: impl Into<Cow<'a, str>>) -> Result<Self, InvalidNamespace> {
        let namespace = namespace.into();
        let bad = |reason| InvalidNamespace {
            namespace: namespace.to_string(),
            reason,
        };
        if namespace.is_empty() {
            return Err(bad("it is empty"));
        }
        if namespace.contains(SEPARATOR) {
            return Err(bad(
                "it contains `#`, which separates the namespace from the key",
            ));
        }
        Ok(Namespace(namespace))
    }

    /// The default namespace of a handler: the URN of the envelope it handles (`job`).
    pub fn of_handler(env: &'a Envelope) -> Self {
        Namespace(Cow::Borrowed(env.job.as_str()))
    }

    /// The namespace as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The stored key of `key` in this namespace, `<namespace>#<key>`; `None` when `key`
    /// gives no usable key (the guard then fails open).
    pub fn key<K: DedupeKey>(&self, key: K) -> Option<String> {
        let key = key.dedupe_key()?;
        let mut out = String::with_capacity(self.0.len() + 1 + key.len());
        out.push_str(&self.0);
        out.push(SEPARATOR);
        out.push_str(&key);
        Some(out)
    }

    /// `key` scoped to this namespace, as a [`DedupeKey`] to hand to a guard.
    pub fn scope<K: DedupeKey>(&self, key: K) -> Scoped<'_, K> {
        Scoped {
            namespace: self.as_str(),
            key,
        }
    }
}

impl fmt::Display for Namespace<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A key scoped to a namespace ([`Namespace::scope`]): its dedupe key is
/// `<namespace>#<key>`, or none when the key has none.
#[derive(Debug, Clone)]
pub struct Scoped<'n, K> {
    namespace: &'n str,
    key: K,
}

impl<K: DedupeKey> DedupeKey for Scoped<'_, K> {
    fn dedupe_key(&self) -> Option<Cow<'_, str>> {
        let key = self.key.dedupe_key()?;
        Some(Cow::Owned(format!("{}{SEPARATOR}{key}", self.namespace)))
    }
}

/// The stored key of a custom `key` for the handler of `env`, in `namespace` if given,
/// else in the handler's URN. What `#[idempotent(key = ...)]` computes.
///
/// ```
/// use babelqueue_core::namespace::{handler_key, Namespace};
/// let env = babelqueue_core::Envelope::new("urn:babel:payments:refund", serde_json::json!({}))?;
/// assert_eq!(handler_key(&env, None, "pay_7f3a").as_deref(), Some("urn:babel:payments:refund#pay_7f3a"));
/// let shared = Namespace::new("payments")?;
/// assert_eq!(handler_key(&env, Some(&shared), "pay_7f3a").as_deref(), Some("payments#pay_7f3a"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn handler_key<K: DedupeKey>(
    env: &Envelope,
    namespace: Option<&Namespace<'_>>,
    key: K,
) -> Option<String> {
    match namespace {
        Some(ns) => ns.key(key),
        None => Namespace::of_handler(env).key(key),
    }
}

/// `<namespace>#<key>` for an already computed key (`None` stays `None`: fail open).
/// What the code `#[idempotent(key = ...)]` generates calls, with the envelope's URN or
/// the literal of `namespace = "..."` (checked at compile time: non-empty, no `#`).
///
/// ```
/// use babelqueue_core::namespace::scoped_key;
/// assert_eq!(scoped_key("urn:babel:payments:refund", Some("pay_7f3a".into())).as_deref(),
///            Some("urn:babel:payments:refund#pay_7f3a"));
/// assert_eq!(scoped_key("billing", None), None);
/// ```
pub fn scoped_key(namespace: &str, key: Option<String>) -> Option<String> {
    let key = key?;
    let mut out = String::with_capacity(namespace.len() + 1 + key.len());
    out.push_str(namespace);
    out.push(SEPARATOR);
    out.push_str(&key);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urn_namespaces_do_not_collide() {
        let a = Envelope::new("urn:babel:payments", serde_json::json!({})).unwrap();
        let b = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
        // "urn:babel:payments" + "charge:x" vs "urn:babel:payments:charge" + "x".
        assert_ne!(
            Namespace::of_handler(&a).key("charge:x"),
            Namespace::of_handler(&b).key("x")
        );
    }

    #[test]
    fn scoped_fails_open_and_scopes() {
        let ns = Namespace::new("n").unwrap();
        assert_eq!(ns.scope(None::<&str>).dedupe_key(), None);
        assert_eq!(ns.scope(7u32).dedupe_key().as_deref(), Some("n#7"));
    }
}
