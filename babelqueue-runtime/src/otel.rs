//! OpenTelemetry context propagation (feature `opentelemetry`), the family's tracing
//! contract (ADR-0025, ADR-0028):
//!
//! - **Publish**: every publish of [`App`](super::App) (and the outbox relay, through
//!   [`publish_traced`](super::publish_traced)) runs in a PRODUCER span
//!   `publish <urn>`; its W3C `traceparent` (and `tracestate`) ride as out-of-band
//!   transport headers ([`Transport::publish_with_headers`](super::Transport::publish_with_headers):
//!   the header frame on the list transports, native headers on RabbitMQ), never in the
//!   envelope. With no active parent, the producer span's trace is the envelope's
//!   `trace_id` ([`trace_id_of`]); with one, [`App::publish`](super::App::publish) stamps
//!   the active trace into the new envelope's `trace_id` ([`uuid_of`]), like the Python
//!   SDK's `otel.publish`.
//! - **Consume**: the `traceparent` header is the message span's parent; with none, the
//!   parent is [`fallback_context`] of the envelope's `trace_id`, so a trace still joins
//!   across SDKs that send no header.
//!
//! Without a `tracing-opentelemetry` layer there is no OpenTelemetry context: nothing is
//! injected and a publish is byte for byte what it is without the feature.

use std::borrow::Cow;

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use sha2::{Digest, Sha256};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::transport::Headers;

/// The W3C trace-context header naming the producer's span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C trace-context header carrying vendor state.
pub const TRACESTATE: &str = "tracestate";

struct HeaderExtractor<'a>(&'a Headers);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// The remote parent carried by `headers`: first through the global text-map propagator
/// (`opentelemetry::global::set_text_map_propagator`, e.g. W3C trace context plus
/// baggage), else by reading the W3C `traceparent` / `tracestate` headers directly.
/// `None` when there is no valid parent.
///
/// ```
/// use babelqueue_runtime::{otel, Headers};
/// use opentelemetry::trace::TraceContextExt;
///
/// let mut h = Headers::new();
/// h.insert(
///     "traceparent".into(),
///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
/// );
/// let cx = otel::parent_context(&h).expect("a valid traceparent");
/// let parent = cx.span().span_context().clone();
/// assert_eq!(parent.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(parent.is_remote() && parent.is_sampled());
///
/// h.insert("traceparent".into(), "garbage".into());
/// assert!(otel::parent_context(&h).is_none());
/// ```
pub fn parent_context(headers: &Headers) -> Option<Context> {
    let extractor = HeaderExtractor(headers);
    let cx = opentelemetry::global::get_text_map_propagator(|p| {
        p.extract_with_context(&Context::new(), &extractor)
    });
    if cx.span().span_context().is_valid() {
        return Some(cx);
    }
    let sc = parse_traceparent(
        extractor.get(TRACEPARENT)?,
        extractor.get(TRACESTATE).unwrap_or(""),
    )?;
    Some(Context::new().with_remote_span_context(sc))
}

/// `version-traceid-parentid-flags` (W3C Trace Context, level 1): version `00` has
/// exactly four fields; a later version may append fields; `ff` is invalid; all-zero ids
/// are invalid.
fn parse_traceparent(traceparent: &str, tracestate: &str) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let version = parts.next()?;
    let trace_id = parts.next()?;
    let span_id = parts.next()?;
    let flags = parts.next()?;
    let lower_hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !lower_hex(version, 2)
        || version == "ff"
        || (version == "00" && parts.next().is_some())
        || !lower_hex(trace_id, 32)
        || !lower_hex(span_id, 16)
        || !lower_hex(flags, 2)
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let state = tracestate.parse::<TraceState>().unwrap_or_default();
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        state,
    ))
}

/// The 128-bit OpenTelemetry trace id of an envelope's `trace_id` (the Python SDK's
/// `otel.trace_id_of`): a UUID (32 hex digits once its `-` are removed) is its 16 bytes;
/// any other string, or the nil UUID, is the first 16 bytes of its SHA-256. Never the
/// invalid (all-zero) id.
///
/// ```
/// use babelqueue_runtime::otel;
/// let id = otel::trace_id_of("4bf92f35-77b3-4da6-a3ce-929d0e0e4736");
/// assert_eq!(id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(otel::uuid_of(id), "4bf92f35-77b3-4da6-a3ce-929d0e0e4736");
/// // Not a UUID: hashed, the same on every SDK.
/// assert_eq!(otel::trace_id_of("order-1042"), otel::trace_id_of("order-1042"));
/// ```
pub fn trace_id_of(trace_id: &str) -> TraceId {
    let hex: String = trace_id.chars().filter(|c| *c != '-').collect();
    if hex.len() == 32
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && let Ok(n) = u128::from_str_radix(&hex, 16)
        && n != 0
    {
        return TraceId::from(n);
    }
    let digest = Sha256::digest(trace_id.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    match u128::from_be_bytes(bytes) {
        0 => TraceId::from(1u128),
        n => TraceId::from(n),
    }
}

/// A trace id as a canonical UUID string (lower-case, `8-4-4-4-12`): what a producer
/// stamps into `trace_id` so that [`trace_id_of`] gives the trace back (the Python SDK's
/// `otel.uuid_of`).
pub fn uuid_of(trace_id: TraceId) -> String {
    uuid::Uuid::from_bytes(trace_id.to_bytes())
        .hyphenated()
        .to_string()
}

/// The synthetic remote parent's span id for `trace_id`: the first 8 bytes of the SHA-256
/// of `babelqueue-span:<trace_id>` (the Python SDK's `_span_id_of`), never zero.
fn span_id_of(trace_id: &str) -> SpanId {
    let mut hasher = Sha256::new();
    hasher.update(b"babelqueue-span:");
    hasher.update(trace_id.as_bytes());
    let digest = hasher.finalize();
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    match u64::from_be_bytes(bytes) {
        0 => SpanId::from(1u64),
        n => SpanId::from(n),
    }
}

/// The parent a span takes when its message carries no `traceparent`: a remote, sampled
/// span context in the trace [`trace_id_of`]`(trace_id)`, whose span id is derived from
/// `trace_id` the way every BabelQueue SDK derives it. A span started under it is in the
/// same trace as every other hop of that `trace_id`, with a span id of its own.
///
/// ```
/// use babelqueue_runtime::otel;
/// use opentelemetry::trace::TraceContextExt;
/// let cx = otel::fallback_context("4bf92f35-77b3-4da6-a3ce-929d0e0e4736");
/// let parent = cx.span().span_context().clone();
/// assert_eq!(parent.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(parent.is_valid() && parent.is_remote() && parent.is_sampled());
/// ```
pub fn fallback_context(trace_id: &str) -> Context {
    let sc = SpanContext::new(
        trace_id_of(trace_id),
        span_id_of(trace_id),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    Context::new().with_remote_span_context(sc)
}

struct HeaderInjector<'a>(&'a mut Headers);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value.into());
    }
}

/// The headers that carry `cx`'s span to a consumer: the global text-map propagator's
/// (when one is set), else the W3C `traceparent` (and a non-empty `tracestate`) written
/// directly. Empty when `cx` has no valid span (so a publish stays header-free).
///
/// ```
/// use babelqueue_runtime::otel;
/// use opentelemetry::trace::TraceContextExt;
/// let cx = otel::fallback_context("4bf92f35-77b3-4da6-a3ce-929d0e0e4736");
/// let h = otel::inject(&cx);
/// let tp = h["traceparent"].as_str().unwrap();
/// assert!(tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && tp.ends_with("-01"));
/// // What one side injects, the other extracts.
/// let back = otel::parent_context(&h).unwrap();
/// assert_eq!(back.span().span_context(), cx.span().span_context());
/// assert!(otel::inject(&opentelemetry::Context::new()).is_empty());
/// ```
pub fn inject(cx: &Context) -> Headers {
    let mut headers = Headers::new();
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return headers;
    }
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(cx, &mut HeaderInjector(&mut headers))
    });
    if !headers.contains_key(TRACEPARENT) {
        headers.insert(
            TRACEPARENT.to_owned(),
            format!(
                "00-{}-{}-{:02x}",
                sc.trace_id(),
                sc.span_id(),
                (sc.trace_flags() & TraceFlags::SAMPLED).to_u8()
            )
            .into(),
        );
        let state = sc.trace_state().header();
        if !state.is_empty() {
            headers.insert(TRACESTATE.to_owned(), state.into());
        }
    }
    headers
}

/// The fields of an encoded envelope a span needs, read without decoding the rest.
/// Anything unexpected (not JSON, a field of the wrong type) leaves them all `None`.
#[derive(Default, serde::Deserialize)]
pub(crate) struct EnvelopeIds<'a> {
    #[serde(borrow, default)]
    pub(crate) job: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) urn: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) trace_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) meta: Option<MetaId<'a>>,
}

#[derive(Default, serde::Deserialize)]
pub(crate) struct MetaId<'a> {
    #[serde(borrow, default)]
    pub(crate) id: Option<Cow<'a, str>>,
}

impl<'a> EnvelopeIds<'a> {
    pub(crate) fn read(body: &'a [u8]) -> Self {
        serde_json::from_slice(body).unwrap_or_default()
    }
}

/// Makes the remote parent in `headers` (if any) the parent of the message span `span`;
/// with no valid `traceparent`, the [`fallback_context`] of the `trace_id` in `body`.
/// Without a `tracing-opentelemetry` layer installed, or with the span disabled, nothing
/// happens.
pub(crate) fn set_parent(span: &tracing::Span, headers: Option<&Headers>, body: &[u8]) {
    if span.is_disabled() {
        return;
    }
    let cx = match headers.and_then(parent_context) {
        Some(cx) => cx,
        None => match EnvelopeIds::read(body).trace_id {
            Some(trace_id) if !trace_id.is_empty() => fallback_context(&trace_id),
            _ => return,
        },
    };
    // Err: no OpenTelemetry layer: nothing to link.
    let _ = span.set_parent(cx);
}

/// The valid span context active where a publish is called: the current `tracing` span's
/// (through the layer), else the current OpenTelemetry context's.
fn active_parent() -> Option<SpanContext> {
    let from_tracing = tracing::Span::current().context();
    let sc = from_tracing.span().span_context().clone();
    if sc.is_valid() {
        return Some(sc);
    }
    let sc = Context::current().span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// Prepares the PRODUCER span `span` of a publish (not yet entered): with no active
/// parent, parents it on the [`fallback_context`] of `trace_id` (when given). Returns the
/// headers carrying it (empty without an OpenTelemetry layer) and whether an active parent
/// chose its trace.
pub(crate) fn producer_headers(span: &tracing::Span, trace_id: Option<&str>) -> (Headers, bool) {
    if span.is_disabled() {
        return (Headers::new(), false);
    }
    let inherited = active_parent().is_some();
    if !inherited && let Some(trace_id) = trace_id.filter(|t| !t.is_empty()) {
        // Err: no OpenTelemetry layer: no context, nothing injected below.
        let _ = span.set_parent(fallback_context(trace_id));
    }
    (inject(&span.context()), inherited)
}

/// The trace id the headers from [`producer_headers`] carry.
pub(crate) fn headers_trace_id(headers: &Headers) -> Option<TraceId> {
    parent_context(headers).map(|cx| cx.span().span_context().trace_id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_follow_the_python_sdk() {
        // Values computed with the Python SDK 1.24.0 (`babelqueue.otel`).
        assert_eq!(
            trace_id_of("0AF7651916CD43DD8448EB211C80319C").to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(
            trace_id_of("order-1042").to_string(),
            "bff83cdfb94d8087b6fd49cb20c427dc"
        );
        assert_eq!(span_id_of("order-1042").to_string(), "af8fc63f9549a49d");
        // The nil UUID is not a valid trace id: hashed like any other string.
        assert_eq!(
            trace_id_of("00000000-0000-0000-0000-000000000000").to_string(),
            "12b9377cbe7e5c94e8a70d9d23929523"
        );
        assert_ne!(trace_id_of("a"), trace_id_of("b"));
        let id = TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap();
        assert_eq!(trace_id_of(&uuid_of(id)), id);
    }

    #[test]
    fn envelope_ids_are_read_leniently() {
        let ids = EnvelopeIds::read(
            br#"{"job":"urn:x","trace_id":"t\u0031","data":{"a":[1,2]},"meta":{"id":"m"}}"#,
        );
        assert_eq!(ids.job.as_deref(), Some("urn:x"));
        assert_eq!(ids.trace_id.as_deref(), Some("t1"));
        assert_eq!(ids.meta.and_then(|m| m.id).as_deref(), Some("m"));
        assert!(EnvelopeIds::read(b"not json").trace_id.is_none());
        assert!(EnvelopeIds::read(br#"{"trace_id":7}"#).trace_id.is_none());
    }

    #[test]
    fn traceparent_validation() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse_traceparent(ok, "congo=t61rcWkgMzE").unwrap();
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(sc.trace_state().get("congo"), Some("t61rcWkgMzE"));
        assert!(
            !parse_traceparent(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
                ""
            )
            .unwrap()
            .is_sampled()
        );
        // A later version may carry more fields.
        assert!(
            parse_traceparent(
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
                ""
            )
            .is_some()
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            assert!(parse_traceparent(bad, "").is_none(), "{bad}");
        }
    }
}
