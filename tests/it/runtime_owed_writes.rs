//! The store write a successful handler owes (`remember` in seen-set
//! mode, `complete` in lease mode) is never dropped while the consumer lives. The store
//! goes down right after the handler succeeded: the message stays unacknowledged, the
//! key's turn stays held (a duplicate in this process waits), the write is retried with
//! the store backoff until the store answers, then the ack goes; the byte-identical
//! duplicate is skipped. Only a shutdown past its grace period leaves the message, unacked,
//! for recovery. In-process transport, a store with injected faults, paused tokio time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use babelqueue::runtime::{App, InMemoryTransport, Transport};
use babelqueue::testing::faults::{FaultyStore, StoreCall};
use babelqueue::{BoxError, Envelope, Guard, InMemoryStore};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";

type Store = Arc<FaultyStore<InMemoryStore>>;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Seen,
    Lease,
    Sync,
}

/// An app whose handler charges (counts) and then takes the store down for `outage`
/// (on its first charge only): "the store became unreachable right after the handler
/// succeeded".
fn app(
    t: &InMemoryTransport,
    queue: &str,
    store: &Store,
    charges: &Arc<AtomicUsize>,
    mode: Mode,
    outage: Option<Duration>,
) -> App {
    let cut = move |store: &Store, n: usize| {
        if n == 1
            && let Some(outage) = outage
        {
            store.faults().set_down(true);
            let store = Arc::clone(store);
            tokio::spawn(async move {
                tokio::time::sleep(outage).await;
                store.faults().set_down(false);
            });
        }
    };
    let base = App::new(t.clone())
        .queue(queue)
        .concurrency(2)
        .store_backoff(Duration::from_millis(100), Duration::from_secs(5))
        // Shorter than the 3 s outages: the time a write is owed is not the handler's.
        .handler_timeout(Duration::from_secs(1))
        .in_flight_delay(Duration::from_millis(200));
    let (store, charges) = (Arc::clone(store), Arc::clone(charges));
    match mode {
        Mode::Seen | Mode::Lease => base.route_async(CHARGE, move |env: Envelope| {
            let (store, charges) = (Arc::clone(&store), Arc::clone(&charges));
            async move {
                let charge = async {
                    let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                    cut(&store, n);
                    Ok::<(), BoxError>(())
                };
                match mode {
                    Mode::Lease => Guard::new(&*store)
                        .lease(Duration::from_secs(30))
                        .run_async(&env, charge)
                        .await
                        .map(drop),
                    _ => Guard::new(&*store).run_async(&env, charge).await.map(drop),
                }
            }
        }),
        Mode::Sync => {
            let handle = tokio::runtime::Handle::current();
            base.route_sync(CHARGE, move |env: &Envelope| {
                Guard::new(&*store)
                    .run(env, || {
                        let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                        let _rt = handle.enter();
                        cut(&store, n);
                        Ok::<(), BoxError>(())
                    })
                    .map(drop)
            })
        }
    }
}

/// One payment delivered twice (the same bytes), the store down for `outage` right
/// after the first charge: charged once, the duplicate skipped, nothing left.
async fn charged_once_across_an_outage(mode: Mode, outage: Duration) {
    let queue = format!("owed-{mode:?}-{}", outage.as_millis()).to_lowercase();
    let t = InMemoryTransport::new();
    let store: Store = Arc::new(FaultyStore::new(InMemoryStore::new()));
    let charges = Arc::new(AtomicUsize::new(0));
    let app = app(&t, &queue, &store, &charges, mode, Some(outage));
    let env = Envelope::new(CHARGE, json!({"amount": 4200}))
        .unwrap()
        .with_queue(&queue);
    let bytes = env.encode();
    app.publish_raw(bytes.clone()).await.unwrap();
    app.publish_raw(bytes).await.unwrap();
    let stats = app.drain().await.unwrap();
    let owed = match mode {
        Mode::Lease => StoreCall::Complete,
        _ => StoreCall::Remember,
    };
    assert!(
        store.faults().injected(owed) >= 1,
        "{mode:?}: the owed write met the outage"
    );
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "{mode:?}, outage {outage:?}: the duplicate must not be charged again ({stats:?})"
    );
    assert_eq!((stats.succeeded, stats.skipped), (1, 1), "{stats:?}");
    assert_eq!(stats.unacked, 0, "{stats:?}");
    assert_eq!(
        (
            t.len(&queue),
            t.processing_len(&queue),
            t.delayed_len(&queue)
        ),
        (0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn seen_set_remember_is_retried_through_a_300_ms_outage() {
    charged_once_across_an_outage(Mode::Seen, Duration::from_millis(300)).await;
}

#[tokio::test(start_paused = true)]
async fn seen_set_remember_is_retried_through_a_3_s_outage() {
    charged_once_across_an_outage(Mode::Seen, Duration::from_secs(3)).await;
}

#[tokio::test(start_paused = true)]
async fn lease_complete_is_retried_through_a_300_ms_outage() {
    charged_once_across_an_outage(Mode::Lease, Duration::from_millis(300)).await;
}

#[tokio::test(start_paused = true)]
async fn lease_complete_is_retried_through_a_3_s_outage() {
    charged_once_across_an_outage(Mode::Lease, Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_guard_retries_its_remember_too() {
    charged_once_across_an_outage(Mode::Sync, Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_guard_retries_its_remember_past_the_handler_timeout() {
    charged_once_across_an_outage(Mode::Sync, Duration::from_secs(3)).await;
}

/// The store never comes back: the message stays unacknowledged while the write is
/// retried, and a shutdown past its grace period leaves it in flight for recovery
/// (never acked, never dropped).
#[tokio::test(start_paused = true)]
async fn a_shutdown_past_its_grace_leaves_the_owed_message_unacked() {
    let queue = "owed-shutdown";
    let t = InMemoryTransport::new();
    let store: Store = Arc::new(FaultyStore::new(InMemoryStore::new()));
    let charges = Arc::new(AtomicUsize::new(0));
    let app =
        app(&t, queue, &store, &charges, Mode::Seen, None).shutdown_grace(Duration::from_secs(1));
    // Down for good once the first charge is done.
    store.faults().fail_while(StoreCall::Remember, true);
    let env = Envelope::new(CHARGE, json!({"amount": 1}))
        .unwrap()
        .with_queue(queue);
    app.publish_envelope(&env).await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = {
        let app = app.clone();
        tokio::spawn(async move {
            app.run_until(async move {
                let _ = stop_rx.await;
            })
            .await
        })
    };
    // A minute of retries: still one charge, the message still held, not acked.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    assert_eq!(
        t.processing_len(queue),
        1,
        "unacked while the write is owed"
    );
    assert!(store.faults().injected(StoreCall::Remember) >= 5);
    let r = app.readiness();
    assert!(
        r.consuming && !r.store_available,
        "not ready while the write is owed: {r:?}"
    );
    stop_tx.send(()).unwrap();
    let stats = run.await.unwrap();
    assert_eq!((stats.acked, stats.unacked), (0, 1), "{stats:?}");
    assert_eq!(t.processing_len(queue), 1, "left in flight for recovery");
    let _ = t.leave(queue).await;
}

/// While the write is owed, the duplicate reserved by the second worker waits for the
/// key's turn (it does not even ask the store), then finds the id remembered.
#[tokio::test(start_paused = true)]
async fn a_duplicate_in_this_process_waits_for_the_owed_write() {
    let queue = "owed-turn";
    let t = InMemoryTransport::new();
    let store: Store = Arc::new(FaultyStore::new(InMemoryStore::new()));
    let charges = Arc::new(AtomicUsize::new(0));
    let app = app(&t, queue, &store, &charges, Mode::Seen, None);
    store.faults().fail_while(StoreCall::Remember, true);
    let body = Envelope::new(CHARGE, json!({"amount": 3}))
        .unwrap()
        .with_queue(queue)
        .encode();
    app.publish_raw(body.clone()).await.unwrap();
    app.publish_raw(body).await.unwrap();
    let drain = tokio::spawn({
        let app = app.clone();
        async move { app.drain().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    assert_eq!(t.processing_len(queue), 2, "both copies held, none acked");
    assert_eq!(
        store.faults().calls(StoreCall::Seen),
        1,
        "the duplicate waits for the turn before asking the store"
    );
    store.faults().fail_while(StoreCall::Remember, false);
    let stats = drain.await.unwrap();
    assert_eq!((stats.succeeded, stats.skipped), (1, 1), "{stats:?}");
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    assert_eq!((t.len(queue), t.processing_len(queue)), (0, 0));
}

/// A lease's owed `complete` is retried at least every third of the lease, however far the
/// store backoff has grown: the store back for 400 ms between two cuts is not missed.
/// Backoff 100 ms doubling to 5 s, lease 3 s: the tries go at 0.1, 0.3, 0.7, 1.5, 2.5 s
/// after the charge (capped at 1 s apart) and the one at 2.5 s lands; an uncapped backoff
/// would try at 3.1 s, into the second cut, after the lease had ended.
#[tokio::test(start_paused = true)]
async fn a_lease_complete_is_retried_within_the_lease_not_at_the_store_backoff() {
    let queue = "owed-lease-cap";
    let t = InMemoryTransport::new();
    let store: Store = Arc::new(FaultyStore::new(InMemoryStore::new()));
    let charged_at = Arc::new(std::sync::Mutex::new(None::<tokio::time::Instant>));
    let app = App::new(t.clone())
        .queue(queue)
        .store_backoff(Duration::from_millis(100), Duration::from_secs(5))
        .handler_timeout(Duration::from_secs(1))
        .route_async(CHARGE, {
            let (store, charged_at) = (Arc::clone(&store), Arc::clone(&charged_at));
            move |env: Envelope| {
                let (store, charged_at) = (Arc::clone(&store), Arc::clone(&charged_at));
                async move {
                    let charge = async {
                        *charged_at.lock().unwrap() = Some(tokio::time::Instant::now());
                        // Down now, back at 2.3 s for 400 ms, down again until 20 s.
                        store.faults().set_down(true);
                        let store = Arc::clone(&store);
                        tokio::spawn(async move {
                            let ms = |n| tokio::time::sleep(Duration::from_millis(n));
                            ms(2_300).await;
                            store.faults().set_down(false);
                            ms(400).await;
                            store.faults().set_down(true);
                            ms(17_300).await;
                            store.faults().set_down(false);
                        });
                        Ok::<(), BoxError>(())
                    };
                    Guard::new(&*store)
                        .lease(Duration::from_secs(3))
                        .run_async(&env, charge)
                        .await
                        .map(drop)
                }
            }
        });
    let env = Envelope::new(CHARGE, json!({"amount": 7}))
        .unwrap()
        .with_queue(queue);
    app.publish_envelope(&env).await.unwrap();
    let stats = app.drain().await.unwrap();
    let took = charged_at.lock().unwrap().expect("charged").elapsed();
    assert!(
        took >= Duration::from_millis(2_300) && took < Duration::from_millis(2_700),
        "the complete landed while the store was back, not after the second cut: {took:?}"
    );
    let f = store.faults();
    assert_eq!(
        (
            f.injected(StoreCall::Complete),
            f.calls(StoreCall::Complete)
        ),
        (5, 6),
        "five tries met the first cut, the sixth landed"
    );
    assert_eq!((stats.succeeded, stats.unacked), (1, 0), "{stats:?}");
    assert_eq!((t.len(queue), t.processing_len(queue)), (0, 0));
}
