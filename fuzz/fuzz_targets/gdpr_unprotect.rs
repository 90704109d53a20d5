//! Personal-data fields (`babelqueue_core::gdpr`): `unprotect` with a fixed key never panics
//! on any bytes, as a token, as `data` (with a schema read from the same input) or as an
//! envelope; a failure leaves `data` unchanged; `protect` then `unprotect` with sorted paths
//! gives the data back whenever it succeeds; the canonical text of any value reads back as it.
#![no_main]

use std::sync::LazyLock;

use babelqueue_core::Envelope;
use babelqueue_core::gdpr::{self, AesGcmCipher, Cipher, SensitivePath};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

static CIPHER: LazyLock<AesGcmCipher> =
    LazyLock::new(|| AesGcmCipher::new(&[0x42; 32]).expect("a 32-byte key"));

/// Sorted, as `sensitive_paths` gives them.
static PATHS: LazyLock<Vec<SensitivePath>> = LazyLock::new(|| {
    let mut paths: Vec<SensitivePath> = [
        "",
        "[]",
        "a[][]",
        "addresses[].line",
        "card",
        "card.number",
        "email",
        "x..y",
    ]
    .into_iter()
    .map(SensitivePath::new)
    .collect();
    paths.sort();
    paths
});

fuzz_target!(|input: &[u8]| {
    let cipher = &*CIPHER;

    // The bytes as a token.
    let token = String::from_utf8_lossy(input).into_owned();
    let _ = cipher.decrypt(&token);
    let mut data: Map<String, Value> = [("email".to_owned(), Value::String(token))]
        .into_iter()
        .collect();
    let before = data.clone();
    if gdpr::unprotect(&mut data, &PATHS, cipher).is_err() {
        assert_eq!(data, before, "a failed unprotect changed data");
    }

    // The bytes as `schema 0xFF data`, or as data alone with the fixed paths.
    let (schema, text) = match input.iter().position(|b| *b == 0xFF) {
        Some(at) => (Some(&input[..at]), &input[at + 1..]),
        None => (None, input),
    };
    let paths = schema
        .and_then(|s| serde_json::from_slice::<Value>(s).ok())
        .map(|s| gdpr::sensitive_paths(&s))
        .unwrap_or_else(|| PATHS.clone());
    if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(text) {
        let mut got = map.clone();
        if gdpr::unprotect(&mut got, &paths, cipher).is_err() {
            assert_eq!(got, map, "a failed unprotect changed data");
        }
        let _ = gdpr::mask(&map, &paths);
        let mut sealed = map.clone();
        gdpr::protect(&mut sealed, &paths, cipher).expect("AES-GCM seals any value");
        let mut back = sealed.clone();
        if gdpr::unprotect(&mut back, &paths, cipher).is_ok() {
            assert_eq!(back, map, "protect then unprotect changed data");
        }
        for value in map.values() {
            let canonical = gdpr::canonical_json(value);
            let read: Value = serde_json::from_str(&canonical).expect("canonical JSON reads");
            assert_eq!(&read, value, "{canonical}");
        }
    }

    // The bytes as an envelope.
    if let Ok(mut env) = Envelope::decode(input) {
        let _ = gdpr::unprotect_envelope(&mut env, &PATHS, cipher);
    }
});
