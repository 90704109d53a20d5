//! The payments story (SPEC section 6): the same payment delivered twice is charged once,
//! and on a bad day (a slow or failing gateway, a store outage, consumers killed) every
//! payment is still charged exactly once.
//!
//! ```text
//! cargo run --example payments                      # embedded: in-memory queue and store
//! cargo run --example payments -- produce [--count N]   # payments (each twice) to BROKER_URL
//! cargo run --example payments -- consume [options] # drain (or --follow) the queue
//! cargo run --example payments -- --help
//! ```
//!
//! Replaying a dead letter without charging twice (redrive with replay-bypass):
//!
//! ```text
//! cargo run --example payments -- produce --marked           # one marked payment
//! cargo run --example payments -- consume --ledger-bug       # charged, then the ledger step
//!                                                            # fails permanently: dead-lettered
//! babelqueue dlq redrive payments --dry-run                  # the plan
//! babelqueue dlq redrive payments --bypass                   # back, as a replay
//! cargo run --example payments -- consume                    # charge skipped, ledger runs
//! ```
//!
//! Environment: `BROKER_URL` (default `redis://localhost:6379/0`; `amqp://…` selects
//! RabbitMQ, `sqs://<region>?endpoint=<url>` Amazon SQS and `kafka://host:port` Kafka when
//! built with `--features sqs` / `--features kafka`: the scheme
//! decides, as in the other SDKs), `STORE_URL` (the dedupe
//! store's own URL for `--store redis|postgres`; default `BROKER_URL` for redis when the
//! broker is Redis, else `redis://localhost:6379/0`,
//! `POSTGRES_URL` or `postgres://postgres@127.0.0.1:5432/test` for postgres; the table is
//! created on first use), `QUEUE` (default `payments`), `STORE_PATH` (default
//! `babelqueue-payments.sqlite3`, for `--store embedded`). `RUST_LOG` sets the log level
//! (default `warn`).
//!
//! The consumer's dedupe store defaults to Redis at `BROKER_URL`, the store every consumer
//! of the fleet shares — whichever SDK it is written in, since the key is `meta.id`.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

use babelqueue::amqp::AmqpTransport;
use babelqueue::binding::BrokerUrl;
use babelqueue::postgres::PostgresStore;
use babelqueue::redis::{RedisStore, RedisTransport};
use babelqueue::replay::bypass_external_effects_async;
use babelqueue::runtime::{
    App, Disposition, InMemoryTransport, Permanent, Report, Stats, Transport,
};
use babelqueue::sqlite::SqliteStore;
#[cfg(feature = "sqs")]
use babelqueue::sqs::SqsTransport;
use babelqueue::{
    AsyncLeaseStore, BoxError, Envelope, EnvelopeError, Guard, InMemoryStore, dyn_store::DynStore,
    dyn_store::DynStoreError, handler, idempotent, store::IntoHandlerError,
};
use serde::{Deserialize, Serialize};

const CHARGE: &str = "urn:babel:payments:charge";

#[derive(Debug, Serialize, Deserialize)]
struct Payment {
    payment_id: String,
    amount: u64,
    currency: String,
    /// The marked payment of the replay story: the (buggy) ledger step rejects it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    marked: bool,
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("the dedupe store failed")]
    Store(#[from] DynStoreError),
    #[error("not a payment")]
    Payload(#[from] EnvelopeError),
    #[error("payment gateway hiccup (transient)")]
    Gateway,
    #[error("the ledger rejected the payment")]
    Ledger(#[source] Permanent),
}

/// The simulated payment gateway (`--gateway-delay-ms`, `--gateway-fail-every`).
#[derive(Debug, Default, Clone, Copy)]
struct Gateway {
    delay: Duration,
    fail_every: u64,
}

static GATEWAY: OnceLock<Gateway> = OnceLock::new();
static ATTEMPTS: AtomicU64 = AtomicU64::new(0);

/// One charge attempt at the gateway: takes `delay`, and every `fail_every`-th attempt
/// fails with a transient error (retried by the runtime with backoff).
async fn gateway_charge() -> Result<(), ChargeError> {
    let g = GATEWAY.get().copied().unwrap_or_default();
    if !g.delay.is_zero() {
        tokio::time::sleep(g.delay).await;
    }
    let n = ATTEMPTS.fetch_add(1, Ordering::SeqCst) + 1;
    if g.fail_every > 0 && n.is_multiple_of(g.fail_every) {
        return Err(ChargeError::Gateway);
    }
    Ok(())
}

fn record_charge(env: &Envelope) -> Result<(), ChargeError> {
    let p: Payment = env.data_as()?;
    CHARGED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(env.meta.id.clone());
    if !QUIET.get().copied().unwrap_or(false) {
        println!(
            "[rust] charged  payment_id={} amount={} {}  meta.id={}  (charged once)",
            p.payment_id, p.amount, p.currency, env.meta.id
        );
    }
    Ok(())
}

/// Many payments: one line per charge would drown the output.
static QUIET: OnceLock<bool> = OnceLock::new();

/// The store picked on the command line (`--store`), set once at start-up.
static CHOSEN: OnceLock<DynStore> = OnceLock::new();

/// The dedupe store the charge handler uses: the chosen one, else an in-memory store.
static STORE: LazyLock<DynStore> = LazyLock::new(|| {
    CHOSEN
        .get()
        .cloned()
        .unwrap_or_else(|| DynStore::new(InMemoryStore::new()))
});

/// The `meta.id`s this process charged (a real service would call its payment gateway).
static CHARGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// `consume --ledger-bug`: the ledger step rejects marked payments (a bug, fixed by
/// running without the flag).
static LEDGER_BUG: OnceLock<bool> = OnceLock::new();

/// The ledger step, the idempotent core of the charge (shown for the marked payment of
/// the replay story). With `--ledger-bug` it fails **permanently** on a marked payment: the
/// runtime dead-letters it at once, after the card was charged.
fn ledger(env: &Envelope, p: &Payment) -> Result<(), ChargeError> {
    if !p.marked {
        return Ok(());
    }
    if LEDGER_BUG.get().copied().unwrap_or(false) {
        return Err(ChargeError::Ledger(Permanent::new(
            "ledger bug: marked payments are rejected",
        )));
    }
    println!(
        "[rust] ledger   payment_id={} amount={} {}  meta.id={}  (recorded: the idempotent core ran)",
        p.payment_id, p.amount, p.currency, env.meta.id
    );
    Ok(())
}

/// The charge handler. `#[idempotent]` guards it on `meta.id` with the chosen store: a
/// delivery whose id was already charged (by this process or any consumer sharing the
/// store, whatever its language) is skipped and acked without running this body.
///
/// The card charge is the external, non-idempotent side: on a deliberate replay (a
/// dead letter redriven with `--bypass`, header `bq-replay-bypass`) it is skipped, since it
/// fired the first time, while the ledger step runs.
#[handler("urn:babel:payments:charge")]
#[idempotent(store = STORE)]
async fn charge(env: Envelope) -> Result<(), ChargeError> {
    let p: Payment = env.data_as()?;
    match bypass_external_effects_async(gateway_charge()).await {
        Some(charged) => {
            charged?;
            record_charge(&env)?;
        }
        None => println!(
            "[rust] replay   payment_id={}  meta.id={}  external charge skipped (bq-replay-bypass: the card was charged the first time)",
            p.payment_id, env.meta.id
        ),
    }
    ledger(&env, &p)
}

/// Lease mode (`--mode lease`): the same charge guarded by an atomic claim held for
/// `lease` (renewed while it runs where the store supports it), so two consumers never
/// charge one payment at the same moment.
async fn charge_leased<S>(store: &S, env: Envelope, lease: Duration) -> Result<(), BoxError>
where
    S: AsyncLeaseStore,
    S::Error: IntoHandlerError<BoxError>,
{
    Guard::new(store)
        .lease(lease)
        .run_async(&env, async {
            let _: Payment = env.data_as()?;
            gateway_charge().await?;
            record_charge(&env)?;
            Ok::<(), BoxError>(())
        })
        .await
        .map(drop)
}

/// A concrete store, for lease mode (the type-erased [`DynStore`] is seen-set only).
#[derive(Clone)]
enum LeaseBackend {
    Redis(RedisStore),
    Postgres(PostgresStore),
    Sqlite(Arc<SqliteStore>),
    Memory(Arc<InMemoryStore>),
}

impl LeaseBackend {
    async fn charge(&self, env: Envelope, lease: Duration) -> Result<(), BoxError> {
        match self {
            LeaseBackend::Redis(s) => charge_leased(s, env, lease).await,
            LeaseBackend::Postgres(s) => charge_leased(s, env, lease).await,
            LeaseBackend::Sqlite(s) => charge_leased(&**s, env, lease).await,
            LeaseBackend::Memory(s) => charge_leased(&**s, env, lease).await,
        }
    }
}

/// One line per delivery the handler did not print itself.
fn report(r: &Report) {
    let env = r.envelope.as_ref();
    let payment_id = env
        .and_then(|e| e.data.get("payment_id"))
        .and_then(|v| v.as_str())
        .unwrap_or("?");
    let id = env.map_or("?", |e| e.meta.id.as_str());
    match &r.disposition {
        Disposition::Succeeded => {}
        Disposition::Skipped if QUIET.get().copied().unwrap_or(false) => {}
        Disposition::Skipped => println!(
            "[rust] skipped  payment_id={payment_id}  meta.id={id}  (duplicate, not charged again)"
        ),
        Disposition::Retried { .. } | Disposition::Requeued | Disposition::Deferred
            if QUIET.get().copied().unwrap_or(false) => {}
        other => println!(
            "[rust] {other:?}  payment_id={payment_id}  meta.id={id}  error={}",
            r.error.as_deref().unwrap_or("-")
        ),
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// The payment envelope, published twice with identical bytes (a redelivery on the wire).
fn payment(queue: &str) -> Result<Vec<u8>, EnvelopeError> {
    payment_with_id(queue, "pay_7f3a")
}

fn payment_with_id(queue: &str, payment_id: &str) -> Result<Vec<u8>, EnvelopeError> {
    marked_payment(queue, payment_id, false)
}

fn marked_payment(queue: &str, payment_id: &str, marked: bool) -> Result<Vec<u8>, EnvelopeError> {
    let p = Payment {
        payment_id: payment_id.into(),
        amount: 4200,
        currency: "EUR".into(),
        marked,
    };
    Ok(Envelope::from_payload(CHARGE, &p)?
        .with_queue(queue)
        .encode())
}

fn app(transport: impl Transport, queue: &str) -> App {
    App::new(transport)
        .queue(queue)
        .register(charge {})
        .on_delivery(report)
}

/// The last line: what the consumer did.
fn stats_line(s: &Stats) {
    println!(
        "[rust] stats: processed={} succeeded={} skipped={} retried={} dead_lettered={} deferred={}",
        s.processed,
        s.succeeded,
        s.skipped,
        s.retried,
        s.dead_lettered,
        s.deferred + s.requeued
    );
}

/// The summary line; `true` when no payment was charged twice.
fn summary(stats: &Stats) -> bool {
    let charged = CHARGED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let distinct: HashSet<&String> = charged.iter().collect();
    let n = stats.processed;
    if charged.len() == distinct.len() {
        let how = match charged.len() {
            0 => "nothing charged".to_owned(),
            1 => "charged exactly once".to_owned(),
            k => format!("{k} payments, each charged exactly once"),
        };
        println!("[rust] handled {n} deliveries: {how}, no double charge.");
        true
    } else {
        println!(
            "[rust] handled {n} deliveries: DOUBLE CHARGE ({} charges for {} payments).",
            charged.len(),
            distinct.len()
        );
        false
    }
}

async fn embedded() -> Result<bool, Box<dyn std::error::Error>> {
    let queue = env_or("QUEUE", "payments");
    let transport = InMemoryTransport::new();
    let app = app(transport.clone(), &queue);
    let bytes = payment(&queue)?;
    app.publish_raw(bytes.clone()).await?;
    app.publish_raw(bytes).await?;
    let stats = app.drain().await?;
    let ok = summary(&stats);
    Ok(ok && stats.succeeded == 1 && stats.skipped == 1 && transport.is_empty(&queue))
}

/// The broker `BROKER_URL` names, by its scheme as every SDK of the family reads it:
/// `redis://` / `rediss://` (Redis lists), `amqp://` / `amqps://` (RabbitMQ) or
/// `sqs://<region>?endpoint=<url>` (Amazon SQS; credentials from the AWS default chain).
async fn open_broker(url: &str) -> Result<Arc<dyn Transport>, Box<dyn std::error::Error>> {
    Ok(match BrokerUrl::parse(url)? {
        BrokerUrl::Redis { .. } => Arc::new(RedisTransport::connect(url).await?),
        BrokerUrl::Amqp(_) => Arc::new(AmqpTransport::open(url).await?),
        // SQS: build with `--features sqs`.
        #[cfg(feature = "sqs")]
        BrokerUrl::Sqs(_) => Arc::new(SqsTransport::connect(url).await?),
        // Kafka (default group `babelqueue`, or `?group=`): build with `--features kafka`.
        #[cfg(feature = "kafka")]
        BrokerUrl::Kafka(_) => Arc::new(babelqueue::kafka::KafkaTransport::new(url)?),
        other => {
            return Err(format!(
                "BROKER_URL {other}: this example speaks redis://, amqp://, and (built with --features sqs / kafka) sqs:// and kafka://"
            )
            .into());
        }
    })
}

async fn produce(count: usize, marked: bool) -> Result<bool, Box<dyn std::error::Error>> {
    let url = env_or("BROKER_URL", "redis://localhost:6379/0");
    let queue = env_or("QUEUE", "payments");
    let transport = open_broker(&url).await?;
    let app = App::from_arc(transport).queue(&queue);
    if marked {
        let bytes = marked_payment(&queue, "pay_marked", true)?;
        let id = Envelope::decode(&bytes)?.meta.id;
        app.publish_raw(bytes).await?;
        println!("[rust] produced payment_id=pay_marked  meta.id={id}  (marked) to {queue}");
        return Ok(true);
    }
    if count <= 1 {
        let bytes = payment(&queue)?;
        let id = Envelope::decode(&bytes)?.meta.id;
        app.publish_raw(bytes.clone()).await?;
        app.publish_raw(bytes).await?;
        println!(
            "[rust] produced payment_id=pay_7f3a  meta.id={id}  twice (identical bytes) to {queue}"
        );
        return Ok(true);
    }
    for i in 0..count {
        let bytes = payment_with_id(&queue, &format!("pay_{i:08}"))?;
        app.publish_raw(bytes.clone()).await?;
        app.publish_raw(bytes).await?;
    }
    println!("[rust] produced {count} payments, each twice (identical bytes), to {queue}");
    Ok(true)
}

async fn open_store(
    kind: &str,
    broker_url: &str,
) -> Result<(DynStore, LeaseBackend), Box<dyn std::error::Error>> {
    let store_url = std::env::var("STORE_URL").ok();
    // On another broker than Redis, the Redis store needs its own URL.
    let redis_default = if broker_url.starts_with("redis") {
        broker_url
    } else {
        "redis://localhost:6379/0"
    };
    Ok(match kind {
        "redis" => {
            // Connected by the first call: a consumer started while its store is down
            // starts, reports itself not ready (a warning), and begins work when the store
            // answers, instead of exiting.
            let s = RedisStore::builder(store_url.as_deref().unwrap_or(redis_default))
                .connect_lazy()?;
            (DynStore::new(s.clone()), LeaseBackend::Redis(s))
        }
        "postgres" => {
            let url = store_url.unwrap_or_else(|| {
                env_or("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
            });
            let store = PostgresStore::connect(&url).await?;
            // The table must exist before any work: while the server is down, wait for it
            // (not ready) instead of exiting.
            let mut delay = Duration::from_millis(100);
            loop {
                match store.migrate().await {
                    Ok(()) => break,
                    Err(e) if e.is_unavailable() => {
                        tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "the postgres store is unavailable: not ready, waiting for it");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            (DynStore::new(store.clone()), LeaseBackend::Postgres(store))
        }
        "embedded" => {
            let path = env_or("STORE_PATH", "babelqueue-payments.sqlite3");
            let s = Arc::new(SqliteStore::open(path)?);
            (DynStore::new(s.clone()), LeaseBackend::Sqlite(s))
        }
        "memory" => {
            let s = Arc::new(InMemoryStore::new());
            (DynStore::new(s.clone()), LeaseBackend::Memory(s))
        }
        other => {
            return Err(format!(
                "unknown store `{other}` (expected redis, postgres, embedded or memory)"
            )
            .into());
        }
    })
}

/// `consume` options.
#[derive(Debug)]
struct ConsumeOpts {
    store: String,
    follow: bool,
    concurrency: usize,
    gateway: Gateway,
    lease: Option<Duration>,
    heartbeat: Option<Duration>,
    max_recoveries: Option<u32>,
    quiet: bool,
    ledger_bug: bool,
}

async fn consume(o: ConsumeOpts) -> Result<bool, Box<dyn std::error::Error>> {
    let url = env_or("BROKER_URL", "redis://localhost:6379/0");
    let queue = env_or("QUEUE", "payments");
    let (chosen, backend) = open_store(&o.store, &url).await?;
    if CHOSEN.set(chosen).is_err() {
        return Err("the store was already chosen".into());
    }
    let _ = GATEWAY.set(o.gateway);
    let _ = QUIET.set(o.quiet);
    let _ = LEDGER_BUG.set(o.ledger_bug);
    let transport = open_broker(&url).await?;
    let mut app = App::from_arc(Arc::clone(&transport))
        .queue(&queue)
        .concurrency(o.concurrency)
        .on_delivery(report);
    app = match o.lease {
        None => app.register(charge {}),
        Some(lease) => app.route_async(CHARGE, move |env: Envelope| {
            let backend = backend.clone();
            async move { backend.charge(env, lease).await }
        }),
    };
    if let Some(n) = o.max_recoveries {
        app = app.max_recoveries(n);
    }
    if let Some(hb) = o.heartbeat {
        app = app.heartbeat(hb, hb * 5);
    }
    let stats = if o.follow {
        app.run().await
    } else {
        app.drain().await?
    };
    let ok = summary(&stats);
    let left = match transport.depth(&queue).await {
        Ok(depth) => depth.ready,
        Err(e) => {
            println!("[rust] could not read the depth of {queue}: {e}");
            0
        }
    };
    if left > 0 {
        println!("[rust] {left} message(s) left in {queue}");
    }
    stats_line(&stats);
    Ok(ok && (o.follow || left == 0))
}

const USAGE: &str = "usage: payments [COMMAND] [OPTIONS]

Commands:
  (none)                  embedded demo: the same payment delivered twice, charged once
  produce [--count N]     publish N payments (default 1), each twice, to BROKER_URL
  produce --marked        publish one marked payment (the replay story), once
  consume [OPTIONS]       consume the queue from BROKER_URL and charge each payment once

consume options:
  --store KIND            dedupe store: redis (default), postgres, embedded, memory
  --follow                run until SIGTERM / Ctrl-C instead of draining the queue
  --concurrency N         messages handled at once (default 1)
  --mode seen|lease       seen-set guard (default) or in-flight lease guard
  --lease DURATION        lease length in lease mode (default 30s; e.g. 300ms, 5s, 1m)
  --heartbeat DURATION    consumer heartbeat interval (TTL: 5x; default 2s)
  --max-recoveries N      a message recovered from N dead consumers is dead-lettered (default 3)
  --gateway-delay-ms N    each charge takes N ms at the simulated gateway
  --gateway-fail-every N  every Nth charge attempt fails with a transient error
  --quiet                 no line per charge (for runs with many payments)
  --ledger-bug            the ledger step rejects marked payments permanently (dead-lettered);
                          then `babelqueue dlq redrive QUEUE --bypass` and consume again
  -h, --help              this help

Environment:
  BROKER_URL   the broker, by its scheme: redis://… (default redis://localhost:6379/0)
               or amqp://user:pass@host:port/vhost (RabbitMQ)
               or sqs://<region>?endpoint=<url> (Amazon SQS; built with --features sqs)
               or kafka://host:port[,host:port] (Kafka; built with --features kafka)
  STORE_URL    the dedupe store's own URL (redis: default BROKER_URL when it is Redis,
               else redis://localhost:6379/0; postgres: default POSTGRES_URL)
  QUEUE        queue name (default payments)
  STORE_PATH   SQLite file for --store embedded (default babelqueue-payments.sqlite3)
  RUST_LOG     log level (default warn)

The last line of consume is:
  [rust] stats: processed=.. succeeded=.. skipped=.. retried=.. dead_lettered=.. deferred=..
(deferred: put back without counting an attempt: in flight elsewhere, or the store was down)";

/// `300ms`, `2s`, `1.5s`, `1m`, or a bare number of seconds.
fn parse_duration(v: &str) -> Result<Duration, String> {
    let bad = || format!("bad duration `{v}` (e.g. 300ms, 2s, 1m)");
    let (num, unit) = match v.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => v.split_at(i),
        None => (v, "s"),
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

fn parse_consume(args: &[String]) -> Result<ConsumeOpts, String> {
    let mut o = ConsumeOpts {
        store: "redis".to_owned(),
        follow: false,
        concurrency: 1,
        gateway: Gateway::default(),
        lease: None,
        heartbeat: None,
        max_recoveries: None,
        quiet: false,
        ledger_bug: false,
    };
    let mut mode = "seen".to_owned();
    let mut lease = Duration::from_secs(30);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().cloned().ok_or(format!("{name} needs a value")),
            }
        };
        let number = |v: String| -> Result<u64, String> {
            v.parse()
                .map_err(|_| format!("{name} needs a number, got `{v}`"))
        };
        match name {
            "--store" => o.store = value()?,
            "--follow" => o.follow = true,
            "--quiet" => o.quiet = true,
            "--ledger-bug" => o.ledger_bug = true,
            "--concurrency" => o.concurrency = number(value()?)?.max(1) as usize,
            "--mode" => mode = value()?,
            "--lease" => lease = parse_duration(&value()?)?,
            "--heartbeat" => o.heartbeat = Some(parse_duration(&value()?)?),
            "--max-recoveries" => {
                o.max_recoveries = Some(u32::try_from(number(value()?)?).unwrap_or(u32::MAX));
            }
            "--gateway-delay-ms" => o.gateway.delay = Duration::from_millis(number(value()?)?),
            "--gateway-fail-every" => o.gateway.fail_every = number(value()?)?,
            _ => return Err(format!("unexpected argument `{arg}`\n\n{USAGE}")),
        }
    }
    o.lease = match mode.as_str() {
        "seen" => None,
        "lease" => Some(lease),
        other => return Err(format!("--mode must be seen or lease, got `{other}`")),
    };
    Ok(o)
}

/// `(count, marked)`.
fn parse_produce(args: &[String]) -> Result<(usize, bool), String> {
    if let [flag] = args
        && flag == "--marked"
    {
        return Ok((1, true));
    }
    parse_count(args).map(|n| (n, false))
}

fn parse_count(args: &[String]) -> Result<usize, String> {
    match args {
        [] => Ok(1),
        [flag, n] if flag == "--count" => n
            .parse()
            .map_err(|_| format!("--count needs a number, got `{n}`")),
        [flag] if flag.starts_with("--count=") => flag["--count=".len()..]
            .parse()
            .map_err(|_| format!("bad {flag}")),
        _ => Err(format!("unexpected arguments {args:?}\n\n{USAGE}")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match args.first().map(String::as_str) {
        None => embedded().await,
        Some("produce") => match parse_produce(&args[1..]) {
            Ok((n, marked)) => produce(n, marked).await,
            Err(e) => Err(e.into()),
        },
        Some("consume") => match parse_consume(&args[1..]) {
            Ok(o) => consume(o).await,
            Err(e) => Err(e.into()),
        },
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}").into()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("[rust] error: {e}");
            ExitCode::from(2)
        }
    }
}
