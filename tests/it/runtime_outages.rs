//! The dedupe store fails on real servers while payments are consumed: a Redis store
//! stopped and restarted (its own `redis-server`, append-only, on port 17001), the
//! PostgreSQL store cut off behind a TCP proxy and restored, and a PostgreSQL table lock.
//! Every payment is charged exactly once, none is dead-lettered, no attempt is counted.
//!
//! The transport is the in-memory one: these tests are about the store. They are slow
//! (seconds of outage) and need servers, so they are ignored by default; CI runs them with
//! `--include-ignored`.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use babelqueue::postgres::PostgresStore;
use babelqueue::postgres::tokio_postgres::{self, NoTls};
use babelqueue::redis::RedisStore;
use babelqueue::runtime::{App, Disposition, InMemoryTransport, Report, Stats};
use babelqueue::{AsyncStore, BoxError, Envelope, Guard, store::IntoHandlerError};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";
const REDIS_PORT: u16 = 17001;
const PROXY_PORT: u16 = 17011;

fn pg_url() -> String {
    std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Effects per payment id, and every report.
#[derive(Default, Clone)]
struct Seen {
    effects: Arc<Mutex<HashMap<String, u32>>>,
    reports: Arc<Mutex<Vec<Report>>>,
}

impl Seen {
    fn charged(&self) -> usize {
        self.effects.lock().unwrap().len()
    }

    fn check(&self, n: usize, stats: &Stats) {
        let effects = self.effects.lock().unwrap();
        let doubles = effects.values().filter(|&&c| c != 1).count();
        assert_eq!(
            (effects.len(), doubles),
            (n, 0),
            "every payment charged exactly once"
        );
        assert_eq!(
            (
                stats.succeeded,
                stats.dead_lettered,
                stats.failed,
                stats.retried
            ),
            (n as u64, 0, 0, 0),
            "{stats:?}"
        );
        let reports = self.reports.lock().unwrap();
        // Seen as a put-back (a `seen` that failed), or as a delivery whose
        // owed `remember` waited for the store to come back (the workers holding one keep
        // their message unacked and retry it, so with every worker in that state nothing
        // new is reserved and nothing is put back).
        let waited = reports
            .iter()
            .any(|r| r.duration.is_some_and(|d| d >= Duration::from_secs(1)));
        assert!(
            stats.requeued >= 1 || waited,
            "the outage was seen: {stats:?}"
        );
        assert!(
            reports
                .iter()
                .filter(|r| r.disposition == Disposition::Succeeded)
                .all(|r| r.envelope.as_ref().unwrap().attempts == 0),
            "no attempt counted for the outage"
        );
    }
}

fn charge_app<S>(t: &InMemoryTransport, store: Arc<S>, seen: &Seen, gateway: Duration) -> App
where
    S: AsyncStore + Send + Sync + 'static,
    S::Error: IntoHandlerError<BoxError>,
{
    let (effects, reports) = (seen.effects.clone(), seen.reports.clone());
    App::new(t.clone())
        .queue("payments")
        .concurrency(4)
        .store_timeout(Duration::from_secs(2))
        .store_backoff(Duration::from_millis(100), Duration::from_secs(2))
        .on_delivery(move |r| reports.lock().unwrap().push(r.clone()))
        .route_async(CHARGE, move |env: Envelope| {
            let (store, effects) = (store.clone(), effects.clone());
            async move {
                Guard::new(&*store)
                    .run_async(&env, async {
                        tokio::time::sleep(gateway).await;
                        let id = env.data["payment_id"].as_str().unwrap().to_owned();
                        *effects.lock().unwrap().entry(id).or_insert(0) += 1;
                        Ok::<(), BoxError>(())
                    })
                    .await
                    .map(drop)
            }
        })
}

async fn publish_payments(app: &App, n: usize) {
    for i in 0..n {
        let env = Envelope::new(
            CHARGE,
            json!({"payment_id": format!("pay_{i:08}"), "amount": 4200}),
        )
        .unwrap()
        .with_queue("payments");
        app.publish_envelope(&env).await.unwrap();
    }
}

async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A `redis-server` of this test: append-only persistence in its own directory, killed
/// (by pid) when dropped.
struct RedisServer {
    child: Option<Child>,
    dir: std::path::PathBuf,
}

impl RedisServer {
    fn start(dir: &std::path::Path) -> RedisServer {
        RedisServer {
            child: Some(Self::spawn(dir)),
            dir: dir.to_owned(),
        }
    }

    /// Spawns `redis-server` on `dir` and waits until it accepts connections.
    fn spawn(dir: &std::path::Path) -> Child {
        std::fs::create_dir_all(dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &REDIS_PORT.to_string(), "--bind", "127.0.0.1"])
            .args(["--dir", dir.to_str().unwrap()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", REDIS_PORT)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    /// Starts the server again on the same directory (its append-only file). The same
    /// value is kept: dropping a `RedisServer` removes the directory, which must not
    /// happen under the restarted server.
    fn restart(&mut self) {
        self.child = Some(Self::spawn(&self.dir));
    }

    /// SIGTERM: a clean shutdown that keeps the append-only file.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server on PATH and ~20 s (a store outage); CI runs it with --include-ignored"]
async fn a_redis_store_down_for_12_s_mid_run_loses_and_double_charges_nothing() {
    let dir = std::env::temp_dir().join(format!("bq-runtime-outage-{}", uuid::Uuid::new_v4()));
    let mut server = RedisServer::start(&dir);
    let url = format!("redis://127.0.0.1:{REDIS_PORT}/0");
    let store = RedisStore::builder(&url)
        .prefix(format!("bq-test:{}:", uuid::Uuid::new_v4().simple()))
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let t = InMemoryTransport::new();
    let seen = Seen::default();
    let app = charge_app(&t, Arc::new(store), &seen, Duration::from_millis(20));
    publish_payments(&app, 1000).await;
    let drain = tokio::spawn({
        let app = app.clone();
        async move { app.drain().await.unwrap() }
    });
    wait_until("300 charges", Duration::from_secs(60), || {
        seen.charged() >= 300
    })
    .await;
    server.stop();
    let stopped_at = seen.charged();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let during = seen.charged() - stopped_at;
    server.restart();
    let stats = tokio::time::timeout(Duration::from_secs(120), drain)
        .await
        .expect("the drain ends once the store is back")
        .unwrap();
    eprintln!(
        "redis store outage: {stopped_at} charged before, {during} during (in flight when it stopped), stats {stats:?}"
    );
    assert!(
        during <= 4,
        "no charge while the store is down except those in flight"
    );
    seen.check(1000, &stats);
    assert_eq!(
        (
            t.len("payments"),
            t.processing_len("payments"),
            t.len("payments.dlq")
        ),
        (0, 0, 0)
    );
    drop(server);
}

/// A TCP proxy in front of PostgreSQL that can be cut (every connection dropped, new
/// ones refused) and restored, so the real server is never touched.
struct Proxy {
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: &'static str) -> Proxy {
        Proxy::start_on(target, PROXY_PORT).await
    }

    async fn start_on(target: &'static str, port: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
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
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                c.lock().unwrap().push(task);
            }
        });
        Proxy { up, conns, accept }
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

async fn pg_admin() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&pg_url(), NoTls)
        .await
        .expect("PostgreSQL at BABELQUEUE_POSTGRES_URL");
    tokio::spawn(conn);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL) and ~20 s; CI runs it with --include-ignored"]
async fn a_postgres_store_cut_off_and_back_loses_and_double_charges_nothing() {
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let table = format!("bq_outage_{}", uuid::Uuid::new_v4().simple());
    let via_proxy = pg_url().replace("127.0.0.1:5432", &format!("127.0.0.1:{PROXY_PORT}"));
    assert_ne!(via_proxy, pg_url(), "the store must go through the proxy");
    let store = PostgresStore::builder(&via_proxy)
        .table(&table)
        .timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let t = InMemoryTransport::new();
    let seen = Seen::default();
    let app = charge_app(&t, Arc::new(store), &seen, Duration::from_millis(20));
    publish_payments(&app, 1000).await;
    let drain = tokio::spawn({
        let app = app.clone();
        async move { app.drain().await.unwrap() }
    });
    wait_until("300 charges", Duration::from_secs(60), || {
        seen.charged() >= 300
    })
    .await;
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(12)).await;
    proxy.restore();
    let stats = tokio::time::timeout(Duration::from_secs(120), drain)
        .await
        .expect("the drain ends once the store is back")
        .unwrap();
    eprintln!("postgres store outage: stats {stats:?}");
    seen.check(1000, &stats);
    assert_eq!(
        (
            t.len("payments"),
            t.processing_len("payments"),
            t.len("payments.dlq")
        ),
        (0, 0, 0)
    );
    pg_admin()
        .await
        .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_store_call_blocked_by_a_table_lock_is_answered_within_the_store_timeout() {
    let table = format!("bq_locked_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::builder(pg_url())
        .table(&table)
        .connect()
        .await
        .unwrap();
    store.migrate().await.unwrap();
    // Another session holds the table.
    let locker = pg_admin().await;
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .unwrap();

    let t = InMemoryTransport::new();
    let seen = Seen::default();
    let app = charge_app(&t, Arc::new(store), &seen, Duration::ZERO);
    publish_payments(&app, 1).await;
    let started = Instant::now();
    let drain = tokio::spawn({
        let app = app.clone();
        async move { app.drain().await.unwrap() }
    });
    wait_until("the first answer", Duration::from_secs(10), || {
        !seen.reports.lock().unwrap().is_empty()
    })
    .await;
    let answered = started.elapsed();
    {
        let reports = seen.reports.lock().unwrap();
        assert_eq!(reports[0].disposition, Disposition::Requeued);
        assert!(
            reports[0]
                .error
                .as_deref()
                .unwrap()
                .contains("did not answer within 2s")
        );
    }
    // The configured store timeout is 2 s: answered then (generous margin for a busy CI).
    assert!(
        answered >= Duration::from_secs(2) && answered < Duration::from_secs(4),
        "{answered:?}"
    );
    assert_eq!(seen.charged(), 0);

    locker.batch_execute("COMMIT").await.unwrap();
    let stats = tokio::time::timeout(Duration::from_secs(60), drain)
        .await
        .expect("the drain ends once the lock is gone")
        .unwrap();
    seen.check(1, &stats);
    pg_admin()
        .await
        .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
        .await
        .unwrap();
}

/// `n` payments, each published twice (shuffled), at `concurrency`, with the shared Redis
/// seen-set store (unique prefix): exactly one effect per payment.
async fn no_double_effect_with_redis(concurrency: usize) {
    let url =
        std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let store = RedisStore::builder(&url)
        .prefix(format!(
            "bq-test:dup{concurrency}:{}:",
            uuid::Uuid::new_v4().simple()
        ))
        .ttl(Duration::from_secs(600))
        .connect()
        .await
        .expect("Redis at BABELQUEUE_REDIS_URL");
    let t = InMemoryTransport::new();
    let seen = Seen::default();
    let app =
        charge_app(&t, Arc::new(store), &seen, Duration::from_micros(300)).concurrency(concurrency);
    let n = 2000;
    let mut elements = Vec::new();
    for i in 0..n {
        let bytes = Envelope::new(
            CHARGE,
            json!({"payment_id": format!("pay_{i:08}"), "amount": 4200}),
        )
        .unwrap()
        .with_queue("payments")
        .encode();
        elements.push(bytes.clone());
        elements.push(bytes);
    }
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in (1..elements.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        elements.swap(i, (x % (i as u64 + 1)) as usize);
    }
    for e in elements {
        app.publish_raw(e).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    let effects = seen.effects.lock().unwrap();
    let doubles = effects.values().filter(|&&c| c != 1).count();
    assert_eq!((effects.len(), doubles), (n, 0), "one effect per payment");
    assert_eq!((stats.succeeded, stats.skipped), (n as u64, n as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn concurrency_8_with_half_duplicates_and_the_redis_store_charges_once() {
    no_double_effect_with_redis(8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn concurrency_32_with_half_duplicates_and_the_redis_store_charges_once() {
    no_double_effect_with_redis(32).await;
}

/// The PostgreSQL store cut off (behind the proxy, port 17463) right
/// after a handler succeeded and back 300 ms later: the owed `remember` is retried until it
/// lands and the byte-identical duplicate is skipped (an ack after one failed try would
/// let the duplicate be charged again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_remember_owed_to_a_postgres_store_cut_for_300_ms_lands_and_the_duplicate_is_skipped() {
    const PORT: u16 = 17463;
    let proxy = Arc::new(Proxy::start_on("127.0.0.1:5432", PORT).await);
    let table = format!("bq_owed_{}", uuid::Uuid::new_v4().simple());
    let via_proxy = pg_url().replace("127.0.0.1:5432", &format!("127.0.0.1:{PORT}"));
    assert_ne!(via_proxy, pg_url(), "the store must go through the proxy");
    let store = Arc::new(
        PostgresStore::builder(&via_proxy)
            .table(&table)
            .timeout(Duration::from_secs(1))
            .connect()
            .await
            .unwrap(),
    );
    store.migrate().await.unwrap();
    let charges = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = InMemoryTransport::new();
    let app = {
        let (store, charges, proxy) = (store.clone(), charges.clone(), proxy.clone());
        App::new(t.clone())
            .queue("owed-pg")
            .store_timeout(Duration::from_secs(2))
            .store_backoff(Duration::from_millis(100), Duration::from_secs(1))
            .route_async(CHARGE, move |env: Envelope| {
                let (store, charges, proxy) = (store.clone(), charges.clone(), proxy.clone());
                async move {
                    Guard::new(&*store)
                        .run_async(&env, async {
                            if charges.fetch_add(1, Ordering::SeqCst) == 0 {
                                // Cut right after the charge; back 300 ms later.
                                proxy.cut();
                                tokio::spawn(async move {
                                    tokio::time::sleep(Duration::from_millis(300)).await;
                                    proxy.restore();
                                });
                            }
                            Ok::<(), BoxError>(())
                        })
                        .await
                        .map(drop)
                }
            })
    };
    let body = Envelope::new(CHARGE, json!({"amount": 4200}))
        .unwrap()
        .with_queue("owed-pg")
        .encode();
    app.publish_raw(body.clone()).await.unwrap();
    app.publish_raw(body).await.unwrap();
    let stats = tokio::time::timeout(Duration::from_secs(60), app.drain())
        .await
        .expect("the drain ends")
        .unwrap();
    pg_admin()
        .await
        .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
        .await
        .unwrap();
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "the duplicate is not charged again: {stats:?}"
    );
    assert_eq!((stats.succeeded, stats.skipped), (1, 1), "{stats:?}");
}
