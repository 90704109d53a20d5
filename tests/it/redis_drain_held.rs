//! A one-shot `drain` while a killed consumer's heartbeat has not yet
//! expired. The drain waits for that consumer's list to be recovered (the heartbeat's time
//! left, plus two recovery intervals) and handles its message; when the other consumer's
//! heartbeat keeps being renewed past that bound, the drain ends and says what it left
//! (a warning, and `Stats::left_in_flight`). Shared Redis, unique queues (deleted after).

use crate::fleet_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use babelqueue::Envelope;
use babelqueue::redis::RedisTransport;
use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::runtime::App;
use fleet_support::{QueueGuard, raw, shared_url};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";
const DEAD: &str = "killed-consumer-1";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What a consumer killed while holding one message leaves: the message in its own list,
/// its heartbeat (still `ttl` to live) and its registry entry.
async fn killed_consumer_holding_one(queue: &str, ttl: Duration) -> Vec<u8> {
    let mut c = raw(&shared_url()).await;
    let body = Envelope::new(CHARGE, json!({"amount": 12}))
        .unwrap()
        .with_queue(queue)
        .encode();
    let _: () = c
        .rpush(format!("{{{queue}}}:processing:{DEAD}"), &body)
        .await
        .unwrap();
    beat(&mut c, queue, ttl).await;
    body
}

async fn beat(c: &mut redis::aio::MultiplexedConnection, queue: &str, ttl: Duration) {
    let _: () = redis::cmd("SET")
        .arg(format!("{{{queue}}}:heartbeat:{DEAD}"))
        .arg(1)
        .arg("PX")
        .arg(ttl.as_millis() as u64)
        .query_async(c)
        .await
        .unwrap();
    let _: () = c
        .zadd(
            format!("{{{queue}}}:consumers"),
            DEAD,
            now_ms() + ttl.as_millis() as u64,
        )
        .await
        .unwrap();
}

async fn app(queue: &str, charges: &Arc<AtomicUsize>) -> App {
    let t = RedisTransport::connect(&shared_url()).await.unwrap();
    let charges = Arc::clone(charges);
    App::new(t)
        .queue(queue)
        .heartbeat(Duration::from_millis(200), Duration::from_secs(1))
        .recovery_interval(Duration::from_millis(300))
        .route_sync(CHARGE, move |_: &Envelope| {
            charges.fetch_add(1, Ordering::SeqCst);
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL)"]
async fn a_drain_waits_for_a_killed_consumers_list_and_handles_it() {
    let q = QueueGuard::new("drain-held", &shared_url());
    killed_consumer_holding_one(&q.name, Duration::from_secs(2)).await;
    let charges = Arc::new(AtomicUsize::new(0));
    let stats = app(&q.name, &charges).await.drain().await.unwrap();
    assert_eq!(
        (stats.succeeded, stats.recovered),
        (1, 1),
        "the drain waited for the killed consumer's heartbeat to expire and handled its message: {stats:?}"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    let mut c = raw(&shared_url()).await;
    let left: usize = c
        .llen(format!("{{{}}}:processing:{DEAD}", q.name))
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL)"]
async fn a_drain_that_cannot_wait_longer_says_what_it_left_and_where() {
    let q = QueueGuard::new("drain-held-live", &shared_url());
    let ttl = Duration::from_millis(1500);
    let body = killed_consumer_holding_one(&q.name, ttl).await;
    // The other consumer is stuck, not dead: its heartbeat keeps being renewed.
    let beating = tokio::spawn({
        let queue = q.name.clone();
        async move {
            let mut c = raw(&shared_url()).await;
            loop {
                beat(&mut c, &queue, ttl).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    });
    let charges = Arc::new(AtomicUsize::new(0));
    let stats = app(&q.name, &charges).await.drain().await.unwrap();
    beating.abort();
    assert_eq!(stats.succeeded, 0, "{stats:?}");
    assert_eq!(stats.left_in_flight.len(), 1, "{stats:?}");
    let left = &stats.left_in_flight[0];
    assert_eq!((left.consumer.as_str(), left.messages), (DEAD, 1));
    let mut c = raw(&shared_url()).await;
    let still: Vec<Vec<u8>> = c
        .lrange(format!("{{{}}}:processing:{DEAD}", q.name), 0, -1)
        .await
        .unwrap();
    assert_eq!(still, vec![body], "left where it was, not lost");
}
