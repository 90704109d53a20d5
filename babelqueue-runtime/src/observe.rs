//! The message span (fields after the OpenTelemetry messaging semantic conventions) and
//! the error text kept for a failure (the whole cause chain).

#[cfg(feature = "opentelemetry")]
use std::borrow::Cow;

use tracing::Instrument;
use tracing::field::Empty;

use super::transport::{Delivery, Transport, TransportError};
use babelqueue_core::envelope::Envelope;

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
/// become the span's parent; with no `traceparent`, the envelope's `trace_id` chooses the
/// trace (see [`otel::fallback_context`](super::otel::fallback_context)).
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
    super::otel::set_parent(&span, delivery.headers(), delivery.body());
    span
}

/// The PRODUCER span of one publish (ADR-0028).
///
/// Named `babelqueue.publish` for `tracing`; `otel.name` = `publish <urn>` (the Python
/// SDK's name) and `otel.kind` = `producer`. Fields: `messaging.system`,
/// `messaging.destination.name` (the queue), `messaging.operation.type` = `send`,
/// `messaging.operation.name` = `publish`, `messaging.message.body.size`,
/// `messaging.message.id`, `messaging.message.conversation_id` (`trace_id`), plus `queue`,
/// `urn`, `meta.id`, `trace_id`, and `otel.status_code` = `error` when the broker refused.
fn publish_span(queue: &str, urn: &str, body_size: Option<usize>) -> tracing::Span {
    let span = tracing::info_span!(
        "babelqueue.publish",
        otel.name = %format_args!("publish {urn}"),
        otel.kind = "producer",
        otel.status_code = Empty,
        messaging.system = MESSAGING_SYSTEM,
        messaging.destination.name = %queue,
        messaging.operation.type = "send",
        messaging.operation.name = "publish",
        messaging.message.body.size = Empty,
        messaging.message.id = Empty,
        messaging.message.conversation_id = Empty,
        queue = %queue,
        urn = %urn,
        "meta.id" = Empty,
        trace_id = Empty,
    );
    if let Some(size) = body_size {
        span.record("messaging.message.body.size", size as u64);
    }
    span
}

fn record_ids(span: &tracing::Span, id: &str, trace_id: &str) {
    span.record("meta.id", id);
    span.record("messaging.message.id", id);
    span.record("trace_id", trace_id);
    span.record("messaging.message.conversation_id", trace_id);
}

async fn finish<F>(span: tracing::Span, publish: F) -> Result<(), TransportError>
where
    F: Future<Output = Result<(), TransportError>>,
{
    let result = publish.instrument(span.clone()).await;
    if result.is_err() {
        span.record("otel.status_code", "error");
    }
    result
}

/// Publishes an envelope in a PRODUCER span. With `fresh` (an envelope
/// [`App::publish`](super::App::publish) just built) and an active trace, the envelope
/// sent carries that trace's id as its `trace_id`, which is returned so the caller's copy
/// matches what was sent. Without an OpenTelemetry context this is exactly
/// [`Transport::publish`].
pub(crate) async fn publish_envelope(
    transport: &dyn Transport,
    queue: &str,
    envelope: &Envelope,
    fresh: bool,
) -> Result<Option<String>, TransportError> {
    let _ = fresh;
    let span = publish_span(queue, envelope.urn(), None);
    #[cfg(feature = "opentelemetry")]
    {
        let (headers, inherited) =
            super::otel::producer_headers(&span, Some(envelope.trace_id.as_str()));
        if !headers.is_empty() {
            // The Python SDK's `otel.publish`: a new message's `trace_id` is the trace it
            // is published in, so a consumer that reads no header joins it too.
            let stamped = match super::otel::headers_trace_id(&headers) {
                Some(trace) if fresh && inherited => Some(super::otel::uuid_of(trace)),
                _ => None,
            };
            let trace_id = stamped.as_deref().unwrap_or(&envelope.trace_id);
            record_ids(&span, &envelope.meta.id, trace_id);
            let body = match &stamped {
                Some(t) => envelope.clone().with_trace_id(t.clone()).encode(),
                None => envelope.encode(),
            };
            span.record("messaging.message.body.size", body.len() as u64);
            finish(
                span,
                transport.publish_with_headers(queue, &body, Some(&headers)),
            )
            .await?;
            return Ok(stamped);
        }
    }
    record_ids(&span, &envelope.meta.id, &envelope.trace_id);
    finish(span, transport.publish(queue, envelope)).await?;
    Ok(None)
}

/// Publishes pre-encoded bytes (an envelope, or a header frame around one) to `queue` in
/// a PRODUCER span, the way [`App::publish_raw`](super::App::publish_raw) does: what the
/// outbox relay calls for each row.
///
/// Without the `opentelemetry` feature, or without an OpenTelemetry context, this is
/// exactly [`Transport::publish_raw`]: the bytes go out unchanged. With one, the body goes
/// out unchanged and the span's `traceparent` rides beside it (through
/// [`Transport::publish_with_headers`]), unless `element` is already a header frame that
/// carries a `traceparent` (it keeps its own trace) or is not UTF-8 (sent as is). With no
/// active parent, the span's trace is the envelope's `trace_id`.
///
/// ```
/// use babelqueue_runtime::{publish_traced, InMemoryTransport, Transport};
/// use babelqueue_core::Envelope;
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let t = InMemoryTransport::new();
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({"order_id": 1}))?;
/// publish_traced(&t, "orders", env.encode()).await?;
/// let d = t.reserve("orders", std::time::Duration::ZERO).await?.expect("one message");
/// assert_eq!(d.body(), env.encode()); // no OpenTelemetry layer here: unchanged
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub async fn publish_traced(
    transport: &(impl Transport + ?Sized),
    queue: &str,
    element: Vec<u8>,
) -> Result<(), TransportError> {
    #[cfg(feature = "opentelemetry")]
    {
        let framed = super::transport::unframe(&element);
        let (mut headers, body) = match framed {
            Some((headers, body)) => (headers, Cow::Owned(body)),
            None => (
                super::transport::Headers::new(),
                Cow::Borrowed(&element[..]),
            ),
        };
        let ids = super::otel::EnvelopeIds::read(&body);
        let urn = ids.job.as_deref().or(ids.urn.as_deref()).unwrap_or("");
        let span = publish_span(queue, urn, Some(body.len()));
        let id = ids
            .meta
            .as_ref()
            .and_then(|m| m.id.as_deref())
            .unwrap_or("");
        record_ids(&span, id, ids.trace_id.as_deref().unwrap_or(""));
        let keeps_own = headers.contains_key(super::otel::TRACEPARENT);
        if !keeps_own && std::str::from_utf8(&body).is_ok() {
            let (ours, _) = super::otel::producer_headers(&span, ids.trace_id.as_deref());
            if !ours.is_empty() {
                headers.extend(ours);
                return finish(
                    span,
                    transport.publish_with_headers(queue, &body, Some(&headers)),
                )
                .await;
            }
        }
        drop(ids);
        drop(body);
        return finish(span, transport.publish_raw(queue, element)).await;
    }
    #[cfg(not(feature = "opentelemetry"))]
    {
        let span = publish_span(queue, "", Some(element.len()));
        finish(span, transport.publish_raw(queue, element)).await
    }
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
