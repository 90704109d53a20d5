//! JSON parsed into [`Value`]s with no key of special meaning.
//!
//! serde_json's own `Value` reads an object whose first key is its raw-value marker
//! (`$serde_json::private::RawValue`) as a raw JSON text instead of an object, so a header
//! or a payload that happens to hold that key would not read back. This parser reads
//! every object as an object.

use std::fmt;

use serde::Deserializer;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parses `bytes` (one JSON value, surrounding whitespace allowed) as serde_json parses a
/// `Value`, except that no object key has a special meaning.
pub(crate) fn from_slice(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = PlainValue.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Like [`from_slice`], over text.
pub(crate) fn from_str(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = PlainValue.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

#[derive(Clone, Copy)]
struct PlainValue;

impl<'de> DeserializeSeed<'de> for PlainValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PlainValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::from(n))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        // The parser gives finite floats only; `Value` reads anything else as null too.
        Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(PlainValue)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(PlainValue)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_value_and_reads_the_marker_key_as_a_key() {
        for text in [
            r#"{"a":[1,-2,3.5,1e2,-0,null,true,"x"],"b":{"c":{}},"a":2}"#,
            "[]",
            "12345678901234567890",
            " \"s\" ",
        ] {
            assert_eq!(
                from_str(text).unwrap(),
                serde_json::from_str::<Value>(text).unwrap()
            );
        }
        let text = r#"{"h":{"$serde_json::private::RawValue":"x","b":[{"$serde_json::private::RawValue":1}]}}"#;
        assert!(serde_json::from_str::<Value>(text).is_err());
        let v = from_slice(text.as_bytes()).unwrap();
        assert_eq!(v["h"]["$serde_json::private::RawValue"], "x");
        assert_eq!(v["h"]["b"][0]["$serde_json::private::RawValue"], 1);
        assert!(from_str("{} x").is_err());
        assert!(from_str("{").is_err());
    }
}
