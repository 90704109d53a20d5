//! Run-time behaviour of `#[idempotent]`: `?` and early `return`, `key =` dedupe on a
//! business id, empty keys failing open, `ttl =` reaching the store, a failing store,
//! and `lease =` under 16 concurrent deliveries of one id.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use babelqueue::{AsyncStore, Envelope, InFlight, InMemoryStore, Store, idempotent};

fn payment(data: serde_json::Value) -> Envelope {
    Envelope::new("urn:babel:payments:charge", data).expect("valid envelope")
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("bad amount")]
    Amount(#[from] std::num::ParseIntError),
    #[error(transparent)]
    Busy(#[from] InFlight),
    #[error(transparent)]
    Store(#[from] StoreDown),
}

// ---- `?` and early return ------------------------------------------------------------------

struct Counted {
    store: InMemoryStore,
    effects: AtomicU32,
}

impl Counted {
    fn new() -> Self {
        Counted {
            store: InMemoryStore::new(),
            effects: AtomicU32::new(0),
        }
    }

    /// `?` on a bad amount; early `return Ok(())` for a zero amount.
    #[idempotent(store = self.store)]
    fn charge(&self, env: &Envelope) -> Result<(), ChargeError> {
        self.effects.fetch_add(1, Ordering::SeqCst);
        let amount: u64 = env.data["amount"].as_str().unwrap_or_default().parse()?;
        if amount == 0 {
            return Ok(());
        }
        Ok(())
    }

    #[idempotent(store = self.store)]
    async fn charge_async(&self, env: &Envelope) -> Result<(), ChargeError> {
        tokio::task::yield_now().await;
        self.effects.fetch_add(1, Ordering::SeqCst);
        let amount: u64 = env.data["amount"].as_str().unwrap_or_default().parse()?;
        if amount == 0 {
            return Ok(());
        }
        Ok(())
    }
}

#[test]
fn question_mark_returns_the_error_and_leaves_the_id_open() {
    let c = Counted::new();
    let bad = payment(serde_json::json!({"amount": "x"}));
    assert!(matches!(c.charge(&bad), Err(ChargeError::Amount(_))));
    assert!(matches!(c.charge(&bad), Err(ChargeError::Amount(_))));
    assert_eq!(
        c.effects.load(Ordering::SeqCst),
        2,
        "a failure is retried, not skipped"
    );
    assert!(!Store::seen(&c.store, &bad.meta.id).unwrap_or_else(|e| match e {}));
}

#[test]
fn early_return_ok_is_a_success_and_remembered() {
    let c = Counted::new();
    let zero = payment(serde_json::json!({"amount": "0"}));
    c.charge(&zero).unwrap();
    c.charge(&zero).unwrap();
    assert_eq!(c.effects.load(Ordering::SeqCst), 1);
    assert!(Store::seen(&c.store, &zero.meta.id).unwrap_or_else(|e| match e {}));
}

#[tokio::test]
async fn async_question_mark_and_early_return() {
    let c = Counted::new();
    let bad = payment(serde_json::json!({"amount": "x"}));
    assert!(matches!(
        c.charge_async(&bad).await,
        Err(ChargeError::Amount(_))
    ));
    let zero = payment(serde_json::json!({"amount": "0"}));
    c.charge_async(&zero).await.unwrap();
    c.charge_async(&zero).await.unwrap();
    assert_eq!(c.effects.load(Ordering::SeqCst), 2, "bad once, zero once");
    assert!(
        !AsyncStore::seen(&c.store, &bad.meta.id)
            .await
            .unwrap_or_else(|e| match e {})
    );
}

// ---- key = ... ----------------------------------------------------------------------------

static BY_PAYMENT: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGED: AtomicU32 = AtomicU32::new(0);

/// Keyed on the business id: a client retry publishes a new message (new `meta.id`).
#[idempotent(store = BY_PAYMENT, key = env.data.get("payment_id"))]
fn charge_by_payment(env: &Envelope) {
    let _ = env;
    CHARGED.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn key_dedupes_on_the_business_id_and_empty_keys_fail_open() {
    let retry_1 = payment(serde_json::json!({"payment_id": "pay_7f3a"}));
    let retry_2 = payment(serde_json::json!({"payment_id": "pay_7f3a"}));
    assert_ne!(retry_1.meta.id, retry_2.meta.id, "two distinct messages");
    charge_by_payment(&retry_1);
    charge_by_payment(&retry_2);
    assert_eq!(
        CHARGED.load(Ordering::SeqCst),
        1,
        "one payment, charged once"
    );

    charge_by_payment(&payment(serde_json::json!({"payment_id": "pay_other"})));
    assert_eq!(CHARGED.load(Ordering::SeqCst), 2);

    // No usable key (absent, empty, not a string or number): run every time.
    let absent = payment(serde_json::json!({}));
    let empty = payment(serde_json::json!({"payment_id": ""}));
    let null = payment(serde_json::json!({"payment_id": null}));
    for env in [&absent, &absent, &empty, &empty, &null, &null] {
        charge_by_payment(env);
    }
    assert_eq!(
        CHARGED.load(Ordering::SeqCst),
        8,
        "six deliveries without a key all ran"
    );
}

static BY_ORDER: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// The key may come from a parameter that is not an envelope; no envelope at all, so the
/// namespace is named (the default one, the handler's URN, is the envelope's `job`).
#[idempotent(store = BY_ORDER, key = order_id, namespace = "shipping")]
async fn ship(order_id: u64, shipped: &AtomicU32) {
    shipped.fetch_add(1, Ordering::SeqCst);
}

#[tokio::test]
async fn key_from_a_plain_parameter() {
    let shipped = AtomicU32::new(0);
    ship(1042, &shipped).await;
    ship(1042, &shipped).await;
    ship(1043, &shipped).await;
    assert_eq!(shipped.load(Ordering::SeqCst), 2);
    assert!(Store::seen(&*BY_ORDER, "shipping#1042").unwrap_or_else(|e| match e {}));
}

// ---- key namespaces --------------------------------------------------------------------------

static LEDGER: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGES: AtomicU32 = AtomicU32::new(0);
static REFUNDS: AtomicU32 = AtomicU32::new(0);
static SETTLED: AtomicU32 = AtomicU32::new(0);

#[idempotent(store = LEDGER, key = env.data.get("payment_id"))]
fn charge(env: &Envelope) {
    let _ = env;
    CHARGES.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = LEDGER, key = env.data.get("payment_id"))]
async fn refund(env: Envelope) {
    let _ = env;
    REFUNDS.fetch_add(1, Ordering::SeqCst);
}

/// Two handlers sharing one namespace on purpose: they dedupe each other.
#[idempotent(store = LEDGER, key = env.data.get("payment_id"), namespace = "settlement")]
fn settle_by_card(env: &Envelope) {
    let _ = env;
    SETTLED.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = LEDGER, key = env.data.get("payment_id"), namespace = "settlement")]
fn settle_by_transfer(env: &mut Envelope) {
    let _ = env;
    SETTLED.fetch_add(1, Ordering::SeqCst);
}

/// `namespace = none`: the bare key, as other SDKs write it.
#[idempotent(store = LEDGER, key = env.data.get("payment_id"), namespace = none)]
fn audit(env: &Envelope) {
    let _ = env;
}

#[tokio::test]
async fn charge_and_refund_keyed_on_one_payment_do_not_skip_each_other() {
    let on =
        |urn: &str| Envelope::new(urn, serde_json::json!({"payment_id": "pay_ns_7f3a"})).unwrap();
    let seen = |key: &str| Store::seen(&*LEDGER, key).unwrap_or_else(|e| match e {});
    charge(&on("urn:babel:payments:charge"));
    refund(on("urn:babel:payments:refund")).await;
    assert_eq!(
        (
            CHARGES.load(Ordering::SeqCst),
            REFUNDS.load(Ordering::SeqCst)
        ),
        (1, 1),
        "the refund is not skipped after the charge of the same payment"
    );
    // Each handler still dedupes its own redeliveries (new meta.id, same payment).
    charge(&on("urn:babel:payments:charge"));
    refund(on("urn:babel:payments:refund")).await;
    assert_eq!(
        (
            CHARGES.load(Ordering::SeqCst),
            REFUNDS.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    assert!(seen("urn:babel:payments:charge#pay_ns_7f3a"));
    assert!(seen("urn:babel:payments:refund#pay_ns_7f3a"));
    assert!(
        !seen("pay_ns_7f3a"),
        "a namespaced key is never written bare"
    );

    // An explicit namespace is shared on purpose.
    settle_by_card(&on("urn:babel:payments:settle-card"));
    settle_by_transfer(&mut on("urn:babel:payments:settle-transfer"));
    assert_eq!(SETTLED.load(Ordering::SeqCst), 1);
    assert!(seen("settlement#pay_ns_7f3a"));

    audit(&on("urn:babel:payments:audit"));
    assert!(
        seen("pay_ns_7f3a"),
        "`namespace = none` writes the key bare"
    );
}

// ---- fingerprint -----------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
enum ReplayError {
    #[error(transparent)]
    Replay(#[from] babelqueue::PayloadMismatch),
}

static FP_STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static FP_SYNC_RUNS: AtomicU32 = AtomicU32::new(0);
static FP_ASYNC_RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(store = FP_STORE, key = env.data.get("payment_id"), fingerprint)]
fn capture_checked(env: &Envelope) -> Result<(), ReplayError> {
    let _ = env;
    FP_SYNC_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// On `meta.id`: a redelivery whose `data` was altered is refused.
#[idempotent(store = FP_STORE, fingerprint, ttl = "1h")]
async fn capture_by_id(env: Envelope) -> Result<(), ReplayError> {
    let _ = env;
    FP_ASYNC_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn fingerprint_refuses_a_replayed_key_with_another_payload() {
    let amount = |n: u32| payment(serde_json::json!({"payment_id": "pay_fp", "amount": n}));
    capture_checked(&amount(4200)).unwrap();
    capture_checked(&amount(4200)).unwrap();
    assert_eq!(
        FP_SYNC_RUNS.load(Ordering::SeqCst),
        1,
        "same payload: skipped"
    );
    let err = capture_checked(&amount(9900)).unwrap_err();
    assert!(
        err.to_string().contains("differs from the first delivery"),
        "{err}"
    );
    assert_eq!(FP_SYNC_RUNS.load(Ordering::SeqCst), 1, "refused, not run");

    let first = amount(1);
    let mut altered = first.clone();
    altered.data.insert("amount".into(), serde_json::json!(2));
    capture_by_id(first.clone()).await.unwrap();
    capture_by_id(first).await.unwrap();
    assert!(matches!(
        capture_by_id(altered).await,
        Err(ReplayError::Replay(_))
    ));
    assert_eq!(FP_ASYNC_RUNS.load(Ordering::SeqCst), 1);
}

// ---- ttl = ... -----------------------------------------------------------------------------

static TTL_STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static TTL_RUNS: AtomicU32 = AtomicU32::new(0);
static FOREVER_RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(store = TTL_STORE, ttl = "500ms")]
fn short_lived(env: &Envelope) {
    let _ = env;
    TTL_RUNS.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = TTL_STORE)]
fn remembered_forever(env: &Envelope) {
    let _ = env;
    FOREVER_RUNS.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn ttl_reaches_the_store() {
    let a = payment(serde_json::json!({}));
    let b = payment(serde_json::json!({}));
    short_lived(&a);
    short_lived(&a);
    remembered_forever(&b);
    assert_eq!(
        TTL_RUNS.load(Ordering::SeqCst),
        1,
        "remembered within the ttl"
    );
    std::thread::sleep(Duration::from_millis(800));
    short_lived(&a);
    remembered_forever(&b);
    assert_eq!(
        TTL_RUNS.load(Ordering::SeqCst),
        2,
        "the id expired after 500ms"
    );
    assert_eq!(
        FOREVER_RUNS.load(Ordering::SeqCst),
        1,
        "no ttl: still remembered"
    );
}

// ---- a store that fails ---------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
#[error("store unavailable")]
struct StoreDown;

babelqueue::handler_error_from!(StoreDown);

/// A store whose `seen` or `remember` can be made to fail.
#[derive(Default)]
struct FlakyStore {
    inner: InMemoryStore,
    seen_down: AtomicBool,
    remember_down: AtomicBool,
}

impl Store for FlakyStore {
    type Error = StoreDown;
    fn seen(&self, id: &str) -> Result<bool, StoreDown> {
        if self.seen_down.load(Ordering::SeqCst) {
            return Err(StoreDown);
        }
        Store::seen(&self.inner, id).map_err(|e| match e {})
    }
    fn remember(&self, id: &str) -> Result<(), StoreDown> {
        if self.remember_down.load(Ordering::SeqCst) {
            return Err(StoreDown);
        }
        Store::remember(&self.inner, id).map_err(|e| match e {})
    }
    fn forget(&self, id: &str) -> Result<(), StoreDown> {
        Store::forget(&self.inner, id).map_err(|e| match e {})
    }
}

#[idempotent(store = store)]
fn charge_with(store: &FlakyStore, effects: &AtomicU32, env: &Envelope) -> Result<(), ChargeError> {
    let _ = env;
    effects.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[test]
fn a_failing_store_is_reported_not_guessed() {
    let store = FlakyStore::default();
    let effects = AtomicU32::new(0);
    let env = payment(serde_json::json!({}));

    store.seen_down.store(true, Ordering::SeqCst);
    assert!(matches!(
        charge_with(&store, &effects, &env),
        Err(ChargeError::Store(StoreDown))
    ));
    assert_eq!(
        effects.load(Ordering::SeqCst),
        0,
        "seen failed: the handler did not run"
    );

    store.seen_down.store(false, Ordering::SeqCst);
    store.remember_down.store(true, Ordering::SeqCst);
    charge_with(&store, &effects, &env).expect("remember failing after the effect still acks");
    charge_with(&store, &effects, &env).unwrap();
    assert_eq!(
        effects.load(Ordering::SeqCst),
        2,
        "nothing remembered: the redelivery ran"
    );

    store.remember_down.store(false, Ordering::SeqCst);
    charge_with(&store, &effects, &env).unwrap();
    charge_with(&store, &effects, &env).unwrap();
    assert_eq!(effects.load(Ordering::SeqCst), 3);
}

// ---- lease = ... ----------------------------------------------------------------------------

struct Leased {
    store: InMemoryStore,
    effects: AtomicU32,
    refused: AtomicU32,
}

impl Leased {
    /// Holds the claim until every other delivery has been refused, so the race is
    /// decided by the claim alone, not by timing.
    #[idempotent(store = self.store, lease = "30s")]
    async fn charge(&self, env: Envelope, others: u32) -> Result<(), ChargeError> {
        let _ = env;
        self.effects.fetch_add(1, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.refused.load(Ordering::SeqCst) < others {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the others never got an answer"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_lets_one_of_16_concurrent_deliveries_run() {
    const TASKS: u32 = 16;
    let leased = Arc::new(Leased {
        store: InMemoryStore::new(),
        effects: AtomicU32::new(0),
        refused: AtomicU32::new(0),
    });
    let env = payment(serde_json::json!({"payment_id": "pay_7f3a"}));
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS as usize));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (leased, env, barrier) = (Arc::clone(&leased), env.clone(), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let result = leased.charge(env, TASKS - 1).await;
            if let Err(ChargeError::Busy(_)) = &result {
                leased.refused.fetch_add(1, Ordering::SeqCst);
            }
            result
        }));
    }
    let mut in_flight = 0;
    let mut ok = 0;
    for task in tasks {
        match task.await.expect("task did not panic") {
            Ok(()) => ok += 1,
            Err(ChargeError::Busy(e)) => {
                assert_eq!(e.id, env.meta.id);
                in_flight += 1;
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(
        leased.effects.load(Ordering::SeqCst),
        1,
        "exactly one effect"
    );
    assert_eq!(
        (ok, in_flight),
        (1, TASKS - 1),
        "the losers were told InFlight"
    );

    // Completed: a later delivery is a skip, not another effect.
    leased.charge(env, 0).await.unwrap();
    assert_eq!(leased.effects.load(Ordering::SeqCst), 1);
}

static LEASE_STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = LEASE_STORE, lease = "30s")]
fn capture(env: &Envelope, fail: bool) -> Result<(), ChargeError> {
    let _ = env;
    if fail {
        return Err(ChargeError::Amount("x".parse::<u64>().unwrap_err()));
    }
    Ok(())
}

#[test]
fn sync_lease_releases_the_claim_on_failure() {
    let env = payment(serde_json::json!({}));
    assert!(capture(&env, true).is_err());
    capture(&env, false).expect("the failed run released its claim: the retry runs");
    capture(&env, false).expect("completed: skipped");
    assert!(Store::seen(&*LEASE_STORE, &env.meta.id).unwrap_or_else(|e| match e {}));
}
