//! The consume runtime: an [`App`] over a [`Transport`].
//!
//! Per reserved message, exactly SPEC section 4: decode → route by URN → handler → ack,
//! with the unknown-URN strategies, retries by republishing with `attempts + 1`,
//! dead-lettering to `<queue>.dlq` with a `dead_letter` block, and poison bodies
//! dead-lettered with their bytes intact (see [`poison_body`]). One bad message never
//! stops the loop; transport failures are retried with backoff.
//!
//! - [`InMemoryTransport`]: in-process, the embedded default.
//! - `babelqueue_redis::RedisTransport` (feature `redis` of the facade): the reliable-queue
//!   list pattern shared by every SDK.
//!
//! # Messages stranded in the processing list
//!
//! A reserved message sits in the queue's processing list until it is acked. If a worker
//! dies (crash, `kill -9`, lost connection during an ack), its in-flight messages stay
//! there and are not redelivered by themselves. Call [`App::requeue_processing`] (or
//! [`Transport::requeue_processing`]) when starting a worker, **before** any other worker
//! consumes that queue, to move them back to the head of the queue. A message that had
//! already been handled is then delivered again; the idempotency guard skips it.
//!
//! # Lease mode and [`InFlight`](crate::InFlight)
//!
//! A handler guarded in lease mode returns an error wrapping [`InFlight`](crate::InFlight)
//! when another worker holds the id. The runtime finds it anywhere in the error's source
//! chain (so wrap it with `#[from]` / `#[error(transparent)]`), does not count a failed
//! attempt, waits [`App::in_flight_delay`] and republishes the message unchanged (then
//! acks the original): the next delivery either skips (the other worker completed) or
//! runs (it failed and released its claim).

mod app;
mod dead_letter;
mod memory;
mod transport;

pub use app::{App, Disposition, DrainError, PublishError, Report, Stats, UnknownUrnStrategy};
pub use dead_letter::{POISON_URN, poison_body, recover_poison};
pub use memory::InMemoryTransport;
pub use transport::{
    Delivery, FRAME_KEY, Headers, Recovered, Transport, TransportError, encode_element, unframe,
};
