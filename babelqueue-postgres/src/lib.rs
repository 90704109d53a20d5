//! # babelqueue-postgres
//!
//! The PostgreSQL backend of BabelQueue for Rust: [`PostgresStore`], the shared
//! seen-set on the `babelqueue_idempotency` table that every BabelQueue SDK uses, with the in-flight lease mode on top (two additive nullable columns).
//!
//! The DDL ships as `sql/babelqueue_idempotency.sql` ([`DDL`]); [`PostgresStore::migrate`]
//! runs it for the configured, validated table name.
//!
//! ```no_run
//! use babelqueue_postgres::PostgresStore;
//!
//! # async fn demo() -> Result<(), babelqueue_postgres::PostgresStoreError> {
//! let store = PostgresStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
//! store.migrate().await?;
//! let deleted = store.purge_expired().await?;
//! # Ok(()) }
//! ```
//!
//! ## TLS
//!
//! `sslmode` (`disable`, `allow`, `prefer`, `require`, `verify-ca`, `verify-full`) and
//! `sslrootcert` are read from the URL with libpq's meaning; TLS itself needs the
//! `rustls` feature. Without it, `sslmode=require` and stricter are refused rather than
//! connecting in plaintext. The exact semantics are on [`SslMode`]'s module, [`tls`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), babelqueue_postgres::PostgresStoreError> {
//! let store = babelqueue_postgres::PostgresStore::connect(
//!     "postgres://app@db.example.com:5432/app?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem",
//! )
//! .await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod outbox;
mod purge;
mod statements;
mod store;
mod table;
pub mod tls;
mod txn;

pub use outbox::{DEFAULT_OUTBOX_TABLE, OUTBOX_DDL, PostgresOutbox};
pub use purge::{DEFAULT_PURGE_BATCH, PurgeReport, Purger};
pub use store::{PostgresStore, PostgresStoreBuilder, PostgresStoreError};
pub use table::{DDL, DEFAULT_TABLE, InvalidTableName, TableName};
pub use tls::{SslMode, TlsError};

/// The pool crate this backend is built on (to pass your own pool to
/// [`PostgresStore::from_pool`]).
pub use deadpool_postgres;
/// The TLS crate of the `rustls` feature (to build a
/// [`tls_config`](PostgresStoreBuilder::tls_config) of your own).
#[cfg(feature = "rustls")]
#[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
pub use rustls;
/// The client crate this backend is built on.
pub use tokio_postgres;
