//! The child process of `amqp_fleet.rs`.

use crate::amqp_support;

use std::time::Duration;

use amqp_support::url;
use babelqueue::amqp::AmqpTransport;
use babelqueue::redis::redis;
use babelqueue::redis::{RedisStore, RedisStoreError};
use babelqueue::runtime::RetryPolicy;
use babelqueue::{App, Envelope, Guard};

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
    #[error("the gateway hiccuped (first attempt of every tenth payment)")]
    Hiccup,
}

/// Every tenth payment fails its first attempt: retried through a delay queue.
fn hiccups(env: &Envelope) -> bool {
    let n: u64 = env.data["n"].as_u64().unwrap_or(1);
    n.is_multiple_of(10) && env.attempts == 0
}

/// The child consumer process.
pub fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(env_or("BQ_LOG", "warn"))
        .with_writer(std::io::stderr)
        .init();
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
    let prefix = env_or("BQ_PREFIX", "bq-test:amqp-fleet");
    let handler_delay = Duration::from_millis(env_or("BQ_HANDLER_MS", "5").parse().unwrap());
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
    let app = App::new(AmqpTransport::open(&url()).await.unwrap())
        .queue(&queue)
        .concurrency(4)
        .poll_timeout(Duration::from_millis(200))
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(200))
                .jitter(0.0)
                .max_attempts(5),
        )
        .shutdown_grace(Duration::from_secs(10))
        .route_async(CHARGE, move |env: Envelope| {
            let store = store.clone();
            let mut effects = effects.clone();
            let prefix = prefix.clone();
            async move {
                let pid = env.data["payment_id"].as_str().unwrap_or("?").to_owned();
                Guard::new(&store)
                    .run_async(&env, async {
                        tokio::time::sleep(handler_delay).await;
                        if hiccups(&env) {
                            return Err(ChargeError::Hiccup);
                        }
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
    eprintln!("[amqp child] stopped: {stats:?}");
}
