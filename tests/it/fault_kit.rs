//! The fault kit (`babelqueue::testing::faults`) used on the guard: store outages,
//! failed `remember`s, lost leases and fencing tokens, and concurrent redeliveries.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use babelqueue::lease::{LeaseHealth, LeaseLostCause, current_fencing_token};
use babelqueue::store_error::{UnavailableKind, find_unavailable};
use babelqueue::testing::faults::{DeliveryResult, FaultyStore, Redelivery, StoreCall};
use babelqueue::{BoxError, Envelope, InMemoryStore, Outcome, guard::Guard};

fn payment() -> Envelope {
    Envelope::new(
        "urn:babel:payments:charge",
        serde_json::json!({"amount": 4200}),
    )
    .expect("envelope")
}

#[tokio::test]
async fn a_store_that_cannot_answer_runs_nothing_and_says_so_by_type() {
    let store = FaultyStore::new(InMemoryStore::new());
    let env = payment();
    store.faults().fail_while(StoreCall::Seen, true);
    let charged = AtomicUsize::new(0);
    let charge = |_env: Envelope| async {
        charged.fetch_add(1, Ordering::SeqCst);
        Ok::<(), BoxError>(())
    };
    let down = Redelivery::of(&env)
        .times(3)
        .through_guard(&store, charge)
        .await;
    assert_eq!(down.effects, 0, "the handler must not run while seen fails");
    assert_eq!(down.unavailable(), 3, "{:?}", down.results);
    let err = down.errors().next().expect("an error");
    let marker = find_unavailable(err.as_ref()).expect("typed");
    assert_eq!(
        (marker.kind, marker.operation),
        (UnavailableKind::Injected, "seen")
    );

    store.faults().fail_while(StoreCall::Seen, false);
    let back = Redelivery::of(&env)
        .times(3)
        .through_guard(&store, charge)
        .await;
    assert_eq!((back.effects, back.ran, back.skipped), (1, 1, 2));
    assert_eq!(charged.load(Ordering::SeqCst), 1);
    assert_eq!(store.faults().injected(StoreCall::Seen), 3);
}

#[tokio::test]
async fn a_failed_remember_is_the_at_least_once_window() {
    let store = FaultyStore::new(InMemoryStore::new());
    let env = payment();
    store.faults().fail_nth(StoreCall::Remember, 1);
    let report = Redelivery::of(&env)
        .times(3)
        .through_guard(&store, |_env| async { Ok::<(), BoxError>(()) })
        .await;
    // The first run's `remember` failed (logged), so the second delivery runs again; the
    // second run is remembered and the third delivery is skipped.
    assert_eq!((report.effects, report.ran, report.skipped), (2, 2, 1));
    assert!(
        report.errors().next().is_none(),
        "a failed remember is not an error"
    );
}

#[tokio::test(start_paused = true)]
async fn eight_deliveries_at_once_under_a_renewed_lease_run_once() {
    let store = FaultyStore::new(InMemoryStore::new());
    let env = payment();
    let report = Redelivery::of(&env)
        .times(8)
        .all_at_once()
        .retry_in_flight(Duration::from_millis(25))
        .through_lease_guard(&store, Duration::from_millis(300), |_env| async {
            assert!(current_fencing_token().is_some());
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok::<(), BoxError>(())
        })
        .await;
    assert_eq!((report.effects, report.ran, report.skipped), (1, 1, 7));
    assert!(report.in_flight > 0, "the deliveries overlapped");
    assert!(
        store.faults().calls(StoreCall::Renew) >= 5,
        "renewed every 100 ms for 2 s: {}",
        store.faults().calls(StoreCall::Renew)
    );
}

#[tokio::test(start_paused = true)]
async fn renewals_that_cannot_reach_the_store_lose_the_lease_and_fencing_tells() {
    let store = Arc::new(FaultyStore::new(InMemoryStore::new()));
    store.faults().fail_while(StoreCall::Renew, true);
    let lease = Duration::from_millis(300);
    let first_fence = Arc::new(AtomicU64::new(0));
    let slow = {
        let (store, fence) = (Arc::clone(&store), Arc::clone(&first_fence));
        tokio::spawn(async move {
            Guard::new(&*store)
                .lease(lease)
                .run_async("pay_7f3a", async move {
                    fence.store(current_fencing_token().expect("fence"), Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok::<(), BoxError>(())
                })
                .await
        })
    };
    // After the lease ended (no renewal reached the store), another delivery takes it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = Guard::new(&*store)
        .lease(lease)
        .run_async("pay_7f3a", async { Ok::<(), BoxError>(()) })
        .await
        .expect("second delivery");
    let first = slow.await.expect("task").expect("first delivery");
    assert_eq!(first.outcome, Outcome::Ran);
    assert_eq!(
        first.lease,
        LeaseHealth::Lost(LeaseLostCause::CompleteRefused),
        "the lost lease is reported, typed"
    );
    assert_eq!(
        second.outcome,
        Outcome::Ran,
        "the id ran elsewhere meanwhile"
    );
    assert!(
        second.fencing_token.expect("fence") > first_fence.load(Ordering::SeqCst),
        "the newer holder's fencing token is larger: a downstream can refuse the stale one"
    );
    assert!(store.faults().injected(StoreCall::Renew) >= 2);
}

#[tokio::test]
async fn an_unavailable_claim_is_typed_and_runs_nothing() {
    let store = FaultyStore::new(InMemoryStore::new());
    let env = payment();
    store.faults().fail_next(StoreCall::Claim);
    let report = Redelivery::of(&env)
        .times(2)
        .through_lease_guard(&store, Duration::from_secs(30), |_env| async {
            Ok::<(), BoxError>(())
        })
        .await;
    assert!(matches!(report.results[0], DeliveryResult::Failed(_)));
    assert_eq!(report.unavailable(), 1);
    assert_eq!((report.effects, report.ran), (1, 1), "the retry ran");
}

#[tokio::test]
async fn a_down_store_fails_every_call_until_it_is_back() {
    let store = FaultyStore::new(InMemoryStore::new());
    store.faults().set_down(true);
    for call in [StoreCall::Seen, StoreCall::Remember, StoreCall::Forget] {
        let r = match call {
            StoreCall::Seen => babelqueue::AsyncStore::seen(&store, "x").await.map(|_| ()),
            StoreCall::Remember => babelqueue::AsyncStore::remember(&store, "x").await,
            _ => babelqueue::AsyncStore::forget(&store, "x").await,
        };
        assert!(r.expect_err(call.name()).is_injected());
    }
    store.faults().set_down(false);
    babelqueue::AsyncStore::remember(&store, "x")
        .await
        .expect("back");
    assert!(
        babelqueue::AsyncStore::seen(&store, "x")
            .await
            .expect("back")
    );
}
