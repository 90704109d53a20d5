//! Tracing across a publish (ADR-0025 / ADR-0028, feature `opentelemetry`): the
//! PRODUCER span of `App::publish*` and the outbox relay, its `traceparent` header, and the
//! consumer's fallback to the envelope's `trace_id` when a message carries none.
//!
//! In a test binary of its own, and every test installs a subscriber of its own: `tracing`
//! caches each callsite's interest process-wide, and a test running without one could make
//! another test's scoped subscriber miss its spans.
#![cfg(feature = "opentelemetry")]

use std::time::Duration;

use babelqueue_core::Envelope;
use babelqueue_runtime::outbox::{InMemoryOutbox, OutboxRelay};
use babelqueue_runtime::{App, Headers, InMemoryTransport, Transport, otel, unframe};
use opentelemetry::trace::{SpanKind, TraceContextExt, TraceId, Tracer as _, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

const CREATED: &str = "urn:babel:orders:created";

/// A subscriber with the OpenTelemetry layer over an in-memory exporter.
struct Traced {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
    _default: tracing::subscriber::DefaultGuard,
}

impl Traced {
    fn install() -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-publish")));
        let _default = tracing::subscriber::set_default(subscriber);
        Traced {
            exporter,
            provider,
            _default,
        }
    }

    fn spans(&self) -> Vec<SpanData> {
        self.provider.force_flush().unwrap();
        self.exporter.get_finished_spans().unwrap()
    }
}

fn attr(s: &SpanData, k: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == k)
        .map(|kv| kv.value.to_string())
}

fn one<'a>(spans: &'a [SpanData], kind: SpanKind, id: &str) -> &'a SpanData {
    let found: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.span_kind == kind && attr(s, "messaging.message.id").as_deref() == Some(id))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {kind:?} span of message {id}: {:?}",
        spans
            .iter()
            .map(|s| (&s.name, &s.span_kind))
            .collect::<Vec<_>>()
    );
    found[0]
}

/// The traceparent of the single message waiting on `queue` (reserved and put back).
async fn waiting_headers(t: &InMemoryTransport, queue: &str) -> Option<Headers> {
    let d = t
        .reserve(queue, Duration::ZERO)
        .await
        .unwrap()
        .expect("a message");
    let headers = unframe(d.element()).map(|(h, _)| h);
    t.requeue_processing(queue).await.unwrap();
    headers
}

#[tokio::test]
async fn a_publish_then_a_consume_is_one_trace_producer_then_consumer() {
    let traced = Traced::install();
    let q = "otel-pub-one";
    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue(q)
        .route_sync(CREATED, |_: &Envelope| ());
    let sent = app
        .publish(CREATED, &json!({"order_id": 1042}))
        .await
        .unwrap();

    // The traceparent rides in the header frame, beside the envelope, never in it.
    let headers = waiting_headers(&t, q).await.expect("a header frame");
    let tp = headers["traceparent"].as_str().unwrap().to_owned();
    let d = t.reserve(q, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(d.body(), sent.encode(), "the envelope is unchanged");
    t.requeue_processing(q).await.unwrap();

    let stats = app.drain().await.unwrap();
    assert_eq!(stats.succeeded, 1);
    let spans = traced.spans();
    let producer = one(&spans, SpanKind::Producer, &sent.meta.id);
    let consumer = one(&spans, SpanKind::Consumer, &sent.meta.id);

    assert_eq!(producer.name, format!("publish {CREATED}"));
    for (k, v) in [
        ("messaging.system", "babelqueue"),
        ("messaging.destination.name", q),
        ("messaging.operation.type", "send"),
        ("messaging.message.conversation_id", sent.trace_id.as_str()),
    ] {
        assert_eq!(attr(producer, k).as_deref(), Some(v), "attribute {k}");
    }
    // One trace: the consumer is the producer's child, through the header.
    assert_eq!(
        consumer.span_context.trace_id(),
        producer.span_context.trace_id()
    );
    assert_eq!(consumer.parent_span_id, producer.span_context.span_id());
    assert!(consumer.parent_span_is_remote);
    assert_eq!(
        tp,
        format!(
            "00-{}-{}-01",
            producer.span_context.trace_id(),
            producer.span_context.span_id()
        )
    );
    // No active trace: the producer's trace is the envelope's trace_id, left as minted.
    assert_eq!(
        producer.span_context.trace_id(),
        otel::trace_id_of(&sent.trace_id)
    );
    assert_eq!(
        otel::uuid_of(producer.span_context.trace_id()),
        sent.trace_id
    );
}

#[tokio::test]
async fn a_publish_inside_a_trace_continues_it_and_stamps_its_trace_id() {
    let traced = Traced::install();
    let q = "otel-pub-active";
    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue(q)
        .route_sync(CREATED, |_: &Envelope| ());

    // An active OpenTelemetry span of the caller's own (not a `tracing` one).
    let tracer = traced.provider.tracer("caller");
    let root = tracer.start("checkout");
    let root_cx = opentelemetry::Context::current_with_span(root);
    let root_sc = root_cx.span().span_context().clone();
    let sent = {
        let _attached = root_cx.clone().attach();
        app.publish(CREATED, &json!({"order_id": 7})).await.unwrap()
    };
    root_cx.span().end();
    // And an envelope given as is keeps its trace_id, even inside a trace.
    let given = Envelope::new(CREATED, json!({"order_id": 8})).unwrap();
    {
        let _attached = root_cx.clone().attach();
        app.publish_envelope(&given).await.unwrap();
    }
    app.drain().await.unwrap();

    let spans = traced.spans();
    let producer = one(&spans, SpanKind::Producer, &sent.meta.id);
    assert_eq!(producer.parent_span_id, root_sc.span_id());
    assert_eq!(producer.span_context.trace_id(), root_sc.trace_id());
    // The Python SDK's rule: the new message's trace_id is the active trace, as a UUID.
    assert_eq!(sent.trace_id, otel::uuid_of(root_sc.trace_id()));
    let consumer = one(&spans, SpanKind::Consumer, &sent.meta.id);
    assert_eq!(consumer.parent_span_id, producer.span_context.span_id());
    assert_eq!(
        attr(consumer, "messaging.message.conversation_id").as_deref(),
        Some(sent.trace_id.as_str()),
        "the consumer saw the stamped trace_id"
    );

    let given_producer = one(&spans, SpanKind::Producer, &given.meta.id);
    assert_eq!(given_producer.span_context.trace_id(), root_sc.trace_id());
    let given_consumer = one(&spans, SpanKind::Consumer, &given.meta.id);
    assert_eq!(
        attr(given_consumer, "messaging.message.conversation_id").as_deref(),
        Some(given.trace_id.as_str()),
        "publish_envelope sends the envelope as is"
    );
}

#[tokio::test]
async fn a_message_without_traceparent_joins_the_trace_of_its_trace_id() {
    let traced = Traced::install();
    let q = "otel-pub-fallback";
    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue(q)
        .route_sync(CREATED, |_: &Envelope| ());
    // What another SDK sends without headers: a bare envelope whose trace_id is a UUID.
    let trace = "0af76519-16cd-43dd-8448-eb211c80319c";
    let first = Envelope::new(CREATED, json!({"n": 1}))
        .unwrap()
        .with_trace_id(trace);
    let second = Envelope::new(CREATED, json!({"n": 2}))
        .unwrap()
        .with_trace_id(trace);
    // And one whose trace_id is not a UUID: hashed, as every SDK does.
    let named = Envelope::new(CREATED, json!({"n": 3}))
        .unwrap()
        .with_trace_id("order-1042");
    for env in [&first, &second, &named] {
        t.publish_raw(q, env.encode()).await.unwrap();
    }
    app.drain().await.unwrap();

    let spans = traced.spans();
    let expected = TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap();
    let a = one(&spans, SpanKind::Consumer, &first.meta.id);
    let b = one(&spans, SpanKind::Consumer, &second.meta.id);
    assert_eq!(a.span_context.trace_id(), expected);
    assert_eq!(b.span_context.trace_id(), expected, "both hops, one trace");
    assert_ne!(a.span_context.span_id(), b.span_context.span_id());
    assert!(a.parent_span_is_remote);
    // The synthetic parent is the one every SDK derives from the trace_id.
    let parent = otel::fallback_context(trace);
    assert_eq!(a.parent_span_id, parent.span().span_context().span_id());
    let c = one(&spans, SpanKind::Consumer, &named.meta.id);
    assert_eq!(
        c.span_context.trace_id().to_string(),
        "bff83cdfb94d8087b6fd49cb20c427dc"
    );
}

#[tokio::test]
async fn without_an_opentelemetry_layer_a_publish_is_byte_for_byte_unchanged() {
    // A subscriber without the OpenTelemetry layer: spans, but no OpenTelemetry context.
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry());
    let q = "otel-pub-none";
    let t = InMemoryTransport::new();
    let app = App::new(t.clone()).queue(q);
    let sent = app.publish(CREATED, &json!({"n": 1})).await.unwrap();
    let given = Envelope::new(CREATED, json!({"n": 2})).unwrap();
    app.publish_envelope(&given).await.unwrap();
    app.publish_raw(b"raw bytes".to_vec()).await.unwrap();
    let mut elements = Vec::new();
    while let Some(d) = t.reserve(q, Duration::ZERO).await.unwrap() {
        elements.push(d.element().to_vec());
    }
    assert_eq!(
        elements,
        vec![sent.encode(), given.encode(), b"raw bytes".to_vec()]
    );
}

#[tokio::test]
async fn publish_raw_and_the_relay_add_a_traceparent_but_keep_their_bytes() {
    let traced = Traced::install();
    let q = "otel-pub-raw";
    let t = InMemoryTransport::new();
    let app = App::new(t.clone()).queue(q);

    // A bare envelope: its body is kept, the traceparent rides beside it.
    let bare = Envelope::new(CREATED, json!({"n": 1})).unwrap();
    app.publish_raw(bare.encode()).await.unwrap();
    // A frame that already carries a traceparent keeps it (a replay keeps its trace).
    let mut own = Headers::new();
    own.insert(
        "traceparent".into(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
    );
    own.insert("bq-replay-bypass".into(), "1".into());
    let replay = Envelope::new(CREATED, json!({"n": 2})).unwrap();
    let framed = babelqueue_runtime::encode_element(&replay.encode(), Some(&own)).unwrap();
    app.publish_raw(framed.clone()).await.unwrap();
    // Bytes that are not UTF-8 cannot ride in a frame: sent as they are.
    app.publish_raw(vec![0xff, 0xfe]).await.unwrap();

    // The outbox relay publishes through the same helper.
    let outbox = std::sync::Arc::new(InMemoryOutbox::new());
    let stored = Envelope::new(CREATED, json!({"n": 3}))
        .unwrap()
        .with_queue(q);
    outbox.save_envelope(&stored);
    let relay = OutboxRelay::new(outbox.clone(), std::sync::Arc::new(t.clone()));
    assert_eq!(relay.drain().await.unwrap().published, 1);

    let mut got = Vec::new();
    while let Some(d) = t.reserve(q, Duration::ZERO).await.unwrap() {
        got.push((
            d.body().to_vec(),
            d.element().to_vec(),
            d.headers().cloned(),
        ));
    }
    assert_eq!(got.len(), 4);
    let spans = traced.spans();

    let (body, _, headers) = &got[0];
    assert_eq!(body, &bare.encode());
    let producer = one(&spans, SpanKind::Producer, &bare.meta.id);
    assert_eq!(producer.name, format!("publish {CREATED}"));
    let tp = headers.as_ref().unwrap()["traceparent"].as_str().unwrap();
    assert!(tp.contains(&producer.span_context.span_id().to_string()));
    assert_eq!(
        producer.span_context.trace_id(),
        otel::trace_id_of(&bare.trace_id)
    );

    let (_, element, _) = &got[1];
    assert_eq!(element, &framed, "a frame with its own traceparent is kept");
    assert_eq!(&got[2].1, &vec![0xff, 0xfe]);

    let (body, _, headers) = &got[3];
    assert_eq!(body, &stored.encode(), "the stored bytes, unchanged");
    let relayed = one(&spans, SpanKind::Producer, &stored.meta.id);
    let tp = headers.as_ref().expect("a header frame")["traceparent"]
        .as_str()
        .unwrap();
    assert!(tp.contains(&relayed.span_context.span_id().to_string()));
}
