//! Amazon SQS (`sqs://<region>?endpoint=<url>`, feature `sqs`): what only SQS does for the
//! CLI. Queues are never created by a command (a missing queue is an error).

use babelqueue_sqs::SqsTransport;
use babelqueue_sqs::aws_sdk_sqs::types::QueueAttributeName;

use crate::CliError;
use crate::dead_letters::print_list;
use crate::redrive_cmd::chain_text;

/// How long listed dead letters stay invisible while the listing runs; they are made
/// visible again (`ChangeMessageVisibility` to 0) as soon as it is done.
const LIST_VISIBILITY: i32 = 30;

/// What the counts of `queue stats` mean on SQS.
pub(crate) const STATS_NOTE: &str = "SQS's approximate counts: ApproximateNumberOfMessages, \
    ApproximateNumberOfMessagesDelayed and ApproximateNumberOfMessagesNotVisible";

/// The transport for `url`, which creates no queue.
pub(crate) async fn connect(url: &str) -> Result<SqsTransport, CliError> {
    SqsTransport::connect(url)
        .await
        .map(|t| t.create_queues(false))
        .map_err(|e| CliError::Message(format!("cannot use SQS: {}", chain_text(&e))))
}

fn sdk<E: std::error::Error>(what: String) -> impl FnOnce(E) -> CliError {
    move |e| CliError::Message(format!("{what}: {}", chain_text(&e)))
}

/// `dlq list`: receives up to `limit` dead letters of `dlq` (a receive hides them for
/// [`LIST_VISIBILITY`] s and counts as a receive), prints them, then makes each visible
/// again at once. Nothing is deleted.
pub(crate) async fn dlq_list(
    t: &SqsTransport,
    dlq: &str,
    limit: usize,
    json: bool,
) -> Result<(), CliError> {
    let url = t
        .queue_url(dlq)
        .await
        .map_err(|e| CliError::Message(format!("{dlq}: {}", chain_text(&e))))?;
    let client = t.client();
    let attrs = client
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .map_err(sdk(format!("GetQueueAttributes of {dlq}")))?;
    let total = attrs
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let mut bodies = Vec::new();
    let mut receipts = Vec::new();
    let mut failure = None;
    // Until `limit`, or every counted one, or a long poll that brings nothing (a short
    // poll samples only some of SQS's servers: an empty answer proves nothing).
    while bodies.len() < limit && (bodies.len() as u64) < total.max(1) {
        let want = (limit - bodies.len()).min(10) as i32;
        let got = client
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(want)
            .visibility_timeout(LIST_VISIBILITY)
            .wait_time_seconds(1)
            .send()
            .await;
        match got {
            Ok(out) => {
                let messages = out.messages.unwrap_or_default();
                if messages.is_empty() {
                    break;
                }
                for m in messages {
                    bodies.push(m.body.unwrap_or_default().into_bytes());
                    if let Some(r) = m.receipt_handle {
                        receipts.push(r);
                    }
                }
            }
            Err(e) => {
                failure = Some(sdk(format!("ReceiveMessage of {dlq}"))(e));
                break;
            }
        }
    }
    // Visible again before anything else can fail.
    for r in &receipts {
        if let Err(e) = client
            .change_message_visibility()
            .queue_url(&url)
            .receipt_handle(r)
            .visibility_timeout(0)
            .send()
            .await
        {
            eprintln!(
                "warning: a listed dead letter stays hidden for up to {LIST_VISIBILITY} s: {}",
                chain_text(&e)
            );
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    print_list(dlq, total.max(bodies.len() as u64), &bodies, json);
    Ok(())
}
