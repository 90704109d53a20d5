//! The RabbitMQ commands (`amqp://`, `amqps://` brokers): queue stats, dead letters.
//!
//! Queues are the family's RabbitMQ layout, as `babelqueue-amqp` and the other SDKs
//! declare them: `<queue>` and `<queue>.dlq` (durable, no arguments) and the delay queues
//! of retries `<queue>.delay.<ms>` (one per delay bucket). Nothing here declares a queue
//! except `requeue`/`recover-poison` publishing to a target queue (declared as the family
//! does, so a missing target is created exactly as a consumer would create it).
//!
//! What AMQP 0-9-1 shows: a passive `queue.declare` answers a queue's **ready** messages
//! and its **consumers**, or `NOT_FOUND`. It does not show unacknowledged (in-flight)
//! messages, nor list queues: the management plugin's HTTP API does both, and this
//! command does not need it.

use std::collections::BTreeSet;
use std::time::Duration;

use babelqueue_amqp::lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use babelqueue_amqp::lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use babelqueue_amqp::lapin::types::{FieldTable, LongString, ShortString};
use babelqueue_amqp::lapin::{self, Channel, Connection, ConnectionProperties, ErrorKind};
use babelqueue_amqp::{AmqpTransport, MAX_DELAY, delay_bucket, delay_queue, out_of_band};
use babelqueue_core::binding::{AmqpUrl, BrokerUrl};
use babelqueue_runtime::Transport;
use serde_json::{Map, Value, json};

use crate::CliError;
use crate::dead_letters::{Select, Tally, print_list};
use crate::envelope::Element;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to the broker, and how to name it in messages (password hidden).
pub(crate) struct Broker {
    /// The URL in the client's normal form (for the transport's own connection).
    url: String,
    /// The URL as printed.
    shown: String,
    connection: Connection,
}

fn amqp_err(context: impl Into<String>) -> impl FnOnce(lapin::Error) -> CliError {
    let context = context.into();
    move |e| CliError::Amqp(context, Box::new(e))
}

fn is_not_found(e: &lapin::Error) -> bool {
    matches!(e.kind(), ErrorKind::ProtocolError(p) if p.kind() == &AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
}

/// `name` as an AMQP queue name (at most 255 bytes).
fn queue_name(name: &str) -> Result<ShortString, CliError> {
    ShortString::try_new(name).map_err(|e| {
        CliError::Message(format!(
            "`{}…` is not a valid AMQP queue name: {e}",
            name.chars().take(40).collect::<String>()
        ))
    })
}

impl Broker {
    /// Connects (10 s timeout).
    pub(crate) async fn connect(url: &AmqpUrl) -> Result<Broker, CliError> {
        let shown = BrokerUrl::Amqp(url.clone()).to_string();
        if url.tls && !cfg!(feature = "rustls") {
            return Err(CliError::Message(format!(
                "{shown}: amqps:// needs the `rustls` feature of babelqueue-cli"
            )));
        }
        let normal = url.to_url();
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from("babelqueue-cli"));
        let connection = tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(&normal, props))
            .await
            .map_err(|_| {
                CliError::Message(format!(
                    "cannot connect to RabbitMQ at {shown}: timed out after {CONNECT_TIMEOUT:?}"
                ))
            })?
            .map_err(amqp_err(format!("cannot connect to RabbitMQ at {shown}")))?;
        Ok(Broker {
            url: normal,
            shown,
            connection,
        })
    }

    async fn channel(&self) -> Result<Channel, CliError> {
        self.connection
            .create_channel()
            .await
            .map_err(amqp_err(format!("opening a channel on {}", self.shown)))
    }

    /// The transport of `babelqueue-amqp` on its own connection: publishes as every
    /// producer of the family does (declared queue, projection, publisher confirms).
    async fn transport(&self) -> Result<AmqpTransport, CliError> {
        AmqpTransport::open(&self.url).await.map_err(|e| {
            CliError::Amqp(
                format!("cannot connect to RabbitMQ at {}", self.shown),
                Box::new(e),
            )
        })
    }

    /// Closes the connection (what is still unacknowledged goes back to its queue).
    pub(crate) async fn close(self) {
        let _ = self
            .connection
            .close(200, ShortString::from("babelqueue-cli done"))
            .await;
    }
}

/// What a passive declare answers about a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QueueInfo {
    ready: u32,
    consumers: u32,
}

/// Passive declares: a `NOT_FOUND` closes the channel, so a new one is opened after it.
struct Prober<'a> {
    broker: &'a Broker,
    channel: Option<Channel>,
}

impl Prober<'_> {
    /// `queue`'s counts, `None` when it does not exist (nothing is created).
    async fn probe(&mut self, queue: &str) -> Result<Option<QueueInfo>, CliError> {
        let name = queue_name(queue)?;
        let channel = match self.channel.take() {
            Some(c) if c.status().connected() => c,
            _ => self.broker.channel().await?,
        };
        match channel
            .queue_declare(
                name,
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
        {
            Ok(q) => {
                self.channel = Some(channel);
                Ok(Some(QueueInfo {
                    ready: q.message_count(),
                    consumers: q.consumer_count(),
                }))
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(amqp_err(format!("passive declare of queue `{queue}`"))(e)),
        }
    }
}

/// Every delay bucket `babelqueue-amqp` can use, shortest first: 1 ms to [`MAX_DELAY`].
fn delay_buckets() -> Vec<Duration> {
    let mut out = Vec::new();
    let mut next = Duration::from_millis(1);
    loop {
        let bucket = delay_bucket(next);
        out.push(bucket);
        if bucket >= MAX_DELAY {
            return out;
        }
        next = bucket + Duration::from_millis(1);
    }
}

/// The counts of one queue on RabbitMQ.
pub(crate) struct Stats {
    queue: String,
    main: Option<QueueInfo>,
    dlq: String,
    dead: Option<QueueInfo>,
    /// The delay queues that exist: (name, messages).
    delays: Vec<(String, u32)>,
    /// How many delay-queue names were probed.
    probed: usize,
}

impl Stats {
    fn delayed(&self) -> u64 {
        self.delays.iter().map(|(_, n)| u64::from(*n)).sum()
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "broker": "amqp",
            "queue": self.queue,
            "exists": self.main.is_some(),
            "ready": self.main.map(|q| q.ready),
            "consumers": self.main.map(|q| q.consumers),
            // AMQP 0-9-1 does not report unacknowledged deliveries.
            "in_flight": Value::Null,
            "delayed": self.delayed(),
            "delay_queues": self
                .delays
                .iter()
                .map(|(name, n)| (name.clone(), Value::from(*n)))
                .collect::<Map<_, _>>(),
            "dlq": self.dlq,
            "dlq_exists": self.dead.is_some(),
            "dead_letters": self.dead.map(|q| q.ready),
            "dlq_consumers": self.dead.map(|q| q.consumers),
        })
    }

    pub(crate) fn to_text(&self) -> String {
        let q = &self.queue;
        let mut s = format!("queue         {q}  (RabbitMQ)\n");
        match self.main {
            Some(info) => {
                s += &format!("ready         {:<8}  ({q}: messages ready)\n", info.ready);
                s += "in flight     unknown   (AMQP 0-9-1 does not report unacknowledged deliveries; \
                      the management API does)\n";
                s += &format!("consumers     {:<8}  (on {q})\n", info.consumers);
            }
            None => s += &format!("ready         missing   (no queue {q} on the broker)\n"),
        }
        let detail = if self.delays.is_empty() {
            format!("no {q}.delay.<ms> queue among the {} buckets", self.probed)
        } else {
            self.delays
                .iter()
                .map(|(name, n)| format!("{name}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        s += &format!("delayed       {:<8}  ({detail})\n", self.delayed());
        match self.dead {
            Some(info) => {
                s += &format!("dead letters  {:<8}  ({})\n", info.ready, self.dlq);
                if info.consumers > 0 {
                    s += &format!(
                        "dlq consumers {:<8}  (on {}: they take dead letters away)\n",
                        info.consumers, self.dlq
                    );
                }
            }
            None => {
                s += &format!(
                    "dead letters  missing   (no queue {} on the broker)\n",
                    self.dlq
                )
            }
        }
        s
    }
}

/// Ready messages and consumers of `queue` and `dlq` and the messages of `queue`'s delay
/// queues, by passive declares (a missing queue is reported, never created).
pub(crate) async fn stats(broker: &Broker, queue: &str, dlq: &str) -> Result<Stats, CliError> {
    let mut prober = Prober {
        broker,
        channel: None,
    };
    let main = prober.probe(queue).await?;
    let dead = prober.probe(dlq).await?;
    let buckets = delay_buckets();
    let mut delays = Vec::new();
    for ttl in &buckets {
        let name = delay_queue(queue, *ttl);
        if let Some(info) = prober.probe(&name).await? {
            delays.push((name, info.ready));
        }
    }
    Ok(Stats {
        queue: queue.to_owned(),
        main,
        dlq: dlq.to_owned(),
        dead,
        delays,
        probed: buckets.len(),
    })
}

/// The number of messages ready in `dlq`, `None` (and a note on stderr) when it does not
/// exist.
async fn dead_letter_count(
    broker: &Broker,
    channel: &Channel,
    dlq: &str,
) -> Result<Option<u32>, CliError> {
    let name = queue_name(dlq)?;
    match channel
        .queue_declare(
            name,
            QueueDeclareOptions::default().passive(),
            FieldTable::default(),
        )
        .await
    {
        Ok(q) => Ok(Some(q.message_count())),
        Err(e) if is_not_found(&e) => {
            eprintln!(
                "no queue {dlq} on {} (nothing was dead-lettered there)",
                broker.shown
            );
            Ok(None)
        }
        Err(e) => Err(amqp_err(format!("passive declare of queue `{dlq}`"))(e)),
    }
}

/// Gets up to `limit` messages of `queue` on `channel` without acknowledging them.
async fn get_unacked(
    channel: &Channel,
    queue: &str,
    limit: usize,
) -> Result<Vec<lapin::message::BasicGetMessage>, CliError> {
    let mut out = Vec::new();
    while out.len() < limit {
        let got = channel
            .basic_get(queue_name(queue)?, BasicGetOptions { no_ack: false })
            .await
            .map_err(amqp_err(format!("basic.get on `{queue}`")))?;
        match got {
            Some(m) => out.push(m),
            None => break,
        }
    }
    Ok(out)
}

/// Lists up to `limit` dead letters of `dlq` without taking them: they are fetched
/// unacknowledged on one channel, which is then closed, so the broker puts them back
/// (marked redelivered).
pub(crate) async fn dlq_list(
    broker: &Broker,
    dlq: &str,
    limit: usize,
    json: bool,
) -> Result<(), CliError> {
    let channel = broker.channel().await?;
    let Some(total) = dead_letter_count(broker, &channel, dlq).await? else {
        if !json {
            println!("{dlq}: 0 dead letter(s), showing 0");
        }
        return Ok(());
    };
    let got = get_unacked(&channel, dlq, limit).await;
    // Put them back before anything else can fail.
    let _ = channel
        .close(200, ShortString::from("listed, not acknowledged"))
        .await;
    let items: Vec<Vec<u8>> = got?.into_iter().map(|m| m.delivery.data).collect();
    print_list(dlq, u64::from(total), &items, json);
    Ok(())
}

/// The queue a dead letter goes back to: its `dead_letter.original_queue`, else `queue`.
fn target_of<'a>(el: &'a Element, queue: &'a str) -> &'a str {
    el.dead_letter("original_queue")
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
        .unwrap_or(queue)
}

/// Moves the selected dead letters of `dlq` back to their `dead_letter.original_queue`
/// (else `queue`): each is published with the body rewritten as on Redis (block removed,
/// `attempts` reset unless `keep_attempts`, its out-of-band headers kept, the projection
/// written afresh), confirmed by the broker, and only then acknowledged on `dlq`. What is
/// not selected, poison wrappers and bodies that are not JSON objects stay in `dlq`.
pub(crate) async fn dlq_requeue(
    broker: &Broker,
    queue: &str,
    dlq: &str,
    select: &Select,
    keep_attempts: bool,
) -> Result<(), CliError> {
    let channel = broker.channel().await?;
    let mut tally = Tally::default();
    let Some(total) = dead_letter_count(broker, &channel, dlq).await? else {
        return tally.finish(dlq, queue, select);
    };
    let transport = broker.transport().await?;
    let mut targets = BTreeSet::new();
    // At most the dead letters there now (not those dead-lettered meanwhile, again and
    // again): the ones got and not acknowledged stay out of reach until the channel closes.
    for _ in 0..total {
        let Some(msg) = get_unacked(&channel, dlq, 1).await?.pop() else {
            break;
        };
        let delivery = msg.delivery;
        let el = Element::parse(&delivery.data);
        if !select.matches(&el) {
            continue;
        }
        tally.matched += 1;
        if el.job() == Some(babelqueue_runtime::POISON_URN) {
            tally.poison += 1;
            continue;
        }
        let target = target_of(&el, queue).to_owned();
        let id = el.meta_id().unwrap_or("-").to_owned();
        let Some(body) = el.requeued(keep_attempts) else {
            tally.unreadable += 1;
            continue;
        };
        let headers = out_of_band(delivery.properties.headers().as_ref());
        transport
            .publish_with_headers(&target, &body, Some(&headers))
            .await
            .map_err(|e| {
                CliError::Amqp(
                    format!("publishing meta.id={id} to `{target}` (it stays in {dlq})"),
                    Box::new(e),
                )
            })?;
        channel
            .basic_ack(delivery.delivery_tag, BasicAckOptions::default())
            .await
            .map_err(amqp_err(format!(
                "acknowledging meta.id={id} on {dlq} after publishing it to `{target}` \
                 (it is now in both)"
            )))?;
        tally.moved += 1;
        println!("requeued meta.id={id} to {target}");
        targets.insert(target);
    }
    let _ = channel
        .close(
            200,
            ShortString::from("the rest stays in the dead-letter queue"),
        )
        .await;
    let target = if targets.is_empty() {
        queue.to_owned()
    } else {
        targets.into_iter().collect::<Vec<_>>().join(", ")
    };
    tally.finish(dlq, &target, select)
}

/// Publishes the original bytes of the poison wrappers of `dlq` to `target` (confirmed),
/// then acknowledges them on `dlq`; every other dead letter stays.
pub(crate) async fn recover_poison(
    broker: &Broker,
    dlq: &str,
    target: &str,
) -> Result<(), CliError> {
    let channel = broker.channel().await?;
    let mut moved = 0u64;
    if let Some(total) = dead_letter_count(broker, &channel, dlq).await? {
        let transport = broker.transport().await?;
        for _ in 0..total {
            let Some(msg) = get_unacked(&channel, dlq, 1).await?.pop() else {
                break;
            };
            let delivery = msg.delivery;
            let Some(original) = babelqueue_runtime::recover_poison(&delivery.data) else {
                continue;
            };
            transport.publish_raw(target, original).await.map_err(|e| {
                CliError::Amqp(
                    format!(
                        "publishing a poison message's bytes to `{target}` (it stays in {dlq})"
                    ),
                    Box::new(e),
                )
            })?;
            channel
                .basic_ack(delivery.delivery_tag, BasicAckOptions::default())
                .await
                .map_err(amqp_err(format!(
                    "acknowledging a poison wrapper on {dlq} after publishing its bytes to `{target}`"
                )))?;
            moved += 1;
        }
        let _ = channel
            .close(
                200,
                ShortString::from("the rest stays in the dead-letter queue"),
            )
            .await;
    }
    println!("recovered {moved} poison message(s) from {dlq} to {target} (original bytes)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bucket_is_probed_once() {
        let buckets = delay_buckets();
        assert_eq!(buckets.first(), Some(&Duration::from_millis(1)));
        assert_eq!(buckets.last(), Some(&MAX_DELAY));
        assert!(buckets.windows(2).all(|w| w[0] < w[1]));
        // Every delay lands on a probed bucket.
        for ms in [1, 7, 999, 1001, 45_000, 3_600_000, 86_400_000] {
            assert!(
                buckets.contains(&delay_bucket(Duration::from_millis(ms))),
                "{ms}"
            );
        }
        // The README says 78.
        assert_eq!(buckets.len(), 78, "{buckets:?}");
    }

    #[test]
    fn dead_letters_go_back_to_their_original_queue() {
        let el = Element::parse(br#"{"job":"urn:x","dead_letter":{"original_queue":"orders"}}"#);
        assert_eq!(target_of(&el, "payments"), "orders");
        let el = Element::parse(br#"{"job":"urn:x","dead_letter":{"original_queue":""}}"#);
        assert_eq!(target_of(&el, "payments"), "payments");
        let el = Element::parse(br#"{"job":"urn:x"}"#);
        assert_eq!(target_of(&el, "payments"), "payments");
    }

    #[test]
    fn long_queue_names_are_errors() {
        assert!(queue_name(&"q".repeat(256)).is_err());
        assert!(queue_name("payments.dlq").is_ok());
    }

    #[test]
    fn stats_say_what_is_missing_and_unknown() {
        let stats = Stats {
            queue: "p".into(),
            main: Some(QueueInfo {
                ready: 3,
                consumers: 1,
            }),
            dlq: "p.dlq".into(),
            dead: None,
            delays: vec![("p.delay.1000".into(), 2), ("p.delay.2500".into(), 1)],
            probed: 80,
        };
        let j = stats.to_json();
        assert_eq!(j["ready"], 3);
        assert_eq!(j["in_flight"], Value::Null);
        assert_eq!(j["delayed"], 3);
        assert_eq!(j["delay_queues"]["p.delay.2500"], 1);
        assert_eq!(j["dlq_exists"], false);
        assert_eq!(j["dead_letters"], Value::Null);
        let t = stats.to_text();
        assert!(t.contains("dead letters  missing"), "{t}");
        assert!(t.contains("p.delay.1000: 2, p.delay.2500: 1"), "{t}");
    }
}
