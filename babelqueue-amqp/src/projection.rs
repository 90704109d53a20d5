//! The binding's projection ([`babelqueue_core::binding::amqp`]) as `lapin` properties.

use babelqueue_core::binding::amqp::{self, HeaderValue};
use babelqueue_runtime::Headers;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::headers::from_json;

fn short(s: &str) -> Option<ShortString> {
    ShortString::try_new(s)
        .ok()
        .filter(|s| !s.as_str().is_empty())
}

/// A contract header value on the wire: an integer as a 32-bit signed `I` when it fits,
/// else a 64-bit `l` (what the Python SDK's pika writes), a string as a long string.
fn native(v: HeaderValue) -> AMQPValue {
    match v {
        HeaderValue::Int(i) => match i32::try_from(i) {
            Ok(small) => AMQPValue::LongInt(small),
            Err(_) => AMQPValue::LongLongInt(i),
        },
        HeaderValue::Str(s) => AMQPValue::LongString(LongString::from(s.into_bytes())),
    }
}

/// The AMQP properties of a publish of `body` with out-of-band `headers`: the binding's
/// projection when `body` is an envelope (`type` = URN, `correlation_id` = trace_id,
/// `message_id` = meta.id, `app_id`, `content_type`, `content_encoding` `utf-8` as the
/// Python SDK writes it, persistent, headers `x-schema-version`, `x-source-lang`,
/// `x-attempts` natively typed), else only content type and persistence (a poison body
/// dead-lettered as it came). Out-of-band headers go in first, so the projection's
/// replace them on a collision.
pub(crate) fn properties(body: &[u8], headers: Option<&Headers>) -> BasicProperties {
    let mut table = FieldTable::default();
    if let Some(h) = headers {
        for (k, v) in h {
            if let (Some(k), Some(v)) = (short(k), from_json(v)) {
                table.insert(k, v);
            }
        }
    }
    let mut props = BasicProperties::default()
        .with_content_type(ShortString::from(amqp::CONTENT_TYPE))
        .with_delivery_mode(amqp::PERSISTENT);
    if let Some(p) = amqp::project_body(body) {
        props = props
            .with_content_type(ShortString::from(p.content_type))
            .with_content_encoding(ShortString::from(amqp::CONTENT_ENCODING))
            .with_delivery_mode(p.delivery_mode)
            .with_app_id(ShortString::from(p.app_id));
        if let Some(v) = short(&p.kind) {
            props = props.with_type(v);
        }
        if let Some(v) = short(&p.correlation_id) {
            props = props.with_correlation_id(v);
        }
        if let Some(v) = short(&p.message_id) {
            props = props.with_message_id(v);
        }
        if let Some(ts) = p.timestamp {
            props = props.with_timestamp(ts);
        }
        for (k, v) in p.headers {
            table.insert(ShortString::from(k), native(v));
        }
    }
    if !table.inner().is_empty() {
        props = props.with_headers(table);
    }
    props
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_envelope_is_projected_and_the_contract_wins_a_collision() {
        let body = br#"{"job":"urn:babel:orders:created","trace_id":"t-1","data":{},"meta":{"id":"m-1","queue":"orders","lang":"php","schema_version":1,"created_at":0},"attempts":2}"#;
        let mut h = Headers::new();
        h.insert("traceparent".into(), json!("00-ab"));
        h.insert("x-attempts".into(), json!(99));
        let p = properties(body, Some(&h));
        assert_eq!(
            p.kind().as_ref().unwrap().as_str(),
            "urn:babel:orders:created"
        );
        assert_eq!(p.correlation_id().as_ref().unwrap().as_str(), "t-1");
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), "m-1");
        assert_eq!(p.app_id().as_ref().unwrap().as_str(), "babelqueue");
        assert_eq!(p.content_encoding().as_ref().unwrap().as_str(), "utf-8");
        assert_eq!(*p.delivery_mode(), Some(2));
        let t = p.headers().as_ref().unwrap().inner();
        assert_eq!(t.get("x-attempts"), Some(&AMQPValue::LongInt(2)));
        assert_eq!(t.get("x-schema-version"), Some(&AMQPValue::LongInt(1)));
        assert_eq!(
            t.get("x-source-lang"),
            Some(&AMQPValue::LongString("php".into()))
        );
        assert_eq!(
            t.get("traceparent"),
            Some(&AMQPValue::LongString("00-ab".into()))
        );
    }

    #[test]
    fn a_poison_body_gets_only_content_type_and_persistence() {
        let p = properties(b"\xff not json", None);
        assert_eq!(
            p.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        assert_eq!(*p.delivery_mode(), Some(2));
        assert!(p.kind().is_none() && p.headers().is_none() && p.message_id().is_none());
    }

    #[test]
    fn big_integers_are_64_bit() {
        assert_eq!(
            native(HeaderValue::Int(1 << 40)),
            AMQPValue::LongLongInt(1 << 40)
        );
        assert_eq!(native(HeaderValue::Int(-1)), AMQPValue::LongInt(-1));
    }
}
