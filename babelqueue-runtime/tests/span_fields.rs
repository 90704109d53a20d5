//! The message span's fields (OpenTelemetry messaging conventions). In a test binary of
//! its own: `tracing` caches each callsite's interest process-wide, and the other runtime
//! tests of a binary, running in parallel without a subscriber, could make this test's
//! scoped subscriber miss the span.

use std::collections::HashMap;

use babelqueue_core::Envelope;
use babelqueue_runtime::{App, InMemoryTransport};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";

mod span_fields {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing_subscriber::layer::{Context, Layer};

    /// Every `babelqueue.message` span's fields, by span id.
    #[derive(Clone, Default)]
    pub struct Capture(pub Arc<Mutex<HashMap<u64, HashMap<String, String>>>>);

    struct Fields<'a>(&'a mut HashMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.insert(field.name().into(), format!("{value:?}"));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().into(), value.into());
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Capture {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
            if attrs.metadata().name() == "babelqueue.message" {
                let mut spans = self.0.lock().unwrap();
                attrs.record(&mut Fields(spans.entry(id.into_u64()).or_default()));
            }
        }
        fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
            if let Some(fields) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
                values.record(&mut Fields(fields));
            }
        }
    }
}

#[tokio::test]
async fn the_message_span_follows_the_messaging_conventions() {
    use tracing_subscriber::layer::SubscriberExt;

    let capture = span_fields::Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _default = tracing::subscriber::set_default(subscriber);

    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue("obs-span")
        .route_sync(CHARGE, |_: &Envelope| ());
    let sent = app.publish(CHARGE, &json!({"amount": 1})).await.unwrap();
    app.drain().await.unwrap();

    let spans = capture.0.lock().unwrap();
    let [fields] = &spans.values().collect::<Vec<_>>()[..] else {
        panic!("one message span, got {spans:?}")
    };
    let body_size = sent.encode().len().to_string();
    let expect: HashMap<&str, &str> = HashMap::from([
        ("otel.name", "process obs-span"),
        ("otel.kind", "consumer"),
        ("messaging.system", "babelqueue"),
        ("messaging.destination.name", "obs-span"),
        ("messaging.operation.type", "process"),
        ("messaging.operation.name", "process"),
        ("messaging.message.body.size", body_size.as_str()),
        ("messaging.message.id", sent.meta.id.as_str()),
        ("messaging.message.conversation_id", sent.trace_id.as_str()),
        ("queue", "obs-span"),
        ("urn", CHARGE),
        ("meta.id", sent.meta.id.as_str()),
        ("trace_id", sent.trace_id.as_str()),
        ("attempts", "0"),
    ]);
    for (k, v) in expect {
        assert_eq!(fields.get(k).map(String::as_str), Some(v), "field {k}");
    }
}
