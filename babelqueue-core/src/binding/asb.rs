//! Azure Service Bus: the envelope's native message fields and typed application
//! properties, and the attempts rule.
//!
//! The message body is the envelope, byte for byte. On produce the binding sets (the
//! manifest's `asb.property_projection` block, SPEC §7):
//!
//! | Service Bus field | value |
//! | --- | --- |
//! | `Subject` | `job` (the URN) |
//! | `CorrelationId` | `trace_id` |
//! | `MessageId` | `meta.id` |
//! | `ContentType` | `application/json` |
//! | application property `bq-schema-version` | `meta.schema_version`, a **number** |
//! | application property `bq-source-lang` | `meta.lang`, a string |
//! | application property `bq-created-at` | `meta.created_at` (Unix ms), a **number** |
//!
//! Application properties are AMQP 1.0 typed values: numbers stay numbers
//! ([`PropertyValue::Int`]). A transport encodes an integer that fits in 32 bits as an AMQP
//! `int` and a larger one (every millisecond timestamp) as an AMQP `long`, as the Python SDK
//! does ([`fits_int32`]). An empty string field is left unset (the Python SDK skips it).
//!
//! On consume, `attempts = max(body, DeliveryCount − 1)` ([`reconcile_attempts`]).
//!
//! ```
//! use babelqueue_core::binding::asb::{self, PropertyValue};
//! use babelqueue_core::Envelope;
//!
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
//! let m = asb::project(&env);
//! assert_eq!(m.subject, "urn:babel:payments:charge");
//! assert_eq!(m.application_properties[0], ("bq-schema-version", PropertyValue::Int(1)));
//! assert_eq!(asb::reconcile_attempts(0, 3), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::binding::amqp::Lenient;
use crate::envelope::Envelope;

/// A typed application property value (`Int` for numbers, `Str` for strings); the same
/// type as the AMQP 0-9-1 header value.
pub use crate::binding::amqp::HeaderValue as PropertyValue;

/// `bq-schema-version`: `meta.schema_version` (number).
pub const SCHEMA_VERSION: &str = "bq-schema-version";
/// `bq-source-lang`: `meta.lang` (string).
pub const SOURCE_LANG: &str = "bq-source-lang";
/// `bq-created-at`: `meta.created_at` (number, Unix ms).
pub const CREATED_AT: &str = "bq-created-at";
/// The `ContentType` of every BabelQueue message.
pub const CONTENT_TYPE: &str = "application/json";

/// The Service Bus fields projected from one envelope. An empty `subject`,
/// `correlation_id` or `message_id` is left unset by the transport.
///
/// ```
/// use babelqueue_core::binding::asb;
/// use babelqueue_core::Envelope;
///
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// assert_eq!(asb::project(&env).content_type, "application/json");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    /// `Subject`: the URN.
    pub subject: String,
    /// `CorrelationId`: the `trace_id`.
    pub correlation_id: String,
    /// `MessageId`: `meta.id`.
    pub message_id: String,
    /// `ContentType`: always [`CONTENT_TYPE`].
    pub content_type: &'static str,
    /// The `bq-*` application properties, natively typed, in the table's order.
    pub application_properties: Vec<(&'static str, PropertyValue)>,
}

/// Projects an envelope onto Service Bus fields (see the module table).
///
/// ```
/// use babelqueue_core::binding::asb::{self, PropertyValue};
/// use babelqueue_core::Envelope;
///
/// let mut env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// env.meta.created_at = 1749132727000;
/// let m = asb::project(&env);
/// assert_eq!(m.message_id, env.meta.id);
/// assert_eq!(m.application_properties[2], ("bq-created-at", PropertyValue::Int(1749132727000)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn project(env: &Envelope) -> Projection {
    let mut props = Vec::with_capacity(3);
    props.push((
        SCHEMA_VERSION,
        PropertyValue::Int(i64::from(env.meta.schema_version)),
    ));
    if !env.meta.lang.is_empty() {
        props.push((SOURCE_LANG, PropertyValue::Str(env.meta.lang.clone())));
    }
    props.push((CREATED_AT, PropertyValue::Int(env.meta.created_at)));
    Projection {
        subject: env.job.clone(),
        correlation_id: env.trace_id.clone(),
        message_id: env.meta.id.clone(),
        content_type: CONTENT_TYPE,
        application_properties: props,
    }
}

/// Lenient: the projection of a body that is an envelope without the full acceptance check
/// (a JSON object with a non-empty string `job`, else `urn`), `None` for anything else.
/// Fields of another type are left out (a numeric `meta.id` or `meta.lang` is read in decimal).
///
/// ```
/// use babelqueue_core::binding::asb;
/// let m = asb::project_body(br#"{"job":"urn:x","meta":{"schema_version":"1"}}"#).unwrap();
/// assert!(m.application_properties.is_empty());
/// assert_eq!(asb::project_body(b"[]"), None);
/// ```
pub fn project_body(body: &[u8]) -> Option<Projection> {
    let l = Lenient::parse(body)?;
    let mut props = Vec::with_capacity(3);
    if let Some(v) = l.meta_int("schema_version") {
        props.push((SCHEMA_VERSION, PropertyValue::Int(v)));
    }
    if let Some(lang) = l.meta_text("lang").filter(|s| !s.is_empty()) {
        props.push((SOURCE_LANG, PropertyValue::Str(lang)));
    }
    if let Some(v) = l.meta_int("created_at") {
        props.push((CREATED_AT, PropertyValue::Int(v)));
    }
    Some(Projection {
        subject: l.urn.clone(),
        correlation_id: l.str_field("trace_id").unwrap_or_default().to_owned(),
        message_id: l.meta_id().unwrap_or_default(),
        content_type: CONTENT_TYPE,
        application_properties: props,
    })
}

/// Whether an integer property fits an AMQP `int` (32 bits); a transport encodes the
/// others as an AMQP `long`.
///
/// ```
/// use babelqueue_core::binding::asb::fits_int32;
/// assert!(fits_int32(1));
/// assert!(!fits_int32(1749132727000));
/// ```
pub fn fits_int32(value: i64) -> bool {
    i32::try_from(value).is_ok()
}

/// Service Bus's attempts rule: `max(body, DeliveryCount − 1)`.
///
/// `DeliveryCount` is Service Bus's 1-based delivery counter: a first delivery (1) reads
/// the body's count, 0 or 1 leave it untouched, and a count the runtime already passed (it
/// retries by republishing with `attempts + 1`, which starts the count at 1 again) never
/// lowers it. A client that reports no count passes 0.
///
/// ```
/// use babelqueue_core::binding::asb::reconcile_attempts;
/// assert_eq!(reconcile_attempts(0, 1), 0);
/// assert_eq!(reconcile_attempts(2, 5), 4);
/// assert_eq!(reconcile_attempts(5, 2), 5);
/// assert_eq!(reconcile_attempts(3, 0), 3);
/// ```
pub fn reconcile_attempts(body: u32, delivery_count: u32) -> u32 {
    body.max(delivery_count.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn project_and_lenient_agree() {
        let mut e = Envelope::new("urn:babel:a", json!({})).unwrap();
        e.meta.created_at = 1_749_132_727_000;
        assert_eq!(project_body(&e.encode()), Some(project(&e)));
    }

    #[test]
    fn empty_lang_and_id() {
        let mut e = Envelope::new("urn:babel:a", json!({})).unwrap();
        e.meta.lang.clear();
        e.meta.id.clear();
        let m = project(&e);
        assert_eq!(m.message_id, "");
        assert_eq!(m.application_properties.len(), 2);
        assert_eq!(project_body(&e.encode()), Some(m));
    }

    #[test]
    fn reconcile_extremes() {
        assert_eq!(reconcile_attempts(0, u32::MAX), u32::MAX - 1);
        assert_eq!(reconcile_attempts(u32::MAX, 2), u32::MAX);
        assert_eq!(reconcile_attempts(0, 0), 0);
        assert!(fits_int32(i64::from(i32::MIN)));
        assert!(!fits_int32(i64::from(i32::MAX) + 1));
    }
}
