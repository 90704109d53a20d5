//! Every byte of a message survives a dead-lettering and a redrive, on a real Redis and a
//! real RabbitMQ: big integers, `-0`, `1.0E2`, repeated keys, escapes and odd whitespace
//! come back to the queue exactly as the producer wrote them.
//!
//! Ignored without the brokers; every test uses its own queue names and deletes them.

use std::time::Duration;

use crate::amqp_support;
use babelqueue::Envelope;
use babelqueue::amqp::AmqpTransport;
use babelqueue::redis::redis;
use babelqueue::redis::{RedisTransport, keys::queue_keys};
use babelqueue::redrive::{RedriveOptions, redrive};
use babelqueue::runtime::{App, Delivery, Permanent, Transport};

const URN: &str = "urn:babel:bytes:kept";

/// A body as another SDK may write it: nothing in it is in this SDK's canonical form.
fn odd_body(q: &str) -> Vec<u8> {
    format!(
        r#"{{"job":"{URN}", "trace_id":"t-1","data":{{"amount":4200,"big":92345678901234567890,"z":-0,"e":1.0E2,"d":1,"d":2,"s":"caf\u00e9\/"}},"meta":{{"id":"{}","queue":"{q}","lang":"go","schema_version":1,"created_at":1}} ,"attempts" : 0 ,"x":[1.10]}}"#,
        uuid::Uuid::new_v4()
    )
    .into_bytes()
}

fn failing(t: impl Transport, q: &str) -> App {
    App::new(t)
        .queue(q)
        .route_async(URN, |_env: Envelope| async {
            Err::<(), _>(Permanent::new("declined"))
        })
}

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// Deletes every key of the queue and of its DLQ when dropped.
struct RedisQueue(String);

impl Drop for RedisQueue {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(redis_url())
            && let Ok(mut c) = client.get_connection()
        {
            let mut keys = Vec::new();
            for name in [self.0.clone(), format!("{}.dlq", self.0)] {
                keys.extend(queue_keys(&name));
                let tagged: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{{{name}}}:*"))
                    .query(&mut c)
                    .unwrap_or_default();
                keys.extend(tagged);
            }
            let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut c);
        }
    }
}

#[tokio::test]
#[ignore = "needs Redis (BABELQUEUE_REDIS_URL, default redis://127.0.0.1:6379/0)"]
async fn redis_dead_letter_then_redrive_gives_back_every_byte() {
    let q = format!("bq-test:bytes:{}", uuid::Uuid::new_v4().simple());
    let _cleanup = RedisQueue(q.clone());
    let t = RedisTransport::connect(&redis_url()).await.unwrap();
    let body = odd_body(&q);
    let app = failing(t.clone(), &q);
    app.publish_raw(body.clone()).await.unwrap();
    assert_eq!(app.drain().await.unwrap().dead_lettered, 1);

    let result = redrive(&t, &format!("{q}.dlq"), &RedriveOptions::new())
        .await
        .unwrap();
    assert_eq!(result.redriven, 1);
    let mut c = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let got: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(&q)
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    let redriven = Delivery::new(&q, got[0].clone(), 0);
    assert_eq!(
        String::from_utf8_lossy(redriven.body()),
        String::from_utf8_lossy(&body)
    );
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL)"]
async fn rabbitmq_dead_letter_then_redrive_gives_back_every_byte() {
    let q = amqp_support::unique_queue("bytes");
    let body = odd_body(&q);
    let app = failing(AmqpTransport::open(&amqp_support::url()).await.unwrap(), &q);
    app.publish_raw(body.clone()).await.unwrap();
    assert_eq!(app.drain().await.unwrap().dead_lettered, 1);

    let t = AmqpTransport::open(&amqp_support::url()).await.unwrap();
    let result = redrive(&t, &format!("{q}.dlq"), &RedriveOptions::new())
        .await
        .unwrap();
    assert_eq!(result.redriven, 1);
    let d = t
        .reserve(&q, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the redriven message");
    let got = d.body().to_vec();
    t.ack(&d).await.unwrap();
    drop(t);
    amqp_support::delete_all(&q).await;
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&body)
    );
}
