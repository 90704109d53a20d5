//! # babelqueue
//!
//! BabelQueue for Rust: read and write the canonical polyglot queue envelope shared with
//! the Go, Python, PHP, Java, Node and .NET SDKs, and make consumers idempotent on
//! `meta.id` with `#[idempotent]`.
//!
//! This is the facade crate: it re-exports [`babelqueue_core`] and, behind cargo
//! features, the backends (`redis`, `postgres`, `sqlite`).
#![warn(missing_docs)]

pub use babelqueue_core::*;
