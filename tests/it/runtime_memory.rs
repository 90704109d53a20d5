//! The consume runtime (SPEC section 4) over the in-process transport: no server needed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babelqueue::runtime::{
    App, Disposition, Headers, InMemoryTransport, POISON_URN, Report, Transport,
    UnknownUrnStrategy, recover_poison,
};
use babelqueue::{
    AsyncLeaseStore, DeadLetterReason, Envelope, Guard, InFlight, InMemoryStore,
    envelope::now_millis,
};
use serde_json::{Value, json};

const CHARGE: &str = "urn:babel:payments:charge";

#[derive(Debug, thiserror::Error)]
#[error("card declined for {0}")]
struct ChargeDeclined(String);

fn envelope(queue: &str, data: Value) -> Envelope {
    Envelope::new(CHARGE, data).unwrap().with_queue(queue)
}

fn explode(what: &str) -> Result<(), ChargeDeclined> {
    panic!("{what}")
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

#[tokio::test(start_paused = true)]
async fn produce_then_consume_delivers_the_payload_and_acks() {
    let t = InMemoryTransport::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let app = App::new(t.clone()).queue("orders").route_sync(
        "urn:babel:orders:created",
        move |env: &Envelope| {
            s.lock().unwrap().push(env.clone());
        },
    );
    let sent = app
        .publish(
            "urn:babel:orders:created",
            &json!({"order_id": 1042, "note": "Café ☕"}),
        )
        .await
        .unwrap();
    assert_eq!(sent.meta.queue, "orders");
    let stats = app.drain().await.unwrap();
    assert_eq!((stats.processed, stats.succeeded, stats.acked), (1, 1, 1));
    let got = seen.lock().unwrap().clone();
    assert_eq!(got, vec![sent]);
    assert_eq!((t.len("orders"), t.processing_len("orders")), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_is_skipped_and_acked() {
    let t = InMemoryTransport::new();
    let store = Arc::new(InMemoryStore::new());
    let charges = Arc::new(AtomicUsize::new(0));
    let (st, ch) = (store.clone(), charges.clone());
    let app = App::new(t.clone())
        .queue("payments")
        .route_async(CHARGE, move |env: Envelope| {
            let (st, ch) = (st.clone(), ch.clone());
            async move {
                Guard::new(&*st)
                    .run_async(&env, async {
                        ch.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), ChargeDeclined>(())
                    })
                    .await
                    .map(drop)
            }
        });
    let bytes = envelope(
        "payments",
        json!({"payment_id": "pay_7f3a", "amount": 4200}),
    )
    .encode();
    app.publish_raw(bytes.clone()).await.unwrap();
    app.publish_raw(bytes).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    assert_eq!((stats.succeeded, stats.skipped, stats.acked), (1, 1, 2));
    assert_eq!((t.len("payments"), t.processing_len("payments")), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_failing_handler_is_retried_then_dead_lettered_with_the_block() {
    let t = InMemoryTransport::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let app = App::new(t.clone())
        .queue("payments")
        .route_sync(CHARGE, move |env: &Envelope| {
            c.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(ChargeDeclined(env.data["payment_id"].to_string()))
        });
    // Another producer's envelope with an unknown field and a meta.queue of its own.
    let original = json!({
        "job": CHARGE, "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
        "data": {"payment_id": "pay_1", "amount": 10},
        "meta": {"id": "f1e2d3c4-b5a6-4789-90ab-cdef01234567", "queue": "billing", "lang": "go",
                 "schema_version": 1, "created_at": 1749132727000_i64},
        "attempts": 0, "x_tenant": "acme"
    });
    let before = now_millis();
    app.publish_raw(serde_json::to_vec(&original).unwrap())
        .await
        .unwrap();
    let stats = app.drain().await.unwrap();
    let after = now_millis();

    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "max_attempts defaults to 3"
    );
    assert_eq!(
        (
            stats.failed,
            stats.retried,
            stats.dead_lettered,
            stats.acked
        ),
        (3, 2, 1, 3)
    );
    assert_eq!((t.len("payments"), t.processing_len("payments")), (0, 0));
    let dlq = t.messages("payments.dlq");
    assert_eq!(dlq.len(), 1);
    let mut dead = json_of(&dlq[0]);
    let block = dead.as_object_mut().unwrap().remove("dead_letter").unwrap();
    assert_eq!(block["reason"], "failed");
    assert_eq!(block["error"], "card declined for \"pay_1\"");
    assert!(
        block["exception"]
            .as_str()
            .unwrap()
            .ends_with("ChargeDeclined")
    );
    let failed_at = block["failed_at"].as_i64().unwrap();
    assert!((before..=after).contains(&failed_at));
    assert_eq!(block["original_queue"], "billing");
    assert_eq!(block["attempts"], 3);
    assert_eq!(block["lang"], "rust");
    // Everything else is the original message (attempts at its final count).
    let mut expected = original.clone();
    expected["attempts"] = json!(3);
    assert_eq!(dead, expected);
    // And it is still an accepted envelope with a typed block.
    let env = Envelope::decode(&dlq[0]).unwrap();
    assert_eq!(env.dead_letter.unwrap().reason, DeadLetterReason::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_handler_failing_once_succeeds_on_the_retry() {
    let t = InMemoryTransport::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let attempts_seen = Arc::new(Mutex::new(Vec::new()));
    let (c, a) = (calls.clone(), attempts_seen.clone());
    let app = App::new(t.clone())
        .queue("q")
        .route_sync(CHARGE, move |env: &Envelope| {
            a.lock().unwrap().push(env.attempts);
            if c.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(ChargeDeclined("first".into()))
            } else {
                Ok(())
            }
        });
    app.publish(CHARGE, &json!({})).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!(*attempts_seen.lock().unwrap(), vec![0, 1]);
    assert_eq!(
        (stats.retried, stats.succeeded, stats.dead_lettered),
        (1, 1, 0)
    );
    assert!(t.messages("q.dlq").is_empty());
}

#[tokio::test(start_paused = true)]
async fn without_dead_lettering_the_last_failure_is_dropped() {
    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue("q")
        .max_attempts(2)
        .dead_letter(false)
        .route_sync(CHARGE, |_: &Envelope| {
            Err::<(), _>(ChargeDeclined("x".into()))
        });
    app.publish(CHARGE, &json!({})).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!(
        (stats.retried, stats.dropped, stats.dead_lettered),
        (1, 1, 0)
    );
    assert_eq!(
        (t.len("q"), t.processing_len("q"), t.len("q.dlq")),
        (0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn poison_bodies_are_dead_lettered_with_their_bytes_and_the_loop_goes_on() {
    let t = InMemoryTransport::new();
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let app = App::new(t.clone())
        .queue("q")
        .dead_letter_queue("poison-box")
        .route_sync(CHARGE, move |_: &Envelope| {
            h.fetch_add(1, Ordering::SeqCst);
        });
    let garbage: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 7 + 3) as u8).collect();
    let unknown_version = json!({
        "job": CHARGE, "trace_id": "t", "data": {},
        "meta": {"id": "m", "queue": "elsewhere", "lang": "go", "schema_version": 2, "created_at": 0},
        "attempts": 1
    });
    let poison: Vec<Vec<u8>> = vec![
        b"this is not json".to_vec(),
        b"[1,2,3]".to_vec(),
        serde_json::to_vec(&unknown_version).unwrap(),
        garbage.clone(),
        b"\xc3\x28".to_vec(),
    ];
    app.publish(CHARGE, &json!({"n": 1})).await.unwrap();
    for p in &poison {
        app.publish_raw(p.clone()).await.unwrap();
    }
    app.publish(CHARGE, &json!({"n": 2})).await.unwrap();

    let stats = app.drain().await.unwrap();
    assert_eq!(
        handled.load(Ordering::SeqCst),
        2,
        "good messages on both sides ran"
    );
    assert_eq!((stats.poison, stats.dead_lettered, stats.acked), (5, 5, 7));
    assert_eq!((t.len("q"), t.processing_len("q")), (0, 0));
    let dlq = t.messages("poison-box");
    assert_eq!(dlq.len(), 5);
    for (original, dead) in poison.iter().zip(&dlq) {
        let block = &json_of(dead)["dead_letter"];
        assert_eq!(block["reason"], "poison");
        assert_eq!(block["lang"], "rust");
        assert!(block["error"].as_str().is_some_and(|e| !e.is_empty()));
        // Every poison body comes back byte for byte.
        assert_eq!(recover_poison(dead).as_ref(), Some(original));
        if Envelope::decode(dead).is_ok_and(|e| e.job == POISON_URN) {
            // Non-objects travel in a wrapper envelope.
            assert_eq!(block["original_queue"], "q");
        } else {
            // The object is dead-lettered as is, plus the block.
            let mut obj = json_of(dead);
            obj.as_object_mut().unwrap().remove("dead_letter");
            assert_eq!(obj, unknown_version);
            assert_eq!(block["original_queue"], "elsewhere");
            assert_eq!(block["attempts"], 1);
        }
    }
    let garbage_dead = &dlq[3];
    assert_eq!(json_of(garbage_dead)["data"]["encoding"], "base64");
}

#[tokio::test(start_paused = true)]
async fn unknown_urn_strategies() {
    let make = |strategy| {
        let t = InMemoryTransport::new();
        let app = App::new(t.clone()).queue("q").unknown_urn(strategy);
        (t, app)
    };
    let unknown = || envelope("q", json!({"k": 1})).encode();

    // fail (default): retried like a failure, then dead-lettered as unknown_urn.
    let (t, app) = make(UnknownUrnStrategy::Fail);
    app.publish_raw(unknown()).await.unwrap();
    let s = app.drain().await.unwrap();
    assert_eq!((s.retried, s.dead_lettered, s.unknown_urn), (2, 1, 3));
    let block = json_of(&t.messages("q.dlq")[0])["dead_letter"].clone();
    assert_eq!(block["reason"], "unknown_urn");
    assert_eq!(block["attempts"], 3);

    // delete: acked and gone.
    let (t, app) = make(UnknownUrnStrategy::Delete);
    app.publish_raw(unknown()).await.unwrap();
    let s = app.drain().await.unwrap();
    assert_eq!((s.dropped, s.acked), (1, 1));
    assert_eq!(
        (t.len("q"), t.len("q.dlq"), t.processing_len("q")),
        (0, 0, 0)
    );

    // release: put back unchanged (body byte for byte, its release count in the frame)
    // after the release delay, for a consumer that knows the URN; after `max_releases`
    // releases nobody took it: dead-lettered as unknown_urn. Never a hot loop.
    let (t, app) = make(UnknownUrnStrategy::Release);
    let app = app.release_delay(Duration::from_secs(2)).max_releases(3);
    let bytes = unknown();
    app.publish_raw(bytes.clone()).await.unwrap();
    let started = tokio::time::Instant::now();
    let s = app.drain().await.unwrap();
    assert_eq!((s.released, s.dead_lettered, s.unknown_urn), (3, 1, 4));
    assert!(
        started.elapsed() >= Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        (t.len("q"), t.processing_len("q"), t.delayed_len("q")),
        (0, 0, 0)
    );
    let dlq = t.messages("q.dlq");
    let frame =
        babelqueue::runtime::unframe(&dlq[0]).expect("the release count travels in a frame");
    assert_eq!(frame.0[babelqueue::runtime::RELEASES_HEADER], 3);
    let dead = json_of(&frame.1);
    assert_eq!(dead["dead_letter"]["reason"], "unknown_urn");
    let mut original = json_of(&bytes);
    original["dead_letter"] = dead["dead_letter"].clone();
    assert_eq!(dead, original, "every field of the original survives");

    // dead_letter: at once, attempts untouched.
    let (t, app) = make(UnknownUrnStrategy::DeadLetter);
    app.publish_raw(unknown()).await.unwrap();
    let s = app.drain().await.unwrap();
    assert_eq!((s.dead_lettered, s.retried), (1, 0));
    let dead = json_of(&t.messages("q.dlq")[0]);
    assert_eq!(dead["attempts"], 0);
    assert_eq!(dead["dead_letter"]["reason"], "unknown_urn");
    assert_eq!(dead["dead_letter"]["attempts"], 0);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_is_a_failure_not_the_end_of_the_loop() {
    let t = InMemoryTransport::new();
    let ok = Arc::new(AtomicUsize::new(0));
    let o = ok.clone();
    let app = App::new(t.clone())
        .queue("q")
        .concurrency(2)
        .route_async("urn:babel:test:panics", |_env: Envelope| async {
            explode("handler bug")
        })
        .route_sync("urn:babel:test:sync-panics", |_: &Envelope| {
            explode("sync bug")
        })
        .route_sync("urn:babel:test:ok", move |_: &Envelope| {
            o.fetch_add(1, Ordering::SeqCst);
        });
    app.publish("urn:babel:test:panics", &json!({}))
        .await
        .unwrap();
    app.publish("urn:babel:test:sync-panics", &json!({}))
        .await
        .unwrap();
    app.publish("urn:babel:test:ok", &json!({})).await.unwrap();
    let s = app.drain().await.unwrap();
    assert_eq!(ok.load(Ordering::SeqCst), 1);
    assert_eq!((s.failed, s.dead_lettered), (6, 2));
    for dead in t.messages("q.dlq") {
        let block = json_of(&dead)["dead_letter"].clone();
        assert_eq!(block["exception"], "panic");
        assert!(block["error"].as_str().unwrap().contains("bug"));
    }
}

#[tokio::test(start_paused = true)]
async fn concurrency_bounds_the_messages_in_flight() {
    for n in [1usize, 4] {
        let t = InMemoryTransport::new();
        let now = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (nw, pk) = (now.clone(), peak.clone());
        let app = App::new(t.clone()).queue("q").concurrency(n).route_async(
            CHARGE,
            move |_env: Envelope| {
                let (nw, pk) = (nw.clone(), pk.clone());
                async move {
                    let cur = nw.fetch_add(1, Ordering::SeqCst) + 1;
                    pk.fetch_max(cur, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    nw.fetch_sub(1, Ordering::SeqCst);
                    Ok::<(), ChargeDeclined>(())
                }
            },
        );
        for i in 0..12 {
            app.publish(CHARGE, &json!({"i": i})).await.unwrap();
        }
        let s = app.drain().await.unwrap();
        assert_eq!(s.succeeded, 12);
        assert_eq!(peak.load(Ordering::SeqCst), n, "concurrency({n})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_mid_burst_loses_nothing() {
    let t = InMemoryTransport::new();
    let handled = Arc::new(Mutex::new(Vec::<String>::new()));
    let h = handled.clone();
    let app = App::new(t.clone())
        .queue("burst")
        .concurrency(4)
        .poll_timeout(Duration::from_millis(20))
        .route_async(CHARGE, move |env: Envelope| {
            let h = h.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                h.lock().unwrap().push(env.meta.id.clone());
                Ok::<(), ChargeDeclined>(())
            }
        });
    let mut ids = Vec::new();
    for i in 0..1000 {
        ids.push(app.publish(CHARGE, &json!({"i": i})).await.unwrap().meta.id);
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn({
        let app = app.clone();
        async move {
            app.run_until(async {
                let _ = rx.await;
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    tx.send(()).unwrap();
    let stats = worker.await.unwrap();

    let handled = handled.lock().unwrap().clone();
    assert!(
        !handled.is_empty() && handled.len() < 1000,
        "stopped mid-burst: {}",
        handled.len()
    );
    assert_eq!(
        stats.acked as usize,
        handled.len(),
        "every handled message was acked"
    );
    assert_eq!(
        t.processing_len("burst"),
        0,
        "in-flight messages were finished and acked"
    );
    let left: Vec<String> = t
        .messages("burst")
        .iter()
        .map(|b| Envelope::decode(b).unwrap().meta.id)
        .collect();
    assert_eq!(handled.len() + left.len(), 1000);
    let mut all: Vec<String> = handled.iter().chain(&left).cloned().collect();
    all.sort();
    ids.sort();
    assert_eq!(
        all, ids,
        "each message is either handled once or still queued"
    );
}

#[derive(Debug, thiserror::Error)]
enum LeasedError {
    #[error(transparent)]
    Busy(#[from] InFlight),
}

#[tokio::test(start_paused = true)]
async fn an_id_in_flight_elsewhere_is_deferred_without_counting_an_attempt() {
    let t = InMemoryTransport::new();
    let store = Arc::new(InMemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let (st, r) = (store.clone(), runs.clone());
    let app = App::new(t.clone())
        .queue("q")
        .in_flight_delay(Duration::from_millis(5))
        .route_async(CHARGE, move |env: Envelope| {
            let (st, r) = (st.clone(), r.clone());
            async move {
                Guard::new(&*st)
                    .lease(Duration::from_secs(30))
                    .run_async(&env, async {
                        r.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), LeasedError>(())
                    })
                    .await
                    .map(drop)
            }
        });
    let env = envelope("q", json!({"payment_id": "pay_1"}));
    let bytes = env.encode();
    // Another worker holds the id.
    let babelqueue::lease::Claim::Acquired(token) =
        AsyncLeaseStore::claim(&*store, &env.meta.id, Duration::from_secs(30))
            .await
            .unwrap()
    else {
        panic!("fresh id must be claimable")
    };
    app.publish_raw(bytes.clone()).await.unwrap();
    // The drain defers it (delayed, not a hot loop) until the other worker completes;
    // it ends only once nothing is left delayed.
    let completer = {
        let (store, id) = (store.clone(), env.meta.id.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(
                AsyncLeaseStore::complete(&*store, &id, &token, None)
                    .await
                    .unwrap()
            );
        })
    };
    let s = app.drain().await.unwrap();
    completer.await.unwrap();
    assert!(
        (5..=12).contains(&s.deferred),
        "one deferral per in_flight_delay (5 ms) for 50 ms: {}",
        s.deferred
    );
    assert_eq!((s.failed, s.retried, s.dead_lettered), (0, 0, 0));
    assert_eq!((s.skipped, s.acked), (1, s.deferred + 1));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        (t.len("q"), t.processing_len("q"), t.delayed_len("q")),
        (0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn header_frames_are_read_and_kept_on_retry_and_dead_letter() {
    let t = InMemoryTransport::new();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let app =
        App::new(t.clone())
            .queue("q")
            .max_attempts(2)
            .route_sync(CHARGE, move |env: &Envelope| {
                g.lock().unwrap().push(env.clone());
                Err::<(), _>(ChargeDeclined("x".into()))
            });
    let env = envelope("q", json!({"n": 1}));
    let mut headers = Headers::new();
    headers.insert(
        "traceparent".into(),
        json!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    );
    t.publish_with_headers("q", &env.encode(), Some(&headers))
        .await
        .unwrap();
    let element = t.messages("q").remove(0);
    assert_eq!(json_of(&element)["__bq_frame"], 1);

    let s = app.drain().await.unwrap();
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], env, "the frame's body is the envelope");
    assert_eq!(got[1].attempts, 1, "the retry was republished in its frame");
    assert_eq!((s.retried, s.dead_lettered), (1, 1));
    let dead = t.messages("q.dlq");
    let frame = json_of(&dead[0]);
    assert_eq!(frame["__bq_frame"], 1);
    assert_eq!(frame["headers"], Value::Object(headers));
    let body = json_of(frame["body"].as_str().unwrap().as_bytes());
    assert_eq!(body["attempts"], 2);
    assert_eq!(body["dead_letter"]["reason"], "failed");
    assert_eq!(body["meta"]["id"], env.meta.id.as_str());
}

#[tokio::test(start_paused = true)]
async fn stranded_messages_are_requeued_and_handled() {
    let t = InMemoryTransport::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let app = App::new(t.clone())
        .queue("q")
        .route_sync(CHARGE, move |_: &Envelope| {
            r.fetch_add(1, Ordering::SeqCst);
        });
    app.publish(CHARGE, &json!({})).await.unwrap();
    // A worker reserves it and dies before acking.
    let _lost = t.reserve("q", Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(app.drain().await.unwrap().processed, 0);
    assert_eq!(app.requeue_processing().await.unwrap(), 1);
    assert_eq!(app.drain().await.unwrap().succeeded, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!((t.len("q"), t.processing_len("q")), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn the_observer_sees_every_delivery() {
    let t = InMemoryTransport::new();
    let reports = Arc::new(Mutex::new(Vec::<Report>::new()));
    let r = reports.clone();
    let store = Arc::new(InMemoryStore::new());
    let st = store.clone();
    let app = App::new(t.clone())
        .queue("q")
        .on_delivery(move |rep| r.lock().unwrap().push(rep.clone()))
        .route_async(CHARGE, move |env: Envelope| {
            let st = st.clone();
            async move {
                Guard::new(&*st)
                    .run_async(&env, async { Ok::<(), ChargeDeclined>(()) })
                    .await
                    .map(drop)
            }
        });
    let bytes = envelope("q", json!({"payment_id": "pay_7f3a"})).encode();
    app.publish_raw(bytes.clone()).await.unwrap();
    app.publish_raw(bytes).await.unwrap();
    app.publish_raw(b"nope".to_vec()).await.unwrap();
    app.drain().await.unwrap();
    let reports = reports.lock().unwrap();
    let kinds: Vec<_> = reports.iter().map(|r| r.disposition.clone()).collect();
    assert_eq!(
        kinds,
        vec![
            Disposition::Succeeded,
            Disposition::Skipped,
            Disposition::DeadLettered {
                reason: DeadLetterReason::Poison
            }
        ]
    );
    assert_eq!(
        reports[1].envelope.as_ref().unwrap().data["payment_id"],
        "pay_7f3a"
    );
    assert!(reports[2].envelope.is_none());
    assert!(reports.iter().all(|r| r.acked));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_drain_waits_for_the_retries_of_other_workers() {
    let t = InMemoryTransport::new();
    let first_tries = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let f = first_tries.clone();
    let app =
        App::new(t.clone())
            .queue("q")
            .concurrency(8)
            .route_async(CHARGE, move |env: Envelope| {
                let f = f.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    // Each message fails on its first delivery: its retry is republished by
                    // whichever worker handled it, possibly after the others saw the queue empty.
                    if f.lock().unwrap().insert(env.meta.id.clone()) {
                        Err(ChargeDeclined(env.meta.id))
                    } else {
                        Ok(())
                    }
                }
            });
    for i in 0..200 {
        app.publish(CHARGE, &json!({"i": i})).await.unwrap();
    }
    let s = app.drain().await.unwrap();
    assert_eq!(
        (s.retried, s.succeeded, s.acked, s.processed),
        (200, 200, 400, 400)
    );
    assert_eq!(
        (t.len("q"), t.processing_len("q"), t.len("q.dlq")),
        (0, 0, 0)
    );
}

/// A `Write` into a shared buffer, for capturing the tracing output.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_message_has_a_span_and_events_for_ack_skip_retry_and_dead_letter() {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let t = InMemoryTransport::new();
    let store = Arc::new(InMemoryStore::new());
    let st = store.clone();
    let app = App::new(t.clone())
        .queue("traced")
        .max_attempts(2)
        .route_async(CHARGE, move |env: Envelope| {
            let st = st.clone();
            async move {
                Guard::new(&*st)
                    .run_async(&env, async {
                        if env.data.contains_key("fail") {
                            Err(ChargeDeclined("x".into()))
                        } else {
                            Ok(())
                        }
                    })
                    .await
                    .map(drop)
            }
        });
    let ok = envelope("traced", json!({"n": 1}));
    app.publish_raw(ok.encode()).await.unwrap();
    app.publish_raw(ok.encode()).await.unwrap();
    let failing = envelope("traced", json!({"fail": true}));
    app.publish_raw(failing.encode()).await.unwrap();
    app.drain().await.unwrap();

    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    // Each event line carries its message span with the message's fields.
    let in_span = |fields: &[String]| {
        text.lines().any(|line| {
            line.contains("babelqueue.message{") && fields.iter().all(|f| line.contains(f.as_str()))
        })
    };
    let ok_fields = [
        "queue=traced".to_owned(),
        format!("urn=\"{CHARGE}\""),
        format!("meta.id=\"{}\"", ok.meta.id),
        format!("trace_id=\"{}\"", ok.trace_id),
        format!("messaging.message.id=\"{}\"", ok.meta.id),
        format!("messaging.message.conversation_id=\"{}\"", ok.trace_id),
        "messaging.system=\"babelqueue\"".to_owned(),
        "messaging.destination.name=traced".to_owned(),
        "attempts=0}".to_owned(),
    ];
    assert!(in_span(&ok_fields), "{text}");
    let retry_fields = [
        format!("meta.id=\"{}\"", failing.meta.id),
        format!("trace_id=\"{}\"", failing.trace_id),
        "attempts=1}".to_owned(),
    ];
    assert!(in_span(&retry_fields), "{text}");
    for event in [
        "acked",
        "duplicate skipped",
        "handler failed; retrying",
        "dead-lettered",
    ] {
        assert!(text.contains(event), "no `{event}` event in:\n{text}");
    }
}
