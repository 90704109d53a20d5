//! Redis lists: payload identity, and the header frame.
//!
//! Redis lists carry no native metadata, so this binding has **no projection**: the list
//! element is the envelope, byte for byte, with no wrapping and no added fields (the
//! manifest's `redis.payload_identity` block, SPEC §5 and §7). A producer `RPUSH`es the
//! encoded envelope; reserve returns that element unchanged. The one exception is a message
//! published with out-of-band headers (e.g. a W3C `traceparent`): the element is then the
//! family's header frame `{"__bq_frame":1,"headers":{…},"body":"<envelope as a string>"}`,
//! and the reader takes the envelope back out of it.
//!
//! The frame helpers: [`encode_element`] (no headers → the body itself) and [`unframe`],
//! which every reader of list elements here uses (the consumer, the CLI, redrive). Attempts are the body's: the Redis
//! runtime retries by writing the body back with `attempts + 1`.
//!
//! ```
//! use babelqueue_core::binding::redis;
//! use babelqueue_core::Envelope;
//!
//! let body = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?.encode();
//! let element = redis::encode_element(&body, None)?;
//! assert_eq!(element, body); // payload identity
//! assert_eq!(redis::element_body(&element), &body[..]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;

use serde_json::{Map, Value};

/// Out-of-band message headers (trace context and the like), as a JSON object.
pub type Headers = Map<String, Value>;

/// The key that marks a header frame: `{"__bq_frame":1,"headers":{…},"body":"<envelope>"}`.
pub const FRAME_KEY: &str = "__bq_frame";

/// A header frame could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The body is not UTF-8 (a frame carries it as a JSON string).
    #[error("a framed body must be UTF-8 (the frame carries it as a JSON string)")]
    BodyNotUtf8,
    /// The frame could not be serialized.
    #[error("the header frame could not be encoded")]
    Encode(#[source] serde_json::Error),
}

/// Encodes a list element: the body itself when `headers` is `None` or empty (the element
/// IS the envelope, byte for byte), else a header frame
/// `{"__bq_frame":1,"headers":{…},"body":"<body as a JSON string>"}`.
///
/// ```
/// use babelqueue_core::binding::redis::{encode_element, Headers};
/// assert_eq!(encode_element(b"{}", None)?, b"{}");
/// let mut h = Headers::new();
/// h.insert("traceparent".into(), "00-ab".into());
/// assert_eq!(
///     encode_element(b"{\"a\":1}", Some(&h))?,
///     br#"{"__bq_frame":1,"headers":{"traceparent":"00-ab"},"body":"{\"a\":1}"}"#
/// );
/// # Ok::<(), babelqueue_core::binding::redis::FrameError>(())
/// ```
pub fn encode_element(body: &[u8], headers: Option<&Headers>) -> Result<Vec<u8>, FrameError> {
    let Some(headers) = headers.filter(|h| !h.is_empty()) else {
        return Ok(body.to_vec());
    };
    let body = std::str::from_utf8(body).map_err(|_| FrameError::BodyNotUtf8)?;
    let mut frame = Map::new();
    frame.insert(FRAME_KEY.to_owned(), Value::from(1));
    frame.insert("headers".to_owned(), Value::Object(headers.clone()));
    frame.insert("body".to_owned(), Value::String(body.to_owned()));
    serde_json::to_vec(&Value::Object(frame)).map_err(FrameError::Encode)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

/// Whether a parsed JSON object is a header frame by the family's rule (the Python SDK's
/// `_unframe`, which every reader of Redis elements here follows: the consumer, the CLI and
/// redrive): its `__bq_frame` is truthy (not `null`, `false`, `0`, `""`, `[]` or `{}`)
/// and its `body` is a string.
pub fn is_frame_object(obj: &serde_json::Map<String, Value>) -> bool {
    let truthy = match obj.get(FRAME_KEY) {
        None | Some(Value::Null | Value::Bool(false)) => false,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Bool(true)) => true,
    };
    truthy && matches!(obj.get("body"), Some(Value::String(_)))
}

/// Whether `element` may be a header frame at all: its first byte is `{` and it contains
/// the quoted marker (the family's cheap reject, before any parsing).
pub fn may_be_frame(element: &[u8]) -> bool {
    element.first() == Some(&b'{') && contains(element, b"\"__bq_frame\"")
}

/// Unwraps a header frame: `Some((headers, body))` when `element` starts with `{`, is a
/// JSON object, and [`is_frame_object`] holds for it; `None` for anything else (a bare
/// envelope, or bytes that are not a frame). `headers` that are not an object read as none.
pub fn unframe(element: &[u8]) -> Option<(Headers, Vec<u8>)> {
    if !may_be_frame(element) {
        return None;
    }
    // No key has a special meaning: headers may hold any string key.
    let Ok(Value::Object(mut obj)) = crate::plain_value::from_slice(element) else {
        return None;
    };
    if !is_frame_object(&obj) {
        return None;
    }
    let body = match obj.shift_remove("body") {
        Some(Value::String(s)) => s.into_bytes(),
        _ => return None,
    };
    let headers = match obj.shift_remove("headers") {
        Some(Value::Object(h)) => h,
        _ => Headers::new(),
    };
    Some((headers, body))
}

/// The envelope bytes of a list element: the body of a header frame, else the element
/// itself (payload identity).
///
/// ```
/// use babelqueue_core::binding::redis::{element_body, encode_element, Headers};
///
/// let mut h = Headers::new();
/// h.insert("traceparent".into(), "00-ab".into());
/// let framed = encode_element(br#"{"a":1}"#, Some(&h))?;
/// assert_eq!(element_body(&framed), &br#"{"a":1}"#[..]);
/// assert_eq!(element_body(b"{}"), &b"{}"[..]);
/// # Ok::<(), babelqueue_core::binding::redis::FrameError>(())
/// ```
pub fn element_body(element: &[u8]) -> Cow<'_, [u8]> {
    match unframe(element) {
        Some((_, body)) => Cow::Owned(body),
        None => Cow::Borrowed(element),
    }
}

/// Attempts on Redis: the body's own count (the runtime republishes with `attempts + 1`;
/// a list has no delivery counter).
///
/// ```
/// assert_eq!(babelqueue_core::binding::redis::reconcile_attempts(3), 3);
/// ```
pub fn reconcile_attempts(body: u32) -> u32 {
    body
}

/// The family's dead-letter list of a queue: `<queue>.dlq`.
///
/// ```
/// assert_eq!(babelqueue_core::binding::redis::dead_letter_queue_name("orders"), "orders.dlq");
/// ```
pub fn dead_letter_queue_name(queue: &str) -> String {
    format!("{queue}{}", crate::binding::amqp::DEAD_LETTER_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Envelope;

    #[test]
    fn an_envelope_is_its_own_element() {
        let body = Envelope::new("urn:babel:a", serde_json::json!({"k": "é/"}))
            .unwrap()
            .encode();
        let element = encode_element(&body, None).unwrap();
        assert_eq!(element, body);
        assert!(unframe(&element).is_none());
        assert!(matches!(element_body(&element), Cow::Borrowed(b) if b == &body[..]));
        let empty = Headers::new();
        assert_eq!(encode_element(&body, Some(&empty)).unwrap(), body);
    }
}

#[cfg(test)]
mod frame_tests {
    use super::*;

    #[test]
    fn frame_round_trip_keeps_body_bytes() {
        let body = "{\"job\":\"urn:x\",\"data\":{\"t\":\"Café \\\"q\\\" \\n ☕\"}}";
        let mut h = Headers::new();
        h.insert("traceparent".into(), "00-abc-01".into());
        let element = encode_element(body.as_bytes(), Some(&h)).unwrap();
        let (headers, got) = unframe(&element).unwrap();
        assert_eq!(headers, h);
        assert_eq!(got, body.as_bytes());
    }

    #[test]
    fn empty_headers_write_no_frame() {
        let h = Headers::new();
        assert_eq!(encode_element(b"{}", Some(&h)).unwrap(), b"{}");
    }

    #[test]
    fn non_frames_are_not_unwrapped() {
        for bytes in [
            &b""[..],
            b"not json",
            b"[1]",
            b"{\"job\":\"x\",\"data\":{\"s\":\"\\\"__bq_frame\\\"\"}}",
            b"{\"__bq_frame\":0,\"body\":\"{}\"}",
            b"{\"__bq_frame\":false,\"body\":\"{}\"}",
            b"{\"__bq_frame\":\"\",\"body\":\"{}\"}",
            b"{\"__bq_frame\":null,\"body\":\"{}\"}",
            b" {\"__bq_frame\":1,\"body\":\"{}\"}",
            b"{\"__bq_frame\":1,\"body\":{}}",
            b"{\"__bq_frame\":1}",
            b"\xff\xfe",
        ] {
            assert!(
                unframe(bytes).is_none(),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn frame_without_headers_is_accepted() {
        let (h, body) = unframe(br#"{"body":"{}","__bq_frame":1}"#).unwrap();
        assert!(h.is_empty());
        assert_eq!(body, b"{}");
    }

    #[test]
    fn any_truthy_marker_makes_a_frame_as_in_the_python_sdk() {
        for marker in ["1", "2", "true", "\"1\"", "[0]", "{\"a\":0}", "0.5"] {
            let element = format!(r#"{{"__bq_frame":{marker},"headers":[1],"body":"{{}}"}}"#);
            let (h, body) = unframe(element.as_bytes()).expect(&element);
            assert!(h.is_empty(), "headers that are not an object read as none");
            assert_eq!(body, b"{}");
        }
    }

    #[test]
    fn non_utf8_body_cannot_be_framed() {
        let mut h = Headers::new();
        h.insert("a".into(), "b".into());
        assert!(matches!(
            encode_element(b"\xff", Some(&h)),
            Err(FrameError::BodyNotUtf8)
        ));
    }

    #[test]
    fn frame_headers_survive_any_string_key() {
        for key in [
            "$serde_json::private::RawValue",
            "$serde_json::private::Number",
            "__bq_frame",
            "body",
            "",
            "\u{0}",
        ] {
            let mut h = Headers::new();
            h.insert(key.to_owned(), "x".into());
            let mut nested = Map::new();
            nested.insert(key.to_owned(), Value::from(1));
            h.insert("n".to_owned(), Value::Object(nested));
            let body = br#"{"job":"urn:x"}"#;
            let element = encode_element(body, Some(&h)).unwrap();
            let (back, b) = unframe(&element).expect("a frame reads back");
            assert_eq!(back, h, "{key:?}");
            assert_eq!(b, body);
        }
    }
}
