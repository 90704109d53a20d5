//! What the runtime did: [`Disposition`], [`Report`], [`Stats`].

use super::transport::TransportError;
use crate::extract::MissingState;
use babelqueue_core::envelope::{DeadLetterReason, Envelope};

/// What the runtime did with one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// The handler ran and succeeded.
    Succeeded,
    /// The idempotency guard skipped a duplicate: the handler did not run.
    Skipped,
    /// The handler failed; the message was put back with `attempts` incremented, after the
    /// [`RetryPolicy`](super::RetryPolicy)'s backoff.
    Retried {
        /// The new `attempts` value.
        attempts: u32,
    },
    /// The message was published to the dead-letter queue.
    DeadLettered {
        /// Why.
        reason: DeadLetterReason,
    },
    /// The message was dropped: failed at the limit with dead-lettering off, or an unknown
    /// URN under [`UnknownUrnStrategy::Delete`](super::UnknownUrnStrategy::Delete).
    Dropped,
    /// Unknown URN under [`UnknownUrnStrategy::Release`](super::UnknownUrnStrategy::Release): put back unchanged (its release
    /// count + 1) after [`App::release_delay`](super::App::release_delay).
    Released,
    /// Its id is in flight on another worker (lease mode, [`InFlight`](babelqueue_core::InFlight)):
    /// put back unchanged after [`App::in_flight_delay`](super::App::in_flight_delay),
    /// without counting an attempt.
    Deferred,
    /// The dedupe store could not answer (an error or [`App::store_timeout`](super::App::store_timeout)):
    /// put back unchanged after the store backoff, without counting an attempt.
    Requeued,
    /// The consumer stopped (its shutdown grace period ended) before the message could be
    /// settled: it was left in flight, where [`ListMaintenance::recover`](super::ListMaintenance::recover)
    /// finds it once this consumer is gone.
    Stranded,
}

/// One delivery's outcome, given to the [`App::on_delivery`](super::App::on_delivery) observer.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Report {
    /// The queue it was consumed from.
    pub queue: String,
    /// The decoded envelope (`None` for a poison body).
    pub envelope: Option<Envelope>,
    /// What happened.
    pub disposition: Disposition,
    /// Whether the original delivery was settled (acked, or atomically put back).
    pub acked: bool,
    /// Whether a handler failed (an error, a panic, or an unknown URN under
    /// [`UnknownUrnStrategy::Fail`](super::UnknownUrnStrategy::Fail)).
    pub failed: bool,
    /// Whether no handler was registered for its URN.
    pub unknown_urn: bool,
    /// The error, if any, with its whole cause chain (`top: cause: root cause`).
    pub error: Option<String>,
    /// The URN of the handler that ran (`None` when none ran: poison, unknown URN,
    /// recovered too often).
    pub urn: Option<String>,
    /// How long the handler ran, its idempotency guard included (`None` when no handler
    /// ran). Measured on tokio's clock.
    pub duration: Option<std::time::Duration>,
    /// The delivery's out-of-band headers (`traceparent`, …), when it had any.
    pub headers: Option<super::transport::Headers>,
}

/// Counts of what a [`drain`](super::App::drain) or [`run`](super::App::run_until) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Deliveries reserved and handled.
    pub processed: u64,
    /// Handler ran and succeeded.
    pub succeeded: u64,
    /// Duplicates skipped by the idempotency guard (acked, handler not run).
    pub skipped: u64,
    /// Handler failures (errors, panics, unknown URNs under `Fail`).
    pub failed: u64,
    /// Republished with `attempts + 1`.
    pub retried: u64,
    /// Published to the dead-letter queue (every reason).
    pub dead_lettered: u64,
    /// Of which poison bodies.
    pub poison: u64,
    /// Deliveries whose URN had no handler (whatever the strategy).
    pub unknown_urn: u64,
    /// Dropped (failed at the limit without dead-lettering, unknown URN deleted).
    pub dropped: u64,
    /// Unknown URNs released.
    pub released: u64,
    /// Deferred because their id was in flight elsewhere.
    pub deferred: u64,
    /// Put back because the dedupe store could not answer (no attempt counted).
    pub requeued: u64,
    /// Messages of dead consumers this consumer put back on the queue.
    pub recovered: u64,
    /// Deliveries settled (acked, or atomically put back on the queue).
    pub acked: u64,
    /// Deliveries left in flight (the consumer stopped before it could settle them).
    pub unacked: u64,
    /// Transport errors seen by the reserve loop (each followed by a backoff).
    pub transport_errors: u64,
    /// A drain only: messages it ended without, left in the in-flight lists of other
    /// consumers whose heartbeat had not expired when its wait for them ran out (see
    /// [`App::drain`](super::App::drain)); a consumer running once the heartbeat
    /// expired recovers them. Empty when nothing was left.
    pub left_in_flight: Vec<super::depth::HeldElsewhere>,
}

impl Stats {
    pub(crate) fn merge(&mut self, o: &Stats) {
        self.processed += o.processed;
        self.succeeded += o.succeeded;
        self.skipped += o.skipped;
        self.failed += o.failed;
        self.retried += o.retried;
        self.dead_lettered += o.dead_lettered;
        self.poison += o.poison;
        self.unknown_urn += o.unknown_urn;
        self.dropped += o.dropped;
        self.released += o.released;
        self.deferred += o.deferred;
        self.requeued += o.requeued;
        self.recovered += o.recovered;
        self.acked += o.acked;
        self.unacked += o.unacked;
        self.transport_errors += o.transport_errors;
        self.left_in_flight.extend(o.left_in_flight.iter().cloned());
    }

    pub(crate) fn record(&mut self, r: &Report) {
        self.processed += 1;
        match &r.disposition {
            Disposition::Succeeded => self.succeeded += 1,
            Disposition::Skipped => self.skipped += 1,
            Disposition::Retried { .. } => self.retried += 1,
            Disposition::DeadLettered { reason } => {
                self.dead_lettered += 1;
                if *reason == DeadLetterReason::Poison {
                    self.poison += 1;
                }
            }
            Disposition::Dropped => self.dropped += 1,
            Disposition::Released => self.released += 1,
            Disposition::Deferred => self.deferred += 1,
            Disposition::Requeued => self.requeued += 1,
            Disposition::Stranded => {}
        }
        if r.failed {
            self.failed += 1;
        }
        if r.unknown_urn {
            self.unknown_urn += 1;
        }
        if r.acked {
            self.acked += 1;
        } else {
            self.unacked += 1;
        }
    }
}

/// Whether a consumer is ready to work, for a readiness probe
/// ([`App::readiness`](super::App::readiness)).
///
/// A consumer started while its dedupe store is down does not exit: it starts, reports
/// itself not ready (here, in the `babelqueue_ready` gauge with feature `metrics`, and
/// with a `tracing` warning), keeps the messages it cannot check on the queue, and begins
/// work when the store answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Readiness {
    /// A [`run`](super::App::run_until) or [`drain`](super::App::drain) of this app is
    /// consuming (its consumer was started and it has not stopped).
    pub consuming: bool,
    /// The dedupe store answered the last guard call that needed it (`false` from a
    /// store failure or timeout until the next answer).
    pub store_available: bool,
}

impl Readiness {
    /// Consuming, with the store answering.
    pub fn is_ready(&self) -> bool {
        self.consuming && self.store_available
    }
}

/// [`App::drain`](super::App::drain) gave up: the transport kept failing for longer than
/// [`App::give_up_after`](super::App::give_up_after). In-flight messages were finished first.
///
/// Or it did not start: a handler needs shared state the router lacks (see
/// [`App::check_state`](super::App::check_state)); then `error` is a [`TransportError::Backend`] whose source is
/// the [`MissingState`], and nothing was reserved.
#[derive(Debug, thiserror::Error)]
#[error("{}", drain_error_message(error))]
pub struct DrainError {
    /// The last transport error.
    #[source]
    pub error: TransportError,
    /// What was done before giving up.
    pub stats: Stats,
}

fn drain_error_message(error: &TransportError) -> String {
    match missing_state(error) {
        Some(missing) => format!("drain did not start: {missing}"),
        None => format!("drain gave up after repeated transport failures: {error}"),
    }
}

fn missing_state(error: &TransportError) -> Option<&MissingState> {
    match error {
        TransportError::Backend(source) => source.downcast_ref::<MissingState>(),
        _ => None,
    }
}

impl DrainError {
    /// The shared state a handler needs and the router lacks, when that is why the
    /// drain did not start.
    pub fn missing_state(&self) -> Option<&MissingState> {
        missing_state(&self.error)
    }
}
