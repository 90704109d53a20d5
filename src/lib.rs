//! # babelqueue
//!
//! BabelQueue for Rust: read and write the canonical polyglot queue envelope shared with
//! the Go, Python, PHP, Java, Node and .NET SDKs, and make consumers idempotent on
//! `meta.id` with `#[idempotent]`.
//!
//! This is the facade crate: it re-exports [`babelqueue_core`] and, behind cargo
//! features, the backends (`redis`, `postgres`, `sqlite`).
//!
//! ## A note on `serde_json` features
//!
//! The wire envelope keeps the key order of `data` and round-trips floats exactly, so this
//! crate turns on `serde_json`'s `preserve_order` and `float_roundtrip` features. Cargo
//! unifies features across a build: in an application that depends on babelqueue,
//! **every** `serde_json::Map` keeps insertion order (an `IndexMap` instead of a
//! `BTreeMap`, so maps no longer iterate sorted) and float parsing is the exact, slightly
//! slower algorithm. Code that relied on sorted map iteration should sort explicitly.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use babelqueue_core::*;

#[doc(inline)]
pub use babelqueue_macros::idempotent;

#[doc(inline)]
pub use babelqueue_macros::handler;

/// The Redis backend: [`RedisStore`](babelqueue_redis::RedisStore) (feature `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use babelqueue_redis as redis;

/// The PostgreSQL backend: [`PostgresStore`](babelqueue_postgres::PostgresStore)
/// (feature `postgres`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use babelqueue_postgres as postgres;

/// The embedded SQLite backend: [`SqliteStore`](babelqueue_sqlite::SqliteStore)
/// (feature `sqlite`).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use babelqueue_sqlite as sqlite;

/// The code blocks of `README.md`, compiled (and run, where they need no server) as
/// doctests so the README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
