//! The producer's `traceparent` as the parent of the message span (feature
//! `opentelemetry`). In a test binary of its own: `tracing` caches each callsite's
//! interest process-wide, and other runtime tests running in parallel without a subscriber
//! could make this test's scoped subscriber miss the span.
#![cfg(feature = "opentelemetry")]

use babelqueue_core::Envelope;
use babelqueue_runtime::{App, Headers, InMemoryTransport, Transport};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn traced_headers() -> Headers {
    let mut h = Headers::new();
    h.insert("traceparent".into(), TRACEPARENT.into());
    h.insert("tracestate".into(), "congo=t61rcWkgMzE".into());
    h
}

#[tokio::test]
async fn the_producers_traceparent_is_the_parent_of_the_message_span() {
    use opentelemetry::trace::{SpanKind, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use tracing_subscriber::layer::SubscriberExt;

    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("obs-test")));
    let _default = tracing::subscriber::set_default(subscriber);

    let q = "obs-otel";
    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue(q)
        .route_sync(CHARGE, |_: &Envelope| {
            tracing::info_span!("charge").in_scope(|| ())
        });
    let traced = Envelope::new(CHARGE, json!({"n": 1})).unwrap();
    t.publish_with_headers(q, &traced.encode(), Some(&traced_headers()))
        .await
        .unwrap();
    let untraced = app.publish(CHARGE, &json!({"n": 2})).await.unwrap();
    app.drain().await.unwrap();
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let message_spans: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == format!("process {q}"))
        .collect();
    assert_eq!(
        message_spans.len(),
        2,
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let attr = |s: &SpanData, k: &str| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == k)
            .map(|kv| kv.value.to_string())
    };
    let find = |id: &str| {
        *message_spans
            .iter()
            .find(|s| attr(s, "messaging.message.id").as_deref() == Some(id))
            .expect("the message's span")
    };
    let traced_span = find(&traced.meta.id);
    assert_eq!(
        traced_span.span_context.trace_id().to_string(),
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "the producer's trace"
    );
    assert_eq!(traced_span.parent_span_id.to_string(), "00f067aa0ba902b7");
    assert!(traced_span.parent_span_is_remote);
    assert_eq!(traced_span.span_kind, SpanKind::Consumer);
    assert_eq!(
        traced_span.span_context.trace_state().get("congo"),
        Some("t61rcWkgMzE")
    );
    for (k, v) in [
        ("messaging.system", "babelqueue"),
        ("messaging.destination.name", q),
        ("messaging.operation.type", "process"),
        (
            "messaging.message.conversation_id",
            traced.trace_id.as_str(),
        ),
    ] {
        assert_eq!(attr(traced_span, k).as_deref(), Some(v), "attribute {k}");
    }
    // The handler's own span is a child of the message span, in the producer's trace.
    let charge = spans
        .iter()
        .find(|s| s.name == "charge" && s.parent_span_id == traced_span.span_context.span_id())
        .expect("the handler's span under the traced message span");
    assert_eq!(
        charge.span_context.trace_id(),
        traced_span.span_context.trace_id()
    );
    // `App::publish`: its PRODUCER span, in the trace of the envelope's
    // `trace_id` (no active trace here), is the parent of the message span.
    let own = find(&untraced.meta.id);
    let producer = spans
        .iter()
        .find(|s| s.span_kind == SpanKind::Producer)
        .expect("the publish's PRODUCER span");
    assert_eq!(producer.name, format!("publish {CHARGE}"));
    assert_eq!(
        producer.span_context.trace_id(),
        babelqueue_runtime::otel::trace_id_of(&untraced.trace_id)
    );
    assert_eq!(
        own.span_context.trace_id(),
        producer.span_context.trace_id()
    );
    assert_eq!(own.parent_span_id, producer.span_context.span_id());
}
