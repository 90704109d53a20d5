//! The child process of `redrive_redis.rs`.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use babelqueue::handler::BoxFuture;
use babelqueue::redis::RedisTransport;
use babelqueue::redrive::{RedriveOptions, redrive};
use babelqueue::runtime::{ConsumerOptions, Delivery, Republish, Transport, TransportError};

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

const CHILD: &str = "BQ_REDRIVE_CHILD";
const MARK: &str = "BQ-REDRIVE-PUBLISHED";
/// The child hangs after this many re-publishes (the kill lands between the publish and
/// the ack of this one).
const HANG_AFTER: usize = 4;

/// The Redis transport, except that its `HANG_AFTER`-th publish, once Redis accepted it,
/// prints a mark and never returns.
struct HangAfterPublish(RedisTransport, AtomicUsize);

impl Transport for HangAfterPublish {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.0.publish_raw(queue, element).await?;
            if self.1.fetch_add(1, Ordering::SeqCst) + 1 == HANG_AFTER {
                {
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "\n{MARK}").unwrap();
                    out.flush().unwrap();
                }
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        self.0.reserve(queue, timeout)
    }
    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        self.0.ack(delivery)
    }
    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        republish: Republish,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        self.0.requeue(delivery, republish, delay)
    }
    fn start_consumer<'a>(
        &'a self,
        queue: &'a str,
        options: &'a ConsumerOptions,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        self.0.start_consumer(queue, options)
    }
    fn leave<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(), TransportError>> {
        self.0.leave(queue)
    }
}

async fn transport() -> RedisTransport {
    RedisTransport::connect(&redis_url())
        .await
        .expect("Redis must be reachable for this test")
}

/// The redrive process (`BQ_REDRIVE_CHILD` names the DLQ).
pub async fn main() {
    let dlq = std::env::var(CHILD).expect("the parent test sets the child's parameter");
    let t = HangAfterPublish(transport().await, AtomicUsize::new(0));
    let opts = RedriveOptions::new()
        .bypass(true)
        .heartbeat(Duration::from_millis(200), Duration::from_secs(1));
    redrive(&t, &dlq, &opts).await.unwrap();
    unreachable!("the transport hangs after a publish");
}
