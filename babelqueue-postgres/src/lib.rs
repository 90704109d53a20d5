//! # babelqueue-postgres
//!
//! The PostgreSQL backend of BabelQueue for Rust: [`PostgresStore`], the shared
//! seen-set on the `babelqueue_idempotency` table that every BabelQueue SDK uses (SPEC
//! section 3), with the in-flight lease mode on top (two additive nullable columns).
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
#![warn(missing_docs)]

mod purge;
mod store;
mod table;
mod txn;

pub use purge::{DEFAULT_PURGE_BATCH, PurgeReport, Purger};
pub use store::{PostgresStore, PostgresStoreBuilder, PostgresStoreError};
pub use table::{DDL, DEFAULT_TABLE, InvalidTableName, TableName};

/// The pool crate this backend is built on (to pass your own pool to
/// [`PostgresStore::from_pool`]).
pub use deadpool_postgres;
/// The client crate this backend is built on.
pub use tokio_postgres;
