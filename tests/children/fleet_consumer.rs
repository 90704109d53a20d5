//! The child process of `fleet_processes.rs`.

use crate::fleet_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use babelqueue::redis::redis;
use babelqueue::redis::{RedisStore, RedisStoreError, RedisTransport};
use babelqueue::{App, Envelope, Guard, InFlight};
use fleet_support::{raw, shared_url};

const CHARGE: &str = "urn:babel:payments:charge";

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("the dedupe store failed")]
    Store(#[from] RedisStoreError),
    #[error("the effects counter failed")]
    Effects(#[from] redis::RedisError),
    #[error(transparent)]
    InFlight(#[from] InFlight),
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(env_or(name, &default.to_string()).parse().unwrap())
}

/// Counts one charge of `payment_id` in Redis.
async fn charge(
    effects: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    payment_id: &str,
) -> Result<(), redis::RedisError> {
    redis::pipe()
        .incr(format!("{prefix}:charges:{payment_id}"), 1)
        .ignore()
        .sadd(format!("{prefix}:charged"), payment_id)
        .ignore()
        .query_async::<()>(effects)
        .await
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
    let broker = env_or("BQ_BROKER_URL", &shared_url());
    let store_url = env_or("BQ_STORE_URL", &shared_url());
    let queue = env_or("BQ_QUEUE", "payments");
    let prefix = env_or("BQ_PREFIX", "bq-test:fleet");
    let id = env_or("BQ_CONSUMER_ID", &uuid::Uuid::new_v4().simple().to_string());
    let lease = env_or("BQ_MODE", "seen") == "lease";
    let lease_for = env_ms("BQ_LEASE_MS", 10_000);
    let handler_delay = env_ms("BQ_HANDLER_MS", 1);
    let concurrency: usize = env_or("BQ_CONCURRENCY", "2").parse().unwrap();

    let transport = RedisTransport::open(&broker).unwrap().consumer_id(&id);
    let store = RedisStore::builder(&store_url)
        .prefix(format!("{prefix}:idemp:"))
        .connect()
        .await
        .unwrap();
    let effects = raw(&shared_url()).await;
    let charged = Arc::new(AtomicU64::new(0));
    let counter = charged.clone();
    let app = App::new(transport)
        .queue(&queue)
        .concurrency(concurrency)
        .heartbeat(
            env_ms("BQ_HB_INTERVAL_MS", 500),
            env_ms("BQ_HB_TTL_MS", 2000),
        )
        .recovery_interval(env_ms("BQ_RECOVERY_MS", 1000))
        .poll_timeout(Duration::from_millis(200))
        .in_flight_delay(Duration::from_millis(200))
        .shutdown_grace(Duration::from_secs(10))
        .route_async(CHARGE, move |env: Envelope| {
            let store = store.clone();
            let mut effects = effects.clone();
            let prefix = prefix.clone();
            let counter = counter.clone();
            async move {
                let pid = env.data["payment_id"].as_str().unwrap_or("?").to_owned();
                let work = async {
                    tokio::time::sleep(handler_delay).await;
                    charge(&mut effects, &prefix, &pid).await?;
                    counter.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), ChargeError>(())
                };
                if lease {
                    Guard::new(&store)
                        .lease(lease_for)
                        .run_async(&env, work)
                        .await?;
                } else {
                    Guard::new(&store).run_async(&env, work).await?;
                }
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
    eprintln!(
        "[child {id}] stopped: charged={} stats={stats:?}",
        charged.load(Ordering::Relaxed)
    );
}
