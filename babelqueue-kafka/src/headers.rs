//! The binding's record headers on produce, and the out-of-band headers of a consumed
//! record.

use babelqueue_core::binding::kafka::{self, retry};
use babelqueue_runtime::Headers;
use serde_json::Value;

/// The record headers the binding writes and reads itself (the projection, and the two
/// headers of a record parked on a retry tier). Every other header of a consumed record is
/// out-of-band ([`Delivery::headers`](babelqueue_runtime::Delivery::headers)).
pub const PROJECTION_HEADERS: [&str; 8] = [
    kafka::JOB,
    kafka::TRACE_ID,
    kafka::MESSAGE_ID,
    kafka::SCHEMA_VERSION,
    kafka::SOURCE_LANG,
    kafka::ATTEMPTS,
    retry::DELAY_HEADER,
    retry::ORIGINAL_TOPIC_HEADER,
];

/// What a produced record carries beside its value: the headers (name, UTF-8 value) and
/// the record timestamp (Unix ms; `None`: the client stamps the produce time).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordMeta {
    /// Header names and values, in write order.
    pub headers: Vec<(String, String)>,
    /// The record timestamp.
    pub timestamp_ms: Option<i64>,
}

/// The binding's projection of `body` (read leniently: a body that is no JSON object gets
/// no projected header and no timestamp, and is still written byte for byte) followed by
/// the out-of-band `extra` headers (a JSON string as is, any other JSON value as its JSON
/// text; a name of the projection is skipped: the body decides those).
///
/// ```
/// use babelqueue_kafka::record_meta;
/// let body = br#"{"job":"urn:babel:a:b","trace_id":"t","data":{},"meta":{"id":"m","lang":"go","schema_version":1,"created_at":1700000000000},"attempts":2}"#;
/// let mut extra = babelqueue_runtime::Headers::new();
/// extra.insert("traceparent".into(), "00-ab".into());
/// let meta = record_meta(body, Some(&extra));
/// assert_eq!(meta.timestamp_ms, Some(1_700_000_000_000));
/// assert!(meta.headers.contains(&("bq-attempts".into(), "2".into())));
/// assert_eq!(meta.headers.last().unwrap(), &("traceparent".into(), "00-ab".into()));
/// assert_eq!(record_meta(b"\xff not json", None), Default::default());
/// ```
pub fn record_meta(body: &[u8], extra: Option<&Headers>) -> RecordMeta {
    let mut meta = match kafka::project_body(body) {
        Some(r) => RecordMeta {
            headers: r
                .headers
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            timestamp_ms: r.timestamp_ms,
        },
        None => RecordMeta::default(),
    };
    if let Some(extra) = extra {
        for (k, v) in extra {
            if PROJECTION_HEADERS.contains(&k.as_str()) {
                continue;
            }
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            meta.headers.push((k.clone(), v));
        }
    }
    meta
}

/// The out-of-band headers of a consumed record: every header outside
/// [`PROJECTION_HEADERS`] whose value is UTF-8, as a JSON string (a header without a value
/// or with bytes that are not UTF-8 is left out; the first of repeated names wins).
///
/// ```
/// use babelqueue_kafka::out_of_band;
/// let h = out_of_band([("bq-job", Some(&b"urn:x"[..])), ("traceparent", Some(b"00-ab")), ("bin", Some(b"\xff")), ("none", None)]);
/// assert_eq!(h.len(), 1);
/// assert_eq!(h["traceparent"], "00-ab");
/// ```
pub fn out_of_band<'a>(headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>) -> Headers {
    let mut out = Headers::new();
    for (k, v) in headers {
        if PROJECTION_HEADERS.contains(&k) || out.contains_key(k) {
            continue;
        }
        if let Some(Ok(text)) = v.map(std::str::from_utf8) {
            out.insert(k.to_owned(), Value::String(text.to_owned()));
        }
    }
    out
}
