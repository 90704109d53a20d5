//! The dead-letter block and the poison record: decoding a `dead_letter` block never
//! panics; every body the consumer rejects becomes a dead letter that is JSON with a
//! `dead_letter` block, and `recover_poison` gives back exactly the original bytes, always
//! (whatever the body looks like: a frame, an envelope with its own `dead_letter`, a poison
//! record); `recover_poison` of arbitrary bytes never panics.
#![no_main]

use babelqueue_runtime::{poison_body, recover_poison};
use babelqueue_core::{DeadLetter, Envelope};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<DeadLetter>(data);
    let _ = recover_poison(data);
    let Err(err) = Envelope::decode(data) else {
        return;
    };
    let dlq = poison_body(data, &err, "orders");
    let record: Value = serde_json::from_slice(&dlq).expect("a poison record is JSON");
    assert_eq!(record["dead_letter"]["reason"], "poison", "{record}");
    assert_eq!(
        recover_poison(&dlq).as_deref(),
        Some(data),
        "recover_poison must give back exactly the original bytes"
    );
});
