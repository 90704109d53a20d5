//! The broker bindings: every `project_body` never panics and all agree on what is an
//! envelope; an accepted envelope always has a projection, and the lenient projection of
//! its canonical encoding equals the typed one. Then the attempts rules on arbitrary
//! counts: never below the body where the rule is a max, the Kafka header authoritative
//! when it is a count.
#![no_main]

use babelqueue_core::Envelope;
use babelqueue_core::binding::{amqp, artemis, asb, kafka, pulsar, sqs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let a = amqp::project_body(data);
    let flags = [
        a.is_some(),
        sqs::project_body(data).is_some(),
        kafka::project_body(data).is_some(),
        asb::project_body(data).is_some(),
        pulsar::project_body(data).is_some(),
        artemis::project_body(data).is_some(),
    ];
    assert!(flags.iter().all(|f| *f == flags[0]), "{flags:?}");

    if let Ok(env) = Envelope::decode(data) {
        assert!(flags[0], "an accepted envelope has no projection");
        {
            let canon = env.encode();
            assert_eq!(amqp::project_body(&canon), Some(amqp::project(&env)));
            assert_eq!(
                sqs::project_body(&canon),
                Some(sqs::message_attributes(&env))
            );
            assert_eq!(
                kafka::project_body(&canon),
                Some(kafka::Record {
                    headers: kafka::headers(&env),
                    timestamp_ms: kafka::timestamp_ms(&env),
                })
            );
            assert_eq!(asb::project_body(&canon), Some(asb::project(&env)));
            assert_eq!(pulsar::project_body(&canon), Some(pulsar::properties(&env)));
            assert_eq!(artemis::project_body(&canon), Some(artemis::project(&env)));
        }
    }

    if data.len() >= 8 {
        let body = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let count = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
        let rest = &data[8..];
        let text = String::from_utf8_lossy(rest);

        assert!(sqs::reconcile_attempts(body, Some(&text)) >= body);
        assert_eq!(sqs::reconcile_attempts(body, None), body);
        assert_eq!(
            asb::reconcile_attempts(body, count),
            body.max(count.saturating_sub(1))
        );
        assert_eq!(pulsar::reconcile_attempts(body, count), body.max(count));
        assert_eq!(artemis::reconcile_attempts(body, count), body.max(count));
        assert!(pulsar::reconcile_attempts_with_property(body, Some(&text), count) >= count);
        assert_eq!(amqp::reconcile_attempts(body, Some(i64::from(count))), body);

        let k = kafka::reconcile_attempts(body, Some(rest));
        match kafka::header_attempts(rest) {
            Some(n) => assert_eq!(u128::from(k), n.min(u128::from(u32::MAX))),
            None => assert_eq!(k, body),
        }
        assert_eq!(kafka::reconcile_attempts(body, None), body);
    }
});
