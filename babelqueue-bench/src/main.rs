//! `babelqueue-bench`: how fast a consumer drains a Redis queue through the real runtime
//! ([`App`]), the Redis transport, the idempotency guard and a dedupe store.
//!
//! ```text
//! cargo run --release -p babelqueue-bench -- --n 20000 --dup-frac 0.5 --store redis --concurrency 8 --runs 3
//! ```
//!
//! Workload (the same as `scripts/perf-vs-python.sh` gives the Python SDK): N distinct
//! envelopes with URN `urn:babel:payments:charge` and data
//! `{"payment_id":"pay_%08d","amount":4200,"currency":"EUR","customer":"cus_19c2"}`, then
//! D = round(dup_frac × N) byte-identical copies of D of those originals, the whole list
//! shuffled with a fixed seed, on the queue `bench:payments`. Loading the list is not timed.
//!
//! Each run checks that the handler's effects equal N, that the guard skipped exactly D,
//! and that every list of the queue is empty afterwards; it counts the Redis commands the
//! server executed per delivery (`INFO commandstats`, before and after; commands run inside
//! scripts are counted too, and so is anything else talking to that server at the time).
//! On the Redis broker it also measures, over the timed drain only, the consumer
//! process's CPU time (user + system, `getrusage`) and the Redis server's (`INFO cpu`).
//! The last line is
//! `deliveries=.. msgs_per_s=.. effects=.. skips=.. redis_cmds_per_delivery=..
//! redis_reads_per_delivery=.. client_cpu_us_per_delivery=.. server_cpu_share=..` with the
//! median run's figures (`server_cpu_share`: the server's CPU seconds per second of the
//! drain, 1.00 = one core; the last two on the Redis broker only).
//!
//! `--broker amqp` runs the same workload on RabbitMQ (`--amqp-url`): each run loads the
//! bytes onto a fresh queue `bench.payments.<uuid>` (the family's projection, persistent,
//! confirmed; not timed), drains it with the real `App` over `AmqpTransport` (its
//! prefetch: 2 × `--concurrency`, or `--prefetch`), checks effects, skips and that the queue is empty, and deletes it.
//! `--url` is then only the Redis store's server (its commands per delivery are the
//! store's). `--bare` drains the same queue with a bare lapin consume + ack loop
//! (the same prefetch, no runtime, no guard): the client's ceiling.
//!
//! ```text
//! cargo run --release -p babelqueue-bench -- --broker amqp --amqp-url amqp://guest:guest@127.0.0.1:5672/%2f --concurrency 8
//! cargo run --release -p babelqueue-bench -- --broker amqp --bare --concurrency 8
//! ```
//!
//! `--broker sqs` runs it on SQS (`--sqs-url`, the family's `sqs://<region>?endpoint=…`,
//! credentials from the AWS chain): each run loads a fresh queue `bench-payments-<uuid>`
//! in `SendMessageBatch` calls (not timed), drains it with the `App` over `SqsTransport`,
//! checks effects, skips and that nothing is left, and deletes the queue. Against an
//! emulator (moto) the figures say nothing about the real service.
//!
//! `--broker kafka` (built with `--features kafka`) loads each run onto a fresh
//! one-partition topic `bench.payments.<uuid>` (the binding's headers, every produce
//! acknowledged; not timed), drains it with the `App` over `KafkaTransport` in a fresh
//! consumer group (the group join is inside the timed drain; its time is printed apart),
//! checks effects, skips and that the group committed every record, and deletes the topic.
//!
//! ```text
//! cargo run --release -p babelqueue-bench --features kafka -- --broker kafka --kafka-url kafka://127.0.0.1:9092 --store memory --n 2000 --concurrency 8
//! ```

mod amqp;
mod bare_redis;
#[cfg(feature = "kafka")]
mod kafka;
mod sqs;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use babelqueue::amqp::AmqpTransport;
use babelqueue::postgres::PostgresStore;
use babelqueue::redis::redis::{self, aio::MultiplexedConnection};
use babelqueue::redis::{RedisStore, RedisTransport};
use babelqueue::runtime::{App, Stats, Transport};
use babelqueue::sqlite::SqliteStore;
use babelqueue::sqs::SqsTransport;
use babelqueue::{
    AsyncLeaseStore, AsyncStore, BoxError, Envelope, Guard, InMemoryStore, store::IntoHandlerError,
};
use clap::{Parser, ValueEnum};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

const URN: &str = "urn:babel:payments:charge";
const QUEUE: &str = "bench:payments";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Broker {
    /// Redis lists (`--url`), as today.
    Redis,
    /// RabbitMQ (`--amqp-url`); `--url` is then the Redis store's server.
    Amqp,
    /// Amazon SQS (`--sqs-url`); `--url` is then the Redis store's server.
    Sqs,
    /// Kafka (`--kafka-url`; built with `--features kafka`); `--url` is then the Redis
    /// store's server.
    Kafka,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    /// The process-local in-memory store.
    Memory,
    /// A Redis store of the cross-SDK layout (`bq:idemp:<id>`), on the broker's server.
    Redis,
    /// The PostgreSQL store (`--postgres-url`).
    Postgres,
    /// The embedded SQLite store (a temporary file).
    Embedded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Post-success dedupe: seen → skip, run, remember.
    Seen,
    /// In-flight lease: claim, run, complete.
    Lease,
}

/// Drains a pre-loaded Redis (or RabbitMQ) queue through babelqueue's runtime, guard and
/// store, and prints deliveries per second.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The broker the workload is loaded onto and drained from.
    #[arg(long, value_enum, default_value_t = Broker::Redis)]
    broker: Broker,
    /// RabbitMQ's URL (`--broker amqp`).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_url: String,
    /// SQS, in the family's URL form (`--broker sqs`; credentials from the AWS chain).
    #[arg(long, default_value = "sqs://us-east-1?endpoint=http://127.0.0.1:4566")]
    sqs_url: String,
    /// Kafka's URL (`--broker kafka`).
    #[arg(long, default_value = "kafka://127.0.0.1:9092")]
    kafka_url: String,
    /// `--broker amqp --preload-only`: the queue to load (default: a fresh
    /// `bench.payments.<uuid>`, printed). Timed runs always use a fresh queue each.
    #[arg(long)]
    queue: Option<String>,
    /// Drain with a bare loop instead of the runtime. `--broker amqp`: a lapin consume +
    /// ack loop (at the prefetch the `App` would have, see `--prefetch`), no guard, no
    /// store. `--broker redis` (seen-set mode, Redis store): the runtime's own commands
    /// per delivery (reserve, `EXISTS`, `SET … NX` with the ack), pipelined as its batch
    /// workers send them, with no runtime, decoding or guard: the server's ceiling for
    /// the consumer's command mix.
    #[arg(long)]
    bare: bool,
    /// `--broker amqp`: the consumer's prefetch, for the `App` (`AmqpTransport::with_prefetch`)
    /// and the bare loop alike. Default: the transport's own, `PREFETCH_PER_WORKER` (2) ×
    /// `--concurrency`.
    #[arg(long)]
    prefetch: Option<u16>,
    /// Distinct payments.
    #[arg(long, default_value_t = 20_000)]
    n: usize,
    /// Duplicates as a fraction of N (byte-identical copies of that many originals).
    #[arg(long, default_value_t = 0.5)]
    dup_frac: f64,
    /// The dedupe store.
    #[arg(long, value_enum, default_value_t = StoreKind::Redis)]
    store: StoreKind,
    /// Guard mode.
    #[arg(long, value_enum, default_value_t = Mode::Seen)]
    mode: Mode,
    /// Worker tasks of the consumer.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Timed runs; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The broker's Redis (also the Redis store's); with `--broker amqp`, the Redis store's.
    #[arg(long, default_value = "redis://127.0.0.1:6379/0")]
    url: String,
    /// The PostgreSQL store's URL (`--store postgres`).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    postgres_url: String,
    /// Seed of the shuffle and of the choice of duplicated payments.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Runtime worker threads (default: the CPUs this process may run on, e.g. 1 under
    /// `taskset -c 1`: more threads than CPUs only adds context switches).
    #[arg(long)]
    threads: Option<usize>,
    /// Only load the shuffled workload onto the queue (after emptying its lists) and exit:
    /// how `scripts/perf-vs-python.sh` gives another consumer the same bytes.
    #[arg(long)]
    preload_only: bool,
    /// Turn off the transport's pipelining (acks with the next reserve, the Redis store's
    /// `remember` with the ack): every operation a round trip of its own (the baseline).
    #[arg(long)]
    no_pipelining: bool,
    /// Set `TCP_NODELAY` (Nagle's algorithm off) on the transport's and the Redis store's
    /// connections; the default leaves it off, as the redis crate does.
    #[arg(long)]
    nodelay: bool,
    /// Messages one worker holds at once (`App::batch`): their acks and the refill go in
    /// one round trip. Default: the transport's (16 on Redis with pipelining, 1
    /// elsewhere); `--batch 1`: one message per worker.
    #[arg(long)]
    batch: Option<usize>,
}

/// One run's figures.
#[derive(Debug, Clone)]
struct Run {
    deliveries: u64,
    secs: f64,
    effects: u64,
    skips: u64,
    redis_cmds: u64,
    /// Read events the server processed (`INFO stats` `total_reads_processed`): about one
    /// per round trip of a client that waits for each reply.
    redis_reads: u64,
    /// CPU time (user + system) of this process while it drained, in seconds (Redis
    /// broker only; 0 elsewhere).
    client_cpu: f64,
    /// Heap allocations (and reallocations) of this process while it drained (Redis
    /// broker only; 0 elsewhere).
    allocations: u64,
    /// CPU time the Redis server used meanwhile (`INFO cpu`), in seconds (Redis broker
    /// only; 0 elsewhere).
    server_cpu: f64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.deliveries as f64 / self.secs
    }
}

/// The workload: `n` originals plus `round(dup_frac × n)` byte-identical copies, shuffled.
fn workload(n: usize, dup_frac: f64, seed: u64) -> Result<Vec<Vec<u8>>, BoxError> {
    if !(0.0..=1.0).contains(&dup_frac) {
        return Err(format!("--dup-frac must be within 0..=1, got {dup_frac}").into());
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut originals = Vec::with_capacity(n);
    for i in 0..n {
        let data = serde_json::json!({
            "payment_id": format!("pay_{i:08}"),
            "amount": 4200,
            "currency": "EUR",
            "customer": "cus_19c2",
        });
        originals.push(Envelope::new(URN, data)?.with_queue(QUEUE).encode());
    }
    let d = (dup_frac * n as f64).round() as usize;
    let mut picks: Vec<usize> = (0..n).collect();
    picks.shuffle(&mut rng);
    let mut all = originals.clone();
    all.extend(picks[..d].iter().map(|&i| originals[i].clone()));
    all.shuffle(&mut rng);
    Ok(all)
}

/// Counts this process's heap allocations (one relaxed atomic add per allocation, in
/// every configuration alike), for `allocs_per_delivery`.
struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator; only adds a counter.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// CPU time (user + system) this process has used so far (`getrusage`).
fn process_cpu() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the rusage it is pointed at and reports failure by its result.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return 0.0;
    }
    // SAFETY: initialized by the successful call above (and zeroed before it).
    let usage = unsafe { usage.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// The CPU time the Redis server has used (`used_cpu_user` + `used_cpu_sys` of `INFO
/// cpu`), in seconds.
async fn server_cpu(conn: &mut MultiplexedConnection) -> Result<f64, BoxError> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    match (field("used_cpu_user:"), field("used_cpu_sys:")) {
        (Some(u), Some(s)) => Ok(u + s),
        _ => Err("INFO cpu has no used_cpu_user / used_cpu_sys".into()),
    }
}

/// `total_reads_processed` of `INFO stats` (one per request batch the server read).
async fn reads_processed(conn: &mut MultiplexedConnection) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO").arg("stats").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_reads_processed:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or_else(|| "INFO stats has no total_reads_processed (Redis 6.2 or later needed)".into())
}

async fn commands_processed(conn: &mut MultiplexedConnection) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    // Lines like `cmdstat_lrem:calls=3,usec=...`; the INFO calls themselves are left out.
    let mut total = 0;
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, stats)) = rest.split_once(':') else {
            continue;
        };
        if name == "info" {
            continue;
        }
        let calls = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| format!("unexpected INFO commandstats line: {line}"))?;
        total += calls;
    }
    Ok(total)
}

/// The keys of the queue this library may write, for the emptiness check and clean-up.
async fn queue_keys(conn: &mut MultiplexedConnection) -> Result<Vec<String>, BoxError> {
    let mut keys = vec![QUEUE.to_owned(), format!("{QUEUE}:processing")];
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{{{QUEUE}}}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(keys)
}

/// Lists and sorted sets of the queue that still hold something: `(key, length)`.
async fn leftovers(conn: &mut MultiplexedConnection) -> Result<Vec<(String, u64)>, BoxError> {
    let mut left = Vec::new();
    for key in queue_keys(conn).await? {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(conn).await?;
        let len: u64 = match kind.as_str() {
            "list" => redis::cmd("LLEN").arg(&key).query_async(conn).await?,
            "zset" => redis::cmd("ZCARD").arg(&key).query_async(conn).await?,
            _ => 0,
        };
        if len > 0 {
            left.push((key, len));
        }
    }
    Ok(left)
}

/// What is left in the queue's lists, described (empty: nothing).
async fn left_in_lists(conn: &mut MultiplexedConnection) -> Result<String, BoxError> {
    let left = leftovers(conn).await?;
    Ok(if left.is_empty() {
        String::new()
    } else {
        format!("in the queue's lists: {left:?}")
    })
}

async fn clear_queue(conn: &mut MultiplexedConnection) -> Result<(), BoxError> {
    for key in queue_keys(conn).await? {
        let _: i64 = redis::cmd("DEL").arg(&key).query_async(conn).await?;
    }
    Ok(())
}

/// Builds the consumer: one handler for the payments URN, guarded by `store` in `mode`,
/// counting its effects.
fn consumer<S>(
    transport: impl Transport,
    queue: &str,
    store: Arc<S>,
    mode: Mode,
    concurrency: usize,
    batch: Option<usize>,
    effects: Arc<AtomicU64>,
) -> App
where
    S: AsyncStore + AsyncLeaseStore + Send + Sync + 'static,
    S::Error: IntoHandlerError<BoxError>,
{
    let app = App::new(transport).queue(queue).concurrency(concurrency);
    let app = match batch {
        Some(k) => app.batch(k),
        None => app,
    };
    app.route_async(URN, move |env: Envelope| {
        let (store, effects) = (store.clone(), effects.clone());
        async move {
            let charge = async {
                effects.fetch_add(1, Ordering::Relaxed);
                Ok::<(), BoxError>(())
            };
            match mode {
                Mode::Seen => Guard::new(&*store).run_async(&env, charge).await.map(drop),
                Mode::Lease => Guard::new(&*store)
                    .lease(Duration::from_secs(30))
                    .run_async(&env, charge)
                    .await
                    .map(drop),
            }
        }
    })
}

/// Empties the queue's lists and pushes `bodies` onto the queue (not timed).
async fn preload(conn: &mut MultiplexedConnection, bodies: &[Vec<u8>]) -> Result<(), BoxError> {
    clear_queue(conn).await?;
    for chunk in bodies.chunks(1000) {
        let _: i64 = redis::cmd("RPUSH")
            .arg(QUEUE)
            .arg(chunk)
            .query_async(conn)
            .await?;
    }
    Ok(())
}

/// Checks a run's figures: every payment charged once, every duplicate skipped, and
/// nothing left (`left` describes what is).
fn check(run: &Run, stats: &Stats, n: u64, d: u64, left: &str) -> Result<(), BoxError> {
    // Deliveries deferred because their id was in flight elsewhere (lease mode) come back
    // and are delivered again: they are counted as deliveries, not as effects or skips.
    let settled = run.deliveries - stats.deferred;
    if settled != n + d || run.effects != n || run.skips != d || !left.is_empty() {
        return Err(format!(
            "check failed: deliveries={} (want {} + deferred {}), effects={} (want {n}), \
             skips={} (want {d}), left: {left}; stats: {stats:?}",
            run.deliveries,
            n + d,
            stats.deferred,
            run.effects,
            run.skips
        )
        .into());
    }
    Ok(())
}

/// One run on the broker `args.broker`.
async fn one_run<S>(
    args: &Args,
    bodies: &[Vec<u8>],
    store: Arc<S>,
    raw: Option<&mut MultiplexedConnection>,
) -> Result<Run, BoxError>
where
    S: AsyncStore + AsyncLeaseStore + Send + Sync + 'static,
    S::Error: IntoHandlerError<BoxError>,
{
    match (args.broker, raw) {
        (Broker::Redis, Some(raw)) => one_run_redis(args, bodies, store, raw).await,
        (Broker::Redis, None) => Err("the Redis broker needs its connection".into()),
        (Broker::Amqp, raw) => one_run_amqp(args, bodies, store, raw).await,
        (Broker::Sqs, raw) => one_run_sqs(args, bodies, store, raw).await,
        #[cfg(feature = "kafka")]
        (Broker::Kafka, _) => {
            kafka::one_run(
                &args.kafka_url,
                bodies,
                store,
                args.mode,
                args.concurrency,
                args.n as u64,
            )
            .await
        }
        #[cfg(not(feature = "kafka"))]
        (Broker::Kafka, _) => {
            Err("--broker kafka: build babelqueue-bench with --features kafka".into())
        }
    }
}

/// Redis figures around `f`: `(result, commands, reads)`, when there is a connection.
async fn counted<T, F: Future<Output = T>>(
    raw: Option<&mut MultiplexedConnection>,
    f: F,
) -> Result<(T, u64, u64), BoxError> {
    let Some(raw) = raw else {
        return Ok((f.await, 0, 0));
    };
    let before = commands_processed(raw).await?;
    let reads_before = reads_processed(raw).await?;
    let out = f.await;
    let reads_after = reads_processed(raw).await?;
    let after = commands_processed(raw).await?;
    // The two INFO calls between the marks are left out.
    Ok((
        out,
        after - before,
        (reads_after - reads_before).saturating_sub(1),
    ))
}

/// One run on RabbitMQ: a fresh queue, loaded, drained (by the `App` or the bare loop),
/// checked, deleted.
async fn one_run_amqp<S>(
    args: &Args,
    bodies: &[Vec<u8>],
    store: Arc<S>,
    raw: Option<&mut MultiplexedConnection>,
) -> Result<Run, BoxError>
where
    S: AsyncStore + AsyncLeaseStore + Send + Sync + 'static,
    S::Error: IntoHandlerError<BoxError>,
{
    let queue = amqp::fresh_queue();
    let admin = amqp::connect(&args.amqp_url).await?;
    let run = async {
        amqp::preload(&args.amqp_url, &queue, bodies).await?;
        let total = bodies.len() as u64;
        let n = args.n as u64;
        // Connected before the timed drain, as the bare loop's connection is.
        let transport = AmqpTransport::open(&args.amqp_url).await?;
        let transport = match args.prefetch {
            Some(p) => transport.with_prefetch(p),
            None => transport,
        };
        let prefetch = transport.prefetch_for(args.concurrency);
        if args.bare {
            let secs = amqp::bare(&admin, &queue, prefetch, total).await?;
            let left = amqp::ready(&admin, &queue).await?.unwrap_or(0);
            if left != 0 {
                return Err(format!("the bare loop left {left} messages on `{queue}`").into());
            }
            return Ok(Run {
                deliveries: total,
                secs,
                effects: 0,
                skips: 0,
                redis_cmds: 0,
                redis_reads: 0,
                client_cpu: 0.0,
                allocations: 0,
                server_cpu: 0.0,
            });
        }
        let effects = Arc::new(AtomicU64::new(0));
        let app = consumer(
            transport,
            &queue,
            store,
            args.mode,
            args.concurrency,
            args.batch,
            effects.clone(),
        );
        let (out, redis_cmds, redis_reads) = counted(raw, async {
            let start = Instant::now();
            let stats = app.drain().await;
            (stats, start.elapsed().as_secs_f64())
        })
        .await?;
        let (stats, secs) = out;
        let stats = stats?;
        app.transport().leave(&queue).await?;
        let run = Run {
            deliveries: stats.processed,
            secs,
            effects: effects.load(Ordering::Relaxed),
            skips: stats.skipped,
            redis_cmds,
            redis_reads,
            client_cpu: 0.0,
            allocations: 0,
            server_cpu: 0.0,
        };
        let left = match amqp::ready(&admin, &queue).await? {
            Some(0) => String::new(),
            Some(k) => format!("{k} ready on `{queue}`"),
            None => format!("the queue `{queue}` is gone"),
        };
        check(&run, &stats, n, total - n, &left)?;
        Ok::<Run, BoxError>(run)
    }
    .await;
    let deleted = amqp::delete(&admin, &queue).await;
    let _ = admin.close(200, "bench done".into()).await;
    let run = run?;
    deleted?;
    Ok(run)
}

/// One run on SQS: a fresh queue, loaded in batches, drained by the `App`, checked,
/// deleted.
async fn one_run_sqs<S>(
    args: &Args,
    bodies: &[Vec<u8>],
    store: Arc<S>,
    raw: Option<&mut MultiplexedConnection>,
) -> Result<Run, BoxError>
where
    S: AsyncStore + AsyncLeaseStore + Send + Sync + 'static,
    S::Error: IntoHandlerError<BoxError>,
{
    let queue = sqs::fresh_queue();
    let transport = SqsTransport::connect(&args.sqs_url).await?;
    let run = async {
        sqs::preload(&transport, &queue, bodies).await?;
        let total = bodies.len() as u64;
        let n = args.n as u64;
        let effects = Arc::new(AtomicU64::new(0));
        let app = consumer(
            transport.clone(),
            &queue,
            store,
            args.mode,
            args.concurrency,
            args.batch,
            effects.clone(),
        );
        let (out, redis_cmds, redis_reads) = counted(raw, async {
            let start = Instant::now();
            let stats = app.drain().await;
            (stats, start.elapsed().as_secs_f64())
        })
        .await?;
        let (stats, secs) = out;
        let stats = stats?;
        app.transport().leave(&queue).await?;
        let run = Run {
            deliveries: stats.processed,
            secs,
            effects: effects.load(Ordering::Relaxed),
            skips: stats.skipped,
            redis_cmds,
            redis_reads,
            client_cpu: 0.0,
            allocations: 0,
            server_cpu: 0.0,
        };
        let left = match sqs::left(&transport, &queue).await? {
            0 => String::new(),
            k => format!("{k} left on `{queue}`"),
        };
        check(&run, &stats, n, total - n, &left)?;
        Ok::<Run, BoxError>(run)
    }
    .await;
    let deleted = sqs::delete(&transport, &queue).await;
    let run = run?;
    deleted?;
    Ok(run)
}

async fn one_run_redis<S>(
    args: &Args,
    bodies: &[Vec<u8>],
    store: Arc<S>,
    raw: &mut MultiplexedConnection,
) -> Result<Run, BoxError>
where
    S: AsyncStore + AsyncLeaseStore + Send + Sync + 'static,
    S::Error: IntoHandlerError<BoxError>,
{
    preload(raw, bodies).await?;
    if args.bare {
        return one_run_redis_bare(args, bodies, raw).await;
    }
    let transport = RedisTransport::connect(&args.url)
        .await?
        .pipelining(!args.no_pipelining)
        .tcp_nodelay(args.nodelay);
    let effects = Arc::new(AtomicU64::new(0));
    let app = consumer(
        transport,
        QUEUE,
        store,
        args.mode,
        args.concurrency,
        args.batch,
        effects.clone(),
    );
    let (stats, m) = measured(raw, async {
        let start = Instant::now();
        let stats = app.drain().await;
        (stats, start.elapsed().as_secs_f64())
    })
    .await?;
    let (stats, secs) = stats;
    let stats = stats?;
    let run = m.run(
        stats.processed,
        secs,
        effects.load(Ordering::Relaxed),
        stats.skipped,
    );
    let n = args.n as u64;
    let d = bodies.len() as u64 - n;
    let left = left_in_lists(raw).await?;
    check(&run, &stats, n, d, &left)?;
    Ok(run)
}

/// What the server and this process did while a drain ran (Redis broker).
struct Measured {
    redis_cmds: u64,
    redis_reads: u64,
    client_cpu: f64,
    allocations: u64,
    server_cpu: f64,
}

impl Measured {
    fn run(self, deliveries: u64, secs: f64, effects: u64, skips: u64) -> Run {
        Run {
            deliveries,
            secs,
            effects,
            skips,
            redis_cmds: self.redis_cmds,
            redis_reads: self.redis_reads,
            client_cpu: self.client_cpu,
            allocations: self.allocations,
            server_cpu: self.server_cpu,
        }
    }
}

/// Runs `drain` between two readings of the server's counters (`INFO`) and this
/// process's CPU time and allocations.
async fn measured<T>(
    raw: &mut MultiplexedConnection,
    drain: impl Future<Output = T>,
) -> Result<(T, Measured), BoxError> {
    let before = commands_processed(raw).await?;
    let reads_before = reads_processed(raw).await?;
    let server_before = server_cpu(raw).await?;
    let cpu_before = process_cpu();
    let allocs_before = ALLOCATIONS.load(Ordering::Relaxed);
    let out = drain.await;
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - allocs_before;
    let client_cpu = process_cpu() - cpu_before;
    let server_after = server_cpu(raw).await?;
    let reads_after = reads_processed(raw).await?;
    let after = commands_processed(raw).await?;
    Ok((
        out,
        Measured {
            redis_cmds: after - before,
            // The four INFO calls between the marks are left out.
            redis_reads: (reads_after - reads_before).saturating_sub(3),
            client_cpu,
            allocations,
            server_cpu: server_after - server_before,
        },
    ))
}

/// One run of the bare loop (`--broker redis --bare`) on the loaded queue, with the same
/// counters and checks as the runtime's run.
async fn one_run_redis_bare(
    args: &Args,
    bodies: &[Vec<u8>],
    raw: &mut MultiplexedConnection,
) -> Result<Run, BoxError> {
    // A fresh key space per run, expiring as the bench's Redis store's keys do.
    let prefix = format!("bq:idemp:bench:{}:", uuid::Uuid::new_v4().simple());
    let (drained, m) = measured(
        raw,
        bare_redis::drain(
            &args.url,
            QUEUE,
            args.concurrency,
            args.batch,
            prefix,
            600_000,
        ),
    )
    .await?;
    let drained = drained?;
    // The bare loop's set-up (two connections, two `SCRIPT LOAD`) is in the server's figures.
    let run = m.run(
        drained.effects + drained.skips,
        drained.secs,
        drained.effects,
        drained.skips,
    );
    let n = args.n as u64;
    let left = left_in_lists(raw).await?;
    check(&run, &Stats::default(), n, bodies.len() as u64 - n, &left)?;
    Ok(run)
}

async fn bench(args: Args) -> Result<(), BoxError> {
    if args.runs == 0 || args.n == 0 || args.concurrency == 0 {
        return Err("--n, --runs and --concurrency must be at least 1".into());
    }
    if args.broker != Broker::Amqp && args.queue.is_some() {
        return Err("--queue is for --broker amqp".into());
    }
    if args.broker == Broker::Redis
        && args.bare
        && (args.mode != Mode::Seen || args.store != StoreKind::Redis || args.no_pipelining)
    {
        return Err(
            "--broker redis --bare is the seen-set mode's commands on a Redis store, pipelined: \
             drop --mode lease, --store and --no-pipelining"
                .into(),
        );
    }
    if !matches!(args.broker, Broker::Amqp | Broker::Redis) && args.bare {
        return Err("--bare is for --broker amqp and redis".into());
    }
    if args.broker == Broker::Sqs && (args.bare || args.preload_only || args.queue.is_some()) {
        return Err("--bare, --preload-only and --queue are for --broker amqp".into());
    }
    if args.broker == Broker::Kafka && args.preload_only {
        return Err("--preload-only is for --broker redis and amqp".into());
    }
    if args.broker != Broker::Amqp && args.prefetch.is_some() {
        return Err("--prefetch is for --broker amqp".into());
    }
    let bodies = workload(args.n, args.dup_frac, args.seed)?;
    if args.broker == Broker::Amqp && args.preload_only {
        let queue = args.queue.clone().unwrap_or_else(amqp::fresh_queue);
        amqp::preload(&args.amqp_url, &queue, &bodies).await?;
        println!("preloaded={} queue={queue}", bodies.len());
        return Ok(());
    }
    // Redis figures: the broker's on Redis; the store's on RabbitMQ with the Redis store.
    let mut raw = if args.broker == Broker::Redis || (args.store == StoreKind::Redis && !args.bare)
    {
        Some(
            redis::Client::open(args.url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        )
    } else {
        None
    };
    if args.preload_only {
        let raw = raw.as_mut().ok_or("no Redis connection")?;
        preload(raw, &bodies).await?;
        println!("preloaded={} queue={QUEUE}", bodies.len());
        return Ok(());
    }
    let tmp = std::env::temp_dir().join(format!("bq-bench-{}", uuid::Uuid::new_v4().simple()));
    let mut runs = Vec::with_capacity(args.runs);
    for i in 0..args.runs {
        // A fresh dedupe state per run, so every run sees N first deliveries.
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let run = match args.store {
            StoreKind::Memory => {
                one_run(&args, &bodies, Arc::new(InMemoryStore::new()), raw.as_mut()).await?
            }
            StoreKind::Redis => {
                // Go layout under a per-run prefix, expiring on its own.
                let store = RedisStore::builder(args.url.as_str())
                    .prefix(format!("bq:idemp:bench:{tag}:"))
                    .ttl(Duration::from_secs(600))
                    .tcp_nodelay(args.nodelay)
                    .connect()
                    .await?;
                one_run(&args, &bodies, Arc::new(store), raw.as_mut()).await?
            }
            StoreKind::Postgres => {
                let store = PostgresStore::builder(args.postgres_url.as_str())
                    .table(format!("bq_bench_{tag}"))
                    .pool_size(args.concurrency.max(1))
                    .connect()
                    .await?;
                store.migrate().await?;
                let run = one_run(&args, &bodies, Arc::new(store.clone()), raw.as_mut()).await;
                let client = store.pool().get().await?;
                client
                    .batch_execute(&format!("DROP TABLE IF EXISTS bq_bench_{tag}"))
                    .await?;
                run?
            }
            StoreKind::Embedded => {
                std::fs::create_dir_all(&tmp)?;
                let store = SqliteStore::open(tmp.join(format!("{tag}.sqlite3")))?;
                one_run(&args, &bodies, Arc::new(store), raw.as_mut()).await?
            }
        };
        eprintln!(
            "run {}/{}: {} deliveries in {:.3} s = {:.0}/s, effects={} skips={} redis_cmds={} redis_reads={} client_cpu={:.3}s server_cpu={:.3}s",
            i + 1,
            args.runs,
            run.deliveries,
            run.secs,
            run.rate(),
            run.effects,
            run.skips,
            run.redis_cmds,
            run.redis_reads,
            run.client_cpu,
            run.server_cpu
        );
        runs.push(run);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    if args.broker == Broker::Redis
        && let Some(raw) = raw.as_mut()
    {
        clear_queue(raw).await?;
    }
    runs.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    let median = &runs[runs.len() / 2];
    println!(
        "broker={:?} bare={} store={:?} mode={:?} concurrency={} n={} dup_frac={} runs={} pipelining={} nodelay={} batch={} prefetch={}",
        args.broker,
        args.bare,
        args.store,
        args.mode,
        args.concurrency,
        args.n,
        args.dup_frac,
        args.runs,
        !args.no_pipelining,
        args.nodelay,
        args.batch
            .map_or_else(|| "default".to_owned(), |k| k.to_string()),
        match (args.broker, args.prefetch) {
            (Broker::Amqp, Some(p)) => p.to_string(),
            (Broker::Amqp, None) => args
                .concurrency
                .saturating_mul(usize::from(babelqueue::amqp::PREFETCH_PER_WORKER))
                .min(usize::from(u16::MAX))
                .to_string(),
            _ => "-".to_owned(),
        }
    );
    let cpu = if median.client_cpu > 0.0 {
        format!(
            " client_cpu_us_per_delivery={:.2} allocs_per_delivery={:.1} server_cpu_share={:.2}",
            median.client_cpu * 1e6 / median.deliveries as f64,
            median.allocations as f64 / median.deliveries as f64,
            median.server_cpu / median.secs
        )
    } else {
        String::new()
    };
    println!(
        "deliveries={} msgs_per_s={:.0} effects={} skips={} redis_cmds_per_delivery={:.2} redis_reads_per_delivery={:.2}{cpu}",
        median.deliveries,
        median.rate(),
        median.effects,
        median.skips,
        median.redis_cmds as f64 / median.deliveries as f64,
        median.redis_reads as f64 / median.deliveries as f64
    );
    Ok(())
}

fn main() {
    let args = Args::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    builder.worker_threads(threads.max(1));
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("babelqueue-bench: cannot start the runtime: {e}");
            std::process::exit(2);
        }
    };
    // The library's logs, only when asked for (no subscriber otherwise: no cost).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    if let Err(e) = rt.block_on(bench(args)) {
        eprintln!("babelqueue-bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_n_originals_and_byte_identical_duplicates() {
        let all = workload(100, 0.5, 7).unwrap();
        assert_eq!(all.len(), 150);
        let mut counts = std::collections::HashMap::new();
        for body in &all {
            *counts.entry(body.clone()).or_insert(0u32) += 1;
        }
        assert_eq!(counts.len(), 100, "100 distinct payments");
        assert_eq!(counts.values().filter(|&&c| c == 2).count(), 50);
        assert!(counts.values().all(|&c| c <= 2));
    }

    #[test]
    fn a_duplicate_fraction_out_of_range_is_an_error() {
        assert!(workload(10, 1.5, 7).is_err());
        assert!(workload(10, -0.1, 7).is_err());
    }

    #[test]
    fn fresh_queues_are_unique_amqp_names() {
        let (a, b) = (amqp::fresh_queue(), amqp::fresh_queue());
        assert_ne!(a, b);
        assert!(a.starts_with("bench.payments.") && a.len() <= 255, "{a}");
    }
}
