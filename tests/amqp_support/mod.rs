//! Shared by the RabbitMQ tests: the broker URL, unique queue names, a raw `lapin` client
//! to look at the wire, and cleanup of a queue with its dead-letter and delay queues.
#![allow(dead_code)]

use std::time::Duration;

use babelqueue::amqp::lapin::options::{BasicGetOptions, QueueDeleteOptions};
use babelqueue::amqp::lapin::{self, Channel, Connection, ConnectionProperties};
use babelqueue::amqp::{dead_letter_queue, delay_bucket, delay_queue};

pub const NEEDS: &str =
    "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored";

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
    ch.basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
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

/// Ready messages of `queue` once they are `want`, or what they are after `within`: for
/// messages a publisher without confirms (the Python SDK's pika transport) may still have
/// on their way into the queue when it exits.
pub async fn ready_within(queue: &str, want: u32, within: Duration) -> u32 {
    let deadline = std::time::Instant::now() + within;
    loop {
        let n = ready(queue).await;
        if n == want || std::time::Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

/// A RabbitMQ node of the test's own (never the shared one): its own node name, AMQP and
/// distribution ports, data and log directories under a temporary directory, no plugins.
/// Stopped with `rabbitmqctl -n <its node> stop`, or killed by pid when dropped.
pub struct OwnNode {
    pub dir: std::path::PathBuf,
    pub name: String,
    pub port: u16,
    dist_port: u16,
    child: Option<std::process::Child>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn rabbit_bin(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::var("BABELQUEUE_RABBITMQ_BIN").unwrap_or_else(|_| "/usr/lib/rabbitmq/bin".into());
    std::path::Path::new(&dir).join(name)
}

impl OwnNode {
    /// Starts a new node and waits until it accepts AMQP connections.
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("bq-rmq-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        std::fs::write(dir.join("env.conf"), "").unwrap();
        std::fs::write(dir.join("rabbit.conf"), "log.console = false\n").unwrap();
        let mut node = OwnNode {
            name: format!(
                "bqtest-{}@localhost",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ),
            port: free_port(),
            dist_port: free_port(),
            dir,
            child: None,
        };
        node.boot();
        node
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    fn env(&self, cmd: &mut std::process::Command) {
        let d = &self.dir;
        cmd.env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbit"))
            .env("RABBITMQ_CONF_ENV_FILE", d.join("env.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_PID_FILE", d.join("node.pid"))
            .env("HOME", d);
    }

    /// Starts the node (again, on the same data) and waits for its AMQP port.
    pub fn boot(&mut self) {
        let _ = std::fs::remove_file(self.dir.join("node.pid"));
        let log = std::fs::File::create(self.dir.join("server.out")).unwrap();
        let mut cmd = std::process::Command::new(rabbit_bin("rabbitmq-server"));
        self.env(&mut cmd);
        cmd.stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.child = Some(cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start rabbitmq-server (BABELQUEUE_RABBITMQ_BIN): {e}")
        }));
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "the own RabbitMQ node exited ({status}): {}",
                    std::fs::read_to_string(self.dir.join("server.out")).unwrap_or_default()
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the own RabbitMQ node did not listen in 90 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the node gracefully (`rabbitmqctl -n <node> stop`), as a broker restart does.
    pub fn stop(&mut self) {
        let mut cmd = std::process::Command::new(rabbit_bin("rabbitmqctl"));
        self.env(&mut cmd);
        let out = cmd.args(["-n", &self.name, "stop"]).output().unwrap();
        if !out.status.success() {
            self.kill();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// SIGKILL of this node's own processes (the beam pid it wrote, and the script).
    fn kill(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("node.pid")) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", pid.trim()])
                .status();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnNode {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
