//! `data` deserialized in place: a serde [`Deserializer`] over `&Map<String, Value>` that
//! behaves exactly as `&Value::Object(map)`, without the deep copy of the map that
//! building that `Value` costs (every key and every string of the payload allocated
//! again, per message, per typed handler).
//!
//! serde_json's own `&Map` deserializer treats `Option<T>` and newtype structs differently
//! from `&Value` (it sends everything to `visit_map`), so this one answers those two as
//! `&Value` does and forwards the rest.

use serde::Deserializer;
use serde::de::Visitor;
use serde_json::{Error, Map, Value};

/// `&Value::Object(map)` as a deserializer, borrowing `map`.
pub(crate) struct DataRef<'a>(pub(crate) &'a Map<String, Value>);

impl<'de> Deserializer<'de> for DataRef<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.0.deserialize_any(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        // An object is never `null`: `Some`, as `&Value` answers.
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.0.deserialize_ignored_any(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fmt::Debug;

    use serde::Deserialize;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    use super::*;

    /// Deserializing through `DataRef` gives what deserializing the owned `Value` gives:
    /// the same value, or an error with the same message.
    fn same<T: DeserializeOwned + PartialEq + Debug>(data: &Value) {
        let map = data.as_object().expect("an object");
        let by_value = T::deserialize(Value::Object(map.clone())).map_err(|e| e.to_string());
        let by_ref = T::deserialize(DataRef(map)).map_err(|e| e.to_string());
        assert_eq!(
            by_ref,
            by_value,
            "{} from {data}",
            std::any::type_name::<T>()
        );
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Payment {
        payment_id: String,
        amount: u64,
        #[serde(default)]
        note: Option<String>,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Strict {
        payment_id: String,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Wrapper(Payment);

    #[derive(Debug, PartialEq, Deserialize)]
    enum Command {
        Charge { amount: u64 },
        Refund(u64),
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(tag = "kind")]
    enum Tagged {
        Charge { amount: u64 },
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(untagged)]
    enum Either {
        Payment(Payment),
        Other(BTreeMap<String, Value>),
    }

    #[test]
    fn a_borrowed_map_deserializes_as_the_owned_object_does() {
        let payment = json!({"payment_id": "pay_1", "amount": 4200, "extra": [1, 2]});
        let bad = json!({"payment_id": 7, "amount": "x"});
        let empty = json!({});
        for data in [&payment, &bad, &empty] {
            same::<Payment>(data);
            same::<Strict>(data);
            same::<Option<Payment>>(data);
            same::<Wrapper>(data);
            same::<Value>(data);
            same::<Map<String, Value>>(data);
            same::<BTreeMap<String, Value>>(data);
            same::<Either>(data);
            same::<Tagged>(data);
            same::<String>(data);
            same::<Vec<u8>>(data);
            same::<()>(data);
            same::<u64>(data);
            same::<Command>(data);
            same::<serde::de::IgnoredAny>(data);
        }
        same::<Command>(&json!({"Charge": {"amount": 1}}));
        same::<Command>(&json!({"Refund": 5}));
        same::<Command>(&json!({"Charge": {"amount": 1}, "Refund": 5}));
        same::<Tagged>(&json!({"kind": "Charge", "amount": 3}));
    }
}
