//! GDPR field encryption (`babelqueue_core::gdpr`): the path walk, protect and unprotect,
//! the reference AES-256-GCM cipher, and the interop with the upstream Python SDK.
//!
//! `cargo test -p babelqueue-core --features gdpr --test gdpr`; the Python interop test is
//! `-- --ignored`, with `BABELQUEUE_PYTHON` (a Python with `babelqueue[redis]==1.24.0` and
//! `cryptography`) and `BABELQUEUE_REDIS_URL` (default `redis://127.0.0.1:6379/0`).

use std::collections::BTreeSet;

use babelqueue_core::Envelope;
use babelqueue_core::gdpr::{
    self, AesGcmCipher, Cipher, CipherError, DecryptErrorKind, SensitivePath, canonical_json,
    sensitive_paths,
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

const KEY: [u8; 32] = *b"0123456789abcdef0123456789abcdef";
const OTHER_KEY: [u8; 32] = *b"fedcba9876543210fedcba9876543210";

fn aes(key: &[u8; 32]) -> AesGcmCipher {
    AesGcmCipher::new(key).expect("a 32-byte key")
}

/// Not a cipher: the token shows the plaintext it was given (`v:` + the bytes), so a test
/// sees the exact bytes `protect` seals.
struct Visible;

impl Cipher for Visible {
    fn encrypt(&self, plaintext: &[u8]) -> Result<String, CipherError> {
        let text =
            std::str::from_utf8(plaintext).map_err(|e| CipherError::with_source("utf-8", e))?;
        Ok(format!("v:{text}"))
    }

    fn decrypt(&self, token: &str) -> Result<Vec<u8>, CipherError> {
        token
            .strip_prefix("v:")
            .map(|t| t.as_bytes().to_vec())
            .ok_or_else(|| CipherError::new("not a visible token"))
    }
}

/// A cipher whose `encrypt` fails on the n-th call.
struct FailsAt(std::sync::atomic::AtomicUsize);

impl Cipher for FailsAt {
    fn encrypt(&self, plaintext: &[u8]) -> Result<String, CipherError> {
        if self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            return Err(CipherError::new("the KMS is down"));
        }
        Visible.encrypt(plaintext)
    }

    fn decrypt(&self, token: &str) -> Result<Vec<u8>, CipherError> {
        Visible.decrypt(token)
    }
}

fn obj(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn paths(list: &[&str]) -> Vec<SensitivePath> {
    list.iter().map(|p| SensitivePath::new(*p)).collect()
}

fn path_names(schema: &Value) -> Vec<(String, Option<String>)> {
    sensitive_paths(schema)
        .into_iter()
        .map(|p| (p.path, p.category))
        .collect()
}

fn payment_schema() -> Value {
    serde_json::from_str(include_str!("gdpr_payment_schema.json")).expect("the schema is JSON")
}

// ---------------------------------------------------------------------------------------
// sensitive_paths

#[test]
fn sensitive_paths_through_properties_and_items_sorted() {
    let schema = json!({
        "type": "object",
        "properties": {
            "profile": {"type": "object", "properties": {
                "full_name": {"type": "string", "x-gdpr-sensitive": "identity"},
                "age": {"type": "integer"}
            }},
            "email": {"type": "string", "x-gdpr-sensitive": true},
            "addresses": {"type": "array", "items": {"properties": {
                "line": {"x-gdpr-sensitive": true},
                "geo": {"properties": {"lat": {"x-gdpr-sensitive": "location"}}}
            }}},
            "card": {"x-gdpr-sensitive": "payment", "properties": {"number": {"type": "string"}}},
            "amount": {"type": "integer"}
        }
    });
    assert_eq!(
        path_names(&schema),
        [
            (
                "addresses[].geo.lat".to_owned(),
                Some("location".to_owned())
            ),
            ("addresses[].line".to_owned(), None),
            ("card".to_owned(), Some("payment".to_owned())),
            ("email".to_owned(), None),
            ("profile.full_name".to_owned(), Some("identity".to_owned())),
        ]
    );
    assert_eq!(
        path_names(&payment_schema())
            .into_iter()
            .map(|p| p.0)
            .collect::<Vec<_>>(),
        ["addresses[].line", "card.number", "email"]
    );
}

#[test]
fn only_true_and_non_empty_strings_mark() {
    for (mark, marked) in [
        (json!(true), true),
        (json!("contact"), true),
        (json!(" "), true),
        (json!(false), false),
        (json!(""), false),
        (json!(1), false),
        (json!(0), false),
        (json!(null), false),
        (json!(["contact"]), false),
        (json!({"category": "contact"}), false),
        (json!("true"), true),
    ] {
        let schema = json!({"properties": {"f": {"x-gdpr-sensitive": mark}}});
        assert_eq!(!sensitive_paths(&schema).is_empty(), marked, "{mark}");
    }
}

#[test]
fn root_marks_nested_items_and_odd_shapes() {
    // A root mark is the path "" and sorts first.
    assert_eq!(
        path_names(
            &json!({"x-gdpr-sensitive": true, "properties": {"a": {"x-gdpr-sensitive": true}}})
        ),
        [("".to_owned(), None), ("a".to_owned(), None)]
    );
    // Items of items: `[]` twice; items at the root: `[]`.
    assert_eq!(
        path_names(&json!({"properties": {"m": {"items": {"items": {"x-gdpr-sensitive": true}}}}})),
        [("m[][]".to_owned(), None)]
    );
    assert_eq!(
        path_names(&json!({"items": {"properties": {"a": {"x-gdpr-sensitive": true}}}})),
        [("[].a".to_owned(), None)]
    );
    // Not descended: a tuple `items`, `allOf`, `definitions`, non-object nodes.
    assert!(
        sensitive_paths(&json!({
            "items": [{"x-gdpr-sensitive": true}],
            "allOf": [{"properties": {"a": {"x-gdpr-sensitive": true}}}],
            "definitions": {"d": {"x-gdpr-sensitive": true}},
            "properties": {"b": true, "c": [{"x-gdpr-sensitive": true}]}
        }))
        .is_empty()
    );
    for not_a_schema in [
        json!(null),
        json!(true),
        json!("x"),
        json!([{"x-gdpr-sensitive": true}]),
    ] {
        assert!(sensitive_paths(&not_a_schema).is_empty());
    }
    // `properties` that is not an object is ignored.
    assert!(sensitive_paths(&json!({"properties": [1, 2]})).is_empty());
}

#[test]
fn one_path_marked_twice_keeps_both_in_schema_order() {
    // A property named "a.b" and a property "b" inside "a" are the same path.
    let schema = json!({"properties": {
        "a.b": {"x-gdpr-sensitive": "first"},
        "a": {"properties": {"b": {"x-gdpr-sensitive": "second"}}}
    }});
    assert_eq!(
        path_names(&schema),
        [
            ("a.b".to_owned(), Some("first".to_owned())),
            ("a.b".to_owned(), Some("second".to_owned())),
        ]
    );
}

// ---------------------------------------------------------------------------------------
// protect / unprotect: the walk

#[test]
fn protect_seals_leaves_containers_and_array_elements() {
    let mut data = obj(json!({
        "email": "alice@example.com",
        "profile": {"full_name": "Alice Liddell", "age": 7},
        "card": {"number": "4111", "exp": "12/30"},
        "addresses": [{"line": "1 Main St", "city": "Oslo"}, {"city": "Bergen"}, "not an object", {"line": null}],
        "history": [1, 2, {"x": "é"}],
        "amount": 4200
    }));
    let original = data.clone();
    let marked = paths(&[
        "addresses[].line",
        "card",
        "email",
        "history",
        "profile.full_name",
    ]);
    assert_eq!(gdpr::protect(&mut data, &marked, &Visible).unwrap(), 6);
    assert_eq!(
        Value::Object(data.clone()),
        json!({
            "email": "v:\"alice@example.com\"",
            "profile": {"full_name": "v:\"Alice Liddell\"", "age": 7},
            "card": "v:{\"exp\":\"12/30\",\"number\":\"4111\"}",
            "addresses": [{"line": "v:\"1 Main St\"", "city": "Oslo"}, {"city": "Bergen"}, "not an object", {"line": "v:null"}],
            "history": "v:[1,2,{\"x\":\"\\u00e9\"}]",
            "amount": 4200
        })
    );
    // Key order is kept.
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        original.keys().collect::<Vec<_>>()
    );
    assert_eq!(gdpr::unprotect(&mut data, &marked, &Visible).unwrap(), 6);
    assert_eq!(data, original);
}

#[test]
fn absent_paths_and_shape_mismatches_are_skipped() {
    let data = obj(json!({
        "email": {"nested": "object where a leaf was expected is still sealed whole"},
        "profile": "a string where an object is expected",
        "addresses": {"line": "an object where an array is expected"},
        "tags": "a string where an array is expected",
        "list": [["nested"], 3, null],
        "amount": 1
    }));
    let marked = paths(&[
        "",
        "absent",
        "absent.deeper",
        "absent[].line",
        "profile.full_name",
        "addresses[].line",
        "tags[]",
        "list[].x",
        "amount.value",
        "email.nested.deeper",
    ]);
    let mut got = data.clone();
    assert_eq!(gdpr::protect(&mut got, &marked, &Visible).unwrap(), 0);
    assert_eq!(got, data);
    assert_eq!(gdpr::unprotect(&mut got, &marked, &Visible).unwrap(), 0);
    assert_eq!(got, data);
    // An empty data, and no paths.
    let mut empty = Map::new();
    assert_eq!(gdpr::protect(&mut empty, &marked, &Visible).unwrap(), 0);
    let mut got = data.clone();
    assert_eq!(gdpr::protect(&mut got, &[], &Visible).unwrap(), 0);
    assert_eq!(got, data);
}

#[test]
fn arrays_of_arrays_are_as_python_reads_them() {
    // `m[][]` is the array step of the key "m[]" (as the Python and Go SDKs split it).
    let marked = paths(&["m[][]"]);
    let mut data = obj(json!({"m": [["a"]], "m[]": ["b", 1]}));
    assert_eq!(gdpr::protect(&mut data, &marked, &Visible).unwrap(), 2);
    assert_eq!(
        Value::Object(data),
        json!({"m": [["a"]], "m[]": ["v:\"b\"", "v:1"]})
    );
}

#[test]
fn the_sealed_bytes_are_the_python_sdks() {
    // Each line: `json.dumps(value, sort_keys=True, separators=(",", ":"))` in Python 3.
    let cases = [
        (
            json!({"name": "Zoë Ørsted", "n": [1, 2.5, -0.0, 1e16, 1e-05, 123456789], "nested": {"z": null, "a": true, "é": "\u{2028}"}}),
            r#"{"n":[1,2.5,-0.0,1e+16,1e-05,123456789],"name":"Zo\u00eb \u00d8rsted","nested":{"a":true,"z":null,"\u00e9":"\u2028"}}"#,
        ),
        (json!("alice@example.com"), r#""alice@example.com""#),
        (json!(4111111111111111u64), "4111111111111111"),
        (json!([{"line": "1 Main St"}]), r#"[{"line":"1 Main St"}]"#),
        (json!(0.1), "0.1"),
        (json!("😀\u{0}"), r#""\ud83d\ude00\u0000""#),
    ];
    for (value, python) in cases {
        assert_eq!(canonical_json(&value), python);
        let mut data = obj(json!({"f": value.clone()}));
        gdpr::protect(&mut data, &paths(&["f"]), &Visible).unwrap();
        assert_eq!(data["f"], format!("v:{python}"));
    }
}

#[test]
fn unprotect_leaves_non_strings_and_is_safe_to_rerun_on_them() {
    let cipher = aes(&KEY);
    let marked = paths(&["card.number", "profile", "amounts[]"]);
    let original = obj(json!({
        "card": {"number": 4111111111111111u64},
        "profile": {"name": "Ann"},
        "amounts": [1, 2.5, null, true, [1]]
    }));
    let mut data = original.clone();
    assert_eq!(gdpr::protect(&mut data, &marked, &cipher).unwrap(), 7);
    assert_eq!(gdpr::unprotect(&mut data, &marked, &cipher).unwrap(), 7);
    assert_eq!(data, original);
    // Every restored value is not a string: a second run changes nothing.
    assert_eq!(gdpr::unprotect(&mut data, &marked, &cipher).unwrap(), 0);
    assert_eq!(data, original);
    // A restored *string* is read as a token again, and refused (as in Python and Go).
    let mut data = obj(json!({"email": "a@b.c"}));
    let err = gdpr::unprotect(&mut data, &paths(&["email"]), &cipher).unwrap_err();
    assert_eq!(err.path(), "email");
}

#[test]
fn a_failure_changes_nothing() {
    let original = obj(json!({
        "a": "one", "b": {"c": "two", "d": "three"}, "e": [{"f": "four"}, {"f": "five"}], "z": 1
    }));
    let marked = paths(&["a", "b.c", "b.d", "e[].f"]);
    for fail_at in 1..=5 {
        let mut data = original.clone();
        let cipher = FailsAt(fail_at.into());
        let err = gdpr::protect(&mut data, &marked, &cipher).unwrap_err();
        assert_eq!(data, original, "protect failing at call {fail_at}");
        assert!(err.to_string().contains("the KMS is down"), "{err}");
        assert_eq!(err.cipher_error().to_string(), "the KMS is down");
    }
    let mut sealed = original.clone();
    gdpr::protect(&mut sealed, &marked, &Visible).unwrap();
    // The last marked value is not a token: unprotect fails and changes nothing.
    sealed["e"][1]["f"] = json!("garbage");
    let before = sealed.clone();
    let err = gdpr::unprotect(&mut sealed, &marked, &Visible).unwrap_err();
    assert_eq!(err.path(), "e[].f");
    assert_eq!(sealed, before);
}

// ---------------------------------------------------------------------------------------
// the reference cipher

#[test]
fn aes_gcm_round_trip_and_format() {
    let cipher = aes(&KEY);
    let marked = sensitive_paths(&payment_schema());
    let original = obj(json!({
        "payment_id": "pay_1", "email": "ø@example.com", "amount": 12.5, "currency": "EUR",
        "card": {"number": "4111 1111 1111 1111", "exp": "12/30"},
        "addresses": [{"line": "Storgata 1, Tromsø", "city": "Tromsø"}]
    }));
    let mut data = original.clone();
    assert_eq!(gdpr::protect(&mut data, &marked, &cipher).unwrap(), 3);
    for token in [
        &data["email"],
        &data["card"]["number"],
        &data["addresses"][0]["line"],
    ] {
        let token = token.as_str().expect("a token is a string");
        // Standard padded base64 of nonce (12) + ciphertext + tag (16).
        assert_eq!(token.len() % 4, 0, "{token}");
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
        );
        use base64_check::decoded_len;
        assert!(decoded_len(token) >= 12 + 16 + 2);
    }
    assert_eq!(data["currency"], "EUR");
    assert_eq!(data["card"]["exp"], "12/30");
    // A fresh nonce each time.
    let mut again = original.clone();
    gdpr::protect(&mut again, &marked, &cipher).unwrap();
    assert_ne!(again["email"], data["email"]);
    assert_eq!(gdpr::unprotect(&mut data, &marked, &cipher).unwrap(), 3);
    assert_eq!(data, original);
    // The cipher's Debug shows no key.
    assert_eq!(format!("{cipher:?}"), "AesGcmCipher { .. }");
}

/// The decoded length of standard padded base64 (the crate is not a dependency here).
mod base64_check {
    pub fn decoded_len(token: &str) -> usize {
        token.len() / 4 * 3 - token.bytes().rev().take_while(|b| *b == b'=').count()
    }
}

#[test]
fn wrong_key_lengths_are_refused() {
    for len in [0usize, 1, 16, 24, 31, 33, 64] {
        let err = AesGcmCipher::new(&vec![1u8; len]).unwrap_err();
        assert_eq!(err.len(), len);
        assert_eq!(
            err.to_string(),
            format!("an AES-256-GCM key is 32 bytes, not {len}")
        );
    }
}

#[test]
fn a_wrong_key_is_a_decrypt_error() {
    let marked = sensitive_paths(&payment_schema());
    let original = obj(json!({"email": "a@b.c", "card": {"number": "4111"}, "amount": 1}));
    let mut data = original.clone();
    gdpr::protect(&mut data, &marked, &aes(&KEY)).unwrap();
    let sealed = data.clone();
    let err = gdpr::unprotect(&mut data, &marked, &aes(&OTHER_KEY)).unwrap_err();
    assert_eq!(
        err.path(),
        "card.number",
        "the first marked path present, sorted"
    );
    assert!(matches!(err.kind(), DecryptErrorKind::Cipher(_)));
    assert_eq!(
        err.to_string(),
        "cannot decrypt the protected field `card.number`: AES-GCM authentication failed (another key, or altered bytes)"
    );
    assert!(std::error::Error::source(&err).is_some());
    assert_eq!(data, sealed, "nothing changed");
}

#[test]
fn garbage_tokens_are_decrypt_errors() {
    let cipher = aes(&KEY);
    let sealed_not_json = cipher.encrypt(b"not json").unwrap();
    let sealed_two_values = cipher.encrypt(b"1 2").unwrap();
    let mut flipped = cipher.encrypt(b"\"x\"").unwrap().into_bytes();
    flipped[20] = if flipped[20] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    let cases: Vec<(String, bool)> = vec![
        (String::new(), false),
        ("!!!!".into(), false),
        ("AAAA".into(), false),
        ("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(), false),
        ("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(), false),
        ("YWxpY2VAZXhhbXBsZS5jb20".into(), false),
        (" ".repeat(40), false),
        ("é".repeat(20), false),
        (flipped, false),
        (sealed_not_json, true),
        (sealed_two_values, true),
    ];
    for (token, opens) in cases {
        let mut data = obj(json!({"email": token}));
        let err = gdpr::unprotect(&mut data, &paths(&["email"]), &cipher).unwrap_err();
        assert_eq!(err.path(), "email");
        match err.kind() {
            DecryptErrorKind::Cipher(_) => assert!(!opens, "{token:?}: {err}"),
            DecryptErrorKind::NotJson(_) => assert!(opens, "{token:?}: {err}"),
            other => panic!("{other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// envelopes and masks

#[test]
fn the_envelope_frame_is_untouched() {
    let cipher = aes(&KEY);
    let marked = sensitive_paths(&payment_schema());
    let data = json!({"payment_id": "p1", "email": "a@b.c", "name": "Zoë", "amount": 10,
        "card": {"number": "4111", "exp": "12/30"}});
    let mut env = Envelope::new("urn:babel:payments:charge", data.clone())
        .unwrap()
        .with_queue("payments")
        .with_trace_id("trace-gdpr-1");
    let before: Value = serde_json::from_slice(&env.encode()).unwrap();
    assert_eq!(
        gdpr::protect_envelope(&mut env, &marked, &cipher).unwrap(),
        2
    );
    let bytes = env.encode();
    let after: Value = serde_json::from_slice(&bytes).unwrap();
    for key in ["job", "trace_id", "meta", "attempts"] {
        assert_eq!(after[key], before[key], "{key}");
    }
    assert_eq!(
        after.as_object().unwrap().keys().collect::<Vec<_>>(),
        before.as_object().unwrap().keys().collect::<Vec<_>>()
    );
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(!text.contains("a@b.c") && !text.contains("4111"), "{text}");
    assert!(text.contains(r#""name":"Zoë""#) && text.contains(r#""exp":"12/30""#));

    let mut got = Envelope::decode(&bytes).unwrap();
    assert_eq!(
        gdpr::unprotect_envelope(&mut got, &marked, &cipher).unwrap(),
        2
    );
    assert_eq!(Value::Object(got.data.clone().into_map()), data);
    assert_eq!(got.trace_id, "trace-gdpr-1");
    // Nothing marked in it: nothing changes.
    let mut plain = Envelope::new("urn:babel:x", json!({"amount": 1})).unwrap();
    assert_eq!(
        gdpr::protect_envelope(&mut plain, &marked, &cipher).unwrap(),
        0
    );
    assert_eq!(
        gdpr::unprotect_envelope(&mut plain, &marked, &cipher).unwrap(),
        0
    );
    // A wrong key on an envelope.
    let mut wrong = Envelope::decode(&bytes).unwrap();
    let err = gdpr::unprotect_envelope(&mut wrong, &marked, &aes(&OTHER_KEY)).unwrap_err();
    assert_eq!(err.path(), "card.number");
}

#[test]
fn masks_for_logs() {
    let data = obj(json!({
        "email": "alice@example.com", "phone": 5550100, "empty": "", "none": null,
        "card": {"number": "4111", "exp": "12/30"}, "profile": {"a": 1},
        "addresses": [{"line": "Øvre gate 1", "city": "Oslo"}, {"city": "Bergen"}],
        "matrix": [["ab", "cd"], ["ef"]], "amount": 1
    }));
    let marked = paths(&[
        "email",
        "phone",
        "empty",
        "none",
        "card.number",
        "profile",
        "addresses[].line",
        "matrix[][]",
        "absent",
        "amount.deeper",
    ]);
    assert_eq!(
        gdpr::mask(&data, &marked),
        json!({
            "email": "a***", "phone": "***", "empty": "***", "none": "***",
            "card": {"number": "4***", "exp": "12/30"}, "profile": "***",
            "addresses": [{"line": "Ø***", "city": "Oslo"}, {"city": "Bergen"}],
            "matrix": [["a***", "c***"], ["e***"]], "amount": 1
        })
    );
    assert_eq!(gdpr::mask(&data, &paths(&["email", ""])), json!("***"));
}

// ---------------------------------------------------------------------------------------
// properties

/// An independent reading of a path: every location it reaches in `data`, each a list of
/// keys and indexes (written the simple recursive way, to check the library's walk).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Key(String),
    Index(usize),
}

fn locations(data: &Value, path: &str) -> Vec<Vec<Step>> {
    if path.is_empty() {
        return vec![];
    }
    let parts: Vec<&str> = path.split('.').collect();
    let mut out = vec![];
    fn go(node: &Value, parts: &[&str], at: Vec<Step>, out: &mut Vec<Vec<Step>>) {
        let Some((part, rest)) = parts.split_first() else {
            out.push(at);
            return;
        };
        let (key, array) = match part.strip_suffix("[]") {
            Some(k) => (k, true),
            None => (*part, false),
        };
        let Some(child) = node.as_object().and_then(|m| m.get(key)) else {
            return;
        };
        let mut at = at;
        at.push(Step::Key(key.to_owned()));
        if array {
            if let Value::Array(items) = child {
                for (i, item) in items.iter().enumerate() {
                    let mut here = at.clone();
                    here.push(Step::Index(i));
                    go(item, rest, here, out);
                }
            }
        } else {
            go(child, rest, at, out);
        }
    }
    go(data, &parts, vec![], &mut out);
    out
}

fn at_mut<'a>(value: &'a mut Value, loc: &[Step]) -> &'a mut Value {
    loc.iter().fold(value, |v, step| match step {
        Step::Key(k) => &mut v[k.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

/// Small keys so generated paths meet generated data.
fn arb_key() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "c", "é", "a.b", ""]).prop_map(str::to_owned)
}

fn arb_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop::sample::select(vec![1.0, 0.1, -0.0, 1e16, 1e-5, 1e300, 5e-324, 123.456])
            .prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        "[a-z@. ]{0,8}".prop_map(Value::String),
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    arb_leaf().prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((arb_key(), inner), 0..5)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

fn arb_data() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((arb_key(), arb_value()), 0..6).prop_map(|e| e.into_iter().collect())
}

fn arb_path() -> impl Strategy<Value = String> {
    prop::collection::vec((arb_key(), any::<bool>()), 0..4).prop_map(|parts| {
        parts
            .into_iter()
            .map(|(k, array)| if array { format!("{k}[]") } else { k })
            .collect::<Vec<_>>()
            .join(".")
    })
}

/// Paths where one reaches inside another's value (on this data): unprotect would then
/// meet a restored value as a token (documented, as in the Go and Python SDKs).
fn nested_marks(data: &Value, paths: &[String]) -> bool {
    let all: Vec<Vec<Step>> = paths.iter().flat_map(|p| locations(data, p)).collect();
    all.iter()
        .any(|a| all.iter().any(|b| b.len() > a.len() && b.starts_with(a)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// protect seals exactly the locations the paths reach; unmarked values are untouched;
    /// unprotect restores the data exactly; a wrong key fails when anything was sealed.
    #[test]
    fn protect_then_unprotect_is_the_identity(data in arb_data(), raw_paths in prop::collection::vec(arb_path(), 0..4)) {
        let original = Value::Object(data.clone());
        prop_assume!(!nested_marks(&original, &raw_paths));
        let marked: Vec<SensitivePath> = raw_paths.iter().map(SensitivePath::new).collect();
        let cipher = aes(&KEY);
        let mut sealed = data.clone();
        let n = gdpr::protect(&mut sealed, &marked, &cipher).unwrap();

        let locs: BTreeSet<Vec<Step>> = raw_paths.iter().flat_map(|p| locations(&original, p)).collect();
        let reached: usize = raw_paths.iter().map(|p| locations(&original, p).len()).sum();
        prop_assert_eq!(n, reached);
        // Null out the marked locations on both sides: the rest is equal.
        let mut a = original.clone();
        let mut b = Value::Object(sealed.clone());
        for loc in &locs {
            prop_assert!(at_mut(&mut b, loc).is_string());
            *at_mut(&mut a, loc) = Value::Null;
            *at_mut(&mut b, loc) = Value::Null;
        }
        prop_assert_eq!(a, b);

        if n > 0 {
            let mut wrong = sealed.clone();
            let err = gdpr::unprotect(&mut wrong, &marked, &aes(&OTHER_KEY)).unwrap_err();
            prop_assert!(matches!(err.kind(), DecryptErrorKind::Cipher(_)));
            prop_assert_eq!(&wrong, &sealed);
        }
        let mut restored = sealed;
        prop_assert_eq!(gdpr::unprotect(&mut restored, &marked, &cipher).unwrap(), n);
        prop_assert_eq!(Value::Object(restored), original);
    }

    /// unprotect on any data, with any strings where tokens are expected, never panics and
    /// either fails without a change or restores only what opens.
    #[test]
    fn unprotect_never_panics(data in arb_data(), raw_paths in prop::collection::vec(arb_path(), 0..4)) {
        let marked: Vec<SensitivePath> = raw_paths.iter().map(SensitivePath::new).collect();
        let mut got = data.clone();
        match gdpr::unprotect(&mut got, &marked, &aes(&KEY)) {
            Ok(n) => { prop_assert_eq!(n, 0); prop_assert_eq!(&got, &data); }
            Err(_) => prop_assert_eq!(&got, &data),
        }
        let _ = gdpr::mask(&data, &marked);
    }

    /// The canonical text reads back as the same value, is ASCII, and has no whitespace
    /// outside strings.
    #[test]
    fn canonical_json_reads_back(value in arb_value()) {
        let text = canonical_json(&value);
        prop_assert!(text.is_ascii());
        let back: Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&back, &value);
        let again = canonical_json(&back);
        prop_assert_eq!(again, text);
    }

    /// Each marked node of a schema built over a data shape is found, at its path.
    #[test]
    fn sensitive_paths_finds_every_mark(data in arb_value(), seed in any::<u64>()) {
        // The schema of `data`'s shape, marking nodes by the bits of `seed`.
        fn schema_of(v: &Value, path: String, bits: &mut u64, marks: &mut Vec<String>) -> Value {
            let mut node = Map::new();
            if *bits & 1 == 1 {
                node.insert("x-gdpr-sensitive".into(), json!(true));
                marks.push(path.clone());
            }
            *bits = bits.rotate_right(1);
            match v {
                Value::Object(m) => {
                    let mut props = Map::new();
                    for (k, child) in m {
                        let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                        props.insert(k.clone(), schema_of(child, p, bits, marks));
                    }
                    node.insert("properties".into(), Value::Object(props));
                }
                Value::Array(items) => {
                    if let Some(first) = items.first() {
                        node.insert("items".into(), schema_of(first, format!("{path}[]"), bits, marks));
                    }
                }
                _ => {}
            }
            Value::Object(node)
        }
        let mut bits = seed;
        let mut marks = vec![];
        let schema = schema_of(&data, String::new(), &mut bits, &mut marks);
        marks.sort();
        let found: Vec<String> = sensitive_paths(&schema).into_iter().map(|p| p.path).collect();
        prop_assert_eq!(found, marks);
    }
}

// ---------------------------------------------------------------------------------------
// interop with the upstream Python SDK, through Redis

mod interop {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    use std::process::Command;

    /// A RESP reply.
    #[derive(Debug)]
    enum Reply {
        Status,
        Int,
        Bulk(Option<Vec<u8>>),
        Array(Vec<Reply>),
    }

    /// The smallest Redis client the test needs: one connection, one command at a time.
    struct Redis {
        reader: BufReader<TcpStream>,
    }

    impl Redis {
        fn open(url: &str) -> Redis {
            let rest = url
                .strip_prefix("redis://")
                .expect("a redis:// URL in BABELQUEUE_REDIS_URL");
            let (authority, db) = rest.split_once('/').unwrap_or((rest, "0"));
            let host = authority.rsplit('@').next().unwrap_or(authority);
            let addr = if host.contains(':') {
                host.to_owned()
            } else {
                format!("{host}:6379")
            };
            let stream =
                TcpStream::connect(&addr).unwrap_or_else(|e| panic!("Redis at {addr}: {e}"));
            let mut redis = Redis {
                reader: BufReader::new(stream),
            };
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                let pass = userinfo.rsplit(':').next().unwrap_or(userinfo);
                redis.cmd(&[b"AUTH", pass.as_bytes()]);
            }
            let db = db.split('?').next().unwrap_or("0");
            if !db.is_empty() && db != "0" {
                redis.cmd(&[b"SELECT", db.as_bytes()]);
            }
            redis
        }

        fn cmd(&mut self, args: &[&[u8]]) -> Reply {
            let mut out = format!("*{}\r\n", args.len()).into_bytes();
            for arg in args {
                out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
                out.extend_from_slice(arg);
                out.extend_from_slice(b"\r\n");
            }
            self.reader.get_mut().write_all(&out).unwrap();
            self.read()
        }

        fn read(&mut self) -> Reply {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            let line = line.trim_end_matches("\r\n");
            let (kind, rest) = line.split_at(1);
            match kind {
                "+" => Reply::Status,
                "-" => panic!("Redis error: {rest}"),
                ":" => Reply::Int,
                "$" => {
                    let len: i64 = rest.parse().unwrap();
                    if len < 0 {
                        return Reply::Bulk(None);
                    }
                    let mut buf = vec![0; len as usize + 2];
                    self.reader.read_exact(&mut buf).unwrap();
                    buf.truncate(len as usize);
                    Reply::Bulk(Some(buf))
                }
                "*" => {
                    let n: i64 = rest.parse().unwrap();
                    Reply::Array((0..n.max(0)).map(|_| self.read()).collect())
                }
                other => panic!("unexpected RESP type {other:?}"),
            }
        }

        fn lrange_all(&mut self, key: &str) -> Vec<Vec<u8>> {
            match self.cmd(&[b"LRANGE", key.as_bytes(), b"0", b"-1"]) {
                Reply::Array(items) => items
                    .into_iter()
                    .map(|r| match r {
                        Reply::Bulk(Some(b)) => b,
                        other => panic!("{other:?}"),
                    })
                    .collect(),
                other => panic!("{other:?}"),
            }
        }

        fn del(&mut self, keys: &[String]) {
            let mut args: Vec<&[u8]> = vec![b"DEL"];
            args.extend(keys.iter().map(|k| k.as_bytes()));
            self.cmd(&args);
        }
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn peer(
        python: &str,
        mode: &str,
        url: &str,
        queue: &str,
        key: &[u8; 32],
        count: usize,
    ) -> Vec<Value> {
        let dir = env!("CARGO_MANIFEST_DIR");
        let out = Command::new(python)
            .arg(format!("{dir}/tests/gdpr_peer.py"))
            .args([
                mode,
                url,
                queue,
                &hex(key),
                &format!("{dir}/tests/gdpr_payment_schema.json"),
                &count.to_string(),
            ])
            .output()
            .expect("run the Python peer");
        assert!(
            out.status.success(),
            "gdpr_peer.py {mode} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("UTF-8 output")
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    }

    /// The payments the Rust side sends (the same shape as the peer's).
    fn rust_payment(i: usize) -> Value {
        let mut data = json!({
            "payment_id": format!("pay_rs_{i:04}"),
            "email": format!("kunde{i}.æ@example.com"),
            "name": format!("Åse Ødegård {i}"),
            "amount": if i.is_multiple_of(2) { json!(2000 + i) } else { json!(0.25 + i as f64) },
            "currency": "NOK",
            "card": {"number": format!("5500 0000 0000 {i:04}"), "exp": "01/31"},
        });
        if i % 3 != 1 {
            data["addresses"] =
                json!([{"line": format!("Kirkegata {i}, Bodø \u{1F3E0}"), "city": "Bodø"}]);
        }
        if i.is_multiple_of(4) {
            data["card"]["number"] = json!(5500000000000000u64 + i as u64);
        }
        if i.is_multiple_of(6) {
            data["card"]["number"] = json!({"pan": "5500", "seq": [1, 2.5, null]});
        }
        data
    }

    /// Every string and number of the marked values of `data`, as text to look for.
    fn cleartexts(data: &Value) -> Vec<String> {
        let mut out = vec![];
        for path in ["email", "card.number", "addresses[].line"] {
            for loc in locations(data, path) {
                let mut v = data.clone();
                let value = at_mut(&mut v, &loc).clone();
                match &value {
                    Value::String(s) => {
                        out.push(s.clone());
                        out.push(serde_json::to_string(s).unwrap());
                    }
                    Value::Number(n) => out.push(n.to_string()),
                    other => out.push(other.to_string()),
                }
            }
        }
        out
    }

    fn null_marked(data: &Value) -> Value {
        let mut v = data.clone();
        for path in ["email", "card.number", "addresses[].line"] {
            for loc in locations(data, path) {
                *at_mut(&mut v, &loc) = Value::Null;
            }
        }
        v
    }

    /// A schema over `value`'s shape, its nodes marked (or given a mark that does not
    /// mark) by the bits of `bits`.
    fn schema_over(value: &Value, bits: &mut u64) -> Value {
        let marks = [
            json!(true),
            json!("contact"),
            json!(false),
            json!(""),
            json!(1),
            json!(null),
        ];
        let mut node = Map::new();
        if *bits & 1 == 1 {
            let pick = ((*bits >> 1) % marks.len() as u64) as usize;
            node.insert("x-gdpr-sensitive".into(), marks[pick].clone());
        }
        *bits = bits.rotate_right(3);
        match value {
            Value::Object(m) => {
                let props = m
                    .iter()
                    .map(|(k, v)| (k.clone(), schema_over(v, bits)))
                    .collect();
                node.insert("properties".into(), Value::Object(props));
            }
            Value::Array(items) => {
                if let Some(first) = items.first() {
                    node.insert("items".into(), schema_over(first, bits));
                }
            }
            _ => {}
        }
        Value::Object(node)
    }

    /// The Python SDK and this crate, given the same schemas and data, find the same
    /// paths and seal the same values into the same plaintext bytes (a cipher whose
    /// token shows its plaintext), and agree on whether unprotect gives the data back.
    #[test]
    #[ignore = "needs the Python SDK venv (BABELQUEUE_PYTHON)"]
    fn python_finds_and_seals_what_rust_does() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;

        let python = std::env::var("BABELQUEUE_PYTHON")
            .expect("BABELQUEUE_PYTHON: a Python with babelqueue==1.24.0");
        let mut runner = TestRunner::deterministic();
        let mut cases: Vec<(Value, Map<String, Value>)> = vec![
            (payment_schema(), obj(rust_payment(0))),
            (payment_schema(), obj(rust_payment(6))),
            (
                json!({"x-gdpr-sensitive": true, "properties": {"a": {"items": {"items": {"x-gdpr-sensitive": "m"}}}}}),
                obj(json!({"a": [[1]], "a[]": [2.5, "x"]})),
            ),
            (
                json!({"properties": {"a.b": {"x-gdpr-sensitive": true}, "a": {"properties": {"b": {"x-gdpr-sensitive": 1}}}}}),
                obj(json!({"a": {"b": -0.0}, "a.b": 1e300})),
            ),
            (
                json!({"properties": {"c": {"x-gdpr-sensitive": true, "properties": {"n": {"x-gdpr-sensitive": true}}}}}),
                obj(json!({"c": {"n": 7}})),
            ),
        ];
        let data = arb_data();
        for _ in 0..1500 {
            let d = data.new_tree(&mut runner).unwrap().current();
            let mut bits = any::<u64>().new_tree(&mut runner).unwrap().current();
            let schema = schema_over(&Value::Object(d.clone()), &mut bits);
            cases.push((schema, d));
        }
        let input: String = cases
            .iter()
            .map(|(schema, data)| format!("{}\n", json!({"schema": schema, "data": data})))
            .collect();
        let dir = env!("CARGO_MANIFEST_DIR");
        let mut child = Command::new(&python)
            .arg(format!("{dir}/tests/gdpr_peer.py"))
            .arg("visible")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run the Python peer");
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), cases.len());
        let (mut sealed, mut failed_back) = (0, 0);
        for ((schema, data), py) in cases.iter().zip(&lines) {
            let paths = sensitive_paths(schema);
            let py_paths: Vec<(String, Option<String>)> = py["paths"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    let category = p[1].as_str().unwrap();
                    (
                        p[0].as_str().unwrap().to_owned(),
                        (!category.is_empty()).then(|| category.to_owned()),
                    )
                })
                .collect();
            let rs_paths: Vec<_> = paths
                .iter()
                .map(|p| (p.path.clone(), p.category.clone()))
                .collect();
            assert_eq!(rs_paths, py_paths, "paths of {schema}");
            let mut got = data.clone();
            sealed += gdpr::protect(&mut got, &paths, &Visible).unwrap();
            assert_eq!(
                Value::Object(got.clone()),
                py["protected"],
                "protect of {data:?} under {schema}"
            );
            match gdpr::unprotect(&mut got, &paths, &Visible) {
                Ok(_) => assert_eq!(
                    py["restored"],
                    json!(got == *data),
                    "{data:?} under {schema}"
                ),
                Err(e) => {
                    assert_eq!(py["restored"], Value::Null, "{data:?} under {schema}: {e}");
                    failed_back += 1;
                }
            }
        }
        eprintln!(
            "gdpr differential: {} cases, {sealed} values sealed alike, {failed_back} refused by both on the way back",
            cases.len()
        );
    }

    #[test]
    #[ignore = "needs the Python SDK venv (BABELQUEUE_PYTHON) and Redis (BABELQUEUE_REDIS_URL)"]
    fn python_and_rust_protect_for_each_other() {
        const COUNT: usize = 50;
        let python = std::env::var("BABELQUEUE_PYTHON")
            .expect("BABELQUEUE_PYTHON: a Python with babelqueue[redis]==1.24.0 and cryptography");
        let url = std::env::var("BABELQUEUE_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".to_owned());
        let marked = sensitive_paths(&payment_schema());
        let cipher = aes(&KEY);
        let unique = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let py_queue = format!("bq-test-gdpr-py-{unique}");
        let rs_queue = format!("bq-test-gdpr-rs-{unique}");
        let keys: Vec<String> = [&py_queue, &rs_queue]
            .iter()
            .flat_map(|q| {
                [
                    q.to_string(),
                    format!("{q}:processing"),
                    format!("{q}:processing:deadlines"),
                ]
            })
            .collect();
        let mut redis = Redis::open(&url);
        redis.del(&keys);

        // (a) Python protects and publishes; Rust reads the raw bytes, then unprotects.
        let sent = peer(&python, "produce", &url, &py_queue, &KEY, COUNT);
        assert_eq!(sent.len(), COUNT);
        let raw = redis.lrange_all(&py_queue);
        assert_eq!(raw.len(), COUNT, "messages in the Python queue");
        let (mut restored, mut wrong_key_failures) = (0, 0);
        for (bytes, sent) in raw.iter().zip(&sent) {
            let text = std::str::from_utf8(bytes).expect("UTF-8 body");
            for clear in cleartexts(&sent["data"]) {
                assert!(
                    !text.contains(&clear),
                    "cleartext {clear:?} on the wire: {text}"
                );
            }
            let wire: Value = serde_json::from_str(text).unwrap();
            assert_eq!(wire["trace_id"], sent["trace_id"]);
            assert_eq!(wire["meta"]["lang"], "python");
            // Every unmarked value as sent, and each top-level unmarked member's bytes.
            assert_eq!(null_marked(&wire["data"]), null_marked(&sent["data"]));
            for (key, value) in sent["data"].as_object().unwrap() {
                if key != "email" && key != "addresses" && key != "card" {
                    let member = format!(
                        "{}:{}",
                        serde_json::to_string(key).unwrap(),
                        serde_json::to_string(value).unwrap()
                    );
                    assert!(text.contains(&member), "{member} not in {text}");
                }
            }
            assert!(text.contains(r#""exp":"12/30""#));

            let mut env = Envelope::decode(bytes).expect("a Python envelope decodes");
            let err = gdpr::unprotect_envelope(&mut env.clone(), &marked, &aes(&OTHER_KEY))
                .expect_err("(c) a wrong key fails every message");
            assert!(matches!(err.kind(), DecryptErrorKind::Cipher(_)), "{err}");
            wrong_key_failures += 1;
            gdpr::unprotect_envelope(&mut env, &marked, &cipher).expect("the right key opens it");
            assert_eq!(Value::Object(env.data.clone().into_map()), sent["data"]);
            assert_eq!(env.trace_id, sent["trace_id"].as_str().unwrap());
            restored += 1;
        }
        assert_eq!((restored, wrong_key_failures), (COUNT, COUNT));

        // (b) Rust protects and publishes; the Python SDK's unprotect restores exactly.
        let mut originals = vec![];
        for i in 0..COUNT {
            let data = rust_payment(i);
            let mut env = Envelope::new("urn:babel:payments:gdpr-interop", data.clone())
                .unwrap()
                .with_queue(&rs_queue);
            gdpr::protect_envelope(&mut env, &marked, &cipher).unwrap();
            let bytes = env.encode();
            let text = String::from_utf8(bytes.clone()).unwrap();
            for clear in cleartexts(&data) {
                assert!(
                    !text.contains(&clear),
                    "cleartext {clear:?} on the wire: {text}"
                );
            }
            redis.cmd(&[b"RPUSH", rs_queue.as_bytes(), &bytes]);
            originals.push((env.trace_id.clone(), data));
        }
        let got = peer(&python, "consume", &url, &rs_queue, &KEY, COUNT);
        assert_eq!(got.len(), COUNT);
        let mut same = 0;
        for (got, (trace_id, data)) in got.iter().zip(&originals) {
            assert_eq!(got["trace_id"], trace_id.as_str());
            assert_eq!(
                &got["data"], data,
                "Python's unprotect of a Rust-protected payment"
            );
            same += 1;
        }
        assert_eq!(same, COUNT);
        eprintln!(
            "gdpr interop: Python -> Rust {restored}/{COUNT} restored, wrong key {wrong_key_failures}/{COUNT} DecryptError; Rust -> Python {same}/{COUNT} restored"
        );
        redis.del(&keys);
    }
}

#[test]
fn errors_are_send_sync_static_and_numbers_read_back() {
    fn send_sync<T: Send + Sync + 'static + std::error::Error>() {}
    send_sync::<gdpr::DecryptError>();
    send_sync::<gdpr::EncryptError>();
    send_sync::<CipherError>();
    send_sync::<gdpr::InvalidKeyLength>();
    // Numbers as serde_json reads them write back to the same number.
    for text in [
        "-0",
        "-0.0",
        "0",
        "1e2",
        "-1E-7",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775809",
        "1.5e300",
    ] {
        let value: Value = serde_json::from_str(text).unwrap();
        let back: Value = serde_json::from_str(&canonical_json(&value)).unwrap();
        assert_eq!(back, value, "{text} -> {}", canonical_json(&value));
    }
}
