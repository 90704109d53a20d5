//! The built `babelqueue` binary, end to end: against SQLite files it makes (always),
//! and against the local Redis and PostgreSQL (ignored; CI runs them).

use std::process::{Command, Output};

use babelqueue_core::Envelope;
use babelqueue_runtime::poison_body;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_babelqueue");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("BROKER_URL")
        .output()
        .expect("the babelqueue binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn postgres_url() -> String {
    std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn unique(name: &str) -> String {
    format!("bq_cli_{name}_{}", uuid::Uuid::new_v4().simple())
}

#[test]
fn help_everywhere_and_usage_errors_exit_2() {
    for args in [
        &["--help"][..],
        &["queue", "stats", "--help"],
        &["dlq", "list", "--help"],
        &["dlq", "requeue", "--help"],
        &["dlq", "recover-poison", "--help"],
        &["doctor", "--help"],
        &["processing", "recover-legacy", "--help"],
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).contains("Usage: babelqueue"), "{args:?}");
    }
    let o = run(&["dlq", "requeue", "q"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--id"), "{}", stderr(&o));
    let o = run(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn unreachable_servers_and_missing_files_are_clear_errors() {
    let o = run(&["queue", "stats", "q", "--url", "redis://:pw@127.0.0.1:1/0"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.starts_with("error: cannot connect to Redis at redis://:***@127.0.0.1:1/0"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let o = run(&["dlq", "list", "q", "--url", "http://nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid Redis URL"), "{}", stderr(&o));

    let o = run(&["doctor", "/nonexistent/babelqueue/store.db"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no SQLite file at /nonexistent/babelqueue/store.db"));

    let o = run(&[
        "doctor",
        "postgres://postgres@127.0.0.1:5432/test?sslmode=bogus",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("invalid sslmode \"bogus\""),
        "{}",
        stderr(&o)
    );
}

#[test]
fn recover_legacy_refuses_without_yes() {
    let o = run(&[
        "processing",
        "recover-legacy",
        "q",
        "--url",
        "redis://127.0.0.1:1/0",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("WARNING") && err.contains("q:processing"),
        "{err}"
    );
    assert!(err.contains("--yes"), "{err}");
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn doctor_on_a_sqlite_store() {
    let dir = std::env::temp_dir().join(unique("sqlite"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store.db");
    let store = babelqueue_sqlite::SqliteStore::open(&path).unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let now = now_ms();
    let insert = "INSERT INTO babelqueue_idempotency \
                  (message_id, created_at, expires_at, lease_token, lease_expires_at) VALUES (?1, ?2, ?3, ?4, ?5)";
    type Row<'a> = (&'a str, Option<i64>, Option<&'a str>, Option<i64>);
    let rows: [Row<'_>; 4] = [
        ("done-forever", None, None, None),
        ("done-expired", Some(now - 60_000), None, None),
        (
            "in-flight",
            Some(now + 600_000),
            Some("tok1"),
            Some(now + 600_000),
        ),
        (
            "holder-died",
            Some(now - 1_000),
            Some("tok2"),
            Some(now - 1_000),
        ),
    ];
    for (id, exp, tok, lease) in rows {
        conn.execute(
            insert,
            rusqlite::params![id, now - 120_000, exp, tok, lease],
        )
        .unwrap();
    }
    let o = run(&["doctor", path.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(
        out.contains("4 row(s): 2 expired, 1 without expiry"),
        "{out}"
    );
    assert!(out.contains("index on expires_at"), "{out}");
    assert!(out.contains("in flight now: in-flight"), "{out}");
    assert!(out.contains("holder-died (lease expired"), "{out}");
    assert!(out.contains("done-expired"), "{out}");
    assert!(out.contains("0 problem(s)"), "{out}");

    // A table without the expiry index and with a wrong type: problems, exit 3.
    conn.execute_batch(
        "CREATE TABLE other (message_id TEXT NOT NULL PRIMARY KEY, created_at TEXT NOT NULL, \
         expires_at INTEGER, lease_token TEXT, lease_expires_at INTEGER)",
    )
    .unwrap();
    let o = run(&[
        "doctor",
        &format!("sqlite://{}", path.display()),
        "--table",
        "other",
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(3), "{out}");
    assert!(
        out.contains("PROBLEM other.created_at: type TEXT, expected INTEGER"),
        "{out}"
    );
    assert!(
        out.contains("PROBLEM other: no index on expires_at"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn cleanup(conn: &mut redis::aio::MultiplexedConnection, queue: &str) {
    let keys = [
        queue.to_owned(),
        format!("{queue}:processing"),
        format!("{queue}.dlq"),
        format!("{queue}.poison"),
        format!("{{{queue}}}:processing:c1"),
        format!("{{{queue}}}:processing:c2"),
        format!("{{{queue}}}:delayed"),
        format!("{{{queue}}}:heartbeat:c1"),
        format!("{{{queue}}}:consumers"),
    ];
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(conn)
        .await
        .unwrap();
}

fn dead_letter(id: &str, reason: &str, error: &str) -> String {
    format!(
        r#"{{"job":"urn:babel:test:charge","trace_id":"t-{id}","data":{{"z":1,"a":2}},"meta":{{"id":"{id}","queue":"q","lang":"go","schema_version":1,"created_at":1}},"attempts":3,"dead_letter":{{"reason":"{reason}","error":"{error}","exception":null,"failed_at":1700000000123,"original_queue":"q","attempts":3,"lang":"go"}},"x_extra":true}}"#
    )
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn queue_stats_and_dead_letters_on_redis() {
    let queue = unique("redis");
    let url = redis_url();
    let mut conn = redis().await;
    cleanup(&mut conn, &queue).await;
    let env = Envelope::new("urn:babel:test:charge", json!({"n": 1})).unwrap();
    let ready = env.encode();
    let dlq = format!("{queue}.dlq");
    let garbage = b"\xffnot json at all".to_vec();
    let poison = poison_body(&garbage, &Envelope::decode(&garbage).unwrap_err(), &queue);
    let mut pipe = redis::pipe();
    pipe.rpush(&queue, &ready)
        .rpush(&queue, &ready)
        .rpush(format!("{queue}:processing"), "legacy")
        .rpush(format!("{{{queue}}}:processing:c1"), &["a", "b"][..])
        .rpush(format!("{{{queue}}}:processing:c2"), "c")
        .zadd(format!("{{{queue}}}:delayed"), "d", 1)
        .set_ex(format!("{{{queue}}}:heartbeat:c1"), "1", 60)
        .zadd(
            format!("{{{queue}}}:consumers"),
            "c1",
            4_102_444_800_000_i64,
        )
        .zadd(format!("{{{queue}}}:consumers"), "c2", 1_000_i64)
        .rpush(&dlq, dead_letter("m-1", "failed", "boom: db down"))
        .rpush(&dlq, dead_letter("m-2", "unknown_urn", "no handler"))
        .rpush(&dlq, &poison);
    let _: () = pipe.query_async(&mut conn).await.unwrap();

    // queue stats
    let o = run(&["queue", "stats", &queue, "--url", &url, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let stats: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(stats["ready"], 2);
    assert_eq!(stats["in_flight"], 4);
    assert_eq!(stats["in_flight_legacy"], 1);
    assert_eq!(stats["in_flight_by_consumer"], json!({"c1": 2, "c2": 1}));
    assert_eq!(stats["delayed"], 1);
    assert_eq!(stats["dead_letters"], 3);
    assert_eq!(stats["consumers_alive"], json!(["c1"]));
    assert_eq!(
        stats["consumers_registered"],
        json!({"c2": 1000, "c1": 4_102_444_800_000_i64})
    );
    assert_eq!(stats["consumers_expired"], json!(["c2"]));
    let o = run(&["queue", "stats", &queue, "--url", &url]);
    let text = stdout(&o);
    assert!(
        text.contains(&format!("{{{queue}}}:processing:c2, no heartbeat")),
        "{text}"
    );

    // dlq list
    let o = run(&[
        "dlq", "list", &queue, "--url", &url, "--json", "--limit", "2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let listed: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["meta_id"], "m-1");
    assert_eq!(listed[0]["reason"], "failed");
    assert_eq!(listed[0]["error"], "boom: db down");
    assert_eq!(listed[0]["attempts"], 3);
    assert_eq!(listed[0]["failed_at_utc"], "2023-11-14T22:13:20.123Z");
    assert_eq!(listed[1]["reason"], "unknown_urn");
    let o = run(&["dlq", "list", &queue, "--url", &url]);
    let text = stdout(&o);
    assert!(text.contains("3 dead letter(s), showing 3"), "{text}");
    assert!(text.contains("poison wrapper"), "{text}");

    // dlq requeue --id: the block goes, the order of the rest stays, attempts = 0.
    let o = run(&["dlq", "requeue", &queue, "--url", &url, "--id", "m-2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let tail: Vec<u8> = redis::cmd("LINDEX")
        .arg(&queue)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8(tail).unwrap(),
        r#"{"job":"urn:babel:test:charge","trace_id":"t-m-2","data":{"z":1,"a":2},"meta":{"id":"m-2","queue":"q","lang":"go","schema_version":1,"created_at":1},"attempts":0,"x_extra":true}"#
    );
    let o = run(&["dlq", "requeue", &queue, "--url", &url, "--id", "m-2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no dead letter with meta.id m-2"),
        "{}",
        stderr(&o)
    );

    // --all skips the poison wrapper.
    let o = run(&["dlq", "requeue", &queue, "--url", &url, "--all"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("skipped 1 poison wrapper"),
        "{}",
        stderr(&o)
    );
    let len: u64 = redis::cmd("LLEN")
        .arg(&queue)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 4);

    // recover-poison: the original bytes, exactly.
    let to = format!("{queue}.poison");
    let o = run(&["dlq", "recover-poison", &queue, "--url", &url, "--to", &to]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let back: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(&to)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(back, vec![garbage]);
    let left: u64 = redis::cmd("LLEN")
        .arg(&dlq)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0);

    // processing recover-legacy --yes
    let o = run(&[
        "processing",
        "recover-legacy",
        &queue,
        "--url",
        &url,
        "--yes",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("moved 1 message(s)"));
    let head: String = redis::cmd("LINDEX")
        .arg(&queue)
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(head, "legacy");
    cleanup(&mut conn, &queue).await;
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn doctor_on_redis_keys() {
    let prefix = format!("{}:idemp:", unique("doctor"));
    let mut conn = redis().await;
    let mut pipe = redis::pipe();
    pipe.set(format!("{prefix}done"), "1")
        .set_ex(format!("{prefix}done-ttl"), "1", 600)
        .pset_ex(format!("{prefix}leased"), "lease:tok", 600_000);
    let _: () = pipe.query_async(&mut conn).await.unwrap();
    let o = run(&["doctor", &redis_url(), "--prefix", &prefix]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("3 key(s) under"), "{out}");
    assert!(
        out.contains("2 remembered (`1`; 1 without TTL), 1 in-flight lease(s), 0 unexpected"),
        "{out}"
    );
    assert!(
        out.contains(&format!("{prefix}leased: in-flight lease")),
        "{out}"
    );

    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}odd"))
        .arg("yes")
        .query_async(&mut conn)
        .await
        .unwrap();
    let o = run(&["doctor", &redis_url(), "--prefix", &prefix]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(3), "{out}");
    assert!(
        out.contains(&format!("PROBLEM {prefix}odd = \"yes\"")),
        "{out}"
    );
    let keys: Vec<String> = ["done", "done-ttl", "leased", "odd"]
        .iter()
        .map(|k| format!("{prefix}{k}"))
        .collect();
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn doctor_on_postgres() {
    let table = unique("pg");
    let store = babelqueue_postgres::PostgresStore::builder(postgres_url())
        .table(&table)
        .connect()
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let client = store.pool().get().await.unwrap();
    client
        .batch_execute(&format!(
            "INSERT INTO {table} (message_id, expires_at) VALUES ('forever', NULL), ('old', now() - interval '1 minute');
             INSERT INTO {table} (message_id, expires_at, lease_token, lease_expires_at) VALUES
               ('live', now() + interval '10 minutes', 't1', now() + interval '10 minutes'),
               ('died', now() - interval '1 second', 't2', now() - interval '1 second');"
        ))
        .await
        .unwrap();
    let o = run(&["doctor", &postgres_url(), "--table", &table]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("PRIMARY KEY (message_id)"), "{out}");
    assert!(out.contains("index on expires_at"), "{out}");
    assert!(out.contains("created_at DEFAULT now()"), "{out}");
    assert!(
        out.contains("4 row(s): 2 expired, 1 without expiry"),
        "{out}"
    );
    assert!(out.contains("in flight now: live"), "{out}");
    assert!(out.contains("died (lease expired"), "{out}");

    // Another SDK's table without the expiry index: a problem.
    let bare = unique("pgbare");
    client
        .batch_execute(&format!(
            "CREATE TABLE {bare} (message_id TEXT PRIMARY KEY, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), expires_at TIMESTAMPTZ)"
        ))
        .await
        .unwrap();
    let o = run(&["doctor", &postgres_url(), "--table", &bare]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(3), "{out}");
    assert!(
        out.contains(&format!("PROBLEM \"{bare}\": no index on expires_at")),
        "{out}"
    );
    assert!(out.contains("no column lease_token"), "{out}");
    client
        .batch_execute(&format!("DROP TABLE {table}; DROP TABLE {bare}"))
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// RabbitMQ (`amqp://` brokers)

use babelqueue_amqp::lapin;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

fn amqp_url() -> String {
    std::env::var("BABELQUEUE_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Runs the binary with the broker in `BROKER_URL` (as a deployment sets it).
fn run_on(broker: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("BROKER_URL", broker)
        .output()
        .expect("the babelqueue binary runs")
}

/// A connection and a channel in confirm mode (the test's own publishes are confirmed).
async fn rabbit() -> (Connection, Channel) {
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("RabbitMQ at BABELQUEUE_AMQP_URL");
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    (conn, ch)
}

/// Declares `queue` as the family does (durable, no arguments).
async fn declare(ch: &Channel, queue: &str) {
    ch.queue_declare(
        ShortString::from(queue),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
}

async fn publish(ch: &Channel, queue: &str, body: &[u8], props: BasicProperties) {
    ch.basic_publish(
        ShortString::from(""),
        ShortString::from(queue),
        BasicPublishOptions::default(),
        body,
        props,
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

/// Ready messages of `queue` (passive declare).
async fn ready(ch: &Channel, queue: &str) -> u32 {
    ch.queue_declare(
        ShortString::from(queue),
        QueueDeclareOptions::default().passive(),
        FieldTable::default(),
    )
    .await
    .unwrap()
    .message_count()
}

/// Takes (acks) the next message of `queue`.
async fn take(ch: &Channel, queue: &str) -> lapin::message::Delivery {
    let m = ch
        .basic_get(ShortString::from(queue), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("a message in {queue}"));
    m.delivery
}

async fn delete_queues(ch: &Channel, queues: &[String]) {
    for q in queues {
        ch.queue_delete(ShortString::from(q.as_str()), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
}

fn amqp_dead_letter(id: &str, original_queue: &str) -> String {
    format!(
        r#"{{"job":"urn:babel:test:charge","trace_id":"t-{id}","data":{{"z":1,"a":2}},"meta":{{"id":"{id}","queue":"{original_queue}","lang":"go","schema_version":1,"created_at":1}},"attempts":3,"dead_letter":{{"reason":"failed","error":"boom {id}","exception":null,"failed_at":1700000000123,"original_queue":"{original_queue}","attempts":3,"lang":"go"}},"x_extra":true}}"#
    )
}

fn json_lines(o: &Output) -> Vec<Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn amqp_urls_select_rabbitmq_and_redis_only_commands_say_so() {
    // Nothing listens on port 1: the error names RabbitMQ, without the password.
    let o = run(&[
        "queue",
        "stats",
        "q",
        "--broker",
        "amqp://guest:secret@127.0.0.1:1/%2f",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.starts_with("error: cannot connect to RabbitMQ at amqp://guest:***@127.0.0.1:1/"),
        "{err}"
    );
    assert!(
        !err.contains("secret") && !err.contains("panicked"),
        "{err}"
    );

    let o = run(&["dlq", "list", "q", "--url", "amqp://h:notaport/"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid AMQP URL"), "{}", stderr(&o));

    let o = run_on(
        "amqp://guest:guest@127.0.0.1:1/%2f",
        &["processing", "recover-legacy", "q", "--yes"],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("`processing recover-legacy` has no meaning on RabbitMQ (amqp://)"),
        "{err}"
    );
    assert!(!err.contains("WARNING"), "{err}");

    let o = run(&["doctor", "amqps://guest:guest@rabbit/%2f"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("RabbitMQ (amqps://) is a broker, not a store"),
        "{}",
        stderr(&o)
    );

    // Built without a broker's feature, the CLI says how to get it (exit 2).
    for (scheme, url) in [
        ("kafka", "kafka://127.0.0.1:9092"),
        ("sqs", "sqs://us-east-1?endpoint=http://127.0.0.1:4566"),
    ] {
        let built = match scheme {
            "kafka" => cfg!(feature = "kafka"),
            _ => cfg!(feature = "sqs"),
        };
        if built {
            continue;
        }
        let o = run_on(url, &["queue", "stats", "q"]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!(
                "built without {scheme}:// support: `cargo install babelqueue-cli --features {scheme}`"
            )),
            "{}",
            stderr(&o)
        );
    }
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn queue_stats_on_rabbitmq() {
    let queue = unique("amqp_stats");
    let dlq = format!("{queue}.dlq");
    let delay = format!("{queue}.delay.1000");
    let url = amqp_url();
    let (conn, ch) = rabbit().await;

    // Nothing declared: reported missing, and still not created.
    let o = run_on(&url, &["queue", "stats", &queue, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let stats: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(stats["broker"], "amqp");
    assert_eq!(stats["exists"], false);
    assert_eq!(stats["ready"], Value::Null);
    assert_eq!(stats["dlq_exists"], false);
    assert_eq!(stats["delayed"], 0);
    let o = run_on(&url, &["queue", "stats", &queue]);
    assert!(
        stdout(&o).contains(&format!("missing   (no queue {queue} on the broker)")),
        "{}",
        stdout(&o)
    );
    let probe = conn.create_channel().await.unwrap();
    let missing = probe
        .queue_declare(
            ShortString::from(queue.as_str()),
            QueueDeclareOptions::default().passive(),
            FieldTable::default(),
        )
        .await;
    assert!(missing.is_err(), "stats must not create {queue}");

    // Empty queues.
    declare(&ch, &queue).await;
    declare(&ch, &dlq).await;
    let o = run_on(&url, &["queue", "stats", &queue, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let stats: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(stats["exists"], true);
    assert_eq!(stats["ready"], 0);
    assert_eq!(stats["consumers"], 0);
    assert_eq!(stats["in_flight"], Value::Null);
    assert_eq!(stats["dead_letters"], 0);

    // Two ready, one in a delay queue, three dead letters.
    declare(&ch, &delay).await;
    let env = Envelope::new("urn:babel:test:charge", json!({"n": 1})).unwrap();
    for _ in 0..2 {
        publish(&ch, &queue, &env.encode(), BasicProperties::default()).await;
    }
    publish(&ch, &delay, &env.encode(), BasicProperties::default()).await;
    for id in ["m-1", "m-2", "m-3"] {
        let body = amqp_dead_letter(id, &queue);
        publish(&ch, &dlq, body.as_bytes(), BasicProperties::default()).await;
    }
    let o = run_on(&url, &["queue", "stats", &queue, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let stats: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(stats["ready"], 2);
    assert_eq!(stats["delayed"], 1);
    assert_eq!(stats["delay_queues"], json!({ delay.clone(): 1 }));
    assert_eq!(stats["dead_letters"], 3);
    assert_eq!(stats["dlq"], dlq);
    let o = run_on(&url, &["queue", "stats", &queue]);
    let text = stdout(&o);
    assert!(text.contains("in flight     unknown"), "{text}");
    assert!(text.contains(&format!("({delay}: 1)")), "{text}");

    delete_queues(&ch, &[queue, dlq, delay]).await;
    conn.close(200, ShortString::from("done")).await.unwrap();
}

#[tokio::test]
#[ignore = "needs RabbitMQ at 127.0.0.1:5672 (BABELQUEUE_AMQP_URL); CI runs it with --include-ignored"]
async fn dead_letters_on_rabbitmq() {
    let queue = unique("amqp_dlq");
    let dlq = format!("{queue}.dlq");
    let other = format!("{queue}.other");
    let to = format!("{queue}.poison");
    let url = amqp_url();
    let (conn, ch) = rabbit().await;
    declare(&ch, &queue).await;
    declare(&ch, &dlq).await;

    // m-1 and m-3 of `queue`, m-2 of `other`, then a poison wrapper and a body that is
    // not JSON. m-2 carries a traceparent header and the projection's headers.
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from("traceparent"),
        AMQPValue::LongString(LongString::from("00-abc-def-01")),
    );
    headers.insert(ShortString::from("x-attempts"), AMQPValue::LongInt(3));
    let garbage = b"\xffnot json at all".to_vec();
    let poison = poison_body(&garbage, &Envelope::decode(&garbage).unwrap_err(), &queue);
    publish(
        &ch,
        &dlq,
        amqp_dead_letter("m-1", &queue).as_bytes(),
        BasicProperties::default(),
    )
    .await;
    publish(
        &ch,
        &dlq,
        amqp_dead_letter("m-2", &other).as_bytes(),
        BasicProperties::default().with_headers(headers),
    )
    .await;
    publish(
        &ch,
        &dlq,
        amqp_dead_letter("m-3", &queue).as_bytes(),
        BasicProperties::default(),
    )
    .await;
    publish(&ch, &dlq, &poison, BasicProperties::default()).await;
    publish(&ch, &dlq, b"plain text", BasicProperties::default()).await;

    // list: the first N, in order, and every one stays.
    let o = run_on(&url, &["dlq", "list", &queue, "--limit", "2", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let listed = json_lines(&o);
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["meta_id"], "m-1");
    assert_eq!(listed[0]["reason"], "failed");
    assert_eq!(listed[0]["error"], "boom m-1");
    assert_eq!(listed[0]["attempts"], 3);
    assert_eq!(listed[0]["failed_at_utc"], "2023-11-14T22:13:20.123Z");
    assert_eq!(listed[1]["meta_id"], "m-2");
    assert_eq!(listed[1]["original_queue"], other.as_str());
    assert_eq!(ready(&ch, &dlq).await, 5);
    let o = run_on(&url, &["dlq", "list", &queue]);
    let text = stdout(&o);
    assert!(text.contains("5 dead letter(s), showing 5"), "{text}");
    assert!(text.contains("poison wrapper"), "{text}");
    assert!(text.contains("meta.id=m-3"), "{text}");
    assert_eq!(ready(&ch, &dlq).await, 5);
    let o = run_on(&url, &["dlq", "list", &queue, "--help"]);
    assert!(stdout(&o).contains("redelivered"), "{}", stdout(&o));

    // requeue --id m-2: to its original queue, block gone, attempts 0, headers kept; the
    // others stay.
    let o = run_on(&url, &["dlq", "requeue", &queue, "--id", "m-2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("requeued meta.id=m-2 to {other}")),
        "{}",
        stdout(&o)
    );
    assert_eq!(ready(&ch, &dlq).await, 4);
    assert_eq!(ready(&ch, &queue).await, 0);
    let back = take(&ch, &other).await;
    assert_eq!(
        String::from_utf8(back.data).unwrap(),
        format!(
            r#"{{"job":"urn:babel:test:charge","trace_id":"t-m-2","data":{{"z":1,"a":2}},"meta":{{"id":"m-2","queue":"{other}","lang":"go","schema_version":1,"created_at":1}},"attempts":0,"x_extra":true}}"#
        )
    );
    let props = back.properties;
    assert_eq!(
        props.message_id().as_ref().map(ShortString::as_str),
        Some("m-2")
    );
    assert_eq!(props.delivery_mode(), &Some(2));
    let h = props.headers().as_ref().expect("headers");
    assert_eq!(
        h.inner().get("traceparent"),
        Some(&AMQPValue::LongString(LongString::from("00-abc-def-01")))
    );
    assert_eq!(h.inner().get("x-attempts"), Some(&AMQPValue::LongInt(0)));
    let o = run_on(&url, &["dlq", "requeue", &queue, "--id", "m-2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no dead letter with meta.id m-2"),
        "{}",
        stderr(&o)
    );
    assert_eq!(ready(&ch, &dlq).await, 4);

    // requeue --all: m-1 and m-3 move (in order); the poison wrapper and the text stay.
    let o = run_on(
        &url,
        &["dlq", "requeue", &queue, "--all", "--keep-attempts"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("skipped 1 poison wrapper"), "{err}");
    assert!(
        err.contains("skipped 1 dead letter(s) that are not JSON"),
        "{err}"
    );
    assert!(
        stdout(&o).contains(&format!("requeued 2 dead letter(s) from {dlq} to {queue}")),
        "{}",
        stdout(&o)
    );
    assert_eq!(ready(&ch, &queue).await, 2);
    for id in ["m-1", "m-3"] {
        let m = take(&ch, &queue).await;
        let v: Value = serde_json::from_slice(&m.data).unwrap();
        assert_eq!(v["meta"]["id"], id);
        assert_eq!(v["attempts"], 3, "--keep-attempts");
        assert!(v.get("dead_letter").is_none());
    }
    assert_eq!(ready(&ch, &dlq).await, 2);

    // recover-poison: the original bytes; the text body stays.
    let o = run_on(&url, &["dlq", "recover-poison", &queue, "--to", &to]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("recovered 1 poison message(s)"),
        "{}",
        stdout(&o)
    );
    assert_eq!(take(&ch, &to).await.data, garbage);
    assert_eq!(ready(&ch, &dlq).await, 1);
    assert_eq!(take(&ch, &dlq).await.data, b"plain text");

    // The last requeue of an empty dead-letter queue moves nothing and is no error.
    let o = run_on(&url, &["dlq", "requeue", &queue, "--all"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("requeued 0 dead letter(s)"),
        "{}",
        stdout(&o)
    );
    assert_eq!(ready(&ch, &dlq).await, 0);

    delete_queues(&ch, &[queue, dlq, other, to]).await;
    conn.close(200, ShortString::from("done")).await.unwrap();
}
