//! JSON-level reading and editing of queue elements (bare envelopes or header frames),
//! keeping every field and its order.

use serde_json::{Map, Value};

/// A queue element: its envelope object and, for a frame, the frame around it.
pub(crate) struct Element {
    /// The element's bytes, as read.
    bytes: Vec<u8>,
    /// Whether the element is a header frame (its `body` is edited on write).
    framed: bool,
    /// The envelope object (`None`: the body is not a JSON object).
    pub envelope: Option<Map<String, Value>>,
}

/// The family's rule for telling a header frame from a bare envelope, the same one the
/// consumer applies (`babelqueue_runtime::unframe`).
fn is_frame(bytes: &[u8], obj: &Map<String, Value>) -> bool {
    babelqueue_runtime::may_be_frame(bytes) && babelqueue_runtime::is_frame_object(obj)
}

fn parse_object(bytes: &[u8]) -> Option<Map<String, Value>> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

impl Element {
    pub(crate) fn parse(bytes: &[u8]) -> Element {
        match parse_object(bytes) {
            Some(obj) if is_frame(bytes, &obj) => {
                let envelope = obj
                    .get("body")
                    .and_then(Value::as_str)
                    .and_then(|b| parse_object(b.as_bytes()));
                Element {
                    bytes: bytes.to_vec(),
                    framed: true,
                    envelope,
                }
            }
            envelope => Element {
                bytes: bytes.to_vec(),
                framed: false,
                envelope,
            },
        }
    }

    /// The envelope bytes (the frame's `body` for a frame).
    pub(crate) fn body(bytes: &[u8]) -> Vec<u8> {
        match parse_object(bytes) {
            Some(obj) if is_frame(bytes, &obj) => obj
                .get("body")
                .and_then(Value::as_str)
                .map_or_else(|| bytes.to_vec(), |b| b.as_bytes().to_vec()),
            _ => bytes.to_vec(),
        }
    }

    fn field<'a>(&'a self, path: &[&str]) -> Option<&'a Value> {
        let mut cur = self.envelope.as_ref()?.get(path[0])?;
        for key in &path[1..] {
            cur = cur.get(key)?;
        }
        Some(cur)
    }

    pub(crate) fn meta_id(&self) -> Option<&str> {
        self.field(&["meta", "id"]).and_then(Value::as_str)
    }

    pub(crate) fn job(&self) -> Option<&str> {
        self.field(&["job"])
            .or_else(|| self.field(&["urn"]))
            .and_then(Value::as_str)
    }

    pub(crate) fn dead_letter(&self, key: &str) -> Option<&Value> {
        self.field(&["dead_letter", key])
    }

    /// The element without its `dead_letter` block (and `attempts` reset unless
    /// `keep_attempts`), edited in its text: every other byte stays (numbers of any size
    /// and spelling, key order, whitespace; a frame's other members). `None` when there is
    /// no envelope object to edit.
    pub(crate) fn requeued(self, keep_attempts: bool) -> Option<Vec<u8>> {
        let envelope = self.envelope?;
        let reset_attempts = !keep_attempts && envelope.contains_key("attempts");
        if !self.framed {
            return babelqueue_runtime::redrive::reset_text(&self.bytes, reset_attempts);
        }
        let body = Element::body(&self.bytes);
        let body = babelqueue_runtime::redrive::reset_text(&body, reset_attempts)?;
        let body = serde_json::to_vec(std::str::from_utf8(&body).ok()?).ok()?;
        babelqueue_runtime::set_json_member(&self.bytes, "body", &body)
    }
}

/// `ms` since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
pub(crate) fn iso_millis(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_dates() {
        assert_eq!(iso_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_millis(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn requeue_strips_the_block_and_keeps_the_order() {
        let dead = br#"{"job":"urn:x","trace_id":"t","data":{"z":1,"a":2},"meta":{"id":"m1"},"attempts":3,"dead_letter":{"reason":"failed"},"extra":true}"#;
        let el = Element::parse(dead);
        assert_eq!(el.meta_id(), Some("m1"));
        assert_eq!(
            el.dead_letter("reason").and_then(Value::as_str),
            Some("failed")
        );
        assert_eq!(
            el.requeued(false).unwrap(),
            br#"{"job":"urn:x","trace_id":"t","data":{"z":1,"a":2},"meta":{"id":"m1"},"attempts":0,"extra":true}"#
        );
        assert_eq!(
            Element::parse(dead).requeued(true).unwrap(),
            br#"{"job":"urn:x","trace_id":"t","data":{"z":1,"a":2},"meta":{"id":"m1"},"attempts":3,"extra":true}"#
        );
    }

    #[test]
    fn frames_are_edited_inside_and_kept() {
        let body =
            r#"{"job":"urn:x","meta":{"id":"m2"},"attempts":3,"dead_letter":{"reason":"failed"}}"#;
        let frame =
            serde_json::json!({"__bq_frame":1,"headers":{"traceparent":"00-a-b-01"},"body":body});
        let bytes = serde_json::to_vec(&frame).unwrap();
        let el = Element::parse(&bytes);
        assert_eq!(el.meta_id(), Some("m2"));
        let out = el.requeued(false).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["headers"]["traceparent"], "00-a-b-01");
        assert_eq!(
            v["body"].as_str().unwrap(),
            r#"{"job":"urn:x","meta":{"id":"m2"},"attempts":0}"#
        );
        assert_eq!(Element::body(&bytes), body.as_bytes());
    }

    #[test]
    fn non_json_is_not_editable() {
        assert!(Element::parse(b"\xffgarbage").requeued(false).is_none());
    }

    #[test]
    fn requeue_edits_the_text_and_keeps_every_other_byte() {
        let dead = br#"{"job":"urn:x","data":{"big":92345678901234567890,"z":-0,"e":1.0E2,"d":1,"d":2}, "meta":{"id":"m1"},"attempts" : 3,"dead_letter":{"reason":"failed"}}"#;
        assert_eq!(
            std::str::from_utf8(&Element::parse(dead).requeued(false).unwrap()).unwrap(),
            r#"{"job":"urn:x","data":{"big":92345678901234567890,"z":-0,"e":1.0E2,"d":1,"d":2}, "meta":{"id":"m1"},"attempts" : 0}"#
        );
        let body = std::str::from_utf8(dead).unwrap();
        let frame = format!(
            r#"{{"__bq_frame":1, "headers":{{"traceparent":"00-a-b-01"}},"body":{},"x":1.0E2}}"#,
            serde_json::to_string(body).unwrap()
        );
        let out = Element::parse(frame.as_bytes()).requeued(true).unwrap();
        let expect_body = r#"{"job":"urn:x","data":{"big":92345678901234567890,"z":-0,"e":1.0E2,"d":1,"d":2}, "meta":{"id":"m1"},"attempts" : 3}"#;
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            format!(
                r#"{{"__bq_frame":1, "headers":{{"traceparent":"00-a-b-01"}},"body":{},"x":1.0E2}}"#,
                serde_json::to_string(expect_body).unwrap()
            )
        );
    }
}
