//! The Kafka transport against a real broker (`tansu`, one process per test on its own
//! port, stopped by pid): the record value byte for byte, the binding's headers and record
//! timestamp on the wire (the conformance manifest's `kafka` block, read back with a raw
//! client), `bq-attempts` authoritative on consume, out-of-band headers, and the commit
//! rule: on one partition a handler held on one message while the later ones are handled
//! keeps the committed offset at that message; it then fails, is retried through the retry
//! tier topic, and the committed offset reaches the end.
//!
//! Run with `cargo test --features kafka --test kafka_transport -- --ignored`.

use crate::cli_support;
use crate::kafka_support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use babelqueue::binding::kafka::retry::Tiers;
use babelqueue::kafka::KafkaTransport;
use babelqueue::kafka::rdkafka::ClientConfig;
use babelqueue::kafka::rdkafka::message::{Header, OwnedHeaders};
use babelqueue::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use babelqueue::kafka::rdkafka::util::Timeout;
use babelqueue::runtime::{Headers, RetryPolicy, Transport};
use babelqueue::{App, Envelope};
use kafka_support::{Broker, high_watermarks, read_all, unique_topic};
use serde_json::{Value, json};

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

fn manifest() -> Value {
    let dir = conformance_dir();
    let bytes = std::fs::read(dir.join("manifest.json")).unwrap_or_else(|e| {
        panic!(
            "the conformance suite (BABELQUEUE_CONFORMANCE_DIR={}) has no manifest.json: {e}",
            dir.display()
        )
    });
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the tansu broker (BABELQUEUE_TANSU or ~/.cargo/bin/tansu); CI runs it with --ignored"]
async fn the_wire_is_the_conformance_kafka_block_and_the_body_is_byte_identical() {
    let Some(broker) = Broker::start() else {
        return;
    };
    println!(
        "kafka-result: tansu started_in_ms={}",
        broker.started_in.as_millis()
    );
    let t = KafkaTransport::new(&broker.url()).unwrap();
    let topic = unique_topic("wire");
    let block = &manifest()["kafka"]["property_projection"];
    let fixture =
        std::fs::read(conformance_dir().join(block["envelope_file"].as_str().unwrap())).unwrap();
    t.publish_raw(&topic, fixture.clone()).await.unwrap();
    // Bytes no re-encoding would keep, with an out-of-band header.
    let odd = "{ \"job\":\"urn:babel:x:y\",  \"data\":{\"z\":1,\"a\":\"Zo\\u00eb \u{2615}\"},\"trace_id\":\"t\",\"meta\":{\"id\":\"i\",\"queue\":\"q\",\"lang\":\"go\",\"schema_version\":1,\"created_at\":1},\"attempts\":0 }";
    let mut extra = Headers::new();
    extra.insert("traceparent".into(), "00-abc-01".into());
    t.publish_with_headers(&topic, odd.as_bytes(), Some(&extra))
        .await
        .unwrap();

    let raw = read_all(&broker.bootstrap(), &topic, 2, Duration::from_secs(20));
    assert_eq!(raw.len(), 2, "{raw:?}");
    let first = &raw[0];
    assert_eq!(
        first.value, fixture,
        "the record value is the envelope byte for byte"
    );
    let want: HashMap<String, String> = block["headers"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    let got: HashMap<String, String> = first
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), String::from_utf8(v.clone().unwrap()).unwrap()))
        .collect();
    assert_eq!(got, want, "exactly the block's headers, as UTF-8 strings");
    let env: Value = serde_json::from_slice(&fixture).unwrap();
    assert_eq!(
        first.timestamp_ms,
        env["meta"]["created_at"].as_i64(),
        "record timestamp = meta.created_at"
    );
    assert_eq!(raw[1].value, odd.as_bytes());
    assert_eq!(raw[1].header("traceparent").as_deref(), Some("00-abc-01"));
    assert_eq!(raw[1].header("bq-source-lang").as_deref(), Some("go"));
    assert_eq!(raw[1].timestamp_ms, Some(1));

    // The transport's own consumer reads the same: body byte for byte, the out-of-band
    // header (and none of the projection's).
    let d1 = t
        .reserve(&topic, Duration::from_secs(20))
        .await
        .unwrap()
        .expect("the first record");
    assert_eq!(d1.body(), &fixture[..]);
    assert!(d1.headers().is_none(), "{:?}", d1.headers());
    let d2 = t
        .reserve(&topic, Duration::from_secs(20))
        .await
        .unwrap()
        .expect("the second record");
    assert_eq!(d2.body(), odd.as_bytes());
    assert_eq!(d2.headers().unwrap()["traceparent"], "00-abc-01");
    assert_eq!(d2.headers().unwrap().len(), 1);
    t.ack(&d1).await.unwrap();
    t.ack(&d2).await.unwrap();
    t.leave(&topic).await.unwrap();
    assert_eq!(t.committed(&topic).await.unwrap(), [(0, 2)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the tansu broker (BABELQUEUE_TANSU or ~/.cargo/bin/tansu); CI runs it with --ignored"]
async fn bq_attempts_is_authoritative_on_the_wire_for_every_conformance_case() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let t = KafkaTransport::new(&broker.url()).unwrap();
    let topic = unique_topic("attempts");
    t.ensure_topic(&topic).await.unwrap();
    let cases = manifest()["kafka"]["attempts_reconciliation"]["cases"]
        .as_array()
        .unwrap()
        .clone();
    // Records of another producer: the raw client writes the body and the header as given.
    let raw: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .unwrap();
    for case in &cases {
        let mut env = Envelope::new(CHARGE, json!({"case": case["name"]})).unwrap();
        env.attempts = case["body_attempts"].as_u64().unwrap() as u32;
        let body = env.encode();
        let header = match &case["header_attempts"] {
            Value::Null => None,
            v => Some(v.to_string()),
        };
        let mut headers = OwnedHeaders::new();
        if let Some(h) = &header {
            headers = headers.insert(Header {
                key: "bq-attempts",
                value: Some(h.as_str()),
            });
        }
        raw.send(
            FutureRecord::<[u8], [u8]>::to(&topic)
                .payload(&body)
                .headers(headers),
            Timeout::After(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    }
    for case in &cases {
        let d = t
            .reserve(&topic, Duration::from_secs(20))
            .await
            .unwrap()
            .expect("the case's record");
        let env = Envelope::decode(d.body()).unwrap();
        assert_eq!(env.data["case"], case["name"], "in order");
        assert_eq!(
            t.attempts(env.attempts, &d),
            case["expected_attempts"].as_u64().unwrap() as u32,
            "{case}"
        );
        t.ack(&d).await.unwrap();
    }
    t.leave(&topic).await.unwrap();
}

#[derive(Debug, thiserror::Error)]
#[error("the gateway failed")]
struct Gateway;

type Handled = Arc<Mutex<Vec<(String, u32)>>>;

/// Polls `handled` until `f` holds (30 s at most).
async fn wait_for(handled: &Handled, what: &str, f: impl Fn(&[(String, u32)]) -> bool) {
    let start = Instant::now();
    loop {
        if f(&handled.lock().unwrap()) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: {:?}",
            handled.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One partition, concurrency 4: `pay_1` is held in its handler while `pay_0`, `pay_2`,
/// `pay_3`, `pay_4` are handled; the committed offset stays at 1 (pay_1's). Released, it
/// fails, is parked on the first retry tier (a raw read shows it there with `bq-attempts`
/// 1, `bq-delay`, `bq-original-topic`), re-injected, handled with attempts 1, and the
/// committed offset reaches the end of the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the tansu broker (BABELQUEUE_TANSU or ~/.cargo/bin/tansu); CI runs it with --ignored"]
async fn offsets_never_pass_an_unsettled_message_and_a_failure_retries_through_the_tier_topic() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let t = KafkaTransport::builder(&broker.url())
        .unwrap()
        .retry_tiers(Tiers::new(vec![300, 5_000]).unwrap())
        .commit_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let topic = unique_topic("commit");
    for i in 0..5 {
        t.publish(
            &topic,
            &Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i}")})).unwrap(),
        )
        .await
        .unwrap();
    }
    let handled: Handled = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (h, g) = (handled.clone(), gate.clone());
    let app = App::new(t.clone())
        .queue(&topic)
        .concurrency(4)
        .poll_timeout(Duration::from_millis(100))
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(200))
                .jitter(0.0)
                .max_attempts(3),
        )
        .route_async(CHARGE, move |env: Envelope| {
            let (h, g) = (h.clone(), g.clone());
            async move {
                let id = env.data["payment_id"].as_str().unwrap().to_owned();
                if id == "pay_1" && env.attempts == 0 {
                    h.lock().unwrap().push(("held".into(), 0));
                    let _permit = g.acquire().await.unwrap();
                    return Err(Gateway);
                }
                h.lock().unwrap().push((id, env.attempts));
                Ok(())
            }
        });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        app.run_until(async {
            let _ = stop_rx.await;
        })
        .await
    });

    wait_for(&handled, "the others handled while pay_1 is held", |h| {
        h.len() == 5 && h.iter().any(|(id, _)| id == "held")
    })
    .await;
    // pay_0 is settled: the commit reaches 1 and, while pay_1 runs, goes no further
    // (observed over 10 commit intervals).
    let start = Instant::now();
    loop {
        let c = t.committed(&topic).await.unwrap();
        if c == [(0, 1)] {
            break;
        }
        assert!(
            c.is_empty() || c == [(0, 1)],
            "the commit passed pay_1: {c:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no commit: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            t.committed(&topic).await.unwrap(),
            [(0, 1)],
            "held at pay_1"
        );
    }

    gate.add_permits(1);
    wait_for(&handled, "pay_1 retried", |h| {
        h.iter().any(|(id, a)| id == "pay_1" && *a == 1)
    })
    .await;
    // The retry went through the first tier topic, with the family's headers.
    let parked = read_all(
        &broker.bootstrap(),
        &format!("{topic}.retry.1"),
        1,
        Duration::from_secs(10),
    );
    assert_eq!(parked.len(), 1, "{parked:?}");
    let p = &parked[0];
    assert_eq!(p.header("bq-attempts").as_deref(), Some("1"));
    assert_eq!(p.header("bq-delay").as_deref(), Some("200"));
    assert_eq!(
        p.header("bq-original-topic").as_deref(),
        Some(topic.as_str())
    );
    let body = Envelope::decode(&p.value).unwrap();
    assert_eq!(
        (body.data["payment_id"].as_str(), body.attempts),
        (Some("pay_1"), 1)
    );

    // Every record of the partition settled: the commit reaches its end (5 originals + the
    // re-injected retry).
    let start = Instant::now();
    loop {
        let c = t.committed(&topic).await.unwrap();
        if c == [(0, 6)] {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "commit stuck: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(high_watermarks(&broker.bootstrap(), &topic), [(0, 6)]);
    let _ = stop_tx.send(());
    let stats = run.await.unwrap();
    assert_eq!((stats.succeeded, stats.retried), (5, 1), "{stats:?}");
    let h = handled.lock().unwrap();
    assert_eq!(h.iter().filter(|(id, _)| id.starts_with("pay_")).count(), 5);
}

/// Runs the CLI against `url`: (exit code, stdout, stderr).
async fn cli(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(cli_support::binary())
        .args(args)
        .env("BROKER_URL", url)
        .output()
        .await
        .expect("the babelqueue CLI runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the tansu broker and the CLI built with --features kafka (BABELQUEUE_CLI); CI runs it"]
async fn the_cli_reads_and_moves_kafka_dead_letters() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let url = broker.url();
    let t = KafkaTransport::new(&url).unwrap();
    let q = unique_topic("cli");
    let dlq = format!("{q}.dlq");
    t.ensure_topic(&q).await.unwrap();
    for id in ["cli-a", "cli-b", "cli-c"] {
        t.publish_raw(&dlq, cli_support::dead_letter(id, &q))
            .await
            .unwrap();
    }
    let garbage = b"not an envelope: {\"n\": 1.0E2".to_vec();
    let err = Envelope::decode(&garbage).unwrap_err();
    t.publish_raw(&dlq, babelqueue::runtime::poison_body(&garbage, &err, &q))
        .await
        .unwrap();

    let (code, out, err) = cli(&url, &["queue", "stats", &q, "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let stats: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(stats["dead_letter_queue"], dlq.as_str());
    assert_eq!(stats["dead_letters"], 4, "{stats}");
    assert_eq!(stats["ready"], 0, "{stats}");

    // list reads without committing: the group's offsets on the DLQ stay where they were.
    let (code, out, err) = cli(&url, &["dlq", "list", &q, "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let listed: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 4, "{out}");
    let ids: Vec<&str> = listed[..3]
        .iter()
        .filter_map(|v| v["meta_id"].as_str())
        .collect();
    assert_eq!(ids, ["cli-a", "cli-b", "cli-c"], "{out}");
    assert_eq!(listed[3]["poison_wrapper"], true, "{out}");
    assert!(
        t.committed(&dlq).await.unwrap().is_empty(),
        "list commits nothing"
    );

    let (code, out, err) = cli(&url, &["dlq", "requeue", &q, "--id", "cli-b"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = cli(&url, &["dlq", "recover-poison", &q]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("recovered 1 poison"), "{out}");
    let (code, out, err) = cli(&url, &["dlq", "redrive", &q, "--bypass", "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let result: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(result["redriven"], 2, "{result}");

    let records = read_all(&broker.bootstrap(), &q, 4, Duration::from_secs(20));
    assert_eq!(records.len(), 4, "{records:?}");
    let mut seen: Vec<(String, Option<String>)> = records
        .iter()
        .map(|r| {
            let id = Envelope::decode(&r.value).map_or_else(
                |_| String::from_utf8(r.value.clone()).unwrap(),
                |e| e.meta.id,
            );
            (id, r.header("bq-replay-bypass"))
        })
        .collect();
    seen.sort();
    let mut expected = vec![
        ("cli-a".to_owned(), Some("1".to_owned())),
        ("cli-b".to_owned(), None),
        ("cli-c".to_owned(), Some("1".to_owned())),
        (String::from_utf8(garbage).unwrap(), None),
    ];
    expected.sort();
    assert_eq!(seen, expected);
    let (code, out, err) = cli(&url, &["queue", "stats", &q, "--json"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let stats: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        stats["dead_letters"], 0,
        "every dead letter committed: {stats}"
    );
}
