//! Shared by the RabbitMQ tests: the broker URL, unique queue names, a raw `lapin` client
//! to look at the wire, and cleanup of a queue with its dead-letter and delay queues.
#![allow(dead_code)]

use std::time::Duration;

use babelqueue::amqp::lapin::options::{BasicGetOptions, QueueDeleteOptions};
use babelqueue::amqp::lapin::{self, Channel, Connection, ConnectionProperties};
use babelqueue::amqp::{dead_letter_queue, delay_bucket, delay_queue};

pub const NEEDS: &str = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored";

pub fn url() -> String {
    std::env::var("BABELQUEUE_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

pub fn unique_queue(tag: &str) -> String {
    format!("bq-test.amqp-{tag}-{}", uuid::Uuid::new_v4().simple())
}

/// A raw client channel (no confirms) on `url`.
pub async fn raw_channel_at(url: &str) -> (Connection, Channel) {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("RabbitMQ must be reachable for this test");
    let ch = conn.create_channel().await.unwrap();
    (conn, ch)
}

pub async fn raw_channel() -> (Connection, Channel) {
    raw_channel_at(&url()).await
}

/// One message of `queue` read with `basic.get` (acked: it is removed).
pub async fn raw_get(ch: &Channel, queue: &str) -> Option<lapin::message::BasicGetMessage> {
    let got = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap();
    got
}

/// Ready messages of `queue` (0 when it does not exist).
pub async fn ready_at(url: &str, queue: &str) -> u32 {
    let (conn, ch) = raw_channel_at(url).await;
    let n = match ch
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await
    {
        Ok(q) => q.message_count(),
        Err(_) => 0,
    };
    let _ = conn.close(200, "OK".into()).await;
    n
}

pub async fn ready(queue: &str) -> u32 {
    ready_at(&url(), queue).await
}

/// Every delay bucket up to a minute (the delays the tests use).
pub fn buckets() -> Vec<Duration> {
    let mut all: Vec<Duration> = (1..=60_000u64)
        .map(|ms| delay_bucket(Duration::from_millis(ms)))
        .collect();
    all.dedup();
    all
}

/// Ready messages in every delay queue of `queue` (buckets up to a minute).
pub async fn delayed_at(url: &str, queue: &str) -> u32 {
    let mut n = 0;
    for b in buckets() {
        n += ready_at(url, &delay_queue(queue, b)).await;
    }
    n
}

/// Deletes `queue`, `<queue>.dlq` and its delay queues (buckets up to a minute).
pub async fn delete_all_at(url: &str, queue: &str) {
    let (conn, ch) = raw_channel_at(url).await;
    let mut names = vec![queue.to_owned(), dead_letter_queue(queue)];
    names.extend(buckets().into_iter().map(|b| delay_queue(queue, b)));
    for name in names {
        ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap_or_else(|e| panic!("deleting {name}: {e}"));
    }
    let _ = conn.close(200, "OK".into()).await;
}

pub async fn delete_all(queue: &str) {
    delete_all_at(&url(), queue).await
}
