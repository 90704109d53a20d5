//! `babelqueue outbox relay <db-url>`: a transactional-outbox relay on its own.

use std::sync::Arc;
use std::time::Duration;

use babelqueue_postgres::{PostgresOutbox, PostgresStore};
use babelqueue_redis::RedisTransport;
use babelqueue_runtime::outbox::{OutboxRelay, OutboxStore, RelayStats};
use babelqueue_sqlite::SqliteOutbox;

use crate::CliError;

/// Where the outbox table lives.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Database {
    /// A PostgreSQL URL (`postgres://` or `postgresql://`).
    Postgres(String),
    /// A SQLite file: `sqlite:<path>`, `sqlite://<path>`, or a path.
    Sqlite(String),
}

impl Database {
    pub(crate) fn parse(url: &str) -> Database {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Database::Postgres(url.to_owned());
        }
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        Database::Sqlite(path.to_owned())
    }
}

/// The relay's settings from the command line.
#[derive(Debug)]
pub(crate) struct Settings {
    pub db_url: String,
    pub broker: String,
    pub table: String,
    pub batch: usize,
    pub poll: Duration,
    pub once: bool,
}

fn outbox_err(context: &str) -> impl FnOnce(babelqueue_runtime::outbox::OutboxError) -> CliError {
    let context = context.to_owned();
    move |e| CliError::Postgres(context, Box::new(e))
}

async fn open_store(s: &Settings) -> Result<Arc<dyn OutboxStore>, CliError> {
    Ok(match Database::parse(&s.db_url) {
        Database::Postgres(url) => {
            let store = PostgresStore::connect(&url)
                .await
                .map_err(|e| CliError::Postgres(format!("connecting to {url}"), Box::new(e)))?;
            let outbox = PostgresOutbox::with_table(store.pool().clone(), &s.table)
                .map_err(|e| CliError::Message(e.to_string()))?;
            outbox
                .migrate()
                .await
                .map_err(outbox_err("migrating the outbox table"))?;
            // Wake on every committed save (NOTIFY); the poll stays as the fallback.
            Arc::new(outbox.listen(&url))
        }
        Database::Sqlite(path) => {
            if !std::path::Path::new(&path).is_file() {
                return Err(CliError::Message(format!(
                    "no SQLite database at {path} (the outbox lives in your application's file)"
                )));
            }
            Arc::new(
                SqliteOutbox::open_table(&path, &s.table)
                    .map_err(|e| CliError::Message(format!("opening {path}: {e}")))?,
            )
        }
    })
}

/// Runs the relay: one drain with `once`, else until Ctrl-C. Returns the totals.
pub(crate) async fn relay(s: &Settings) -> Result<RelayStats, CliError> {
    let store = open_store(s).await?;
    let transport = RedisTransport::connect(&s.broker)
        .await
        .map_err(|e| CliError::Message(format!("connecting to the broker {}: {e}", s.broker)))?;
    let relay = OutboxRelay::new(store, Arc::new(transport))
        .batch_size(s.batch)
        .poll_interval(s.poll);
    if s.once {
        return relay
            .drain()
            .await
            .map_err(|e| CliError::Message(format!("relaying: {e}")));
    }
    eprintln!("relaying {} to {} (Ctrl-C stops)", s.db_url, s.broker);
    Ok(relay
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls() {
        assert_eq!(
            Database::parse("postgres://u@h/db"),
            Database::Postgres("postgres://u@h/db".into())
        );
        assert_eq!(
            Database::parse("postgresql://h/db"),
            Database::Postgres("postgresql://h/db".into())
        );
        assert_eq!(
            Database::parse("sqlite:shop.db"),
            Database::Sqlite("shop.db".into())
        );
        assert_eq!(
            Database::parse("sqlite:///var/shop.db"),
            Database::Sqlite("/var/shop.db".into())
        );
        assert_eq!(
            Database::parse("shop.db"),
            Database::Sqlite("shop.db".into())
        );
    }
}
