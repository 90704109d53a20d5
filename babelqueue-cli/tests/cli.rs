//! The built `babelqueue` binary, end to end: against SQLite files it makes (always),
//! and against the local Redis and PostgreSQL (ignored; CI runs them).

use std::process::{Command, Output};

use babelqueue_core::Envelope;
use babelqueue_core::runtime::poison_body;
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
