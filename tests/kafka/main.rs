//! The Kafka tests (feature `kafka`, not in `full`: librdkafka's C build), against tansu,
//! a Kafka-protocol emulator each test starts on its own port:
//! `cargo test --features kafka --test kafka -- --ignored`.

#[path = "../child_support/mod.rs"]
mod child_support;
#[path = "../cli_support/mod.rs"]
mod cli_support;
#[path = "../kafka_support/mod.rs"]
mod kafka_support;

mod kafka_payments;
mod kafka_transport;
