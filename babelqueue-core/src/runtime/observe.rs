//! The message span (fields after the OpenTelemetry messaging semantic conventions) and
//! the error text kept for a failure (the whole cause chain).

use tracing::field::Empty;

use super::transport::Delivery;
use crate::envelope::Envelope;

/// The value of `messaging.system` on every message span.
pub(crate) const MESSAGING_SYSTEM: &str = "babelqueue";

/// The span one delivery is processed in.
///
/// Named `babelqueue.message` for `tracing`; `otel.name` = `process <queue>` and
/// `otel.kind` = `consumer` for `tracing-opentelemetry`. Fields: the OpenTelemetry
/// messaging conventions (`messaging.system`, `messaging.destination.name`,
/// `messaging.operation.type` = `process`, `messaging.operation.name`,
/// `messaging.message.body.size`, and once decoded `messaging.message.id` = `meta.id`,
/// `messaging.message.conversation_id` = `trace_id`), plus the short `queue`, `urn`,
/// `meta.id`, `trace_id` and `attempts`.
///
/// With the `opentelemetry` feature, the frame's `traceparent` / `tracestate` headers
/// become the span's parent.
pub(crate) fn message_span(queue: &str, delivery: &Delivery) -> tracing::Span {
    let span = tracing::info_span!(
        "babelqueue.message",
        otel.name = %format_args!("process {queue}"),
        otel.kind = "consumer",
        messaging.system = MESSAGING_SYSTEM,
        messaging.destination.name = %queue,
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.message.body.size = delivery.body().len() as u64,
        messaging.message.id = Empty,
        messaging.message.conversation_id = Empty,
        queue = %queue,
        urn = Empty,
        "meta.id" = Empty,
        trace_id = Empty,
        attempts = Empty,
    );
    #[cfg(feature = "opentelemetry")]
    super::otel::set_parent(&span, delivery.headers());
    span
}

/// Records the decoded envelope's fields on the current message span.
pub(crate) fn record_envelope(envelope: &Envelope) {
    let span = tracing::Span::current();
    span.record("urn", envelope.urn());
    span.record("meta.id", envelope.meta.id.as_str());
    span.record("messaging.message.id", envelope.meta.id.as_str());
    span.record("trace_id", envelope.trace_id.as_str());
    span.record(
        "messaging.message.conversation_id",
        envelope.trace_id.as_str(),
    );
    span.record("attempts", envelope.attempts);
}

/// The error and its causes, `top: cause: root cause` (what a dead letter's `error` and a
/// [`Report`](super::Report)'s `error` keep). A cause whose text the previous one already
/// ends with (an error whose message repeats its source) is not repeated.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut last_len = out.len();
    let mut cause = error.source();
    while let Some(e) = cause {
        let text = e.to_string();
        let last = &out[out.len() - last_len..];
        if !text.is_empty() && !last.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
            last_len = text.len();
        }
        cause = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("root cause")]
    struct Root;

    #[derive(Debug, thiserror::Error)]
    #[error("db error")]
    struct Db(#[source] Root);

    #[derive(Debug, thiserror::Error)]
    #[error("postgres store")]
    struct Top(#[source] Db);

    /// An error whose message repeats its source (bad style, but it exists).
    #[derive(Debug, thiserror::Error)]
    #[error("wrapper: {0}")]
    struct Repeats(#[source] Db);

    #[test]
    fn the_whole_chain_is_kept_once() {
        assert_eq!(
            error_chain(&Top(Db(Root))),
            "postgres store: db error: root cause"
        );
        assert_eq!(error_chain(&Root), "root cause");
        assert_eq!(
            error_chain(&Repeats(Db(Root))),
            "wrapper: db error: root cause"
        );
    }
}
