//! The canonical wire envelope (schema_version 1) and its codec.
//!
//! Every BabelQueue SDK reads and writes the same JSON object:
//!
//! ```json
//! {"job":"urn:babel:payments:charge","trace_id":"…","data":{…},
//!  "meta":{"id":"…","queue":"payments","lang":"rust","schema_version":1,"created_at":1749132727000},
//!  "attempts":0}
//! ```
//!
//! [`Envelope::encode`] writes exactly that compact form (fields in contract order, UTF-8
//! unescaped, `data` keys in insertion order). [`Envelope::decode`] applies the consumer
//! acceptance rules and returns a typed [`DecodeError`] for anything else; it never panics.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::{DeserializeOwned, DeserializeSeed};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::data::Data;
use crate::data::check_scanned_object;

/// The only schema version this SDK reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// The `meta.lang` this SDK writes.
pub const LANG: &str = "rust";

/// The queue name used when a producer does not choose one.
pub const DEFAULT_QUEUE: &str = "default";

/// A BabelQueue message: the canonical envelope of schema_version 1.
///
/// Build one with [`Envelope::new`] (or [`Envelope::from_payload`]) on the producer side,
/// read one with [`Envelope::decode`] on the consumer side.
///
/// ```
/// use babelqueue_core::Envelope;
/// use serde_json::json;
///
/// let env = Envelope::new("urn:babel:payments:charge", json!({"payment_id": "pay_7f3a"}))?
///     .with_queue("payments");
/// let bytes = env.encode();
/// let back = Envelope::decode(&bytes)?;
/// assert_eq!(back, env);
/// assert_eq!(back.meta.lang, "rust");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope {
    /// The message URN, e.g. `urn:babel:payments:charge`.
    pub job: String,
    /// Correlation id of the whole causal chain (forwarded unchanged by every hop).
    pub trace_id: String,
    /// The business payload (a JSON object; key order is preserved). It reads as a
    /// [`Map<String, Value>`]; see [`Data`].
    pub data: Data,
    /// Immutable producer-set metadata.
    pub meta: Meta,
    /// Transport retry counter; starts at 0.
    pub attempts: u32,
    /// Present only on a dead-lettered message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetter>,
    /// Unknown top-level fields found on decode, kept so a re-encoded message loses nothing.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The `meta` block of an [`Envelope`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Identity of this message (UUID v4 when produced by a BabelQueue SDK); the
    /// idempotency key. Empty when the producer sent none.
    pub id: String,
    /// Logical queue name.
    pub queue: String,
    /// The producing SDK (`rust`, `go`, `python`, …). Never checked on decode.
    pub lang: String,
    /// Always [`SCHEMA_VERSION`] on an accepted envelope.
    pub schema_version: u32,
    /// Production time, Unix epoch milliseconds, UTC.
    pub created_at: i64,
    /// Unknown `meta` fields found on decode.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Why a message was dead-lettered (`dead_letter.reason`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterReason {
    /// The handler failed `max_attempts` times.
    Failed,
    /// No handler is registered for the URN.
    UnknownUrn,
    /// The body is not JSON, or not an accepted envelope.
    Poison,
    /// A reason written by another SDK that this version does not know.
    #[serde(untagged)]
    Other(String),
}

impl DeadLetterReason {
    /// The wire spelling of the reason.
    pub fn as_str(&self) -> &str {
        match self {
            DeadLetterReason::Failed => "failed",
            DeadLetterReason::UnknownUrn => "unknown_urn",
            DeadLetterReason::Poison => "poison",
            DeadLetterReason::Other(s) => s,
        }
    }
}

/// The `dead_letter` block added to a dead-lettered message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Why the message was dead-lettered.
    pub reason: DeadLetterReason,
    /// The error message, if any.
    #[serde(default)]
    pub error: Option<String>,
    /// The error type name, if any.
    #[serde(default)]
    pub exception: Option<String>,
    /// When it was dead-lettered, Unix epoch milliseconds.
    #[serde(default)]
    pub failed_at: i64,
    /// `meta.queue`, else the queue the message was consumed from.
    #[serde(default)]
    pub original_queue: String,
    /// The attempts count at the time of dead-lettering.
    #[serde(default)]
    pub attempts: u32,
    /// The SDK that dead-lettered it.
    #[serde(default)]
    pub lang: String,
}

/// Why bytes were not accepted as an envelope. Such a message is `poison`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not JSON (or not UTF-8).
    #[error("body is not valid JSON: {0}")]
    NotJson(String),
    /// The JSON is not an object.
    #[error("envelope must be a JSON object, found {0}")]
    NotAnObject(&'static str),
    /// Neither `job` nor `urn` is a non-empty string.
    #[error("envelope has no non-empty `job` (or `urn`) string")]
    MissingUrn,
    /// `trace_id` is absent, not a string, or empty.
    #[error("envelope `trace_id` must be a non-empty string")]
    InvalidTraceId,
    /// `data` is absent or not an object.
    #[error("envelope `data` must be a JSON object, found {0}")]
    DataNotAnObject(&'static str),
    /// `meta` is absent or not an object.
    #[error("envelope `meta` must be a JSON object, found {0}")]
    MetaNotAnObject(&'static str),
    /// `meta.schema_version` is absent or not `1`.
    #[error("unsupported `meta.schema_version` {0} (this SDK reads 1)")]
    UnsupportedSchemaVersion(String),
    /// `attempts` is absent or not a non-negative integer.
    #[error("envelope `attempts` must be a non-negative integer, found {0}")]
    InvalidAttempts(String),
}

/// Errors building an envelope on the producer side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The URN is empty (or only whitespace).
    #[error("the URN must be a non-empty string")]
    EmptyUrn,
    /// The payload did not serialize to a JSON object.
    #[error("the payload must serialize to a JSON object, found {0}")]
    PayloadNotAnObject(&'static str),
    /// Serializing or deserializing the payload failed.
    #[error("payload (de)serialization failed")]
    Payload(#[from] serde_json::Error),
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Current time as Unix epoch milliseconds.
#[doc(hidden)]
pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The envelope's fields picked while parsing, then the end of the input; `data` as its
/// text when `raw_data`.
fn pick_top<'de, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
    raw_data: bool,
) -> Result<Shape<TopFields>, serde_json::Error> {
    let top = PickTop { raw_data }.deserialize(&mut *de)?;
    de.end()?;
    Ok(top)
}

impl Envelope {
    /// Builds a new envelope for `urn` carrying `data` (which must be a JSON object).
    ///
    /// Mints a UUID v4 `meta.id` and `trace_id`, sets `meta.queue` to `default`,
    /// `meta.lang` to `rust`, `schema_version` to 1, `created_at` to now (ms) and
    /// `attempts` to 0.
    ///
    /// ```
    /// use babelqueue_core::Envelope;
    /// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({"order_id": 1042}))?;
    /// assert_eq!(env.meta.schema_version, 1);
    /// assert_ne!(env.meta.id, env.trace_id);
    /// assert!(Envelope::new("", serde_json::json!({})).is_err());
    /// # Ok::<(), babelqueue_core::EnvelopeError>(())
    /// ```
    pub fn new(urn: impl Into<String>, data: Value) -> Result<Self, EnvelopeError> {
        let urn = urn.into();
        if urn.trim().is_empty() {
            return Err(EnvelopeError::EmptyUrn);
        }
        let data = match data {
            Value::Object(map) => map,
            other => return Err(EnvelopeError::PayloadNotAnObject(kind(&other))),
        };
        Ok(Envelope {
            job: urn,
            trace_id: uuid::Uuid::new_v4().to_string(),
            data: Data::from(data),
            meta: Meta {
                id: uuid::Uuid::new_v4().to_string(),
                queue: DEFAULT_QUEUE.to_owned(),
                lang: LANG.to_owned(),
                schema_version: SCHEMA_VERSION,
                created_at: now_millis(),
                extra: Map::new(),
            },
            attempts: 0,
            dead_letter: None,
            extra: Map::new(),
        })
    }

    /// Builds a new envelope whose `data` is `payload` serialized (it must serialize to a
    /// JSON object, e.g. a struct or a map).
    ///
    /// ```
    /// use babelqueue_core::Envelope;
    /// #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    /// struct Charge { payment_id: String, amount: u64 }
    ///
    /// let charge = Charge { payment_id: "pay_7f3a".into(), amount: 4200 };
    /// let env = Envelope::from_payload("urn:babel:payments:charge", &charge)?;
    /// assert_eq!(env.data_as::<Charge>()?, charge);
    /// # Ok::<(), babelqueue_core::EnvelopeError>(())
    /// ```
    pub fn from_payload<T: Serialize + ?Sized>(
        urn: impl Into<String>,
        payload: &T,
    ) -> Result<Self, EnvelopeError> {
        Envelope::new(urn, serde_json::to_value(payload)?)
    }

    /// Sets `meta.queue`.
    #[must_use]
    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.meta.queue = queue.into();
        self
    }

    /// Continues an existing trace: uses `trace_id` instead of the freshly minted one.
    #[must_use]
    pub fn with_trace_id(mut self, trace_id: impl Into<String>) -> Self {
        self.trace_id = trace_id.into();
        self
    }

    /// Continues the trace of `parent` (the message being handled): a message produced
    /// while handling another keeps its `trace_id` but has its own `meta.id`.
    ///
    /// ```
    /// use babelqueue_core::Envelope;
    /// let parent = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
    /// let child = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?
    ///     .continuing(&parent);
    /// assert_eq!(child.trace_id, parent.trace_id);
    /// assert_ne!(child.meta.id, parent.meta.id);
    /// # Ok::<(), babelqueue_core::EnvelopeError>(())
    /// ```
    #[must_use]
    pub fn continuing(self, parent: &Envelope) -> Self {
        self.with_trace_id(parent.trace_id.clone())
    }

    /// The message URN (`job`).
    pub fn urn(&self) -> &str {
        &self.job
    }

    /// The idempotency key: `meta.id`, or `None` when it is empty (fail open).
    pub fn id(&self) -> Option<&str> {
        let id = self.meta.id.as_str();
        (!id.is_empty()).then_some(id)
    }

    /// Deserializes `data` into `T`: from the text it arrived in when the map was not
    /// built yet (no map is built), else from the map in place (nothing of it is copied
    /// but what `T` keeps). The answer is the map's either way (see [`Data`]).
    pub fn data_as<T: DeserializeOwned>(&self) -> Result<T, EnvelopeError> {
        Ok(self.data.deserialize_into()?)
    }

    /// Encodes to the canonical compact JSON (contract field order, UTF-8 and `/`
    /// unescaped, `data` key order preserved).
    ///
    /// A `data` that was decoded and not changed since (reading it does not count) is
    /// written as the exact text it arrived in: numbers of any size and spelling
    /// (`92345678901234567890`, `-0`, `1.0E2`), repeated keys, escapes and whitespace
    /// inside it reach the next reader as the producer wrote them. A `data` built or
    /// changed here is written canonically.
    ///
    /// ```
    /// use babelqueue_core::Envelope;
    /// let body = br#"{"job":"urn:x","trace_id":"t","data":{"big":92345678901234567890,"e":1.0E2},"meta":{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":1},"attempts":0}"#;
    /// let env = Envelope::decode(body)?;
    /// assert_eq!(env.encode(), body);
    /// # Ok::<(), babelqueue_core::DecodeError>(())
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain strings, integers, a `Map<String, Value>` and checked JSON text
        // into a Vec cannot fail: there are no non-string keys, no NaN floats and no I/O.
        serde_json::to_vec(&Wire::of(self)).unwrap_or_default()
    }

    /// Like [`encode`](Self::encode), as a `String`.
    pub fn encode_string(&self) -> String {
        String::from_utf8(self.encode()).unwrap_or_default()
    }

    /// Decodes bytes into an envelope, applying exactly the consumer acceptance rules:
    /// the URN (`job`, else the `urn` alias) is a non-empty string, `meta.schema_version`
    /// is 1, `data` is an object, `attempts` is a non-negative integer and `trace_id` is a
    /// non-empty string. Unknown fields are tolerated (and kept in `extra`). Optional
    /// `meta` fields of the wrong type are read as absent. Never panics.
    ///
    /// ```
    /// use babelqueue_core::{DecodeError, Envelope};
    /// let ok = br#"{"urn":"urn:babel:orders:created","trace_id":"t","data":{},
    ///              "meta":{"id":"m","queue":"orders","lang":"go","schema_version":1,"created_at":0},
    ///              "attempts":0}"#;
    /// assert_eq!(Envelope::decode(ok)?.urn(), "urn:babel:orders:created");
    /// assert_eq!(Envelope::decode(b"[1,2]"), Err(DecodeError::NotAnObject("an array")));
    /// # Ok::<(), DecodeError>(())
    /// ```
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        // The known fields are picked while parsing (their names are not allocated, the
        // parsed object is not searched); the rules are those of `from_value`, which
        // `decode_agrees_with_from_value` checks.
        // UTF-8 checked once for the whole body (fast on ASCII), then parsed as text: the
        // byte parser would check every string on its own. Bytes that are not UTF-8 go
        // through the byte parser, which rejects them as before, with its own message.
        let top = match std::str::from_utf8(bytes) {
            Ok(text) => {
                if let Some(envelope) = Envelope::decode_keeping_data(text) {
                    return Ok(envelope);
                }
                pick_top(&mut serde_json::Deserializer::from_str(text), false)
            }
            Err(_) => pick_top(&mut serde_json::Deserializer::from_slice(bytes), false),
        }
        .map_err(|e| DecodeError::NotJson(e.to_string()))?;
        Envelope::from_shape(top)
    }

    /// An accepted envelope with its `data` kept as text (checked, not parsed), or `None`
    /// for anything else: the caller then decodes the whole text into values, which gives
    /// the answer (the same envelope, or the exact error and its position) that `decode`
    /// has always given. Only the envelopes it accepts take this way.
    fn decode_keeping_data(text: &str) -> Option<Envelope> {
        let top = pick_top(&mut serde_json::Deserializer::from_str(text), true).ok()?;
        if let Shape::Object(TopFields {
            data: Some(DataField::Text(raw)),
            ..
        }) = &top
            && !check_scanned_object(raw)
        {
            return None;
        }
        Envelope::from_shape(top).ok()
    }

    /// Whether `bytes` is an envelope a consumer accepts (see [`decode`](Self::decode)).
    pub fn accepts(bytes: &[u8]) -> bool {
        Envelope::decode(bytes).is_ok()
    }

    /// Applies the acceptance rules to an already parsed JSON value.
    pub fn from_value(value: Value) -> Result<Self, DecodeError> {
        let top = match Shape::of_value(value, &TOP) {
            Shape::Object(Picked {
                fields: [job, urn, trace_id, attempts, data, meta],
                rest,
            }) => Shape::Object(TopFields {
                fields: [job, urn, trace_id, attempts],
                data: data.map(DataField::Value),
                meta: meta.map(|m| Shape::of_value(m, &META)),
                rest,
            }),
            Shape::Other(kind) => Shape::Other(kind),
        };
        Envelope::from_shape(top)
    }

    /// The acceptance rules, on an object whose [`TOP`] fields (and `meta`'s [`META`]
    /// fields) are picked out.
    fn from_shape(top: Shape<TopFields>) -> Result<Self, DecodeError> {
        let TopFields {
            fields: [job, urn, trace_id, attempts],
            data,
            meta,
            rest: mut obj,
        } = match top {
            Shape::Object(picked) => picked,
            Shape::Other(kind) => return Err(DecodeError::NotAnObject(kind)),
        };
        let job = match (job, urn) {
            (Some(Value::String(s)), _) if !s.is_empty() => s,
            (_, Some(Value::String(s))) if !s.is_empty() => s,
            _ => return Err(DecodeError::MissingUrn),
        };
        let trace_id = match trace_id {
            Some(Value::String(s)) if !s.is_empty() => s,
            _ => return Err(DecodeError::InvalidTraceId),
        };
        let data = match data {
            Some(DataField::Value(Value::Object(m))) => Data::from(m),
            // Checked by the one who picked it (`decode_keeping_data`).
            Some(DataField::Text(text)) => Data::from_checked_text(text),
            Some(DataField::Value(other)) => {
                return Err(DecodeError::DataNotAnObject(kind(&other)));
            }
            None => return Err(DecodeError::DataNotAnObject("nothing")),
        };
        let Picked {
            fields: [id, queue, lang, schema_version, created_at],
            rest: meta,
        } = match meta {
            Some(Shape::Object(picked)) => picked,
            Some(Shape::Other(kind)) => return Err(DecodeError::MetaNotAnObject(kind)),
            None => return Err(DecodeError::MetaNotAnObject("nothing")),
        };
        let schema_version = match schema_version {
            Some(Value::Number(n)) if n.as_u64() == Some(u64::from(SCHEMA_VERSION)) => {
                SCHEMA_VERSION
            }
            Some(other) => return Err(DecodeError::UnsupportedSchemaVersion(other.to_string())),
            None => return Err(DecodeError::UnsupportedSchemaVersion("absent".into())),
        };
        let attempts = match attempts {
            // `-0` is a JSON integer zero (the Python SDK reads it as `0`); serde_json
            // reads it as the float `-0.0` (so `-0.0` is accepted too).
            Some(Value::Number(n)) => match n
                .as_u64()
                .or_else(|| {
                    n.as_f64()
                        .is_some_and(|f| f == 0.0 && f.is_sign_negative())
                        .then_some(0)
                })
                .and_then(|a| u32::try_from(a).ok())
            {
                Some(a) => a,
                None => return Err(DecodeError::InvalidAttempts(n.to_string())),
            },
            Some(other) => return Err(DecodeError::InvalidAttempts(other.to_string())),
            None => return Err(DecodeError::InvalidAttempts("absent".into())),
        };
        let string_field = |v: Option<Value>| match v {
            Some(Value::String(s)) => s,
            // A numeric id from a loose producer is still a usable identity.
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        let id = string_field(id);
        let queue = string_field(queue);
        let lang = string_field(lang);
        // Like the other optional `meta` fields, one of the wrong type (a float, a number
        // beyond i64) is read as absent; it is taken out of `meta` either way, so an
        // encoding writes `created_at` once.
        let created_at = created_at.and_then(|v| v.as_i64()).unwrap_or(0);
        let dead_letter = match obj.get("dead_letter") {
            Some(v) => match DeadLetter::deserialize(v) {
                Ok(dl) => {
                    obj.shift_remove("dead_letter");
                    Some(dl)
                }
                // A malformed block from elsewhere is kept verbatim in `extra`.
                Err(_) => None,
            },
            None => None,
        };
        Ok(Envelope {
            job,
            trace_id,
            data,
            meta: Meta {
                id,
                queue,
                lang,
                schema_version,
                created_at,
                extra: meta,
            },
            attempts,
            dead_letter,
            extra: obj,
        })
    }
}

/// What [`Envelope::encode`] writes: the envelope's fields in contract order, with `data`
/// as the text it arrived in when it still is the payload.
#[derive(Serialize)]
struct Wire<'a> {
    job: &'a str,
    trace_id: &'a str,
    data: WireData<'a>,
    meta: &'a Meta,
    attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    dead_letter: Option<&'a DeadLetter>,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

impl<'a> Wire<'a> {
    fn of(env: &'a Envelope) -> Self {
        Wire {
            job: &env.job,
            trace_id: &env.trace_id,
            data: WireData(&env.data),
            meta: &env.meta,
            attempts: env.attempts,
            dead_letter: env.dead_letter.as_ref(),
            extra: &env.extra,
        }
    }
}

/// `data` for [`Wire`]: its text verbatim (checked JSON, written as a raw value), else the
/// map.
struct WireData<'a>(&'a Data);

impl Serialize for WireData<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self
            .0
            .raw_text()
            .and_then(|t| serde_json::from_str::<&serde_json::value::RawValue>(t).ok())
        {
            Some(raw) => raw.serialize(serializer),
            None => self.0.as_map().serialize(serializer),
        }
    }
}

/// Deserializing an `Envelope` (e.g. nested in another document) applies the same
/// acceptance rules as [`Envelope::decode`].
impl<'de> Deserialize<'de> for Envelope {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let top = PickTop { raw_data: false }.deserialize(deserializer)?;
        Envelope::from_shape(top).map_err(serde::de::Error::custom)
    }
}

/// The top-level fields the acceptance rules read. `dead_letter` is not among them: a
/// malformed block stays in `extra` where it was.
const TOP: [&str; 6] = ["job", "urn", "trace_id", "attempts", "data", "meta"];

/// The `meta` fields the acceptance rules read; the others are `meta.extra`.
const META: [&str; 5] = ["id", "queue", "lang", "schema_version", "created_at"];

/// A JSON object with `N` named fields taken out, as a parsed [`Map`] would hold them: the
/// last of a repeated name wins, and the other fields keep the place of their first
/// occurrence.
struct Picked<const N: usize> {
    fields: [Option<Value>; N],
    rest: Map<String, Value>,
}

/// An envelope's object with its fields taken out: `job`, `urn`, `trace_id` and
/// `attempts` (TOP's order), `data`, and `meta` with its own [`META`] fields taken out.
struct TopFields {
    fields: [Option<Value>; 4],
    data: Option<DataField>,
    meta: Option<Shape<Picked<5>>>,
    rest: Map<String, Value>,
}

/// `data` as picked: parsed, or as its text (not yet checked).
enum DataField {
    Value(Value),
    Text(Box<str>),
}

/// Where `data` is in [`TOP`] (after the plain fields, before `meta`).
const DATA: usize = 4;

/// A JSON value read as an object's picked fields, or the kind of a value that is not an
/// object.
enum Shape<T> {
    Object(T),
    Other(&'static str),
}

impl<const N: usize> Shape<Picked<N>> {
    /// The same picking, from an already parsed value.
    fn of_value(value: Value, names: &[&'static str; N]) -> Self {
        match value {
            Value::Object(mut rest) => Shape::Object(Picked {
                fields: names.map(|name| rest.shift_remove(name)),
                rest,
            }),
            other => Shape::Other(kind(&other)),
        }
    }
}

/// Parses a value into a [`Shape`] of picked fields, without allocating the picked names
/// or searching the object afterwards: a `serde` seed over the names ([`Pick`]: any
/// object; [`PickTop`]: an envelope, `meta` included).
struct Pick<'n, const N: usize>(&'n [&'static str; N]);

/// `raw_data`: `data` is picked as its text (only a `serde_json` parser of text can), else
/// parsed.
struct PickTop {
    raw_data: bool,
}

/// The visits of a value that is not an object, shared by [`Pick`] and [`PickTop`].
macro_rules! not_objects {
    ($out:ty) => {
        fn visit_bool<E>(self, _: bool) -> Result<$out, E> {
            Ok(Shape::Other("a boolean"))
        }

        fn visit_i64<E>(self, _: i64) -> Result<$out, E> {
            Ok(Shape::Other("a number"))
        }

        fn visit_u64<E>(self, _: u64) -> Result<$out, E> {
            Ok(Shape::Other("a number"))
        }

        fn visit_f64<E>(self, _: f64) -> Result<$out, E> {
            Ok(Shape::Other("a number"))
        }

        fn visit_str<E>(self, _: &str) -> Result<$out, E> {
            Ok(Shape::Other("a string"))
        }

        fn visit_unit<E>(self) -> Result<$out, E> {
            Ok(Shape::Other("null"))
        }

        fn visit_none<E>(self) -> Result<$out, E> {
            Ok(Shape::Other("null"))
        }

        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<$out, D::Error> {
            d.deserialize_any(self)
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<$out, A::Error> {
            // Read to its end as values (a malformed array is not JSON, with the error
            // a parsed `Value` gives: `IgnoredAny` reports some at another column).
            while seq.next_element::<Value>()?.is_some() {}
            Ok(Shape::Other("an array"))
        }

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
    };
}

impl<'de, const N: usize> DeserializeSeed<'de> for Pick<'_, N> {
    type Value = Shape<Picked<N>>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, const N: usize> serde::de::Visitor<'de> for Pick<'_, N> {
    type Value = Shape<Picked<N>>;

    not_objects!(Self::Value);

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields: [Option<Value>; N] = std::array::from_fn(|_| None);
        let mut rest = Map::new();
        while let Some(key) = map.next_key_seed(Name(self.0))? {
            match key {
                Named::Picked(i) => fields[i] = Some(map.next_value()?),
                Named::Other(name) => {
                    let value = map.next_value()?;
                    rest.insert(name, value);
                }
            }
        }
        Ok(Shape::Object(Picked { fields, rest }))
    }
}

impl<'de> DeserializeSeed<'de> for PickTop {
    type Value = Shape<TopFields>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for PickTop {
    type Value = Shape<TopFields>;

    not_objects!(Self::Value);

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut top = TopFields {
            fields: Default::default(),
            data: None,
            meta: None,
            rest: Map::new(),
        };
        while let Some(key) = map.next_key_seed(Name(&TOP))? {
            // `meta`, last of TOP, is picked in turn; `data`, before it, as asked; the
            // others are values.
            match key {
                Named::Picked(i) if i == TOP.len() - 1 => {
                    top.meta = Some(map.next_value_seed(Pick(&META))?);
                }
                Named::Picked(DATA) if self.raw_data => {
                    let text: &serde_json::value::RawValue = map.next_value()?;
                    top.data = Some(DataField::Text(text.get().into()));
                }
                Named::Picked(DATA) => top.data = Some(DataField::Value(map.next_value()?)),
                Named::Picked(i) => top.fields[i] = Some(map.next_value()?),
                Named::Other(name) => {
                    let value = map.next_value()?;
                    top.rest.insert(name, value);
                }
            }
        }
        Ok(Shape::Object(top))
    }
}

/// An object key: one of the picked names (by index), or another, owned.
enum Named {
    Picked(usize),
    Other(String),
}

struct Name<'n, const N: usize>(&'n [&'static str; N]);

impl<'de, const N: usize> DeserializeSeed<'de> for Name<'_, N> {
    type Value = Named;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Named, D::Error> {
        d.deserialize_str(self)
    }
}

impl<const N: usize> serde::de::Visitor<'_> for Name<'_, N> {
    type Value = Named;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Named, E> {
        Ok(self
            .picked(key)
            .unwrap_or_else(|| Named::Other(key.to_owned())))
    }

    fn visit_string<E>(self, key: String) -> Result<Named, E> {
        Ok(self.picked(&key).unwrap_or(Named::Other(key)))
    }
}

impl<const N: usize> Name<'_, N> {
    fn picked(&self, key: &str) -> Option<Named> {
        self.0.iter().position(|n| *n == key).map(Named::Picked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `decode` picks fields while parsing; `from_value` picks them from a parsed value.
    /// Both must give the same envelope or the same error, whatever the bytes.
    #[test]
    fn decode_agrees_with_from_value() {
        let env = r#""trace_id":"t","data":{"a":1},"meta":{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":5},"attempts":0"#;
        let mut cases: Vec<String> = vec![
            format!(r#"{{"job":"urn:x",{env}}}"#),
            format!(r#"{{"urn":"urn:x",{env}}}"#),
            format!(r#"{{"job":"",{env},"urn":"urn:y"}}"#),
            format!(r#"{{"job":"urn:x",{env},"job":"urn:z"}}"#),
            format!(r#"{{"job":"urn:x",{env},"job":7}}"#),
            format!(
                r#"{{"x":1,"job":"urn:x","y":2,{env},"x":3,"dead_letter":{{"reason":"failed"}}}}"#
            ),
            format!(r#"{{"job":"urn:x",{env},"dead_letter":"not a block","z":null}}"#),
            format!(r#"{{"jo\u0062":"urn:x",{env}}}"#),
            format!(r#"{{"job":"urn:x",{env},"attempts":-0}}"#),
            format!(r#"{{"job":"urn:x",{env},"attempts":1.0}}"#),
            format!(r#"{{"job":"urn:x",{env},"attempts":4294967296}}"#),
            format!(r#"{{"job":"urn:x",{env},"meta":[1]}}"#),
            format!(
                r#"{{"job":"urn:x",{env},"meta":{{"schema_version":1,"id":12,"id":"b","extra":{{"k":[1,2]}},"created_at":1e3}}}}"#
            ),
            format!(r#"{{"job":"urn:x",{env},"data":"no"}}"#),
            format!(r#"{{"job":"urn:x",{env},"trace_id":""}}"#),
            r#"{"job":"urn:x"}"#.into(),
            r#"{}"#.into(),
            r#"[1,{"job":2}]"#.into(),
            r#"[1,"#.into(),
            // Found by the `envelope` fuzz target: skipping the array's items reported the
            // control character one column early.
            "[\"\u{4}\t".into(),
            "{\"meta\":[\"\u{4}\t".into(),
            r#""text""#.into(),
            r#"12.5"#.into(),
            r#"null"#.into(),
            r#"true"#.into(),
            r#"{"job":"urn:x"} trailing"#.into(),
            r#"{"job":"urn:x","#.into(),
            "".into(),
        ];
        // `data` is kept as text when the envelope is accepted: its check must accept and
        // refuse exactly what parsing it as a value does, at the same place.
        let with_data = |data: &str| {
            format!(
                r#"{{"job":"urn:x","trace_id":"t","data":{data},"meta":{{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":5}},"attempts":0}}"#
            )
        };
        for data in [
            r#"{"a":1e400}"#,
            r#"{"a":-1e400,"b":1}"#,
            r#"{"a":1e308,"b":-0,"c":18446744073709551616,"d":-9223372036854775809}"#,
            r#"{"a":"\ud800"}"#,
            r#"{"a":"\ud83d\ude00","b":"\u00e9\n\"\\/"}"#,
            "{\"a\":\"\u{1}\"}",
            r#"{"a":1,"a":2}"#,
            r#"{ "a" : [ 1 , { } ] , "b":{"c":null} }"#,
            r#"{"a":tru}"#,
            r#"{"a":01}"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{1:2}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":"x"} "#,
            "{}",
            "[]",
            "null",
            "\"{}\"",
        ] {
            cases.push(with_data(data));
        }
        // Nesting around the parser's limit (counted from the envelope's own object).
        for depth in 120..=130 {
            let objects = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
            cases.push(with_data(&objects));
            let arrays = format!("{{\"a\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
            cases.push(with_data(&arrays));
        }
        for case in &cases {
            let old = serde_json::from_slice::<Value>(case.as_bytes())
                .map_err(|e| DecodeError::NotJson(e.to_string()))
                .and_then(Envelope::from_value);
            let new = Envelope::decode(case.as_bytes());
            // An accepted envelope keeps its `data` as text (so the comparison is of
            // the two ways, not of one way twice).
            if let Ok(env) = &new {
                assert!(env.data.is_text(), "{case}");
            }
            assert_eq!(new, old, "{case}");
            let nested = serde_json::from_str::<Envelope>(case).map_err(|e| e.to_string());
            assert_eq!(nested.is_ok(), old.is_ok(), "{case}");
        }
    }

    /// Bodies that are not UTF-8, or UTF-8 beyond ASCII: `decode` (which checks UTF-8 once
    /// and parses text) answers as the byte parser does, errors and their messages alike.
    #[test]
    fn decode_agrees_with_the_byte_parser_on_any_utf8_or_not() {
        let env = r#""trace_id":"t","data":{"a":"\u00e9"},"meta":{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":5},"attempts":0"#;
        let good = format!(r#"{{"job":"urn:x",{env}}}"#).into_bytes();
        let mut cases: Vec<Vec<u8>> = vec![
            good.clone(),
            format!(r#"{{"job":"urn:€ 支払い 💳",{env},"note":"naïve"}}"#).into_bytes(),
        ];
        // A byte that is not UTF-8 inside a string, a key, between tokens and at the end;
        // a truncated multibyte sequence; an overlong encoding; a lone surrogate's bytes.
        for bad in [
            &b"\xff"[..],
            b"\xc3",
            b"\xe2\x82",
            b"\xc0\xaf",
            b"\xed\xa0\x80",
        ] {
            for at in [9, 2, good.len() - 1, good.len()] {
                let mut body = good.clone();
                body.splice(at..at, bad.iter().copied());
                cases.push(body);
            }
        }
        for case in &cases {
            let old = serde_json::from_slice::<Value>(case)
                .map_err(|e| DecodeError::NotJson(e.to_string()))
                .and_then(Envelope::from_value);
            assert_eq!(
                Envelope::decode(case),
                old,
                "{}",
                String::from_utf8_lossy(case)
            );
        }
        assert!(Envelope::decode(&cases[1]).is_ok());
        assert!(cases[2..].iter().all(|c| Envelope::decode(c).is_err()));
    }

    #[test]
    fn attempts_minus_zero_is_a_zero() {
        let body = br#"{"job":"urn:x","trace_id":"t","data":{},"meta":{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":1},"attempts":-0}"#;
        assert_eq!(Envelope::decode(body).unwrap().attempts, 0);
        let neg = br#"{"job":"urn:x","trace_id":"t","data":{},"meta":{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":1},"attempts":-1}"#;
        assert!(Envelope::decode(neg).is_err());
    }

    mod reencode {
        use super::*;
        use proptest::prelude::*;

        /// JSON number texts as other producers write them, in range of a parsed `Value`.
        fn number() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<i64>().prop_map(|n| n.to_string()),
                "-?[1-9][0-9]{19,40}",
                Just("-0".to_owned()),
                "-?(0|[1-9][0-9]{0,5})\\.[0-9]{1,6}",
                "-?[1-9]\\.[0-9]{1,4}[eE][+-]?[0-9]{1,2}",
                "-?[1-9][eE][0-9]{1,2}",
            ]
        }

        fn ws() -> impl Strategy<Value = String> {
            "[ \t\n\r]{0,2}"
        }

        fn value() -> impl Strategy<Value = String> {
            let leaf = prop_oneof![
                number(),
                Just("true".to_owned()),
                Just("null".to_owned()),
                "[a-z\u{e9}\u{2615}/]{0,4}".prop_map(|s| format!("{s:?}")),
                Just(r#""caf\u00e9 \/ \ud83d\ude00""#.to_owned()),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    (prop::collection::vec((ws(), inner.clone()), 0..4)).prop_map(|v| format!(
                        "[{}]",
                        v.into_iter()
                            .map(|(w, x)| format!("{w}{x}"))
                            .collect::<Vec<_>>()
                            .join(",")
                    )),
                    object(inner),
                ]
            })
        }

        fn object(inner: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
            prop::collection::vec(("[a-c]", ws(), inner, ws()), 0..5).prop_map(|v| {
                format!(
                    "{{{}}}",
                    v.into_iter()
                        .map(|(k, w1, x, w2)| format!("{w1}\"{k}\"{w1}:{w2}{x}{w2}"))
                        .collect::<Vec<_>>()
                        .join(",")
                )
            })
        }

        proptest! {
            #[test]
            fn decode_then_encode_keeps_the_data_text(data in object(value())) {
                let body = format!(
                    r#"{{"job":"urn:x","trace_id":"t","data":{data},"meta":{{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":1}},"attempts":0}}"#
                );
                let env = Envelope::decode(body.as_bytes());
                prop_assume!(env.is_ok());
                let env = env.unwrap();
                // Reading the map does not drop the text.
                let _ = env.data.len();
                prop_assert_eq!(String::from_utf8(env.encode()).unwrap(), body);
            }
        }

        #[test]
        fn the_issue_s_numbers_survive_and_a_change_is_canonical() {
            let body = r#"{"job":"urn:x","trace_id":"t","data":{"amount":4200,"big":92345678901234567890,"z":-0,"e":1.0E2},"meta":{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":1},"attempts":0}"#;
            let mut env = Envelope::decode(body.as_bytes()).unwrap();
            assert_eq!(env.encode_string(), body);
            env.data.insert("n".into(), 1.into());
            assert!(
                env.encode_string().contains(
                    r#""data":{"amount":4200,"big":9.234567890123457e+19,"z":-0.0,"e":100.0,"n":1}"#
                ),
                "{}",
                env.encode_string()
            );
        }
    }
}
