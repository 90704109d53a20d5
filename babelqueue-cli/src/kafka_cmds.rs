//! Kafka (`kafka://host:port[,host:port][?group=…]`, feature `kafka`): what only Kafka does
//! for the CLI. Topics are never created by a command, and the retry topics are not
//! re-injected by it (that is the consumers' work).

use babelqueue_kafka::KafkaTransport;

use crate::CliError;
use crate::dead_letters::print_list;
use crate::redrive_cmd::chain_text;

/// What the counts of `queue stats` mean on Kafka.
pub(crate) const STATS_NOTE: &str = "Kafka: ready counts the records the consumer group has not \
    committed (records in flight in running consumers included); records parked on the retry \
    topics <queue>.retry.<n> are not counted";

/// The transport for `url`: no topic creation, no re-inject consumers.
pub(crate) fn connect(url: &str) -> Result<KafkaTransport, CliError> {
    KafkaTransport::builder(url)
        .and_then(|b| b.create_topics(false).reinject(false).build())
        .map_err(|e| CliError::Message(format!("cannot use Kafka: {}", chain_text(&e))))
}

/// `dlq list`: up to `limit` records of the dead-letter topic that the group has not
/// committed, read without joining the group and without committing: nothing changes.
pub(crate) async fn dlq_list(
    t: &KafkaTransport,
    dlq: &str,
    limit: usize,
    json: bool,
) -> Result<(), CliError> {
    let (total, bodies) = t
        .peek(dlq, limit)
        .await
        .map_err(|e| CliError::Message(format!("reading {dlq}: {}", chain_text(&e))))?;
    print_list(dlq, total, &bodies, json);
    Ok(())
}
