//! Envelope decoding and the acceptance rules (SPEC §1): never panics; `accepts` agrees
//! with `decode`; an accepted envelope survives encode → decode unchanged, and its
//! encoding is stable; `decode` (fields picked while parsing) agrees with `from_value` on
//! the parsed value, error for error.
#![no_main]

use babelqueue_core::{DecodeError, Envelope};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decoded = Envelope::decode(data);
    let parsed = serde_json::from_slice::<serde_json::Value>(data)
        .map_err(|e| DecodeError::NotJson(e.to_string()))
        .and_then(Envelope::from_value);
    assert_eq!(decoded, parsed, "decode and from_value disagree");
    assert_eq!(Envelope::accepts(data), decoded.is_ok());
    if let Ok(env) = decoded {
        let bytes = env.encode();
        let again = Envelope::decode(&bytes).expect("a re-encoded accepted envelope is accepted");
        assert_eq!(again, env, "encode/decode round trip changed the envelope");
        assert_eq!(again.encode(), bytes, "the encoding is not stable");
    }
});
