//! # babelqueue
//!
//! BabelQueue for Rust: read and write the canonical polyglot queue envelope shared with
//! the Go, Python, PHP, Java, Node and .NET SDKs, and make consumers idempotent on
//! `meta.id` with `#[idempotent]`: a redelivered payment is never charged twice.
//!
//! This is the facade crate: it re-exports [`babelqueue_core`] (the envelope, the guard,
//! the stores' traits, the in-memory store, the bindings), [`babelqueue_runtime`] (the
//! consume runtime, the router and its extractors, the outbox, redrive) and, behind cargo
//! features, the test kit and the backends (`babelqueue::redis`, `postgres`, `sqlite`, `amqp`, `sqs`,
//! `kafka`). The [`guide`] has a chapter for each task.
//!
//! ## Quick start
//!
//! A typed handler, made idempotent on `meta.id` with an in-memory store, run by an
//! [`App`] over the in-memory transport (no server). The same payment
//! delivered twice is charged once:
//!
//! ```
//! use babelqueue::prelude::*;
//!
//! #[derive(serde::Deserialize)]
//! struct Payment { payment_id: String, amount: u64 }
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error("card declined")]
//! struct Declined;
//!
//! #[handler("urn:babel:payments:charge")]
//! #[idempotent(store = store)]
//! async fn charge(
//!     Json(payment): Json<Payment>,
//!     store: State<InMemoryStore>,
//!     env: &Envelope,
//! ) -> Result<(), Declined> {
//!     println!("charging {} for {}", payment.amount, payment.payment_id);
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // The runtime reports retries, dead letters and store outages through `tracing`:
//!     // without a subscriber they happen silently. Install one first.
//!     tracing_subscriber::fmt().init();
//!
//!     let app = App::new(InMemoryTransport::new())
//!         .queue("payments")
//!         .state(InMemoryStore::new()) // in production: a RedisStore, PostgresStore, …
//!         .register(charge {});
//!
//!     let payment = Envelope::new(
//!         "urn:babel:payments:charge",
//!         serde_json::json!({"payment_id": "pay_7f3a", "amount": 4200}),
//!     )?;
//!     app.publish_envelope(&payment).await?;
//!     app.publish_envelope(&payment).await?; // a redelivery: the same meta.id
//!
//!     let stats = app.drain().await?; // `run()` consumes until Ctrl-C / SIGTERM
//!     assert_eq!((stats.succeeded, stats.skipped), (1, 1));
//!     Ok(())
//! }
//! ```
//!
//! On a broker, replace the transport (`babelqueue::redis::RedisTransport::connect(url)`,
//! `babelqueue::amqp::AmqpTransport::open(url)`, …) and the store; see the guide's
//! [brokers](guide::brokers) and [stores](guide::stores) chapters.
//!
//! ## Cargo features
//!
//! No feature is on by default: the envelope, the guard, `#[idempotent]`, the in-memory
//! store and the consume runtime need none.
//!
//! | feature | what it turns on |
//! | --- | --- |
//! | `redis` | `babelqueue::redis`: the Redis store (`RedisStore`) and transport (`RedisTransport`) |
//! | `postgres` | `babelqueue::postgres`: the PostgreSQL store, transactional guard and outbox |
//! | `sqlite` | `babelqueue::sqlite`: the embedded SQLite store, transactional guard and outbox |
//! | `amqp` | `babelqueue::amqp`: the RabbitMQ (AMQP 0-9-1) transport |
//! | `sqs` | `babelqueue::sqs`: the Amazon SQS transport (not in `full`: the AWS SDK adds about 90 crates to a cold build) |
//! | `kafka` | `babelqueue::kafka`: the Apache Kafka transport (not in `full`: it builds librdkafka's C sources) |
//! | `full` | `redis`, `postgres`, `sqlite` and `amqp` |
//! | `redis-cluster` | `redis` with Redis Cluster (`RedisTransport::open_cluster`) |
//! | `rustls` | TLS (rustls) for the enabled network backends: `rediss://`, `amqps://`, PostgreSQL `sslmode` |
//! | `testing` | the generic store test suite and fault kit (`testing`, `store_suite!`) |
//! | `metrics` | counters, gauges and histograms through the `metrics` facade, and the `Metered` store wrapper |
//! | `opentelemetry` | a message's `traceparent` header becomes its span's parent; publishes inject it |
//! | `schema` | payload schemas per URN (`schema`): JSON Schema (draft-07) on `data` |
//! | `gdpr` | the reference AES-256-GCM cipher (`gdpr::AesGcmCipher`) for personal data sealed field by field (the `gdpr` module itself needs no feature) |
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

// The contract: the envelope, keys, stores, the guard, the bindings.
#[cfg(feature = "schema")]
#[cfg_attr(docsrs, doc(cfg(feature = "schema")))]
#[doc(inline)]
pub use babelqueue_core::schema;
#[doc(inline)]
pub use babelqueue_core::{
    AsyncFingerprintStore, AsyncLeaseStore, AsyncStore, BoxError, BoxFuture, Data, DeadLetter,
    DeadLetterReason, DecodeError, DedupeKey, Envelope, EnvelopeError, Fingerprint,
    FingerprintStore, Guard, Guarded, InFlight, InMemoryStore, IntoHandlerError, LeaseStore, Meta,
    Namespace, Outcome, PayloadMismatch, Store, StoreUnavailable, handler_error_from,
};
#[doc(inline)]
pub use babelqueue_core::{
    binding, dyn_store, envelope, fingerprint, gdpr, guard, hooks, key, lease, memory, namespace,
    pipelined, retention, store, store_error, txn,
};

// The consume runtime: the app, the router and its extractors, what runs beside it.
#[doc(inline)]
pub use babelqueue_runtime::{
    App, Attempts, FromEnvelope, HandlerError, InMemoryTransport, Json, Permanent, RetryPolicy,
    Router, State, Transport, TransportError, TypedHandler,
};
#[doc(inline)]
pub use babelqueue_runtime::{extract, handler, outbox, redrive, replay};

/// The consume runtime (`babelqueue_runtime`): [`App`], the [`Transport`] trait, the
/// in-memory transport, settlement, maintenance, metrics and tracing.
pub use babelqueue_runtime as runtime;

/// What the code generated by the macros names. Not public API.
#[doc(hidden)]
pub use babelqueue_runtime::__private;

/// The test kit (`babelqueue_testing`, feature `testing`): the generic store test suite,
/// the cross-process lease races, the fault kit.
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use babelqueue_testing as testing;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
#[doc(inline)]
pub use babelqueue_testing::store_suite;

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
    #[doc(no_inline)]
    pub use babelqueue_macros::{handler, idempotent};
    pub use babelqueue_runtime::prelude::*;
}

/// The Redis backend: [`RedisStore`](babelqueue_redis::RedisStore) (feature `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use babelqueue_redis as redis;

/// The PostgreSQL backend: [`PostgresStore`](babelqueue_postgres::PostgresStore)
/// (feature `postgres`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use babelqueue_postgres as postgres;

/// The embedded SQLite backend: [`SqliteStore`](babelqueue_sqlite::SqliteStore)
/// (feature `sqlite`).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
#[doc(inline)]
pub use babelqueue_sqlite as sqlite;

/// The RabbitMQ (AMQP 0-9-1) transport: [`AmqpTransport`](babelqueue_amqp::AmqpTransport)
/// (feature `amqp`).
#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
#[doc(inline)]
pub use babelqueue_amqp as amqp;

/// The Apache Kafka transport: [`KafkaTransport`](babelqueue_kafka::KafkaTransport)
/// (feature `kafka`; not in `full`: it builds librdkafka's C sources).
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
#[doc(inline)]
pub use babelqueue_kafka as kafka;

/// The Amazon SQS transport: [`SqsTransport`](babelqueue_sqs::SqsTransport) (feature `sqs`).
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
#[doc(inline)]
pub use babelqueue_sqs as sqs;

/// The guide: one chapter per task, each a page of `docs/` in the repository. Their
/// code blocks are compiled as doctests.
pub mod guide {
    #[doc = include_str!("../docs/handlers.md")]
    pub mod handlers {}
    #[doc = include_str!("../docs/consuming.md")]
    pub mod consuming {}
    #[doc = include_str!("../docs/stores.md")]
    pub mod stores {}
    #[doc = include_str!("../docs/failures-and-retries.md")]
    pub mod failures_and_retries {}
    #[doc = include_str!("../docs/lease-mode.md")]
    pub mod lease_mode {}
    #[doc = include_str!("../docs/fleets.md")]
    pub mod fleets {}
    #[doc = include_str!("../docs/replay.md")]
    pub mod replay {}
    #[doc = include_str!("../docs/outbox.md")]
    pub mod outbox {}
    #[doc = include_str!("../docs/schemas.md")]
    pub mod schemas {}
    #[doc = include_str!("../docs/personal-data.md")]
    #[cfg(feature = "gdpr")]
    #[cfg_attr(docsrs, doc(cfg(feature = "gdpr")))]
    pub mod personal_data {}
    #[doc = include_str!("../docs/observability.md")]
    pub mod observability {}
    #[doc = include_str!("../docs/brokers.md")]
    pub mod brokers {}
    #[doc = include_str!("../docs/cli.md")]
    pub mod cli {}
    #[doc = include_str!("../docs/tls.md")]
    pub mod tls {}
    #[doc = include_str!("../docs/idempotency-deeper.md")]
    pub mod idempotency_deeper {}
    #[doc = include_str!("../docs/examples.md")]
    pub mod examples {}
}

/// The code blocks of `README.md`, compiled (and run, where they need no server) as
/// doctests so the README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
