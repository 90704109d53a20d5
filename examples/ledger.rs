//! The ledger story: exactly-once effects in the database, with a real crash.
//!
//! ```text
//! cargo run --example ledger
//! ```
//!
//! One payment is published twice (identical bytes: a redelivery on the wire) to a Redis
//! queue. A first consumer, a child process, writes the payment's ledger row and then
//! dies (`std::process::abort`) before it can finish. A second consumer recovers the
//! message the first one held (its heartbeat expired: the runtime's recovery moves a dead
//! consumer's in-flight messages back to the queue) and consumes what is left. Then the ledger is counted:
//!
//! * **transactional mode** (`PostgresStore::transaction`): the ledger row and the id's
//!   row are written in one transaction; the crash came before the commit, so PostgreSQL
//!   rolled both back, the recovered message ran once and the duplicate was skipped:
//!   `ledger rows for pay_7f3a: 1`.
//! * **seen-set guard** (`guard_async`, for contrast): the ledger row committed on its own
//!   and the crash came before `remember`, so the recovered message ran again:
//!   `ledger rows for pay_7f3a (seen-set guard): 2`.
//!
//! The id rows use the table layout every BabelQueue SDK shares
//! (`babelqueue_idempotency`'s columns), so other SDKs still see the id as seen.
//!
//! Environment: `POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! `BROKER_URL` (default `redis://localhost:6379/0`). Each run uses tables and a queue
//! of its own (a random suffix) and removes them at the end.

use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Duration;

use babelqueue::postgres::{PostgresStore, PostgresStoreError};
use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::redis::{RedisTransport, processing_list};
use babelqueue::runtime::{App, Disposition, Report};
use babelqueue::{Envelope, Guard};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";
const PAYMENT_ID: &str = "pay_7f3a";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The handler writes through the store's transaction, with the id's row.
    Transactional,
    /// The handler writes on its own; the guard remembers the id after it.
    SeenSet,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Transactional => "transactional",
            Mode::SeenSet => "seen-set",
        }
    }
}

/// What one run works on: its own id table, ledger table and queue.
#[derive(Clone)]
struct Setup {
    ids: String,
    ledger: String,
    queue: String,
}

impl Setup {
    fn from_env() -> Result<Self, String> {
        let get = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
        Ok(Setup {
            ids: get("LEDGER_IDS_TABLE")?,
            ledger: get("LEDGER_TABLE")?,
            queue: get("LEDGER_QUEUE")?,
        })
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn postgres_url() -> String {
    env_or("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
}

fn broker_url() -> String {
    env_or("BROKER_URL", "redis://localhost:6379/0")
}

async fn store(setup: &Setup) -> Result<PostgresStore, PostgresStoreError> {
    let store = PostgresStore::builder(postgres_url())
        .table(&setup.ids)
        .connect()
        .await?;
    store.migrate().await?;
    Ok(store)
}

/// `INSERT INTO <ledger> …` for the payment in `env`.
fn ledger_insert(ledger: &str) -> String {
    format!(
        "INSERT INTO \"{ledger}\" (payment_id, amount, currency, message_id) VALUES ($1, $2, $3, $4)"
    )
}

fn ledger_params(env: &Envelope) -> (String, i64, String) {
    (
        env.data["payment_id"].as_str().unwrap_or("?").to_owned(),
        env.data["amount"].as_i64().unwrap_or(0),
        env.data["currency"].as_str().unwrap_or("?").to_owned(),
    )
}

fn wrote(consumer: u8, mode: Mode, env: &Envelope, crash: bool) {
    let (payment_id, amount, currency) = ledger_params(env);
    let how = match (mode, crash) {
        (Mode::Transactional, true) => "in the transaction; crashing before the commit",
        (Mode::SeenSet, true) => "(committed); crashing before remember",
        (Mode::Transactional, false) => "committed with the id",
        (Mode::SeenSet, false) => "committed; id remembered after",
    };
    println!(
        "[rust] consumer {consumer}: ledger row payment_id={payment_id} amount={amount} {currency} meta.id={} {how}",
        env.meta.id
    );
}

/// How long a consumer's heartbeat is valid: short, so the story does not wait long for
/// the crashed consumer to be declared dead.
const HEARTBEAT_TTL: Duration = Duration::from_millis(500);

/// The charge handler of either mode; `crash` makes it abort right after its write.
fn consumer_app(
    transport: RedisTransport,
    setup: &Setup,
    store: PostgresStore,
    mode: Mode,
    consumer: u8,
    crash: bool,
) -> App {
    let ledger: Arc<str> = Arc::from(setup.ledger.as_str());
    App::new(transport.registration_ttl(HEARTBEAT_TTL))
        .queue(&setup.queue)
        .heartbeat(HEARTBEAT_TTL / 5, HEARTBEAT_TTL)
        .route_async(CHARGE, move |env: Envelope| {
            let (store, ledger) = (store.clone(), ledger.clone());
            async move {
                let (payment_id, amount, currency) = ledger_params(&env);
                let sql = ledger_insert(&ledger);
                let params = (&payment_id, &amount, &currency, &env.meta.id);
                match mode {
                    Mode::Transactional => store
                        .transaction(&env, async |tx| {
                            tx.execute(&sql, &[params.0, params.1, params.2, params.3])
                                .await?;
                            wrote(consumer, mode, &env, crash);
                            if crash {
                                std::process::abort();
                            }
                            Ok::<(), PostgresStoreError>(())
                        })
                        .await
                        .map(drop),
                    Mode::SeenSet => Guard::new(&store).run_async(&env, async {
                        let client = store.pool().get().await?;
                        client
                            .execute(&sql, &[params.0, params.1, params.2, params.3])
                            .await?;
                        wrote(consumer, mode, &env, crash);
                        if crash {
                            std::process::abort();
                        }
                        Ok::<(), PostgresStoreError>(())
                    })
                    .await
                    .map(drop),
                }
            }
        })
        .on_delivery(move |r: &Report| {
            if r.disposition == Disposition::Skipped {
                let id = r.envelope.as_ref().map_or("?", |e| e.meta.id.as_str());
                println!(
                    "[rust] consumer {consumer}: skipped  payment_id={PAYMENT_ID}  meta.id={id}  (duplicate)"
                );
            }
        })
}

/// The first consumer (a child process): consumes until its handler aborts.
async fn crashing_consumer(mode: Mode) -> Result<bool, Box<dyn std::error::Error>> {
    let setup = Setup::from_env()?;
    let store = store(&setup).await?;
    let transport = RedisTransport::connect(&broker_url()).await?;
    consumer_app(transport, &setup, store, mode, 1, true)
        .drain()
        .await?;
    Err("the first consumer was expected to crash in its handler".into())
}

async fn count_rows(store: &PostgresStore, ledger: &str) -> Result<i64, PostgresStoreError> {
    let client = store.pool().get().await?;
    let row = client
        .query_one(
            &format!("SELECT count(*) FROM \"{ledger}\" WHERE payment_id = $1"),
            &[&PAYMENT_ID],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// One round of the story in `mode`; returns the ledger's row count for the payment.
async fn round(mode: Mode, setup: &Setup) -> Result<i64, Box<dyn std::error::Error>> {
    let store = store(setup).await?;
    store
        .pool()
        .get()
        .await?
        .batch_execute(&format!(
            "CREATE TABLE \"{}\" (payment_id TEXT NOT NULL, amount BIGINT NOT NULL, \
               currency TEXT NOT NULL, message_id TEXT NOT NULL)",
            setup.ledger
        ))
        .await?;
    let transport = RedisTransport::connect(&broker_url()).await?;

    // The same payment, twice, byte for byte.
    let env = Envelope::new(
        CHARGE,
        json!({"payment_id": PAYMENT_ID, "amount": 4200, "currency": "EUR"}),
    )?
    .with_queue(&setup.queue);
    let bytes = env.encode();
    let producer = App::new(transport.clone()).queue(&setup.queue);
    producer.publish_raw(bytes.clone()).await?;
    producer.publish_raw(bytes).await?;
    println!(
        "[rust] published payment_id={PAYMENT_ID} meta.id={} twice (identical bytes)",
        env.meta.id
    );

    // Consumer 1: this program again, in a child process that aborts after its write.
    let out = Command::new(std::env::current_exe()?)
        .args(["consumer", "--mode", mode.arg()])
        .env("LEDGER_IDS_TABLE", &setup.ids)
        .env("LEDGER_TABLE", &setup.ledger)
        .env("LEDGER_QUEUE", &setup.queue)
        .output()?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if out.status.success() {
        return Err(format!(
            "consumer 1 was expected to crash: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    println!("[rust] consumer 1 died ({})", out.status);

    // Consumer 2: recovers what consumer 1 held, then consumes what is left.
    let app = consumer_app(transport, setup, store.clone(), mode, 2, false);
    // Once consumer 1's heartbeat has expired, the drain's recovery (at start) moves the
    // message it held back to the queue.
    tokio::time::sleep(HEARTBEAT_TTL + Duration::from_millis(200)).await;
    let stats = app.drain().await?;
    println!(
        "[rust] consumer 2: recovered {} in-flight message(s) of consumer 1",
        stats.recovered
    );
    count_rows(&store, &setup.ledger).await.map_err(Into::into)
}

async fn cleanup(setup: &Setup) {
    if let Ok(store) = store(setup).await
        && let Ok(client) = store.pool().get().await
    {
        let _ = client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS \"{}\"; DROP TABLE IF EXISTS \"{}\"",
                setup.ledger, setup.ids
            ))
            .await;
    }
    if let Ok(client) = redis::Client::open(broker_url())
        && let Ok(mut conn) = client.get_multiplexed_async_connection().await
    {
        let keys = [
            setup.queue.clone(),
            processing_list(&setup.queue),
            format!("{}.dlq", setup.queue),
        ];
        let _: Result<i64, _> = conn.del(&keys).await;
        // The consumers' own keys: `{<queue>}:processing:<id>`, heartbeats, registry.
        let pattern = format!("{{{}}}:*", setup.queue);
        let theirs: Vec<String> = conn.keys(&pattern).await.unwrap_or_default();
        if !theirs.is_empty() {
            let _: Result<i64, _> = conn.del(&theirs).await;
        }
    }
}

async fn story() -> Result<bool, Box<dyn std::error::Error>> {
    let run = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let mut ok = true;
    for mode in [Mode::Transactional, Mode::SeenSet] {
        let tag = match mode {
            Mode::Transactional => "txn",
            Mode::SeenSet => "seen",
        };
        let setup = Setup {
            ids: format!("bq_ledger_ids_{run}_{tag}"),
            ledger: format!("bq_ledger_{run}_{tag}"),
            queue: format!("ledger-{run}-{tag}"),
        };
        let rows = round(mode, &setup).await;
        cleanup(&setup).await;
        let rows = rows?;
        match mode {
            Mode::Transactional => {
                println!("ledger rows for {PAYMENT_ID}: {rows}");
                ok &= rows == 1;
            }
            Mode::SeenSet => {
                println!("ledger rows for {PAYMENT_ID} (seen-set guard): {rows}");
                ok &= rows == 2;
            }
        }
    }
    Ok(ok)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        [] => story().await,
        ["consumer", "--mode", "transactional"] => crashing_consumer(Mode::Transactional).await,
        ["consumer", "--mode", "seen-set"] => crashing_consumer(Mode::SeenSet).await,
        _ => Err(
            "usage: ledger (no arguments; `consumer --mode transactional|seen-set` is the \
                  crashing child it starts)"
                .into(),
        ),
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
