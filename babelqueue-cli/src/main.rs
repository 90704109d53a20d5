//! `babelqueue`: look at BabelQueue queues, dead letters and stores from a shell.
//!
//! ```text
//! babelqueue queue stats payments
//! babelqueue dlq list payments --limit 20
//! babelqueue dlq requeue payments --id 2f1c…
//! babelqueue dlq recover-poison payments --to payments.poison
//! babelqueue doctor postgres://app@db/app
//! babelqueue processing recover-legacy payments --yes
//! babelqueue outbox relay postgres://app@db/app --broker redis://broker:6379/0
//! ```
//!
//! Exit codes: 0 success, 1 error (connection, command, bad data), 2 usage error,
//! 3 `doctor` found problems in the store's layout.

mod doctor;
mod envelope;
mod outbox;
mod redis_cmds;
mod report;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Exit code of `doctor` when the store's layout has problems.
const EXIT_PROBLEMS: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "babelqueue",
    version,
    about = "Look at BabelQueue queues, dead letters and idempotency stores",
    long_about = "Look at BabelQueue queues, dead letters and idempotency stores.\n\n\
        Queues live on Redis (the reliable-queue list layout every BabelQueue SDK shares); \
        stores on Redis, PostgreSQL or SQLite.\n\n\
        Exit codes: 0 success, 1 error, 2 usage error, 3 `doctor` found problems."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Queue depth: ready, in flight per consumer, delayed, dead letters, consumers.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Dead letters of a queue (`<queue>.dlq`): list, requeue, recover poison.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Check that a live store has the cross-SDK layout; list leftover leases and
    /// expired rows.
    Doctor(DoctorArgs),
    /// Processing lists (messages reserved by consumers).
    #[command(subcommand)]
    Processing(ProcessingCommand),
    /// Transactional outbox: publish the rows applications wrote in their own
    /// transactions.
    #[command(subcommand)]
    Outbox(OutboxCommand),
}

#[derive(Debug, Subcommand)]
enum OutboxCommand {
    /// Publishes the outbox's rows to the broker, byte for byte, marking each published
    /// once Redis accepted it; failures are recorded on the row and retried with backoff.
    /// Several relays may run at once (each row goes to one of them).
    Relay {
        /// The database holding the outbox: `postgres://…` (woken by LISTEN/NOTIFY), or
        /// `sqlite:<path>` (polled).
        db_url: String,
        /// Redis URL of the broker to publish to (`redis://`, or `rediss://` for TLS).
        #[arg(
            long,
            env = "BROKER_URL",
            default_value = "redis://127.0.0.1:6379/0",
            value_name = "URL"
        )]
        broker: String,
        /// The outbox table.
        #[arg(long, default_value = "babelqueue_outbox")]
        table: String,
        /// Rows claimed per pass.
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Longest wait between passes when the outbox is empty, in milliseconds.
        #[arg(long, default_value_t = 200, value_name = "MS")]
        poll_ms: u64,
        /// Publish what is due, then exit (default: run until Ctrl-C).
        #[arg(long)]
        once: bool,
    },
}

#[derive(Debug, Args)]
struct Broker {
    /// Redis URL of the broker (`redis://`, or `rediss://` for TLS).
    #[arg(
        long,
        env = "BROKER_URL",
        default_value = "redis://127.0.0.1:6379/0",
        value_name = "URL"
    )]
    url: String,
}

#[derive(Debug, Subcommand)]
enum QueueCommand {
    /// Counts of a queue: ready (`LLEN <queue>`), in flight (the legacy shared
    /// `<queue>:processing` list and each consumer's `{<queue>}:processing:<id>`),
    /// delayed (`{<queue>}:delayed`), dead letters (`<queue>.dlq`), live consumers
    /// (`{<queue>}:heartbeat:<id>`) and the consumer registry (`{<queue>}:consumers`,
    /// with the ones whose heartbeat expired).
    Stats {
        /// The queue name.
        queue: String,
        #[command(flatten)]
        broker: Broker,
        /// The dead-letter queue (default `<queue>.dlq`).
        #[arg(long, value_name = "QUEUE")]
        dlq: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// Lists dead letters, oldest first: meta.id, reason, attempts, failed_at, error.
    List {
        /// The queue whose dead letters to list.
        queue: String,
        #[command(flatten)]
        broker: Broker,
        /// The dead-letter queue (default `<queue>.dlq`).
        #[arg(long, value_name = "QUEUE")]
        dlq: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print JSON (one object per line) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Moves dead letters back to `<queue>`: the `dead_letter` block is removed (every
    /// other field and its order kept) and `attempts` reset to 0. Poison wrappers are
    /// skipped (see `recover-poison`).
    Requeue {
        /// The queue to requeue into; its dead letters are read from `<queue>.dlq`.
        queue: String,
        #[command(flatten)]
        broker: Broker,
        /// The dead-letter queue (default `<queue>.dlq`).
        #[arg(long, value_name = "QUEUE")]
        dlq: Option<String>,
        /// Requeue the dead letter(s) with this meta.id.
        #[arg(
            long,
            value_name = "META_ID",
            required_unless_present = "all",
            conflicts_with = "all"
        )]
        id: Option<String>,
        /// Requeue every dead letter.
        #[arg(long)]
        all: bool,
        /// Keep `attempts` as it is (default: reset to 0, a fresh set of retries).
        #[arg(long)]
        keep_attempts: bool,
    },
    /// Puts the original bytes of poison wrappers (bodies that were not an accepted
    /// envelope, dead-lettered as `urn:babel:poison`) back on a queue.
    RecoverPoison {
        /// The queue whose dead letters to read (`<queue>.dlq`).
        queue: String,
        #[command(flatten)]
        broker: Broker,
        /// The dead-letter queue (default `<queue>.dlq`).
        #[arg(long, value_name = "QUEUE")]
        dlq: Option<String>,
        /// Push the original bytes here (default: `<queue>`, where they will fail
        /// again unless the consumer was fixed).
        #[arg(long, value_name = "QUEUE")]
        to: Option<String>,
    },
}

#[derive(Debug, Args)]
struct DoctorArgs {
    /// The store: `redis://…`/`rediss://…`, `postgres://…`/`postgresql://…` (sslmode
    /// honoured), or a SQLite file path (`sqlite://path` also accepted).
    store_url: String,
    /// Table name (PostgreSQL, SQLite).
    #[arg(long, default_value = "babelqueue_idempotency")]
    table: String,
    /// Key prefix (Redis).
    #[arg(long, default_value = "bq:idemp:")]
    prefix: String,
    /// How many keys or rows to inspect / list at most.
    #[arg(long, default_value_t = 1000)]
    sample: usize,
}

#[derive(Debug, Subcommand)]
enum ProcessingCommand {
    /// Moves every message of the legacy shared `<queue>:processing` list back to the
    /// head of `<queue>`. UNSAFE while any consumer (of any SDK) that uses that list
    /// runs: it would redeliver messages they are processing. Needs `--yes`.
    RecoverLegacy {
        /// The queue.
        queue: String,
        #[command(flatten)]
        broker: Broker,
        /// Confirm that no consumer uses `<queue>:processing` right now.
        #[arg(long)]
        yes: bool,
    },
}

/// A command that failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// Redis answered with an error or could not be reached.
    #[error("{0}")]
    Redis(String, #[source] redis::RedisError),
    /// PostgreSQL.
    #[error("{0}")]
    Postgres(String, #[source] Box<dyn std::error::Error + Send + Sync>),
    /// SQLite.
    #[error("{0}")]
    Sqlite(String, #[source] rusqlite::Error),
    /// Anything else, said in full.
    #[error("{0}")]
    Message(String),
    /// The user must confirm.
    #[error("{0}")]
    Refused(String),
}

impl CliError {
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Refused(_) => 2,
            _ => 1,
        }
    }
}

pub(crate) fn redis_err(context: impl Into<String>) -> impl FnOnce(redis::RedisError) -> CliError {
    let context = context.into();
    move |e| CliError::Redis(context, e)
}

fn print_chain(e: &dyn std::error::Error) {
    let mut text = format!("error: {e}");
    let mut cur = e.source();
    while let Some(c) = cur {
        let cause = c.to_string();
        // Some errors (redis) already print their cause: do not say it twice.
        if !text.ends_with(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        cur = c.source();
    }
    eprintln!("{text}");
}

fn dlq_name(queue: &str, dlq: Option<String>) -> String {
    dlq.unwrap_or_else(|| format!("{queue}.dlq"))
}

async fn run(cli: Cli) -> Result<u8, CliError> {
    match cli.command {
        Command::Queue(QueueCommand::Stats {
            queue,
            broker,
            dlq,
            json,
        }) => {
            let mut conn = redis_cmds::connect(&broker.url).await?;
            let stats = redis_cmds::stats(&mut conn, &queue, &dlq_name(&queue, dlq)).await?;
            if json {
                println!("{}", stats.to_json());
            } else {
                print!("{}", stats.to_text());
            }
            Ok(0)
        }
        Command::Dlq(DlqCommand::List {
            queue,
            broker,
            dlq,
            limit,
            json,
        }) => {
            let mut conn = redis_cmds::connect(&broker.url).await?;
            redis_cmds::dlq_list(&mut conn, &dlq_name(&queue, dlq), limit, json).await?;
            Ok(0)
        }
        Command::Dlq(DlqCommand::Requeue {
            queue,
            broker,
            dlq,
            id,
            all,
            keep_attempts,
        }) => {
            let selector = match (id, all) {
                (Some(id), false) => redis_cmds::Select::Id(id),
                (None, true) => redis_cmds::Select::All,
                _ => {
                    return Err(CliError::Refused(
                        "give exactly one of --id ID or --all".into(),
                    ));
                }
            };
            let mut conn = redis_cmds::connect(&broker.url).await?;
            redis_cmds::dlq_requeue(
                &mut conn,
                &queue,
                &dlq_name(&queue, dlq),
                &selector,
                keep_attempts,
            )
            .await?;
            Ok(0)
        }
        Command::Dlq(DlqCommand::RecoverPoison {
            queue,
            broker,
            dlq,
            to,
        }) => {
            let mut conn = redis_cmds::connect(&broker.url).await?;
            let target = to.unwrap_or_else(|| queue.clone());
            redis_cmds::recover_poison(&mut conn, &dlq_name(&queue, dlq), &target).await?;
            Ok(0)
        }
        Command::Doctor(args) => {
            let report =
                doctor::run(&args.store_url, &args.table, &args.prefix, args.sample).await?;
            print!("{}", report.text());
            Ok(if report.problems() > 0 {
                EXIT_PROBLEMS
            } else {
                0
            })
        }
        Command::Processing(ProcessingCommand::RecoverLegacy { queue, broker, yes }) => {
            let list = format!("{queue}:processing");
            let warning = format!(
                "WARNING: moving every message of the legacy shared list {list} back to {queue}. \
                 Consumers of every SDK (Go, Python, PHP, Java, Node, .NET, older Rust) reserve into \
                 {list}: any of them still running will have the messages it is processing \
                 delivered a second time. Stop them first."
            );
            eprintln!("{warning}");
            if !yes {
                return Err(CliError::Refused(format!(
                    "not moving anything without --yes (confirm that no consumer uses {list})"
                )));
            }
            let mut conn = redis_cmds::connect(&broker.url).await?;
            let moved = redis_cmds::recover_legacy(&mut conn, &queue).await?;
            println!("moved {moved} message(s) from {list} back to {queue}");
            Ok(0)
        }
        Command::Outbox(OutboxCommand::Relay {
            db_url,
            broker,
            table,
            batch,
            poll_ms,
            once,
        }) => {
            let stats = outbox::relay(&outbox::Settings {
                db_url,
                broker,
                table,
                batch,
                poll: std::time::Duration::from_millis(poll_ms),
                once,
            })
            .await?;
            println!(
                "published {} row(s), {} failed publish(es) recorded",
                stats.published, stats.failed
            );
            Ok(0)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            print_chain(&e);
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            print_chain(&e);
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn requeue_needs_id_or_all_but_not_both() {
        assert!(Cli::try_parse_from(["babelqueue", "dlq", "requeue", "q"]).is_err());
        assert!(
            Cli::try_parse_from(["babelqueue", "dlq", "requeue", "q", "--id", "x", "--all"])
                .is_err()
        );
        assert!(Cli::try_parse_from(["babelqueue", "dlq", "requeue", "q", "--all"]).is_ok());
    }
}
