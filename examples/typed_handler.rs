//! A typed handler with shared state: the payload deserialized into `Payment`, the dedupe
//! store picked on the command line at start-up and handed to the router as state (no
//! `static`, no `OnceLock`), the attempt count, and the envelope.
//!
//! ```text
//! cargo run --example typed_handler                    # in-memory store
//! cargo run --example typed_handler -- --store embedded  # SQLite file (STORE_PATH)
//! cargo run --example typed_handler -- --store redis     # BROKER_URL, default redis://127.0.0.1:6379/0
//! ```
//!
//! It publishes one payment twice (a redelivery: identical bytes) and one message whose
//! payload is not a payment, drains the queue on an in-memory transport, and checks that
//! the payment was charged exactly once.

use std::sync::Mutex;

use babelqueue::redis::RedisStore;
use babelqueue::sqlite::SqliteStore;
use babelqueue::{
    App, Attempts, Envelope, InMemoryStore, InMemoryTransport, Json, Router, State,
    dyn_store::DynStore, dyn_store::DynStoreError, handler, idempotent,
};

const CHARGE: &str = "urn:babel:payments:charge";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Payment {
    payment_id: String,
    amount: u64,
    currency: String,
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("the dedupe store failed")]
    Store(#[from] DynStoreError),
}

/// The payment gateway stand-in: what was charged (shared state, injected by type).
#[derive(Default)]
struct Gateway {
    charged: Mutex<Vec<String>>,
}

/// Charges a payment once per `meta.id`, with the store the program chose at start-up.
#[handler("urn:babel:payments:charge")]
#[idempotent(store = store)]
async fn charge(
    Json(payment): Json<Payment>,
    gateway: State<Gateway>,
    store: State<DynStore>,
    attempts: Attempts,
    env: &Envelope,
) -> Result<(), ChargeError> {
    gateway
        .charged
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(payment.payment_id.clone());
    println!(
        "[rust] charged  payment_id={} amount={} {}  meta.id={}  attempt={}",
        payment.payment_id,
        payment.amount,
        payment.currency,
        env.meta.id,
        attempts.0 + 1
    );
    Ok(())
}

async fn open_store(kind: &str) -> Result<DynStore, Box<dyn std::error::Error>> {
    Ok(match kind {
        "memory" => DynStore::new(InMemoryStore::new()),
        "embedded" => {
            let path = std::env::var("STORE_PATH")
                .unwrap_or_else(|_| "babelqueue-typed-handler.sqlite3".to_owned());
            DynStore::new(SqliteStore::open(path)?)
        }
        "redis" => {
            let url = std::env::var("BROKER_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".to_owned());
            DynStore::new(RedisStore::connect(&url).await?)
        }
        other => {
            return Err(
                format!("unknown store `{other}` (expected memory, embedded or redis)").into(),
            );
        }
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let kind = match args.iter().position(|a| a == "--store") {
        Some(i) => args.get(i + 1).map_or("memory", String::as_str),
        None => "memory",
    };
    // The store is an ordinary value, chosen at run time, and reaches the handler
    // through the router's state.
    let store = open_store(kind).await?;
    let router = Router::new()
        .state(store)
        .state(Gateway::default())
        .register(charge {});

    let queue = format!("typed-handler-{}", uuid::Uuid::new_v4());
    let transport = InMemoryTransport::new();
    let app = App::new(transport.clone()).queue(&queue).router(router);

    let payment = Payment {
        payment_id: "pay_7f3a".into(),
        amount: 4200,
        currency: "EUR".into(),
    };
    let bytes = Envelope::from_payload(CHARGE, &payment)?
        .with_queue(&queue)
        .encode();
    app.publish_raw(bytes.clone()).await?;
    app.publish_raw(bytes).await?;
    // Not a payment: the handler never runs for it (a `PayloadError`).
    let bad = Envelope::new(CHARGE, serde_json::json!({"payment_id": 7}))?
        .with_queue(&queue)
        .encode();
    app.publish_raw(bad).await?;

    let stats = app.drain().await?;
    println!(
        "[rust] store={kind}: {} processed, {} succeeded, {} skipped (duplicate), {} dead-lettered",
        stats.processed, stats.succeeded, stats.skipped, stats.dead_lettered
    );
    if stats.succeeded != 1 || stats.skipped != 1 || stats.dead_lettered != 1 {
        return Err(format!("unexpected outcome: {stats:?}").into());
    }
    Ok(())
}
