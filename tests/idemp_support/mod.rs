//! Shared by the namespace, fingerprint, retention and transactional tests: connections
//! to the real servers and unique names. Every server test is `#[ignore]`d with the
//! reason; CI runs them with `--include-ignored`.
#![allow(dead_code)]

use babelqueue::postgres::PostgresStore;
use babelqueue::postgres::tokio_postgres::{self, NoTls};
use babelqueue::redis::RedisStore;
use babelqueue::redis::redis;

pub const NEEDS_PG: &str = "PostgreSQL must be reachable at BABELQUEUE_POSTGRES_URL \
                            (default postgres://postgres@127.0.0.1:5432/test)";
pub const NEEDS_REDIS: &str =
    "Redis must be reachable at BABELQUEUE_REDIS_URL (default redis://127.0.0.1:6379/0)";

pub fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

pub fn pg_url() -> String {
    std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A fresh suffix: 20 hex digits.
pub fn unique() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..20].to_owned()
}

pub async fn raw_redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect(NEEDS_REDIS)
}

pub async fn raw_pg() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&pg_url(), NoTls)
        .await
        .expect(NEEDS_PG);
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A Redis store on a prefix of its own (`bq-test:<tag>:<unique>:bq:idemp:`).
pub async fn redis_store(tag: &str) -> RedisStore {
    RedisStore::builder(redis_url())
        .prefix(format!("bq-test:{tag}:{}:bq:idemp:", unique()))
        .connect()
        .await
        .expect(NEEDS_REDIS)
}

/// Deletes every key under the store's prefix.
pub async fn redis_cleanup(store: &RedisStore) {
    let mut conn = raw_redis().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", store.prefix()))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }
}

/// A migrated PostgreSQL store on a fresh table `bqt_<tag>_<unique>`.
pub async fn pg_store(tag: &str) -> PostgresStore {
    let store = PostgresStore::builder(pg_url())
        .table(format!("bqt_{tag}_{}", unique()))
        .connect()
        .await
        .expect(NEEDS_PG);
    store.migrate().await.expect(NEEDS_PG);
    store
}

pub async fn pg_drop(table: &str) {
    raw_pg()
        .await
        .batch_execute(&format!("DROP TABLE IF EXISTS \"{table}\""))
        .await
        .expect("DROP TABLE");
}

/// A fresh SQLite file path in the temp dir (with its `-wal`/`-shm` removed on drop).
pub struct TempDb(pub std::path::PathBuf);

impl TempDb {
    pub fn new(tag: &str) -> Self {
        TempDb(std::env::temp_dir().join(format!("bq-{tag}-{}.db", unique())))
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for ext in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{ext}", self.0.display()));
        }
    }
}
