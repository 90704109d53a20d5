//! # babelqueue
//!
//! BabelQueue for Rust: read and write the canonical polyglot queue envelope shared with
//! the Go, Python, PHP, Java, Node and .NET SDKs, and make consumers idempotent on
//! `meta.id` with `#[idempotent]`.
//!
//! This is the facade crate: it re-exports [`babelqueue_core`] and, behind cargo
//! features, the backends (`redis`, `postgres`, `sqlite`, `amqp`, `sqs`).
//!
//! ## A note on `serde_json` features
//!
//! The wire envelope keeps the key order of `data` and round-trips floats exactly, so this
//! crate turns on `serde_json`'s `preserve_order` and `float_roundtrip` features. Cargo
//! unifies features across a build: in an application that depends on babelqueue,
//! **every** `serde_json::Map` keeps insertion order (an `IndexMap` instead of a
//! `BTreeMap`, so maps no longer iterate sorted) and float parsing is the exact, slightly
//! slower algorithm. Code that relied on sorted map iteration should sort explicitly.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use babelqueue_core::*;

/// The seven broker bindings' projections and attempts rules (`babelqueue_core::binding`).
#[doc(inline)]
pub use babelqueue_core::binding;

#[doc(inline)]
pub use babelqueue_macros::idempotent;

#[doc(inline)]
pub use babelqueue_macros::handler;

/// What a handler author needs, in one import: the envelope, the extractors, the guards,
/// the store traits and the in-memory store, the router and the runtime's [`App`], and
/// the `#[handler]` / `#[idempotent]` macros.
///
/// ```
/// use std::sync::LazyLock;
/// use babelqueue::prelude::*;
///
/// static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
///
/// #[derive(serde::Deserialize)]
/// struct Payment { amount: u64 }
///
/// #[handler("urn:babel:payments:charge")]
/// #[idempotent(store = STORE)]
/// fn charge(Json(p): Json<Payment>, env: &Envelope, attempts: Attempts) -> Result<(), BoxError> {
///     println!("charging {} for {} (attempt {})", p.amount, env.meta.id, attempts.0 + 1);
///     Ok(())
/// }
///
/// let router = Router::new().register(charge {});
/// assert_eq!(router.urns().collect::<Vec<_>>(), ["urn:babel:payments:charge"]);
/// ```
pub mod prelude {
    pub use babelqueue_core::prelude::*;
    #[doc(no_inline)]
    pub use babelqueue_macros::{handler, idempotent};
}

/// The Redis backend: [`RedisStore`](babelqueue_redis::RedisStore) (feature `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use babelqueue_redis as redis;

/// The PostgreSQL backend: [`PostgresStore`](babelqueue_postgres::PostgresStore)
/// (feature `postgres`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use babelqueue_postgres as postgres;

/// The embedded SQLite backend: [`SqliteStore`](babelqueue_sqlite::SqliteStore)
/// (feature `sqlite`).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use babelqueue_sqlite as sqlite;

/// The RabbitMQ (AMQP 0-9-1) transport: [`AmqpTransport`](babelqueue_amqp::AmqpTransport)
/// (feature `amqp`).
#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub use babelqueue_amqp as amqp;

/// The Apache Kafka transport: [`KafkaTransport`](babelqueue_kafka::KafkaTransport)
/// (feature `kafka`; not in `full`: it builds librdkafka's C sources).
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub use babelqueue_kafka as kafka;
/// The Amazon SQS transport: [`SqsTransport`](babelqueue_sqs::SqsTransport) (feature `sqs`).
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub use babelqueue_sqs as sqs;

/// The code blocks of `README.md`, compiled (and run, where they need no server) as
/// doctests so the README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
