//! The payments story (SPEC section 6): the same payment delivered twice is charged once.
//!
//! ```text
//! cargo run --example payments                      # embedded: in-memory queue and store
//! cargo run --example payments -- produce           # the same payment, twice, to Redis
//! cargo run --example payments -- consume [--store redis|postgres|embedded|memory]
//! ```
//!
//! Environment: `BROKER_URL` (default `redis://localhost:6379/0`), `QUEUE` (default
//! `payments`), `POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`, for
//! `--store postgres`; the table is created on first use), `STORE_PATH` (default
//! `babelqueue-payments.sqlite3`, for `--store embedded`). `RUST_LOG` sets the log level
//! (default `warn`).
//!
//! The consumer's dedupe store defaults to Redis at `BROKER_URL`, the store every consumer
//! of the fleet shares — whichever SDK it is written in, since the key is `meta.id`.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{LazyLock, Mutex, OnceLock};

use babelqueue::postgres::PostgresStore;
use babelqueue::redis::{RedisStore, RedisTransport};
use babelqueue::runtime::{App, Disposition, InMemoryTransport, Report, Stats, Transport};
use babelqueue::sqlite::SqliteStore;
use babelqueue::{
    DynStore, DynStoreError, Envelope, EnvelopeError, InMemoryStore, handler, idempotent,
};
use serde::{Deserialize, Serialize};

const CHARGE: &str = "urn:babel:payments:charge";

#[derive(Debug, Serialize, Deserialize)]
struct Payment {
    payment_id: String,
    amount: u64,
    currency: String,
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("the dedupe store failed: {0}")]
    Store(#[from] DynStoreError),
    #[error("not a payment: {0}")]
    Payload(#[from] EnvelopeError),
}

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

/// The charge handler. `#[idempotent]` guards it on `meta.id` with the chosen store: a
/// delivery whose id was already charged (by this process or any consumer sharing the
/// store, whatever its language) is skipped and acked without running this body.
#[handler("urn:babel:payments:charge")]
#[idempotent(store = STORE)]
async fn charge(env: Envelope) -> Result<(), ChargeError> {
    let p: Payment = env.data_as()?;
    CHARGED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(env.meta.id.clone());
    println!(
        "[rust] charged  payment_id={} amount={} {}  meta.id={}  (charged once)",
        p.payment_id, p.amount, p.currency, env.meta.id
    );
    Ok(())
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
        Disposition::Skipped => println!(
            "[rust] skipped  payment_id={payment_id}  meta.id={id}  (duplicate, not charged again)"
        ),
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
    let p = Payment {
        payment_id: "pay_7f3a".into(),
        amount: 4200,
        currency: "EUR".into(),
    };
    Ok(Envelope::from_payload(CHARGE, &p)?
        .with_queue(queue)
        .encode())
}

fn app(transport: impl Transport, queue: &str) -> App {
    App::new(transport)
        .queue(queue)
        .register(charge)
        .on_delivery(report)
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

async fn produce() -> Result<bool, Box<dyn std::error::Error>> {
    let url = env_or("BROKER_URL", "redis://localhost:6379/0");
    let queue = env_or("QUEUE", "payments");
    let transport = RedisTransport::connect(&url).await?;
    let bytes = payment(&queue)?;
    let id = Envelope::decode(&bytes)?.meta.id;
    let app = App::new(transport).queue(&queue);
    app.publish_raw(bytes.clone()).await?;
    app.publish_raw(bytes).await?;
    println!(
        "[rust] produced payment_id=pay_7f3a  meta.id={id}  twice (identical bytes) to {queue}"
    );
    Ok(true)
}

async fn open_store(kind: &str, broker_url: &str) -> Result<DynStore, Box<dyn std::error::Error>> {
    Ok(match kind {
        "redis" => DynStore::new(RedisStore::connect(broker_url).await?),
        "postgres" => {
            let url = env_or("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test");
            let store = PostgresStore::connect(&url).await?;
            store.migrate().await?;
            DynStore::new(store)
        }
        "embedded" => {
            let path = env_or("STORE_PATH", "babelqueue-payments.sqlite3");
            DynStore::new(SqliteStore::open(path)?)
        }
        "memory" => DynStore::new(InMemoryStore::new()),
        other => {
            return Err(format!(
                "unknown store `{other}` (expected redis, postgres, embedded or memory)"
            )
            .into());
        }
    })
}

async fn consume(store_kind: &str) -> Result<bool, Box<dyn std::error::Error>> {
    let url = env_or("BROKER_URL", "redis://localhost:6379/0");
    let queue = env_or("QUEUE", "payments");
    let chosen = open_store(store_kind, &url).await?;
    if CHOSEN.set(chosen).is_err() {
        return Err("the store was already chosen".into());
    }
    let transport = RedisTransport::connect(&url).await?;
    let stats = app(transport.clone(), &queue).drain().await?;
    let ok = summary(&stats);
    let left = transport.len(&queue).await?;
    if left > 0 {
        println!("[rust] {left} message(s) left in {queue}");
    }
    Ok(ok && left == 0)
}

fn parse_store(args: &[String]) -> Result<String, String> {
    let mut store = "redis".to_owned();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if let Some(v) = arg.strip_prefix("--store=") {
            store = v.to_owned();
        } else if arg == "--store" {
            store = it.next().ok_or("--store needs a value")?.clone();
        } else {
            return Err(format!("unexpected argument `{arg}`"));
        }
    }
    Ok(store)
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
    let result = match args.first().map(String::as_str) {
        None => embedded().await,
        Some("produce") if args.len() == 1 => produce().await,
        Some("consume") => match parse_store(&args[1..]) {
            Ok(store) => consume(&store).await,
            Err(e) => Err(e.into()),
        },
        Some(other) => Err(format!(
            "unknown command `{other}`; usage: payments [produce | consume [--store redis|postgres|embedded|memory]]"
        )
        .into()),
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
