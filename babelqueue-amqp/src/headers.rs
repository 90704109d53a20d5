//! AMQP field tables ⇄ the runtime's out-of-band [`Headers`] (a JSON object).

use babelqueue_runtime::Headers;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use serde_json::{Number, Value};

/// Headers of the binding's projection: produced from the envelope on every publish,
/// never surfaced as out-of-band headers (the body is their source of truth).
pub const PROJECTION_HEADERS: [&str; 3] = ["x-schema-version", "x-source-lang", "x-attempts"];

/// Whether `key` is a header RabbitMQ adds when it dead-letters a message (a delay
/// queue's expiry): `x-death`, `x-first-death-*`, `x-last-death-*`. They describe one hop
/// and are not carried to the next publish.
fn is_broker_header(key: &str) -> bool {
    key == "x-death" || key.starts_with("x-first-death-") || key.starts_with("x-last-death-")
}

/// The out-of-band headers of a delivery: its AMQP headers table minus the projection's
/// `x-*` headers and the broker's dead-lettering headers, natively typed values mapped to
/// JSON (strings, numbers, booleans, tables as objects, arrays, void as `null`; byte
/// strings that are not UTF-8 are decoded lossily).
///
/// What a tool that moves a delivery by hand (the `babelqueue dlq requeue` command) passes
/// to [`Transport::publish_with_headers`](babelqueue_runtime::Transport::publish_with_headers)
/// so the new copy keeps the delivery's own headers (`traceparent`, …) while the
/// projection's are written afresh from the body.
///
/// ```
/// use babelqueue_amqp::lapin::types::{AMQPValue, FieldTable};
///
/// let mut table = FieldTable::default();
/// table.insert("traceparent".into(), AMQPValue::LongString("00-ab-cd-01".into()));
/// table.insert("x-attempts".into(), AMQPValue::LongInt(3));
/// let headers = babelqueue_amqp::out_of_band(Some(&table));
/// assert_eq!(serde_json::Value::Object(headers), serde_json::json!({"traceparent": "00-ab-cd-01"}));
/// ```
pub fn out_of_band(table: Option<&FieldTable>) -> Headers {
    let mut out = Headers::new();
    let Some(table) = table else {
        return out;
    };
    for (key, value) in table {
        let key = key.as_str();
        if PROJECTION_HEADERS.contains(&key) || is_broker_header(key) {
            continue;
        }
        out.insert(key.to_owned(), to_json(value));
    }
    out
}

/// An AMQP value as JSON.
pub fn to_json(value: &AMQPValue) -> Value {
    match value {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(n) => Value::from(*n),
        AMQPValue::ShortShortUInt(n) => Value::from(*n),
        AMQPValue::ShortInt(n) => Value::from(*n),
        AMQPValue::ShortUInt(n) => Value::from(*n),
        AMQPValue::LongInt(n) => Value::from(*n),
        AMQPValue::LongUInt(n) => Value::from(*n),
        AMQPValue::LongLongInt(n) => Value::from(*n),
        AMQPValue::Timestamp(n) => Value::from(*n),
        AMQPValue::Float(f) => Number::from_f64(f64::from(*f)).map_or(Value::Null, Value::Number),
        AMQPValue::Double(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        AMQPValue::DecimalValue(d) => {
            let v = f64::from(d.value) / 10f64.powi(i32::from(d.scale));
            Number::from_f64(v).map_or(Value::Null, Value::Number)
        }
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_owned()),
        AMQPValue::LongString(s) => {
            Value::String(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        AMQPValue::ByteArray(b) => {
            Value::String(String::from_utf8_lossy(b.as_slice()).into_owned())
        }
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(to_json).collect()),
        AMQPValue::FieldTable(t) => Value::Object(
            t.into_iter()
                .map(|(k, v)| (k.as_str().to_owned(), to_json(v)))
                .collect(),
        ),
        AMQPValue::Void => Value::Null,
    }
}

/// A JSON value as a natively typed AMQP value: strings as long strings, integers as
/// signed 64-bit (`u64` above `i64::MAX` as a double), other numbers as doubles, booleans,
/// `null` as void, arrays and objects as field arrays and tables. `None` when an object
/// key is longer than an AMQP short string (255 bytes).
pub fn from_json(value: &Value) -> Option<AMQPValue> {
    Some(match value {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => AMQPValue::LongLongInt(i),
            (None, Some(f)) => AMQPValue::Double(f),
            (None, None) => AMQPValue::LongString(LongString::from(n.to_string())),
        },
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_bytes())),
        Value::Array(a) => AMQPValue::FieldArray(FieldArray::from(
            a.iter().map(from_json).collect::<Option<Vec<_>>>()?,
        )),
        Value::Object(o) => {
            let mut t = FieldTable::default();
            for (k, v) in o {
                t.insert(ShortString::try_new(k.as_str()).ok()?, from_json(v)?);
            }
            AMQPValue::FieldTable(t)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_round_trips_through_amqp_values() {
        let v = json!({
            "traceparent": "00-abc-def-01",
            "n": 3,
            "neg": -4,
            "f": 1.5,
            "b": true,
            "nil": null,
            "list": [1, "two", {"three": 3}],
        });
        assert_eq!(to_json(&from_json(&v).unwrap()), v);
    }

    #[test]
    fn projection_and_broker_headers_are_not_out_of_band() {
        let mut t = FieldTable::default();
        t.insert("x-attempts".into(), AMQPValue::LongLongInt(2));
        t.insert("x-schema-version".into(), AMQPValue::LongLongInt(1));
        t.insert("x-source-lang".into(), AMQPValue::LongString("php".into()));
        t.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::default()),
        );
        t.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString("q".into()),
        );
        t.insert(
            "x-last-death-reason".into(),
            AMQPValue::LongString("expired".into()),
        );
        t.insert("traceparent".into(), AMQPValue::LongString("00-ab".into()));
        t.insert("x-babelqueue-releases".into(), AMQPValue::LongInt(2));
        let h = out_of_band(Some(&t));
        assert_eq!(
            Value::Object(h),
            json!({"traceparent": "00-ab", "x-babelqueue-releases": 2})
        );
        assert!(out_of_band(None).is_empty());
    }

    #[test]
    fn native_types_map_to_json() {
        assert_eq!(to_json(&AMQPValue::ShortInt(-3)), json!(-3));
        assert_eq!(to_json(&AMQPValue::Timestamp(7)), json!(7));
        assert_eq!(to_json(&AMQPValue::Void), Value::Null);
        assert_eq!(
            to_json(&AMQPValue::LongString(LongString::from(&b"\xffok"[..]))),
            json!("\u{fffd}ok")
        );
        assert_eq!(
            from_json(&json!(u64::MAX)),
            Some(AMQPValue::Double(u64::MAX as f64))
        );
        let long_key = "k".repeat(256);
        assert_eq!(from_json(&json!({ long_key: 1 })), None);
    }
}
