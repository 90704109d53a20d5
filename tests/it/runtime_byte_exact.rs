//! Only what the contract changes is changed: a retry changes `attempts`, a dead
//! letter adds the `dead_letter` block, and every other byte of the body stays as it
//! arrived — integers beyond 64 bits, number spellings, `-0`, duplicated keys, key order,
//! whitespace. A poison body is kept byte for byte whatever it is, and `recover_poison`
//! gives it back. In process (paused time), and over a real Redis (ignored without one).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use babelqueue::Envelope;
use babelqueue::runtime::{
    App, InMemoryTransport, RetryPolicy, Transport, recover_poison, unframe,
};
use serde_json::Value;

const CHARGE: &str = "urn:babel:payments:charge";

/// A body another SDK could send: a 30-digit integer, `1.0E2`, `-0`, a duplicated key
/// (readers take the last), unusual spacing, key order not ours, `attempts` spelled `-0`.
fn odd_body(queue: &str) -> String {
    format!(
        r#"{{ "trace_id":"t-1","job":"{CHARGE}" ,"data":{{"amount":123456789012345678901234567890,"rate":1.0E2,"z":-0,"k":"first","k":"last","s":"\u00e9\/"}},"meta":{{"queue":"{queue}","id":"byte-exact-1","lang":"go","schema_version":1,"created_at":1700000000000,"x_extra":[1,2.50]}},"attempts":-0 }}"#
    )
}

/// What the body must look like with `attempts` = `n`: the same text, only that value.
fn with_attempts(body: &str, n: u32) -> String {
    body.replace(r#""attempts":-0 }"#, &format!(r#""attempts":{n} }}"#))
}

fn failing_app<T: Transport + 'static>(t: T, queue: &str, runs: Arc<AtomicU32>) -> App {
    App::new(t)
        .queue(queue)
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(5))
                .max_delay(Duration::from_millis(5))
                .max_attempts(3)
                .jitter(0.0),
        )
        .route_sync(CHARGE, move |_: &Envelope| -> Result<(), std::io::Error> {
            runs.fetch_add(1, Ordering::SeqCst);
            Err(std::io::Error::other("declined for now"))
        })
}

/// The dead letter is the body with `attempts` and the appended block, byte for byte.
fn check_dead_letter(body: &str, dead: &[u8], attempts: u32) {
    let dead = std::str::from_utf8(dead).unwrap();
    let head = with_attempts(body, attempts);
    let head = head.strip_suffix(" }").unwrap();
    assert!(
        dead.starts_with(&format!("{head},\"dead_letter\":{{")),
        "the dead letter keeps every byte of the body:\n{body}\n{dead}"
    );
    assert!(dead.ends_with("} }"), "{dead}");
    let v: Value = serde_json::from_str(dead).unwrap();
    assert_eq!(v["dead_letter"]["reason"], "failed");
    assert_eq!(v["dead_letter"]["attempts"], attempts);
}

#[tokio::test(start_paused = true)]
async fn a_retried_and_dead_lettered_body_keeps_every_byte_in_memory() {
    let t = InMemoryTransport::new();
    let runs = Arc::new(AtomicU32::new(0));
    let app = failing_app(t.clone(), "q", runs.clone());
    let body = odd_body("q");
    Envelope::decode(body.as_bytes()).expect("an accepted envelope");
    app.publish_raw(body.clone().into_bytes()).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!((stats.retried, stats.dead_lettered), (2, 1));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let dlq = t.messages("q.dlq");
    assert_eq!(dlq.len(), 1);
    check_dead_letter(&body, &dlq[0], 3);
}

#[tokio::test(start_paused = true)]
async fn every_poison_body_comes_back_byte_for_byte() {
    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue("q")
        .route_sync(CHARGE, |_: &Envelope| {});
    let bodies: Vec<Vec<u8>> = vec![
        br#"{"job":"urn:x","data":{"n":123456789012345678901234567890},"meta":{"schema_version":9}}"#.to_vec(),
        br#"{"job":"urn:x","dead_letter":{"reason":"failed","note":"its own"}}"#.to_vec(),
        br#"{"job":"urn:babel:poison","data":{"encoding":"utf8","body":"not me"},"dead_letter":{"reason":"poison"}}"#.to_vec(),
        br#"{"job":"urn:babel:poison","data":{"encoding":"utf8","body":"nor me"}}"#.to_vec(),
        b"{ }".to_vec(),
        b"\xff\xfe binary".to_vec(),
        b"[1,2]".to_vec(),
    ];
    for b in &bodies {
        app.publish_raw(b.clone()).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    assert_eq!(stats.poison, bodies.len() as u64);
    let dlq = t.messages("q.dlq");
    assert_eq!(dlq.len(), bodies.len());
    for (dead, original) in dlq.iter().zip(&bodies) {
        let v: Value = serde_json::from_slice(dead).unwrap();
        assert_eq!(v["dead_letter"]["reason"], "poison");
        assert_eq!(
            recover_poison(dead).as_deref(),
            Some(&original[..]),
            "{}",
            String::from_utf8_lossy(dead)
        );
    }
}

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --ignored"]
async fn a_retried_and_dead_lettered_body_keeps_every_byte_over_redis() {
    use babelqueue::redis::RedisTransport;
    use babelqueue::redis::redis::{self, AsyncCommands};
    let queue = format!("bq-test:bytes:{}", uuid::Uuid::new_v4().simple());
    let t = RedisTransport::connect(&redis_url()).await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let app = failing_app(t.clone(), &queue, runs.clone());
    let body = odd_body(&queue);
    app.publish_raw(body.clone().into_bytes()).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!((stats.retried, stats.dead_lettered), (2, 1));
    let mut c = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let dlq = format!("{queue}.dlq");
    let elements: Vec<Vec<u8>> = c.lrange(&dlq, 0, -1).await.unwrap();
    assert_eq!(elements.len(), 1);
    // A Redis element may be a header frame; the envelope inside is what is compared.
    let dead = unframe(&elements[0]).map_or_else(|| elements[0].clone(), |(_, b)| b);
    check_dead_letter(&body, &dead, 3);
    let mut keys = babelqueue::redis::keys::queue_keys(&queue);
    keys.push(dlq);
    let _: () = c.del(keys).await.unwrap();
}
