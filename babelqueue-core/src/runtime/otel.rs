//! OpenTelemetry context propagation (feature `opentelemetry`): the W3C `traceparent` /
//! `tracestate` headers of a delivery become the parent of its message span.

use opentelemetry::Context;
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
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
/// use babelqueue_core::runtime::{otel, Headers};
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

/// Makes the remote parent in `headers` (if any) the parent of `span`. Without a
/// `tracing-opentelemetry` layer installed, or with the span disabled, nothing happens.
pub(crate) fn set_parent(span: &tracing::Span, headers: Option<&Headers>) {
    if let Some(cx) = headers.and_then(parent_context) {
        // Err: no OpenTelemetry layer, or the span is disabled: nothing to link.
        let _ = span.set_parent(cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
