//! The runtime's [`App`] over RabbitMQ with a guarded handler: duplicates skipped, a
//! failing handler retried through the delay queues after its backoff, exhausted and
//! poison messages dead-lettered to `<queue>.dlq` with the family's block. Ignored
//! without a broker (`BABELQUEUE_AMQP_URL`).

use crate::amqp_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use amqp_support::{delayed_at, delete_all, raw_channel, raw_get, ready, unique_queue, url};
use babelqueue::amqp::lapin::types::AMQPValue;
use babelqueue::amqp::{AmqpTransport, dead_letter_queue};
use babelqueue::runtime::{App, RetryPolicy, Transport, recover_poison};
use babelqueue::{DeadLetterReason, Envelope, Guard, InMemoryStore};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";

async fn transport() -> AmqpTransport {
    AmqpTransport::open(&url())
        .await
        .expect("RabbitMQ must be reachable for this test")
}

#[derive(Debug, thiserror::Error)]
#[error("the gateway failed")]
struct Gateway;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn two_hundred_payments_published_twice_are_charged_once_each() {
    let queue = unique_queue("payments");
    let t = transport().await;
    // Each payment twice, byte for byte (what a redelivery looks like on the wire).
    for i in 0..200 {
        let env = Envelope::new(
            CHARGE,
            json!({"payment_id": format!("pay_{i}"), "amount": 100 + i}),
        )
        .unwrap()
        .encode();
        t.publish_raw(&queue, env.clone()).await.unwrap();
        t.publish_raw(&queue, env).await.unwrap();
    }
    assert_eq!(ready(&queue).await, 400);

    let store = Arc::new(InMemoryStore::new());
    let charges = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let (st, ch) = (store.clone(), charges.clone());
    let app = App::new(t.clone())
        .queue(&queue)
        .concurrency(8)
        .route_async(CHARGE, move |env: Envelope| {
            let (st, ch) = (st.clone(), ch.clone());
            async move {
                Guard::new(&*st)
                    .run_async(&env, async {
                        let id = env.data["payment_id"].as_str().unwrap().to_owned();
                        *ch.lock().unwrap().entry(id).or_default() += 1;
                        Ok::<(), Gateway>(())
                    })
                    .await
                    .map(drop)
            }
        });
    let stats = app.drain().await.unwrap();
    let charges = charges.lock().unwrap().clone();
    assert_eq!(charges.len(), 200, "every payment charged");
    assert!(charges.values().all(|n| *n == 1), "none twice: {charges:?}");
    assert_eq!((stats.succeeded, stats.skipped), (200, 200), "{stats:?}");
    assert_eq!(ready(&queue).await, 0);
    assert_eq!(t.depth(&queue).await.unwrap().in_flight, 0);
    delete_all(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn a_handler_failing_twice_is_retried_after_its_backoff_through_the_delay_queue() {
    let queue = unique_queue("retry");
    let t = transport().await;
    let calls = Arc::new(Mutex::new(Vec::<(Instant, u32)>::new()));
    let seen = calls.clone();
    let app = App::new(t.clone())
        .queue(&queue)
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(300))
                .factor(2.0)
                .jitter(0.0)
                .max_attempts(5),
        )
        .route_async(CHARGE, move |env: Envelope| {
            let seen = seen.clone();
            async move {
                let n = {
                    let mut s = seen.lock().unwrap();
                    s.push((Instant::now(), env.attempts));
                    s.len()
                };
                if n <= 2 { Err(Gateway) } else { Ok(()) }
            }
        });
    app.publish(CHARGE, &json!({"payment_id": "pay_retry"}))
        .await
        .unwrap();
    let stats = app.drain().await.unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 3, "{stats:?}");
    assert_eq!(
        calls.iter().map(|c| c.1).collect::<Vec<_>>(),
        [0, 1, 2],
        "attempts + 1 in the body each time"
    );
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].0 - w[0].0).collect();
    println!(
        "amqp-result: retry-backoff gaps_ms={:?}",
        gaps.iter().map(|g| g.as_millis()).collect::<Vec<_>>()
    );
    // Delays are rounded up to a delay bucket: never shorter than the backoff.
    assert!(gaps[0] >= Duration::from_millis(300), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(600), "{gaps:?}");
    assert!(gaps[1] < Duration::from_secs(5), "{gaps:?}");
    assert_eq!((stats.succeeded, stats.retried), (1, 2), "{stats:?}");
    assert_eq!(ready(&queue).await, 0);
    assert_eq!(
        delayed_at(&url(), &queue).await,
        0,
        "the delay queues are empty"
    );
    delete_all(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn a_failure_past_max_attempts_lands_in_the_dlq_with_the_family_block() {
    let queue = unique_queue("exhausted");
    let t = transport().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let app = App::new(t.clone())
        .queue(&queue)
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(50))
                .jitter(0.0)
                .max_attempts(3),
        )
        .route_async(CHARGE, move |_env: Envelope| {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Gateway)
            }
        });
    let mut sent = Envelope::new(CHARGE, json!({"payment_id": "pay_dead", "amount": 1})).unwrap();
    sent.meta.queue = queue.clone();
    t.publish(&queue, &sent).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(stats.dead_lettered, 1, "{stats:?}");

    let (conn, ch) = raw_channel().await;
    let dlq = dead_letter_queue(&queue);
    let got = raw_get(&ch, &dlq).await.expect("the dead letter").delivery;
    assert!(raw_get(&ch, &dlq).await.is_none(), "exactly one");
    let dead = Envelope::decode(&got.data).unwrap();
    assert_eq!(dead.meta.id, sent.meta.id, "the same message");
    assert_eq!(dead.data, sent.data);
    let block = dead.dead_letter.expect("the dead_letter block");
    assert_eq!(block.reason, DeadLetterReason::Failed);
    assert_eq!(block.original_queue, queue);
    assert_eq!(block.attempts, 3);
    assert_eq!(block.lang, "rust");
    assert!(block.error.unwrap().contains("gateway"));
    // The dead letter is projected like any publish.
    let p = &got.properties;
    assert_eq!(p.kind().as_ref().unwrap().as_str(), CHARGE);
    assert_eq!(p.message_id().as_ref().unwrap().as_str(), sent.meta.id);
    assert!(matches!(
        p.headers().as_ref().unwrap().inner().get("x-attempts"),
        Some(AMQPValue::LongInt(3) | AMQPValue::LongLongInt(3))
    ));
    let _ = conn.close(200, "OK".into()).await;
    assert_eq!(ready(&queue).await, 0);
    assert_eq!(delayed_at(&url(), &queue).await, 0);
    delete_all(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn a_poison_body_lands_in_the_dlq_with_its_bytes_intact() {
    let queue = unique_queue("poison");
    let t = transport().await;
    let garbage = b"\xff\x00 not an envelope \xfe".to_vec();
    t.publish_raw(&queue, garbage.clone()).await.unwrap();
    let good = Envelope::new(CHARGE, json!({"payment_id": "pay_ok"})).unwrap();
    t.publish(&queue, &good).await.unwrap();
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let app = App::new(t.clone())
        .queue(&queue)
        .route_sync(CHARGE, move |_env: &Envelope| {
            h.fetch_add(1, Ordering::SeqCst);
        });
    let stats = app.drain().await.unwrap();
    assert_eq!(
        handled.load(Ordering::SeqCst),
        1,
        "one bad message never stops the loop"
    );
    assert_eq!(stats.poison, 1, "{stats:?}");
    let (conn, ch) = raw_channel().await;
    let got = raw_get(&ch, &dead_letter_queue(&queue))
        .await
        .expect("the poison record")
        .delivery;
    let record = Envelope::decode(&got.data).unwrap();
    assert_eq!(record.dead_letter.unwrap().reason, DeadLetterReason::Poison);
    assert_eq!(recover_poison(&got.data).unwrap(), garbage, "bytes intact");
    let _ = conn.close(200, "OK".into()).await;
    assert_eq!(ready(&queue).await, 0);
    delete_all(&queue).await;
}

/// Not a benchmark (debug build, shared machine): the App's drain rate over RabbitMQ next
/// to a bare lapin consume + ack loop on the same broker, printed for the record
/// (`amqp-result: rate …`); it checks that both consumed every message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn drain_rate_next_to_a_bare_client_loop() {
    use babelqueue::amqp::lapin::options::{
        BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
    };
    use babelqueue::amqp::lapin::types::FieldTable;
    const N: usize = 3000;
    let t = transport().await;
    let body = Envelope::new(CHARGE, json!({"payment_id": "pay_rate"}))
        .unwrap()
        .encode();

    // The bare client: consume + ack, at the App's prefetch (2 × concurrency 8).
    let bare_q = unique_queue("rate-bare");
    for _ in 0..N {
        t.publish_raw(&bare_q, body.clone()).await.unwrap();
    }
    let (conn, ch) = raw_channel().await;
    ch.basic_qos(t.prefetch_for(8), BasicQosOptions::default())
        .await
        .unwrap();
    ch.queue_declare(
        bare_q.as_str().into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let done_tx = Arc::new(Mutex::new(Some(done_tx)));
    let acked = Arc::new(AtomicUsize::new(0));
    let consumer = ch
        .basic_consume(
            bare_q.as_str().into(),
            "bare".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let start = Instant::now();
    let (a, tx) = (acked.clone(), done_tx.clone());
    consumer.set_delegate(
        move |delivery: babelqueue::amqp::lapin::message::DeliveryResult| {
            let (a, tx) = (a.clone(), tx.clone());
            async move {
                if let Ok(Some(d)) = delivery {
                    d.ack(BasicAckOptions::default()).await.unwrap();
                    if a.fetch_add(1, Ordering::SeqCst) + 1 == N
                        && let Some(tx) = tx.lock().unwrap().take()
                    {
                        let _ = tx.send(());
                    }
                }
            }
        },
    );
    done_rx.await.unwrap();
    let bare = N as f64 / start.elapsed().as_secs_f64();
    let _ = conn.close(200, "OK".into()).await;

    // The App: decode, route, handler, ack; concurrency 8, prefetch 16.
    let app_q = unique_queue("rate-app");
    for _ in 0..N {
        t.publish_raw(&app_q, body.clone()).await.unwrap();
    }
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let app = App::new(t.clone()).queue(&app_q).concurrency(8).route_sync(
        CHARGE,
        move |_env: &Envelope| {
            h.fetch_add(1, Ordering::Relaxed);
        },
    );
    let start = Instant::now();
    let stats = app.drain().await.unwrap();
    let rate = N as f64 / start.elapsed().as_secs_f64();
    println!(
        "amqp-result: rate app_c8={rate:.0}/s bare_c8={bare:.0}/s ratio={:.2}",
        rate / bare
    );
    assert_eq!(handled.load(Ordering::Relaxed), N);
    assert_eq!(stats.succeeded as usize, N);
    assert_eq!(ready(&app_q).await + ready(&bare_q).await, 0);
    delete_all(&bare_q).await;
    delete_all(&app_q).await;
}

/// An App's consumer holds `PREFETCH_PER_WORKER` × `concurrency` messages: `concurrency`
/// of them in handlers, the rest waiting in the client, none more. Handlers are held on a
/// semaphore until the broker's count is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn an_apps_consumer_holds_two_messages_per_worker() {
    use babelqueue::amqp::PREFETCH_PER_WORKER;
    const N: u32 = 12;
    const CONCURRENCY: usize = 3;
    let queue = unique_queue("prefetch");
    let t = transport().await;
    for i in 0..N {
        let body = Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i}")}))
            .unwrap()
            .encode();
        t.publish_raw(&queue, body).await.unwrap();
    }
    assert_eq!(ready(&queue).await, N);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let (g, s) = (gate.clone(), started.clone());
    let app = App::new(t.clone())
        .queue(&queue)
        .concurrency(CONCURRENCY)
        .batch(1)
        .route_async(CHARGE, move |_env: Envelope| {
            let (g, s) = (g.clone(), s.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                g.acquire().await.unwrap().forget();
                Ok::<(), Gateway>(())
            }
        });
    let drain = tokio::spawn(async move { app.drain().await });
    // Held: what the broker still has ready is N minus the prefetch.
    let held = u32::from(PREFETCH_PER_WORKER) * CONCURRENCY as u32;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left = ready(&queue).await;
    while (left > N - held || started.load(Ordering::SeqCst) < CONCURRENCY)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = ready(&queue).await;
    }
    assert_eq!(left, N - held, "the broker kept N minus the prefetch ready");
    assert_eq!(
        started.load(Ordering::SeqCst),
        CONCURRENCY,
        "only `concurrency` handlers run"
    );
    gate.add_permits(N as usize);
    let stats = drain.await.unwrap().unwrap();
    assert_eq!(stats.succeeded, u64::from(N));
    assert_eq!(ready(&queue).await, 0);
    delete_all(&queue).await;
}
