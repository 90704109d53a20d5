//! Shared helpers of the fleet, outage and cluster tests: a private `redis-server` killed by
//! pid on drop, unique queue names, and raw Redis access.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use babelqueue::redis::redis;

pub fn shared_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

pub fn unique(tag: &str) -> String {
    format!("bq-test:{tag}:{}", uuid::Uuid::new_v4().simple())
}

/// Deletes every key of a test queue on drop (the queue, its `{queue}:*` keys, its DLQ).
pub struct QueueGuard {
    pub name: String,
    pub url: String,
}

impl QueueGuard {
    pub fn new(tag: &str, url: &str) -> Self {
        QueueGuard {
            name: unique(tag),
            url: url.to_owned(),
        }
    }
}

impl Drop for QueueGuard {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(self.url.as_str())
            && let Ok(mut c) = client.get_connection()
        {
            let mut keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{{{}}}:*", self.name))
                .query(&mut c)
                .unwrap_or_default();
            keys.push(self.name.clone());
            keys.push(format!("{}:processing", self.name));
            keys.push(format!("{}.dlq", self.name));
            let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut c);
        }
    }
}

pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis must be reachable for this test")
}

/// A private `redis-server` on `port`, in a temp dir, killed by pid on drop.
pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts `redis-server --port <port>` with `extra` arguments (e.g. `--appendonly yes`)
    /// and waits until it answers `PING`.
    pub fn start(port: u16, extra: &[&str]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("bq-redis-{port}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = RedisServer {
            port,
            dir,
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.restart();
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// (Re)starts the server process with the same arguments and data directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--save".into(),
            "".into(),
        ];
        if !self.extra.iter().any(|a| a == "--appendonly") {
            args.extend(["--appendonly".into(), "no".into()]);
        }
        args.extend(self.extra.iter().cloned());
        let child = Command::new("redis-server")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(client) = redis::Client::open(self.url())
                && let Ok(mut c) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                // With AOF, wait until the data is loaded.
                let info: String = redis::cmd("INFO")
                    .arg("persistence")
                    .query(&mut c)
                    .unwrap_or_default();
                if info.contains("loading:0") {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server with SIGKILL (by pid) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the server gracefully (`SHUTDOWN NOSAVE`... with AOF, the log is fsynced).
    pub fn shutdown(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(client) = redis::Client::open(self.url())
                && let Ok(mut conn) = client.get_connection()
            {
                let _: Result<(), _> = redis::cmd("SHUTDOWN").query(&mut conn);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `total_reads_processed` of `INFO stats`: the read events the server processed
    /// (one per request of a client that waits for each reply, or per pipeline).
    #[allow(dead_code)]
    pub fn reads_processed(&self) -> u64 {
        let client = redis::Client::open(self.url()).unwrap();
        let mut c = client.get_connection().unwrap();
        let info: String = redis::cmd("INFO").arg("stats").query(&mut c).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_reads_processed:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("INFO stats has total_reads_processed")
    }

    /// `INFO commandstats` as (command, calls) pairs.
    pub fn command_calls(&self) -> std::collections::HashMap<String, u64> {
        let client = redis::Client::open(self.url()).unwrap();
        let mut c = client.get_connection().unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut c)
            .unwrap();
        info.lines()
            .filter_map(|l| {
                let l = l.strip_prefix("cmdstat_")?;
                let (name, rest) = l.split_once(':')?;
                let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((name.to_owned(), calls.parse().ok()?))
            })
            .collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
