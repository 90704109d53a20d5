//! Amazon SQS: the envelope's `MessageAttributes`, the attempts rule and the DLQ name.
//!
//! The message body is the envelope, byte for byte. On produce the binding adds a routable
//! view in `MessageAttributes` (the manifest's `sqs.attribute_projection` block, SPEC §7):
//!
//! | attribute | `DataType` | value |
//! | --- | --- | --- |
//! | `bq-job` | `String` | `job` (the URN) |
//! | `bq-trace-id` | `String` | `trace_id` |
//! | `bq-message-id` | `String` | `meta.id` |
//! | `bq-schema-version` | `Number` | `meta.schema_version` |
//! | `bq-source-lang` | `String` | `meta.lang` |
//! | `bq-created-at` | `Number` | `meta.created_at` (Unix ms) |
//!
//! SQS rejects an attribute with an empty value, so, as in the Python SDK, a `String`
//! attribute whose value is empty is left out (an empty `meta.id` gives no `bq-message-id`).
//!
//! On consume, `attempts = max(body, ApproximateReceiveCount − 1)` ([`reconcile_attempts`]).
//! Dead letters go to `<queue>-dlq` (`<queue>-dlq.fifo` for a FIFO queue), since an SQS
//! queue name allows no `.` but the one of `.fifo` ([`dead_letter_queue_name`]).
//!
//! ```
//! use babelqueue_core::binding::sqs;
//! use babelqueue_core::Envelope;
//!
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
//! let attrs = sqs::message_attributes(&env);
//! assert_eq!(attrs[0].0, "bq-job");
//! assert_eq!(attrs[0].1.string_value, "urn:babel:payments:charge");
//! assert_eq!(sqs::reconcile_attempts(0, Some("3")), 2);
//! assert_eq!(sqs::dead_letter_queue_name("orders.fifo"), "orders-dlq.fifo");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::binding::amqp::Lenient;
use crate::envelope::Envelope;

/// `bq-job`: the URN.
pub const JOB: &str = "bq-job";
/// `bq-trace-id`: the `trace_id`.
pub const TRACE_ID: &str = "bq-trace-id";
/// `bq-message-id`: `meta.id`.
pub const MESSAGE_ID: &str = "bq-message-id";
/// `bq-schema-version`: `meta.schema_version` (Number).
pub const SCHEMA_VERSION: &str = "bq-schema-version";
/// `bq-source-lang`: `meta.lang`.
pub const SOURCE_LANG: &str = "bq-source-lang";
/// `bq-created-at`: `meta.created_at` (Number, Unix ms).
pub const CREATED_AT: &str = "bq-created-at";

/// SQS's cap on the attributes of one message.
pub const MAX_ATTRIBUTES: usize = 10;

/// The default dead-letter suffix on SQS (`-dlq`; a `.` is not allowed in a queue name).
pub const DEAD_LETTER_SUFFIX: &str = "-dlq";

/// The suffix SQS requires on a FIFO queue's name.
pub const FIFO_SUFFIX: &str = ".fifo";

/// One SQS message attribute: its `DataType` and `StringValue` (a `Number` travels as its
/// decimal text too).
///
/// ```
/// use babelqueue_core::binding::sqs::Attribute;
/// let a = Attribute::number(1749132727000_i64);
/// assert_eq!((a.data_type, a.string_value.as_str()), ("Number", "1749132727000"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attribute {
    /// `"String"` or `"Number"`.
    pub data_type: &'static str,
    /// The value as text.
    pub string_value: String,
}

impl Attribute {
    /// A `String` attribute.
    ///
    /// ```
    /// assert_eq!(babelqueue_core::binding::sqs::Attribute::string("go").data_type, "String");
    /// ```
    pub fn string(value: impl Into<String>) -> Self {
        Attribute {
            data_type: "String",
            string_value: value.into(),
        }
    }

    /// A `Number` attribute.
    ///
    /// ```
    /// assert_eq!(babelqueue_core::binding::sqs::Attribute::number(1).string_value, "1");
    /// ```
    pub fn number(value: impl std::fmt::Display) -> Self {
        Attribute {
            data_type: "Number",
            string_value: value.to_string(),
        }
    }
}

fn push_str(out: &mut Vec<(&'static str, Attribute)>, name: &'static str, value: &str) {
    if !value.is_empty() {
        out.push((name, Attribute::string(value)));
    }
}

/// The `MessageAttributes` of an envelope, in the table's order (empty strings left out).
///
/// ```
/// use babelqueue_core::binding::sqs;
/// use babelqueue_core::Envelope;
///
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// let attrs = sqs::message_attributes(&env);
/// let names: Vec<_> = attrs.iter().map(|(n, _)| *n).collect();
/// assert_eq!(names, ["bq-job", "bq-trace-id", "bq-message-id",
///                    "bq-schema-version", "bq-source-lang", "bq-created-at"]);
/// assert_eq!(attrs[3].1.data_type, "Number");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn message_attributes(env: &Envelope) -> Vec<(&'static str, Attribute)> {
    let mut out = Vec::with_capacity(6);
    push_str(&mut out, JOB, &env.job);
    push_str(&mut out, TRACE_ID, &env.trace_id);
    push_str(&mut out, MESSAGE_ID, &env.meta.id);
    out.push((SCHEMA_VERSION, Attribute::number(env.meta.schema_version)));
    push_str(&mut out, SOURCE_LANG, &env.meta.lang);
    out.push((CREATED_AT, Attribute::number(env.meta.created_at)));
    out
}

/// Lenient: the attributes of a body that is an envelope without the full acceptance check
/// (a JSON object with a non-empty string `job`, else `urn`), `None` for anything else
/// (a poison body is sent without attributes).
///
/// Strings are taken when they are non-empty strings (a numeric `meta.id` or `meta.lang` in decimal),
/// numbers when they are integers; anything else is left out.
///
/// ```
/// use babelqueue_core::binding::sqs;
/// let attrs = sqs::project_body(br#"{"job":"urn:x","meta":{"created_at":5}}"#).unwrap();
/// assert_eq!(attrs.len(), 2);
/// assert_eq!(attrs[1].0, "bq-created-at");
/// assert_eq!(sqs::project_body(b"not json"), None);
/// ```
pub fn project_body(body: &[u8]) -> Option<Vec<(&'static str, Attribute)>> {
    let l = Lenient::parse(body)?;
    let mut out = Vec::with_capacity(6);
    push_str(&mut out, JOB, &l.urn);
    push_str(
        &mut out,
        TRACE_ID,
        l.str_field("trace_id").unwrap_or_default(),
    );
    push_str(&mut out, MESSAGE_ID, &l.meta_id().unwrap_or_default());
    if let Some(v) = l.meta_int("schema_version") {
        out.push((SCHEMA_VERSION, Attribute::number(v)));
    }
    push_str(
        &mut out,
        SOURCE_LANG,
        &l.meta_text("lang").unwrap_or_default(),
    );
    if let Some(v) = l.meta_int("created_at") {
        out.push((CREATED_AT, Attribute::number(v)));
    }
    Some(out)
}

/// Merges out-of-band headers (e.g. `traceparent`) as `String` attributes after the
/// contract attributes: a contract name wins a collision, empty names and values are
/// skipped, and nothing is added once SQS's cap of [`MAX_ATTRIBUTES`] is reached (the
/// contract attributes are always kept), as in the Python SDK.
///
/// ```
/// use babelqueue_core::binding::sqs;
/// use babelqueue_core::Envelope;
///
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// let all = sqs::merge_attributes(sqs::message_attributes(&env),
///     [("traceparent", "00-ab"), ("bq-job", "other")]);
/// assert_eq!(all.len(), 7);
/// assert_eq!(all[0].1.string_value, "urn:babel:orders:created");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn merge_attributes<K, V>(
    contract: Vec<(&'static str, Attribute)>,
    headers: impl IntoIterator<Item = (K, V)>,
) -> Vec<(String, Attribute)>
where
    K: AsRef<str>,
    V: AsRef<str>,
{
    let mut out: Vec<(String, Attribute)> = contract
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    for (k, v) in headers {
        let (k, v) = (k.as_ref(), v.as_ref());
        if k.is_empty() || v.is_empty() || out.iter().any(|(n, _)| n == k) {
            continue;
        }
        if out.len() >= MAX_ATTRIBUTES {
            break;
        }
        out.push((k.to_owned(), Attribute::string(v)));
    }
    out
}

/// SQS's attempts rule: `max(body, ApproximateReceiveCount − 1)`.
///
/// `ApproximateReceiveCount` is SQS's 1-based delivery count, as the text SQS returns. A
/// first delivery (count 1) reads the body's count; a count the runtime already passed (it
/// retries by republishing with `attempts + 1`) never lowers it. A missing count, or one
/// that is not a decimal integer (surrounding ASCII whitespace allowed), is ignored; a
/// count of 0 or less changes nothing; a count beyond `u32` saturates.
///
/// ```
/// use babelqueue_core::binding::sqs::reconcile_attempts;
/// assert_eq!(reconcile_attempts(0, Some("1")), 0);
/// assert_eq!(reconcile_attempts(2, Some("5")), 4);
/// assert_eq!(reconcile_attempts(5, Some("1")), 5);
/// assert_eq!(reconcile_attempts(4, Some("not-a-number")), 4);
/// assert_eq!(reconcile_attempts(3, None), 3);
/// ```
pub fn reconcile_attempts(body: u32, approximate_receive_count: Option<&str>) -> u32 {
    let Some(count) = approximate_receive_count.and_then(parse_count) else {
        return body;
    };
    let native = u32::try_from(count.saturating_sub(1).max(0)).unwrap_or(u32::MAX);
    body.max(native)
}

/// A decimal integer, optionally signed, with surrounding ASCII whitespace.
pub(crate) fn parse_count(text: &str) -> Option<i128> {
    let t = text.trim_matches(|c: char| c.is_ascii_whitespace());
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match t.parse::<i128>() {
        Ok(v) => Some(v),
        // More digits than an i128 holds: a huge count of either sign.
        Err(_) => Some(if t.starts_with('-') {
            i128::MIN
        } else {
            i128::MAX
        }),
    }
}

/// The family's dead-letter queue of an SQS queue: `<queue>-dlq`, and `<queue>-dlq.fifo`
/// for a FIFO queue (its name must end in `.fifo`), as the Python SDK's
/// `dead_letter_queue_name`.
///
/// ```
/// use babelqueue_core::binding::sqs::dead_letter_queue_name;
/// assert_eq!(dead_letter_queue_name("orders"), "orders-dlq");
/// assert_eq!(dead_letter_queue_name("orders.fifo"), "orders-dlq.fifo");
/// ```
pub fn dead_letter_queue_name(queue: &str) -> String {
    dead_letter_queue_name_with(queue, None)
}

/// [`dead_letter_queue_name`] with an explicit suffix (`None` or empty: [`DEAD_LETTER_SUFFIX`]);
/// the suffix goes before `.fifo` on a FIFO queue.
///
/// ```
/// use babelqueue_core::binding::sqs::dead_letter_queue_name_with;
/// assert_eq!(dead_letter_queue_name_with("orders.fifo", Some("-x")), "orders-x.fifo");
/// assert_eq!(dead_letter_queue_name_with("orders", Some("")), "orders-dlq");
/// ```
pub fn dead_letter_queue_name_with(queue: &str, suffix: Option<&str>) -> String {
    let suffix = suffix
        .filter(|s| !s.is_empty())
        .unwrap_or(DEAD_LETTER_SUFFIX);
    match queue.strip_suffix(FIFO_SUFFIX) {
        Some(base) => format!("{base}{suffix}{FIFO_SUFFIX}"),
        None => format!("{queue}{suffix}"),
    }
}

/// Whether `queue` names a FIFO queue (ends in `.fifo`).
///
/// ```
/// assert!(babelqueue_core::binding::sqs::is_fifo("a.fifo"));
/// ```
pub fn is_fifo(queue: &str) -> bool {
    queue.ends_with(FIFO_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn attributes_of_an_envelope() {
        let mut e = Envelope::new("urn:babel:a", json!({})).unwrap();
        e.meta.created_at = 1_749_132_727_000;
        let a = message_attributes(&e);
        assert_eq!(a.len(), 6);
        assert_eq!(a[5], (CREATED_AT, Attribute::number(1_749_132_727_000_i64)));
        assert_eq!(a[3].1.string_value, "1");
        assert_eq!(project_body(&e.encode()), Some(a));
    }

    #[test]
    fn empty_strings_are_left_out() {
        let mut e = Envelope::new("urn:babel:a", json!({})).unwrap();
        e.meta.id.clear();
        e.meta.lang.clear();
        let names: Vec<_> = message_attributes(&e).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, [JOB, TRACE_ID, SCHEMA_VERSION, CREATED_AT]);
    }

    #[test]
    fn project_body_refuses_non_envelopes() {
        assert_eq!(project_body(b"[]"), None);
        assert_eq!(project_body(br#"{"job":""}"#), None);
        assert_eq!(
            project_body(br#"{"urn":"u","meta":{"schema_version":1.5}}"#).map(|v| v.len()),
            Some(1)
        );
    }

    #[test]
    fn reconcile_edges() {
        assert_eq!(reconcile_attempts(0, Some(" 3\n")), 2);
        assert_eq!(reconcile_attempts(0, Some("+3")), 2);
        assert_eq!(reconcile_attempts(1, Some("0")), 1);
        assert_eq!(reconcile_attempts(1, Some("-7")), 1);
        assert_eq!(reconcile_attempts(1, Some("")), 1);
        assert_eq!(reconcile_attempts(1, Some("3.0")), 1);
        assert_eq!(reconcile_attempts(1, Some("٣")), 1);
        assert_eq!(reconcile_attempts(0, Some("4294967297")), u32::MAX);
        assert_eq!(
            reconcile_attempts(0, Some("99999999999999999999999999999999999999999999")),
            u32::MAX
        );
        assert_eq!(reconcile_attempts(u32::MAX, Some("2")), u32::MAX);
    }

    #[test]
    fn merge_respects_the_cap() {
        let e = Envelope::new("urn:babel:a", json!({})).unwrap();
        let extra: Vec<(String, String)> = (0..20).map(|i| (format!("h{i}"), "v".into())).collect();
        let all = merge_attributes(message_attributes(&e), extra);
        assert_eq!(all.len(), MAX_ATTRIBUTES);
        assert_eq!(all[6].0, "h0");
    }

    #[test]
    fn dlq_names() {
        assert_eq!(dead_letter_queue_name(""), "-dlq");
        assert_eq!(dead_letter_queue_name(".fifo"), "-dlq.fifo");
        assert_eq!(dead_letter_queue_name("a.fifo.x"), "a.fifo.x-dlq");
        assert!(!is_fifo("a.fif"));
    }
}
