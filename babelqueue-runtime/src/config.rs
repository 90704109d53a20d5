//! The consumer's settings ([`Config`]), shared by the runtime's layers below
//! [`App`](super::App).

use std::sync::Arc;
use std::time::Duration;

use super::report::Report;
use super::settle::{RetryPolicy, UnknownUrnStrategy};

pub(crate) type Observer = Arc<dyn Fn(&Report) + Send + Sync>;

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub queue: String,
    pub concurrency: usize,
    /// Messages one worker holds at once (`App::batch`); `None`: the transport's
    /// `batch_hint`.
    pub batch: Option<usize>,
    pub retry: RetryPolicy,
    pub unknown_urn: UnknownUrnStrategy,
    pub dead_letter: bool,
    pub dead_letter_queue: Option<String>,
    pub dead_letter_suffix: String,
    pub poll_timeout: Duration,
    pub in_flight_delay: Duration,
    pub release_delay: Duration,
    pub max_releases: u32,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub store_backoff_min: Duration,
    pub store_backoff_max: Duration,
    pub give_up_after: Duration,
    pub max_body_size: usize,
    pub handler_timeout: Option<Duration>,
    pub store_timeout: Duration,
    pub shutdown_grace: Duration,
    pub heartbeat_interval: Duration,
    pub heartbeat_ttl: Duration,
    pub recovery_interval: Duration,
    pub max_recoveries: u32,
    /// Payload schemas checked on consume (`App::validate_on_consume`): an invalid payload
    /// is dead-lettered at once.
    #[cfg(feature = "schema")]
    pub consume_schemas: Option<Arc<babelqueue_core::schema::Schemas>>,
    /// `App::validate_on_consume` was asked for.
    #[cfg(feature = "schema")]
    pub validate_on_consume: bool,
}
