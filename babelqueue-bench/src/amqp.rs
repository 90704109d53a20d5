//! The RabbitMQ side of the bench (`--broker amqp`): loading the workload onto a queue,
//! checking and deleting queues, and the bare lapin consume + ack loop (the broker's
//! ceiling for this client).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use babelqueue::BoxError;
use babelqueue::amqp::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use babelqueue::amqp::lapin::types::{FieldTable, ShortString};
use babelqueue::amqp::lapin::{Channel, Connection, ConnectionProperties};
use babelqueue::amqp::{AmqpTransport, dead_letter_queue};
use babelqueue::runtime::Transport;
use futures_core::Stream;

/// Publishes running at once while loading a queue (each waits for its confirm).
const LOAD_IN_FLIGHT: usize = 64;

/// A fresh, unique queue name for one run.
pub fn fresh_queue() -> String {
    format!("bench.payments.{}", uuid::Uuid::new_v4().simple())
}

/// An AMQP name the broker accepts, or a clear error.
fn short(name: &str) -> Result<ShortString, BoxError> {
    ShortString::try_new(name).map_err(|e| format!("`{name}` is not a valid AMQP name: {e}").into())
}

/// An admin connection (declarations, counts, deletions, the bare loop).
pub async fn connect(url: &str) -> Result<Connection, BoxError> {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| format!("cannot connect to the AMQP broker: {e}").into())
}

/// Loads `bodies` onto `queue` through an [`AmqpTransport`] (the family's projection,
/// persistent, every publish confirmed), [`LOAD_IN_FLIGHT`] publishes at a time in the
/// workload's order, and checks that the queue holds exactly them. Not timed.
pub async fn preload(url: &str, queue: &str, bodies: &[Vec<u8>]) -> Result<(), BoxError> {
    let conn = connect(url).await?;
    match ready(&conn, queue).await? {
        Some(0) | None => {}
        Some(n) => {
            return Err(
                format!("queue `{queue}` already holds {n} messages: use a fresh name").into(),
            );
        }
    }
    let producer = AmqpTransport::open(url).await?;
    // The first publish declares the queue (durable, no arguments) as every SDK does.
    if let Some(first) = bodies.first() {
        producer.publish_raw(queue, first.clone()).await?;
    }
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(bodies.to_vec());
    let next = Arc::new(AtomicUsize::new(1));
    let mut tasks = Vec::with_capacity(LOAD_IN_FLIGHT);
    for _ in 0..LOAD_IN_FLIGHT {
        let (producer, bodies, next, queue) = (
            producer.clone(),
            bodies.clone(),
            next.clone(),
            queue.to_owned(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(body) = bodies.get(i) else {
                    return Ok::<(), BoxError>(());
                };
                producer.publish_raw(&queue, body.clone()).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let have = ready(&conn, queue).await?.unwrap_or(0);
    let _ = conn.close(200, ShortString::from("loaded")).await;
    if have as usize != bodies.len() {
        return Err(format!(
            "loading `{queue}`: it holds {have} messages, {} were published",
            bodies.len()
        )
        .into());
    }
    Ok(())
}

/// Ready messages of `queue`, `None` when it does not exist (on a channel of its own: a
/// passive declaration of a missing queue closes its channel).
pub async fn ready(conn: &Connection, queue: &str) -> Result<Option<u32>, BoxError> {
    let ch = conn.create_channel().await?;
    match ch
        .queue_declare(
            short(queue)?,
            QueueDeclareOptions::default().passive(),
            FieldTable::default(),
        )
        .await
    {
        Ok(q) => {
            let _ = ch.close(200, ShortString::from("counted")).await;
            Ok(Some(q.message_count()))
        }
        Err(e) if e.is_amqp_soft_error() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Deletes `queue` and its dead-letter queue (if they exist). Delay queues of the run (a
/// lease deferral's) expire on their own (`x-expires`).
pub async fn delete(conn: &Connection, queue: &str) -> Result<(), BoxError> {
    for name in [queue.to_owned(), dead_letter_queue(queue)] {
        let ch = conn.create_channel().await?;
        match ch
            .queue_delete(short(&name)?, QueueDeleteOptions::default())
            .await
        {
            Ok(_) => {
                let _ = ch.close(200, ShortString::from("deleted")).await;
            }
            Err(e) if e.is_amqp_soft_error() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The next item of `stream`.
async fn next<S: Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *stream).poll_next(cx)).await
}

/// The bare client: one lapin consumer with manual ack and `prefetch`, acking each
/// delivery as it arrives, until `total` were taken. Returns the seconds it took (from
/// opening the channel, as a drain's time includes starting its consumer).
pub async fn bare(
    conn: &Connection,
    queue: &str,
    prefetch: u16,
    total: u64,
) -> Result<f64, BoxError> {
    let start = Instant::now();
    let ch: Channel = conn.create_channel().await?;
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            short(queue)?,
            ShortString::from("bq-bench-bare"),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut taken = 0u64;
    while taken < total {
        match next(&mut consumer).await {
            Some(Ok(d)) => {
                ch.basic_ack(d.delivery_tag, BasicAckOptions::default())
                    .await?;
                taken += 1;
            }
            Some(Err(e)) => return Err(format!("the bare consumer failed: {e}").into()),
            None => return Err("the broker cancelled the bare consumer".into()),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = ch.close(200, ShortString::from("done")).await;
    Ok(secs)
}
