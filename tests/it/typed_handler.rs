//! Typed `#[handler]` arguments and router state, through a real `Router`: what each
//! argument receives, the one rule for a payload that does not deserialize (a typed
//! `PayloadError`, the handler not run), a missing state (a typed `MissingState`), state
//! added before or after registration, `#[idempotent]` keyed on a store taken from
//! the state, and a missing state found before any message (by `Router::check_state`,
//! and by a consumer when it starts, reserving nothing).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue::runtime::{App, InMemoryTransport, Stats};
use babelqueue::{
    Attempts, Envelope, InMemoryStore, Json, Meta, Outcome, Router, State, Store, TypedHandler,
    extract::MissingState, extract::PayloadError, handler, idempotent,
};

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
struct Payment {
    payment_id: String,
    amount: u64,
}

/// What the handlers saw, per test (each test has its own `Seen` in its router's state).
#[derive(Default)]
struct Seen {
    runs: AtomicU32,
    last: std::sync::Mutex<Option<(Payment, u32, String)>>,
}

#[derive(Debug, thiserror::Error)]
#[error("declined")]
struct Declined;

#[handler("urn:babel:payments:charge")]
async fn charge(
    attempts: Attempts,
    seen: State<Seen>,
    env: &Envelope,
    Json(payment): Json<Payment>,
) -> Result<(), Declined> {
    seen.runs.fetch_add(1, Ordering::SeqCst);
    *seen.last.lock().unwrap() = Some((payment, attempts.0, env.meta.id.clone()));
    Ok(())
}

#[handler("urn:babel:payments:refund")]
fn refund(meta: Meta, seen: State<Seen>, env: Envelope) {
    assert_eq!(meta.id, env.meta.id);
    seen.runs.fetch_add(1, Ordering::SeqCst);
}

#[handler("urn:babel:payments:settle")]
#[idempotent(store = store)]
async fn settle(store: State<InMemoryStore>, seen: State<Seen>, env: &Envelope) {
    let _ = env;
    seen.runs.fetch_add(1, Ordering::SeqCst);
}

fn payment(urn: &str, data: serde_json::Value) -> Envelope {
    Envelope::new(urn, data).expect("valid envelope")
}

#[tokio::test]
async fn each_argument_gets_its_part_of_the_message() {
    let seen = Arc::new(Seen::default());
    let router = Router::new().register(charge {}).state(Arc::clone(&seen));
    // `State<Seen>` needs a `Seen`, not an `Arc<Seen>`: register the value itself.
    let err = router
        .dispatch(payment(
            "urn:babel:payments:charge",
            serde_json::json!({"payment_id": "p1", "amount": 1}),
        ))
        .await
        .unwrap()
        .unwrap_err();
    let missing = err
        .error()
        .downcast_ref::<MissingState>()
        .expect("MissingState");
    assert!(
        missing.type_name().ends_with("Seen"),
        "{}",
        missing.type_name()
    );
    assert_eq!(
        seen.runs.load(Ordering::SeqCst),
        0,
        "the handler did not run"
    );

    let router = router.state(Seen::default());
    let mut env = payment(
        "urn:babel:payments:charge",
        serde_json::json!({"payment_id": "p1", "amount": 4200}),
    );
    env.attempts = 2;
    let out = router.dispatch(env.clone()).await.unwrap().unwrap();
    assert_eq!(out, None, "unguarded");
    let state = router.state_map().get::<Seen>().unwrap();
    assert_eq!(state.runs.load(Ordering::SeqCst), 1);
    let last = state.last.lock().unwrap().clone().unwrap();
    assert_eq!(
        last,
        (
            Payment {
                payment_id: "p1".into(),
                amount: 4200
            },
            2,
            env.meta.id.clone()
        )
    );
}

#[tokio::test]
async fn a_payload_that_does_not_deserialize_is_a_payload_error_and_the_body_does_not_run() {
    let router = Router::new().state(Seen::default()).register(charge {});
    let bad = payment(
        "urn:babel:payments:charge",
        serde_json::json!({"payment_id": "p1", "amount": "a lot"}),
    );
    let err = router.dispatch(bad).await.unwrap().unwrap_err();
    // Recognisable by type (what the runtime dead-letters at once), with serde's reason.
    let payload = err
        .error()
        .downcast_ref::<PayloadError>()
        .expect("PayloadError");
    assert_eq!(payload.urn(), "urn:babel:payments:charge");
    assert!(
        payload.target().ends_with("Payment"),
        "{}",
        payload.target()
    );
    assert!(
        payload.serde_error().to_string().contains("invalid type"),
        "{}",
        payload.serde_error()
    );
    assert!(
        err.type_name().ends_with("PayloadError"),
        "{}",
        err.type_name()
    );
    let seen = router.state_map().get::<Seen>().unwrap();
    assert_eq!(seen.runs.load(Ordering::SeqCst), 0);

    // A missing field too.
    let missing = payment(
        "urn:babel:payments:charge",
        serde_json::json!({"amount": 1}),
    );
    let err = router.dispatch(missing).await.unwrap().unwrap_err();
    assert!(err.error().is::<PayloadError>());
    assert!(
        err.error().source().is_some(),
        "serde's error is the source"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_handler_by_value_envelope_and_meta() {
    let router = Router::new().register(refund {}).state(Seen::default());
    let env = payment("urn:babel:payments:refund", serde_json::json!({}));
    assert_eq!(router.dispatch(env).await.unwrap().unwrap(), None);
    let seen = router.state_map().get::<Seen>().unwrap();
    assert_eq!(seen.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn idempotent_store_from_the_state_needs_no_static() {
    // Picked at start-up (here: built in the test), handed to the router as state.
    let store = InMemoryStore::new();
    let router = Router::new()
        .register(settle {})
        .state(Seen::default())
        .state(store);
    let env = payment("urn:babel:payments:settle", serde_json::json!({}));
    assert_eq!(
        router.dispatch(env.clone()).await.unwrap().unwrap(),
        Some(Outcome::Ran)
    );
    assert_eq!(
        router.dispatch(env.clone()).await.unwrap().unwrap(),
        Some(Outcome::Skipped)
    );
    let seen = router.state_map().get::<Seen>().unwrap();
    assert_eq!(seen.runs.load(Ordering::SeqCst), 1);
    // The id is in the router's store, not in some other one.
    let store = router.state_map().get::<InMemoryStore>().unwrap();
    assert!(Store::seen(store, &env.meta.id).unwrap());

    // A second router with its own store: the same id runs again there.
    let other = Router::new()
        .state(InMemoryStore::new())
        .state(Seen::default())
        .register(settle {});
    assert_eq!(
        other.dispatch(env).await.unwrap().unwrap(),
        Some(Outcome::Ran)
    );
}

#[test]
fn the_handler_type_knows_its_urn_and_the_fn_stays_a_fn() {
    assert_eq!(charge {}.serves(), "urn:babel:payments:charge");
    assert_eq!(settle {}.serves(), "urn:babel:payments:settle");
    // `refund` is the fn, callable as written.
    let seen = State(Arc::new(Seen::default()));
    let env = payment("urn:babel:payments:refund", serde_json::json!({}));
    refund(env.meta.clone(), seen.clone(), env);
    assert_eq!(seen.runs.load(Ordering::SeqCst), 1);
}

/// State no router registers.
struct Ledger;

#[handler("urn:babel:payments:audit")]
async fn audit(ledger: State<Ledger>, env: &Envelope) {
    let _ = (ledger, env);
}

#[test]
fn a_missing_state_is_found_by_the_router_before_any_message() {
    let router = Router::new().register(audit {}).state(Seen::default());
    let missing = router.check_state().expect_err("Ledger is missing");
    assert!(missing.type_name().ends_with("Ledger"), "{missing}");
    assert_eq!(
        missing.handler(),
        Some("`audit` (`urn:babel:payments:audit`)")
    );
    assert!(
        missing
            .to_string()
            .starts_with("the handler `audit` (`urn:babel:payments:audit`) takes `State<"),
        "{missing}"
    );
    // Handlers without `State<T>` arguments, or with their state present, pass.
    assert!(
        Router::new()
            .register(refund {})
            .state(Seen::default())
            .check_state()
            .is_ok()
    );
    assert!(router.state(Ledger).check_state().is_ok());
}

#[tokio::test]
async fn a_consumer_with_a_missing_state_starts_nothing() {
    let transport = InMemoryTransport::new();
    let app = App::new(transport.clone())
        .queue("typed-handler-missing-state")
        .register(audit {});
    let env = payment("urn:babel:payments:audit", serde_json::json!({}))
        .with_queue("typed-handler-missing-state");
    app.publish_envelope(&env).await.unwrap();

    let err = app.drain().await.expect_err("the drain does not start");
    let missing = err.missing_state().expect("a MissingState");
    assert!(missing.type_name().ends_with("Ledger"), "{missing}");
    assert_eq!(
        missing.handler(),
        Some("`audit` (`urn:babel:payments:audit`)")
    );
    assert!(
        err.to_string()
            .starts_with("drain did not start: the handler `audit`"),
        "{err}"
    );
    assert_eq!(err.stats, Stats::default());
    // Nothing was reserved: the message is still queued, none in flight.
    assert_eq!(transport.len("typed-handler-missing-state"), 1);
    assert_eq!(transport.processing_len("typed-handler-missing-state"), 0);
    // `run_until` does not start either (it would otherwise block on the shutdown future).
    let stats = app.run_until(std::future::pending()).await;
    assert_eq!(stats, Stats::default());
    assert_eq!(transport.len("typed-handler-missing-state"), 1);

    // With the state, the same message is handled.
    let app = app.state(Ledger);
    let stats = app.drain().await.unwrap();
    assert_eq!(stats.succeeded, 1);
}
