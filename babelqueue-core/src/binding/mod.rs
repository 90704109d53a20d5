//! The family's broker bindings as pure code: how an envelope is projected onto each
//! broker's native message on produce, and how `attempts` is reconciled on consume.
//!
//! In every binding the message body is the envelope, byte for byte (SPEC §7). What a
//! binding adds is a native, routable *view* of it and a rule for `attempts`; both are
//! locked by the conformance manifest's blocks of the same names. No module here depends on
//! a broker client: each returns neutral Rust values a transport converts to its client's
//! types.
//!
//! | module | broker | projection | attempts on consume |
//! | --- | --- | --- | --- |
//! | [`amqp`] | RabbitMQ (AMQP 0-9-1) | properties + typed `x-*` headers | the body |
//!
//! ```
//! use babelqueue_core::binding::amqp;
//! use babelqueue_core::Envelope;
//!
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
//! assert_eq!(amqp::project(&env).kind, "urn:babel:payments:charge");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod amqp;
pub mod kafka;
pub mod sqs;
