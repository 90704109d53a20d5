//! The child process of `outbox_sigkill.rs`.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use babelqueue::handler::BoxFuture;
use babelqueue::outbox::{OutboxRelay, OutboxStore};
use babelqueue::postgres::{PostgresOutbox, PostgresStore};
use babelqueue::redis::RedisTransport;
use babelqueue::runtime::{Delivery, Transport, TransportError};
use babelqueue::sqlite::SqliteOutbox;

const CHILD: &str = "BQ_OUTBOX_CHILD";
/// What the relay process prints once Redis accepted the row (libtest may print on the
/// same line, so it is searched for, not compared).
const MARK: &str = "BQ-OUTBOX-PUBLISHED";
const LEASE: Duration = Duration::from_secs(2);

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn pg_url() -> String {
    std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Publishes through Redis, then announces it and never returns (the kill comes here).
struct PublishThenHang(RedisTransport);

impl Transport for PublishThenHang {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.0.publish_raw(queue, element).await?;
            {
                let mut out = std::io::stdout().lock();
                writeln!(out, "\n{MARK}").unwrap();
                out.flush().unwrap();
            }
            std::future::pending().await
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
}

/// The relay process (`BQ_OUTBOX_CHILD`): `sqlite:<path>` or
/// `postgres:<table>`.
pub async fn main() {
    let which = std::env::var(CHILD).expect("the parent test sets the child's parameter");
    let transport = PublishThenHang(RedisTransport::connect(&redis_url()).await.unwrap());
    let store: Arc<dyn OutboxStore> = match which.split_once(':') {
        Some(("sqlite", path)) => Arc::new(SqliteOutbox::open(path).unwrap()),
        Some(("postgres", table)) => {
            let store = PostgresStore::connect(&pg_url()).await.unwrap();
            Arc::new(PostgresOutbox::with_table(store.pool().clone(), table).unwrap())
        }
        _ => panic!("{CHILD}={which}: expected sqlite:<path> or postgres:<table>"),
    };
    let relay = OutboxRelay::new(store, Arc::new(transport)).lease(LEASE);
    relay.relay_once().await.unwrap();
    unreachable!("the transport hangs after the publish");
}
