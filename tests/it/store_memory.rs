//! The generic store suite against the in-memory store (every trait it implements).

use babelqueue::InMemoryStore;
use babelqueue::testing::{StoreFactory, StoreSpec};

/// One fresh `InMemoryStore` per namespace: the namespace of an in-memory store is the
/// instance itself.
struct Memory;

impl StoreFactory for Memory {
    type Store = InMemoryStore;

    async fn create(&self, spec: &StoreSpec) -> InMemoryStore {
        match spec.ttl {
            Some(ttl) => InMemoryStore::with_ttl(ttl),
            None => InMemoryStore::new(),
        }
    }

    fn claim_once<'a>(
        &'a self,
        store: &'a InMemoryStore,
        id: &'a str,
    ) -> Option<babelqueue::BoxFuture<'a, bool>> {
        Some(Box::pin(async move { store.claim(id) }))
    }
}

babelqueue::store_suite! {
    mod memory = Memory;
    kinds = [async_store, async_lease, sync_store, sync_lease];
}

/// Lease 300 ms, a handler of 2 s (paused tokio time: the in-memory store's clock is
/// tokio's), 8 deliveries of one id at once: the guard renews the lease, so exactly one
/// runs it; the others wait (`InFlight`) and then skip; the id is remembered afterwards.
#[tokio::test(start_paused = true)]
async fn renewed_lease_holds_under_paused_time() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use babelqueue::lease::current_fencing_token;
    use babelqueue::{BoxError, InFlight, Outcome, guard::Guard, lease::Claim, lease::LeaseHealth};

    let store = Arc::new(InMemoryStore::new());
    let effects = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (store, effects) = (Arc::clone(&store), Arc::clone(&effects));
            tokio::spawn(async move {
                loop {
                    let effects = Arc::clone(&effects);
                    let r = Guard::new(&*store)
                        .lease(Duration::from_millis(300))
                        .run_async("pay_7f3a", async move {
                            effects.fetch_add(1, Ordering::SeqCst);
                            assert!(current_fencing_token().is_some());
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            Ok::<(), BoxError>(())
                        })
                        .await;
                    match r {
                        Ok(r) => return r,
                        Err(e) if e.downcast_ref::<InFlight>().is_some() => {
                            tokio::time::sleep(Duration::from_millis(25)).await;
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("task"));
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1, "exactly one run");
    let ran: Vec<_> = outcomes
        .iter()
        .filter(|o| o.outcome == Outcome::Ran)
        .collect();
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0].lease, LeaseHealth::Held, "the lease held for 2 s");
    assert!(ran[0].fencing_token.is_some());
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| o.outcome == Outcome::Skipped)
            .count(),
        7
    );
    assert_eq!(
        babelqueue::AsyncLeaseStore::claim(&*store, "pay_7f3a", Duration::from_secs(1))
            .await
            .unwrap(),
        Claim::Completed
    );
}
