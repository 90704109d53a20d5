//! # babelqueue-amqp
//!
//! BabelQueue on RabbitMQ (AMQP 0-9-1): [`AmqpTransport`], the family's RabbitMQ binding
//! for the runtime's [`App`](babelqueue_runtime::App). A message produced here is
//! what the Go, Python, PHP, Java, Node and .NET SDKs produce: the envelope as the body,
//! byte for byte, on the default exchange with routing key = queue, persistent, with the
//! binding's projection onto AMQP properties and natively typed headers; queues are
//! declared as they declare them (`durable`, no arguments), so consumers of every SDK
//! share a queue.
//!
//! Built on [`lapin`] (chosen over `amqprs`: a per-publish publisher-confirm future,
//! actively maintained, tokio through its runtime abstraction; see the README).
//!
//! ```no_run
//! use babelqueue_amqp::AmqpTransport;
//! use babelqueue_runtime::Transport;
//!
//! # async fn demo() -> Result<(), babelqueue_runtime::TransportError> {
//! let t = AmqpTransport::open("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
//! t.publish_raw("jobs", br#"{"job":"urn:babel:jobs:run","data":{}}"#.to_vec()).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod acks;
mod headers;
mod names;
mod projection;
mod transport;

pub use headers::PROJECTION_HEADERS;
pub use headers::out_of_band;
pub use names::{DELAY_QUEUE_GRACE, MAX_DELAY, dead_letter_queue, delay_bucket, delay_queue};
pub use transport::{AmqpTransport, PREFETCH_PER_WORKER};

/// The AMQP client this transport is built on (to inspect queues or messages yourself).
pub use lapin;

/// The code blocks of `README.md`, compiled as doctests so the README cannot drift.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
