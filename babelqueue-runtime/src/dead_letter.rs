//! Building retried and dead-lettered bodies at the JSON level, so every field of the
//! original message (known or not) survives, and the poison representation.
//!
//! The poison representation is described on [`poison_body`].

use serde_json::{Map, Value};

use super::json_text;
use babelqueue_core::envelope::{DecodeError, Envelope, LANG, now_millis};

/// The URN of the wrapper envelope a non-object poison body is dead-lettered in.
pub const POISON_URN: &str = "urn:babel:poison";

/// The `dead_letter` block, in contract field order.
pub(crate) struct Block<'a> {
    pub reason: &'a str,
    pub error: Option<String>,
    pub exception: Option<&'a str>,
    pub attempts: u64,
}

impl Block<'_> {
    fn to_value(&self, original_queue: &str) -> Value {
        let mut m = Map::new();
        m.insert("reason".into(), self.reason.into());
        m.insert(
            "error".into(),
            self.error.clone().map_or(Value::Null, Value::String),
        );
        m.insert(
            "exception".into(),
            self.exception.map_or(Value::Null, Value::from),
        );
        m.insert("failed_at".into(), now_millis().into());
        m.insert("original_queue".into(), original_queue.into());
        m.insert("attempts".into(), self.attempts.into());
        m.insert("lang".into(), LANG.into());
        Value::Object(m)
    }
}

/// `meta.queue` of a JSON envelope object when it is a non-empty string, else `fallback`.
pub(crate) fn original_queue<'a>(obj: &'a Map<String, Value>, fallback: &'a str) -> &'a str {
    obj.get("meta")
        .and_then(|m| m.get("queue"))
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
        .unwrap_or(fallback)
}

fn parse_object(body: &[u8]) -> Option<Map<String, Value>> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

fn to_bytes(obj: Map<String, Value>) -> Vec<u8> {
    // A map of parsed JSON values always serializes.
    serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
}

/// The body with `attempts` set to `attempts`, every other byte untouched (the value of
/// `attempts` is replaced in the text; see [`json_text`]). `None` when the body is not a
/// JSON object (cannot happen for an accepted envelope).
pub(crate) fn with_attempts(body: &[u8], attempts: u64) -> Option<Vec<u8>> {
    json_text::set_member(body, "attempts", attempts.to_string().as_bytes())
}

/// An accepted envelope's body, dead-lettered: with `set_attempts`, `attempts` is set to
/// the block's count; the `dead_letter` block is added (replacing one from an earlier
/// dead-lettering). Every other byte stays as it arrived.
pub(crate) fn dead_lettered(
    body: &[u8],
    consumed_queue: &str,
    set_attempts: bool,
    block: &Block<'_>,
) -> Option<Vec<u8>> {
    let obj = parse_object(body)?;
    let block = block_text(block, original_queue(&obj, consumed_queue));
    drop(obj);
    let body = if set_attempts {
        with_attempts(body, block.1)?
    } else {
        body.to_vec()
    };
    json_text::set_member(&body, "dead_letter", &block.0)
}

/// The block's JSON text, and its attempts.
fn block_text(block: &Block<'_>, original_queue: &str) -> (Vec<u8>, u64) {
    // A map of plain values always serializes.
    (
        serde_json::to_vec(&block.to_value(original_queue)).unwrap_or_default(),
        block.attempts,
    )
}

/// Whether a poison JSON object can carry its `dead_letter` block appended to its own
/// text and still be given back byte for byte: not when it has a `dead_letter` member
/// already (appending would hide it), nor when it looks like the poison wrapper itself or
/// like a header frame (a reader would unwrap it and lose the block).
fn appendable(obj: &Map<String, Value>) -> bool {
    !obj.contains_key("dead_letter")
        && obj.get("job").and_then(Value::as_str) != Some(POISON_URN)
        && !super::transport::is_frame_object(obj)
}

/// The dead-letter body for a poison message: the object plus a `dead_letter` block, or
/// a wrapper envelope carrying the original bytes.
///
/// A body that is a JSON **object** but not an accepted envelope (unknown
/// `schema_version`, no URN, …) is dead-lettered as is, plus the `dead_letter` block.
///
/// Any other body (not JSON, invalid UTF-8, a JSON array or scalar, empty) cannot carry a
/// `dead_letter` block, so it is wrapped in an accepted envelope whose `data` holds the
/// original bytes:
///
/// ```json
/// {"job":"urn:babel:poison","trace_id":"<new uuid>",
///  "data":{"encoding":"utf8","body":"<the original body>"},
///  "meta":{"id":"<new uuid>","queue":"<consumed queue>","lang":"rust","schema_version":1,"created_at":<now ms>},
///  "attempts":0,
///  "dead_letter":{"reason":"poison","error":"<decode error>","exception":"babelqueue_core::envelope::DecodeError",
///                 "failed_at":<now ms>,"original_queue":"<consumed queue>","attempts":0,"lang":"rust"}}
/// ```
///
/// `data.encoding` is `utf8` when the body is valid UTF-8 (`data.body` is then the body
/// itself, as a JSON string, which round-trips every character exactly) and `base64`
/// (standard alphabet, padded) otherwise. Either way the original bytes are recoverable
/// exactly with [`recover_poison`].
///
/// ```
/// use babelqueue_runtime::{poison_body, recover_poison};
/// use babelqueue_core::{DeadLetterReason, Envelope};
///
/// let garbage = b"\xff\x00 not json".to_vec();
/// let err = Envelope::decode(&garbage).unwrap_err();
/// let dlq = poison_body(&garbage, &err, "orders");
/// let wrapper = Envelope::decode(&dlq)?;
/// assert_eq!(wrapper.dead_letter.unwrap().reason, DeadLetterReason::Poison);
/// assert_eq!(wrapper.data["encoding"], "base64");
/// assert_eq!(recover_poison(&dlq).unwrap(), garbage);
/// # Ok::<(), babelqueue_core::DecodeError>(())
/// ```
pub fn poison_body(body: &[u8], error: &DecodeError, consumed_queue: &str) -> Vec<u8> {
    let exception = Some(std::any::type_name::<DecodeError>());
    if let Some(obj) = parse_object(body)
        && appendable(&obj)
    {
        let attempts = obj.get("attempts").and_then(Value::as_u64).unwrap_or(0);
        let block = Block {
            reason: "poison",
            error: Some(error.to_string()),
            exception,
            attempts,
        };
        let (block, _) = block_text(&block, original_queue(&obj, consumed_queue));
        if let Some(out) = json_text::append(body, "dead_letter", &block) {
            return out;
        }
    }
    let (encoding, raw) = match std::str::from_utf8(body) {
        Ok(s) => ("utf8", s.to_owned()),
        Err(_) => ("base64", base64(body)),
    };
    let mut data = Map::new();
    data.insert("encoding".into(), encoding.into());
    data.insert("body".into(), raw.into());
    let wrapper = match Envelope::new(POISON_URN, Value::Object(data)) {
        Ok(env) => env.with_queue(consumed_queue),
        // POISON_URN is non-empty and `data` an object: `new` cannot fail.
        Err(_) => return Vec::new(),
    };
    let mut obj = match serde_json::to_value(&wrapper) {
        Ok(Value::Object(m)) => m,
        _ => return Vec::new(),
    };
    let block = Block {
        reason: "poison",
        error: Some(error.to_string()),
        exception,
        attempts: 0,
    }
    .to_value(consumed_queue);
    obj.insert("dead_letter".into(), block);
    to_bytes(obj)
}

/// The poison wrapper for a body over the size limit, built without parsing the body and
/// with one allocation of the final size (the body is copied once, escaped as a JSON
/// string when it is UTF-8, else base64): the same shape as [`poison_body`]'s wrapper, so
/// [`recover_poison`] gives the bytes back.
pub(crate) fn poison_oversized(body: &[u8], error: &str, consumed_queue: &str) -> Vec<u8> {
    const MARK: &str = "\u{0}babelqueue-poison-body\u{0}";
    let utf8 = std::str::from_utf8(body).is_ok();
    let mut data = Map::new();
    data.insert(
        "encoding".into(),
        (if utf8 { "utf8" } else { "base64" }).into(),
    );
    data.insert("body".into(), MARK.into());
    let Ok(wrapper) = Envelope::new(POISON_URN, Value::Object(data)) else {
        return Vec::new();
    };
    let wrapper = wrapper.with_queue(consumed_queue);
    let Ok(Value::Object(mut obj)) = serde_json::to_value(&wrapper) else {
        return Vec::new();
    };
    let block = Block {
        reason: "poison",
        error: Some(error.to_owned()),
        exception: Some("babelqueue_runtime::MaxBodySize"),
        attempts: 0,
    }
    .to_value(consumed_queue);
    obj.insert("dead_letter".into(), block);
    let skeleton = to_bytes(obj);
    let Ok(mark) = serde_json::to_vec(MARK) else {
        return Vec::new();
    };
    let Some(at) = skeleton
        .windows(mark.len())
        .position(|w| w == mark.as_slice())
    else {
        return Vec::new();
    };
    let encoded_len = if utf8 {
        2 + body
            .iter()
            .map(|&b| match b {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
                0..0x20 => 6,
                _ => 1,
            })
            .sum::<usize>()
    } else {
        2 + body.len().div_ceil(3) * 4
    };
    let mut out = Vec::with_capacity(skeleton.len() - mark.len() + encoded_len);
    out.extend_from_slice(&skeleton[..at]);
    match std::str::from_utf8(body) {
        Ok(text) => {
            if serde_json::to_writer(&mut out, text).is_err() {
                return Vec::new();
            }
        }
        Err(_) => {
            out.push(b'"');
            base64_into(&mut out, body);
            out.push(b'"');
        }
    }
    out.extend_from_slice(&skeleton[at + mark.len()..]);
    out
}

/// The original bytes of a message [`poison_body`] dead-lettered, exactly as they
/// arrived: the wrapper's `data.body` unwrapped, or, for a poison JSON object that carries
/// its block appended to its own text, that text without the block. `None` when
/// `dead_lettered` is neither (e.g. a dead letter of another reason).
pub fn recover_poison(dead_lettered: &[u8]) -> Option<Vec<u8>> {
    let obj = parse_object(dead_lettered)?;
    if obj.get("job").and_then(Value::as_str) == Some(POISON_URN) {
        let data = obj.get("data")?;
        let body = data.get("body")?.as_str()?;
        return match data.get("encoding")?.as_str()? {
            "utf8" => Some(body.as_bytes().to_vec()),
            "base64" => unbase64(body),
            _ => None,
        };
    }
    let block = obj.get("dead_letter")?;
    if block.get("reason")?.as_str()? != "poison" {
        return None;
    }
    // This SDK has never written the family's `raw` record, so a record of its own with a
    // `raw` member is a spliced object that had one.
    if block.get("lang").and_then(Value::as_str) != Some(LANG)
        && let Some(raw) = family_raw(&obj)
    {
        return Some(raw);
    }
    json_text::strip_last(dead_lettered, "dead_letter")
}

/// The bytes of the family's poison record (ADR-0035, written by the other SDKs):
/// `{"raw": <the body as text>, "dead_letter": …}`, or with `"raw_encoding": "base64"` and
/// the standard base64 of the exact bytes. `None` for any other object. A spliced object
/// whose only member was a string `raw` reads the same: the record cannot tell them apart.
fn family_raw(obj: &Map<String, Value>) -> Option<Vec<u8>> {
    let raw = obj.get("raw")?.as_str()?;
    match (obj.len(), obj.get("raw_encoding")) {
        (2, None) => Some(raw.as_bytes().to_vec()),
        (3, Some(Value::String(e))) if e == "base64" => unbase64(raw),
        _ => None,
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 (RFC 4648 §4), padded.
fn base64(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    base64_into(&mut out, bytes);
    // The alphabet is ASCII.
    String::from_utf8(out).unwrap_or_default()
}

fn base64_into(out: &mut Vec<u8>, bytes: &[u8]) {
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
}

fn unbase64(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for chunk in text.chunks(4) {
        let mut n = 0u32;
        let mut pad = 0;
        for &c in chunk {
            let v = match c {
                b'=' => {
                    pad += 1;
                    0
                }
                _ if pad > 0 => return None,
                _ => ALPHABET.iter().position(|&a| a == c)? as u32,
            };
            n = (n << 6) | v;
        }
        if pad > 2 {
            return None;
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_poison_keeps_the_bytes_and_is_allocated_once() {
        for body in [
            &b"{\"job\":\"urn:x\",\"data\":{\"s\":\"a\\\"b\\n\x01\"}}\n\t"[..],
            b"\xff\x00\x01 binary",
            b"",
            "caf\u{e9} \u{2615} \u{7f}".as_bytes(),
        ] {
            let out = poison_oversized(body, "too big", "orders");
            assert_eq!(
                out.len(),
                out.capacity(),
                "exactly one allocation of the final size"
            );
            let env = Envelope::decode(&out).unwrap();
            assert_eq!(env.job, POISON_URN);
            assert_eq!(env.meta.queue, "orders");
            let dl = env.dead_letter.unwrap();
            assert_eq!(dl.reason, babelqueue_core::DeadLetterReason::Poison);
            assert_eq!(recover_poison(&out).unwrap(), body);
        }
    }

    #[test]
    fn base64_rfc4648_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), enc);
            assert_eq!(unbase64(enc).unwrap(), plain.as_bytes());
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unbase64(&base64(&all)).unwrap(), all);
        assert!(unbase64("Zg=").is_none());
        assert!(unbase64("Z=g=").is_none());
        assert!(unbase64("Z***").is_none());
    }

    #[test]
    fn poison_object_keeps_its_fields_and_gains_a_block() {
        let body = br#"{"job":"urn:x","trace_id":"t","data":{},"meta":{"id":"m","queue":"orders","schema_version":2},"attempts":1,"x_custom":[1]}"#;
        let err = Envelope::decode(body).unwrap_err();
        let out: Value = serde_json::from_slice(&poison_body(body, &err, "consumed")).unwrap();
        assert_eq!(out["x_custom"], serde_json::json!([1]));
        assert_eq!(out["meta"]["schema_version"], 2);
        assert_eq!(out["dead_letter"]["reason"], "poison");
        assert_eq!(out["dead_letter"]["original_queue"], "orders");
        assert_eq!(out["dead_letter"]["attempts"], 1);
        assert_eq!(out["dead_letter"]["lang"], "rust");
        assert!(
            out["dead_letter"]["error"]
                .as_str()
                .unwrap()
                .contains("schema_version")
        );
    }

    #[test]
    fn poison_non_objects_round_trip_their_bytes() {
        let big = vec![b'z'; 1 << 20];
        for body in [
            &b"not json"[..],
            b"[1,2,3]",
            b"42",
            b"",
            b"\xc3\x28 invalid utf8",
            b"\"\\u0000 quote \\\" newline \n\"",
            &big,
        ] {
            let err = Envelope::decode(body).unwrap_err();
            let dlq = poison_body(body, &err, "q");
            let env = Envelope::decode(&dlq).expect("the wrapper is an accepted envelope");
            assert_eq!(env.job, POISON_URN);
            assert_eq!(env.meta.queue, "q");
            let dl = env.dead_letter.unwrap();
            assert_eq!(dl.original_queue, "q");
            assert_eq!(dl.error.unwrap(), err.to_string());
            assert_eq!(recover_poison(&dlq).unwrap(), body);
        }
    }

    #[test]
    fn dead_lettered_sets_attempts_and_keeps_order_and_extras() {
        let body = br#"{"job":"urn:x","trace_id":"t","data":{"b":1,"a":2},"meta":{"id":"m","queue":"","lang":"go","schema_version":1,"created_at":5},"attempts":2,"extra":true}"#;
        let block = Block {
            reason: "failed",
            error: Some("boom".into()),
            exception: Some("my::Error"),
            attempts: 3,
        };
        let out = dead_lettered(body, "consumed", true, &block).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(r#"{"job":"urn:x","trace_id":"t","data":{"b":1,"a":2},"#));
        assert!(text.contains(r#""attempts":3,"extra":true,"dead_letter":{"reason":"failed","error":"boom","exception":"my::Error","failed_at":"#));
        assert!(text.ends_with(r#""original_queue":"consumed","attempts":3,"lang":"rust"}}"#));
    }

    #[test]
    fn a_retry_and_a_dead_letter_change_only_what_the_contract_changes() {
        let body = br#"{"job":"urn:x","trace_id":"t","data":{"big":123456789012345678901234567890,"e":1.0E2,"z":-0,"dup":1,"dup":2},"meta":{"id":"m","queue":"orders","lang":"go","schema_version":1,"created_at":1},"attempts":0}"#;
        let retried = with_attempts(body, 1).unwrap();
        let expect = std::str::from_utf8(body)
            .unwrap()
            .replace(r#""attempts":0}"#, r#""attempts":1}"#);
        assert_eq!(std::str::from_utf8(&retried).unwrap(), expect);
        let block = Block {
            reason: "failed",
            error: Some("boom".into()),
            exception: None,
            attempts: 3,
        };
        let dl = dead_lettered(&retried, "orders", true, &block).unwrap();
        let text = std::str::from_utf8(&dl).unwrap();
        let head = expect.replace(r#""attempts":1}"#, r#""attempts":3,"dead_letter":"#);
        assert!(text.starts_with(&head), "{text}");
        let v: Value = serde_json::from_slice(&dl).unwrap();
        assert_eq!(v["dead_letter"]["original_queue"], "orders");
        assert_eq!(v["dead_letter"]["attempts"], 3);
    }

    #[test]
    fn every_poison_object_is_recovered_byte_for_byte() {
        for body in [
            &br#"{ "job" : "urn:x" , "n": 1e400 }"#[..],
            br#"{}"#,
            br#"{"job":"urn:x","dead_letter":{"reason":"failed"}}"#,
            br#"{"__bq_frame":1,"body":"{}","headers":{}}"#,
            br#"{"job":"urn:babel:poison","data":{"encoding":"utf8","body":"other"},"dead_letter":{"reason":"poison"}}"#,
            br#"{"job":"urn:babel:poison"}"#,
        ] {
            let err = Envelope::decode(body).unwrap_err();
            let dlq = poison_body(body, &err, "q");
            let env: Value = serde_json::from_slice(&dlq).unwrap();
            assert_eq!(env["dead_letter"]["reason"], "poison");
            assert_eq!(
                recover_poison(&dlq).as_deref(),
                Some(body),
                "{}",
                String::from_utf8_lossy(&dlq)
            );
        }
    }

    #[test]
    fn the_family_s_poison_records_are_recovered() {
        let block = r#"{"reason":"poison","error":"e","exception":null,"failed_at":1,"original_queue":"q","attempts":0,"lang":"python"}"#;
        // Each record as the Python SDK 1.24.0's `build_poison_record` writes it.
        for (body, record) in [
            (
                &b"not json at all"[..],
                format!(r#"{{"raw":"not json at all","dead_letter":{block}}}"#),
            ),
            (
                b"[1,2]",
                format!(r#"{{"raw":"[1,2]","dead_letter":{block}}}"#),
            ),
            (
                b"\xff\x00 bin",
                format!(r#"{{"raw":"/wAgYmlu","raw_encoding":"base64","dead_letter":{block}}}"#),
            ),
            (
                br#"{"a":1,"dead_letter":{"x":1}}"#,
                format!(
                    r#"{{"raw":"{{\"a\":1,\"dead_letter\":{{\"x\":1}}}}","dead_letter":{block}}}"#
                ),
            ),
            (
                br#"{"a":1 ,"n":92345678901234567890 }"#,
                format!(r#"{{"a":1 ,"n":92345678901234567890 ,"dead_letter":{block}}}"#),
            ),
            (
                "\"caf\u{e9}\"".as_bytes(),
                format!("{{\"raw\":\"\\\"caf\u{e9}\\\"\",\"dead_letter\":{block}}}"),
            ),
        ] {
            assert_eq!(
                recover_poison(record.as_bytes()).as_deref(),
                Some(body),
                "{record}"
            );
        }
        // Not a record: another reason, or a `raw` beside other members.
        let other = r#"{"raw":"x","dead_letter":{"reason":"failed","lang":"python"}}"#;
        assert_eq!(recover_poison(other.as_bytes()), None);
        // This SDK's splice of an object whose only member is `raw` stays that object.
        let body = br#"{"raw":"x"}"#;
        let err = Envelope::decode(body).unwrap_err();
        assert_eq!(
            recover_poison(&poison_body(body, &err, "q")).as_deref(),
            Some(&body[..])
        );
    }
}
