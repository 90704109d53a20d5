//! # babelqueue-sqs
//!
//! BabelQueue on Amazon SQS: [`SqsTransport`], the family's SQS binding for the runtime's
//! [`App`](babelqueue_runtime::App). A message produced here is what the Go,
//! Python, PHP, Java, Node and .NET SDKs produce on SQS: the envelope as the body, byte
//! for byte, with the binding's projection in `MessageAttributes`; dead letters go to the
//! family's `<queue>-dlq`.
//!
//! Built on the official AWS SDK (`aws-sdk-sqs`, `aws-config` with the latest behaviour
//! version): credentials, regions, retries and endpoints as every AWS tool reads them.
//!
//! ```no_run
//! use babelqueue_sqs::SqsTransport;
//! use babelqueue_runtime::Transport;
//!
//! # async fn demo() -> Result<(), babelqueue_runtime::TransportError> {
//! let t = SqsTransport::connect("sqs://us-east-1?endpoint=http://127.0.0.1:4566").await?;
//! t.publish_raw("jobs", br#"{"job":"urn:babel:jobs:run","data":{}}"#.to_vec()).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod attributes;
mod batch;
mod names;
mod transport;

pub use attributes::PROJECTION_ATTRIBUTES;
pub use names::{InvalidQueueName, MAX_NAME_LEN, dead_letter_queue, validate_queue_name};
pub use transport::{
    DEFAULT_VISIBILITY, MAX_DELAY, MAX_VISIBILITY, MAX_WAIT, NOT_BEFORE, SqsTransport,
};

/// The AWS SDK for SQS this transport is built on (to inspect queues or messages yourself).
pub use aws_sdk_sqs;
