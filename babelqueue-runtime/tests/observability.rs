//! Observability of the consume runtime: the message span's fields (OpenTelemetry
//! messaging conventions), the `Report`'s duration and headers, the dead letter's whole
//! cause chain; with feature `metrics` the `babelqueue_*` metrics through a recorder; with
//! feature `opentelemetry` the producer's `traceparent` as the message span's parent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use babelqueue_core::{DeadLetterReason, Envelope};
use babelqueue_runtime::{App, Disposition, Headers, InMemoryTransport, Report, Transport};
use serde_json::{Value, json};

const CHARGE: &str = "urn:babel:payments:charge";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[derive(Debug, thiserror::Error)]
#[error("connection reset by peer")]
struct Root;

#[derive(Debug, thiserror::Error)]
#[error("db error")]
struct Db(#[source] Root);

#[derive(Debug, thiserror::Error)]
#[error("postgres store")]
struct StoreFailed(#[source] Db);

fn traced_headers() -> Headers {
    let mut h = Headers::new();
    h.insert("traceparent".into(), TRACEPARENT.into());
    h.insert("tracestate".into(), "congo=t61rcWkgMzE".into());
    h
}

fn reports(app: App) -> (App, Arc<Mutex<Vec<Report>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let app = app.on_delivery(move |r| s.lock().unwrap().push(r.clone()));
    (app, seen)
}

#[tokio::test]
async fn a_dead_letter_keeps_the_whole_cause_chain_and_the_top_type() {
    let t = InMemoryTransport::new();
    let (app, seen) = reports(
        App::new(t.clone())
            .queue("obs-chain")
            .max_attempts(1)
            .route_sync(CHARGE, |_: &Envelope| Err::<(), _>(StoreFailed(Db(Root)))),
    );
    let env = Envelope::new(CHARGE, json!({"n": 1})).unwrap();
    t.publish_with_headers("obs-chain", &env.encode(), Some(&traced_headers()))
        .await
        .unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!(stats.dead_lettered, 1);

    let dlq = t.messages("obs-chain.dlq");
    assert_eq!(dlq.len(), 1);
    // The dead letter keeps the frame's headers.
    let (headers, body) = babelqueue_runtime::unframe(&dlq[0]).expect("a header frame");
    assert_eq!(headers, traced_headers());
    let dead: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        dead["dead_letter"]["error"],
        "postgres store: db error: connection reset by peer"
    );
    assert_eq!(
        dead["dead_letter"]["exception"],
        std::any::type_name::<StoreFailed>()
    );
    assert_eq!(dead["dead_letter"]["reason"], "failed");

    let reports = seen.lock().unwrap();
    let [r] = &reports[..] else {
        panic!("one report, got {reports:?}")
    };
    assert_eq!(
        r.disposition,
        Disposition::DeadLettered {
            reason: DeadLetterReason::Failed
        }
    );
    assert_eq!(
        r.error.as_deref(),
        Some("postgres store: db error: connection reset by peer")
    );
    assert_eq!(r.urn.as_deref(), Some(CHARGE));
    assert_eq!(r.headers.as_ref(), Some(&traced_headers()));
}

#[tokio::test(start_paused = true)]
async fn the_report_carries_the_handler_duration_and_the_headers() {
    let t = InMemoryTransport::new();
    let (app, seen) = reports(App::new(t.clone()).queue("obs-duration").route_async(
        CHARGE,
        |_: Envelope| async {
            tokio::time::sleep(Duration::from_millis(250)).await;
        },
    ));
    let env = Envelope::new(CHARGE, json!({})).unwrap();
    t.publish_with_headers("obs-duration", &env.encode(), Some(&traced_headers()))
        .await
        .unwrap();
    app.publish(CHARGE, &json!({})).await.unwrap();
    // Not an envelope: no handler runs, so no duration.
    app.publish_raw(b"not json".to_vec()).await.unwrap();
    app.drain().await.unwrap();

    let reports = seen.lock().unwrap();
    assert_eq!(reports.len(), 3);
    for r in &reports[..2] {
        assert_eq!(r.disposition, Disposition::Succeeded);
        let d = r.duration.expect("the handler ran");
        assert!(
            d >= Duration::from_millis(250) && d < Duration::from_millis(300),
            "{d:?}"
        );
        assert_eq!(r.urn.as_deref(), Some(CHARGE));
    }
    assert_eq!(reports[0].headers.as_ref(), Some(&traced_headers()));
    assert_eq!(reports[1].headers, None, "published without headers");
    let poison = &reports[2];
    assert_eq!(
        poison.disposition,
        Disposition::DeadLettered {
            reason: DeadLetterReason::Poison
        }
    );
    assert_eq!((poison.duration, poison.urn.as_deref()), (None, None));
}

#[cfg(feature = "metrics")]
mod recorder {
    //! A small in-process `metrics` recorder: counters, gauges (with their peak) and
    //! histograms (every sample), by name and sorted labels.

    use std::collections::{BTreeMap, HashMap};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, OnceLock};

    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
        Recorder, SharedString, Unit,
    };

    pub type Labels = BTreeMap<String, String>;

    #[derive(Default)]
    pub struct Cell {
        pub count: AtomicU64,
        /// (value, peak)
        pub gauge: Mutex<(f64, f64)>,
        pub samples: Mutex<Vec<f64>>,
    }

    impl CounterFn for Cell {
        fn increment(&self, v: u64) {
            self.count.fetch_add(v, Ordering::SeqCst);
        }
        fn absolute(&self, v: u64) {
            self.count.fetch_max(v, Ordering::SeqCst);
        }
    }

    impl GaugeFn for Cell {
        fn increment(&self, v: f64) {
            let mut g = self.gauge.lock().unwrap();
            g.0 += v;
            g.1 = g.1.max(g.0);
        }
        fn decrement(&self, v: f64) {
            self.gauge.lock().unwrap().0 -= v;
        }
        fn set(&self, v: f64) {
            let mut g = self.gauge.lock().unwrap();
            g.0 = v;
            g.1 = g.1.max(v);
        }
    }

    impl HistogramFn for Cell {
        fn record(&self, v: f64) {
            self.samples.lock().unwrap().push(v);
        }
    }

    #[derive(Default)]
    pub struct Rec(Mutex<HashMap<(String, Labels), Arc<Cell>>>);

    impl Rec {
        fn cell(&self, key: &Key) -> Arc<Cell> {
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            self.0
                .lock()
                .unwrap()
                .entry((key.name().to_owned(), labels))
                .or_default()
                .clone()
        }

        pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<Arc<Cell>> {
            let labels: Labels = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            self.0
                .lock()
                .unwrap()
                .get(&(name.to_owned(), labels))
                .cloned()
        }

        pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
            self.get(name, labels)
                .map_or(0, |c| c.count.load(Ordering::SeqCst))
        }

        pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<(f64, f64)> {
            self.get(name, labels).map(|c| *c.gauge.lock().unwrap())
        }

        pub fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
            self.get(name, labels)
                .map(|c| c.samples.lock().unwrap().clone())
                .unwrap_or_default()
        }

        /// Every series of `name` whose labels include `queue`.
        pub fn series(&self, name: &str, queue: &str) -> Vec<Labels> {
            let mut v: Vec<Labels> = self
                .0
                .lock()
                .unwrap()
                .keys()
                .filter(|(n, l)| n == name && l.get("queue").map(String::as_str) == Some(queue))
                .map(|(_, l)| l.clone())
                .collect();
            v.sort();
            v
        }
    }

    impl Recorder for Rec {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(self.cell(key))
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(self.cell(key))
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(self.cell(key))
        }
    }

    /// The process-wide recorder (tests use distinct queue and store names).
    pub fn installed() -> &'static Rec {
        static REC: OnceLock<&'static Rec> = OnceLock::new();
        REC.get_or_init(|| {
            let rec: &'static Rec = Box::leak(Box::default());
            metrics::set_global_recorder(rec).expect("no other recorder in this test binary");
            rec
        })
    }
}

#[cfg(feature = "metrics")]
#[tokio::test(start_paused = true)]
async fn metrics_count_deliveries_by_outcome_retries_dead_letters_and_store_calls() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use babelqueue_core::{Guard, InMemoryStore};
    use babelqueue_runtime::metrics::{
        DEAD_LETTERS_TOTAL, DELIVERIES_TOTAL, HANDLER_DURATION_SECONDS, IN_FLIGHT, Metered,
        RETRIES_TOTAL, STORE_CALL_DURATION_SECONDS, STORE_ERRORS_TOTAL,
    };

    let rec = recorder::installed();
    let q = "obs-metrics";
    let store = Arc::new(Metered::new(InMemoryStore::new(), "obs-memory"));
    let flaky_calls = Arc::new(AtomicUsize::new(0));
    let (st, fc) = (store.clone(), flaky_calls.clone());
    let t = InMemoryTransport::new();
    let app =
        App::new(t.clone())
            .queue(q)
            .max_attempts(2)
            .route_async(CHARGE, move |env: Envelope| {
                let (st, fc) = (st.clone(), fc.clone());
                async move {
                    let kind = env.data["kind"].as_str().unwrap_or_default().to_owned();
                    Guard::new(&*st)
                        .run_async(&env, async {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            match kind.as_str() {
                                "ok" => Ok(()),
                                // Fails on its first delivery only.
                                "flaky" if fc.fetch_add(1, Ordering::SeqCst) > 0 => Ok(()),
                                _ => Err(StoreFailed(Db(Root))),
                            }
                        })
                        .await
                        .map(drop)
                }
            });
    let ok = Envelope::new(CHARGE, json!({"kind": "ok"}))
        .unwrap()
        .encode();
    app.publish_raw(ok.clone()).await.unwrap();
    app.publish_raw(ok).await.unwrap(); // a duplicate: skipped
    app.publish(CHARGE, &json!({"kind": "flaky"}))
        .await
        .unwrap(); // retried, then ok
    app.publish(CHARGE, &json!({"kind": "bad"})).await.unwrap(); // retried, dead-lettered
    app.publish_raw(b"{not json".to_vec()).await.unwrap(); // poison
    let stats = app.drain().await.unwrap();
    assert_eq!(
        (
            stats.succeeded,
            stats.skipped,
            stats.retried,
            stats.dead_lettered
        ),
        (2, 1, 2, 2)
    );

    let d = |urn: &str, outcome: &str| {
        rec.counter(
            DELIVERIES_TOTAL,
            &[("queue", q), ("urn", urn), ("outcome", outcome)],
        )
    };
    assert_eq!(d(CHARGE, "succeeded"), 2);
    assert_eq!(d(CHARGE, "skipped"), 1);
    assert_eq!(d(CHARGE, "retried"), 2);
    assert_eq!(d(CHARGE, "dead_lettered"), 1);
    // The poison body's URN is unknown: empty label.
    assert_eq!(d("", "dead_lettered"), 1);
    assert_eq!(
        rec.series(DELIVERIES_TOTAL, q).len(),
        5,
        "no other series: {:?}",
        rec.series(DELIVERIES_TOTAL, q)
    );
    assert_eq!(
        rec.counter(RETRIES_TOTAL, &[("queue", q), ("urn", CHARGE)]),
        2
    );
    assert_eq!(
        rec.counter(DEAD_LETTERS_TOTAL, &[("queue", q), ("reason", "failed")]),
        1
    );
    assert_eq!(
        rec.counter(DEAD_LETTERS_TOTAL, &[("queue", q), ("reason", "poison")]),
        1
    );
    // Six handler runs (ok, its duplicate, flaky ×2, bad ×2); the duplicate's run is the
    // guard's `seen` only, the others sleep 10 ms on the paused clock.
    let mut runs = rec.samples(HANDLER_DURATION_SECONDS, &[("queue", q), ("urn", CHARGE)]);
    runs.sort_by(f64::total_cmp);
    assert_eq!(runs.len(), 6, "{runs:?}");
    assert!(runs[0] < 0.010, "{runs:?}");
    assert!(
        runs[1..].iter().all(|&s| (0.010..0.011).contains(&s)),
        "{runs:?}"
    );
    // Back to zero, and it was up while handling.
    let (now, peak) = rec.gauge(IN_FLIGHT, &[("queue", q)]).unwrap();
    assert_eq!((now, peak), (0.0, 1.0));
    // Store calls through `Metered`: `seen` per run, `remember` per success.
    let calls = |op: &str| {
        rec.samples(
            STORE_CALL_DURATION_SECONDS,
            &[("store", "obs-memory"), ("op", op)],
        )
        .len()
    };
    assert_eq!((calls("seen"), calls("remember")), (6, 2));
    assert_eq!(
        rec.counter(
            STORE_ERRORS_TOTAL,
            &[("store", "obs-memory"), ("op", "seen")]
        ),
        0
    );
}

#[cfg(feature = "metrics")]
#[tokio::test(start_paused = true)]
async fn queue_depth_and_in_flight_are_sampled_while_running() {
    use babelqueue_runtime::metrics::{IN_FLIGHT, QUEUE_DEPTH};

    let rec = recorder::installed();
    let q = "obs-depth";
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let r = release.clone();
    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue(q)
        .heartbeat(Duration::from_millis(100), Duration::from_secs(1))
        .route_async(CHARGE, move |_: Envelope| {
            let r = r.clone();
            async move {
                r.acquire().await.unwrap().forget();
            }
        });
    for _ in 0..3 {
        app.publish(CHARGE, &json!({})).await.unwrap();
    }
    let depth = |state: &str| {
        rec.gauge(QUEUE_DEPTH, &[("queue", q), ("state", state)])
            .map(|g| g.0)
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let running =
        tokio::spawn(async move { app.run_until(async move { s.notified().await }).await });
    // One message held by the handler, two waiting.
    let mut sampled = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if (depth("ready"), depth("delayed"), depth("in_flight"))
            == (Some(2.0), Some(0.0), Some(1.0))
        {
            sampled = true;
            break;
        }
    }
    assert!(
        sampled,
        "ready={:?} in_flight={:?}",
        depth("ready"),
        depth("in_flight")
    );
    assert_eq!(
        rec.gauge(IN_FLIGHT, &[("queue", q)]).map(|g| g.0),
        Some(1.0)
    );
    release.add_permits(3);
    let mut drained = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if (depth("ready"), depth("in_flight")) == (Some(0.0), Some(0.0)) {
            drained = true;
            break;
        }
    }
    assert!(
        drained,
        "ready={:?} in_flight={:?}",
        depth("ready"),
        depth("in_flight")
    );
    stop.notify_one();
    let stats = running.await.unwrap();
    assert_eq!(stats.succeeded, 3);
    assert_eq!(
        rec.gauge(IN_FLIGHT, &[("queue", q)]).map(|g| g.0),
        Some(0.0)
    );
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn metered_times_every_store_trait_and_counts_failures() {
    use babelqueue_core::{
        AsyncLeaseStore, AsyncStore, InMemoryStore, LeaseStore, Store, lease::Claim,
    };
    use babelqueue_runtime::metrics::{Metered, STORE_CALL_DURATION_SECONDS, STORE_ERRORS_TOTAL};

    /// A store whose every call fails.
    struct Down;
    impl Store for Down {
        type Error = StoreFailed;
        fn seen(&self, _: &str) -> Result<bool, StoreFailed> {
            Err(StoreFailed(Db(Root)))
        }
        fn remember(&self, _: &str) -> Result<(), StoreFailed> {
            Err(StoreFailed(Db(Root)))
        }
        fn forget(&self, _: &str) -> Result<(), StoreFailed> {
            Err(StoreFailed(Db(Root)))
        }
    }

    let rec = recorder::installed();
    let calls = |store: &str, op: &str| {
        rec.samples(STORE_CALL_DURATION_SECONDS, &[("store", store), ("op", op)])
            .len()
    };
    let errors =
        |store: &str, op: &str| rec.counter(STORE_ERRORS_TOTAL, &[("store", store), ("op", op)]);

    let down = Metered::new(Down, "obs-down");
    assert!(Store::seen(&down, "a").is_err());
    assert!(Store::remember_for(&down, "a", None).is_err());
    assert_eq!(
        (calls("obs-down", "seen"), errors("obs-down", "seen")),
        (1, 1)
    );
    assert_eq!(
        (
            calls("obs-down", "remember"),
            errors("obs-down", "remember")
        ),
        (1, 1)
    );

    // The wrapper behaves like the store it wraps, sync and async, seen-set and lease.
    let mem = Metered::new(InMemoryStore::new(), "obs-lease");
    let Claim::Acquired(token) = LeaseStore::claim(&mem, "id-1", Duration::from_secs(5)).unwrap()
    else {
        panic!("a fresh id is acquired")
    };
    assert!(
        AsyncStore::seen(&mem, "id-1").await.unwrap(),
        "held counts as seen"
    );
    assert!(
        AsyncLeaseStore::complete(&mem, "id-1", &token, None)
            .await
            .unwrap()
    );
    assert!(matches!(
        AsyncLeaseStore::claim(&mem, "id-1", Duration::from_secs(5))
            .await
            .unwrap(),
        Claim::Completed
    ));
    AsyncStore::forget(&mem, "id-1").await.unwrap();
    assert!(!Store::seen(&mem, "id-1").unwrap());
    for (op, n) in [("claim", 2), ("seen", 2), ("complete", 1), ("forget", 1)] {
        assert_eq!(calls("obs-lease", op), n, "op {op}");
        assert_eq!(errors("obs-lease", op), 0, "op {op}");
    }
}
