//! Messages per second of `App::drain()` over 20,000 messages: the in-memory transport
//! (baseline) and a local Redis (`BABELQUEUE_REDIS_URL`, default
//! `redis://127.0.0.1:6379/0`), at concurrency 1 and 8; median of 3 runs each, all in
//! the same process run.
//!
//! ```text
//! cargo bench --bench drain
//! ```
//!
//! The handler is an async no-op routed by URN, so the figures are the runtime's own cost
//! per message (decode, route, task, ack) plus, on Redis, one `LMOVE` and one `LREM`
//! round trip each. Filling the queue is not timed. Without `--bench`, or with `--test`
//! (`cargo test --all-targets`, `cargo bench --bench drain -- --test`) it runs one small
//! smoke round instead. With Redis unreachable, its rows say so and are skipped.

use std::time::Instant;

use babelqueue::Envelope;
use babelqueue::redis::redis;
use babelqueue::redis::{RedisTransport, processing_list};
use babelqueue::runtime::{App, InMemoryTransport, Transport};

const URN: &str = "urn:babel:bench:noop";

fn app(transport: impl Transport, queue: &str, concurrency: usize) -> App {
    App::new(transport)
        .queue(queue)
        .concurrency(concurrency)
        .route_async(URN, |_env: Envelope| async { Ok::<(), std::io::Error>(()) })
}

fn bodies(queue: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            Envelope::new(
                URN,
                serde_json::json!({"i": i, "payment_id": "pay_7f3a", "amount": 4200}),
            )
            .map(|e| e.with_queue(queue).encode())
            .unwrap_or_default()
        })
        .collect()
}

async fn run_memory(n: usize, concurrency: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let t = InMemoryTransport::new();
    let queue = "bench";
    for b in bodies(queue, n) {
        t.publish_raw(queue, b).await?;
    }
    let app = app(t.clone(), queue, concurrency);
    let start = Instant::now();
    let stats = app.drain().await?;
    let secs = start.elapsed().as_secs_f64();
    if stats.succeeded != n as u64 || t.processing_len(queue) != 0 {
        return Err(format!("in-memory drain handled {stats:?}").into());
    }
    Ok(n as f64 / secs)
}

async fn run_redis(
    url: &str,
    n: usize,
    concurrency: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let queue = format!("bq-bench:drain:{}", uuid::Uuid::new_v4().simple());
    let mut raw = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    for chunk in bodies(&queue, n).chunks(1000) {
        let _: i64 = redis::cmd("RPUSH")
            .arg(&queue)
            .arg(chunk)
            .query_async(&mut raw)
            .await?;
    }
    let transport = RedisTransport::connect(url).await?;
    let app = app(transport.clone(), &queue, concurrency);
    let start = Instant::now();
    let stats = app.drain().await?;
    let secs = start.elapsed().as_secs_f64();
    let left = transport.len(&queue).await? + transport.processing_len(&queue).await?;
    let _: i64 = redis::cmd("DEL")
        .arg(&queue)
        .arg(processing_list(&queue))
        .query_async(&mut raw)
        .await?;
    if stats.succeeded != n as u64 || left != 0 {
        return Err(format!("redis drain handled {stats:?}, {left} left").into());
    }
    Ok(n as f64 / secs)
}

/// Why the Redis rows cannot run (`None`: a `PING` answered within 2 seconds).
async fn redis_unreachable(url: &str) -> Option<String> {
    let ping = async {
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    match tokio::time::timeout(std::time::Duration::from_secs(2), ping).await {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("no answer within 2 s".to_owned()),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn fmt_runs(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn bench(n: usize, runs: usize) -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("BABELQUEUE_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".to_owned());
    println!("drain of {n} messages, median of {runs} runs (messages/second)");
    println!(
        "{:<12} {:>11} {:>14} {:>12}  runs",
        "transport", "concurrency", "median msg/s", "vs memory c1"
    );
    let redis_down = redis_unreachable(&url).await;
    let mut baseline = None;
    for (name, concurrency) in [("memory", 1), ("memory", 8), ("redis", 1), ("redis", 8)] {
        if name == "redis"
            && let Some(why) = &redis_down
        {
            println!(
                "{name:<12} {concurrency:>11}  skipped: Redis at {url} is unreachable ({why})"
            );
            continue;
        }
        let mut v = Vec::with_capacity(runs);
        for _ in 0..runs {
            let rate = if name == "memory" {
                run_memory(n, concurrency).await?
            } else {
                run_redis(&url, n, concurrency).await?
            };
            v.push(rate);
        }
        let m = median(v.clone());
        let base = *baseline.get_or_insert(m);
        println!(
            "{name:<12} {concurrency:>11} {m:>14.0} {:>11.3}x  [{}]",
            m / base,
            fmt_runs(&v)
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` passes `--bench`; `cargo bench -- --test` and `cargo test --benches`
    // run one small smoke round.
    let full = std::env::args().any(|a| a == "--bench") && !std::env::args().any(|a| a == "--test");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (n, runs) = if full { (20_000, 3) } else { (200, 1) };
    let started = Instant::now();
    rt.block_on(bench(n, runs))?;
    eprintln!("(took {:.1} s)", started.elapsed().as_secs_f64());
    Ok(())
}
