//! Apache ActiveMQ Artemis (AMQP 1.0, read by JMS peers): the envelope's projection and the
//! attempts rule.
//!
//! The body is the envelope, byte for byte. On produce the binding projects what a JMS
//! peer reads (the manifest's `artemis.property_projection` block, SPEC §7):
//!
//! | AMQP 1.0 slot | JMS name | value |
//! | --- | --- | --- |
//! | message annotation `x-opt-jms-type` | `JMSType` | `job` (the URN) |
//! | property `correlation-id` | `JMSCorrelationID` | `trace_id` |
//! | property `creation-time` | `JMSTimestamp` | `meta.created_at` (Unix ms) |
//! | application property `bq_schema_version` | | `meta.schema_version` in decimal |
//! | application property `bq_source_lang` | | `meta.lang` |
//! | application property `bq_attempts` | | `attempts` in decimal |
//! | application property `bq_app_id` | | `babelqueue` |
//!
//! The application property names use **underscores**: JMS property names must be Java
//! identifiers. The URN, `trace_id` (and no message id) ride the JMS-native slots, not
//! `bq_` properties. All application properties are strings.
//!
//! On consume, `attempts = max(body, delivery-count)`: the AMQP `delivery-count` header is
//! 0-based, so no −1 ([`reconcile_attempts`]).
//!
//! ```
//! use babelqueue_core::binding::artemis;
//! use babelqueue_core::Envelope;
//!
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
//! let p = artemis::project(&env);
//! assert_eq!(p.jms_type, "urn:babel:payments:charge");
//! assert!(p.properties.contains(&("bq_app_id", "babelqueue".to_string())));
//! assert_eq!(artemis::reconcile_attempts(0, 2), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::binding::amqp::{APP_ID, Lenient};
use crate::envelope::Envelope;

/// The message annotation carrying the JMS type (the URN).
pub const JMS_TYPE_ANNOTATION: &str = "x-opt-jms-type";
/// `bq_schema_version`: `meta.schema_version` in decimal.
pub const SCHEMA_VERSION: &str = "bq_schema_version";
/// `bq_source_lang`: `meta.lang`.
pub const SOURCE_LANG: &str = "bq_source_lang";
/// `bq_attempts`: `attempts` in decimal.
pub const ATTEMPTS: &str = "bq_attempts";
/// `bq_app_id`: always `babelqueue`.
pub const APP_ID_PROPERTY: &str = "bq_app_id";

/// The AMQP 1.0 message parts projected from one envelope. An empty `jms_type` or
/// `correlation_id` is left unset by the transport.
///
/// ```
/// use babelqueue_core::binding::artemis;
/// use babelqueue_core::Envelope;
///
/// let mut env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// env.meta.created_at = 1749132727000;
/// assert_eq!(artemis::project(&env).creation_time_ms, Some(1749132727000));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    /// The `x-opt-jms-type` annotation ([`JMS_TYPE_ANNOTATION`]): the URN.
    pub jms_type: String,
    /// The `correlation-id` property: the `trace_id`.
    pub correlation_id: String,
    /// The `creation-time` property (Unix ms): `meta.created_at` when it is positive
    /// (0 is what a body without `created_at` decodes to).
    pub creation_time_ms: Option<i64>,
    /// The `bq_*` application properties (strings), in the table's order.
    pub properties: Vec<(&'static str, String)>,
}

/// Projects an envelope (see the module table).
///
/// ```
/// use babelqueue_core::binding::artemis;
/// use babelqueue_core::Envelope;
///
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// let names: Vec<_> = artemis::project(&env).properties.into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["bq_schema_version", "bq_source_lang", "bq_attempts", "bq_app_id"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn project(env: &Envelope) -> Projection {
    let mut props = Vec::with_capacity(4);
    props.push((SCHEMA_VERSION, env.meta.schema_version.to_string()));
    if !env.meta.lang.is_empty() {
        props.push((SOURCE_LANG, env.meta.lang.clone()));
    }
    props.push((ATTEMPTS, env.attempts.to_string()));
    props.push((APP_ID_PROPERTY, APP_ID.to_owned()));
    Projection {
        jms_type: env.job.clone(),
        correlation_id: env.trace_id.clone(),
        creation_time_ms: (env.meta.created_at > 0).then_some(env.meta.created_at),
        properties: props,
    }
}

/// Lenient: the projection of a body that is an envelope without the full acceptance check
/// (a JSON object with a non-empty string `job`, else `urn`), `None` for anything else.
/// `attempts` absent or null counts as 0; fields of another type are left out (a numeric
/// `meta.id` or `meta.lang` is read in decimal).
///
/// ```
/// use babelqueue_core::binding::artemis;
/// let p = artemis::project_body(br#"{"job":"urn:x","meta":{"lang":"go"}}"#).unwrap();
/// assert_eq!(p.properties.len(), 3);
/// assert_eq!(artemis::project_body(b"7"), None);
/// ```
pub fn project_body(body: &[u8]) -> Option<Projection> {
    let l = Lenient::parse(body)?;
    let mut props = Vec::with_capacity(4);
    if let Some(v) = l.meta_int("schema_version") {
        props.push((SCHEMA_VERSION, v.to_string()));
    }
    if let Some(lang) = l.meta_text("lang").filter(|s| !s.is_empty()) {
        props.push((SOURCE_LANG, lang));
    }
    if let Some(a) = l.attempts() {
        props.push((ATTEMPTS, a.to_string()));
    }
    props.push((APP_ID_PROPERTY, APP_ID.to_owned()));
    Some(Projection {
        jms_type: l.urn.clone(),
        correlation_id: l.str_field("trace_id").unwrap_or_default().to_owned(),
        creation_time_ms: l.meta_int("created_at").filter(|ms| *ms > 0),
        properties: props,
    })
}

/// Artemis's attempts rule: `max(body, delivery-count)`.
///
/// The AMQP `delivery-count` header is 0-based (0 on a first delivery), so it maps with no
/// −1; the max never lowers a runtime-incremented body count (a republish starts the count
/// at 0 again). A JMS consumer reading the 1-based `JMSXDeliveryCount` subtracts 1 first.
///
/// ```
/// use babelqueue_core::binding::artemis::reconcile_attempts;
/// assert_eq!(reconcile_attempts(2, 5), 5);
/// assert_eq!(reconcile_attempts(5, 1), 5);
/// assert_eq!(reconcile_attempts(4, 0), 4);
/// ```
pub fn reconcile_attempts(body: u32, delivery_count: u32) -> u32 {
    body.max(delivery_count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn project_and_lenient_agree() {
        let mut e = Envelope::new("urn:babel:a", json!({})).unwrap();
        e.meta.created_at = 1;
        e.attempts = u32::MAX;
        assert_eq!(project_body(&e.encode()), Some(project(&e)));
        e.meta.created_at = 0;
        e.meta.lang.clear();
        let p = project(&e);
        assert_eq!(p.creation_time_ms, None);
        assert_eq!(p.properties.len(), 3);
    }

    #[test]
    fn reconcile_extremes() {
        assert_eq!(reconcile_attempts(0, u32::MAX), u32::MAX);
        assert_eq!(reconcile_attempts(0, 0), 0);
    }
}
