//! The RabbitMQ transport against a real broker: the body byte for byte, the binding's
//! projection on the wire (the conformance manifest's `rabbitmq` block, read with a raw
//! `basic.get`), out-of-band headers, delayed requeues through the delay queues, acks of
//! a closed channel, and a refused declaration. Ignored without a broker
//! (`BABELQUEUE_AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`).

use crate::amqp_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use amqp_support::{delete_all, raw_channel, raw_get, ready, unique_queue, url};
use babelqueue::Envelope;
use babelqueue::amqp::lapin::options::QueueDeclareOptions;
use babelqueue::amqp::lapin::types::{AMQPValue, FieldTable};
use babelqueue::amqp::{AmqpTransport, delay_bucket, delay_queue};
use babelqueue::runtime::{ConsumerOptions, Headers, Republish, Transport};
use serde_json::{Value, json};

fn conformance_dir() -> PathBuf {
    match std::env::var_os("BABELQUEUE_CONFORMANCE_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_relative() {
                Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)
            } else {
                dir
            }
        }
        // The suite beside the repository, where the workspace keeps it.
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance"),
    }
}

fn read_suite_file(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| {
        panic!(
            "the conformance suite (BABELQUEUE_CONFORMANCE_DIR={}) has no {name}: {e}",
            dir.display()
        )
    })
}

async fn transport() -> AmqpTransport {
    AmqpTransport::open(&url())
        .await
        .expect("RabbitMQ must be reachable for this test")
}

fn envelope(job: &str, attempts: u32) -> Vec<u8> {
    let mut env = Envelope::new(job, json!({"payment_id": "pay_1", "amount": 4200})).unwrap();
    env.attempts = attempts;
    env.encode()
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn publish_reserve_ack_is_byte_identical() {
    let queue = unique_queue("roundtrip");
    let t = transport().await;
    // Bytes no re-encoding would keep: spacing, key order, escapes, non-ASCII.
    let body = "{ \"job\":\"urn:babel:x:y\",  \"data\":{\"z\":1,\"a\":\"Zo\\u00eb \u{2615}\"},\"trace_id\":\"t\",\"meta\":{\"id\":\"i\",\"queue\":\"q\",\"lang\":\"go\",\"schema_version\":1,\"created_at\":1},\"attempts\":0 }";
    t.publish_raw(&queue, body.as_bytes().to_vec())
        .await
        .unwrap();
    let d = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the message");
    assert_eq!(d.body(), body.as_bytes());
    assert!(
        d.headers().is_none(),
        "no out-of-band header: {:?}",
        d.headers()
    );
    assert_eq!(d.queue(), queue);
    let depth = t.depth(&queue).await.unwrap();
    assert_eq!((depth.ready, depth.in_flight), (0, 1));
    t.ack(&d).await.unwrap();
    assert_eq!(t.depth(&queue).await.unwrap().in_flight, 0);
    // Nothing comes back: the ack removed it.
    assert!(
        t.reserve(&queue, Duration::from_millis(300))
            .await
            .unwrap()
            .is_none()
    );
    t.leave(&queue).await.unwrap();
    assert_eq!(ready(&queue).await, 0);
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn the_projection_on_the_wire_is_the_conformance_block() {
    let dir = conformance_dir();
    let manifest: Value = serde_json::from_slice(&read_suite_file(&dir, "manifest.json")).unwrap();
    let block = &manifest["rabbitmq"]["property_projection"];
    let fixture = block["envelope_file"].as_str().unwrap();
    let body = read_suite_file(&dir, fixture);
    println!("case rabbitmq/property_projection ({fixture})");

    let queue = unique_queue("projection");
    let t = transport().await;
    t.publish_raw(&queue, body.clone()).await.unwrap();
    let (conn, ch) = raw_channel().await;
    let got = raw_get(&ch, &queue).await.expect("the published message");
    let d = got.delivery;
    assert_eq!(d.data, body, "the body is the envelope, byte for byte");
    assert_eq!(d.exchange.as_str(), "", "the default exchange");
    assert_eq!(d.routing_key.as_str(), queue, "routing key = queue");
    let p = &d.properties;
    let props = &block["properties"];
    let s = |o: &Option<babelqueue::amqp::lapin::types::ShortString>| {
        o.as_ref().map(|v| v.as_str().to_owned())
    };
    assert_eq!(s(p.kind()).as_deref(), props["type"].as_str());
    assert_eq!(
        s(p.correlation_id()).as_deref(),
        props["correlation_id"].as_str()
    );
    assert_eq!(s(p.message_id()).as_deref(), props["message_id"].as_str());
    assert_eq!(s(p.app_id()).as_deref(), props["app_id"].as_str());
    assert_eq!(
        s(p.content_type()).as_deref(),
        props["content_type"].as_str()
    );
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
    let headers = p.headers().as_ref().expect("the projection's headers");
    let expected = block["headers"].as_object().unwrap();
    for (key, want) in expected {
        let value = headers
            .inner()
            .get(key.as_str())
            .unwrap_or_else(|| panic!("header {key} missing: {headers:?}"));
        match want {
            // Natively typed: an integer stays an integer on the wire.
            Value::Number(n) => match value {
                AMQPValue::LongLongInt(v) => assert_eq!(Some(*v), n.as_i64(), "{key}"),
                AMQPValue::LongInt(v) => assert_eq!(Some(i64::from(*v)), n.as_i64(), "{key}"),
                other => panic!("{key} must be an integer on the wire, not {other:?}"),
            },
            Value::String(w) => match value {
                AMQPValue::LongString(v) => assert_eq!(v.as_bytes(), w.as_bytes(), "{key}"),
                other => panic!("{key} must be a string, not {other:?}"),
            },
            other => panic!("unexpected manifest value {other}"),
        }
    }
    assert_eq!(
        headers.inner().len(),
        expected.len(),
        "no other header: {headers:?}"
    );
    let _ = conn.close(200, "OK".into()).await;
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn out_of_band_headers_ride_the_header_table() {
    let queue = unique_queue("headers");
    let t = transport().await;
    let body = envelope("urn:babel:payments:charge", 2);
    let mut h = Headers::new();
    h.insert(
        "traceparent".into(),
        json!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    );
    h.insert("x-babelqueue-releases".into(), json!(3));
    // A collision: the projection wins.
    h.insert("x-attempts".into(), json!(99));
    t.publish_with_headers(&queue, &body, Some(&h))
        .await
        .unwrap();
    t.publish_with_headers(&queue, &body, Some(&h))
        .await
        .unwrap();

    let (conn, ch) = raw_channel().await;
    let got = raw_get(&ch, &queue).await.unwrap().delivery;
    assert_eq!(got.data, body);
    let table = got.properties.headers().as_ref().unwrap().inner().clone();
    assert!(
        matches!(
            table.get("x-attempts"),
            Some(AMQPValue::LongInt(2) | AMQPValue::LongLongInt(2))
        ),
        "{table:?}"
    );
    assert_eq!(
        table.get("x-babelqueue-releases"),
        Some(&AMQPValue::LongLongInt(3))
    );
    assert!(matches!(
        table.get("traceparent"),
        Some(AMQPValue::LongString(_))
    ));
    let _ = conn.close(200, "OK".into()).await;

    let d = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.body(), body);
    let got = d.headers().expect("out-of-band headers");
    assert_eq!(got["traceparent"], h["traceparent"]);
    assert_eq!(got["x-babelqueue-releases"], json!(3));
    assert!(
        got.get("x-attempts").is_none(),
        "the projection is not out-of-band: {got:?}"
    );
    assert!(got.get("x-source-lang").is_none());
    t.ack(&d).await.unwrap();
    t.leave(&queue).await.unwrap();
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn a_delayed_requeue_waits_in_a_delay_queue_without_a_worker() {
    let queue = unique_queue("delay");
    let t = transport().await;
    t.publish_raw(&queue, envelope("urn:babel:x:retry", 0))
        .await
        .unwrap();
    let d = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let retried = envelope("urn:babel:x:retry", 1);
    let delay = Duration::from_millis(700);
    let start = Instant::now();
    t.requeue(&d, Republish::with_body(retried.clone()), delay)
        .await
        .unwrap();
    // The original is acked, the copy waits in the delay queue of the bucket.
    let bucket = delay_bucket(delay);
    assert_eq!(ready(&delay_queue(&queue, bucket)).await, 1);
    let depth = t.depth(&queue).await.unwrap();
    assert_eq!((depth.ready, depth.delayed, depth.in_flight), (0, 1, 0));
    let due = t.next_due(&queue).await.unwrap();
    assert!(due.is_some_and(|d| d <= bucket), "{due:?}");
    let back = t
        .reserve(&queue, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("back after the delay");
    let waited = start.elapsed();
    assert!(waited >= delay, "came back after {waited:?}");
    assert!(waited < delay * 4, "came back after {waited:?}");
    assert_eq!(back.body(), retried, "the updated envelope, byte for byte");
    assert!(
        back.headers().is_none(),
        "RabbitMQ's x-death headers are not out-of-band: {:?}",
        back.headers()
    );
    t.ack(&back).await.unwrap();
    assert_eq!(t.next_due(&queue).await.unwrap(), None);
    t.leave(&queue).await.unwrap();
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn an_unchanged_put_back_without_delay_is_redelivered() {
    let queue = unique_queue("putback");
    let t = transport().await;
    let body = envelope("urn:babel:x:later", 0);
    t.publish_raw(&queue, body.clone()).await.unwrap();
    let d = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    t.requeue(&d, Republish::unchanged(), Duration::ZERO)
        .await
        .unwrap();
    let again = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.body(), body);
    t.ack(&again).await.unwrap();
    t.leave(&queue).await.unwrap();
    assert_eq!(ready(&queue).await, 0);
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn an_ack_for_a_closed_channel_is_skipped_and_the_broker_redelivers() {
    let queue = unique_queue("stale");
    let t = transport().await;
    let body = envelope("urn:babel:x:stale", 0);
    t.publish_raw(&queue, body.clone()).await.unwrap();
    let d = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    // The consumer's channel closes with the message unacked: the broker puts it back.
    t.leave(&queue).await.unwrap();
    t.ack(&d)
        .await
        .expect("a stale ack is skipped, not an error");
    let again = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.body(), body, "redelivered by the broker");
    assert_ne!(again.tag(), d.tag(), "another channel");
    t.ack(&again).await.unwrap();
    t.leave(&queue).await.unwrap();
    assert_eq!(ready(&queue).await, 0);
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn a_mismatched_declaration_is_a_clear_error_and_the_transport_goes_on() {
    let queue = unique_queue("mismatch");
    let (conn, ch) = raw_channel().await;
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(10));
    ch.queue_declare(queue.as_str().into(), QueueDeclareOptions::durable(), args)
        .await
        .unwrap();
    let _ = conn.close(200, "OK".into()).await;

    let t = transport().await;
    let err = t
        .publish_raw(&queue, envelope("urn:babel:x:y", 0))
        .await
        .unwrap_err();
    assert!(!err.is_connection(), "{err:?}");
    let text = format!("{err:?}");
    assert!(
        text.contains("PRECONDITION_FAILED") || text.contains("PRECONDITION"),
        "{text}"
    );
    assert!(err.to_string().contains("broker error"));
    // The refusal closed a channel; the transport reopens it.
    let other = unique_queue("after-mismatch");
    t.publish_raw(&other, envelope("urn:babel:x:y", 0))
        .await
        .unwrap();
    assert_eq!(ready(&other).await, 1);
    delete_all(&queue).await;
    delete_all(&other).await;
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn an_empty_queue_reserves_nothing_in_time() {
    let queue = unique_queue("empty");
    let t = transport().await;
    assert!(t.reserve(&queue, Duration::ZERO).await.unwrap().is_none());
    let start = Instant::now();
    assert!(
        t.reserve(&queue, Duration::from_millis(300))
            .await
            .unwrap()
            .is_none()
    );
    assert!(start.elapsed() >= Duration::from_millis(250));
    assert_eq!(t.next_due(&queue).await.unwrap(), None);
    t.leave(&queue).await.unwrap();
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn a_zero_timeout_reserve_waits_for_a_delivery_on_its_way_then_not_at_all() {
    let queue = unique_queue("active");
    // Prefetch 1: the broker pushes the second message only after the first one's ack.
    let t = transport().await.with_prefetch(1);
    for _ in 0..2 {
        t.publish_raw(&queue, envelope("urn:babel:x:y", 0))
            .await
            .unwrap();
    }
    let first = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the first message");
    t.ack(&first).await.unwrap();
    // The stream is active: the next delivery is a round trip away, and a zero-timeout
    // reserve takes it instead of reporting an empty queue.
    let second = t
        .reserve(&queue, Duration::ZERO)
        .await
        .unwrap()
        .expect("the delivery on its way");
    t.ack(&second).await.unwrap();
    // The queue is empty: one bounded wait, then the stream is quiet and a zero-timeout
    // reserve returns at once.
    let start = Instant::now();
    assert!(t.reserve(&queue, Duration::ZERO).await.unwrap().is_none());
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    let start = Instant::now();
    assert!(t.reserve(&queue, Duration::ZERO).await.unwrap().is_none());
    assert!(
        start.elapsed() < Duration::from_millis(5),
        "a quiet stream does not wait: {:?}",
        start.elapsed()
    );
    t.leave(&queue).await.unwrap();
    assert_eq!(ready(&queue).await, 0);
    delete_all(&queue).await;
}

/// Reserves the next delivery of `queue`, which must arrive within 5 s.
async fn next_delivery(t: &AmqpTransport, queue: &str) -> babelqueue::runtime::Delivery {
    t.reserve(queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no delivery of `{queue}` within 5 s"))
}

/// Publishes `n` envelopes of URNs `urn:babel:acks:m<i>`, returning their bodies in order.
async fn publish_numbered(t: &AmqpTransport, queue: &str, n: usize) -> Vec<Vec<u8>> {
    let mut bodies = Vec::new();
    for i in 0..n {
        let body = envelope(&format!("urn:babel:acks:m{i}"), 0);
        t.publish_raw(queue, body.clone()).await.unwrap();
        bodies.push(body);
    }
    bodies
}

/// Takes (and acks) what `queue` still holds, with a consumer of a new transport.
async fn drain_rest(queue: &str) -> Vec<Vec<u8>> {
    let t = transport().await;
    let mut rest = Vec::new();
    while let Some(d) = t.reserve(queue, Duration::from_secs(2)).await.unwrap() {
        rest.push(d.body().to_vec());
        t.ack(&d).await.unwrap();
    }
    t.leave(queue).await.unwrap();
    rest
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn acks_waiting_above_a_gap_are_sent_when_it_closes_or_the_consumer_leaves() {
    let queue = unique_queue("acks-gap");
    let t = transport().await;
    let bodies = publish_numbered(&t, &queue, 10).await;
    // Two workers: prefetch 4, so up to 2 acks may wait above an open delivery.
    t.start_consumer(&queue, &ConsumerOptions::new(2))
        .await
        .unwrap();
    let mut taken = Vec::new();
    for _ in 0..4 {
        taken.push(next_delivery(&t, &queue).await);
    }
    for (i, d) in taken.iter().enumerate() {
        assert_eq!(d.body(), bodies[i], "delivered in order");
    }
    // 2 and 3 are acked while 1 is still open: they wait for it (within the hold).
    t.ack(&taken[1]).await.unwrap();
    t.ack(&taken[2]).await.unwrap();
    // 1 closes the gap: one multiple ack settles 1, 2 and 3.
    t.ack(&taken[0]).await.unwrap();
    // 5 is acked above the open 4, then the consumer leaves: the waiting ack goes first,
    // so only 4 comes back.
    let fifth = next_delivery(&t, &queue).await;
    assert_eq!(fifth.body(), bodies[4]);
    t.ack(&fifth).await.unwrap();
    t.leave(&queue).await.unwrap();
    let rest = drain_rest(&queue).await;
    let mut expected = vec![bodies[3].clone()];
    expected.extend(bodies[5..].iter().cloned());
    let mut got = rest.clone();
    got.sort();
    expected.sort();
    assert_eq!(
        got.len(),
        6,
        "the broker put back exactly the open delivery and the ones never handed out"
    );
    assert_eq!(got, expected, "no acked delivery came back, none was lost");
    assert_eq!(ready(&queue).await, 0);
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn a_slow_delivery_does_not_hold_back_the_acks_behind_it() {
    let queue = unique_queue("acks-slow");
    let t = transport().await;
    let bodies = publish_numbered(&t, &queue, 12).await;
    t.start_consumer(&queue, &ConsumerOptions::new(2))
        .await
        .unwrap();
    // The first delivery stays open (a slow handler) while the other eleven are taken and
    // acked. Were their acks all kept waiting for it, the prefetch of 4 would be full of
    // unacked messages after three, and the broker would deliver nothing more.
    let slow = next_delivery(&t, &queue).await;
    assert_eq!(slow.body(), bodies[0]);
    for body in &bodies[1..] {
        let d = next_delivery(&t, &queue).await;
        assert_eq!(d.body(), &body[..]);
        t.ack(&d).await.unwrap();
    }
    t.ack(&slow).await.unwrap();
    t.leave(&queue).await.unwrap();
    assert_eq!(
        drain_rest(&queue).await,
        Vec::<Vec<u8>>::new(),
        "every ack arrived"
    );
    assert_eq!(ready(&queue).await, 0);
    delete_all(&queue).await;
}
