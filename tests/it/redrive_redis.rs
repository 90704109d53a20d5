//! Redrive and replay-bypass (the family's ADR-0026 / ADR-0027) over a real Redis: one test
//! per rule, handlers that see a replay (sync and async, with `#[handler]` and
//! `#[idempotent]` unchanged), and a redrive process SIGKILLed in the middle of a run.
//!
//! Ignored without Redis (`BABELQUEUE_REDIS_URL`, default `redis://127.0.0.1:6379/0`); CI
//! runs them with `--ignored`. Every test uses its own queue names and deletes them.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::redis::{RedisTransport, keys::queue_keys};
use babelqueue::redrive::{ItemStatus, RedriveOptions, redrive};
use babelqueue::replay::{self, Replay};
use babelqueue::runtime::{App, Delivery, Headers, Permanent, Transport, poison_body};
use babelqueue::{BoxError, Envelope, InMemoryStore, handler, idempotent};
use serde_json::{Value, json};

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A unique queue, its DLQ and a sandbox; every key of theirs deleted at the end.
struct Queues {
    q: String,
    dlq: String,
    sandbox: String,
}

impl Queues {
    fn new(tag: &str) -> Self {
        let q = format!("bq-test:redrive:{tag}:{}", uuid::Uuid::new_v4().simple());
        Queues {
            dlq: format!("{q}.dlq"),
            sandbox: format!("{q}.sandbox"),
            q,
        }
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(redis_url())
            && let Ok(mut c) = client.get_connection()
        {
            let mut keys = Vec::new();
            for name in [&self.q, &self.dlq, &self.sandbox] {
                keys.extend(queue_keys(name));
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

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis must be reachable for this test")
}

async fn transport() -> RedisTransport {
    RedisTransport::connect(&redis_url())
        .await
        .expect("Redis must be reachable for this test")
}

async fn lrange(queue: &str) -> Vec<Vec<u8>> {
    raw().await.lrange(queue, 0, -1).await.unwrap()
}

/// Every element in the in-flight (processing) lists of `queue`, any consumer.
async fn in_flight(queue: &str) -> Vec<Vec<u8>> {
    let mut c = raw().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{queue}}}:processing:*"))
        .query_async(&mut c)
        .await
        .unwrap();
    let mut out = Vec::new();
    for k in keys {
        let items: Vec<Vec<u8>> = c.lrange(&k, 0, -1).await.unwrap();
        out.extend(items);
    }
    out
}

/// A dead letter as a Rust or Python runtime writes it, with an unknown field and a
/// float kept verbatim.
fn dead_letter(id: &str, urn: &str, reason: &str, attempts: Value, original: &str) -> Vec<u8> {
    let body = json!({
        "job": urn,
        "trace_id": format!("trace-{id}"),
        "data": {"payment_id": id, "amount": 4200, "rate": 1.25},
        "meta": {"id": id, "queue": original, "lang": "python", "schema_version": 1,
                 "created_at": 1_764_640_000_000u64},
        "attempts": attempts,
        "x-extra": {"kept": true},
        "dead_letter": {"reason": reason, "error": "declined", "exception": "Declined",
                        "failed_at": 1_764_640_001_000u64, "original_queue": original,
                        "attempts": 3, "lang": "python"},
    });
    serde_json::to_vec(&body).unwrap()
}

const URN: &str = "urn:babel:payments:charge";

fn ids(elements: &[Vec<u8>]) -> Vec<String> {
    elements
        .iter()
        .map(|e| {
            let d = Delivery::new("x", e.clone(), 0);
            Envelope::decode(d.body()).map_or_else(|_| "?".into(), |e| e.meta.id)
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn redriven_messages_are_reset_and_everything_else_kept() {
    let n = Queues::new("reset");
    let t = transport().await;
    let original = dead_letter("m-1", URN, "failed", json!(3), &n.q);
    t.publish_raw(&n.dlq, original.clone()).await.unwrap();

    let result = redrive(&t, &n.dlq, &RedriveOptions::new()).await.unwrap();
    assert_eq!((result.redriven, result.restored), (1, 0));
    let item = &result.items[0];
    assert_eq!(
        (
            item.message_id.as_str(),
            item.trace_id.as_str(),
            item.urn.as_str(),
            item.reason.as_str(),
            item.from.as_str(),
            item.to.as_deref(),
            item.redriven,
            item.bypassed,
            item.status
        ),
        (
            "m-1",
            "trace-m-1",
            URN,
            "failed",
            n.dlq.as_str(),
            Some(n.q.as_str()),
            true,
            false,
            ItemStatus::Redriven
        )
    );

    let got = lrange(&n.q).await;
    assert_eq!(got.len(), 1);
    // No bypass: no header, so no frame: the element is the envelope itself.
    let mut expected: serde_json::Map<String, Value> = serde_json::from_slice(&original).unwrap();
    expected.shift_remove("dead_letter");
    expected.insert("attempts".into(), json!(0));
    assert_eq!(got[0], serde_json::to_vec(&expected).unwrap());
    assert!(lrange(&n.dlq).await.is_empty());
    assert!(in_flight(&n.dlq).await.is_empty(), "acked on the DLQ");
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn the_dlq_is_drained_before_any_message_is_processed() {
    let n = Queues::new("drain");
    let t = transport().await;
    for i in 0..3 {
        t.publish_raw(
            &n.dlq,
            dead_letter(&format!("d-{i}"), URN, "failed", json!(1), &n.q),
        )
        .await
        .unwrap();
    }
    // When the first message is reported, all three are already off the ready list; and
    // the first is re-published before the second is looked at.
    let seen: Arc<Mutex<Vec<(usize, usize)>>> = Arc::default();
    let s = Arc::clone(&seen);
    let dlq = n.dlq.clone();
    let target = n.q.clone();
    let opts = RedriveOptions::new().on_item(move |_| {
        let mut c = redis::Client::open(redis_url())
            .unwrap()
            .get_connection()
            .unwrap();
        let ready: usize = redis::cmd("LLEN").arg(&dlq).query(&mut c).unwrap();
        let published: usize = redis::cmd("LLEN").arg(&target).query(&mut c).unwrap();
        s.lock().unwrap().push((ready, published));
    });
    let result = redrive(&t, &n.dlq, &opts).await.unwrap();
    assert_eq!(result.redriven, 3);
    assert_eq!(*seen.lock().unwrap(), [(0, 1), (0, 2), (0, 3)]);

    // Messages put back during a run are not met again in it: nothing is selected, each
    // of the three is restored once, and the run ends.
    let t2 = transport().await;
    for i in 0..3 {
        t2.publish_raw(
            &n.sandbox,
            dead_letter(&format!("s-{i}"), URN, "failed", json!(1), &n.q),
        )
        .await
        .unwrap();
    }
    let before = lrange(&n.sandbox).await;
    let none = RedriveOptions::new().select(|_| false);
    let result = redrive(&t2, &n.sandbox, &none).await.unwrap();
    assert_eq!(result.items.len(), 3, "each message met exactly once");
    assert!(
        result
            .items
            .iter()
            .all(|i| i.status == ItemStatus::NotSelected)
    );
    assert_eq!(
        lrange(&n.sandbox).await,
        before,
        "restored unchanged, in order"
    );
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn a_dlq_message_is_acked_only_after_its_publish_succeeded() {
    let n = Queues::new("ack");
    let t = transport().await;
    for i in 0..3 {
        t.publish_raw(
            &n.dlq,
            dead_letter(&format!("a-{i}"), URN, "failed", json!(2), &n.q),
        )
        .await
        .unwrap();
    }
    let before = lrange(&n.dlq).await;
    // The target is a string key: Redis refuses the RPUSH (WRONGTYPE), a real failed publish.
    let mut c = raw().await;
    let _: () = c.set(&n.sandbox, "not a list").await.unwrap();
    let err = redrive(&t, &n.dlq, &RedriveOptions::new().to(n.sandbox.clone()))
        .await
        .expect_err("the publish fails");
    assert!(err.to_string().contains("re-publishing"), "{err}");
    assert_eq!(err.result().redriven, 0);
    assert_eq!(err.result().items.len(), 3);
    assert!(
        err.result()
            .items
            .iter()
            .all(|i| i.status == ItemStatus::Aborted)
    );
    // Nothing was acked: all three are back on the DLQ, byte for byte, none in flight.
    let mut after = lrange(&n.dlq).await;
    let mut b = before.clone();
    after.sort();
    b.sort();
    assert_eq!(after, b);
    assert!(in_flight(&n.dlq).await.is_empty());
    let kind: String = redis::cmd("TYPE")
        .arg(&n.sandbox)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(kind, "string");
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn poison_and_undecodable_bodies_are_restored_as_they_were() {
    let n = Queues::new("poison");
    let t = transport().await;
    let garbage = b"\xff\x00 not json".to_vec();
    let err = Envelope::decode(&garbage).unwrap_err();
    let wrapper = poison_body(&garbage, &err, &n.q);
    let object_poison = dead_letter("p-1", URN, "poison", json!(0), &n.q);
    let array = b"[1,2,3]".to_vec();
    for e in [&garbage, &wrapper, &object_poison, &array] {
        t.publish_raw(&n.dlq, e.clone()).await.unwrap();
    }
    let result = redrive(&t, &n.dlq, &RedriveOptions::new().bypass(true))
        .await
        .unwrap();
    let statuses: Vec<ItemStatus> = result.items.iter().map(|i| i.status).collect();
    assert_eq!(
        statuses,
        [
            ItemStatus::Undecodable,
            ItemStatus::Poison,
            ItemStatus::Poison,
            ItemStatus::Undecodable
        ]
    );
    assert_eq!((result.redriven, result.restored), (0, 4));
    assert!(result.items.iter().all(|i| !i.redriven && !i.bypassed));
    assert_eq!(
        lrange(&n.dlq).await,
        [garbage, wrapper, object_poison, array]
    );
    assert!(lrange(&n.q).await.is_empty());
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn non_numeric_attempts_are_restored_not_repaired() {
    let n = Queues::new("attempts");
    let t = transport().await;
    let bad = [
        dead_letter("n-1", URN, "failed", json!("3"), &n.q),
        dead_letter("n-2", URN, "failed", json!(null), &n.q),
        dead_letter("n-3", URN, "failed", json!([3]), &n.q),
    ];
    let good = dead_letter("n-4", URN, "failed", json!(3), &n.q);
    for e in bad.iter().chain([&good]) {
        t.publish_raw(&n.dlq, e.clone()).await.unwrap();
    }
    let result = redrive(&t, &n.dlq, &RedriveOptions::new()).await.unwrap();
    let statuses: Vec<ItemStatus> = result.items.iter().map(|i| i.status).collect();
    assert_eq!(
        statuses,
        [
            ItemStatus::NonNumericAttempts,
            ItemStatus::NonNumericAttempts,
            ItemStatus::NonNumericAttempts,
            ItemStatus::Redriven
        ]
    );
    assert_eq!(lrange(&n.dlq).await, bad);
    assert_eq!(ids(&lrange(&n.q).await), ["n-4"]);
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn a_dry_run_changes_nothing_and_reports_the_plan() {
    let n = Queues::new("dry");
    let t = transport().await;
    let mut h = Headers::new();
    h.insert("traceparent".into(), "00-abc-def-01".into());
    t.publish_with_headers(
        &n.dlq,
        &dead_letter("r-1", URN, "failed", json!(3), &n.q),
        Some(&h),
    )
    .await
    .unwrap();
    t.publish_raw(
        &n.dlq,
        dead_letter("r-2", URN, "unknown_urn", json!(0), "elsewhere"),
    )
    .await
    .unwrap();
    t.publish_raw(&n.dlq, b"garbage".to_vec()).await.unwrap();
    let before = lrange(&n.dlq).await;

    let opts = RedriveOptions::new().dry_run(true).bypass(true);
    let plan = redrive(&t, &n.dlq, &opts).await.unwrap();
    assert!(plan.dry_run);
    assert_eq!((plan.redriven, plan.restored), (0, 3));
    let got: Vec<(ItemStatus, Option<&str>, bool)> = plan
        .items
        .iter()
        .map(|i| (i.status, i.to.as_deref(), i.redriven || i.bypassed))
        .collect();
    assert_eq!(
        got,
        [
            (ItemStatus::Planned, Some(n.q.as_str()), false),
            (ItemStatus::Planned, Some("elsewhere"), false),
            (ItemStatus::Undecodable, None, false),
        ]
    );
    assert_eq!(lrange(&n.dlq).await, before, "the DLQ is as it was");
    assert!(in_flight(&n.dlq).await.is_empty());
    assert!(lrange(&n.q).await.is_empty());
    assert!(lrange("elsewhere").await.is_empty());
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn to_sends_every_message_to_the_sandbox() {
    let n = Queues::new("to");
    let t = transport().await;
    t.publish_raw(&n.dlq, dead_letter("t-1", URN, "failed", json!(3), &n.q))
        .await
        .unwrap();
    t.publish_raw(&n.dlq, dead_letter("t-2", URN, "failed", json!(3), "other"))
        .await
        .unwrap();
    let result = redrive(&t, &n.dlq, &RedriveOptions::new().to(n.sandbox.clone()))
        .await
        .unwrap();
    assert!(
        result
            .items
            .iter()
            .all(|i| i.to.as_deref() == Some(n.sandbox.as_str()))
    );
    assert_eq!(ids(&lrange(&n.sandbox).await), ["t-1", "t-2"]);
    assert!(lrange(&n.q).await.is_empty());
    assert!(lrange("other").await.is_empty());
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn max_takes_at_most_that_many() {
    let n = Queues::new("max");
    let t = transport().await;
    for i in 0..5 {
        t.publish_raw(
            &n.dlq,
            dead_letter(&format!("x-{i}"), URN, "failed", json!(3), &n.q),
        )
        .await
        .unwrap();
    }
    let result = redrive(&t, &n.dlq, &RedriveOptions::new().max(2))
        .await
        .unwrap();
    assert_eq!((result.items.len(), result.redriven), (2, 2));
    assert_eq!(ids(&lrange(&n.q).await), ["x-0", "x-1"]);
    assert_eq!(ids(&lrange(&n.dlq).await), ["x-2", "x-3", "x-4"]);
    assert!(in_flight(&n.dlq).await.is_empty());
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn selection_by_reason_urn_and_predicate() {
    let n = Queues::new("select");
    let t = transport().await;
    let other = "urn:babel:mail:send";
    for (id, urn, reason) in [
        ("s-1", URN, "failed"),
        ("s-2", URN, "unknown_urn"),
        ("s-3", other, "failed"),
        ("s-4", URN, "failed"),
    ] {
        t.publish_raw(&n.dlq, dead_letter(id, urn, reason, json!(3), &n.q))
            .await
            .unwrap();
    }
    let opts = RedriveOptions::new()
        .reason("failed")
        .urn(URN)
        .select(|env| env.meta.id != "s-4");
    let result = redrive(&t, &n.dlq, &opts).await.unwrap();
    let got: HashMap<&str, ItemStatus> = result
        .items
        .iter()
        .map(|i| (i.message_id.as_str(), i.status))
        .collect();
    assert_eq!(got["s-1"], ItemStatus::Redriven);
    assert_eq!(got["s-2"], ItemStatus::NotSelected, "reason");
    assert_eq!(got["s-3"], ItemStatus::NotSelected, "URN");
    assert_eq!(got["s-4"], ItemStatus::NotSelected, "predicate");
    assert_eq!(ids(&lrange(&n.q).await), ["s-1"]);
    assert_eq!(ids(&lrange(&n.dlq).await), ["s-2", "s-3", "s-4"]);
}

// --- replay in handlers, through the runtime, over Redis frames -------------------------

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
/// Whether the handlers fail (permanently): the first consume dead-letters.
static FAIL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
static EFFECTS: AtomicUsize = AtomicUsize::new(0);
/// (handler, meta.id, the Replay argument, is_replay() in the body, effect skipped).
static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());
type Seen = (&'static str, String, bool, bool, bool);

#[handler("urn:test:replay:sync")]
#[idempotent(store = STORE)]
fn on_sync(env: &Envelope, replay: Replay) -> Result<(), BoxError> {
    if FAIL.load(Ordering::SeqCst) {
        return Err(Permanent::new("declined").into());
    }
    let skipped =
        replay::bypass_external_effects(|| EFFECTS.fetch_add(1, Ordering::SeqCst)).is_none();
    SEEN.lock().unwrap().push((
        "sync",
        env.meta.id.clone(),
        replay.0,
        replay::is_replay(),
        skipped,
    ));
    Ok(())
}

#[handler("urn:test:replay:async")]
#[idempotent(store = STORE)]
async fn on_async(env: Envelope, Replay(flag): Replay) -> Result<(), BoxError> {
    if FAIL.load(Ordering::SeqCst) {
        return Err(Permanent::new("declined").into());
    }
    tokio::task::yield_now().await;
    let skipped =
        replay::bypass_external_effects_async(async { EFFECTS.fetch_add(1, Ordering::SeqCst) })
            .await
            .is_none();
    SEEN.lock().unwrap().push((
        "async",
        env.meta.id.clone(),
        flag,
        replay::is_replay(),
        skipped,
    ));
    Ok(())
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn a_redrive_with_bypass_is_a_replay_for_sync_and_async_handlers() {
    let n = Queues::new("replay");
    let app = || {
        App::new(RedisTransport::open(&redis_url()).unwrap())
            .queue(&n.q)
            .register(on_sync {})
            .register(on_async {})
    };
    let mut sent = Vec::new();
    for urn in ["urn:test:replay:sync", "urn:test:replay:async"] {
        let env = Envelope::new(urn, json!({"n": 1}))
            .unwrap()
            .with_queue(&n.q);
        sent.push(env.meta.id.clone());
        app().publish_raw(env.encode()).await.unwrap();
    }
    // 1. They fail permanently: dead-lettered by the Rust runtime.
    FAIL.store(true, Ordering::SeqCst);
    let stats = app().drain().await.unwrap();
    assert_eq!(stats.dead_lettered, 2);
    assert_eq!(lrange(&n.dlq).await.len(), 2);

    // 2. Redriven with bypass; 3. consumed again (fixed): both handlers see a replay and
    // skip their external effect, while their core runs (the guard had not remembered a
    // failed run).
    let t = transport().await;
    let result = redrive(&t, &n.dlq, &RedriveOptions::new().bypass(true))
        .await
        .unwrap();
    assert_eq!(result.redriven, 2);
    assert!(result.items.iter().all(|i| i.bypassed));
    FAIL.store(false, Ordering::SeqCst);
    let stats = app().drain().await.unwrap();
    assert_eq!(stats.succeeded, 2);
    let mut seen = SEEN.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("async", sent[1].clone(), true, true, true),
            ("sync", sent[0].clone(), true, true, true),
        ]
    );
    assert_eq!(EFFECTS.load(Ordering::SeqCst), 0);

    // Without the header (a plain publish of a new message), no replay: the effect runs.
    SEEN.lock().unwrap().clear();
    let env = Envelope::new("urn:test:replay:sync", json!({"n": 2}))
        .unwrap()
        .with_queue(&n.q);
    let mut h = Headers::new();
    h.insert(replay::HEADER.into(), "0".into());
    t.publish_with_headers(&n.q, &env.encode(), Some(&h))
        .await
        .unwrap();
    app().drain().await.unwrap();
    assert_eq!(
        *SEEN.lock().unwrap(),
        [("sync", env.meta.id.clone(), false, false, false)]
    );
    assert_eq!(EFFECTS.load(Ordering::SeqCst), 1);
}

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn headers_of_the_dead_letter_ride_along_and_a_stale_mark_is_dropped() {
    let n = Queues::new("headers");
    let t = transport().await;
    let mut h = Headers::new();
    h.insert("traceparent".into(), "00-4bf9-00f0-01".into());
    h.insert(replay::HEADER.into(), "1".into());
    h.insert("x-babelqueue-releases".into(), 4.into());
    t.publish_with_headers(
        &n.dlq,
        &dead_letter("h-1", URN, "failed", json!(3), &n.q),
        Some(&h),
    )
    .await
    .unwrap();
    // Without bypass: a full re-run (the old replay mark and the release count go).
    redrive(&t, &n.dlq, &RedriveOptions::new()).await.unwrap();
    let d = Delivery::new(&n.q, lrange(&n.q).await.remove(0), 0);
    let headers = d.headers().expect("traceparent kept");
    assert_eq!(headers.len(), 1);
    assert_eq!(headers["traceparent"], "00-4bf9-00f0-01");
}

// --- a redrive process SIGKILLed mid-run ----------------------------------------------------

const CHILD: &str = "BQ_REDRIVE_CHILD";
const MARK: &str = "BQ-REDRIVE-PUBLISHED";
/// The child hangs after this many re-publishes (the kill lands between the publish and
/// the ack of this one).
const HANG_AFTER: usize = 4;

#[tokio::test]
#[ignore = "needs Redis; CI runs it with --ignored"]
async fn a_redrive_killed_mid_run_loses_nothing() {
    let n = Queues::new("sigkill");
    let t = transport().await;
    let total = 10;
    let all: Vec<String> = (0..total).map(|i| format!("k-{i}")).collect();
    for id in &all {
        t.publish_raw(&n.dlq, dead_letter(id, URN, "failed", json!(3), &n.q))
            .await
            .unwrap();
    }
    let mut child = Command::new(crate::child_support::exe())
        .arg("redrive")
        .env(CHILD, &n.dlq)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting test_children (tests/children)");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let found = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains(MARK));
        let _ = tx.send(found);
    });
    let published = rx.recv_timeout(Duration::from_secs(60)).unwrap_or(false);
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(published, "the redrive process ended early ({status})");

    // Right after the kill: every message is in the DLQ (ready or in the dead process's
    // in-flight list) or in its target; the one killed between publish and ack is in both.
    let target = ids(&lrange(&n.q).await);
    let mut in_dlq = ids(&lrange(&n.dlq).await);
    in_dlq.extend(ids(&in_flight(&n.dlq).await));
    for id in &all {
        assert!(
            target.contains(id) || in_dlq.contains(id),
            "{id} was lost: target {target:?}, DLQ {in_dlq:?}"
        );
    }
    assert_eq!(target.len(), HANG_AFTER);
    let both: Vec<&String> = target.iter().filter(|id| in_dlq.contains(id)).collect();
    assert_eq!(both, [&all[HANG_AFTER - 1]], "the documented window");
    assert_eq!(in_dlq.len(), total - HANG_AFTER + 1);

    // The next redrive takes back what the dead one held (once its 1 s heartbeat has
    // expired) and finishes the job: every message ends in the target, the one in the
    // window twice (the idempotency guard absorbs it: same meta.id).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        redrive(&t, &n.dlq, &RedriveOptions::new().bypass(true))
            .await
            .unwrap();
        if lrange(&n.dlq).await.is_empty() && in_flight(&n.dlq).await.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead redrive's messages never came back"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut target = ids(&lrange(&n.q).await);
    target.sort();
    let mut expected = all.clone();
    expected.push(all[HANG_AFTER - 1].clone());
    expected.sort();
    assert_eq!(target, expected);
}
