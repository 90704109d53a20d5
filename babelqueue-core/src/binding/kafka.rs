//! Apache Kafka: record headers and timestamp, the attempts rule, the DLQ topic and the
//! retry tier topics of the Python SDK's `kafka_retry`.
//!
//! The record value is the envelope, byte for byte. On produce the binding adds UTF-8
//! string headers and the record timestamp (the manifest's `kafka.property_projection`
//! block, SPEC §7):
//!
//! | header | value |
//! | --- | --- |
//! | `bq-job` | `job` (the URN) |
//! | `bq-trace-id` | `trace_id` |
//! | `bq-message-id` | `meta.id` |
//! | `bq-schema-version` | `meta.schema_version` in decimal |
//! | `bq-source-lang` | `meta.lang` |
//! | `bq-attempts` | `attempts` in decimal |
//!
//! and the record timestamp = `meta.created_at` (Unix ms, [`timestamp_ms`]). As in the
//! Python SDK an empty string header is left out (`bq-schema-version` and `bq-attempts`
//! are always there).
//!
//! Kafka has no delivery count, so on consume the `bq-attempts` header is
//! **authoritative**, not a max ([`reconcile_attempts`]). Dead letters go to the
//! `<topic>.dlq` topic ([`dead_letter_topic`]); delayed retries are parked on tier topics
//! `<topic>.retry.<n>` that a re-inject consumer moves back (the [`retry`] functions).
//!
//! ```
//! use babelqueue_core::binding::kafka;
//! use babelqueue_core::Envelope;
//!
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
//! let headers = kafka::headers(&env);
//! assert!(headers.contains(&("bq-attempts", "0".to_string())));
//! assert_eq!(kafka::reconcile_attempts(5, Some(b"1")), 1);
//! assert_eq!(kafka::dead_letter_topic("payments"), "payments.dlq");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::binding::amqp::Lenient;
use crate::envelope::Envelope;

/// `bq-job`: the URN.
pub const JOB: &str = "bq-job";
/// `bq-trace-id`: the `trace_id`.
pub const TRACE_ID: &str = "bq-trace-id";
/// `bq-message-id`: `meta.id`.
pub const MESSAGE_ID: &str = "bq-message-id";
/// `bq-schema-version`: `meta.schema_version` in decimal.
pub const SCHEMA_VERSION: &str = "bq-schema-version";
/// `bq-source-lang`: `meta.lang`.
pub const SOURCE_LANG: &str = "bq-source-lang";
/// `bq-attempts`: `attempts` in decimal, the authoritative counter on consume.
pub const ATTEMPTS: &str = "bq-attempts";

/// The dead-letter topic suffix: `<topic>.dlq`.
pub const DEAD_LETTER_SUFFIX: &str = ".dlq";

/// The default consumer group of the family's Kafka transports.
pub const DEFAULT_GROUP: &str = "babelqueue";

fn push(out: &mut Vec<(&'static str, String)>, name: &'static str, value: &str) {
    if !value.is_empty() {
        out.push((name, value.to_owned()));
    }
}

/// The record headers of an envelope (UTF-8 strings, in the table's order; an empty
/// string value is left out).
///
/// ```
/// use babelqueue_core::binding::kafka;
/// use babelqueue_core::Envelope;
///
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// let names: Vec<_> = kafka::headers(&env).into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["bq-job", "bq-trace-id", "bq-message-id",
///                    "bq-schema-version", "bq-source-lang", "bq-attempts"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn headers(env: &Envelope) -> Vec<(&'static str, String)> {
    let mut out = Vec::with_capacity(6);
    push(&mut out, JOB, &env.job);
    push(&mut out, TRACE_ID, &env.trace_id);
    push(&mut out, MESSAGE_ID, &env.meta.id);
    out.push((SCHEMA_VERSION, env.meta.schema_version.to_string()));
    push(&mut out, SOURCE_LANG, &env.meta.lang);
    out.push((ATTEMPTS, env.attempts.to_string()));
    out
}

/// The record timestamp: `meta.created_at` (Unix ms), or `None` when it is 0 or negative
/// (absent from the body; the Python SDK then sets none and the client uses the current
/// time).
///
/// ```
/// use babelqueue_core::binding::kafka;
/// use babelqueue_core::Envelope;
///
/// let mut env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// env.meta.created_at = 1749132727000;
/// assert_eq!(kafka::timestamp_ms(&env), Some(1749132727000));
/// env.meta.created_at = 0;
/// assert_eq!(kafka::timestamp_ms(&env), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn timestamp_ms(env: &Envelope) -> Option<i64> {
    (env.meta.created_at > 0).then_some(env.meta.created_at)
}

/// A record's projection from a body: its headers and timestamp.
///
/// ```
/// use babelqueue_core::binding::kafka::Record;
/// let r = Record { headers: vec![("bq-job", "urn:x".into())], timestamp_ms: None };
/// assert_eq!(r.headers.len(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The `bq-*` headers.
    pub headers: Vec<(&'static str, String)>,
    /// The record timestamp (Unix ms), when `meta.created_at` is a positive integer.
    pub timestamp_ms: Option<i64>,
}

/// Lenient: the headers and timestamp of a body that is an envelope without the full
/// acceptance check (a JSON object with a non-empty string `job`, else `urn`); `None` for
/// anything else (a poison record is written without a projection).
///
/// Strings are taken when they are non-empty (a numeric `meta.id` or `meta.lang` in decimal); numbers
/// when they are integers; `attempts` absent or null counts as 0 (the Python SDK's rule),
/// and a non-integer `attempts` leaves `bq-attempts` out.
///
/// ```
/// use babelqueue_core::binding::kafka;
/// let r = kafka::project_body(br#"{"job":"urn:x","meta":{"created_at":7},"attempts":"x"}"#).unwrap();
/// assert_eq!(r.headers, vec![("bq-job", "urn:x".to_string())]);
/// assert_eq!(r.timestamp_ms, Some(7));
/// assert_eq!(kafka::project_body(b"{}"), None);
/// ```
pub fn project_body(body: &[u8]) -> Option<Record> {
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
    Some(Record {
        headers: out,
        timestamp_ms: l.meta_int("created_at").filter(|ms| *ms > 0),
    })
}

/// Kafka's attempts rule: the `bq-attempts` header is **authoritative** (it overrides the
/// body, lower or higher); the body's `attempts` only when the header is absent.
///
/// A header that is not a count (not UTF-8, not a decimal integer after trimming ASCII
/// whitespace, or negative) is treated as absent and the body's count stands, as in the
/// Python SDK (whose `int()` fails and leaves the body). A valid count beyond `u32`
/// saturates at `u32::MAX` (it is past any `max_attempts`).
///
/// ```
/// use babelqueue_core::binding::kafka::reconcile_attempts;
/// assert_eq!(reconcile_attempts(0, Some(b"2")), 2);
/// assert_eq!(reconcile_attempts(5, Some(b"1")), 1); // not a max
/// assert_eq!(reconcile_attempts(3, None), 3);
/// assert_eq!(reconcile_attempts(3, Some(b"three")), 3);
/// assert_eq!(reconcile_attempts(3, Some(b"-1")), 3);
/// ```
pub fn reconcile_attempts(body: u32, header: Option<&[u8]>) -> u32 {
    header
        .and_then(header_attempts)
        .map_or(body, |h| u32::try_from(h).unwrap_or(u32::MAX))
}

/// The `bq-attempts` header value as a count: `None` when it is not one (see
/// [`reconcile_attempts`]).
///
/// ```
/// use babelqueue_core::binding::kafka::header_attempts;
/// assert_eq!(header_attempts(b" 4 "), Some(4));
/// assert_eq!(header_attempts(b"\xff"), None);
/// ```
pub fn header_attempts(value: &[u8]) -> Option<u128> {
    let text = std::str::from_utf8(value).ok()?;
    match crate::binding::sqs::parse_count(text)? {
        n if n < 0 => None,
        n => Some(n.unsigned_abs()),
    }
}

/// The dead-letter topic of `topic`: `<topic>.dlq`.
///
/// ```
/// assert_eq!(babelqueue_core::binding::kafka::dead_letter_topic("orders"), "orders.dlq");
/// ```
pub fn dead_letter_topic(topic: &str) -> String {
    format!("{topic}{DEAD_LETTER_SUFFIX}")
}

pub mod retry {
    //! Delayed delivery and retries over tier topics, as the Python SDK's `kafka_retry` and
    //! `KafkaTransport` (ADR-0034) do it, as pure functions.
    //!
    //! * A transport configured with tiers (milliseconds, positive, strictly ascending; the
    //!   recommended ones are [`DEFAULT_TIERS_MS`]) parks a delayed message on the smallest
    //!   tier covering the delay ([`Tiers::for_delay`]), and a retry on tier
    //!   `n = min(attempts_before, N − 1) + 1` ([`Tiers::for_retry`]), on the topic
    //!   `<work_topic>.retry.<n>` ([`retry_topic`], `n` 1-based).
    //! * A parked record carries the projected headers (with `bq-attempts` = the new count
    //!   on a retry) plus `bq-delay` (the requested delay, or the tier's on a retry) and
    //!   `bq-original-topic` (the work topic) ([`tier_headers`]).
    //! * The re-inject consumer moves a record back to the topic named by
    //!   `bq-original-topic` (else the work topic read off the tier topic's name,
    //!   [`reinject_target`]) once `record timestamp + tier delay`, clamped to
    //!   `[now, now + tier delay]`, has passed ([`target_time`]), with the value and key byte
    //!   for byte and every header but `bq-delay` and `bq-original-topic`
    //!   ([`reinject_headers`]).
    //!
    //! ```
    //! use babelqueue_core::binding::kafka::retry::{self, Tiers};
    //!
    //! let tiers = Tiers::new(retry::DEFAULT_TIERS_MS.to_vec())?;
    //! assert_eq!(tiers.for_retry(0), (1, 5_000));
    //! assert_eq!(tiers.for_retry(9), (4, 1_800_000));
    //! assert_eq!(tiers.for_delay(6_000), Some((2, 30_000)));
    //! assert_eq!(retry::retry_topic("payments", 2), "payments.retry.2");
    //! assert_eq!(retry::parse_retry_topic("payments.retry.2"), Some(("payments", 2)));
    //! # Ok::<(), retry::TiersError>(())
    //! ```

    /// `bq-delay`: the delay (ms) a parked record was given.
    pub const DELAY_HEADER: &str = "bq-delay";
    /// `bq-original-topic`: the work topic a parked record returns to.
    pub const ORIGINAL_TOPIC_HEADER: &str = "bq-original-topic";
    /// The recommended tiers (ms): 5 s, 30 s, 5 min, 30 min.
    pub const DEFAULT_TIERS_MS: [u64; 4] = [5_000, 30_000, 300_000, 1_800_000];
    /// The re-inject consumer's default group.
    pub const REINJECT_GROUP: &str = "babelqueue-retry-reinject";

    /// The tier topic `n` (1-based) of `work_topic`: `<work_topic>.retry.<n>`.
    ///
    /// ```
    /// assert_eq!(babelqueue_core::binding::kafka::retry::retry_topic("t", 1), "t.retry.1");
    /// ```
    pub fn retry_topic(work_topic: &str, n: usize) -> String {
        format!("{work_topic}.retry.{n}")
    }

    /// Splits a tier topic into its work topic and tier number (`^(.+)\.retry\.([0-9]+)$`);
    /// `None` when `topic` is not one (or the number does not fit a `usize`).
    ///
    /// ```
    /// use babelqueue_core::binding::kafka::retry::parse_retry_topic;
    /// assert_eq!(parse_retry_topic("a.retry.b.retry.3"), Some(("a.retry.b", 3)));
    /// assert_eq!(parse_retry_topic(".retry.3"), None);
    /// assert_eq!(parse_retry_topic("a.retry."), None);
    /// ```
    pub fn parse_retry_topic(topic: &str) -> Option<(&str, usize)> {
        let at = topic.rfind(".retry.")?;
        let (work, digits) = (&topic[..at], &topic[at + ".retry.".len()..]);
        if work.is_empty() || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some((work, digits.parse().ok()?))
    }

    /// Why a tier list is refused.
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    pub enum TiersError {
        /// No tiers at all (delayed delivery and retries then have nowhere to go).
        #[error("kafka retry tiers: none configured (e.g. DEFAULT_TIERS_MS)")]
        Empty,
        /// A tier of 0 ms.
        #[error("kafka retry tiers must be positive milliseconds, got 0 at position {0}")]
        Zero(usize),
        /// Tiers not strictly ascending.
        #[error("kafka retry tiers must be strictly ascending, got {0:?}")]
        NotAscending(Vec<u64>),
    }

    /// A validated list of tiers (ms): positive and strictly ascending, at least one.
    ///
    /// ```
    /// use babelqueue_core::binding::kafka::retry::{Tiers, TiersError};
    /// assert!(Tiers::new(vec![1000, 500]).is_err());
    /// assert_eq!(Tiers::new(vec![]), Err(TiersError::Empty));
    /// assert_eq!(Tiers::new(vec![100, 200])?.len(), 2);
    /// # Ok::<(), TiersError>(())
    /// ```
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Tiers(Vec<u64>);

    impl Tiers {
        /// Validates `tiers_ms`.
        ///
        /// ```
        /// use babelqueue_core::binding::kafka::retry::Tiers;
        /// assert!(Tiers::new(vec![0, 5]).is_err());
        /// ```
        pub fn new(tiers_ms: Vec<u64>) -> Result<Self, TiersError> {
            if tiers_ms.is_empty() {
                return Err(TiersError::Empty);
            }
            if let Some(i) = tiers_ms.iter().position(|t| *t == 0) {
                return Err(TiersError::Zero(i));
            }
            if tiers_ms.windows(2).any(|w| w[1] <= w[0]) {
                return Err(TiersError::NotAscending(tiers_ms));
            }
            Ok(Tiers(tiers_ms))
        }

        /// The tiers (ms).
        ///
        /// ```
        /// use babelqueue_core::binding::kafka::retry::Tiers;
        /// assert_eq!(Tiers::new(vec![7])?.as_slice(), &[7]);
        /// # Ok::<(), babelqueue_core::binding::kafka::retry::TiersError>(())
        /// ```
        pub fn as_slice(&self) -> &[u64] {
            &self.0
        }

        /// How many tiers.
        ///
        /// ```
        /// use babelqueue_core::binding::kafka::retry::Tiers;
        /// assert_eq!(Tiers::new(vec![7])?.len(), 1);
        /// # Ok::<(), babelqueue_core::binding::kafka::retry::TiersError>(())
        /// ```
        #[allow(clippy::len_without_is_empty)] // never empty
        pub fn len(&self) -> usize {
            self.0.len()
        }

        /// The delay (ms) of tier `n` (1-based), `None` outside `1..=len`.
        ///
        /// ```
        /// use babelqueue_core::binding::kafka::retry::Tiers;
        /// let t = Tiers::new(vec![5, 9])?;
        /// assert_eq!((t.tier_ms(2), t.tier_ms(0), t.tier_ms(3)), (Some(9), None, None));
        /// # Ok::<(), babelqueue_core::binding::kafka::retry::TiersError>(())
        /// ```
        pub fn tier_ms(&self, n: usize) -> Option<u64> {
            n.checked_sub(1).and_then(|i| self.0.get(i)).copied()
        }

        /// The tier (`n`, its ms) a message delayed by `delay_ms` is parked on: the smallest
        /// whose delay is at least `delay_ms`; `None` when the delay exceeds the largest
        /// tier (the Python SDK refuses it rather than clamp).
        ///
        /// ```
        /// use babelqueue_core::binding::kafka::retry::Tiers;
        /// let t = Tiers::new(vec![5, 9])?;
        /// assert_eq!(t.for_delay(0), Some((1, 5)));
        /// assert_eq!(t.for_delay(9), Some((2, 9)));
        /// assert_eq!(t.for_delay(10), None);
        /// # Ok::<(), babelqueue_core::binding::kafka::retry::TiersError>(())
        /// ```
        pub fn for_delay(&self, delay_ms: u64) -> Option<(usize, u64)> {
            self.0
                .iter()
                .position(|t| *t >= delay_ms)
                .map(|i| (i + 1, self.0[i]))
        }

        /// The tier (`n`, its ms) a retry is parked on: `n = min(attempts_before, N − 1) + 1`
        /// (it stays on the last tier once they run out). The runtime's backoff is not used.
        ///
        /// ```
        /// use babelqueue_core::binding::kafka::retry::Tiers;
        /// let t = Tiers::new(vec![5, 9])?;
        /// assert_eq!([t.for_retry(0), t.for_retry(1), t.for_retry(u32::MAX)], [(1, 5), (2, 9), (2, 9)]);
        /// # Ok::<(), babelqueue_core::binding::kafka::retry::TiersError>(())
        /// ```
        pub fn for_retry(&self, attempts_before: u32) -> (usize, u64) {
            let last = self.0.len() - 1;
            let i = usize::try_from(attempts_before).map_or(last, |a| a.min(last));
            (i + 1, self.0[i])
        }

        /// The tier delay (ms) of a tier topic, `None` when `topic` is not one of these tiers.
        ///
        /// ```
        /// use babelqueue_core::binding::kafka::retry::Tiers;
        /// let t = Tiers::new(vec![5, 9])?;
        /// assert_eq!(t.tier_ms_of_topic("orders.retry.2"), Some(9));
        /// assert_eq!(t.tier_ms_of_topic("orders.retry.3"), None);
        /// # Ok::<(), babelqueue_core::binding::kafka::retry::TiersError>(())
        /// ```
        pub fn tier_ms_of_topic(&self, topic: &str) -> Option<u64> {
            parse_retry_topic(topic).and_then(|(_, n)| self.tier_ms(n))
        }

        /// Every tier topic of `work_topics`, in order (what the re-inject consumer reads).
        ///
        /// ```
        /// use babelqueue_core::binding::kafka::retry::Tiers;
        /// let t = Tiers::new(vec![5, 9])?;
        /// assert_eq!(t.topics(&["a"]), ["a.retry.1", "a.retry.2"]);
        /// # Ok::<(), babelqueue_core::binding::kafka::retry::TiersError>(())
        /// ```
        pub fn topics(&self, work_topics: &[&str]) -> Vec<String> {
            work_topics
                .iter()
                .flat_map(|w| (1..=self.0.len()).map(move |n| retry_topic(w, n)))
                .collect()
        }
    }

    /// The headers of a record parked on a tier: `projected` (the record's `bq-*` headers)
    /// without any `bq-delay` / `bq-original-topic`, with `bq-attempts` replaced when
    /// `attempts` is given (a retry carries the new count), then `bq-delay` = `delay_ms` and
    /// `bq-original-topic` = `work_topic`.
    ///
    /// ```
    /// use babelqueue_core::binding::kafka::retry::tier_headers;
    /// let h = tier_headers(vec![("bq-attempts".into(), "0".into())], "orders", 5000, Some(1));
    /// assert_eq!(h, [
    ///     ("bq-attempts".to_string(), "1".to_string()),
    ///     ("bq-delay".into(), "5000".into()),
    ///     ("bq-original-topic".into(), "orders".into()),
    /// ]);
    /// ```
    pub fn tier_headers(
        projected: Vec<(String, String)>,
        work_topic: &str,
        delay_ms: u64,
        attempts: Option<u32>,
    ) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = projected
            .into_iter()
            .filter(|(k, _)| k != DELAY_HEADER && k != ORIGINAL_TOPIC_HEADER)
            .filter(|(k, _)| attempts.is_none() || k != super::ATTEMPTS)
            .collect();
        if let Some(a) = attempts {
            out.push((super::ATTEMPTS.to_owned(), a.to_string()));
        }
        out.push((DELAY_HEADER.to_owned(), delay_ms.to_string()));
        out.push((ORIGINAL_TOPIC_HEADER.to_owned(), work_topic.to_owned()));
        out
    }

    /// The headers a re-injected record keeps: all but `bq-delay` and `bq-original-topic`,
    /// in order, values untouched.
    ///
    /// ```
    /// use babelqueue_core::binding::kafka::retry::reinject_headers;
    /// let kept = reinject_headers(vec![("bq-delay", &b"5"[..]), ("traceparent", b"00")]);
    /// assert_eq!(kept, [("traceparent", &b"00"[..])]);
    /// ```
    pub fn reinject_headers<K: AsRef<str>, V>(headers: Vec<(K, V)>) -> Vec<(K, V)> {
        headers
            .into_iter()
            .filter(|(k, _)| {
                let k = k.as_ref();
                k != DELAY_HEADER && k != ORIGINAL_TOPIC_HEADER
            })
            .collect()
    }

    /// The topic a parked record returns to: its `bq-original-topic` header when non-empty
    /// (an invalid UTF-8 value is read lossily, as the Python SDK does), else the work topic
    /// of the tier topic's name, else the topic itself (never strand a record).
    ///
    /// ```
    /// use babelqueue_core::binding::kafka::retry::reinject_target;
    /// assert_eq!(reinject_target("a.retry.1", Some(b"b")), "b");
    /// assert_eq!(reinject_target("a.retry.1", None), "a");
    /// assert_eq!(reinject_target("odd", Some(b"")), "odd");
    /// ```
    pub fn reinject_target(tier_topic: &str, original_topic: Option<&[u8]>) -> String {
        match original_topic.filter(|v| !v.is_empty()) {
            Some(v) => String::from_utf8_lossy(v).into_owned(),
            None => parse_retry_topic(tier_topic)
                .map_or(tier_topic, |(work, _)| work)
                .to_owned(),
        }
    }

    /// When (Unix ms) a parked record is due: `record_ms + tier_ms` clamped to
    /// `[now_ms, now_ms + tier_ms]` (a producer clock ahead cannot park it longer than one
    /// tier, one behind cannot release it early); a record with no usable timestamp (`None`
    /// or negative) is due one full tier from now. Saturating, never overflows.
    ///
    /// ```
    /// use babelqueue_core::binding::kafka::retry::target_time;
    /// assert_eq!(target_time(Some(1_000), 500, 1_200), 1_500);
    /// assert_eq!(target_time(Some(0), 500, 1_200), 1_200);      // long overdue: now
    /// assert_eq!(target_time(Some(9_000), 500, 1_200), 1_700);  // clock ahead: one tier
    /// assert_eq!(target_time(None, 500, 1_200), 1_700);
    /// ```
    pub fn target_time(record_ms: Option<i64>, tier_ms: u64, now_ms: i64) -> i64 {
        let tier = i64::try_from(tier_ms).unwrap_or(i64::MAX);
        let latest = now_ms.saturating_add(tier);
        match record_ms.filter(|ms| *ms >= 0) {
            None => latest,
            Some(ms) => ms.saturating_add(tier).clamp(now_ms.min(latest), latest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::retry::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn headers_and_project_body_agree() {
        let mut e = Envelope::new("urn:babel:a", json!({"x": 1})).unwrap();
        e.attempts = 4;
        e.meta.created_at = 1_749_132_727_000;
        let r = project_body(&e.encode()).unwrap();
        assert_eq!(r.headers, headers(&e));
        assert_eq!(r.timestamp_ms, timestamp_ms(&e));
        assert_eq!(r.timestamp_ms, Some(1_749_132_727_000));
    }

    #[test]
    fn empty_id_is_left_out_and_big_attempts_kept() {
        let mut e = Envelope::new("urn:babel:a", json!({})).unwrap();
        e.meta.id.clear();
        e.attempts = u32::MAX;
        let h = headers(&e);
        assert!(!h.iter().any(|(k, _)| *k == MESSAGE_ID));
        assert_eq!(h.last().unwrap().1, u32::MAX.to_string());
        e.meta.created_at = -5;
        assert_eq!(timestamp_ms(&e), None);
    }

    #[test]
    fn reconcile_garbage_and_overflow() {
        assert_eq!(reconcile_attempts(2, Some(b"")), 2);
        assert_eq!(reconcile_attempts(2, Some(b"  ")), 2);
        assert_eq!(reconcile_attempts(2, Some(b"1e3")), 2);
        assert_eq!(reconcile_attempts(2, Some(b"\xff\xfe")), 2);
        assert_eq!(reconcile_attempts(2, Some(b"+0")), 0);
        assert_eq!(reconcile_attempts(2, Some(b"-0")), 0);
        assert_eq!(reconcile_attempts(2, Some(b"4294967296")), u32::MAX);
        assert_eq!(reconcile_attempts(2, Some(&[b'9'; 80])), u32::MAX);
        assert_eq!(reconcile_attempts(2, Some(b"-99")), 2);
    }

    #[test]
    fn tiers_validation() {
        assert_eq!(
            Tiers::new(vec![5, 5]),
            Err(TiersError::NotAscending(vec![5, 5]))
        );
        assert_eq!(Tiers::new(vec![5, 0]), Err(TiersError::Zero(1)));
        let t = Tiers::new(vec![u64::MAX]).unwrap();
        assert_eq!(t.for_delay(u64::MAX), Some((1, u64::MAX)));
        assert_eq!(t.for_retry(3), (1, u64::MAX));
        assert_eq!(target_time(Some(i64::MAX), u64::MAX, i64::MAX), i64::MAX);
        assert_eq!(target_time(Some(-1), 10, 100), 110);
        assert_eq!(target_time(Some(50), 10, i64::MIN), i64::MIN + 10);
    }

    #[test]
    fn retry_topic_roundtrip() {
        for (w, n) in [("a", 1), ("a.b", 12), ("x.retry.1", 3)] {
            assert_eq!(parse_retry_topic(&retry_topic(w, n)), Some((w, n)));
        }
        assert_eq!(parse_retry_topic("a.retry.-1"), None);
        assert_eq!(parse_retry_topic("a.retry.99999999999999999999999"), None);
        assert_eq!(parse_retry_topic("a.dlq"), None);
    }

    #[test]
    fn tier_headers_strip_old_tier_headers() {
        let h = tier_headers(
            vec![
                ("bq-job".into(), "u".into()),
                ("bq-delay".into(), "1".into()),
                ("bq-original-topic".into(), "x".into()),
                ("bq-attempts".into(), "0".into()),
            ],
            "w",
            30,
            None,
        );
        assert_eq!(
            h,
            [
                ("bq-job".to_string(), "u".to_string()),
                ("bq-attempts".into(), "0".into()),
                ("bq-delay".into(), "30".into()),
                ("bq-original-topic".into(), "w".into()),
            ]
        );
    }
}
