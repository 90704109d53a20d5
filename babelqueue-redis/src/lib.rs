//! # babelqueue-redis
//!
//! The Redis backend of BabelQueue for Rust: [`RedisStore`], the shared seen-set in the
//! layout every BabelQueue SDK uses (`bq:idemp:<meta.id>` = `1`), with the in-flight
//! lease mode on top. See [`store`](crate::RedisStore) for the exact layout and what
//! other SDKs see.
//!
//! [`RedisTransport`] is the queue: the reliable-list pattern every SDK shares (`RPUSH` to
//! produce), with one processing list per consumer, heartbeats, crash recovery of dead
//! consumers' lists and a delayed set for retries, all in Lua scripts that touch one Redis
//! Cluster slot (every key of a queue is tagged `{<queue>}`; see [`keys`]). With the
//! `cluster` feature both run on a Redis Cluster (`RedisTransport::open_cluster`,
//! [`RedisConnection`]).
//!
//! ```no_run
//! use babelqueue_core::{Guard, Envelope};
//! use babelqueue_redis::RedisStore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379/0").await?;
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
//! Guard::new(&store).run_async(&env, async { Ok::<(), babelqueue_redis::RedisStoreError>(()) }).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod conn;
pub mod keys;
mod scripts;
mod store;
mod transport;

pub use conn::{RedisConnection, install_crypto_provider};
pub use keys::{
    consumer_processing_list, consumers_registry, delayed_set, hash_slot, heartbeat_key,
    processing_list, recoveries_hash,
};
pub use store::{
    DEFAULT_PREFIX, FENCE_RETENTION, LEASE_VALUE_PREFIX, RedisStore, RedisStoreBuilder,
    RedisStoreError, fence_key,
};
pub use transport::RedisTransport;

/// The Lua of the transport's batch reserve and batch ack, exactly as it sends them: for
/// tools that put the same work on a server without the runtime (`babelqueue-bench
/// --bare`, the server's ceiling for the consumer's commands). Not a stable API.
#[doc(hidden)]
pub mod batch_scripts {
    pub use crate::scripts::{ACK_MANY_SOURCE, RESERVE_MANY_SOURCE};
}

/// The `redis` client crate this backend is built on (to build a [`redis::Client`] with
/// custom TLS certificates for [`RedisStore::from_client`], or share a connection).
pub use redis;
