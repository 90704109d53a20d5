//! Property tests of the envelope codec: any envelope round-trips through its canonical
//! encoding, and decoding arbitrary bytes never panics.

use babelqueue::{DeadLetter, DeadLetterReason, Envelope, Meta};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(|f| Value::Number(Number::from_f64(f).expect("finite"))),
        any::<String>().prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((any::<String>(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn object(keys: impl Strategy<Value = String>) -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((keys, json_value()), 0..6).prop_map(|kv| kv.into_iter().collect())
}

fn non_empty() -> impl Strategy<Value = String> {
    any::<String>().prop_filter("non-empty", |s| !s.is_empty())
}

fn dead_letter() -> impl Strategy<Value = DeadLetter> {
    (
        prop_oneof![
            Just(DeadLetterReason::Failed),
            Just(DeadLetterReason::UnknownUrn),
            Just(DeadLetterReason::Poison),
        ],
        proptest::option::of(any::<String>()),
        proptest::option::of(any::<String>()),
        any::<i64>(),
        any::<String>(),
        any::<u32>(),
        any::<String>(),
    )
        .prop_map(
            |(reason, error, exception, failed_at, original_queue, attempts, lang)| DeadLetter {
                reason,
                error,
                exception,
                failed_at,
                original_queue,
                attempts,
                lang,
            },
        )
}

prop_compose! {
    fn envelope()(
        job in non_empty(),
        trace_id in non_empty(),
        data in object(any::<String>()),
        id in any::<String>(),
        queue in any::<String>(),
        lang in any::<String>(),
        created_at in any::<i64>(),
        meta_extra in object("x_[a-z]{1,8}"),
        attempts in any::<u32>(),
        dead_letter in proptest::option::of(dead_letter()),
        extra in object("x_[a-z]{1,8}"),
    ) -> Envelope {
        Envelope {
            job,
            trace_id,
            data: data.into(),
            meta: Meta { id, queue, lang, schema_version: 1, created_at, extra: meta_extra },
            attempts,
            dead_letter,
            extra,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_envelope_round_trips(env in envelope()) {
        let bytes = env.encode();
        let back = Envelope::decode(&bytes);
        prop_assert_eq!(back.as_ref(), Ok(&env));
        // Canonical: encoding the decoded envelope gives the same bytes again.
        prop_assert_eq!(back.unwrap().encode(), bytes);
    }

    #[test]
    fn encoding_is_compact_and_unescaped(env in envelope(), text in "[^\\\\\"\\x00-\\x1f\\x7f]{1,40}") {
        // Strings without quotes, backslashes or control characters (non-ASCII and '/'
        // included) are written verbatim: no \uXXXX, no \/.
        let mut env = env;
        env.data.insert("probe".into(), Value::String(text.clone()));
        let encoded = env.encode_string();
        prop_assert!(encoded.starts_with(r#"{"job":"#), "does not start with job: {}", encoded);
        let probe = format!(r#""probe":"{text}""#);
        prop_assert!(encoded.contains(&probe), "{} not verbatim in {}", probe, encoded);
        prop_assert!(!encoded.contains("\n  "), "not compact: {}", encoded);
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = Envelope::decode(&bytes);
    }

    #[test]
    fn decoding_arbitrary_json_never_panics(value in json_value()) {
        let bytes = serde_json::to_vec(&value).expect("a Value always serializes");
        let accepted = Envelope::decode(&bytes).is_ok();
        prop_assert_eq!(accepted, Envelope::accepts(&bytes));
    }

    #[test]
    fn mutated_envelopes_never_panic(env in envelope(), cut in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = env.encode();
        let i = cut.index(bytes.len());
        bytes[i] = byte;
        let _ = Envelope::decode(&bytes);
        bytes.truncate(i);
        let _ = Envelope::decode(&bytes);
    }
}

/// Found by the `envelope` fuzz target: a `meta.created_at` that is not an i64 (beyond its
/// range, or a float) is read as absent, like the other optional `meta` fields, and an
/// encoding writes `created_at` once (it was kept in `meta.extra` and written twice).
#[test]
fn a_created_at_beyond_i64_is_read_as_absent_and_written_once() {
    for raw in ["1749132727049132727000", "1.7e12", "\"yesterday\""] {
        let body = format!(
            r#"{{"job":"urn:x","trace_id":"t","data":{{}},"meta":{{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":{raw}}},"attempts":0}}"#
        );
        let env = Envelope::decode(body.as_bytes()).expect("accepted");
        assert_eq!(env.meta.created_at, 0, "{raw}");
        assert!(!env.meta.extra.contains_key("created_at"), "{raw}");
        let bytes = env.encode();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert_eq!(text.matches("\"created_at\"").count(), 1, "{text}");
        let again = Envelope::decode(&bytes).expect("re-encoded is accepted");
        assert_eq!(again, env);
        assert_eq!(again.encode(), bytes, "the encoding is stable");
    }
}
