//! Apache Pulsar: the envelope's string properties and the attempts rule.
//!
//! The payload is the envelope, byte for byte. On produce the binding sets these
//! string→string properties (the manifest's `pulsar.property_projection` block, SPEC §7):
//!
//! | property | value |
//! | --- | --- |
//! | `bq-job` | `job` (the URN) |
//! | `bq-trace-id` | `trace_id` |
//! | `bq-message-id` | `meta.id` |
//! | `bq-schema-version` | `meta.schema_version` in decimal |
//! | `bq-source-lang` | `meta.lang` |
//! | `bq-attempts` | `attempts` in decimal |
//!
//! An empty string value is left out, as in the Python SDK (`bq-schema-version` and
//! `bq-attempts` are always there). The native `publishTime` is broker-set; the body's
//! `meta.created_at` stays authoritative.
//!
//! On consume, `attempts = max(body, RedeliveryCount)`: Pulsar's count is 0-based, so no
//! −1 ([`reconcile_attempts`]). The family's Pulsar consumers also read a valid `bq-attempts`
//! property in place of the body's count before that max
//! ([`reconcile_attempts_with_property`]) and route on a non-blank `bq-job` property
//! ([`routing_urn`]).
//!
//! ```
//! use babelqueue_core::binding::pulsar;
//! use babelqueue_core::Envelope;
//!
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
//! assert_eq!(pulsar::properties(&env)[0], ("bq-job", "urn:babel:payments:charge".to_string()));
//! assert_eq!(pulsar::reconcile_attempts(2, 5), 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::binding::amqp::Lenient;
use crate::envelope::Envelope;

/// `bq-job`: the URN (the routing key on consume).
pub const JOB: &str = "bq-job";
/// `bq-trace-id`: the `trace_id`.
pub const TRACE_ID: &str = "bq-trace-id";
/// `bq-message-id`: `meta.id`.
pub const MESSAGE_ID: &str = "bq-message-id";
/// `bq-schema-version`: `meta.schema_version` in decimal.
pub const SCHEMA_VERSION: &str = "bq-schema-version";
/// `bq-source-lang`: `meta.lang`.
pub const SOURCE_LANG: &str = "bq-source-lang";
/// `bq-attempts`: `attempts` in decimal.
pub const ATTEMPTS: &str = "bq-attempts";

fn push(out: &mut Vec<(&'static str, String)>, name: &'static str, value: &str) {
    if !value.is_empty() {
        out.push((name, value.to_owned()));
    }
}

/// The properties of an envelope, in the table's order.
///
/// ```
/// use babelqueue_core::binding::pulsar;
/// use babelqueue_core::Envelope;
///
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// let p = pulsar::properties(&env);
/// assert_eq!(p.len(), 6);
/// assert_eq!(p[5], ("bq-attempts", "0".to_string()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn properties(env: &Envelope) -> Vec<(&'static str, String)> {
    let mut out = Vec::with_capacity(6);
    push(&mut out, JOB, &env.job);
    push(&mut out, TRACE_ID, &env.trace_id);
    push(&mut out, MESSAGE_ID, &env.meta.id);
    out.push((SCHEMA_VERSION, env.meta.schema_version.to_string()));
    push(&mut out, SOURCE_LANG, &env.meta.lang);
    out.push((ATTEMPTS, env.attempts.to_string()));
    out
}

/// Lenient: the properties of a body that is an envelope without the full acceptance check
/// (a JSON object with a non-empty string `job`, else `urn`), `None` for anything else.
/// `attempts` absent or null counts as 0; fields of another type are left out (a numeric
/// `meta.id` or `meta.lang` is read in decimal).
///
/// ```
/// use babelqueue_core::binding::pulsar;
/// let p = pulsar::project_body(br#"{"job":"urn:x"}"#).unwrap();
/// assert_eq!(p, vec![("bq-job", "urn:x".to_string()), ("bq-attempts", "0".to_string())]);
/// assert_eq!(pulsar::project_body(b"{}"), None);
/// ```
pub fn project_body(body: &[u8]) -> Option<Vec<(&'static str, String)>> {
    let l = Lenient::parse(body)?;
    let mut out = Vec::with_capacity(6);
    push(&mut out, JOB, &l.urn);
    push(
        &mut out,
        TRACE_ID,
        l.str_field("trace_id").unwrap_or_default(),
    );
    push(&mut out, MESSAGE_ID, &l.meta_id().unwrap_or_default());
    if let Some(v) = l.meta_int("schema_version") {
        out.push((SCHEMA_VERSION, v.to_string()));
    }
    push(
        &mut out,
        SOURCE_LANG,
        &l.meta_text("lang").unwrap_or_default(),
    );
    if let Some(a) = l.attempts() {
        out.push((ATTEMPTS, a.to_string()));
    }
    Some(out)
}

/// Pulsar's attempts rule: `max(body, RedeliveryCount)`.
///
/// `RedeliveryCount` is 0-based (0 on a first delivery), so it maps with no −1; the max
/// never lowers a runtime-incremented body count (a republish with `attempts + 1` starts
/// the redelivery count at 0 again).
///
/// ```
/// use babelqueue_core::binding::pulsar::reconcile_attempts;
/// assert_eq!(reconcile_attempts(0, 0), 0);
/// assert_eq!(reconcile_attempts(0, 2), 2);
/// assert_eq!(reconcile_attempts(5, 1), 5);
/// ```
pub fn reconcile_attempts(body: u32, redelivery_count: u32) -> u32 {
    body.max(redelivery_count)
}

/// The full consume rule of the family's Pulsar transports (Python `PulsarTransport`,
/// §5.5): a valid `bq-attempts` property (ASCII digits only, no sign or whitespace, at most
/// `i32::MAX`) replaces the body's count (an absent or invalid one leaves it), then the
/// result is raised to `RedeliveryCount`.
///
/// ```
/// use babelqueue_core::binding::pulsar::reconcile_attempts_with_property;
/// assert_eq!(reconcile_attempts_with_property(5, Some("1"), 0), 1);
/// assert_eq!(reconcile_attempts_with_property(5, Some(" 1"), 0), 5);
/// assert_eq!(reconcile_attempts_with_property(1, Some("2"), 4), 4);
/// ```
pub fn reconcile_attempts_with_property(
    body: u32,
    property: Option<&str>,
    redelivery_count: u32,
) -> u32 {
    let base = property.and_then(parse_property_attempts).unwrap_or(body);
    base.max(redelivery_count)
}

/// A `bq-attempts` property value as a count: ASCII digits only, at most `i32::MAX`
/// (the Java and .NET consumers' limit); `None` otherwise.
///
/// ```
/// use babelqueue_core::binding::pulsar::parse_property_attempts;
/// assert_eq!(parse_property_attempts("007"), Some(7));
/// assert_eq!(parse_property_attempts("2147483648"), None);
/// assert_eq!(parse_property_attempts("-1"), None);
/// ```
pub fn parse_property_attempts(value: &str) -> Option<u32> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let trimmed = value.trim_start_matches('0');
    if trimmed.len() > 10 {
        return None;
    }
    let n: u64 = if trimmed.is_empty() {
        0
    } else {
        trimmed.parse().ok()?
    };
    u32::try_from(n).ok().filter(|n| i32::try_from(*n).is_ok())
}

/// The URN a consumer routes on: a `bq-job` property that is not blank (ASCII whitespace
/// trimmed), else `None` (route on the body's URN).
///
/// ```
/// use babelqueue_core::binding::pulsar::routing_urn;
/// assert_eq!(routing_urn(Some(" urn:x\t")), Some("urn:x"));
/// assert_eq!(routing_urn(Some(" ")), None);
/// ```
pub fn routing_urn(property: Option<&str>) -> Option<&str> {
    property
        .map(|p| p.trim_matches(|c: char| c.is_ascii_whitespace()))
        .filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn properties_and_lenient_agree() {
        let mut e = Envelope::new("urn:babel:a", json!({})).unwrap();
        e.attempts = u32::MAX;
        assert_eq!(project_body(&e.encode()), Some(properties(&e)));
        e.meta.id.clear();
        assert!(!properties(&e).iter().any(|(k, _)| *k == MESSAGE_ID));
    }

    #[test]
    fn property_attempts_edges() {
        assert_eq!(parse_property_attempts(""), None);
        assert_eq!(parse_property_attempts("0"), Some(0));
        assert_eq!(parse_property_attempts("2147483647"), Some(i32::MAX as u32));
        assert_eq!(parse_property_attempts(&"0".repeat(50)), Some(0));
        assert_eq!(parse_property_attempts(&"9".repeat(50)), None);
        assert_eq!(parse_property_attempts("+1"), None);
        assert_eq!(reconcile_attempts_with_property(3, None, 0), 3);
        assert_eq!(reconcile_attempts_with_property(3, Some("x"), 1), 3);
        assert_eq!(reconcile_attempts(u32::MAX, u32::MAX), u32::MAX);
    }
}
