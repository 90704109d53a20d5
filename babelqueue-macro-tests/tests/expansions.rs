//! Runs the handlers of `babelqueue-macro-tests`: each guards (a redelivery is skipped),
//! whether it is called directly, through its router, or both.

use std::sync::Arc;

use babelqueue::{Envelope, Outcome, Router, Store};
use babelqueue_macro_tests::{called, envelopes, no_prelude};
use serde_json::json;

fn envelope(urn: &str, data: serde_json::Value) -> Envelope {
    Envelope::new(urn, data).expect("a valid envelope")
}

/// Dispatches `env` and returns what the guard decided.
async fn dispatch(router: &Router, env: Envelope) -> Option<Outcome> {
    router
        .dispatch(env)
        .await
        .expect("a registered URN")
        .expect("the handler succeeds")
}

#[test]
fn a_handler_called_directly_guards() {
    let env = envelope("urn:babel:macro-tests:direct", json!({}));
    called::direct(&env).unwrap();
    called::direct(&env).unwrap();
    assert_eq!(called::DIRECT.get(), 1, "the redelivery was skipped");
}

#[tokio::test]
async fn a_registered_handler_guards() {
    let router = called::router();
    let env = envelope("urn:babel:macro-tests:registered", json!({}));
    assert_eq!(dispatch(&router, env.clone()).await, Some(Outcome::Ran));
    assert_eq!(dispatch(&router, env).await, Some(Outcome::Skipped));
    assert_eq!(called::REGISTERED.get(), 1);
}

#[tokio::test]
async fn a_handler_both_called_and_registered_shares_its_store() {
    let router = called::router();
    let env = envelope("urn:babel:macro-tests:both", json!({}));
    called::both(&env);
    assert_eq!(dispatch(&router, env.clone()).await, Some(Outcome::Skipped));
    called::both(&env);
    assert_eq!(called::BOTH.get(), 1);
}

#[tokio::test]
async fn an_arc_envelope_parameter_is_keyed_on_its_meta_id() {
    let env = envelope("urn:babel:macro-tests:shared", json!({}));
    envelopes::call_shared(Arc::new(env.clone())).await.unwrap();
    let router = envelopes::router();
    assert_eq!(dispatch(&router, env.clone()).await, Some(Outcome::Skipped));
    assert_eq!(envelopes::SHARED.get(), 1);
    assert!(Store::seen(&*envelopes::STORE, &env.meta.id).unwrap());
}

#[tokio::test]
async fn an_aliased_envelope_parameter_is_keyed_on_its_meta_id() {
    let router = envelopes::router();
    let env = envelope("urn:babel:macro-tests:aliased", json!({}));
    assert_eq!(dispatch(&router, env.clone()).await, Some(Outcome::Ran));
    assert_eq!(dispatch(&router, env.clone()).await, Some(Outcome::Skipped));
    assert_eq!(envelopes::ALIASED.get(), 1);
    assert!(Store::seen(&*envelopes::STORE, &env.meta.id).unwrap());
}

#[tokio::test]
async fn the_typed_form_is_namespaced_by_the_handlers_urn() {
    let router = envelopes::router();
    let data = json!({"payment_id": "pay_7f3a", "amount": 4200});
    // Two messages (two `meta.id`s) for one payment: one charge.
    let first = envelope("urn:babel:payments:charge", data.clone());
    let again = envelope("urn:babel:payments:charge", data.clone());
    assert_eq!(dispatch(&router, first).await, Some(Outcome::Ran));
    assert_eq!(dispatch(&router, again).await, Some(Outcome::Skipped));
    let store = &*envelopes::STORE;
    assert!(Store::seen(store, "urn:babel:payments:charge#pay_7f3a").unwrap());
    assert!(
        !Store::seen(store, "pay_7f3a").unwrap(),
        "the key is namespaced"
    );
    // The refund (`#[idempotent]` written above `#[handler]`) has a namespace of its own:
    // the same payment id runs there once too.
    let refund = envelope("urn:babel:payments:refund", data.clone());
    assert_eq!(dispatch(&router, refund).await, Some(Outcome::Ran));
    let refund = envelope("urn:babel:payments:refund", data);
    assert_eq!(dispatch(&router, refund).await, Some(Outcome::Skipped));
    assert!(Store::seen(store, "urn:babel:payments:refund#pay_7f3a").unwrap());
    assert_eq!(envelopes::CHARGES.get(), 2);
}

#[tokio::test]
async fn handlers_without_the_implicit_prelude_guard() {
    let router = no_prelude::router();
    let env = envelope("urn:babel:macro-tests:no-prelude-sync", json!({}));
    no_prelude::call_sync(&env).unwrap();
    assert_eq!(dispatch(&router, env).await, Some(Outcome::Skipped));
    assert_eq!(no_prelude::SYNC.get(), 1);

    let first = envelope(
        "urn:babel:macro-tests:no-prelude-async",
        json!({"order": 7}),
    );
    let again = envelope(
        "urn:babel:macro-tests:no-prelude-async",
        json!({"order": 7}),
    );
    assert_eq!(dispatch(&router, first).await, Some(Outcome::Ran));
    assert_eq!(dispatch(&router, again).await, Some(Outcome::Skipped));
    assert_eq!(no_prelude::ASYNC.get(), 1);
}
