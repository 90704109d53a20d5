//! `cargo bench --bench stores`: ops/second of `seen` + `remember` for every store, and the
//! Redis round trips per message of the seen-set and the lease mode.
//!
//! Each figure is the median of RUNS runs; every run uses fresh ids (a new message is one
//! `seen` that answers false plus one `remember`, i.e. 2 store operations). Two shapes:
//! one task doing messages one after another (latency bound), and 16 concurrent tasks
//! (a consumer with concurrency 16). Servers: Redis at BABELQUEUE_REDIS_URL (default
//! redis://127.0.0.1:6379/0), PostgreSQL at BABELQUEUE_POSTGRES_URL (default
//! postgres://postgres@127.0.0.1:5432/test); a store whose server is unreachable is
//! reported as skipped. The round-trip count runs on a private `redis-server` started on
//! a free port (so other clients of the shared server cannot skew `INFO commandstats`),
//! falling back to the shared server if `redis-server` is not on PATH.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use babelqueue::postgres::PostgresStore;
use babelqueue::redis::RedisStore;
use babelqueue::sqlite::SqliteStore;
use babelqueue::{AsyncStore, BoxError, Guard, InMemoryStore, Store};

const RUNS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|_| uuid::Uuid::new_v4().to_string()).collect()
}

/// Messages per second: `tasks` tasks each doing `per_task` × (seen, remember).
async fn async_run<S>(store: Arc<S>, tasks: usize, per_task: usize) -> f64
where
    S: AsyncStore + 'static,
{
    let work: Vec<Vec<String>> = (0..tasks).map(|_| ids(per_task)).collect();
    let started = Instant::now();
    let handles: Vec<_> = work
        .into_iter()
        .map(|ids| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for id in &ids {
                    let seen = store.seen(id).await.expect("seen");
                    assert!(!seen);
                    store.remember(id).await.expect("remember");
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("bench task");
    }
    (tasks * per_task) as f64 / started.elapsed().as_secs_f64()
}

/// The same with the blocking `Store` API on `threads` OS threads.
fn sync_run<S: Store + Sync>(store: &S, threads: usize, per_thread: usize) -> f64 {
    let work: Vec<Vec<String>> = (0..threads).map(|_| ids(per_thread)).collect();
    let started = Instant::now();
    std::thread::scope(|s| {
        for ids in &work {
            s.spawn(move || {
                for id in ids {
                    assert!(!store.seen(id).expect("seen"));
                    Store::remember(&store, id).expect("remember");
                }
            });
        }
    });
    (threads * per_thread) as f64 / started.elapsed().as_secs_f64()
}

struct Row {
    name: String,
    sequential: f64,
    concurrent: f64,
}

fn print_rows(rows: &[Row]) {
    let base = rows.first().map(|r| (r.sequential, r.concurrent));
    println!(
        "\n{:<44} {:>14} {:>10} {:>14} {:>10}",
        "store (median of 5 runs; msg = seen+remember)",
        "1 task msg/s",
        "ops/s",
        "16 tasks msg/s",
        "ops/s"
    );
    for r in rows {
        println!(
            "{:<44} {:>14.0} {:>10.0} {:>14.0} {:>10.0}",
            r.name,
            r.sequential,
            2.0 * r.sequential,
            r.concurrent,
            2.0 * r.concurrent
        );
    }
    if let Some((bs, bc)) = base {
        println!("\nratio to the in-memory store (same run):");
        for r in rows.iter().skip(1) {
            println!(
                "  {:<40} 1 task: 1/{:.0}   16 tasks: 1/{:.0}",
                r.name,
                bs / r.sequential,
                bc / r.concurrent
            );
        }
    }
}

async fn measure<S, F, Fut>(name: &str, make: F, seq_n: usize, conc_n: usize) -> Row
where
    S: AsyncStore + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    let mut seq = Vec::new();
    let mut conc = Vec::new();
    // One warm-up run of each shape (connections, prepared statements, page cache).
    let store = Arc::new(make().await);
    async_run(Arc::clone(&store), 1, seq_n / 4).await;
    async_run(Arc::clone(&store), 16, conc_n / 64).await;
    for _ in 0..RUNS {
        seq.push(async_run(Arc::clone(&store), 1, seq_n).await);
        conc.push(async_run(Arc::clone(&store), 16, conc_n / 16).await);
    }
    let row = Row {
        name: name.to_owned(),
        sequential: median(seq),
        concurrent: median(conc),
    };
    eprintln!("measured {name}");
    row
}

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn postgres_url() -> String {
    std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn namespace() -> String {
    format!(
        "bqbench_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

fn sqlite_path(ns: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{ns}.sqlite3"))
}

fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

async fn redis_delete(url: &str, pattern: &str) {
    let Ok(client) = babelqueue::redis::redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let mut cursor = 0u64;
    loop {
        let Ok((next, keys)): Result<(u64, Vec<String>), _> = babelqueue::redis::redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
        else {
            return;
        };
        if !keys.is_empty() {
            let _: Result<i64, _> = babelqueue::redis::redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut conn)
                .await;
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

/// The SQLite pool size: 4 threads doing seen+remember through the blocking API.
fn sqlite_pool_sizes() {
    println!("\nSQLite pool size, blocking API, 4 threads x 2000 messages (median of 5 runs):");
    for connections in [1, 2, 4, 8] {
        let ns = namespace();
        let path = sqlite_path(&ns);
        let store = SqliteStore::builder(&path)
            .connections(connections)
            .open()
            .expect("open sqlite");
        sync_run(&store, 4, 200);
        let runs: Vec<f64> = (0..RUNS).map(|_| sync_run(&store, 4, 2000)).collect();
        // Reads only: the same ids again, all seen.
        let read_ids = ids(2000);
        for id in &read_ids {
            Store::remember(&store, id).expect("remember");
        }
        let reads: Vec<f64> = (0..RUNS)
            .map(|_| {
                let started = Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..4 {
                        s.spawn(|| {
                            for id in &read_ids {
                                assert!(Store::seen(&store, id).expect("seen"));
                            }
                        });
                    }
                });
                (4 * read_ids.len()) as f64 / started.elapsed().as_secs_f64()
            })
            .collect();
        println!(
            "  connections={connections}: {:>8.0} msg/s (seen+remember)   {:>9.0} seen/s (reads only)",
            median(runs),
            median(reads)
        );
        drop(store);
        remove_sqlite(&path);
    }
}

/// Commands the server executed, from `INFO commandstats` (name → calls).
async fn commandstats(
    conn: &mut babelqueue::redis::redis::aio::MultiplexedConnection,
) -> std::collections::BTreeMap<String, u64> {
    let info: String = babelqueue::redis::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

fn delta(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> Vec<(String, u64)> {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .filter_map(|(name, a)| {
            let d = a - before.get(name).copied().unwrap_or(0);
            (d > 0).then(|| (name.clone(), d))
        })
        .collect()
}

/// A private redis-server on a free port, killed on drop.
struct PrivateRedis(std::process::Child, String);

impl PrivateRedis {
    fn start() -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let url = format!("redis://127.0.0.1:{port}/0");
        for _ in 0..50 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(PrivateRedis(child, url));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Length of the first complete RESP request (`*N\r\n` then N bulk strings) in `buf`.
fn resp_request_len(buf: &[u8]) -> Option<usize> {
    fn line(buf: &[u8], from: usize) -> Option<(i64, usize)> {
        let end = from + buf.get(from..)?.windows(2).position(|w| w == b"\r\n")?;
        let n = std::str::from_utf8(buf.get(from + 1..end)?)
            .ok()?
            .parse()
            .ok()?;
        Some((n, end + 2))
    }
    if buf.first() != Some(&b'*') {
        return None;
    }
    let (n, mut at) = line(buf, 0)?;
    for _ in 0..n {
        if buf.get(at) != Some(&b'$') {
            return None;
        }
        let (len, start) = line(buf, at)?;
        at = start + usize::try_from(len).ok()? + 2;
        if at > buf.len() {
            return None;
        }
    }
    Some(at)
}

/// A TCP proxy in front of Redis that counts the requests clients send: each request
/// the store sends and awaits is one round trip.
async fn counting_proxy(upstream: String) -> (u16, Arc<std::sync::atomic::AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind proxy");
    let port = listener.local_addr().expect("proxy addr").port();
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                continue;
            };
            let counter = Arc::clone(&counter);
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut sr, &mut cw).await;
            });
            tokio::spawn(async move {
                let (mut pending, mut chunk) = (Vec::new(), vec![0u8; 64 * 1024]);
                loop {
                    let n = match cr.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    pending.extend_from_slice(&chunk[..n]);
                    while let Some(len) = resp_request_len(&pending) {
                        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        pending.drain(..len);
                    }
                    if sw.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, count)
}

async fn redis_round_trips() {
    const N: usize = 1000;
    let private = PrivateRedis::start();
    let url = private.as_ref().map_or_else(redis_url, |p| p.1.clone());
    println!(
        "\nRedis round trips per message ({} server at {url}; INFO commandstats deltas over {N} messages):",
        if private.is_some() {
            "private"
        } else {
            "SHARED (other clients may add noise)"
        }
    );
    let Ok(client) = babelqueue::redis::redis::Client::open(url.as_str()) else {
        println!("  skipped: bad URL");
        return;
    };
    let Ok(mut admin) = client.get_multiplexed_async_connection().await else {
        println!("  skipped: Redis unreachable");
        return;
    };
    let ns = namespace();
    let upstream = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap_or("127.0.0.1:6379")
        .rsplit('@')
        .next()
        .unwrap_or("127.0.0.1:6379")
        .to_owned();
    let (port, requests) = counting_proxy(upstream).await;
    let store = RedisStore::builder(format!("redis://127.0.0.1:{port}/0"))
        .prefix(format!("{ns}:bq:idemp:"))
        .connect()
        .await
        .expect("connect through the counting proxy");
    let lease = Duration::from_secs(30);
    println!(
        "  (round trips = requests the store sent, counted by a proxy; server commands = \
         INFO commandstats, which also counts the commands run inside Lua scripts)"
    );

    for (mode, is_lease) in [("seen-set (guard)", false), ("lease (guard_lease)", true)] {
        let messages = ids(N);
        for (label, pass) in [("new id", 0), ("duplicate", 1)] {
            let before = commandstats(&mut admin).await;
            let sent_before = requests.load(std::sync::atomic::Ordering::SeqCst);
            for id in &messages {
                let r = if is_lease {
                    Guard::new(&store)
                        .lease(lease)
                        .run_async(id.as_str(), async { Ok::<(), BoxError>(()) })
                        .await
                } else {
                    Guard::new(&store)
                        .run_async(id.as_str(), async { Ok::<(), BoxError>(()) })
                        .await
                };
                let out = r.expect("guard");
                assert_eq!(out.ran(), pass == 0);
            }
            let sent = requests.load(std::sync::atomic::Ordering::SeqCst) - sent_before;
            let after = commandstats(&mut admin).await;
            let d = delta(&before, &after);
            let total: u64 = d.iter().map(|(_, n)| n).sum();
            println!(
                "  {mode:<20} {label:<10} {:.3} round trips/message   {:.3} server commands/message ({})",
                sent as f64 / N as f64,
                total as f64 / N as f64,
                d.iter()
                    .map(|(n, c)| format!("{n}={c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    redis_delete(&url, &format!("{ns}:*")).await;
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows = Vec::new();

    rows.push(rt.block_on(measure(
        "in-memory (InMemoryStore)",
        || async { InMemoryStore::new() },
        200_000,
        400_000,
    )));

    let ns = namespace();
    let path = sqlite_path(&ns);
    rows.push(rt.block_on(measure(
        "sqlite (SqliteStore, async, 4 conns, WAL)",
        || async { SqliteStore::open(&path).expect("open sqlite") },
        5_000,
        10_000,
    )));
    remove_sqlite(&path);
    let ns = namespace();
    let path = sqlite_path(&ns);
    {
        let store = SqliteStore::open(&path).expect("open sqlite");
        sync_run(&store, 1, 1_000);
        let seq = median((0..RUNS).map(|_| sync_run(&store, 1, 5_000)).collect());
        let conc = median(
            (0..RUNS)
                .map(|_| sync_run(&store, 16, 10_000 / 16))
                .collect(),
        );
        rows.push(Row {
            name: "sqlite (SqliteStore, blocking API, threads)".into(),
            sequential: seq,
            concurrent: conc,
        });
    }
    remove_sqlite(&path);

    let ns = namespace();
    let url = redis_url();
    let reachable = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(3), RedisStore::connect(&url))
            .await
            .is_ok_and(|r| r.is_ok())
    });
    if reachable {
        rows.push(rt.block_on(measure(
            "redis (RedisStore, multiplexed conn)",
            || async {
                RedisStore::builder(&url)
                    .prefix(format!("{ns}:bq:idemp:"))
                    .connect()
                    .await
                    .expect("connect redis")
            },
            5_000,
            20_000,
        )));
        rt.block_on(redis_delete(&url, &format!("{ns}:*")));
    } else {
        println!("redis: skipped (unreachable at {url})");
    }

    let ns = namespace();
    let pg = postgres_url();
    let store = rt.block_on(async {
        let store = PostgresStore::builder(&pg)
            .table(&ns)
            .connect()
            .await
            .ok()?;
        store.migrate().await.ok()?;
        Some(store)
    });
    if let Some(store) = store {
        rows.push(rt.block_on(measure(
            "postgres (PostgresStore, pool of 16)",
            || async { store.clone() },
            2_000,
            8_000,
        )));
        rt.block_on(async {
            if let Ok(client) = store.pool().get().await {
                let _ = client
                    .batch_execute(&format!("DROP TABLE IF EXISTS \"{ns}\""))
                    .await;
            }
        });
    } else {
        println!("postgres: skipped (unreachable at {pg})");
    }

    print_rows(&rows);
    sqlite_pool_sizes();
    rt.block_on(redis_round_trips());
    rt.block_on(lease_guard_cost());
}

/// The cost of the lease guard's renewal machinery per message, on the in-memory store
/// (so only the guard is measured): the blocking guard runs a renewal thread beside every
/// handler, the async guard a renewal future in the same task.
async fn lease_guard_cost() {
    use babelqueue::{Guard, InFlight};
    #[derive(Debug)]
    struct Busy;
    impl From<InFlight> for Busy {
        fn from(_: InFlight) -> Self {
            Busy
        }
    }
    let lease = Duration::from_secs(30);
    let n = 20_000;
    let mut blocking = Vec::new();
    let mut asynchronous = Vec::new();
    for _ in 0..RUNS {
        let store = InMemoryStore::new();
        let ids = ids(n);
        let started = std::time::Instant::now();
        tokio::task::block_in_place(|| {
            for id in &ids {
                Guard::new(&store)
                    .lease(lease)
                    .run(id.as_str(), || Ok::<(), Busy>(()))
                    .expect("lease guard");
            }
        });
        blocking.push(n as f64 / started.elapsed().as_secs_f64());
        let store = InMemoryStore::new();
        let started = std::time::Instant::now();
        for id in &ids {
            Guard::new(&store)
                .lease(lease)
                .run_async(id.as_str(), async { Ok::<(), Busy>(()) })
                .await
                .expect("lease guard");
        }
        asynchronous.push(n as f64 / started.elapsed().as_secs_f64());
    }
    println!(
        "lease guard on the in-memory store, one task: blocking (renewal thread per call) \
         {:.0} msg/s, async (renewal future) {:.0} msg/s",
        median(blocking),
        median(asynchronous)
    );
}
