//! Shared by the SQS tests: a `moto_server` (an emulator of the SQS API, not AWS) of this
//! test binary's own on a free port, unique queue names, a raw AWS SDK client to look at
//! the wire, and cleanup of a queue with its `-dlq`.
//!
//! moto is found at `BABELQUEUE_MOTO`, else beside `BABELQUEUE_PYTHON`
//! (`$(dirname $BABELQUEUE_PYTHON)/moto_server`). It is started once per test binary, on
//! first use, through a small watchdog shell that kills it by pid as soon as this process
//! is gone (however it ends).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use babelqueue::binding::BrokerUrl;
use babelqueue::sqs::SqsTransport;
use babelqueue::sqs::aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use babelqueue::sqs::aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use babelqueue::sqs::aws_sdk_sqs::{self, Client};

pub const NEEDS: &str =
    "needs moto_server (BABELQUEUE_MOTO, or beside BABELQUEUE_PYTHON); CI runs it with --ignored";

pub struct Moto {
    pub port: u16,
    pub pid: u32,
    pub started_in: Duration,
}

static MOTO: OnceLock<Moto> = OnceLock::new();

fn moto_bin() -> PathBuf {
    if let Ok(p) = std::env::var("BABELQUEUE_MOTO") {
        return p.into();
    }
    if let Ok(py) = std::env::var("BABELQUEUE_PYTHON") {
        let p = std::path::Path::new(&py).with_file_name("moto_server");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "moto_server not found: set BABELQUEUE_MOTO, or BABELQUEUE_PYTHON to a venv's python with moto[server]"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// This binary's moto, started on first use.
pub fn moto() -> &'static Moto {
    MOTO.get_or_init(|| {
        let port = free_port();
        let start = Instant::now();
        // The watchdog: starts moto, prints its pid, and kills it (by pid) once this test
        // process is gone.
        #[allow(
            clippy::zombie_processes,
            reason = "the watchdog outlives this test process by design: it stops moto once the process is gone"
        )]
        let mut sh = Command::new("sh")
            .arg("-c")
            .arg(
                r#""$0" -H 127.0.0.1 -p "$1" >/dev/null 2>&1 & m=$!
echo $m
while kill -0 "$2" 2>/dev/null; do sleep 0.5; done
kill $m; wait $m"#,
            )
            .arg(moto_bin())
            .arg(port.to_string())
            .arg(std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting moto_server");
        let mut line = String::new();
        BufReader::new(sh.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid: u32 = line.trim().parse().expect("moto's pid");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "moto_server did not start on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let started_in = start.elapsed();
        println!("sqs-result: moto start_ms={}", started_in.as_millis());
        Moto {
            port,
            pid,
            started_in,
        }
    })
}

pub fn endpoint() -> String {
    format!("http://127.0.0.1:{}", moto().port)
}

/// The family's URL form for this moto.
pub fn url() -> String {
    format!("sqs://us-east-1?endpoint={}", endpoint())
}

/// What a child process (a Rust consumer, the Python SDK) needs in its environment.
pub fn child_env() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_DEFAULT_REGION", "us-east-1".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ("BROKER_URL", url()),
    ]
}

/// A raw client of this moto (static test credentials).
pub fn client() -> Client {
    let conf = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint())
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .build();
    Client::from_conf(conf)
}

/// The transport on this moto, with the options of `url()` plus `query` (e.g.
/// `&visibility_timeout=2`).
pub fn transport_with(query: &str) -> SqsTransport {
    let BrokerUrl::Sqs(u) = BrokerUrl::parse(&format!("{}{query}", url())).unwrap() else {
        unreachable!()
    };
    SqsTransport::from_client(client(), u)
}

pub fn transport() -> SqsTransport {
    transport_with("")
}

pub fn unique_queue(tag: &str) -> String {
    format!(
        "bq-test-sqs-{tag}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

pub async fn queue_url(queue: &str) -> Option<String> {
    client()
        .get_queue_url()
        .queue_name(queue)
        .send()
        .await
        .ok()
        .and_then(|o| o.queue_url().map(str::to_owned))
}

/// (visible, delayed, not visible) of `queue`; zeros when it does not exist.
pub async fn counts(queue: &str) -> (u64, u64, u64) {
    let Some(url) = queue_url(queue).await else {
        return (0, 0, 0);
    };
    let out = client()
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap();
    let get = |n: QueueAttributeName| {
        out.attributes()
            .and_then(|a| a.get(&n))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (
        get(QueueAttributeName::ApproximateNumberOfMessages),
        get(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
        get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    )
}

/// Up to `n` messages of `queue` received raw (every attribute), hidden for `visibility`
/// seconds (0: visible again at once).
pub async fn raw_receive(queue: &str, n: i32, visibility: i32) -> Vec<aws_sdk_sqs::types::Message> {
    let url = queue_url(queue).await.expect("the queue exists");
    client()
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(n)
        .visibility_timeout(visibility)
        .wait_time_seconds(0)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap()
        .messages()
        .to_vec()
}

/// Deletes `queue` and its `-dlq` (if they exist).
pub async fn delete_all(queue: &str) {
    for name in [
        queue.to_owned(),
        babelqueue::sqs::dead_letter_queue(queue, ".dlq"),
    ] {
        if let Some(url) = queue_url(&name).await {
            client().delete_queue().queue_url(url).send().await.unwrap();
        }
    }
}
