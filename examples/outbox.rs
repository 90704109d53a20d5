//! The transactional outbox story: an order and its `orders.created` message commit
//! together; a declined order leaves neither; a relay that crashes after publishing and
//! before marking the row makes the message go out twice, and the consumer's idempotency
//! guard ships the order once.
//!
//! ```text
//! cargo run --example outbox
//! ```
//!
//! Embedded: the shop's database and its outbox are one SQLite file in a temporary
//! directory, the queue is in memory. The same code runs on PostgreSQL
//! (`PostgresOutbox::save(&tx, …)` with your `tokio_postgres::Transaction`) and with
//! `RedisTransport` in place of the in-memory queue.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use babelqueue::outbox::{OutboxRelay, OutboxStore};
use babelqueue::runtime::{App, InMemoryTransport, Transport};
use babelqueue::sqlite::{SqliteOutbox, rusqlite};
use babelqueue::{BoxError, Envelope, Guard, InMemoryStore};

const CREATED: &str = "urn:babel:orders:created";

/// Writes an order and its message in one transaction; `declined` rolls both back.
fn place_order(
    db: &mut rusqlite::Connection,
    outbox: &SqliteOutbox,
    id: i64,
    declined: bool,
) -> Result<(), BoxError> {
    let tx = db.transaction()?;
    tx.execute("INSERT INTO orders (id, total) VALUES (?1, ?2)", (id, 4200))?;
    let created = Envelope::new(CREATED, serde_json::json!({"order_id": id}))?.with_queue("orders");
    outbox.save(&tx, &created)?;
    if declined {
        tx.rollback()?; // the order and its message vanish together
        println!("order {id}: payment declined, rolled back (no row, no message)");
    } else {
        tx.commit()?;
        println!("order {id}: committed with its message in the outbox");
    }
    Ok(())
}

async fn run() -> Result<bool, BoxError> {
    let dir = std::env::temp_dir().join(format!("babelqueue-outbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("shop.db");
    let outbox = SqliteOutbox::open(&path)?;
    let mut db = rusqlite::Connection::open(&path)?;
    db.execute_batch("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER)")?;

    place_order(&mut db, &outbox, 1001, false)?;
    place_order(&mut db, &outbox, 1002, true)?;

    let transport = InMemoryTransport::new();

    // A relay claims the row (for a 200 ms lease), publishes it, and dies before it can
    // mark it published: the window every outbox has.
    let claimed = outbox
        .fetch_unpublished(100, Duration::from_millis(200))
        .await?;
    for row in &claimed {
        transport
            .publish_raw(&row.queue, row.payload.clone())
            .await?;
    }
    println!(
        "relay 1: published {} row(s), then crashed before marking them",
        claimed.len()
    );

    // Another relay takes the row over when the lease ends and publishes it again.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let relay = OutboxRelay::new(outbox.clone(), Arc::new(transport.clone()));
    let stats = relay.drain().await?;
    println!(
        "relay 2: published {} row(s) and marked them; {} left in the outbox",
        stats.published,
        outbox.pending()?
    );

    // The consumer ships each order once, whatever the queue delivers.
    let shipped = Arc::new(AtomicU32::new(0));
    let store = Arc::new(InMemoryStore::new());
    let app = App::new(transport.clone())
        .queue("orders")
        .route_sync(CREATED, {
            let (shipped, store) = (shipped.clone(), store.clone());
            move |env: &Envelope| {
                Guard::new(&*store)
                    .run(env, || {
                        shipped.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), BoxError>(())
                    })
                    .map(|_| ())
            }
        });
    let consumed = app.drain().await?;
    let shipped = shipped.load(Ordering::SeqCst);
    println!(
        "consumer: {} deliveries, order 1001 shipped {shipped} time(s); order 1002 never sent",
        consumed.acked
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(consumed.acked == 2 && shipped == 1)
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("outbox: the story did not end as told");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("outbox: {e}");
            ExitCode::FAILURE
        }
    }
}
