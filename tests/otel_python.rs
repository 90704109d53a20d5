//! A trace that crosses SDKs (ADR-0025 / ADR-0028): the upstream Python SDK
//! (babelqueue 1.24.0, its `babelqueue.otel` helper) and the Rust runtime on one Redis
//! queue, with a `tracing-opentelemetry` layer over the in-memory span exporter here.
//!
//! - Python's `otel.publish` → the Rust consumer's span has Python's trace id and is the
//!   child of Python's PRODUCER span (the `traceparent` of the header frame).
//! - Rust's `App::publish` → the Python consumer (`otel.wrap_handler`) reads the same trace
//!   id, as the child of the Rust PRODUCER span.
//! - No header either way: both SDKs derive the same trace from the envelope's `trace_id`.
//!
//! Ignored by default: needs Redis (`BABELQUEUE_REDIS_URL`, default the shared
//! 127.0.0.1:6379) and the Python SDK (`BABELQUEUE_PYTHON`, default
//! `/tmp/bqvenv/bin/python`; a venv with `babelqueue[redis,otel]==1.24.0`). Run with
//! `cargo test --features opentelemetry --test otel_python -- --ignored`.
#![cfg(feature = "opentelemetry")]

#[path = "fleet_support/mod.rs"]
mod fleet_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use babelqueue::redis::RedisTransport;
use babelqueue::runtime::{App, Transport, otel};
use babelqueue::{Envelope, runtime::Headers};
use fleet_support::{QueueGuard, shared_url};
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::{Value, json};
use tracing_subscriber::layer::SubscriberExt;

const CREATED: &str = "urn:babel:orders:created";

fn python() -> PathBuf {
    std::env::var_os("BABELQUEUE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/bqvenv/bin/python"))
}

/// Runs tests/interop/python_otel.py in `mode`; its one JSON line.
fn python_otel(mode: &str, queue: &str, extra: &[(&str, &str)]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_otel.py");
    let py = python();
    let out = Command::new(&py)
        .arg(&script)
        .env("BROKER_URL", shared_url())
        .env("QUEUE", queue)
        .env("MODE", mode)
        .env("TIMEOUT", "5")
        .envs(extra.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "the Python SDK venv is missing ({}: {e}); make one with: python3 -m venv <dir> && <dir>/bin/pip install 'babelqueue[redis,otel]==1.24.0', and set BABELQUEUE_PYTHON",
                py.display()
            )
        });
    assert!(
        out.status.success(),
        "python {mode} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("one JSON line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("python printed {line:?}: {e}"))
}

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
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-python")));
        let _default = tracing::subscriber::set_default(subscriber);
        Traced {
            exporter,
            provider,
            _default,
        }
    }

    /// The one finished span of `kind` for message `id`.
    fn span(&self, kind: SpanKind, id: &str) -> SpanData {
        self.provider.force_flush().unwrap();
        let spans = self.exporter.get_finished_spans().unwrap();
        let mut found: Vec<SpanData> = spans
            .into_iter()
            .filter(|s| {
                s.span_kind == kind
                    && s.attributes.iter().any(|kv| {
                        kv.key.as_str() == "messaging.message.id" && kv.value.to_string() == id
                    })
            })
            .collect();
        assert_eq!(found.len(), 1, "one {kind:?} span of {id}");
        found.remove(0)
    }
}

/// A Rust consumer of `queue` that records the envelopes it handled.
async fn rust_consume(queue: &str) -> Vec<Envelope> {
    let transport = RedisTransport::connect(&shared_url()).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let app = App::new(transport)
        .queue(queue)
        .route_sync(CREATED, move |env: &Envelope| {
            s.lock().unwrap().push(env.clone())
        });
    app.drain().await.unwrap();
    seen.lock().unwrap().drain(..).collect()
}

#[tokio::test]
#[ignore = "needs Redis (BABELQUEUE_REDIS_URL) and the Python SDK with its otel extra (BABELQUEUE_PYTHON)"]
async fn python_publishes_with_its_otel_helper_and_the_rust_consumer_continues_the_trace() {
    let traced = Traced::install();
    let q = QueueGuard::new("otel-py2rs", &shared_url());
    let sent = python_otel("publish", &q.name, &[]);
    let handled = rust_consume(&q.name).await;
    assert_eq!(handled.len(), 1);
    let id = sent["message_id"].as_str().unwrap();
    assert_eq!(handled[0].meta.id, id);

    let consumer = traced.span(SpanKind::Consumer, id);
    assert_eq!(
        consumer.span_context.trace_id().to_string(),
        sent["trace_id"].as_str().unwrap(),
        "Python's trace"
    );
    assert_eq!(
        consumer.parent_span_id.to_string(),
        sent["span_id"].as_str().unwrap(),
        "the child of Python's PRODUCER span"
    );
    assert!(consumer.parent_span_is_remote);
    // Python also stamped its trace into the envelope: the two agree.
    assert_eq!(
        handled[0].trace_id,
        sent["envelope_trace_id"].as_str().unwrap()
    );
    assert_eq!(
        otel::trace_id_of(&handled[0].trace_id),
        consumer.span_context.trace_id()
    );
}

#[tokio::test]
#[ignore = "needs Redis (BABELQUEUE_REDIS_URL) and the Python SDK with its otel extra (BABELQUEUE_PYTHON)"]
async fn rust_publishes_and_the_python_consumer_reads_the_same_trace() {
    let traced = Traced::install();
    let q = QueueGuard::new("otel-rs2py", &shared_url());
    let transport = RedisTransport::connect(&shared_url()).await.unwrap();
    let app = App::new(transport).queue(q.name.clone());
    let sent = app
        .publish(CREATED, &json!({"order_id": 1042}))
        .await
        .unwrap();
    let producer = traced.span(SpanKind::Producer, &sent.meta.id);

    let got = python_otel("consume", &q.name, &[]);
    assert_eq!(got["message_id"], sent.meta.id.as_str());
    assert_eq!(
        got["trace_id"].as_str().unwrap(),
        producer.span_context.trace_id().to_string(),
        "the Rust trace, in Python"
    );
    assert_eq!(
        got["parent_span_id"].as_str().unwrap(),
        producer.span_context.span_id().to_string(),
        "the child of the Rust PRODUCER span (the traceparent header)"
    );
    assert_eq!(got["parent_is_remote"], true);
    assert_eq!(got["envelope_trace_id"], sent.trace_id.as_str());
}

#[tokio::test]
#[ignore = "needs Redis (BABELQUEUE_REDIS_URL) and the Python SDK with its otel extra (BABELQUEUE_PYTHON)"]
async fn without_traceparent_both_sdks_derive_the_trace_from_trace_id() {
    let traced = Traced::install();
    // Rust → Python: a bare envelope (no header frame), its trace_id not a UUID.
    let q = QueueGuard::new("otel-plain-rs2py", &shared_url());
    let transport = RedisTransport::connect(&shared_url()).await.unwrap();
    let trace = format!("order-{}", uuid::Uuid::new_v4().simple());
    let env = Envelope::new(CREATED, json!({"order_id": 1}))
        .unwrap()
        .with_trace_id(trace.clone());
    transport
        .publish_with_headers(&q.name, &env.encode(), Some(&Headers::new()))
        .await
        .unwrap();
    let got = python_otel("consume", &q.name, &[]);
    assert_eq!(got["message_id"], env.meta.id.as_str());
    assert_eq!(
        got["trace_id"].as_str().unwrap(),
        otel::trace_id_of(&trace).to_string(),
        "Python hashes a non-UUID trace_id as Rust does"
    );

    // Python → Rust: `app.publish` with a UUID trace_id and no header.
    let q = QueueGuard::new("otel-plain-py2rs", &shared_url());
    let uuid_trace = uuid::Uuid::new_v4().to_string();
    let sent = python_otel(
        "publish_plain",
        &q.name,
        &[("TRACE_ID", uuid_trace.as_str())],
    );
    let handled = rust_consume(&q.name).await;
    assert_eq!(handled.len(), 1);
    let consumer = traced.span(SpanKind::Consumer, sent["message_id"].as_str().unwrap());
    assert_eq!(
        consumer.span_context.trace_id().to_string(),
        uuid_trace.replace('-', ""),
        "the UUID's 16 bytes are the trace id"
    );
    // The synthetic parent is the one Python derives too.
    let parent = otel::fallback_context(&uuid_trace);
    use opentelemetry::trace::TraceContextExt;
    assert_eq!(
        consumer.parent_span_id,
        parent.span().span_context().span_id()
    );
}
