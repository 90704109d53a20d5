//! [`Data`], an envelope's `data` object: kept as the text it arrived in until something
//! reads it, then parsed once.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;

use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// The business payload of an [`Envelope`](crate::Envelope): a JSON object whose key
/// order is kept.
///
/// It reads as a [`Map<String, Value>`] (it dereferences to one), so
/// `env.data.get("payment_id")`, `env.data["amount"]`, `env.data.insert(..)` and
/// `for (key, value) in &env.data` work as on a map.
///
/// A decoded envelope keeps its `data` as the JSON text it arrived in (checked to be a
/// valid object when the envelope was decoded) and parses it into the map the first time
/// the map is read. A consumer that never looks at the payload, or only deserializes it
/// into a type with [`Envelope::data_as`](crate::Envelope::data_as) or
/// `Json<T>`, does not build the map at all: the type is read from the
/// text directly. The map, the encoding and every comparison are the same whether or not
/// it was parsed yet.
///
/// ```
/// use babelqueue_core::{Data, Envelope};
/// use serde_json::{Map, Value, json};
///
/// let body = br#"{"job":"urn:babel:payments:charge","trace_id":"t","data":{"payment_id":"pay_7f3a","amount":4200},
///   "meta":{"id":"m","queue":"payments","lang":"go","schema_version":1,"created_at":0},"attempts":0}"#;
/// let mut env = Envelope::decode(body)?;
/// assert_eq!(env.data["amount"], 4200);
/// assert_eq!(env.data.get("payment_id"), Some(&json!("pay_7f3a")));
///
/// env.data.insert("currency".into(), json!("EUR"));
/// let keys: Vec<&String> = env.data.keys().collect();
/// assert_eq!(keys, ["payment_id", "amount", "currency"]);
///
/// let map: Map<String, Value> = env.data.into_map();
/// assert_eq!(Data::from(map.clone()), map);
/// # Ok::<(), babelqueue_core::DecodeError>(())
/// ```
#[derive(Clone, Default)]
pub struct Data {
    /// The object as it arrived, while it is the payload's truth: set only by decoding
    /// (after checking it is a valid JSON object), cleared by any change through
    /// [`DerefMut`].
    raw: Option<Box<str>>,
    /// The object parsed: from `raw` on first read, or the payload itself when there is
    /// no `raw`. Always set when `raw` is `None`.
    map: OnceLock<Map<String, Value>>,
}

impl Data {
    /// An empty object.
    pub fn new() -> Self {
        Data::default()
    }

    /// `text`, which the caller has checked with [`check_object`]: kept as it is.
    pub(crate) fn from_checked_text(text: Box<str>) -> Self {
        Data {
            raw: Some(text),
            map: OnceLock::new(),
        }
    }

    /// Whether the object is still the text it arrived in (not parsed, not changed).
    #[cfg(test)]
    pub(crate) fn is_text(&self) -> bool {
        self.raw.is_some() && self.map.get().is_none()
    }

    /// The text the object arrived in, while it is the payload's truth (decoded and not
    /// changed since; reading the map keeps it).
    pub(crate) fn raw_text(&self) -> Option<&str> {
        self.raw.as_deref()
    }

    /// The object as a map (parsed now if it was not yet).
    pub fn as_map(&self) -> &Map<String, Value> {
        self.map.get_or_init(|| parse(self.raw.as_deref()))
    }

    /// The object as a map to change. The text it arrived in is dropped: from now on the
    /// map is the payload.
    pub fn as_map_mut(&mut self) -> &mut Map<String, Value> {
        if self.map.get().is_none() {
            let map = parse(self.raw.as_deref());
            self.map = OnceLock::from(map);
        }
        self.raw = None;
        self.map
            .get_mut()
            .expect("the map is set just above and never unset")
    }

    /// The object as a map, owned.
    pub fn into_map(self) -> Map<String, Value> {
        let Data { raw, map } = self;
        map.into_inner().unwrap_or_else(|| parse(raw.as_deref()))
    }

    /// Deserializes the object into `T`: from the text it arrived in when it was not
    /// parsed yet (no map is built), else from the map in place. Either way the answer is
    /// the map's: a text that `T` refuses (a repeated key, say, where the map keeps the
    /// last) is read again from the map, whose answer or error is returned.
    ///
    /// ```
    /// #[derive(serde::Deserialize)]
    /// struct Payment { amount: u64 }
    ///
    /// let body = babelqueue_core::Envelope::new(
    ///     "urn:babel:payments:charge",
    ///     serde_json::json!({"amount": 4200}),
    /// )?
    /// .encode();
    /// let env = babelqueue_core::Envelope::decode(&body)?;
    /// let p: Payment = env.data.deserialize_into()?;
    /// assert_eq!(p.amount, 4200);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn deserialize_into<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        if let (Some(raw), None) = (self.raw.as_deref(), self.map.get())
            && let Ok(value) = serde_json::from_str(raw)
        {
            return Ok(value);
        }
        T::deserialize(crate::data_de::DataRef(self.as_map()))
    }
}

/// The map of text that [`check_object`] accepted (`None`: an empty object, which is never
/// asked for since `raw` and an unset map do not go together).
fn parse(raw: Option<&str>) -> Map<String, Value> {
    // Cannot fail: the text was checked to be a JSON object, with the same parser and the
    // same limits, when the envelope was decoded.
    // No key has a special meaning (serde_json's `Value` would read a nested object whose
    // first key is its raw-value marker as raw text, and fail).
    match raw.map(crate::plain_value::from_str) {
        Some(Ok(Value::Object(map))) => map,
        _ => Map::new(),
    }
}

/// The deepest nesting `data`'s own text may have (the object itself is 1): the parser's
/// limit of 127 levels, less the envelope's own object around it.
const MAX_DATA_DEPTH: u16 = 126;

/// Whether `text` is one JSON object that parsing the whole envelope into a `Value` would
/// have accepted in its place: the same grammar, numbers in range, and the same nesting
/// limit (counted from the envelope). Nothing is allocated for text without escapes.
pub(crate) fn check_object(text: &str) -> bool {
    if !text.starts_with('{') {
        return false;
    }
    let mut de = serde_json::Deserializer::from_str(text);
    Check(1).deserialize(&mut de).is_ok() && de.end().is_ok()
}

/// [`check_object`]'s answer for `text`, a value that serde_json's own scan accepted as
/// JSON (`RawValue`: the grammar is checked, but not the range of numbers, the code points
/// of `\u` escapes, nor the nesting): seen in one pass over the bytes when it plainly holds
/// none of those, else asked of [`check_object`].
pub(crate) fn check_scanned_object(text: &str) -> bool {
    text.starts_with('{') && (plainly_in_range(text.as_bytes()) || check_object(text))
}

/// Whether grammatical JSON `bytes` plainly hold nothing that a `Value` parse refuses
/// beyond the grammar: no escape at all (so no `\u`, and every `"` opens or closes a
/// string), no `e` or `E` outside strings (no exponent; `true` and `false` are sent to the
/// full check too), no run of more than 300 digits outside strings (no integer beyond an
/// `f64`), and no deeper nesting than [`MAX_DATA_DEPTH`]. `false` only means "check it".
fn plainly_in_range(bytes: &[u8]) -> bool {
    if bytes.contains(&b'\\') {
        return false;
    }
    let mut in_string = false;
    let mut depth: u16 = 0;
    let mut digits: u16 = 0;
    for &b in bytes {
        if in_string {
            in_string = b != b'"';
            continue;
        }
        match b {
            b'0'..=b'9' => {
                digits += 1;
                if digits > 300 {
                    return false;
                }
                continue;
            }
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DATA_DEPTH {
                    return false;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'e' | b'E' => return false,
            _ => {}
        }
        digits = 0;
    }
    true
}

/// Reads any JSON value through `deserialize_any` (so numbers and strings are parsed as a
/// `Value` parses them) and keeps nothing; the `u16` is the value's depth.
#[derive(Clone, Copy)]
struct Check(u16);

impl<'de> DeserializeSeed<'de> for Check {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Check {
    fn deeper<E: serde::de::Error>(self) -> Result<Check, E> {
        if self.0 > MAX_DATA_DEPTH {
            return Err(E::custom("nested too deeply"));
        }
        Ok(Check(self.0 + 1))
    }
}

impl<'de> Visitor<'de> for Check {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        while map.next_key_seed(inner)?.is_some() {
            map.next_value_seed(inner)?;
        }
        Ok(())
    }
}

impl Deref for Data {
    type Target = Map<String, Value>;

    fn deref(&self) -> &Map<String, Value> {
        self.as_map()
    }
}

impl DerefMut for Data {
    fn deref_mut(&mut self) -> &mut Map<String, Value> {
        self.as_map_mut()
    }
}

impl fmt::Debug for Data {
    /// As the map's.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_map().fmt(f)
    }
}

impl PartialEq for Data {
    fn eq(&self, other: &Data) -> bool {
        self.as_map() == other.as_map()
    }
}

impl PartialEq<Map<String, Value>> for Data {
    fn eq(&self, other: &Map<String, Value>) -> bool {
        self.as_map() == other
    }
}

impl PartialEq<Data> for Map<String, Value> {
    fn eq(&self, other: &Data) -> bool {
        self == other.as_map()
    }
}

impl From<Map<String, Value>> for Data {
    fn from(map: Map<String, Value>) -> Self {
        Data {
            raw: None,
            map: OnceLock::from(map),
        }
    }
}

impl From<Data> for Map<String, Value> {
    fn from(data: Data) -> Self {
        data.into_map()
    }
}

impl From<Data> for Value {
    fn from(data: Data) -> Self {
        Value::Object(data.into_map())
    }
}

impl FromIterator<(String, Value)> for Data {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        Data::from(Map::from_iter(iter))
    }
}

impl<'a> IntoIterator for &'a Data {
    type Item = (&'a String, &'a Value);
    type IntoIter = serde_json::map::Iter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_map().iter()
    }
}

impl IntoIterator for Data {
    type Item = (String, Value);
    type IntoIter = serde_json::map::IntoIter;

    fn into_iter(self) -> Self::IntoIter {
        self.into_map().into_iter()
    }
}

impl Serialize for Data {
    /// As the map: the encoding is the same whether or not the text was parsed yet.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.as_map().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Data {
    /// As a map (a JSON object).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Map::deserialize(deserializer).map(Data::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decoded(text: &str) -> Data {
        assert!(check_object(text), "{text}");
        Data::from_checked_text(text.into())
    }

    #[test]
    fn text_and_map_read_and_compare_alike() {
        let text = r#"{"b":1,"a":{"x":[1,2.5,"é"]},"c":null}"#;
        let map: Map<String, Value> = serde_json::from_str(text).unwrap();
        let data = decoded(text);
        assert_eq!(data.clone(), Data::from(map.clone()));
        assert_eq!(data, map);
        assert_eq!(format!("{data:?}"), format!("{map:?}"));
        assert_eq!(
            serde_json::to_string(&decoded(text)).unwrap(),
            serde_json::to_string(&map).unwrap()
        );
        assert_eq!(decoded(text).into_map(), map);
        let keys: Vec<_> = (&data).into_iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "c"]);
    }

    #[test]
    fn a_change_makes_the_map_the_payload() {
        let mut data = decoded(r#"{"a":1}"#);
        data.insert("b".into(), json!(2));
        assert_eq!(serde_json::to_string(&data).unwrap(), r#"{"a":1,"b":2}"#);
        let n: Map<String, Value> = data.deserialize_into().unwrap();
        assert_eq!(n.len(), 2);
    }

    #[test]
    fn typed_reads_answer_as_the_map_does() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct P {
            a: u32,
        }
        // Read from the text: no map built.
        let data = decoded(r#"{"a":7}"#);
        assert_eq!(data.deserialize_into::<P>().unwrap(), P { a: 7 });
        assert!(data.is_text());
        // A repeated key: the map keeps the last, as the text read again from it does.
        assert_eq!(
            decoded(r#"{"a":1,"a":2}"#).deserialize_into::<P>().unwrap(),
            P { a: 2 }
        );
        let wrong = decoded(r#"{"a":"x"}"#).deserialize_into::<P>().unwrap_err();
        let from_map = P::deserialize(crate::data_de::DataRef(
            &serde_json::from_str(r#"{"a":"x"}"#).unwrap(),
        ))
        .unwrap_err();
        assert_eq!(wrong.to_string(), from_map.to_string());
    }

    /// What the one pass over the bytes lets through, the full check accepts; and each of
    /// its reasons to ask the full check is seen.
    #[test]
    fn the_quick_pass_lets_through_only_what_the_check_accepts() {
        let long = "9".repeat(300);
        let longer = "9".repeat(310);
        let nested = |n: usize| format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n));
        let cases = [
            (r#"{"a":1,"b":"x{[e\u0041"}"#.to_owned(), false),
            (r#"{"a":1,"b":"x{[eE]}"}"#.to_owned(), true),
            (r#"{"a":-12.5,"b":[1,{"c":null}],"d":"é"}"#.to_owned(), true),
            (r#"{"a":1e5}"#.to_owned(), false),
            (r#"{"a":1E5}"#.to_owned(), false),
            (r#"{"a":true}"#.to_owned(), false),
            (format!(r#"{{"a":{long}}}"#), true),
            (format!(r#"{{"a":{longer}}}"#), false),
            (format!(r#"{{"a":"{longer}"}}"#), true),
            (format!(r#"{{"a":1.{longer}}}"#), false),
            (nested(126), true),
            (nested(127), false),
            (r#"{"a":"\ud800"}"#.to_owned(), false),
        ];
        for (text, plain) in &cases {
            assert_eq!(plainly_in_range(text.as_bytes()), *plain, "{text}");
            if *plain {
                assert!(check_object(text), "{text}");
            }
            assert_eq!(check_scanned_object(text), check_object(text), "{text}");
        }
        assert!(!check_object(&nested(127)));
        assert!(check_object(&format!(r#"{{"a":1.{longer}}}"#)));
        assert!(!check_object(&format!(r#"{{"a":{longer}}}"#)));
    }

    #[test]
    fn only_objects_are_accepted() {
        for bad in [
            "",
            "[]",
            "1",
            "\"s\"",
            "null",
            "{",
            "{\"a\":}",
            "{} {}",
            "{\"a\":1e400}",
            " {}",
        ] {
            assert!(!check_object(bad), "{bad:?}");
        }
        assert!(check_object("{}"));
        assert!(check_scanned_object("{}"));
        assert!(!check_scanned_object("[]"));
        assert!(check_object("{\"a\":[{},[],{\"b\":\"\\u00e9\"}]}"));
    }

    #[test]
    fn a_decoded_payload_with_any_key_reads_back() {
        let text = r#"{"a":{"$serde_json::private::RawValue":"x"},"b":[{"$serde_json::private::RawValue":1}]}"#;
        let data = decoded(text);
        assert_eq!(data["a"]["$serde_json::private::RawValue"], "x");
        assert_eq!(data["b"][0]["$serde_json::private::RawValue"], 1);
    }
}
