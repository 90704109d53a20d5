//! The consume runtime: an [`App`] over a [`Transport`].
//!
//! Per reserved message: bounds → decode → route by URN → handler → settle. Settlement is
//! one pure decision (what happened × attempts × policy → action) carried out by one
//! executor:
//!
//! | what happened | what the consumer does |
//! | --- | --- |
//! | handler ok, or duplicate skipped | ack |
//! | handler error, panic or timeout | `attempts + 1`, retried after an exponential backoff with jitter ([`RetryPolicy`]); at `max_attempts`, dead-lettered (`failed`) |
//! | handler error marked [`Permanent`] | dead-lettered (`failed`) at once |
//! | dedupe store unavailable or timed out | put back after the store backoff, no attempt counted, never dead-lettered for it; the consumer pauses while the store is down |
//! | id in flight on another worker (lease) | put back after [`App::in_flight_delay`], no attempt counted |
//! | unknown URN | the [`UnknownUrnStrategy`] (`Release` is capped by [`App::max_releases`]) |
//! | not an envelope, body over [`App::max_body_size`], unusable `meta.id` | dead-lettered as `poison`, bytes intact |
//! | broker fails while settling | retried with backoff until it succeeds; after the shutdown grace period, left in flight for recovery |
//! | recovered from dead consumers [`App::max_recoveries`] times | dead-lettered (`failed`) |
//!
//! Retries, deferrals and releases are delayed on the transport ([`Transport::requeue`]
//! with a delay; Redis keeps them in a sorted set `{<queue>}:delayed`), so no worker sits
//! waiting for them.
//!
//! - [`InMemoryTransport`]: in-process, the embedded default.
//! - `babelqueue_redis::RedisTransport` (feature `redis` of the facade): the reliable-queue
//!   list pattern shared by every SDK.
//!
//! # Crash recovery
//!
//! A reserved message stays in the consumer's in-flight state until it is settled. Each
//! [`App`] renews a heartbeat ([`App::heartbeat`]) and periodically recovers the in-flight
//! messages of consumers whose heartbeat expired ([`ListMaintenance::recover`]), so messages of
//! a consumer that crashed come back by themselves. [`App::requeue_processing`] moves
//! *everything* in flight back and is only safe when no consumer of the queue runs.
//!
//! # Lease mode and [`InFlight`](babelqueue_core::InFlight)
//!
//! A handler guarded in lease mode returns an error wrapping [`InFlight`](babelqueue_core::InFlight)
//! when another worker holds the id; the guard also records it for the runtime by type, so
//! any error type works. The message is put back unchanged after [`App::in_flight_delay`]
//! without counting a failed attempt: the next delivery either skips (the other worker
//! completed) or runs (it failed and released its claim).

mod app;
mod apply;
mod config;
mod ctx;
mod dead_letter;
mod depth;
mod errors;
mod execute;
pub(crate) mod json_text;
pub mod maintain;
mod memory;
pub mod metrics;
mod observe;
#[cfg(feature = "opentelemetry")]
pub mod otel;
mod report;
#[cfg(feature = "schema")]
mod schemas;
mod settle;
mod transport;
mod worker;

pub use app::{App, DrainError, EmptyQueueName, PublishError, UnknownUrnStrategy};
pub use dead_letter::{POISON_URN, poison_body, recover_poison};
pub use depth::{HeldElsewhere, QueueDepth};
pub use errors::{HandlerTimeout, Permanent, StoreTimeout, StoreUnavailable};
pub use execute::RELEASES_HEADER;
#[doc(hidden)]
pub use json_text::set_member as set_json_member;
pub use maintain::{ListMaintenance, Maintenance, Recovered};
pub use memory::InMemoryTransport;
pub use observe::publish_traced;
pub use report::{Disposition, Readiness, Report, Stats};
pub use settle::RetryPolicy;
pub use transport::{
    ConsumerEvent, ConsumerOptions, Delivery, EventSink, FRAME_KEY, Headers, Republish, Settled,
    Transport, TransportError, encode_element, is_frame_object, may_be_frame, unframe,
};
