//! The commands on brokers the CLI reaches through their library transport (Amazon SQS
//! and Kafka): queue stats from [`Transport::depth`], requeue as a selective redrive, and
//! poison recovery drained like a redrive. Listing is each broker's own (see
//! `sqs_cmds` and `kafka_cmds`).

use std::time::Duration;

use babelqueue_runtime::redrive::RedriveOptions;
use babelqueue_runtime::{
    ConsumerOptions, Delivery, EventSink, Republish, Transport, TransportError, recover_poison,
};
use serde_json::json;

use crate::CliError;
use crate::dead_letters::Select;
use crate::redrive_cmd;

/// How long a drain waits for the next dead letter before it takes the DLQ as empty.
const DRAIN_WAIT: Duration = Duration::from_millis(1500);

/// How long a drain waits on, without a message arriving, while the transport says more
/// is on its way ([`Transport::next_due`]).
const DRAIN_PATIENCE: Duration = Duration::from_secs(30);

fn err(what: impl Into<String>) -> impl FnOnce(TransportError) -> CliError {
    let what = what.into();
    move |e| CliError::Message(format!("{what}: {}", redrive_cmd::chain_text(&e)))
}

/// `queue stats`: the depth of `queue` and of its dead-letter queue, as the transport
/// reports them. `note` says what the broker's counts mean.
pub(crate) async fn stats<T: Transport>(
    t: &T,
    broker: &str,
    queue: &str,
    dlq: &str,
    note: &str,
    json: bool,
) -> Result<(), CliError> {
    let q = t
        .depth(queue)
        .await
        .map_err(err(format!("reading the depth of {queue}")))?;
    let d = t
        .depth(dlq)
        .await
        .map_err(err(format!("reading the depth of {dlq}")))?;
    if json {
        println!(
            "{}",
            json!({
                "broker": broker,
                "queue": queue,
                "ready": q.ready,
                "delayed": q.delayed,
                "in_flight": q.in_flight,
                "dead_letter_queue": dlq,
                "dead_letters": d.ready + d.delayed + d.in_flight,
                "note": note,
            })
        );
    } else {
        println!("queue {queue} ({broker})");
        println!("  ready:        {}", q.ready);
        println!("  delayed:      {}", q.delayed);
        println!("  in flight:    {}", q.in_flight);
        println!(
            "  dead letters: {} ({dlq})",
            d.ready + d.delayed + d.in_flight
        );
        println!("  ({note})");
    }
    Ok(())
}

/// `dlq requeue`: a redrive of the selected dead letters back to their
/// `dead_letter.original_queue` (else `meta.queue`), `attempts` reset.
pub(crate) async fn requeue<T: Transport>(
    t: &T,
    dlq: &str,
    select: Select,
    keep_attempts: bool,
) -> Result<(), CliError> {
    if keep_attempts {
        return Err(CliError::Unsupported(
            "--keep-attempts is Redis and RabbitMQ only: on SQS and Kafka `dlq requeue` is a \
             redrive, which resets `attempts` (the family's rule)"
                .into(),
        ));
    }
    let mut options = RedriveOptions::new().wait(DRAIN_WAIT);
    if let Select::Id(id) = select {
        options = options.select(move |env| env.meta.id == id);
    }
    let req = redrive_cmd::Request {
        dlq: dlq.to_owned(),
        to: None,
        max: 0,
        dry_run: false,
        reasons: Vec::new(),
        urns: Vec::new(),
        bypass: false,
        json: false,
    };
    redrive_cmd::run_with(t, &req, options).await
}

/// `dlq recover-poison`: every poison record of `dlq` is replaced by the original bytes
/// it holds, published to `to` (then the record is acknowledged); every other dead letter
/// is put back unchanged.
pub(crate) async fn recover_poison_all<T: Transport>(
    t: &T,
    dlq: &str,
    to: &str,
) -> Result<(), CliError> {
    let (events, _rx) = EventSink::channel();
    let consumer = ConsumerOptions::new(usize::from(u16::MAX)).with_events(events);
    t.start_consumer(dlq, &consumer)
        .await
        .map_err(err(format!("starting a consumer of {dlq}")))?;
    let mut batch: Vec<Delivery> = Vec::new();
    let mut idle_since = std::time::Instant::now();
    let drained = loop {
        match t.reserve(dlq, DRAIN_WAIT).await {
            Ok(Some(d)) => {
                batch.push(d);
                idle_since = std::time::Instant::now();
            }
            // More on its way (Kafka: the partitions not assigned yet)? Then wait on.
            Ok(None) => match t.next_due(dlq).await {
                Ok(Some(_)) if idle_since.elapsed() < DRAIN_PATIENCE => {}
                _ => break Ok(()),
            },
            Err(e) => break Err(e),
        }
    };
    let (mut recovered, mut kept) = (0usize, 0usize);
    let mut failure = drained.err().map(|e| err(format!("reading {dlq}"))(e));
    for d in &batch {
        let original = if failure.is_none() {
            recover_poison(d.body())
        } else {
            None
        };
        if let Some(bytes) = original {
            match t.publish_raw(to, bytes).await {
                Ok(()) => match t.ack(d).await {
                    Ok(()) => {
                        recovered += 1;
                        continue;
                    }
                    Err(e) => {
                        // Published and still in the DLQ: said, not hidden.
                        failure = Some(err(format!(
                            "a poison body was published to {to} but its record could not be \
                             removed from {dlq} (it will be recovered twice)"
                        ))(e));
                        continue;
                    }
                },
                Err(e) => failure = Some(err(format!("publishing to {to}"))(e)),
            }
        }
        match t.requeue(d, Republish::unchanged(), Duration::ZERO).await {
            Ok(()) => kept += 1,
            Err(e) => {
                failure.get_or_insert_with(|| {
                    err(format!(
                        "putting a dead letter back on {dlq} (it returns when its lease runs out)"
                    ))(e)
                });
            }
        }
    }
    let _ = t.leave(dlq).await;
    println!(
        "recovered {recovered} poison message(s) from {dlq} to {to}; {kept} other dead letter(s) left"
    );
    failure.map_or(Ok(()), Err)
}
