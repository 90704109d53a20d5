//! The Kafka side of the bench (`--broker kafka`, built with `--features kafka`): loading
//! the workload onto a fresh topic, draining it with the `App` over `KafkaTransport` in a
//! fresh consumer group, checking that the group committed every record, and deleting the
//! topic.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use babelqueue::kafka::KafkaTransport;
use babelqueue::kafka::rdkafka::ClientConfig;
use babelqueue::kafka::rdkafka::admin::{AdminClient, AdminOptions};
use babelqueue::kafka::rdkafka::client::DefaultClientContext;
use babelqueue::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use babelqueue::runtime::Transport;
use babelqueue::{AsyncLeaseStore, AsyncStore, BoxError, store::IntoHandlerError};

use crate::{Mode, Run, check, consumer};

/// Publishes running at once while loading a topic (each waits for its acknowledgement).
const LOAD_IN_FLIGHT: usize = 64;

/// A fresh, unique topic name for one run.
pub fn fresh_topic() -> String {
    format!("bench.payments.{}", uuid::Uuid::new_v4().simple())
}

fn bootstrap(url: &str) -> Result<String, BoxError> {
    match babelqueue::binding::BrokerUrl::parse(url)? {
        babelqueue::binding::BrokerUrl::Kafka(k) => Ok(k.bootstrap_servers()),
        other => Err(format!("--kafka-url must be kafka://…, not {other}").into()),
    }
}

/// Loads `bodies` onto `topic` (one partition) through a [`KafkaTransport`], the
/// binding's headers and timestamp, every produce acknowledged. Not timed.
pub async fn preload(url: &str, topic: &str, bodies: &[Vec<u8>]) -> Result<(), BoxError> {
    let producer = KafkaTransport::new(url)?;
    producer.ensure_topic(topic).await?;
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(bodies.to_vec());
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..LOAD_IN_FLIGHT {
        let (p, b, n, t) = (
            producer.clone(),
            bodies.clone(),
            next.clone(),
            topic.to_owned(),
        );
        tasks.spawn(async move {
            loop {
                let i = n.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(body) = b.get(i) else { break };
                p.publish_raw(&t, body.clone()).await?;
            }
            Ok::<(), babelqueue::runtime::TransportError>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

/// The sum of the high watermarks of `topic` and of what `group` committed on it.
fn end_and_committed(bootstrap: &str, topic: &str, group: &str) -> Result<(i64, i64), BoxError> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()?;
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut tpl = babelqueue::kafka::rdkafka::TopicPartitionList::new();
    let mut end = 0;
    for t in md.topics() {
        for p in t.partitions() {
            end += c
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))?
                .1;
            tpl.add_partition(topic, p.id());
        }
    }
    let committed = c
        .committed_offsets(tpl, Duration::from_secs(10))?
        .elements()
        .iter()
        .filter_map(|e| e.offset().to_raw())
        .filter(|o| *o >= 0)
        .sum();
    Ok((end, committed))
}

async fn delete(bootstrap: &str, topic: &str) -> Result<(), BoxError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    admin.delete_topics(&[topic], &AdminOptions::new()).await?;
    Ok(())
}

/// One run on Kafka: a fresh topic, loaded, drained by the `App` in a fresh group
/// (joining the group is timed too: it is printed apart), checked, deleted.
pub async fn one_run<S>(
    url: &str,
    bodies: &[Vec<u8>],
    store: Arc<S>,
    mode: Mode,
    concurrency: usize,
    n: u64,
) -> Result<Run, BoxError>
where
    S: AsyncStore + AsyncLeaseStore + Send + Sync + 'static,
    S::Error: IntoHandlerError<BoxError>,
{
    let boot = bootstrap(url)?;
    let topic = fresh_topic();
    let group = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let run = async {
        preload(url, &topic, bodies).await?;
        let total = bodies.len() as u64;
        let transport = KafkaTransport::builder(url)?.group(&group).build()?;
        let effects = Arc::new(AtomicU64::new(0));
        let first = Arc::new(std::sync::OnceLock::<Instant>::new());
        let f = first.clone();
        let app = consumer(
            transport,
            &topic,
            store,
            mode,
            concurrency,
            None,
            effects.clone(),
        )
        .on_delivery(move |_| {
            let _ = f.set(Instant::now());
        });
        let start = Instant::now();
        let stats = app.drain().await?;
        let end = Instant::now();
        let secs = end.duration_since(start).as_secs_f64();
        let joined = first
            .get()
            .map_or(0.0, |t| t.duration_since(start).as_secs_f64());
        eprintln!(
            "kafka: first delivery after {:.3} s (group join); {:.0}/s after it",
            joined,
            (total.saturating_sub(1)) as f64 / (secs - joined).max(1e-9)
        );
        app.transport().leave(&topic).await?;
        let run = Run {
            deliveries: stats.processed,
            secs,
            effects: effects.load(Ordering::Relaxed),
            skips: stats.skipped,
            redis_cmds: 0,
            redis_reads: 0,
            client_cpu: 0.0,
            allocations: 0,
            server_cpu: 0.0,
        };
        // Against the records loaded, not the high watermarks: tansu 0.6 reports a
        // partition's watermark as its last batch's base offset + 1 (the loader batches).
        let (high, committed) = end_and_committed(&boot, &topic, &group)?;
        let left = if u64::try_from(committed).ok() == Some(total) {
            String::new()
        } else {
            format!(
                "the group committed {committed} of the {total} records loaded onto `{topic}` \
                 (high watermarks: {high})"
            )
        };
        check(&run, &stats, n, total - n, &left)?;
        Ok::<Run, BoxError>(run)
    }
    .await;
    if let Err(e) = delete(&boot, &topic).await {
        eprintln!("kafka: deleting `{topic}` failed: {e}");
    }
    run
}
