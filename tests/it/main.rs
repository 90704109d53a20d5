//! The integration tests of the `babelqueue` package in one binary (one link of the
//! facade instead of one per file). Each module is one area; the server tests among them
//! are `#[ignore]`d with the reason and run by `.ci/run` (`--run-ignored only`).

#[path = "../amqp_support/mod.rs"]
mod amqp_support;
#[path = "../child_support/mod.rs"]
mod child_support;
#[path = "../cli_support/mod.rs"]
mod cli_support;
#[path = "../fleet_support/mod.rs"]
mod fleet_support;
#[path = "../idemp_support/mod.rs"]
mod idemp_support;
#[path = "../sqs_support/mod.rs"]
mod sqs_support;

mod amqp_fleet;
mod amqp_interop;
mod amqp_payments;
mod amqp_transport;
mod fault_kit;
mod fingerprint_stores;
mod fleet_processes;
mod handler_router;
mod idempotent_behaviour;
mod idempotent_conformance;
mod idempotent_core_only;
mod interop_python_fleet;
mod namespace_stores;
mod outbox_redis;
mod outbox_sigkill;
mod proptest_envelope;
mod readme_blocks;
mod redis_cluster;
mod redis_drain_held;
mod redis_fleet;
mod redis_owed_write_outage;
mod redis_payments;
mod redis_pipelining;
mod redis_transport;
mod redrive_amqp;
mod redrive_bytes;
mod redrive_python;
mod redrive_redis;
mod retention_stores;
mod runtime_bad_day;
mod runtime_byte_exact;
mod runtime_memory;
mod runtime_outages;
mod runtime_owed_writes;
mod runtime_pipelined;
mod runtime_start_outage;
mod sqs_payments;
mod sqs_transport;
mod store_memory;
mod store_postgres;
mod store_redis;
mod store_redis_reconnect;
mod store_sqlite;
mod txn_ledger_example;
mod txn_macro_entry;
mod txn_postgres;
mod txn_sqlite;
mod typed_handler;
mod ui;
