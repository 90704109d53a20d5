//! RabbitMQ (AMQP 0-9-1): the envelope's native projection and the attempts rule.
//!
//! The body of an AMQP message is the envelope, byte for byte. What the binding adds on
//! produce is a routable *view* of it in the basic properties and the header table, as every
//! SDK of the family writes it (the conformance manifest's `rabbitmq.property_projection`
//! block, SPEC §7):
//!
//! | AMQP slot | value |
//! | --- | --- |
//! | `type` | `job` (the URN) |
//! | `correlation_id` | `trace_id` |
//! | `message_id` | `meta.id` |
//! | `app_id` | `babelqueue` |
//! | `content_type` | `application/json` |
//! | `content_encoding` | `utf-8` ([`CONTENT_ENCODING`], as the Python SDK's pika transport sets it) |
//! | `delivery_mode` | `2` (persistent) |
//! | header `x-schema-version` | `meta.schema_version`, an **integer** |
//! | header `x-source-lang` | `meta.lang`, a string |
//! | header `x-attempts` | `attempts`, an **integer** |
//!
//! Header values are natively typed ([`HeaderValue`]): AMQP field tables carry typed values,
//! so integers stay integers (unlike Kafka and Pulsar, where they are strings). The Python
//! SDK (1.24.0) sets no `timestamp` property, so neither does this projection
//! ([`Projection::timestamp`] is `None`).
//!
//! Out-of-band headers (a W3C `traceparent`, `bq-replay-bypass`, …) ride the same header
//! table; the contract headers win a collision ([`Projection::merged_headers`]).
//!
//! This module depends on no AMQP client: a transport converts [`Projection`] into its
//! client's property type.
//!
//! ```
//! use babelqueue_core::Envelope;
//! use babelqueue_core::binding::amqp::{self, HeaderValue};
//!
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
//! let p = amqp::project(&env);
//! assert_eq!(p.kind, "urn:babel:payments:charge");
//! assert_eq!(p.message_id, env.meta.id);
//! assert_eq!(p.delivery_mode, 2);
//! assert!(p.headers.contains(&("x-attempts", HeaderValue::Int(0))));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use serde_json::{Map, Value};

use crate::envelope::Envelope;

/// The `app_id` property every BabelQueue producer writes.
pub const APP_ID: &str = "babelqueue";

/// The `content_type` property of every BabelQueue message.
pub const CONTENT_TYPE: &str = "application/json";

/// The `content_encoding` property the Python SDK's pika transport writes beside
/// [`CONTENT_TYPE`] (not part of the conformance block; a transport that wants the same
/// properties as the Python SDK sets it too).
///
/// ```
/// assert_eq!(babelqueue_core::binding::amqp::CONTENT_ENCODING, "utf-8");
/// ```
pub const CONTENT_ENCODING: &str = "utf-8";

/// AMQP `delivery_mode` 2: persistent.
pub const PERSISTENT: u8 = 2;

/// Header carrying `meta.schema_version` (an integer).
pub const SCHEMA_VERSION_HEADER: &str = "x-schema-version";
/// Header carrying `meta.lang` (a string).
pub const SOURCE_LANG_HEADER: &str = "x-source-lang";
/// Header carrying `attempts` (an integer): a mirror of the body's counter.
pub const ATTEMPTS_HEADER: &str = "x-attempts";

/// The suffix of the family's dead-letter queue: `<queue>.dlq`.
///
/// ```
/// use babelqueue_core::binding::amqp::DEAD_LETTER_SUFFIX;
/// assert_eq!(format!("payments{DEAD_LETTER_SUFFIX}"), "payments.dlq");
/// ```
pub const DEAD_LETTER_SUFFIX: &str = ".dlq";

/// A value of an AMQP 0-9-1 field table, natively typed.
///
/// A transport maps [`Int`](HeaderValue::Int) to its client's signed integer type (the
/// Python SDK's pika writes a 32-bit `I` when the value fits, else a 64-bit `l`) and
/// [`Str`](HeaderValue::Str) to a long string.
///
/// ```
/// use babelqueue_core::binding::amqp::HeaderValue;
/// assert_eq!(HeaderValue::Int(3).as_int(), Some(3));
/// assert_eq!(HeaderValue::Str("go".into()).as_str(), Some("go"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HeaderValue {
    /// A signed integer (`x-schema-version`, `x-attempts`).
    Int(i64),
    /// A UTF-8 string (`x-source-lang`, out-of-band headers).
    Str(String),
}

impl HeaderValue {
    /// The integer, when this is one.
    ///
    /// ```
    /// use babelqueue_core::binding::amqp::HeaderValue;
    /// assert_eq!(HeaderValue::Str("1".into()).as_int(), None);
    /// ```
    pub fn as_int(&self) -> Option<i64> {
        match self {
            HeaderValue::Int(i) => Some(*i),
            HeaderValue::Str(_) => None,
        }
    }

    /// The string, when this is one.
    ///
    /// ```
    /// use babelqueue_core::binding::amqp::HeaderValue;
    /// assert_eq!(HeaderValue::Int(1).as_str(), None);
    /// ```
    pub fn as_str(&self) -> Option<&str> {
        match self {
            HeaderValue::Str(s) => Some(s),
            HeaderValue::Int(_) => None,
        }
    }
}

/// The AMQP basic properties and headers projected from one envelope.
///
/// ```
/// use babelqueue_core::binding::amqp::{self, HeaderValue};
/// use babelqueue_core::Envelope;
///
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// let p = amqp::project(&env);
/// assert_eq!((p.app_id, p.content_type, p.timestamp), ("babelqueue", "application/json", None));
/// assert_eq!(p.headers[0], ("x-schema-version", HeaderValue::Int(1)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    /// AMQP `type`: the `job` (URN), so a consumer routes without reading the body.
    pub kind: String,
    /// AMQP `correlation_id`: the `trace_id`.
    pub correlation_id: String,
    /// AMQP `message_id`: `meta.id`.
    pub message_id: String,
    /// AMQP `app_id`: always [`APP_ID`].
    pub app_id: &'static str,
    /// AMQP `content_type`: always [`CONTENT_TYPE`].
    pub content_type: &'static str,
    /// AMQP `delivery_mode`: always [`PERSISTENT`] (2).
    pub delivery_mode: u8,
    /// AMQP `timestamp` (seconds): `None`, as the Python SDK 1.24.0 sets none.
    pub timestamp: Option<u64>,
    /// The contract headers, in this order: `x-schema-version`, `x-source-lang`,
    /// `x-attempts` (natively typed). A lenient projection ([`project_body`]) leaves out a
    /// header whose field is absent or of another type.
    pub headers: Vec<(&'static str, HeaderValue)>,
}

impl Projection {
    /// The header table to publish: `extra` (out-of-band headers such as `traceparent`,
    /// empty keys and values skipped) first, then the contract headers, which replace an
    /// out-of-band header of the same name (the contract wins a collision, as in every SDK).
    ///
    /// ```
    /// use babelqueue_core::binding::amqp::{self, HeaderValue};
    /// use babelqueue_core::Envelope;
    ///
    /// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
    /// let table = amqp::project(&env)
    ///     .merged_headers([("traceparent", "00-ab-cd-01"), ("x-attempts", "99")]);
    /// assert_eq!(table[0], ("traceparent".to_string(), HeaderValue::Str("00-ab-cd-01".into())));
    /// assert!(table.contains(&("x-attempts".to_string(), HeaderValue::Int(0))));
    /// assert_eq!(table.len(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn merged_headers<K, V>(
        &self,
        extra: impl IntoIterator<Item = (K, V)>,
    ) -> Vec<(String, HeaderValue)>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut out: Vec<(String, HeaderValue)> = Vec::new();
        for (k, v) in extra {
            let (k, v) = (k.as_ref(), v.as_ref());
            if k.is_empty() || v.is_empty() || self.headers.iter().any(|(c, _)| *c == k) {
                continue;
            }
            match out.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = HeaderValue::Str(v.to_owned()),
                None => out.push((k.to_owned(), HeaderValue::Str(v.to_owned()))),
            }
        }
        out.extend(
            self.headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone())),
        );
        out
    }
}

/// Projects a decoded envelope onto AMQP properties and headers (see the module table).
///
/// ```
/// use babelqueue_core::binding::amqp::{self, HeaderValue};
/// use babelqueue_core::Envelope;
///
/// let mut env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
/// env.attempts = 3;
/// let p = amqp::project(&env);
/// assert_eq!(p.correlation_id, env.trace_id);
/// assert_eq!(p.headers, vec![
///     ("x-schema-version", HeaderValue::Int(1)),
///     ("x-source-lang", HeaderValue::Str("rust".into())),
///     ("x-attempts", HeaderValue::Int(3)),
/// ]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn project(env: &Envelope) -> Projection {
    Projection {
        kind: env.job.clone(),
        correlation_id: env.trace_id.clone(),
        message_id: env.meta.id.clone(),
        app_id: APP_ID,
        content_type: CONTENT_TYPE,
        delivery_mode: PERSISTENT,
        timestamp: None,
        headers: vec![
            (
                SCHEMA_VERSION_HEADER,
                HeaderValue::Int(i64::from(env.meta.schema_version)),
            ),
            (SOURCE_LANG_HEADER, HeaderValue::Str(env.meta.lang.clone())),
            (ATTEMPTS_HEADER, HeaderValue::Int(i64::from(env.attempts))),
        ],
    }
}

/// Lenient: parses `body` as an envelope (without the full acceptance check) and projects
/// it; `None` when it is not one (poison bodies are published without a projection).
///
/// "An envelope" here is a JSON object with a non-empty string URN (`job`, else the `urn`
/// alias). Every other field is read leniently, as the Python SDK's pika transport does:
/// `trace_id` and `meta.id` become the empty string when absent or not a string (a numeric
/// `meta.id` or `meta.lang` is written in decimal, as `Envelope::decode` reads them); `x-schema-version` and `x-attempts` are set when the
/// field is an integer (`attempts` absent counts as 0, as in Python) and left out
/// otherwise; `x-source-lang` is set when `meta.lang` is a string or a number. So a retried or
/// dead-lettered body with an unsupported `schema_version` still carries its view, and
/// bytes that are not a JSON object (or an object with no URN) carry none.
///
/// ```
/// use babelqueue_core::binding::amqp::{self, HeaderValue};
///
/// let body = br#"{"job":"urn:babel:orders:created","trace_id":"t","data":{},
///     "meta":{"id":"m","queue":"orders","lang":"go","schema_version":2,"created_at":0},"attempts":1}"#;
/// let p = amqp::project_body(body).expect("an envelope, although schema_version 2");
/// assert_eq!(p.headers[0], ("x-schema-version", HeaderValue::Int(2)));
/// assert_eq!(amqp::project_body(b"\xff not json"), None);
/// assert_eq!(amqp::project_body(br#"{"data":{}}"#), None);
/// ```
pub fn project_body(body: &[u8]) -> Option<Projection> {
    let lenient = Lenient::parse(body)?;
    let mut headers = Vec::with_capacity(3);
    if let Some(v) = lenient.meta_int("schema_version") {
        headers.push((SCHEMA_VERSION_HEADER, HeaderValue::Int(v)));
    }
    if let Some(lang) = lenient.meta_text("lang") {
        headers.push((SOURCE_LANG_HEADER, HeaderValue::Str(lang)));
    }
    if let Some(a) = lenient.attempts() {
        headers.push((ATTEMPTS_HEADER, HeaderValue::Int(a)));
    }
    Some(Projection {
        kind: lenient.urn.to_owned(),
        correlation_id: lenient.str_field("trace_id").unwrap_or_default().to_owned(),
        message_id: lenient.meta_id().unwrap_or_default(),
        app_id: APP_ID,
        content_type: CONTENT_TYPE,
        delivery_mode: PERSISTENT,
        timestamp: None,
        headers,
    })
}

/// AMQP's own attempts rule for the App runtime: **the body's** `attempts`.
///
/// RabbitMQ (AMQP 0-9-1 classic queues) has no delivery count, and the App runtimes of the
/// family (Go, Python, this one) retry by republishing the body with `attempts + 1`, so the
/// body is always current. The `x-attempts` header is a produce-side mirror of it (SPEC
/// §7; the manifest's `rabbitmq` block says consume-side attempts are runtime-specific), so
/// it never changes the count: not when it is higher (a foreign producer's stale or wrong
/// mirror), not when it is lower, not when it is absent or negative. The Laravel driver,
/// which reads the header, increments the body too, so both stay consistent.
///
/// ```
/// use babelqueue_core::binding::amqp::reconcile_attempts;
/// assert_eq!(reconcile_attempts(2, Some(2)), 2);
/// assert_eq!(reconcile_attempts(2, Some(7)), 2); // the mirror never wins
/// assert_eq!(reconcile_attempts(4, None), 4);
/// ```
pub fn reconcile_attempts(body_attempts: u32, header_attempts: Option<i64>) -> u32 {
    let _mirror_only = header_attempts;
    body_attempts
}

/// A JSON object read leniently: the binding projections' view of a body that may not be
/// an accepted envelope. Shared by the `project_body` functions of every binding.
pub(crate) struct Lenient {
    pub(crate) obj: Map<String, Value>,
    pub(crate) urn: String,
}

impl Lenient {
    /// `Some` when `body` is a JSON object with a non-empty string `job` (else `urn`).
    pub(crate) fn parse(body: &[u8]) -> Option<Lenient> {
        let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(body) else {
            return None;
        };
        let urn = [obj.get("job"), obj.get("urn")]
            .into_iter()
            .flatten()
            .find_map(|v| v.as_str().filter(|s| !s.is_empty()))?
            .to_owned();
        Some(Lenient { obj, urn })
    }

    fn meta(&self) -> Option<&Map<String, Value>> {
        self.obj.get("meta").and_then(Value::as_object)
    }

    /// A top-level string field.
    pub(crate) fn str_field(&self, key: &str) -> Option<&str> {
        self.obj.get(key).and_then(Value::as_str)
    }

    /// A text field of `meta`: a string, or a number in decimal (as `Envelope::decode`
    /// reads `meta.id`, `meta.queue` and `meta.lang`).
    pub(crate) fn meta_text(&self, key: &str) -> Option<String> {
        match self.meta()?.get(key)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }

    /// An integer field of `meta` (within i64).
    pub(crate) fn meta_int(&self, key: &str) -> Option<i64> {
        self.meta()?.get(key).and_then(Value::as_i64)
    }

    /// `meta.id` as text (see [`meta_text`](Self::meta_text)).
    pub(crate) fn meta_id(&self) -> Option<String> {
        self.meta_text("id")
    }

    /// `attempts`: an integer (within i64), 0 when absent or null (the Python SDKs'
    /// `envelope.get("attempts", 0)`), `None` for any other value.
    pub(crate) fn attempts(&self) -> Option<i64> {
        match self.obj.get("attempts") {
            None | Some(Value::Null) => Some(0),
            Some(v) => v.as_i64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env() -> Envelope {
        let mut e = Envelope::new("urn:babel:orders:created", json!({"n": 1})).unwrap();
        e.meta.lang = "php".into();
        e
    }

    #[test]
    fn project_maps_every_slot() {
        let mut e = env();
        e.attempts = 7;
        let p = project(&e);
        assert_eq!(p.kind, "urn:babel:orders:created");
        assert_eq!(p.correlation_id, e.trace_id);
        assert_eq!(p.message_id, e.meta.id);
        assert_eq!(p.app_id, "babelqueue");
        assert_eq!(p.content_type, "application/json");
        assert_eq!(p.delivery_mode, 2);
        assert_eq!(p.timestamp, None);
        assert_eq!(
            p.headers,
            vec![
                ("x-schema-version", HeaderValue::Int(1)),
                ("x-source-lang", HeaderValue::Str("php".into())),
                ("x-attempts", HeaderValue::Int(7)),
            ]
        );
    }

    #[test]
    fn project_keeps_an_empty_id_and_big_attempts() {
        let mut e = env();
        e.meta.id.clear();
        e.attempts = u32::MAX;
        let p = project(&e);
        assert_eq!(p.message_id, "");
        assert_eq!(
            p.headers[2],
            ("x-attempts", HeaderValue::Int(i64::from(u32::MAX)))
        );
    }

    #[test]
    fn project_body_equals_project_for_an_accepted_envelope() {
        let mut e = env();
        e.attempts = 2;
        assert_eq!(project_body(&e.encode()), Some(project(&e)));
    }

    #[test]
    fn project_body_reads_the_urn_alias_and_a_numeric_id() {
        let body = br#"{"urn":"urn:x","trace_id":"t","data":{},"meta":{"id":42,"lang":"go","schema_version":1}}"#;
        let p = project_body(body).unwrap();
        assert_eq!(p.kind, "urn:x");
        assert_eq!(p.message_id, "42");
        // attempts absent counts as 0, like the Python SDK.
        assert_eq!(p.headers[2], ("x-attempts", HeaderValue::Int(0)));
        // A numeric lang reads as Envelope::decode reads it.
        let body = br#"{"job":"urn:x","trace_id":"t","data":{},"meta":{"id":"m","lang":7,"schema_version":1},"attempts":0}"#;
        let env = Envelope::decode(body).unwrap();
        assert_eq!(project_body(body), Some(project(&env)));
    }

    #[test]
    fn project_body_leaves_out_headers_of_the_wrong_type() {
        let body = br#"{"job":"urn:x","trace_id":5,"meta":{"schema_version":"1","lang":true},"attempts":"3"}"#;
        let p = project_body(body).unwrap();
        assert_eq!(p.correlation_id, "");
        assert_eq!(p.message_id, "");
        assert!(p.headers.is_empty(), "{:?}", p.headers);
        // meta not an object: no meta headers, but the URN view is still there.
        let p = project_body(br#"{"job":"urn:x","meta":[],"attempts":-2}"#).unwrap();
        assert_eq!(p.headers, vec![("x-attempts", HeaderValue::Int(-2))]);
    }

    #[test]
    fn project_body_refuses_what_is_no_envelope() {
        for body in [
            &b""[..],
            b"null",
            b"[1]",
            b"\"urn:x\"",
            b"{}",
            br#"{"job":""}"#,
            br#"{"job":1,"urn":""}"#,
            b"{\"job\":\"urn:x\"",
            b"\xff\xfe",
        ] {
            assert_eq!(project_body(body), None, "{body:?}");
        }
    }

    #[test]
    fn reconcile_is_the_body() {
        assert_eq!(reconcile_attempts(0, None), 0);
        assert_eq!(reconcile_attempts(3, Some(0)), 3);
        assert_eq!(reconcile_attempts(3, Some(9)), 3);
        assert_eq!(reconcile_attempts(3, Some(-1)), 3);
        assert_eq!(reconcile_attempts(u32::MAX, Some(i64::MAX)), u32::MAX);
    }

    #[test]
    fn merged_headers_contract_wins_and_duplicates_collapse() {
        let p = project(&env());
        let t = p.merged_headers([
            ("a", "1"),
            ("", "skip"),
            ("b", ""),
            ("a", "2"),
            ("x-source-lang", "cobol"),
        ]);
        assert_eq!(t[0], ("a".into(), HeaderValue::Str("2".into())));
        assert_eq!(t.len(), 4);
        assert!(t.contains(&("x-source-lang".into(), HeaderValue::Str("php".into()))));
    }
}
