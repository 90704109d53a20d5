//! # babelqueue-kafka
//!
//! BabelQueue on Apache Kafka: [`KafkaTransport`], the family's Kafka binding for the
//! runtime's [`App`](babelqueue_runtime::App). A record produced here is what the Go,
//! Python, PHP, Java, Node and .NET SDKs produce: topic = queue, the envelope as the record
//! value byte for byte, the binding's UTF-8 headers (`bq-job`, `bq-trace-id`,
//! `bq-message-id`, `bq-schema-version`, `bq-source-lang`, `bq-attempts`) and record
//! timestamp = `meta.created_at` ([`babelqueue_core::binding::kafka`]); on consume the
//! `bq-attempts` header is authoritative.
//!
//! | what | how |
//! | --- | --- |
//! | produce | idempotent producer (`enable.idempotence`), `acks=all`; every publish waits for the broker's acknowledgement |
//! | consume | a consumer group per queue (default group `babelqueue`, or the URL's `?group=`), partitions handled concurrently, and several messages of one partition at once (the App's `concurrency`) |
//! | ack | the offset after a partition's settled prefix is stored ([`PartitionOffsets`]): an offset is never committed past a message that is still running; librdkafka commits what is stored every [`commit_interval`](KafkaBuilder::commit_interval), on a rebalance and on close |
//! | crash, rebalance | the group's: the partitions' new owners read from the last commit; what the dead consumer settled after it is delivered again and the idempotency guard absorbs it |
//! | retry after a delay | the record (attempts + 1 in the body and in `bq-attempts`) is parked on the smallest retry tier `<queue>.retry.<n>` covering the delay, with `bq-delay` and `bq-original-topic` (the Python SDK's `kafka_retry` design), then the original is acked; the partition is not blocked. A re-inject consumer (group `babelqueue-retry-reinject`, started with the consumer) moves it back when due |
//! | put back now | produced again to the queue, then acked |
//! | dead letter | the runtime's publish to `<queue>.dlq` with the family's `dead_letter` block |
//!
//! Built on [`rdkafka`] (librdkafka), chosen over the pure-Rust clients: `rskafka` has no
//! consumer groups, and the `kafka` crate has no group membership (no rebalance), while
//! librdkafka is the client the Python (confluent-kafka), Go, PHP and .NET SDKs of the
//! family use, with the idempotent producer and the group protocol they rely on. Its C
//! sources are built by the crate (`./configure` and `make`, no cmake): Debian 12's
//! `librdkafka-dev` is 2.0.2, older than the 2.12.1 that `rdkafka-sys`'s `dynamic-linking`
//! requires. That build is why the facade's `kafka` feature is not in `full`.
//!
//! ```no_run
//! use babelqueue_kafka::KafkaTransport;
//! use babelqueue_runtime::App;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let t = KafkaTransport::new("kafka://127.0.0.1:9092")?;
//! let app = App::new(t).queue("payments").concurrency(8).route_sync(
//!     "urn:babel:payments:charge",
//!     |env: &babelqueue_core::Envelope| println!("charge {:?}", env.data),
//! );
//! app.publish("urn:babel:payments:charge", &serde_json::json!({"amount": 1})).await?;
//! app.drain().await?;
//! # Ok(()) }
//! ```
//!
//! Retry tiers: with the default tiers (5 s, 30 s, 5 min, 30 min) a retry comes back after
//! the smallest tier at least as long as the runtime's backoff (never earlier, except past
//! the largest tier, where it waits that tier). The Python SDK picks the tier by attempt
//! count instead; both write and read the same topics and headers, so either SDK's
//! re-inject consumer moves the other's records.
#![warn(missing_docs)]

mod headers;
mod offsets;
mod transport;

pub use headers::{PROJECTION_HEADERS, RecordMeta, out_of_band, record_meta};
pub use offsets::PartitionOffsets;
pub use transport::{KafkaBuilder, KafkaTransport};

/// The Kafka client this transport is built on (to read topics or offsets yourself).
pub use rdkafka;

/// The code blocks of `README.md`, compiled as doctests so the README cannot drift.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
