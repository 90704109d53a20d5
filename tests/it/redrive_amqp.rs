//! Redrive and replay-bypass on RabbitMQ: the same library over `AmqpTransport` (the
//! header rides in AMQP's native header table). Ignored without RabbitMQ; CI runs it.

use crate::amqp_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use amqp_support::{NEEDS, delete_all, ready, unique_queue, url};
use babelqueue::Envelope;
use babelqueue::amqp::AmqpTransport;
use babelqueue::redrive::{ItemStatus, RedriveOptions, redrive};
use babelqueue::replay;
use babelqueue::runtime::{App, Permanent, Transport};
use serde_json::json;

const URN: &str = "urn:babel:payments:charge";

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --ignored"]
async fn redrive_with_bypass_over_rabbitmq() {
    let _ = NEEDS;
    let q = unique_queue("redrive");
    let dlq = format!("{q}.dlq");
    // The Rust runtime dead-letters two charges; a garbage body joins them in the DLQ.
    let failing = App::new(AmqpTransport::open(&url()).await.unwrap())
        .queue(&q)
        .route_async(URN, |_env: Envelope| async {
            Err::<(), _>(Permanent::new("card declined"))
        });
    let mut ids = Vec::new();
    for i in 0..2 {
        let env = Envelope::new(URN, json!({"n": i})).unwrap().with_queue(&q);
        ids.push(env.meta.id.clone());
        failing.publish_raw(env.encode()).await.unwrap();
    }
    assert_eq!(failing.drain().await.unwrap().dead_lettered, 2);
    let t = AmqpTransport::open(&url()).await.unwrap();
    t.publish_raw(&dlq, b"not an envelope".to_vec())
        .await
        .unwrap();

    // A dry run: the plan, and the DLQ keeps all three.
    let plan = redrive(&t, &dlq, &RedriveOptions::new().dry_run(true))
        .await
        .unwrap();
    assert_eq!((plan.items.len(), plan.redriven), (3, 0));
    // The broker puts restored (rejected) messages back once the run's channel closed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ready(&dlq).await != 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the DLQ did not get its 3 back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let result = redrive(&t, &dlq, &RedriveOptions::new().bypass(true))
        .await
        .unwrap();
    assert_eq!(result.redriven, 2);
    let undecodable: Vec<_> = result
        .items
        .iter()
        .filter(|i| i.status == ItemStatus::Undecodable)
        .collect();
    assert_eq!(undecodable.len(), 1);

    let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let s = Arc::clone(&seen);
    let fixed = App::new(AmqpTransport::open(&url()).await.unwrap())
        .queue(&q)
        .route_sync(URN, move |env: &Envelope| {
            s.lock()
                .unwrap()
                .push((env.meta.id.clone(), replay::is_replay()));
        });
    assert_eq!(fixed.drain().await.unwrap().succeeded, 2);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    ids.sort();
    assert_eq!(
        seen,
        ids.into_iter().map(|id| (id, true)).collect::<Vec<_>>()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ready(&dlq).await != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the undecodable body was not restored"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    delete_all(&q).await;
}
