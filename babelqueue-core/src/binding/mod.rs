//! The family's broker bindings as pure code: how an envelope is projected onto each
//! broker's native message on produce, and how `attempts` is reconciled on consume.
//!
//! In every binding the message body is the envelope, byte for byte (SPEC §7). What a
//! binding adds is a native, routable *view* of it and a rule for `attempts`; both are
//! locked by the conformance manifest's blocks of the same names, which
//! `tests/conformance.rs` runs against these modules. No module here depends on a broker
//! client: each returns neutral Rust values a transport converts to its client's types.
//!
//! | module | broker | projection | attempts on consume | dead letters |
//! | --- | --- | --- | --- | --- |
//! | [`amqp`] | RabbitMQ (AMQP 0-9-1) | `type`, `correlation_id`, `message_id`, `app_id`, persistent; typed `x-*` headers | the body | `<queue>.dlq` |
//! | [`sqs`] | Amazon SQS | `bq-*` `MessageAttributes` (String / Number) | `max(body, ApproximateReceiveCount − 1)` | `<queue>-dlq` (`-dlq.fifo`) |
//! | [`kafka`] | Apache Kafka | `bq-*` string headers, timestamp = `created_at` | the `bq-attempts` header (authoritative) | `<topic>.dlq`; retry tiers `<topic>.retry.<n>` |
//! | [`asb`] | Azure Service Bus | `Subject`, `CorrelationId`, `MessageId`; typed `bq-*` properties | `max(body, DeliveryCount − 1)` | — |
//! | [`pulsar`] | Apache Pulsar | `bq-*` string properties | `max(body, RedeliveryCount)` | — |
//! | [`artemis`] | ActiveMQ Artemis | `x-opt-jms-type`, `correlation-id`, `creation-time`; `bq_*` string properties | `max(body, delivery-count)` | — |
//! | [`redis`] | Redis lists | none: the element is the envelope (or a header frame) | the body | `<queue>.dlq` |
//!
//! Each module has `project` (or the binding's name for it) over a decoded [`Envelope`],
//! a lenient `project_body` over raw bytes (`None` for a body that is no envelope: poison
//! is published without a projection), and `reconcile_attempts`. [`BrokerUrl`] parses a
//! `BROKER_URL` as the other SDKs write it.
//!
//! ```
//! use babelqueue_core::binding::{amqp, kafka, sqs};
//! use babelqueue_core::Envelope;
//!
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
//! assert_eq!(amqp::project(&env).kind, "urn:babel:payments:charge");
//! assert_eq!(sqs::message_attributes(&env)[0].0, "bq-job");
//! assert_eq!(kafka::headers(&env)[0].0, "bq-job");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Envelope`]: crate::Envelope

pub mod amqp;
pub mod artemis;
pub mod asb;
pub mod kafka;
pub mod pulsar;
pub mod redis;
pub mod sqs;
mod url;

pub use url::{AmqpUrl, BrokerUrl, BrokerUrlError, KafkaUrl, SCHEMES, SqsUrl};
