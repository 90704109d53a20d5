//! `babelqueue`: look at BabelQueue queues, dead letters and stores from a shell.
//!
//! ```text
//! babelqueue queue stats payments
//! babelqueue dlq list payments --limit 20
//! babelqueue dlq requeue payments --id 2f1c…
//! babelqueue dlq recover-poison payments --to payments.poison
//! babelqueue dlq redrive payments --dry-run
//! babelqueue dlq redrive payments --bypass --reason failed
//! babelqueue doctor postgres://app@db/app
//! babelqueue processing recover-legacy payments --yes
//! babelqueue outbox relay postgres://app@db/app --broker redis://broker:6379/0
//! BROKER_URL=amqp://guest:guest@127.0.0.1:5672/%2f babelqueue dlq requeue payments --all
//! ```
//!
//! The broker URL's scheme decides the broker: `redis://`/`rediss://` (the default),
//! `amqp://`/`amqps://` (RabbitMQ), `sqs://<region>?endpoint=<url>` (Amazon SQS, built with
//! the feature `sqs`) or `kafka://host:port[,host:port][?group=…]` (Kafka, feature
//! `kafka`): `queue stats` and every `dlq` command speak all four; `processing` is
//! Redis only.
//!
//! Exit codes: 0 success, 1 error (connection, command, bad data), 2 usage error,
//! 3 `doctor` found problems in the store's layout.

mod amqp_cmds;
mod dead_letters;
mod doctor;
mod envelope;
#[cfg(feature = "kafka")]
mod kafka_cmds;
mod outbox;
mod redis_cmds;
mod redrive_cmd;
mod report;
#[cfg(feature = "sqs")]
mod sqs_cmds;
#[cfg(any(feature = "sqs", feature = "kafka"))]
mod transport_cmds;

use std::process::ExitCode;

use babelqueue_core::binding::{AmqpUrl, BrokerUrl};
use clap::{Args, Parser, Subcommand};

/// Exit code of `doctor` when the store's layout has problems.
const EXIT_PROBLEMS: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "babelqueue",
    version,
    about = "Look at BabelQueue queues, dead letters and idempotency stores",
    long_about = "Look at BabelQueue queues, dead letters and idempotency stores.\n\n\
        Queues live on Redis (the reliable-queue list layout every BabelQueue SDK shares) or \
        on RabbitMQ (`<queue>`, `<queue>.dlq`, `<queue>.delay.<ms>`, as every SDK declares them): \
        on Amazon SQS (`<queue>`, `<queue>-dlq`) or Kafka (`<queue>`, `<queue>.retry.<n>`, \
        `<queue>.dlq`): the scheme of --broker/BROKER_URL decides (`redis://` is the default, \
        `amqp://` or `amqps://` is RabbitMQ, `sqs://<region>?endpoint=<url>` is SQS, \
        `kafka://host:port` is Kafka; SQS and Kafka need the CLI built with the features `sqs` \
        and `kafka`). Stores live on Redis, PostgreSQL or SQLite.\n\n\
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
    /// Dead letters of a queue (`<queue>.dlq`): list, redrive, requeue, recover poison.
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
    /// The broker: Redis (`redis://`, `rediss://` for TLS), RabbitMQ (`amqp://user:pass@host:port/vhost`,
    /// the vhost URL-encoded, `%2f` is `/`; `amqps://` for TLS), Amazon SQS
    /// (`sqs://<region>?endpoint=<url>`, feature `sqs`) or Kafka (`kafka://host:port[,…]`,
    /// feature `kafka`). The scheme decides.
    #[arg(
        long,
        visible_alias = "broker",
        env = "BROKER_URL",
        default_value = "redis://127.0.0.1:6379/0",
        value_name = "URL"
    )]
    url: String,
}

#[derive(Debug, Subcommand)]
enum QueueCommand {
    /// Counts of a queue.
    ///
    /// Redis: ready (`LLEN <queue>`), in flight (the legacy shared
    /// `<queue>:processing` list and each consumer's `{<queue>}:processing:<id>`),
    /// delayed (`{<queue>}:delayed`), dead letters (`<queue>.dlq`), live consumers
    /// (`{<queue>}:heartbeat:<id>`) and the consumer registry (`{<queue>}:consumers`,
    /// with the ones whose heartbeat expired).
    ///
    /// RabbitMQ: by passive declares (a missing queue is reported as missing, never
    /// created): ready messages and consumers of `<queue>` and `<queue>.dlq`, and the
    /// messages of each delay queue `<queue>.delay.<ms>` of every bucket the transport
    /// can use. AMQP 0-9-1 does not report unacknowledged (in-flight) messages nor list
    /// queues (the management API does): in flight is "unknown".
    ///
    /// SQS: the queue's approximate counts (visible, delayed, not visible) and those of
    /// `<queue>-dlq`. Kafka: the records the consumer group has not committed on the
    /// topic `<queue>` and on `<queue>.dlq`.
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
    ///
    /// Never takes them. On RabbitMQ they are fetched with `basic.get` without
    /// acknowledgement on one channel, which is then closed: the broker puts them back
    /// unchanged, but marked redelivered. On SQS they are received (hidden for 30 s, a
    /// receive counted) and made visible again at once. On Kafka the records the group
    /// has not committed are read without joining the group or committing.
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
    ///
    /// RabbitMQ: each selected dead letter is published (publisher confirms) to its
    /// `dead_letter.original_queue`, else `<queue>`, with its own headers and the
    /// binding's properties, and only then acknowledged on the dead-letter queue. The
    /// others (and poison wrappers, and bodies that are not JSON) stay there, marked
    /// redelivered.
    ///
    /// SQS and Kafka: a redrive of the selected dead letters (see `redrive`);
    /// `--keep-attempts` is refused there.
    Requeue {
        /// The queue to requeue into; its dead letters are read from `<queue>.dlq`. On
        /// RabbitMQ a dead letter's `dead_letter.original_queue` wins when it has one.
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
    /// Redrives dead letters (the family's redrive, ADR-0026): each back to its
    /// `dead_letter.original_queue` (else `meta.queue`) or to `--to`, with the
    /// `dead_letter` block removed and `attempts` reset to 0 (everything else kept).
    ///
    /// The DLQ is drained first (up to `--max`), then each message is handled: re-published,
    /// and only then acknowledged on the DLQ. Not selected (`--reason`, `--urn`), a dry
    /// run, a poison record, an undecodable body, a non-numeric `attempts`, no target:
    /// restored to the DLQ unchanged. With `--bypass` the re-published messages carry the
    /// transport header `bq-replay-bypass: 1`: handlers see a replay (`is_replay()`) and
    /// skip their external effects. Redis, RabbitMQ, SQS and Kafka. (`requeue` stays as the older,
    /// narrower command: by meta.id, no dry run, no bypass.)
    Redrive {
        /// The queue whose dead letters to redrive (`<queue>.dlq`).
        queue: String,
        #[command(flatten)]
        broker: Broker,
        /// The dead-letter queue (default `<queue>.dlq`).
        #[arg(long, value_name = "QUEUE")]
        dlq: Option<String>,
        /// Re-publish every message here (a sandbox) instead of its own source queue.
        #[arg(long, value_name = "QUEUE")]
        to: Option<String>,
        /// Take at most this many messages off the DLQ (0: all).
        #[arg(long, value_name = "N", default_value_t = 0)]
        max: usize,
        /// Print the plan; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Only dead letters with this `dead_letter.reason` (repeatable: any of them).
        #[arg(long, value_name = "REASON")]
        reason: Vec<String>,
        /// Only dead letters of this URN (repeatable: any of them).
        #[arg(long, value_name = "URN")]
        urn: Vec<String>,
        /// Stamp `bq-replay-bypass` so handlers skip external effects (a replay).
        #[arg(long)]
        bypass: bool,
        /// Print the result as one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Puts the original bytes of poison wrappers (bodies that were not an accepted
    /// envelope, dead-lettered as `urn:babel:poison`) back on a queue.
    ///
    /// RabbitMQ: published with publisher confirms, then acknowledged on the dead-letter
    /// queue; every other dead letter stays (marked redelivered). SQS and Kafka: the DLQ
    /// is drained like a redrive; every other dead letter is put back (re-published).
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
    /// honoured), or a SQLite file path (`sqlite://path` also accepted). A broker
    /// without a store (`amqp://`) is refused.
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
    /// runs: it would redeliver messages they are processing. Needs `--yes`. Redis
    /// only: RabbitMQ has no processing lists (it puts a closed channel's unacknowledged
    /// messages back itself).
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
    /// RabbitMQ refused or could not be reached.
    #[error("{0}")]
    Amqp(String, #[source] Box<dyn std::error::Error + Send + Sync>),
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
    /// The command has no meaning on the broker or URL given.
    #[error("{0}")]
    Unsupported(String),
}

impl CliError {
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Refused(_) | CliError::Unsupported(_) => 2,
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

/// The broker a URL names: its scheme decides.
enum Target {
    /// `redis://`, `rediss://`, and whatever else the Redis client is handed unchanged
    /// (it says what is wrong with it).
    Redis(String),
    /// `amqp://`, `amqps://`.
    Amqp(AmqpUrl),
    /// `sqs://…` (as given; the transport parses it).
    Sqs(String),
    /// `kafka://…` (as given; the transport parses it).
    Kafka(String),
}

/// The error for a broker this build of the CLI does not include.
#[cfg(not(all(feature = "sqs", feature = "kafka")))]
fn not_built(feature: &str) -> CliError {
    CliError::Unsupported(format!(
        "this babelqueue was built without {feature}:// support: \
         `cargo install babelqueue-cli --features {feature}`"
    ))
}

/// Runs `$body` with `$t` the SQS transport of `$url`, or says the build has no SQS.
macro_rules! on_sqs {
    ($url:expr, |$t:ident| $body:expr) => {{
        #[cfg(feature = "sqs")]
        {
            let $t = sqs_cmds::connect(&$url).await?;
            $body
        }
        #[cfg(not(feature = "sqs"))]
        {
            let _ = &$url;
            return Err(not_built("sqs"));
        }
    }};
}

/// Runs `$body` with `$t` the Kafka transport of `$url`, or says the build has no Kafka.
macro_rules! on_kafka {
    ($url:expr, |$t:ident| $body:expr) => {{
        #[cfg(feature = "kafka")]
        {
            let $t = kafka_cmds::connect(&$url)?;
            $body
        }
        #[cfg(not(feature = "kafka"))]
        {
            let _ = &$url;
            return Err(not_built("kafka"));
        }
    }};
}

/// The dead-letter queue of `queue` on the broker of `t` (SQS: `<queue>-dlq`).
#[cfg(any(feature = "sqs", feature = "kafka"))]
fn dlq_of<T: babelqueue_runtime::Transport>(t: &T, queue: &str, dlq: Option<String>) -> String {
    dlq.or_else(|| t.dead_letter_queue(queue, ".dlq"))
        .unwrap_or_else(|| format!("{queue}.dlq"))
}

fn target(url: &str) -> Result<Target, CliError> {
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    match BrokerUrl::parse(url) {
        Ok(BrokerUrl::Amqp(u)) => Ok(Target::Amqp(u)),
        Ok(BrokerUrl::Sqs(_)) => Ok(Target::Sqs(url.to_owned())),
        Ok(BrokerUrl::Kafka(_)) => Ok(Target::Kafka(url.to_owned())),
        Err(e) if scheme == "amqp" || scheme == "amqps" => {
            Err(CliError::Message(format!("invalid AMQP URL: {e}")))
        }
        Err(e) if scheme == "sqs" || scheme == "kafka" => {
            Err(CliError::Message(format!("invalid broker URL: {e}")))
        }
        Ok(BrokerUrl::Redis { .. }) | Err(_) => Ok(Target::Redis(url.to_owned())),
        Ok(other) => Err(CliError::Unsupported(format!(
            "the babelqueue CLI does not speak {}:// brokers",
            other.broker()
        ))),
    }
}

/// The error of a Redis-only command given another broker's URL.
fn redis_only(command: &str, broker: &str, why: &str) -> CliError {
    CliError::Unsupported(format!("`{command}` has no meaning on {broker}: {why}"))
}

async fn run(cli: Cli) -> Result<u8, CliError> {
    match cli.command {
        Command::Queue(QueueCommand::Stats {
            queue,
            broker,
            dlq,
            json,
        }) => {
            let (json_out, text) = match target(&broker.url)? {
                Target::Redis(url) => {
                    let dlq = dlq_name(&queue, dlq);
                    let mut conn = redis_cmds::connect(&url).await?;
                    let stats = redis_cmds::stats(&mut conn, &queue, &dlq).await?;
                    (stats.to_json(), stats.to_text())
                }
                Target::Amqp(url) => {
                    let dlq = dlq_name(&queue, dlq);
                    let b = amqp_cmds::Broker::connect(&url).await?;
                    let stats = amqp_cmds::stats(&b, &queue, &dlq).await;
                    b.close().await;
                    let stats = stats?;
                    (stats.to_json(), stats.to_text())
                }
                Target::Sqs(url) => on_sqs!(url, |t| {
                    let dlq = dlq_of(&t, &queue, dlq);
                    transport_cmds::stats(&t, "sqs", &queue, &dlq, sqs_cmds::STATS_NOTE, json)
                        .await?;
                    return Ok(0);
                }),
                Target::Kafka(url) => on_kafka!(url, |t| {
                    let dlq = dlq_of(&t, &queue, dlq);
                    transport_cmds::stats(&t, "kafka", &queue, &dlq, kafka_cmds::STATS_NOTE, json)
                        .await?;
                    return Ok(0);
                }),
            };
            if json {
                println!("{json_out}");
            } else {
                print!("{text}");
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
            match target(&broker.url)? {
                Target::Redis(url) => {
                    let dlq = dlq_name(&queue, dlq);
                    let mut conn = redis_cmds::connect(&url).await?;
                    redis_cmds::dlq_list(&mut conn, &dlq, limit, json).await?;
                }
                Target::Amqp(url) => {
                    let dlq = dlq_name(&queue, dlq);
                    let b = amqp_cmds::Broker::connect(&url).await?;
                    let done = amqp_cmds::dlq_list(&b, &dlq, limit, json).await;
                    b.close().await;
                    done?;
                }
                Target::Sqs(url) => on_sqs!(url, |t| {
                    let dlq = dlq_of(&t, &queue, dlq);
                    sqs_cmds::dlq_list(&t, &dlq, limit, json).await?;
                }),
                Target::Kafka(url) => on_kafka!(url, |t| {
                    let dlq = dlq_of(&t, &queue, dlq);
                    kafka_cmds::dlq_list(&t, &dlq, limit, json).await?;
                }),
            }
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
                (Some(id), false) => dead_letters::Select::Id(id),
                (None, true) => dead_letters::Select::All,
                _ => {
                    return Err(CliError::Refused(
                        "give exactly one of --id ID or --all".into(),
                    ));
                }
            };
            match target(&broker.url)? {
                Target::Redis(url) => {
                    let dlq = dlq_name(&queue, dlq);
                    let mut conn = redis_cmds::connect(&url).await?;
                    redis_cmds::dlq_requeue(&mut conn, &queue, &dlq, &selector, keep_attempts)
                        .await?;
                }
                Target::Sqs(url) => on_sqs!(url, |t| {
                    let dlq = dlq_of(&t, &queue, dlq);
                    transport_cmds::requeue(&t, &dlq, selector, keep_attempts).await?;
                }),
                Target::Kafka(url) => on_kafka!(url, |t| {
                    let dlq = dlq_of(&t, &queue, dlq);
                    transport_cmds::requeue(&t, &dlq, selector, keep_attempts).await?;
                }),
                Target::Amqp(url) => {
                    let dlq = dlq_name(&queue, dlq);
                    let b = amqp_cmds::Broker::connect(&url).await?;
                    let done =
                        amqp_cmds::dlq_requeue(&b, &queue, &dlq, &selector, keep_attempts).await;
                    b.close().await;
                    done?;
                }
            }
            Ok(0)
        }
        Command::Dlq(DlqCommand::Redrive {
            queue,
            broker,
            dlq,
            to,
            max,
            dry_run,
            reason,
            urn,
            bypass,
            json,
        }) => {
            let req = redrive_cmd::Request {
                dlq: dlq_name(&queue, dlq.clone()),
                to,
                max,
                dry_run,
                reasons: reason,
                urns: urn,
                bypass,
                json,
            };
            let open_err = |what: &str| {
                let what = what.to_owned();
                move |e: babelqueue_runtime::TransportError| {
                    CliError::Message(format!("{what}: {}", redrive_cmd::chain_text(&e)))
                }
            };
            match target(&broker.url)? {
                Target::Redis(url) => {
                    let t = babelqueue_redis::RedisTransport::connect(&url)
                        .await
                        .map_err(open_err("cannot connect to Redis"))?;
                    redrive_cmd::run(&t, &req).await?;
                }
                Target::Amqp(url) => {
                    let t = babelqueue_amqp::AmqpTransport::open(&url.to_url())
                        .await
                        .map_err(open_err("cannot connect to RabbitMQ"))?;
                    redrive_cmd::run(&t, &req).await?;
                }
                Target::Sqs(url) => on_sqs!(url, |t| {
                    let req = redrive_cmd::Request {
                        dlq: dlq_of(&t, &queue, dlq),
                        ..req
                    };
                    redrive_cmd::run(&t, &req).await?;
                }),
                Target::Kafka(url) => on_kafka!(url, |t| {
                    let req = redrive_cmd::Request {
                        dlq: dlq_of(&t, &queue, dlq),
                        ..req
                    };
                    redrive_cmd::run(&t, &req).await?;
                }),
            }
            Ok(0)
        }
        Command::Dlq(DlqCommand::RecoverPoison {
            queue,
            broker,
            dlq,
            to,
        }) => {
            let to = to.unwrap_or_else(|| queue.clone());
            match target(&broker.url)? {
                Target::Sqs(url) => on_sqs!(url, |t| {
                    let dlq = dlq_of(&t, &queue, dlq);
                    transport_cmds::recover_poison_all(&t, &dlq, &to).await?;
                }),
                Target::Kafka(url) => on_kafka!(url, |t| {
                    let dlq = dlq_of(&t, &queue, dlq);
                    transport_cmds::recover_poison_all(&t, &dlq, &to).await?;
                }),
                Target::Redis(url) => {
                    let dlq = dlq_name(&queue, dlq);
                    let mut conn = redis_cmds::connect(&url).await?;
                    redis_cmds::recover_poison(&mut conn, &dlq, &to).await?;
                }
                Target::Amqp(url) => {
                    let dlq = dlq_name(&queue, dlq);
                    let b = amqp_cmds::Broker::connect(&url).await?;
                    let done = amqp_cmds::recover_poison(&b, &dlq, &to).await;
                    b.close().await;
                    done?;
                }
            }
            Ok(0)
        }
        Command::Doctor(args) => {
            if let Ok(BrokerUrl::Amqp(u)) = BrokerUrl::parse(&args.store_url) {
                let scheme = if u.tls { "amqps" } else { "amqp" };
                return Err(CliError::Unsupported(format!(
                    "`doctor` checks idempotency stores, and RabbitMQ ({scheme}://) is a broker, not a store: \
                     give the store the consumers use (STORE_URL: redis://, postgres://, or a SQLite file)"
                )));
            }
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
            let url = match target(&broker.url)? {
                Target::Redis(url) => url,
                Target::Amqp(u) => {
                    return Err(redis_only(
                        "processing recover-legacy",
                        &format!("RabbitMQ ({}://)", if u.tls { "amqps" } else { "amqp" }),
                        "there are no processing lists; the broker itself puts the unacknowledged \
                         messages of a closed channel back on their queue",
                    ));
                }
                Target::Sqs(_) => {
                    return Err(redis_only(
                        "processing recover-legacy",
                        "SQS (sqs://)",
                        "there are no processing lists; a received message becomes visible again \
                         when its visibility timeout runs out",
                    ));
                }
                Target::Kafka(_) => {
                    return Err(redis_only(
                        "processing recover-legacy",
                        "Kafka (kafka://)",
                        "there are no processing lists; what the group has not committed is read \
                         again after a rebalance",
                    ));
                }
            };
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
            let mut conn = redis_cmds::connect(&url).await?;
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
