//! The owed store write, on real servers: the broker is the shared Redis, the dedupe store a
//! Redis of its own (ports 17460 and 17462, SIGKILLed and restarted by pid), so the guard's owed
//! write is not pipelined with the ack. The store dies right after the handler succeeded
//! and is back 300 ms later: the owed `remember` / `complete` is retried until it lands,
//! and the byte-identical duplicate is skipped (an ack after one failed try would let the
//! duplicate be charged again).

use crate::fleet_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babelqueue::redis::{RedisStore, RedisTransport};
use babelqueue::runtime::App;
use babelqueue::{BoxError, Envelope, Guard};
use fleet_support::{QueueGuard, RedisServer, shared_url};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";
async fn charged_once(lease: bool, port: u16) {
    let q = QueueGuard::new("owed-outage", &shared_url());
    let server = Arc::new(Mutex::new(
        tokio::task::spawn_blocking(move || RedisServer::start(port, &[]))
            .await
            .unwrap(),
    ));
    let url = server.lock().unwrap().url();
    let store = Arc::new(
        RedisStore::builder(&url)
            .prefix(format!("bq-test:owed:{}:", uuid::Uuid::new_v4().simple()))
            .connection_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_secs(1))
            .connect()
            .await
            .unwrap(),
    );
    let charges = Arc::new(AtomicUsize::new(0));
    let restarter: Arc<Mutex<Option<std::thread::JoinHandle<()>>>> = Arc::default();
    let transport = RedisTransport::connect(&shared_url()).await.unwrap();
    let app = {
        let (store, charges, server) = (store.clone(), charges.clone(), server.clone());
        let restarter = restarter.clone();
        App::new(transport)
            .queue(&q.name)
            .store_timeout(Duration::from_secs(2))
            .store_backoff(Duration::from_millis(100), Duration::from_secs(1))
            .in_flight_delay(Duration::from_millis(200))
            .route_async(CHARGE, move |env: Envelope| {
                let (store, charges, server) = (store.clone(), charges.clone(), server.clone());
                let restarter = restarter.clone();
                async move {
                    let charge = async {
                        if charges.fetch_add(1, Ordering::SeqCst) == 0 {
                            // The store dies right after the charge, and is back 300 ms later.
                            let s = server.clone();
                            tokio::task::spawn_blocking(move || s.lock().unwrap().kill())
                                .await
                                .unwrap();
                            *restarter.lock().unwrap() = Some(std::thread::spawn(move || {
                                std::thread::sleep(Duration::from_millis(300));
                                server.lock().unwrap().restart();
                            }));
                        }
                        Ok::<(), BoxError>(())
                    };
                    let guard = Guard::new(&*store);
                    if lease {
                        guard
                            .lease(Duration::from_secs(30))
                            .run_async(&env, charge)
                            .await
                            .map(drop)
                    } else {
                        guard.run_async(&env, charge).await.map(drop)
                    }
                }
            })
    };
    let body = Envelope::new(CHARGE, json!({"amount": 4200}))
        .unwrap()
        .with_queue(&q.name)
        .encode();
    app.publish_raw(body.clone()).await.unwrap();
    app.publish_raw(body).await.unwrap();
    let stats = tokio::time::timeout(Duration::from_secs(120), app.drain())
        .await
        .expect("the drain ends")
        .unwrap();
    // The restart is over before the server is stopped (by pid), even if a check fails.
    let restart = restarter.lock().unwrap().take();
    if let Some(t) = restart {
        t.join().unwrap();
    }
    server.lock().unwrap().kill();
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "lease={lease}: the duplicate is not charged again: {stats:?}"
    );
    assert_eq!((stats.succeeded, stats.skipped), (1, 1), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL) and redis-server on the PATH (starts its own on port 17460)"]
async fn a_remember_owed_across_a_300_ms_store_outage_lands_and_the_duplicate_is_skipped() {
    charged_once(false, 17460).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL) and redis-server on the PATH (starts its own on port 17462)"]
async fn a_complete_owed_across_a_300_ms_store_outage_lands_and_the_duplicate_is_skipped() {
    charged_once(true, 17462).await;
}
