//! The SQS side of the bench (`--broker sqs`): loading the workload onto a fresh queue in
//! `SendMessageBatch` calls, counting what is left, deleting the queue and its `-dlq`.

use babelqueue::BoxError;
use babelqueue::runtime::Transport;
use babelqueue::sqs::SqsTransport;

/// A fresh, unique queue name for one run (SQS names allow no `.` or `:`).
pub fn fresh_queue() -> String {
    format!("bench-payments-{}", uuid::Uuid::new_v4().simple())
}

/// Loads `bodies` onto `queue` (created) in batches of 10, in the workload's order as far
/// as SQS keeps one (a standard queue does not promise it). Not timed.
pub async fn preload(t: &SqsTransport, queue: &str, bodies: &[Vec<u8>]) -> Result<(), BoxError> {
    for chunk in bodies.chunks(200) {
        t.publish_batch(queue, chunk.to_vec()).await?;
    }
    Ok(())
}

/// Visible + delayed + in flight on `queue`.
pub async fn left(t: &SqsTransport, queue: &str) -> Result<u64, BoxError> {
    let d = t.depth(queue).await?;
    Ok(d.ready + d.delayed + d.in_flight)
}

/// Deletes `queue` and its dead-letter queue (when they exist).
pub async fn delete(t: &SqsTransport, queue: &str) -> Result<(), BoxError> {
    for name in [
        queue.to_owned(),
        babelqueue::sqs::dead_letter_queue(queue, ".dlq"),
    ] {
        let url = match t.client().get_queue_url().queue_name(&name).send().await {
            Ok(o) => o.queue_url().map(str::to_owned),
            Err(_) => None,
        };
        if let Some(url) = url {
            t.client().delete_queue().queue_url(url).send().await?;
        }
    }
    Ok(())
}
