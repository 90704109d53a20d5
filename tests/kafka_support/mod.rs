//! Shared by the Kafka tests: a `tansu` broker of the test's own (its own port, an
//! in-memory storage engine, stopped by pid when dropped), unique topic names, and a raw
//! rdkafka client to look at the wire.
//!
//! The broker binary: `BABELQUEUE_TANSU`, else `~/.cargo/bin/tansu` (`.ci/run` installs it
//! there with `cargo install tansu --locked --features dynostore`). Without it a test
//! prints why and returns, unless `CI` is set, where it fails.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use babelqueue::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use babelqueue::kafka::rdkafka::message::{Headers, Message};
use babelqueue::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};

pub const NEEDS: &str =
    "needs the tansu broker (BABELQUEUE_TANSU or ~/.cargo/bin/tansu); CI runs it with --ignored";

pub fn tansu_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BABELQUEUE_TANSU") {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME")?;
    let p = PathBuf::from(home).join(".cargo/bin/tansu");
    p.exists().then_some(p)
}

/// A tansu broker on its own port; killed (by pid) and reaped when dropped.
pub struct Broker {
    child: Child,
    pub port: u16,
    pub started_in: Duration,
}

impl Broker {
    /// Starts a broker, or `None` (with a note) when there is no binary outside CI.
    pub fn start() -> Option<Broker> {
        let Some(bin) = tansu_binary() else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must have the tansu broker ({NEEDS})"
            );
            eprintln!("skipped: no tansu binary ({NEEDS})");
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let start = Instant::now();
        let child = Command::new(&bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let mut broker = Broker {
            child,
            port,
            started_in: Duration::ZERO,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen on {port}");
            std::thread::sleep(Duration::from_millis(10));
        }
        broker.started_in = start.elapsed();
        Some(broker)
    }

    pub fn url(&self) -> String {
        format!("kafka://127.0.0.1:{}", self.port)
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn unique_topic(tag: &str) -> String {
    format!("bq-test.kafka-{tag}-{}", uuid::Uuid::new_v4().simple())
}

/// One record as a raw client reads it.
#[derive(Debug, Clone)]
pub struct RawRecord {
    pub partition: i32,
    pub offset: i64,
    pub value: Vec<u8>,
    pub key: Option<Vec<u8>>,
    pub timestamp_ms: Option<i64>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl RawRecord {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_ref())
            .map(|v| String::from_utf8(v.clone()).unwrap())
    }
}

/// Every record of `topic` (all partitions, from the start), read with a group-less raw
/// consumer until `n` arrived or `within` passed.
pub fn read_all(bootstrap: &str, topic: &str, n: usize, within: Duration) -> Vec<RawRecord> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("raw-{}", uuid::Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for t in md.topics() {
        for p in t.partitions() {
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
                .unwrap();
        }
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + within;
    while out.len() < n && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            out.push(RawRecord {
                partition: m.partition(),
                offset: m.offset(),
                value: m.payload().unwrap_or_default().to_vec(),
                key: m.key().map(<[u8]>::to_vec),
                timestamp_ms: m.timestamp().to_millis(),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
    }
    out
}

/// The high watermark of each partition of `topic`.
pub fn high_watermarks(bootstrap: &str, topic: &str) -> Vec<(i32, i64)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut out = Vec::new();
    for t in md.topics() {
        for p in t.partitions() {
            let (_, high) = c
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .unwrap();
            out.push((p.id(), high));
        }
    }
    out.sort_unstable();
    out
}
