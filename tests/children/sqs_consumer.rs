//! The child process of `sqs_payments.rs`.

use std::time::Duration;

use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::redis::{RedisStore, RedisStoreError};
use babelqueue::runtime::App;
use babelqueue::sqs::SqsTransport;
use babelqueue::{Envelope, Guard};

const CHARGE: &str = "urn:babel:payments:charge";

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("the dedupe store failed")]
    Store(#[from] RedisStoreError),
    #[error("the effects counter failed")]
    Effects(#[from] redis::RedisError),
}

/// The child consumer process.
pub fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run_child());
    std::process::exit(0);
}

async fn run_child() {
    let queue = env_or("BQ_QUEUE", "payments");
    let prefix = env_or("BQ_PREFIX", "bq-test:sqs-fleet");
    let handler_delay = Duration::from_millis(env_or("BQ_HANDLER_MS", "20").parse().unwrap());
    let store = RedisStore::builder(redis_url())
        .prefix(format!("{prefix}:idemp:"))
        .connect()
        .await
        .unwrap();
    let effects = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // The family URL from the environment, credentials from the default chain.
    let t = SqsTransport::connect(&env_or("BROKER_URL", ""))
        .await
        .unwrap()
        .receive_max(4);
    let app = App::new(t)
        .queue(&queue)
        .concurrency(4)
        .poll_timeout(Duration::from_millis(1000))
        .shutdown_grace(Duration::from_secs(10))
        .route_async(CHARGE, move |env: Envelope| {
            let store = store.clone();
            let mut effects = effects.clone();
            let prefix = prefix.clone();
            async move {
                let pid = env.data["payment_id"].as_str().unwrap_or("?").to_owned();
                if env.attempts >= 1 {
                    // Received before (ApproximateReceiveCount ≥ 2): a visibility ran out.
                    let _: () = effects.incr(format!("{prefix}:redelivered"), 1).await?;
                }
                Guard::new(&store)
                    .run_async(&env, async {
                        tokio::time::sleep(handler_delay).await;
                        redis::pipe()
                            .incr(format!("{prefix}:charges:{pid}"), 1)
                            .ignore()
                            .sadd(format!("{prefix}:charged"), &pid)
                            .ignore()
                            .query_async::<()>(&mut effects)
                            .await?;
                        Ok::<(), ChargeError>(())
                    })
                    .await?;
                Ok::<(), ChargeError>(())
            }
        });
    let stats = app
        .run_until(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
            term.recv().await;
        })
        .await;
    eprintln!("[sqs child] stopped: {stats:?}");
}
