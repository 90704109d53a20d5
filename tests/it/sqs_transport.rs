//! The SQS transport against moto (an emulator of the SQS API, started by this binary on a
//! port of its own; see `tests/sqs_support`): the body byte for byte, the binding's
//! `MessageAttributes` as a raw client reads them (the conformance manifest's `sqs`
//! block), out-of-band headers, attempts from `ApproximateReceiveCount`, a delayed retry
//! by `DelaySeconds`, a retry delayed past SQS's 15 minutes, dead letters to `<queue>-dlq`,
//! the visibility lease extended while a handler runs and a lease that runs out. Ignored
//! without moto.

use crate::cli_support;
use crate::sqs_support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use babelqueue::runtime::{App, Headers, Republish, RetryPolicy, Transport, recover_poison};
use babelqueue::sqs::aws_sdk_sqs::types::MessageAttributeValue;
use babelqueue::sqs::{NOT_BEFORE, SqsTransport};
use babelqueue::{DeadLetterReason, Envelope};
use serde_json::{Value, json};
use sqs_support::{
    client, counts, delete_all, queue_url, raw_receive, transport, transport_with, unique_queue,
};

const CHARGE: &str = "urn:babel:payments:charge";

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
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance"),
    }
}

fn read_suite_file(name: &str) -> Vec<u8> {
    let dir = conformance_dir();
    std::fs::read(dir.join(name)).unwrap_or_else(|e| {
        panic!(
            "the conformance suite (BABELQUEUE_CONFORMANCE_DIR={}) has no {name}: {e}",
            dir.display()
        )
    })
}

fn envelope(attempts: u32) -> Vec<u8> {
    let mut env = Envelope::new(
        CHARGE,
        json!({"payment_id": "pay_1", "amount": 4200, "customer": "Zoë Ångström ☕"}),
    )
    .unwrap();
    env.attempts = attempts;
    env.encode()
}

#[derive(Debug, thiserror::Error)]
#[error("the gateway failed")]
struct Gateway;

#[tokio::test]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn publish_reserve_ack_is_byte_identical() {
    let queue = unique_queue("bytes");
    let t = transport();
    let body = envelope(0);
    t.publish_raw(&queue, body.clone()).await.unwrap();
    let d = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the message");
    assert_eq!(d.body(), &body[..], "byte for byte");
    assert_eq!(d.element(), &body[..]);
    assert!(d.headers().is_none(), "the projection is not out-of-band");
    assert_eq!(d.delivery_count(), Some(1));
    assert!(d.receipt().is_some());
    assert_eq!(counts(&queue).await, (0, 0, 1), "in flight, not visible");
    t.ack(&d).await.unwrap();
    assert_eq!(counts(&queue).await, (0, 0, 0), "deleted");
    assert!(t.reserve(&queue, Duration::ZERO).await.unwrap().is_none());
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn the_attributes_on_the_wire_are_the_conformance_block() {
    let manifest: Value = serde_json::from_slice(&read_suite_file("manifest.json")).unwrap();
    let block = &manifest["sqs"]["attribute_projection"];
    let body = read_suite_file(block["envelope_file"].as_str().unwrap());
    let expected = block["message_attributes"].as_object().unwrap();
    assert!(!expected.is_empty());
    let queue = unique_queue("projection");
    let t = transport();
    t.publish_raw(&queue, body.clone()).await.unwrap();
    let got = raw_receive(&queue, 1, 30).await;
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m.body().unwrap().as_bytes(), &body[..], "byte for byte");
    let attrs = m.message_attributes().expect("attributes");
    assert_eq!(attrs.len(), expected.len(), "{attrs:?}");
    for (name, want) in expected {
        let a = attrs
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing: {attrs:?}"));
        assert_eq!(a.data_type(), want["DataType"].as_str().unwrap(), "{name}");
        assert_eq!(a.string_value(), want["StringValue"].as_str(), "{name}");
    }
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn out_of_band_headers_ride_string_attributes() {
    let queue = unique_queue("headers");
    let t = transport();
    let body = envelope(0);
    let mut h = Headers::new();
    h.insert(
        "traceparent".into(),
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
    );
    h.insert("bq-job".into(), "not the urn".into());
    t.publish_with_headers(&queue, &body, Some(&h))
        .await
        .unwrap();
    let d = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.body(), &body[..]);
    let got = d.headers().expect("the out-of-band header");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got["traceparent"], h["traceparent"]);
    t.ack(&d).await.unwrap();
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn attempts_are_reconciled_with_approximate_receive_count() {
    let manifest: Value = serde_json::from_slice(&read_suite_file("manifest.json")).unwrap();
    let cases = manifest["sqs"]["attempts_reconciliation"]["cases"]
        .as_array()
        .unwrap();
    let queue = unique_queue("attempts");
    let t = transport();
    // The case "third-delivery" on the wire: two raw receives that let the visibility go
    // at once, then the transport's: ApproximateReceiveCount 3.
    t.publish_raw(&queue, envelope(0)).await.unwrap();
    for n in 1..=2 {
        let got = raw_receive(&queue, 1, 0).await;
        assert_eq!(got.len(), 1, "receive {n}");
    }
    let d = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.delivery_count(), Some(3));
    assert_eq!(t.attempts(0, &d), 2, "max(body 0, 3 - 1)");
    assert_eq!(t.attempts(5, &d), 5, "never lower than the body");
    // Every case of the block, through the transport's rule with the count as delivered.
    for case in cases {
        let body = case["body_attempts"].as_u64().unwrap() as u32;
        let want = case["expected_attempts"].as_u64().unwrap() as u32;
        let mut d =
            babelqueue::runtime::Delivery::native(&queue, envelope(body), Headers::new(), 1);
        if let Some(c) = case["approximate_receive_count"]
            .as_str()
            .and_then(|c| c.parse().ok())
        {
            d = d.with_delivery_count(c);
        }
        assert_eq!(t.attempts(body, &d), want, "{}", case["name"]);
    }
    t.ack(&d).await.unwrap();
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn an_expired_visibility_redelivers_with_a_higher_count() {
    let queue = unique_queue("expire");
    let t = transport_with("&visibility_timeout=1").extend_visibility(false);
    t.publish_raw(&queue, envelope(0)).await.unwrap();
    let first = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let held_at = Instant::now();
    // Not acked (a crashed worker): after the 1 s lease it is delivered again.
    let again = t
        .reserve(&queue, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("redelivered");
    assert!(
        held_at.elapsed() >= Duration::from_millis(900),
        "{:?}",
        held_at.elapsed()
    );
    assert_eq!(again.body(), first.body());
    assert_eq!(again.delivery_count(), Some(2));
    assert_eq!(t.attempts(0, &again), 1);
    t.ack(&again).await.unwrap();
    assert_eq!(counts(&queue).await, (0, 0, 0));
    delete_all(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn the_lease_is_extended_while_a_slow_handler_runs() {
    let queue = unique_queue("extend");
    let holder = transport_with("&visibility_timeout=2");
    let body_a = envelope(0);
    holder.publish_raw(&queue, body_a.clone()).await.unwrap();
    let d = holder
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    // The control: a message held by a transport that does not extend its lease.
    let careless = transport_with("&visibility_timeout=2").extend_visibility(false);
    let body_b = envelope(7);
    careless.publish_raw(&queue, body_b.clone()).await.unwrap();
    let b = careless
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b.body(), &body_b[..]);
    // Another consumer polls for three leases' worth while both "handle" theirs.
    let other = transport_with("&visibility_timeout=30");
    let start = Instant::now();
    let mut reappeared = Vec::new();
    while start.elapsed() < Duration::from_secs(6) {
        if let Some(got) = other.reserve(&queue, Duration::from_secs(1)).await.unwrap() {
            reappeared.push(got);
        }
    }
    let bodies: Vec<&[u8]> = reappeared.iter().map(|d| d.body()).collect();
    assert_eq!(
        bodies,
        [&body_b[..]],
        "only the control's message reappeared"
    );
    assert_eq!(
        counts(&queue).await,
        (0, 0, 2),
        "A still held, B held by the other"
    );
    holder.ack(&d).await.unwrap();
    other.ack(&reappeared[0]).await.unwrap();
    assert_eq!(counts(&queue).await, (0, 0, 0));
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn a_delayed_requeue_waits_with_delay_seconds_without_a_worker() {
    let queue = unique_queue("delay");
    let t = transport();
    t.publish_raw(&queue, envelope(0)).await.unwrap();
    let d = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let retried = envelope(1);
    let start = Instant::now();
    t.requeue(
        &d,
        Republish::with_body(retried.clone()),
        Duration::from_millis(1500),
    )
    .await
    .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "the caller is not held for the delay"
    );
    assert_eq!(
        counts(&queue).await,
        (0, 1, 0),
        "one delayed copy, the original deleted"
    );
    assert!(t.reserve(&queue, Duration::ZERO).await.unwrap().is_none());
    assert!(
        t.next_due(&queue).await.unwrap().is_some(),
        "a drain waits for it"
    );
    let again = t
        .reserve(&queue, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("due");
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(again.body(), &retried[..], "the new copy, attempts + 1");
    assert_eq!(
        again.delivery_count(),
        Some(1),
        "a new message: the count starts again"
    );
    assert_eq!(t.attempts(1, &again), 1);
    t.ack(&again).await.unwrap();
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn a_retry_past_fifteen_minutes_is_hidden_again_until_due() {
    let queue = unique_queue("notbefore");
    let t = transport();
    let url = t.queue_url(&queue).await.unwrap();
    // What a requeue with a 17-minute delay looks like when the 900 s have passed and the
    // due time has not: `bq-not-before` 3 s ahead (the copy itself is sent raw, without
    // the 900 s wait).
    let due = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3000;
    let body = envelope(1);
    client()
        .send_message()
        .queue_url(&url)
        .message_body(String::from_utf8(body.clone()).unwrap())
        .message_attributes(
            NOT_BEFORE,
            MessageAttributeValue::builder()
                .data_type("Number")
                .string_value(due.to_string())
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let start = Instant::now();
    assert!(
        t.reserve(&queue, Duration::from_secs(1))
            .await
            .unwrap()
            .is_none(),
        "received early: hidden again, not handed out"
    );
    assert_eq!(counts(&queue).await, (0, 0, 1));
    let d = t
        .reserve(&queue, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("due");
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(d.body(), &body[..]);
    assert!(
        d.headers().is_none(),
        "bq-not-before is not an out-of-band header"
    );
    t.ack(&d).await.unwrap();

    // And the publishing side: a requeue beyond 900 s sends the copy with the maximum
    // DelaySeconds and the due time.
    t.publish_raw(&queue, envelope(0)).await.unwrap();
    let d = t
        .reserve(&queue, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    t.requeue(
        &d,
        Republish::with_body(envelope(1)),
        Duration::from_secs(17 * 60),
    )
    .await
    .unwrap();
    assert_eq!(counts(&queue).await, (0, 1, 0));
    delete_all(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn a_failing_handler_is_retried_then_dead_lettered_to_the_dash_dlq() {
    let queue = unique_queue("dead");
    let t = transport();
    let calls = Arc::new(Mutex::new(Vec::<(Instant, u32)>::new()));
    let c = calls.clone();
    let app = App::new(t.clone())
        .queue(&queue)
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(1000))
                .factor(1.0)
                .jitter(0.0)
                .max_attempts(3),
        )
        .route_async(CHARGE, move |env: Envelope| {
            let c = c.clone();
            async move {
                c.lock().unwrap().push((Instant::now(), env.attempts));
                Err::<(), _>(Gateway)
            }
        });
    assert_eq!(app.dead_letter_queue_name(), format!("{queue}-dlq"));
    let mut sent = Envelope::new(CHARGE, json!({"payment_id": "pay_dead"})).unwrap();
    sent.meta.queue = queue.clone();
    t.publish(&queue, &sent).await.unwrap();
    let stats = app.drain().await.unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.iter().map(|c| c.1).collect::<Vec<_>>(),
        [0, 1, 2],
        "{stats:?}"
    );
    for w in calls.windows(2) {
        assert!(
            w[1].0 - w[0].0 >= Duration::from_millis(1000),
            "the backoff was waited"
        );
    }
    assert_eq!((stats.retried, stats.dead_lettered), (2, 1), "{stats:?}");
    let dlq = format!("{queue}-dlq");
    let got = raw_receive(&dlq, 10, 30).await;
    assert_eq!(got.len(), 1, "exactly one dead letter");
    let dead = Envelope::decode(got[0].body().unwrap().as_bytes()).unwrap();
    assert_eq!(dead.meta.id, sent.meta.id);
    let block = dead.dead_letter.expect("the family's block");
    assert_eq!(block.reason, DeadLetterReason::Failed);
    assert_eq!(block.original_queue, queue);
    assert_eq!(block.attempts, 3);
    let attrs = got[0].message_attributes().unwrap();
    assert_eq!(attrs["bq-job"].string_value(), Some(CHARGE));
    assert_eq!(counts(&queue).await, (0, 0, 0));
    delete_all(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn a_poison_body_is_dead_lettered_with_its_bytes_intact() {
    let queue = unique_queue("poison");
    let t = transport();
    let garbage = b"not an envelope \x01 {".to_vec();
    t.publish_raw(&queue, garbage.clone()).await.unwrap();
    t.publish_raw(&queue, envelope(0)).await.unwrap();
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let app = App::new(t.clone())
        .queue(&queue)
        .route_sync(CHARGE, move |_e: &Envelope| {
            h.fetch_add(1, Ordering::SeqCst);
        });
    let stats = app.drain().await.unwrap();
    assert_eq!(handled.load(Ordering::SeqCst), 1);
    assert_eq!(stats.poison, 1, "{stats:?}");
    let got = raw_receive(&format!("{queue}-dlq"), 10, 30).await;
    assert_eq!(got.len(), 1);
    let record = got[0].body().unwrap().as_bytes();
    assert_eq!(
        Envelope::decode(record)
            .unwrap()
            .dead_letter
            .unwrap()
            .reason,
        DeadLetterReason::Poison
    );
    assert_eq!(recover_poison(record).unwrap(), garbage, "bytes intact");
    delete_all(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn concurrent_publishes_and_acks_all_land() {
    let queue = unique_queue("batch");
    let t = transport();
    let bodies: Vec<Vec<u8>> = (0..37)
        .map(|i| {
            Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i}")}))
                .unwrap()
                .encode()
        })
        .collect();
    t.publish_batch(&queue, bodies.clone()).await.unwrap();
    assert_eq!(counts(&queue).await, (37, 0, 0));
    let mut got = Vec::new();
    while let Some(d) = t.reserve(&queue, Duration::from_secs(1)).await.unwrap() {
        got.push(d);
    }
    assert_eq!(got.len(), 37);
    let mut seen: Vec<Vec<u8>> = got.iter().map(|d| d.body().to_vec()).collect();
    seen.sort();
    let mut want = bodies;
    want.sort();
    assert_eq!(seen, want, "every body, byte for byte");
    let acks: Vec<_> = got
        .into_iter()
        .map(|d| {
            let t = t.clone();
            tokio::spawn(async move { t.ack(&d).await })
        })
        .collect();
    for a in acks {
        a.await.unwrap().unwrap();
    }
    assert_eq!(counts(&queue).await, (0, 0, 0));
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn invalid_names_are_clear_errors_and_a_queue_redrive_policy_is_kept() {
    let t = transport();
    let err = t.publish_raw("orders.v2", envelope(0)).await.unwrap_err();
    let chain = std::error::Error::source(&err).unwrap().to_string();
    assert!(chain.contains("not a valid SQS queue name"), "{chain}");
    let err = t.reserve("billing:jobs", Duration::ZERO).await.unwrap_err();
    assert!(
        std::error::Error::source(&err)
            .unwrap()
            .to_string()
            .contains("not a valid SQS queue name")
    );

    // A queue with its own redrive policy: the transport leaves it as it is.
    let queue = unique_queue("redrive");
    let target = format!("{queue}-native");
    let c = client();
    let target_url = c.create_queue().queue_name(&target).send().await.unwrap();
    let arn = c
        .get_queue_attributes()
        .queue_url(target_url.queue_url().unwrap())
        .attribute_names(babelqueue::sqs::aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes()
        .unwrap()[&babelqueue::sqs::aws_sdk_sqs::types::QueueAttributeName::QueueArn]
        .clone();
    let policy = format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"2"}}"#);
    c.create_queue()
        .queue_name(&queue)
        .attributes(
            babelqueue::sqs::aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy,
            policy,
        )
        .send()
        .await
        .unwrap();
    let t = transport_with("&visibility_timeout=1").extend_visibility(false);
    t.publish_raw(&queue, envelope(0)).await.unwrap();
    // Received twice and never settled (a consumer crashing on it): SQS moves it to the
    // policy's target on the next receive.
    for _ in 0..2 {
        let d = t.reserve(&queue, Duration::from_secs(5)).await.unwrap();
        assert!(d.is_some());
    }
    let third = t.reserve(&queue, Duration::from_secs(3)).await.unwrap();
    assert!(third.is_none(), "moved by SQS's redrive");
    let moved = raw_receive(&target, 10, 30).await;
    assert_eq!(moved.len(), 1, "in the policy's target queue");
    c.delete_queue()
        .queue_url(queue_url(&target).await.unwrap())
        .send()
        .await
        .unwrap();
    delete_all(&queue).await;
}

#[tokio::test]
#[ignore = "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored"]
async fn connect_reads_the_family_url() {
    // The URL form of every SDK; credentials from the default chain are not needed to
    // build the transport.
    let t = SqsTransport::connect(&sqs_support::url()).await.unwrap();
    assert_eq!(
        t.dead_letter_queue("orders", ".dlq").as_deref(),
        Some("orders-dlq")
    );
    assert!(SqsTransport::connect("amqp://localhost").await.is_err());
}

/// Runs the CLI against this moto: (exit code, stdout, stderr).
async fn cli(args: &[&str]) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(cli_support::binary());
    cmd.args(args).env("BROKER_URL", sqs_support::url());
    for (k, v) in sqs_support::child_env() {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("the babelqueue CLI runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The ids (or raw bodies) of every message of `queue`, received and deleted.
async fn take_all(queue: &str) -> Vec<String> {
    let url = queue_url(queue).await.expect("the queue exists");
    let mut out = Vec::new();
    loop {
        let got = raw_receive(queue, 10, 30).await;
        if got.is_empty() {
            break;
        }
        for m in got {
            let body = m.body().unwrap_or_default();
            out.push(
                Envelope::decode(body.as_bytes()).map_or_else(|_| body.to_owned(), |e| e.meta.id),
            );
            client()
                .delete_message()
                .queue_url(&url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server (BABELQUEUE_MOTO) and the CLI built with --features sqs (BABELQUEUE_CLI); CI runs it"]
async fn the_cli_reads_and_moves_sqs_dead_letters() {
    let q = unique_queue("cli");
    let dlq = format!("{q}-dlq");
    let t = transport();
    t.queue_url(&q).await.unwrap();
    for id in ["cli-a", "cli-b", "cli-c"] {
        t.publish_raw(&dlq, cli_support::dead_letter(id, &q))
            .await
            .unwrap();
    }
    let garbage = b"not an envelope: {\"n\": 1.0E2".to_vec();
    let err = Envelope::decode(&garbage).unwrap_err();
    let poison = babelqueue::runtime::poison_body(&garbage, &err, &q);
    t.publish_raw(&dlq, poison).await.unwrap();

    // stats: the DLQ's four, the queue empty (SQS's approximate counts, exact on moto).
    let (code, out, err) = cli(&["queue", "stats", &q, "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let stats: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(stats["dead_letter_queue"], dlq.as_str());
    assert_eq!(stats["dead_letters"], 4, "{stats}");
    assert_eq!(stats["ready"], 0, "{stats}");

    // list: every one, and nothing taken (all visible again).
    let (code, out, err) = cli(&["dlq", "list", &q, "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let listed: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 4, "{out}");
    let (poison, letters): (Vec<&Value>, Vec<&Value>) =
        listed.iter().partition(|v| v["poison_wrapper"] == true);
    let mut ids: Vec<&str> = letters
        .iter()
        .filter_map(|v| v["meta_id"].as_str())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["cli-a", "cli-b", "cli-c"], "{out}");
    assert_eq!(poison.len(), 1, "{out}");
    assert_eq!(
        counts(&dlq).await,
        (4, 0, 0),
        "list leaves every dead letter visible"
    );

    // requeue one by id, then recover the poison body, then redrive the rest.
    let (code, out, err) = cli(&["dlq", "requeue", &q, "--id", "cli-b"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = cli(&["dlq", "requeue", &q, "--all", "--keep-attempts"]).await;
    assert_eq!(code, 2, "--keep-attempts is refused on SQS: {out}{err}");
    assert!(err.contains("keep-attempts"), "{err}");
    let (code, out, err) = cli(&["dlq", "recover-poison", &q]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("recovered 1 poison"), "{out}");
    let mut expected = vec![
        "cli-b".to_owned(),
        String::from_utf8(garbage.clone()).unwrap(),
    ];
    expected.sort();
    assert_eq!(
        take_all(&q).await,
        expected,
        "cli-b and the poison's exact bytes"
    );

    let (code, out, err) = cli(&["dlq", "redrive", &q, "--dry-run"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(counts(&dlq).await.0, 2, "a dry run moves nothing: {out}");
    let (code, out, err) = cli(&["dlq", "redrive", &q, "--bypass", "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let result: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(result["redriven"], 2, "{result}");
    let url = queue_url(&q).await.unwrap();
    let got = raw_receive(&q, 10, 30).await;
    assert_eq!(got.len(), 2);
    for m in &got {
        let bypass = m
            .message_attributes()
            .and_then(|a| a.get("bq-replay-bypass"))
            .and_then(|v| v.string_value());
        assert_eq!(
            bypass,
            Some("1"),
            "the redriven message carries the bypass header"
        );
        let env = Envelope::decode(m.body().unwrap().as_bytes()).unwrap();
        assert_eq!(env.attempts, 0);
        client()
            .delete_message()
            .queue_url(&url)
            .receipt_handle(m.receipt_handle().unwrap())
            .send()
            .await
            .unwrap();
    }
    assert_eq!(counts(&dlq).await, (0, 0, 0));

    // A command with no meaning on SQS says so.
    let (code, _, err) = cli(&["processing", "recover-legacy", &q, "--yes"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("SQS"), "{err}");
    delete_all(&q).await;
}
