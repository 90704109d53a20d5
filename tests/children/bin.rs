//! The child processes that the kill and fleet tests start and SIGKILL, as one binary:
//! `test_children <name>`, its settings in `BQ_*` environment variables set by the test.
//! Not a test itself; `tests/child_support` builds and finds it.

#[path = "../amqp_support/mod.rs"]
mod amqp_support;
#[path = "../fleet_support/mod.rs"]
mod fleet_support;
#[path = "../sqs_support/mod.rs"]
mod sqs_support;

mod amqp_consumer;
mod fleet_consumer;
#[cfg(feature = "kafka")]
mod kafka_consumer;
mod outbox_relay;
mod redrive;
mod sqs_consumer;

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let current_thread = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    };
    match name.as_str() {
        "amqp-consumer" => amqp_consumer::main(),
        "fleet-consumer" => fleet_consumer::main(),
        #[cfg(feature = "kafka")]
        "kafka-consumer" => kafka_consumer::main(),
        "sqs-consumer" => sqs_consumer::main(),
        "outbox-relay" => current_thread().block_on(outbox_relay::main()),
        "redrive" => current_thread().block_on(redrive::main()),
        other => {
            eprintln!(
                "test_children: unknown child {other:?}; expected amqp-consumer, fleet-consumer, \
                 kafka-consumer (feature kafka), sqs-consumer, outbox-relay or redrive"
            );
            std::process::exit(2);
        }
    }
}
