//! Typed handler arguments: what a `#[handler]` fn may take besides the envelope.
//!
//! ```
//! use babelqueue_runtime::extract::{Attempts, Json, State};
//! # #[derive(serde::Deserialize)] struct Payment { amount: u64 }
//! # #[derive(Clone)] struct Gateway;
//! # #[derive(Debug, thiserror::Error)] #[error("declined")] struct ChargeError;
//! // #[handler("urn:babel:payments:charge")]
//! async fn charge(
//!     Json(payment): Json<Payment>, // the payload, deserialized with serde
//!     gateway: State<Gateway>,      // shared state, injected by type from the Router
//!     attempts: Attempts,           // 0 on the first delivery
//! ) -> Result<(), ChargeError> {
//!     # let _ = (payment.amount, gateway, attempts);
//!     Ok(())
//! }
//! ```
//!
//! Each argument type implements [`FromEnvelope`]: the router builds every argument from
//! the envelope and its [`StateMap`] before the body runs, in any order. The envelope
//! itself is taken as `&Envelope`, `&mut Envelope` or `Envelope`.
//!
//! # A payload that does not deserialize
//!
//! One rule: a [`Json<T>`] argument whose payload does not deserialize into `T` is a
//! **permanent** failure. The handler does not run; the router returns a
//! [`PayloadError`] (with serde's message), which the runtime recognises by type and
//! dead-letters at once as `failed`, without retrying: the same bytes would fail the
//! same way on every attempt.

use std::any::{Any, TypeId, type_name};
use std::collections::HashMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use babelqueue_core::envelope::Envelope;

/// Shared state a [`Router`](crate::Router) hands its handlers, one value per type.
///
/// Filled with [`Router::state`](crate::Router::state); read by the [`State<T>`]
/// argument. Cheap to clone (values are reference-counted).
#[derive(Clone, Default)]
pub struct StateMap {
    values: HashMap<TypeId, (Arc<dyn Any + Send + Sync>, &'static str)>,
}

impl std::fmt::Debug for StateMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut types: Vec<_> = self.values.values().map(|(_, name)| *name).collect();
        types.sort_unstable();
        f.debug_struct("StateMap").field("types", &types).finish()
    }
}

impl StateMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `value` as the state of type `T`, replacing an earlier one.
    pub fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        self.insert_arc(Arc::new(value));
    }

    /// Stores the `T` behind `value` as the state of type `T`, replacing an earlier
    /// one: the map shares your `Arc` instead of making its own, so a [`State<T>`]
    /// argument gets a clone of the handle you keep.
    pub fn insert_arc<T: Send + Sync + 'static>(&mut self, value: Arc<T>) {
        self.values
            .insert(TypeId::of::<T>(), (value, type_name::<T>()));
    }

    /// The state of type `T`, if any.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.values
            .get(&TypeId::of::<T>())
            .and_then(|(v, _)| v.downcast_ref::<T>())
    }

    /// The state of type `T`, shared, if any.
    pub fn get_shared<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.values
            .get(&TypeId::of::<T>())
            .and_then(|(v, _)| Arc::clone(v).downcast::<T>().ok())
    }

    /// Whether no state is stored.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// A type a `#[handler]` fn may take as an argument: built from the envelope and the
/// router's state before the body runs.
///
/// Implemented by [`Json<T>`], [`State<T>`], [`Attempts`], [`Meta`](babelqueue_core::Meta) and
/// [`Replay`](crate::replay::Replay);
/// implement it for an argument of your own (the `Rejection` is the handler's error
/// when it cannot be built).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a #[handler] argument",
    label = "the router cannot build a `{Self}` from a message",
    note = "a #[handler] fn takes `Json<T>` (the payload), `State<T>` (shared state from `Router::state`), `Attempts`, `Meta`, `Replay`, and the envelope as `&Envelope`, `&mut Envelope` or `Envelope`, in any order"
)]
pub trait FromEnvelope: Sized {
    /// Why the argument could not be built: the handler's error instead of running it.
    type Rejection: std::error::Error + Send + Sync + 'static;

    /// Builds the argument.
    fn from_envelope(envelope: &Envelope, state: &StateMap) -> Result<Self, Self::Rejection>;

    /// Whether `state` holds the shared state this argument needs, checked before any
    /// message is handled ([`Router::check_state`](crate::Router::check_state), called
    /// when a consumer starts). The default needs none; [`State<T>`] needs a `T`.
    fn check_state(state: &StateMap) -> Result<(), MissingState> {
        let _ = state;
        Ok(())
    }
}

/// The message's payload (`data`), deserialized with serde into `T`.
///
/// A payload that does not deserialize is a [`PayloadError`]: the handler does not run
/// and the message is dead-lettered at once (see the [module docs](self)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Json<T>(pub T);

impl<T> std::ops::Deref for Json<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for Json<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T: DeserializeOwned> FromEnvelope for Json<T> {
    type Rejection = PayloadError;

    fn from_envelope(envelope: &Envelope, _: &StateMap) -> Result<Self, PayloadError> {
        envelope
            .data
            .deserialize_into()
            .map(Json)
            .map_err(|source| PayloadError {
                urn: envelope.urn().to_owned(),
                target: type_name::<T>(),
                source,
            })
    }
}

/// A payload did not deserialize into the handler's `Json<T>` argument: a permanent
/// failure, dead-lettered at once as `failed` (retrying the same bytes cannot help).
///
/// The runtime recognises it by type (`error.is::<PayloadError>()` on the handler's
/// error), never by its text.
#[derive(Debug, thiserror::Error)]
#[error("the payload of `{urn}` does not deserialize into `{target}`")]
pub struct PayloadError {
    urn: String,
    target: &'static str,
    #[source]
    source: serde_json::Error,
}

impl PayloadError {
    /// The URN of the message whose payload was rejected.
    pub fn urn(&self) -> &str {
        &self.urn
    }

    /// The Rust type the payload was meant for.
    pub fn target(&self) -> &'static str {
        self.target
    }

    /// serde's error (what was wrong, and where).
    pub fn serde_error(&self) -> &serde_json::Error {
        &self.source
    }
}

/// Shared state of type `T`, injected by type from the router's state
/// ([`Router::state`](crate::Router::state)). The router keeps one `T` behind an `Arc`;
/// each call gets the `Arc` (no `Clone` needed on `T`), and `State<T>` dereferences to
/// `T`. To keep a handle of your own, hand the router your `Arc` with
/// [`Router::state_arc`](crate::Router::state_arc): `state(arc)` would register an
/// `Arc<T>`, read by `State<Arc<T>>`.
///
/// A `State<S>` of a store is itself a store, so `#[idempotent(store = store)]` works on
/// an argument `store: State<S>`: a store chosen at start-up needs no `static`.
#[derive(Debug, Default)]
pub struct State<T>(pub Arc<T>);

impl<T> Clone for State<T> {
    fn clone(&self) -> Self {
        State(Arc::clone(&self.0))
    }
}

impl<T> std::ops::Deref for State<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Send + Sync + 'static> FromEnvelope for State<T> {
    type Rejection = MissingState;

    fn from_envelope(_: &Envelope, state: &StateMap) -> Result<Self, MissingState> {
        state
            .get_shared::<T>()
            .map(State)
            .ok_or_else(|| MissingState::in_map::<T>(state))
    }

    fn check_state(state: &StateMap) -> Result<(), MissingState> {
        match state.get::<T>() {
            Some(_) => Ok(()),
            None => Err(MissingState::in_map::<T>(state)),
        }
    }
}

/// A handler takes `State<T>` but its router holds no `T`: add it with
/// `Router::state(value)` (or `App::state(value)`).
///
/// Found before any message is handled: [`Router::check_state`](crate::Router::check_state)
/// returns it, and a consumer (`App::drain`, `App::run_until`) checks its router when it
/// starts, so it reserves nothing. A router dispatching by hand without that check gets
/// it as the handler's error instead: the handler does not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}takes `State<{type_name}>` but the router has no `{type_name}`; {}",
    handler_prefix(handler.as_deref()),
    advice(type_name, *arc_of_it)
)]
pub struct MissingState {
    type_name: &'static str,
    handler: Option<String>,
    /// The map holds an `Arc<T>` (registered with `state(arc)`), not a `T`.
    arc_of_it: bool,
}

fn advice(type_name: &str, arc_of_it: bool) -> String {
    if arc_of_it {
        format!(
            "it holds an `Arc<{type_name}>`: register the `Arc` with `Router::state_arc(...)` (or `App::state_arc(...)`) instead of `state`"
        )
    } else {
        "add it with `Router::state(...)` (or `App::state(...)`)".to_owned()
    }
}

fn handler_prefix(handler: Option<&str>) -> String {
    match handler {
        Some(h) => format!("the handler {h} "),
        None => "the handler ".to_owned(),
    }
}

impl MissingState {
    /// `T` is missing from `state`; noticed when `state` holds an `Arc<T>` instead.
    fn in_map<T: Send + Sync + 'static>(state: &StateMap) -> Self {
        MissingState {
            type_name: type_name::<T>(),
            handler: None,
            arc_of_it: state.get::<Arc<T>>().is_some(),
        }
    }

    /// The same, naming the handler (its fn and URN) that needs the state.
    pub(crate) fn in_handler(mut self, name: &str, urn: &str) -> Self {
        self.handler = Some(format!("`{name}` (`{urn}`)"));
        self
    }

    /// The missing state's type.
    pub fn type_name(&self) -> &'static str {
        self.type_name
    }

    /// The handler that needs it, as "`fn_name` (`urn`)", when known (a
    /// [`Router::check_state`](crate::Router::check_state) names it).
    pub fn handler(&self) -> Option<&str> {
        self.handler.as_deref()
    }
}

/// How many times this message was delivered before (`0` on the first delivery): the
/// envelope's `attempts`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attempts(pub u32);

impl FromEnvelope for Attempts {
    type Rejection = std::convert::Infallible;

    fn from_envelope(envelope: &Envelope, _: &StateMap) -> Result<Self, Self::Rejection> {
        Ok(Attempts(envelope.attempts))
    }
}

/// Whether the delivery is a deliberate replay (redriven with `bypass`): see
/// [`replay`](crate::replay).
impl FromEnvelope for crate::replay::Replay {
    type Rejection = std::convert::Infallible;

    fn from_envelope(_: &Envelope, _: &StateMap) -> Result<Self, Self::Rejection> {
        Ok(crate::replay::Replay(crate::replay::is_replay()))
    }
}

impl FromEnvelope for babelqueue_core::envelope::Meta {
    type Rejection = std::convert::Infallible;

    fn from_envelope(envelope: &Envelope, _: &StateMap) -> Result<Self, Self::Rejection> {
        Ok(envelope.meta.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(data: serde_json::Value) -> Envelope {
        Envelope::new("urn:babel:payments:charge", data).unwrap()
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Payment {
        amount: u64,
    }

    #[test]
    fn json_deserializes_or_is_a_payload_error() {
        let state = StateMap::new();
        let ok = Json::<Payment>::from_envelope(&env(serde_json::json!({"amount": 7})), &state);
        assert_eq!(ok.unwrap().0, Payment { amount: 7 });
        let bad = Json::<Payment>::from_envelope(&env(serde_json::json!({"amount": "x"})), &state)
            .unwrap_err();
        assert_eq!(bad.urn(), "urn:babel:payments:charge");
        assert!(bad.target().ends_with("Payment"));
        assert!(bad.serde_error().to_string().contains("invalid type"));
        // Display does not repeat its source.
        assert!(!bad.to_string().contains("invalid type"));
    }

    #[test]
    fn state_by_type() {
        let mut state = StateMap::new();
        assert!(State::<u32>::from_envelope(&env(serde_json::json!({})), &state).is_err());
        state.insert(7u32);
        state.insert(String::from("pool"));
        let e = env(serde_json::json!({}));
        assert_eq!(*State::<u32>::from_envelope(&e, &state).unwrap(), 7);
        assert_eq!(*State::<String>::from_envelope(&e, &state).unwrap(), "pool");
        let missing = State::<u64>::from_envelope(&e, &state).unwrap_err();
        assert_eq!(missing.type_name(), "u64");
    }

    #[test]
    fn state_from_your_own_arc() {
        #[derive(Debug)]
        struct Ledger(u32);
        let ledger = Arc::new(Ledger(7));
        let mut state = StateMap::new();
        state.insert_arc(Arc::clone(&ledger));
        let e = env(serde_json::json!({}));
        let got = State::<Ledger>::from_envelope(&e, &state).unwrap();
        assert_eq!(got.0.0, 7);
        // The handler's `State` is the caller's `Arc`, not a copy behind another one.
        assert!(Arc::ptr_eq(&got.0, &ledger));
        assert!(State::<Ledger>::check_state(&state).is_ok());
    }

    #[test]
    fn an_arc_registered_as_a_value_is_named_in_the_error() {
        #[derive(Debug)]
        struct Ledger;
        let mut state = StateMap::new();
        state.insert(Arc::new(Ledger));
        let missing = State::<Ledger>::check_state(&state).unwrap_err();
        assert!(missing.to_string().contains("state_arc"), "{missing}");
        let e = env(serde_json::json!({}));
        let missing = State::<Ledger>::from_envelope(&e, &state).unwrap_err();
        assert!(missing.to_string().contains("state_arc"), "{missing}");
        // Without an `Arc` of it, the usual advice.
        let missing = State::<u8>::check_state(&state).unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("add it with `Router::state(...)`")
        );
    }

    #[test]
    fn attempts_and_meta() {
        let mut e = env(serde_json::json!({}));
        e.attempts = 3;
        let state = StateMap::new();
        assert_eq!(Attempts::from_envelope(&e, &state).unwrap(), Attempts(3));
        let meta = babelqueue_core::Meta::from_envelope(&e, &state).unwrap();
        assert_eq!(meta.id, e.meta.id);
    }
}

// A `State<S>` argument holding a store is a store (the router's shared stores).
macro_rules! forward_state_stores {
    () => {
        impl<S: babelqueue_core::store::Store> babelqueue_core::store::Store
            for crate::extract::State<S>
        {
            type Error = S::Error;
            fn seen(&self, id: &str) -> Result<bool, Self::Error> {
                self.0.seen(id)
            }
            fn remember(&self, id: &str) -> Result<(), Self::Error> {
                self.0.remember(id)
            }
            fn remember_for(
                &self,
                id: &str,
                ttl: Option<std::time::Duration>,
            ) -> Result<(), Self::Error> {
                self.0.remember_for(id, ttl)
            }
            fn forget(&self, id: &str) -> Result<(), Self::Error> {
                self.0.forget(id)
            }
        }

        impl<S: babelqueue_core::store::AsyncStore> babelqueue_core::store::AsyncStore
            for crate::extract::State<S>
        {
            type Error = S::Error;
            fn seen(&self, id: &str) -> impl Future<Output = Result<bool, Self::Error>> + Send {
                self.0.seen(id)
            }
            fn remember(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
                self.0.remember(id)
            }
            fn remember_for(
                &self,
                id: &str,
                ttl: Option<std::time::Duration>,
            ) -> impl Future<Output = Result<(), Self::Error>> + Send {
                self.0.remember_for(id, ttl)
            }
            fn forget(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
                self.0.forget(id)
            }
            fn pipelined_remember(
                &self,
                id: &str,
                ttl: Option<std::time::Duration>,
                server: &str,
            ) -> Option<babelqueue_core::pipelined::PipelinedWrite> {
                self.0.pipelined_remember(id, ttl, server)
            }
        }
    };
}

forward_state_stores!();

// A `State<S>` argument holding a store is a store (the router's shared stores).
macro_rules! forward_state_lease_stores {
    () => {
        impl<S: babelqueue_core::lease::LeaseStore> babelqueue_core::lease::LeaseStore
            for crate::extract::State<S>
        {
            fn claim(
                &self,
                id: &str,
                lease: std::time::Duration,
            ) -> Result<babelqueue_core::lease::Claim, Self::Error> {
                self.0.claim(id, lease)
            }
            fn complete(
                &self,
                id: &str,
                token: &babelqueue_core::lease::LeaseToken,
                ttl: Option<std::time::Duration>,
            ) -> Result<bool, Self::Error> {
                self.0.complete(id, token, ttl)
            }
            fn release(
                &self,
                id: &str,
                token: &babelqueue_core::lease::LeaseToken,
            ) -> Result<bool, Self::Error> {
                self.0.release(id, token)
            }
        }

        impl<S: babelqueue_core::lease::AsyncLeaseStore> babelqueue_core::lease::AsyncLeaseStore
            for crate::extract::State<S>
        {
            fn claim(
                &self,
                id: &str,
                lease: std::time::Duration,
            ) -> impl Future<Output = Result<babelqueue_core::lease::Claim, Self::Error>> + Send
            {
                self.0.claim(id, lease)
            }
            fn complete(
                &self,
                id: &str,
                token: &babelqueue_core::lease::LeaseToken,
                ttl: Option<std::time::Duration>,
            ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
                self.0.complete(id, token, ttl)
            }
            fn release(
                &self,
                id: &str,
                token: &babelqueue_core::lease::LeaseToken,
            ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
                self.0.release(id, token)
            }
        }
    };
}

forward_state_lease_stores!();
