//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`).
//!
//! The consume runtime emits these; install any `metrics` recorder (Prometheus,
//! OpenTelemetry, StatsD…) to collect them. Without the `metrics` feature nothing is
//! recorded and the `metrics` crate is not a dependency; the names below stay defined so
//! dashboards can refer to them.
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `babelqueue_deliveries_total` | counter | `queue`, `urn`, `outcome` | deliveries handled, by what became of them |
//! | `babelqueue_handler_duration_seconds` | histogram | `queue`, `urn` | how long the handler ran (its idempotency guard included) |
//! | `babelqueue_retries_total` | counter | `queue`, `urn` | failures put back for another attempt |
//! | `babelqueue_dead_letters_total` | counter | `queue`, `reason` | messages dead-lettered, by reason (`failed`, `unknown_urn`, `poison`) |
//! | `babelqueue_in_flight` | gauge | `queue` | deliveries this process is handling right now |
//! | `babelqueue_queue_depth` | gauge | `queue`, `state` | messages in the queue, `state` = `ready`, `delayed` or `in_flight` (every consumer), sampled every heartbeat interval |
//! | `babelqueue_store_call_duration_seconds` | histogram | `store`, `op` | dedupe-store call latency, through `Metered` |
//! | `babelqueue_store_errors_total` | counter | `store`, `op` | dedupe-store calls that failed, through `Metered` |
//! | `babelqueue_ready` | gauge | `queue` | 1 while the consumer is consuming and its dedupe store answers, else 0 ([`App::readiness`](super::App::readiness)) |
//!
//! Label values: `outcome` is one of `succeeded`, `skipped`, `retried`, `dead_lettered`,
//! `dropped`, `released`, `deferred`, `requeued`, `stranded` (see
//! [`Disposition`](super::Disposition)); `urn` is the URN of the handler that ran, or empty
//! when none ran (poison, unknown URN: a URN from the wire never becomes a label, so a bad
//! producer cannot explode the label set); `op` is one of `seen`, `remember`, `forget`,
//! `claim`, `complete`, `release`.
//!
//! The queue depth needs [`Transport::depth`] (the in-memory
//! transport has it; a transport without it reports no depth).
//!
//! ```
//! # #[cfg(feature = "metrics")] {
//! use babelqueue_core::InMemoryStore;
//! use babelqueue_runtime::metrics::Metered;
//!
//! // Store calls timed under `store="memory"`.
//! let store = Metered::new(InMemoryStore::new(), "memory");
//! assert!(!babelqueue_core::Store::seen(&store, "id-1").unwrap());
//! # }
//! ```

#[cfg(feature = "metrics")]
mod metered;
#[cfg(feature = "metrics")]
pub use metered::Metered;

use super::report::Report;
use super::transport::Transport;

/// Counter `{queue, urn, outcome}`: deliveries handled.
pub const DELIVERIES_TOTAL: &str = "babelqueue_deliveries_total";
/// Histogram `{queue, urn}`, seconds: handler run time (its guard included).
pub const HANDLER_DURATION_SECONDS: &str = "babelqueue_handler_duration_seconds";
/// Counter `{queue, urn}`: failures retried.
pub const RETRIES_TOTAL: &str = "babelqueue_retries_total";
/// Counter `{queue, reason}`: messages dead-lettered.
pub const DEAD_LETTERS_TOTAL: &str = "babelqueue_dead_letters_total";
/// Gauge `{queue}`: deliveries this process is handling.
pub const IN_FLIGHT: &str = "babelqueue_in_flight";
/// Gauge `{queue, state}`: messages in the queue by state (`ready`, `delayed`, `in_flight`).
pub const QUEUE_DEPTH: &str = "babelqueue_queue_depth";
/// Histogram `{store, op}`, seconds: dedupe-store call latency (through `Metered`).
pub const STORE_CALL_DURATION_SECONDS: &str = "babelqueue_store_call_duration_seconds";
/// Counter `{store, op}`: dedupe-store calls that failed (through `Metered`).
pub const STORE_ERRORS_TOTAL: &str = "babelqueue_store_errors_total";
/// Gauge `{queue}`: 1 while the consumer is ready (consuming, its dedupe store
/// answering), 0 otherwise (see [`App::readiness`](super::App::readiness)).
pub const READY: &str = "babelqueue_ready";

/// Sets the readiness gauge of `queue`.
#[cfg_attr(not(feature = "metrics"), inline(always))]
pub(crate) fn ready(queue: &str, ready: bool) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!(READY, "queue" => queue.to_owned()).set(if ready { 1.0 } else { 0.0 });
    #[cfg(not(feature = "metrics"))]
    let _ = (queue, ready);
}

/// Records one settled delivery.
#[cfg_attr(not(feature = "metrics"), inline(always))]
pub(crate) fn delivery(report: &Report) {
    #[cfg(feature = "metrics")]
    {
        use super::report::Disposition;

        let queue = report.queue.clone();
        let urn = report.urn.clone().unwrap_or_default();
        let outcome = match &report.disposition {
            Disposition::Succeeded => "succeeded",
            Disposition::Skipped => "skipped",
            Disposition::Retried { .. } => "retried",
            Disposition::DeadLettered { .. } => "dead_lettered",
            Disposition::Dropped => "dropped",
            Disposition::Released => "released",
            Disposition::Deferred => "deferred",
            Disposition::Requeued => "requeued",
            Disposition::Stranded => "stranded",
        };
        if let Some(d) = report.duration {
            ::metrics::histogram!(HANDLER_DURATION_SECONDS, "queue" => queue.clone(), "urn" => urn.clone())
                .record(d.as_secs_f64());
        }
        match &report.disposition {
            Disposition::Retried { .. } => {
                ::metrics::counter!(RETRIES_TOTAL, "queue" => queue.clone(), "urn" => urn.clone())
                    .increment(1);
            }
            Disposition::DeadLettered { reason } => {
                let reason = reason.as_str().to_owned();
                ::metrics::counter!(DEAD_LETTERS_TOTAL, "queue" => queue.clone(), "reason" => reason)
                    .increment(1);
            }
            _ => {}
        }
        ::metrics::counter!(DELIVERIES_TOTAL, "queue" => queue, "urn" => urn, "outcome" => outcome)
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = report;
}

/// Holds the `babelqueue_in_flight` gauge up while a delivery is handled (also when the
/// handling is cancelled).
pub(crate) struct InFlightGauge {
    #[cfg(feature = "metrics")]
    gauge: ::metrics::Gauge,
}

impl InFlightGauge {
    #[cfg_attr(not(feature = "metrics"), inline(always))]
    pub(crate) fn enter(queue: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            let gauge = ::metrics::gauge!(IN_FLIGHT, "queue" => queue.to_owned());
            gauge.increment(1.0);
            InFlightGauge { gauge }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = queue;
            InFlightGauge {}
        }
    }
}

#[cfg(feature = "metrics")]
impl Drop for InFlightGauge {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

/// Samples the queue depth into `babelqueue_queue_depth` (nothing when the transport has
/// no depth, or without the `metrics` feature).
pub(crate) async fn sample_depth(transport: &dyn Transport, queue: &str) {
    #[cfg(feature = "metrics")]
    match transport.depth(queue).await {
        Ok(d) => {
            for (state, n) in [
                ("ready", d.ready),
                ("delayed", d.delayed),
                ("in_flight", d.in_flight),
            ] {
                ::metrics::gauge!(QUEUE_DEPTH, "queue" => queue.to_owned(), "state" => state)
                    .set(n as f64);
            }
        }
        Err(super::transport::TransportError::Unsupported(_)) => {}
        Err(error) => tracing::debug!(%error, "sampling the queue depth failed"),
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (transport, queue);
}
