//! An Apache Kafka consumer to copy (feature `kafka`): a typed `#[idempotent]` handler, a
//! Redis dedupe store, state of your own, and `run()` until Ctrl-C. `BROKER_URL` (group
//! `babelqueue` unless `?group=`), `STORE_URL`, `QUEUE` (the topic).
//!
//! ```text
//! cargo run --features kafka --example kafka              # consume until Ctrl-C
//! cargo run --features kafka --example kafka -- produce   # publish a payment, twice: charged once
//! ```
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use babelqueue::kafka::KafkaTransport;
use babelqueue::prelude::*;
use babelqueue::redis::{RedisStore, RedisStoreError};

#[derive(serde::Deserialize)]
struct Payment {
    payment_id: String,
    amount: u64,
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error(transparent)]
    Store(#[from] RedisStoreError), // the store's errors reach the handler's error type
}

/// State of your own, shared by every delivery (`main` keeps its `Arc`).
#[derive(Default)]
struct Ledger {
    charged: AtomicU64,
}

#[handler("urn:babel:payments:charge")]
#[idempotent(store = store)]
async fn charge(
    Json(payment): Json<Payment>,
    ledger: State<Ledger>,
    store: State<RedisStore>,
    env: &Envelope, // #[idempotent] keys on its `meta.id`
) -> Result<(), ChargeError> {
    ledger.charged.fetch_add(payment.amount, Ordering::Relaxed);
    tracing::info!(payment.payment_id, payment.amount, meta.id = %env.meta.id, "charged");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Without a subscriber, retries, dead letters and store outages happen silently.
    tracing_subscriber::fmt().init();
    let url = std::env::var("BROKER_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".into());
    let store_url =
        std::env::var("STORE_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "payments".into());

    let ledger = Arc::new(Ledger::default());
    let app = App::new(KafkaTransport::new(&url)?)
        .queue(queue)
        .state(RedisStore::connect(&store_url).await?)
        .state_arc(Arc::clone(&ledger))
        .register(charge {});

    if std::env::args().nth(1).as_deref() == Some("produce") {
        let payment = serde_json::json!({"payment_id": "pay_7f3a", "amount": 4200});
        let env = app.publish("urn:babel:payments:charge", &payment).await?;
        app.publish_envelope(&env).await?; // the same message again: skipped
        return Ok(());
    }
    let stats = app.run().await; // until Ctrl-C / SIGTERM; in-flight messages finish
    let charged = ledger.charged.load(Ordering::Relaxed);
    println!("{stats:?}; {charged} charged in all");
    Ok(())
}
