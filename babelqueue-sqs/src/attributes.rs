//! The binding's `MessageAttributes` in the AWS SDK's types, and the out-of-band headers
//! read back from them.

use std::collections::HashMap;

use aws_sdk_sqs::types::MessageAttributeValue;
use babelqueue_core::binding::sqs;
use babelqueue_runtime::{Headers, TransportError};
use serde_json::Value;

/// The attribute names of the contract's projection (`bq-job`, …): never out-of-band
/// headers on consume.
pub const PROJECTION_ATTRIBUTES: [&str; 6] = [
    sqs::JOB,
    sqs::TRACE_ID,
    sqs::MESSAGE_ID,
    sqs::SCHEMA_VERSION,
    sqs::SOURCE_LANG,
    sqs::CREATED_AT,
];

/// The `MessageAttributes` of a publish: the projection of `body` (none for a body that is
/// not an envelope: poison travels without a view), then the out-of-band `headers` as
/// `String` attributes up to SQS's cap of 10 ([`sqs::merge_attributes`]). A header whose
/// value is not a JSON string is sent as its JSON text.
pub fn message_attributes(
    body: &[u8],
    headers: Option<&Headers>,
) -> Result<HashMap<String, MessageAttributeValue>, TransportError> {
    let contract = sqs::project_body(body).unwrap_or_default();
    let extra: Vec<(String, String)> = headers
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), v)
        })
        .collect();
    let mut out = HashMap::new();
    for (name, a) in sqs::merge_attributes(contract, extra) {
        let value = MessageAttributeValue::builder()
            .data_type(a.data_type)
            .string_value(a.string_value)
            .build()
            .map_err(TransportError::backend)?;
        out.insert(name, value);
    }
    Ok(out)
}

/// The out-of-band headers of a received message: its `String` (and `Number`) attributes
/// other than the projection's, as JSON strings.
pub fn out_of_band(attrs: Option<&HashMap<String, MessageAttributeValue>>) -> Headers {
    let mut h = Headers::new();
    let Some(attrs) = attrs else { return h };
    let mut names: Vec<&String> = attrs.keys().collect();
    names.sort();
    for name in names {
        if PROJECTION_ATTRIBUTES.contains(&name.as_str()) {
            continue;
        }
        if let Some(v) = attrs[name].string_value() {
            h.insert(name.clone(), Value::String(v.to_owned()));
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projection_and_headers() {
        let body = br#"{"job":"urn:x","trace_id":"t","data":{},"meta":{"id":"i","created_at":5,"schema_version":1,"lang":"go"}}"#;
        let mut h = Headers::new();
        h.insert("traceparent".into(), "00-ab".into());
        h.insert("bq-job".into(), "other".into());
        let a = message_attributes(body, Some(&h)).unwrap();
        assert_eq!(a.len(), 7);
        assert_eq!(a["bq-job"].string_value(), Some("urn:x"));
        assert_eq!(a["bq-created-at"].data_type(), "Number");
        let back = out_of_band(Some(&a));
        assert_eq!(back.len(), 1);
        assert_eq!(back["traceparent"], "00-ab");
        assert!(message_attributes(b"\xff", None).unwrap().is_empty());
    }
}
