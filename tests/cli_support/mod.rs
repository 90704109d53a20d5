//! Shared by the tests that run the `babelqueue` CLI against a broker they started
//! (`tests/it/sqs_transport.rs`, `tests/kafka/kafka_transport.rs`): where the binary is, and a dead
//! letter of the family's shape.

use std::path::PathBuf;

use serde_json::json;

/// The `babelqueue` CLI built with every broker: `BABELQUEUE_CLI` (`.ci/run` builds it with
/// `cargo build -p babelqueue-cli --features sqs,kafka`).
pub fn binary() -> PathBuf {
    PathBuf::from(std::env::var_os("BABELQUEUE_CLI").expect(
        "BABELQUEUE_CLI: the babelqueue CLI built with the sqs and kafka features \
         (cargo build -p babelqueue-cli --features sqs,kafka; .ci/run sets it)",
    ))
}

/// A payment dead-lettered from `queue` (reason `failed`, three attempts), with meta.id `id`.
pub fn dead_letter(id: &str, queue: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "job": "urn:babel:payments:charge",
        "trace_id": format!("trace-{id}"),
        "data": {"payment_id": id, "amount": 4200},
        "meta": {"id": id, "queue": queue, "lang": "python", "schema_version": 1,
                 "created_at": 1_764_640_000_000u64},
        "attempts": 3,
        "dead_letter": {"reason": "failed", "error": "declined", "failed_at": 1_764_640_001_000u64,
                        "original_queue": queue, "attempts": 3, "lang": "python"},
    }))
    .unwrap()
}
