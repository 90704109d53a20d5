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
//! The frame helpers are the runtime's, re-exported here unchanged: [`encode_element`]
//! (no headers → the body itself) and [`unframe`]. Attempts are the body's: the Redis
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

pub use crate::runtime::{FRAME_KEY, Headers, encode_element, unframe};

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
/// # Ok::<(), babelqueue_core::runtime::TransportError>(())
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
