//! The binding's projection of an envelope onto AMQP properties and typed headers.
//!
//! TEMPORARY: a local copy of what `babelqueue_core::binding::amqp::project_body` computes,
//! until that module lands; then this file only maps its `Projection` onto
//! [`BasicProperties`].

use babelqueue_core::runtime::Headers;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde_json::Value;

use crate::headers::from_json;

/// `app_id` of every BabelQueue producer.
pub const APP_ID: &str = "babelqueue";
/// `content_type` of every BabelQueue message.
pub const CONTENT_TYPE: &str = "application/json";
/// `delivery_mode` 2: persistent.
pub const PERSISTENT: u8 = 2;

fn short(s: &str) -> Option<ShortString> {
    ShortString::try_new(s).ok()
}

/// The AMQP properties of a publish of `body` with out-of-band `headers`: the projection
/// when `body` is an envelope (type = URN, correlation_id = trace_id, message_id =
/// meta.id, app_id, content_type, persistent, headers `x-schema-version`, `x-source-lang`,
/// `x-attempts` natively typed), else only content type and persistence (a poison body
/// dead-lettered as it came). Out-of-band headers go in first, so the projection's win a
/// collision.
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
        .with_content_type(CONTENT_TYPE.into())
        .with_delivery_mode(PERSISTENT);
    if let Ok(Value::Object(env)) = serde_json::from_slice::<Value>(body) {
        let meta = env.get("meta").and_then(Value::as_object);
        let s = |v: Option<&Value>| v.and_then(Value::as_str).and_then(short);
        if let Some(v) = s(env.get("job")) {
            props = props.with_type(v);
        }
        if let Some(v) = s(env.get("trace_id")) {
            props = props.with_correlation_id(v);
        }
        if let Some(v) = s(meta.and_then(|m| m.get("id"))) {
            props = props.with_message_id(v);
        }
        props = props.with_app_id(APP_ID.into());
        if let Some(v) = meta
            .and_then(|m| m.get("schema_version"))
            .and_then(Value::as_i64)
        {
            table.insert("x-schema-version".into(), AMQPValue::LongLongInt(v));
        }
        if let Some(v) = meta.and_then(|m| m.get("lang")).and_then(Value::as_str) {
            table.insert(
                "x-source-lang".into(),
                AMQPValue::LongString(LongString::from(v.as_bytes())),
            );
        }
        let attempts = env.get("attempts").and_then(Value::as_i64).unwrap_or(0);
        table.insert("x-attempts".into(), AMQPValue::LongLongInt(attempts));
    }
    if !table.inner().is_empty() {
        props = props.with_headers(table);
    }
    props
}
