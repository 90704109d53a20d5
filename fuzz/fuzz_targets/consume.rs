//! The consume path: any bytes on a queue go through the runtime (`App::drain` over the
//! in-memory transport, a handler that fails when `data.fail` is set, two attempts) without
//! a panic and without loss: afterwards the queue and the in-flight list are empty, the
//! message was handled or is the one dead letter, a poison dead letter gives back exactly
//! the bytes, and a retried envelope keeps every member but `attempts` as it arrived.
#![no_main]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use babelqueue_core::Envelope;
use babelqueue_runtime::{App, InMemoryTransport, Transport, recover_poison, unframe};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const URN: &str = "urn:babel:fuzz:run";

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let t = InMemoryTransport::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let app = App::new(t.clone()).queue("q").max_attempts(2).route_sync(
            URN,
            move |env: &Envelope| {
                c.fetch_add(1, Ordering::SeqCst);
                if env.data.get("fail").is_some() {
                    Err(std::io::Error::other("the handler fails on data.fail"))
                } else {
                    Ok(())
                }
            },
        );
        t.publish_raw("q", data.to_vec()).await.expect("publish");
        let stats = app.drain().await.expect("an in-memory drain does not fail");
        assert_eq!((t.len("q"), t.processing_len("q")), (0, 0), "{stats:?}");
        let dlq = t.messages("q.dlq");
        assert!(dlq.len() <= 1, "{stats:?}");
        if stats.poison > 0 {
            assert_eq!(dlq.len(), 1, "{stats:?}");
            assert_eq!(
                recover_poison(&dlq[0]).as_deref(),
                Some(data),
                "a poison dead letter gives back the exact bytes"
            );
        } else if dlq.is_empty() {
            // Handled (or its URN routed nowhere with dead-lettering off: not here).
            assert!(stats.succeeded + stats.skipped == 1, "{stats:?}");
        } else {
            // Dead-lettered after its attempts (or an unknown URN): the envelope as it
            // arrived, with `attempts` and the `dead_letter` block the only changes.
            // A header frame is compared by its body (the block goes inside it).
            let body_of = |b: &[u8]| unframe(b).map_or_else(|| b.to_vec(), |(_, body)| body);
            let dead: Value =
                serde_json::from_slice(&body_of(&dlq[0])).expect("a dead letter is JSON");
            let sent: Value =
                serde_json::from_slice(&body_of(data)).expect("an accepted envelope is JSON");
            let (Value::Object(mut dead), Value::Object(mut sent)) = (dead, sent) else {
                panic!("dead letter and envelope are JSON objects");
            };
            assert!(dead.shift_remove("dead_letter").is_some());
            dead.shift_remove("attempts");
            sent.shift_remove("attempts");
            sent.shift_remove("dead_letter");
            assert_eq!(dead, sent, "only attempts and dead_letter change");
        }
    });
});
