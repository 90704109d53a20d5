//! The Redis transport (SPEC section 5) and the consume runtime (section 4) over a real
//! Redis. Ignored without one; CI runs them with `--include-ignored`. Every test uses its
//! own queue names.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::redis::{
    RedisStore, RedisTransport, consumer_processing_list, keys::queue_keys, processing_list,
};
use babelqueue::runtime::{App, Republish, Transport, recover_poison};
use babelqueue::{Envelope, Guard, envelope::now_millis};
use serde_json::{Value, json};

const CHARGE: &str = "urn:babel:payments:charge";

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A unique queue name, and a guard deleting its lists at the end.
struct Queue {
    name: String,
}

impl Queue {
    fn new(tag: &str) -> Self {
        Queue {
            name: format!("bq-test:{tag}:{}", uuid::Uuid::new_v4().simple()),
        }
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(redis_url())
            && let Ok(mut c) = client.get_connection()
        {
            let mut keys = queue_keys(&self.name);
            keys.push(format!("{}.dlq", self.name));
            let tagged: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{{{}}}:*", self.name))
                .query(&mut c)
                .unwrap_or_default();
            keys.extend(tagged);
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

fn conformance_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("BABELQUEUE_CONFORMANCE_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("../shared/conformance"),
    }
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("card declined")]
    Declined,
    #[error(transparent)]
    Store(#[from] babelqueue::redis::RedisStoreError),
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn payload_identity_of_the_conformance_fixture() {
    let dir = conformance_dir();
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(dir.join("manifest.json"))
            .unwrap_or_else(|e| panic!("conformance suite not found at {} ({e})", dir.display())),
    )
    .unwrap();
    let file = manifest["redis"]["payload_identity"]["envelope_file"]
        .as_str()
        .unwrap();
    let bytes = std::fs::read(dir.join(file)).unwrap();
    let q = Queue::new("identity");
    let t = transport().await;
    t.publish_raw(&q.name, bytes.clone()).await.unwrap();
    // The list element is the file, byte for byte (no wrapping, no added fields).
    assert_eq!(lrange(&q.name).await, vec![bytes.clone()]);
    let d = t
        .reserve(&q.name, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.element(), &bytes[..]);
    assert_eq!(d.body(), &bytes[..]);
    assert!(d.headers().is_none());
    assert_eq!(
        lrange(&consumer_processing_list(&q.name, t.id())).await,
        vec![bytes.clone()]
    );
    t.ack(&d).await.unwrap();
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
    assert_eq!(t.len(&q.name).await.unwrap(), 0);
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn produce_then_consume_and_the_processing_list_is_empty() {
    let q = Queue::new("produce");
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let app = App::new(transport().await)
        .queue(&q.name)
        .concurrency(4)
        .route_sync(CHARGE, move |env: &Envelope| {
            g.lock().unwrap().push(env.data["n"].as_u64().unwrap());
        });
    let mut sent = Vec::new();
    for n in 0..50u64 {
        let env = app.publish(CHARGE, &json!({"n": n})).await.unwrap();
        sent.push(env);
    }
    // What RPUSH stored is each envelope's canonical encoding.
    let stored = lrange(&q.name).await;
    assert_eq!(
        stored,
        sent.iter().map(Envelope::encode).collect::<Vec<_>>()
    );
    let stats = app.drain().await.unwrap();
    assert_eq!(
        (stats.processed, stats.succeeded, stats.acked),
        (50, 50, 50)
    );
    let mut got = got.lock().unwrap().clone();
    got.sort_unstable();
    assert_eq!(got, (0..50).collect::<Vec<_>>());
    let t = transport().await;
    assert_eq!(t.len(&q.name).await.unwrap(), 0);
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_duplicate_is_skipped_and_acked_with_the_redis_store() {
    let q = Queue::new("dup");
    let prefix = format!("bq-test:idemp:{}:", uuid::Uuid::new_v4().simple());
    let store = Arc::new(
        RedisStore::builder(redis_url())
            .prefix(&prefix)
            .connect()
            .await
            .unwrap(),
    );
    let charges = Arc::new(AtomicUsize::new(0));
    let (st, ch) = (store.clone(), charges.clone());
    let app =
        App::new(transport().await)
            .queue(&q.name)
            .route_async(CHARGE, move |env: Envelope| {
                let (st, ch) = (st.clone(), ch.clone());
                async move {
                    Guard::new(&*st)
                        .run_async(&env, async {
                            ch.fetch_add(1, Ordering::SeqCst);
                            Ok::<(), ChargeError>(())
                        })
                        .await
                        .map(drop)
                }
            });
    let env = Envelope::new(CHARGE, json!({"payment_id": "pay_7f3a", "amount": 4200}))
        .unwrap()
        .with_queue(&q.name);
    app.publish_raw(env.encode()).await.unwrap();
    app.publish_raw(env.encode()).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    assert_eq!((stats.succeeded, stats.skipped, stats.acked), (1, 1, 2));
    let t = transport().await;
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
    assert_eq!(t.len(&q.name).await.unwrap(), 0);
    let key: Option<String> = raw()
        .await
        .get(format!("{prefix}{}", env.meta.id))
        .await
        .unwrap();
    assert_eq!(key.as_deref(), Some("1"));
    let _: () = raw()
        .await
        .del(format!("{prefix}{}", env.meta.id))
        .await
        .unwrap();
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_failure_is_retried_then_dead_lettered_with_a_correct_block() {
    let q = Queue::new("fail");
    let attempts_seen = Arc::new(Mutex::new(Vec::new()));
    let a = attempts_seen.clone();
    let app =
        App::new(transport().await)
            .queue(&q.name)
            .route_async(CHARGE, move |env: Envelope| {
                a.lock().unwrap().push(env.attempts);
                async { Err::<(), _>(ChargeError::Declined) }
            });
    let original = json!({
        "job": CHARGE, "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
        "data": {"payment_id": "pay_9", "amount": 1, "note": "naïve ☕"},
        "meta": {"id": "8d1c1f1e-6a55-4b0e-9d7e-1f2a3b4c5d6e", "queue": "billing", "lang": "python",
                 "schema_version": 1, "created_at": 1749132727000_i64},
        "attempts": 0, "x_extra": {"kept": true}
    });
    let before = now_millis();
    app.publish_raw(serde_json::to_vec(&original).unwrap())
        .await
        .unwrap();
    let stats = app.drain().await.unwrap();
    let after = now_millis();
    assert_eq!(*attempts_seen.lock().unwrap(), vec![0, 1, 2]);
    assert_eq!((stats.retried, stats.dead_lettered, stats.acked), (2, 1, 3));
    let dlq = lrange(&format!("{}.dlq", q.name)).await;
    assert_eq!(dlq.len(), 1);
    let mut dead: Value = serde_json::from_slice(&dlq[0]).unwrap();
    let block = dead.as_object_mut().unwrap().remove("dead_letter").unwrap();
    assert_eq!(block["reason"], "failed");
    assert_eq!(block["error"], "card declined");
    assert!(
        block["exception"]
            .as_str()
            .unwrap()
            .ends_with("ChargeError")
    );
    assert!((before..=after).contains(&block["failed_at"].as_i64().unwrap()));
    assert_eq!(block["original_queue"], "billing");
    assert_eq!(block["attempts"], 3);
    assert_eq!(block["lang"], "rust");
    let mut expected = original;
    expected["attempts"] = json!(3);
    assert_eq!(dead, expected);
    let t = transport().await;
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
    assert_eq!(t.len(&q.name).await.unwrap(), 0);
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn poison_bodies_are_dead_lettered_while_the_loop_goes_on() {
    let q = Queue::new("poison");
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let app = App::new(transport().await)
        .queue(&q.name)
        .route_sync(CHARGE, move |_: &Envelope| {
            h.fetch_add(1, Ordering::SeqCst);
        });
    let mut garbage = vec![0u8; 1 << 20];
    let mut x: u32 = 0x9e37_79b9;
    for b in &mut garbage {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    let unknown_version = br#"{"job":"urn:babel:payments:charge","trace_id":"t","data":{},"meta":{"id":"m","queue":"q","lang":"go","schema_version":99,"created_at":0},"attempts":0}"#.to_vec();
    let poison = [
        b"definitely { not json".to_vec(),
        b"[\"an\",\"array\"]".to_vec(),
        unknown_version.clone(),
        garbage.clone(),
    ];
    for (i, p) in poison.iter().enumerate() {
        app.publish(CHARGE, &json!({"before": i})).await.unwrap();
        app.publish_raw(p.clone()).await.unwrap();
    }
    app.publish(CHARGE, &json!({"last": true})).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!(handled.load(Ordering::SeqCst), 5);
    assert_eq!((stats.poison, stats.succeeded, stats.acked), (4, 5, 9));
    let dlq = lrange(&format!("{}.dlq", q.name)).await;
    assert_eq!(dlq.len(), 4);
    for (original, dead) in poison.iter().zip(&dlq) {
        let v: Value = serde_json::from_slice(dead).unwrap();
        assert_eq!(v["dead_letter"]["reason"], "poison");
        match recover_poison(dead) {
            Some(bytes) => assert_eq!(&bytes, original, "wrapper keeps the bytes"),
            None => {
                let mut obj = v.clone();
                obj.as_object_mut().unwrap().remove("dead_letter");
                assert_eq!(serde_json::to_vec(&obj).unwrap(), unknown_version);
            }
        }
    }
    let t = transport().await;
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
    assert_eq!(t.len(&q.name).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn shutdown_mid_burst_loses_nothing() {
    let q = Queue::new("burst");
    let handled = Arc::new(Mutex::new(Vec::<String>::new()));
    let h = handled.clone();
    let t = transport().await;
    let app = App::new(t.clone())
        .queue(&q.name)
        .concurrency(4)
        .poll_timeout(Duration::from_millis(100))
        .route_async(CHARGE, move |env: Envelope| {
            let h = h.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                h.lock().unwrap().push(env.meta.id.clone());
                Ok::<(), ChargeError>(())
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
    tokio::time::sleep(Duration::from_millis(150)).await;
    tx.send(()).unwrap();
    let stats = worker.await.unwrap();

    let handled = handled.lock().unwrap().clone();
    assert!(
        !handled.is_empty() && handled.len() < 1000,
        "stopped mid-burst: {}",
        handled.len()
    );
    assert_eq!(stats.acked as usize, handled.len());
    let ids_in = |elements: Vec<Vec<u8>>| -> Vec<String> {
        elements
            .iter()
            .map(|b| Envelope::decode(b).unwrap().meta.id)
            .collect()
    };
    let queued = ids_in(lrange(&q.name).await);
    let processing = ids_in(lrange(&consumer_processing_list(&q.name, t.id())).await);
    assert!(
        processing.is_empty(),
        "in-flight messages were finished and acked"
    );
    let mut all: Vec<String> = handled.iter().chain(&queued).cloned().collect();
    all.sort();
    ids.sort();
    assert_eq!(all, ids, "every message handled once or still queued");
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn header_frames_are_written_only_with_headers_and_read_back() {
    let q = Queue::new("frames");
    let t = transport().await;
    let env = Envelope::new(CHARGE, json!({"n": 1}))
        .unwrap()
        .with_queue(&q.name);
    let body = env.encode();
    let mut headers = babelqueue::runtime::Headers::new();
    headers.insert(
        "traceparent".into(),
        json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    );
    t.publish_with_headers(&q.name, &body, None).await.unwrap();
    t.publish_with_headers(&q.name, &body, Some(&headers))
        .await
        .unwrap();
    let stored = lrange(&q.name).await;
    assert_eq!(stored[0], body, "no headers: the bare envelope");
    let frame: Value = serde_json::from_slice(&stored[1]).unwrap();
    assert_eq!(frame["__bq_frame"], 1);
    assert_eq!(frame["headers"], Value::Object(headers.clone()));
    assert_eq!(frame["body"].as_str().unwrap().as_bytes(), &body[..]);

    let bare = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    let framed = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(bare.body(), &body[..]);
    assert_eq!(framed.body(), &body[..]);
    assert_eq!(framed.headers(), Some(&headers));
    // Ack removes the exact element (the frame), not its body.
    t.ack(&framed).await.unwrap();
    assert_eq!(
        lrange(&consumer_processing_list(&q.name, t.id())).await,
        vec![body.clone()]
    );
    t.ack(&bare).await.unwrap();
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn requeue_processing_recovers_a_crashed_workers_messages() {
    let q = Queue::new("requeue");
    let t = transport().await;
    for n in 0..3 {
        t.publish_raw(&q.name, format!("m{n}").into_bytes())
            .await
            .unwrap();
    }
    // A worker of another SDK (shared `<queue>:processing`) reserves two and dies.
    let mut c = raw().await;
    for _ in 0..2 {
        let _: Vec<u8> = redis::cmd("LMOVE")
            .arg(&q.name)
            .arg(processing_list(&q.name))
            .arg("LEFT")
            .arg("RIGHT")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    assert_eq!(lrange(&processing_list(&q.name)).await.len(), 2);
    assert_eq!(t.requeue_processing(&q.name).await.unwrap(), 2);
    assert_eq!(
        lrange(&q.name).await,
        vec![b"m0".to_vec(), b"m1".to_vec(), b"m2".to_vec()],
        "back at the head, in their original order"
    );
    assert!(lrange(&processing_list(&q.name)).await.is_empty());
}

/// A Redis ACL user of its own, so the test can kill exactly the transport's connections
/// (`CLIENT KILL USER`) on a server other tests share, and a password in the URL is used.
struct AclUser {
    name: String,
    password: String,
}

impl AclUser {
    async fn create() -> Self {
        let user = AclUser {
            name: format!("bq_test_{}", uuid::Uuid::new_v4().simple()),
            password: uuid::Uuid::new_v4().simple().to_string(),
        };
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&user.name)
            .arg("on")
            .arg(format!(">{}", user.password))
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .query_async(&mut raw().await)
            .await
            .unwrap();
        user
    }

    fn url(&self) -> String {
        let base = redis_url();
        let rest = base.strip_prefix("redis://").unwrap_or(&base);
        let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        format!("redis://{}:{}@{rest}", self.name, self.password)
    }

    async fn kill_connections(&self) -> i64 {
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("USER")
            .arg(&self.name)
            .query_async(&mut raw().await)
            .await
            .unwrap()
    }
}

impl Drop for AclUser {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(redis_url())
            && let Ok(mut c) = client.get_connection()
        {
            let _: Result<(), _> = redis::cmd("ACL")
                .arg("DELUSER")
                .arg(&self.name)
                .query(&mut c);
        }
    }
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_password_url_works_and_a_wrong_password_is_an_error() {
    let user = AclUser::create().await;
    let q = Queue::new("auth");
    let t = RedisTransport::connect(&user.url()).await.unwrap();
    t.publish_raw(&q.name, b"x".to_vec()).await.unwrap();
    assert_eq!(t.len(&q.name).await.unwrap(), 1);
    let wrong = user.url().replace(&user.password, "wrong-password");
    let err = RedisTransport::connect(&wrong).await.unwrap_err();
    assert!(!err.to_string().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn the_consumer_reconnects_after_its_connections_are_killed() {
    let user = AclUser::create().await;
    let q = Queue::new("reconnect");
    let handled = Arc::new(Mutex::new(Vec::<u64>::new()));
    let h = handled.clone();
    let app = App::new(RedisTransport::connect(&user.url()).await.unwrap())
        .queue(&q.name)
        .poll_timeout(Duration::from_millis(300))
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .route_sync(CHARGE, move |env: &Envelope| {
            h.lock().unwrap().push(env.data["n"].as_u64().unwrap());
        });
    let producer = App::new(transport().await).queue(&q.name);
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
    let wait_for = |n: usize| {
        let handled = handled.clone();
        async move {
            for _ in 0..200 {
                if handled.lock().unwrap().len() >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!(
                "only {} of {n} messages handled",
                handled.lock().unwrap().len()
            );
        }
    };
    producer.publish(CHARGE, &json!({"n": 0})).await.unwrap();
    wait_for(1).await;
    for round in 1..=3u64 {
        // The consumer is blocked in BLMOVE (or about to be): kill its connections.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let killed = user.kill_connections().await;
        assert!(killed >= 1, "the consumer had connections to kill");
        producer
            .publish(CHARGE, &json!({"n": round}))
            .await
            .unwrap();
        wait_for(round as usize + 1).await;
    }
    tx.send(()).unwrap();
    let stats = worker.await.unwrap();
    assert_eq!(*handled.lock().unwrap(), vec![0, 1, 2, 3]);
    assert!(stats.transport_errors >= 1, "{stats:?}");
    assert_eq!(stats.acked, 4);
    let t = transport().await;
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
    assert_eq!(t.len(&q.name).await.unwrap(), 0);
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn an_unreachable_server_is_an_error_not_a_hang() {
    let t = RedisTransport::open("redis://127.0.0.1:1/0")
        .unwrap()
        .timeouts(Duration::from_millis(500), Duration::from_millis(500));
    let err = t.publish_raw("q", b"x".to_vec()).await.unwrap_err();
    assert!(err.is_connection(), "{err:?}");
    // A drain over it gives up after the configured window instead of spinning forever.
    let app = App::new(t)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .give_up_after(Duration::from_millis(300));
    let err = app.drain().await.unwrap_err();
    assert!(err.error.is_connection());
    assert!(err.stats.transport_errors >= 2);
    // And the real server is reachable (so this test fails, not passes, without one).
    transport().await.ping().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn concurrent_blocking_reserves_share_one_connection_without_errors() {
    let q = Queue::new("blocking");
    let t = transport().await;
    let reserve_all = |timeout: Duration| {
        let t = t.clone();
        let name = q.name.clone();
        async move {
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..3 {
                let (t, name) = (t.clone(), name.clone());
                set.spawn(async move { t.reserve(&name, timeout).await });
            }
            set.join_all().await
        }
    };
    // Empty queue: each waits its turn within its own timeout, and none fails.
    let started = std::time::Instant::now();
    let results = reserve_all(Duration::from_millis(300)).await;
    assert!(results.iter().all(|r| matches!(r, Ok(None))), "{results:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    // Two messages for three waiters: two get one each, the third times out.
    let producer = {
        let (t, name) = (t.clone(), q.name.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            t.publish_raw(&name, b"a".to_vec()).await.unwrap();
            t.publish_raw(&name, b"b".to_vec()).await.unwrap();
        })
    };
    let results = reserve_all(Duration::from_secs(2)).await;
    producer.await.unwrap();
    let mut got: Vec<Vec<u8>> = results
        .into_iter()
        .filter_map(|r| r.unwrap().map(|d| d.element().to_vec()))
        .collect();
    got.sort();
    assert_eq!(got, vec![b"a".to_vec(), b"b".to_vec()]);
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn depth_counts_ready_delayed_and_in_flight() {
    let q = Queue::new("depth");
    let t = transport().await;
    for body in [&b"a"[..], b"b", b"c"] {
        t.publish_raw(&q.name, body.to_vec()).await.unwrap();
    }
    let first = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    let second = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    t.requeue(&second, Republish::unchanged(), Duration::from_secs(60))
        .await
        .unwrap();
    let depth = t.depth(&q.name).await.unwrap();
    assert_eq!(
        (depth.ready, depth.delayed, depth.in_flight),
        (1, 1, 1),
        "{depth:?}"
    );
    t.ack(&first).await.unwrap();
    let depth = t.depth(&q.name).await.unwrap();
    assert_eq!((depth.ready, depth.delayed, depth.in_flight), (1, 1, 0));
    // Clean up what is left: the ready message and the delayed one.
    let mut c = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(&q.name)
        .arg(format!("{{{}}}:delayed", q.name))
        .query_async(&mut c)
        .await
        .unwrap();
    t.leave(&q.name).await.unwrap();
}
