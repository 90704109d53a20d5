//! The transactional outbox relaying onto a real Redis (`BABELQUEUE_REDIS_URL`, default
//! `redis://127.0.0.1:6379/0`) that goes away and comes back: the relay talks to Redis
//! through a TCP proxy this test cuts and restores (the real server is never touched).
//! The outbox is a SQLite file in a temporary directory. Ignored without Redis; CI runs it
//! with `--include-ignored`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babelqueue::Envelope;
use babelqueue::outbox::OutboxRelay;
use babelqueue::redis::keys::queue_keys;
use babelqueue::redis::{RedisTransport, redis};
use babelqueue::runtime::Transport;
use babelqueue::sqlite::SqliteOutbox;

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A TCP proxy on an ephemeral loopback port that can be cut (every connection dropped,
/// new ones closed at once) and restored.
struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: String) -> Proxy {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (u, c) = (up.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if !u.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let target = target.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                c.lock().unwrap().push(task);
            }
        });
        Proxy {
            port,
            up,
            conns,
            accept,
        }
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

/// Deletes the queue's keys at the end.
struct Queue(String);

impl Drop for Queue {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(redis_url())
            && let Ok(mut c) = client.get_connection()
        {
            let mut keys = queue_keys(&self.0);
            let tagged: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{{{}}}:*", self.0))
                .query(&mut c)
                .unwrap_or_default();
            keys.extend(tagged);
            let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut c);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_redis_outage_loses_nothing_and_the_relay_resumes() {
    let url = redis_url();
    let info: redis::ConnectionInfo =
        redis::IntoConnectionInfo::into_connection_info(url.as_str()).expect("a Redis URL");
    let target = match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        other => panic!("this test proxies TCP only, not {other:?}"),
    };
    let proxy = Proxy::start(target.clone()).await;
    let via_proxy = url.replacen(&target, &format!("127.0.0.1:{}", proxy.port), 1);
    assert_ne!(via_proxy, url, "the relay must go through the proxy");
    let queue = Queue(format!("bq-test:outbox:{}", uuid::Uuid::new_v4().simple()));

    let dir = std::env::temp_dir().join(format!("bq-outbox-redis-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let outbox = SqliteOutbox::open(dir.join("shop.db")).unwrap();

    // Redis goes away before the rows are written.
    proxy.cut();
    let envs: Vec<Envelope> = (0..20)
        .map(|i| {
            Envelope::new(
                "urn:babel:orders:created",
                serde_json::json!({"order_id": i}),
            )
            .unwrap()
            .with_queue(queue.0.clone())
        })
        .collect();
    let mut conn = babelqueue::sqlite::rusqlite::Connection::open(dir.join("shop.db")).unwrap();
    let tx = conn.transaction().unwrap();
    for env in &envs {
        outbox.save(&tx, env).unwrap();
    }
    tx.commit().unwrap();

    let relay_transport = RedisTransport::open(&via_proxy).unwrap();
    let relay = OutboxRelay::new(outbox.clone(), Arc::new(relay_transport))
        .poll_interval(Duration::from_millis(20))
        .backoff(Duration::from_millis(50), Duration::from_millis(300));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
        }
    });

    // Failures are recorded against the rows while Redis is unreachable.
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let attempts: i64 = conn
                .query_row(
                    "SELECT coalesce(sum(attempts), 0) FROM babelqueue_outbox",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            if attempts >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("failed publishes recorded");
    assert_eq!(outbox.pending().unwrap(), 20);
    let direct = RedisTransport::connect(&url).await.expect("Redis");
    assert!(
        direct
            .reserve(&queue.0, Duration::ZERO)
            .await
            .unwrap()
            .is_none(),
        "nothing reached Redis while it was cut off"
    );

    proxy.restore();
    tokio::time::timeout(Duration::from_secs(20), async {
        while outbox.pending().unwrap() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the relay resumed after the outage");
    stop.send(()).unwrap();
    let stats = running.await.unwrap();
    assert_eq!(stats.published, 20);

    // Every row reached Redis exactly once, byte for byte.
    let mut got = HashSet::new();
    while let Some(d) = direct.reserve(&queue.0, Duration::ZERO).await.unwrap() {
        assert!(
            got.insert(d.element().to_vec()),
            "a row was published twice"
        );
        direct.ack(&d).await.unwrap();
    }
    let want: HashSet<Vec<u8>> = envs.iter().map(Envelope::encode).collect();
    assert_eq!(got, want);
    drop(outbox);
    let _ = std::fs::remove_dir_all(&dir);
}
