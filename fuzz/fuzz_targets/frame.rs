//! The Redis header frame (`{"__bq_frame":1,"headers":{…},"body":"…"}`): `unframe` never
//! panics, and a frame it reads is written back by `encode_element` to a frame that reads
//! the same.
#![no_main]

use babelqueue_core::binding::redis::{element_body, encode_element, unframe};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let body = element_body(data);
    match unframe(data) {
        None => assert_eq!(&body[..], data, "a non-frame element is its own body"),
        Some((headers, inner)) => {
            assert_eq!(&body[..], &inner[..]);
            assert!(
                std::str::from_utf8(&inner).is_ok(),
                "a frame body is a JSON string"
            );
            let element = encode_element(&inner, Some(&headers)).expect("UTF-8 body");
            if headers.is_empty() {
                assert_eq!(element, inner, "no headers: the element is the body");
            } else {
                let (h2, b2) = unframe(&element).expect("a frame we wrote reads as a frame");
                assert_eq!(h2, headers);
                assert_eq!(b2, inner);
            }
        }
    }
});
