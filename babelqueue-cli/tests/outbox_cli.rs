//! `babelqueue outbox relay`, the built binary end to end: usage and errors (always), and a
//! relay of SQLite and PostgreSQL outboxes onto the local Redis (ignored; CI runs them).

use std::process::{Command, Output};

use babelqueue_core::Envelope;
use babelqueue_sqlite::{SqliteOutbox, rusqlite};

const BIN: &str = env!("CARGO_BIN_EXE_babelqueue");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("BROKER_URL")
        .output()
        .expect("the babelqueue binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn postgres_url() -> String {
    std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn unique(name: &str) -> String {
    format!("bq_cli_outbox_{name}_{}", uuid::Uuid::new_v4().simple())
}

fn envelopes(queue: &str) -> Vec<Envelope> {
    (1..=3)
        .map(|i| {
            Envelope::new(
                "urn:babel:orders:created",
                serde_json::json!({"order_id": i}),
            )
            .unwrap()
            .with_queue(queue)
        })
        .collect()
}

/// Pops the whole list `queue` (the Redis transport's ready list) and deletes it.
async fn drain_redis(queue: &str) -> Vec<Vec<u8>> {
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(queue)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(queue)
        .query_async(&mut conn)
        .await
        .unwrap();
    items
}

#[test]
fn usage_and_a_missing_database() {
    let o = run(&["outbox", "relay", "--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("--once"));
    let o = run(&["outbox", "relay"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["outbox", "relay", "sqlite:/nonexistent/shop.db", "--once"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("no SQLite database at /nonexistent/shop.db"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
fn relays_a_sqlite_outbox_to_redis() {
    let queue = unique("sqlite");
    let dir = std::env::temp_dir().join(unique("dir"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shop.db");
    let outbox = SqliteOutbox::open(&path).unwrap();
    let envs = envelopes(&queue);
    let mut conn = rusqlite::Connection::open(&path).unwrap();
    let tx = conn.transaction().unwrap();
    for env in &envs {
        outbox.save(&tx, env).unwrap();
    }
    tx.commit().unwrap();

    let db = format!("sqlite:{}", path.display());
    let o = run(&["outbox", "relay", &db, "--broker", &redis_url(), "--once"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("published 3 row(s)"),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(outbox.pending().unwrap(), 0);
    // A second run finds nothing left.
    let o = run(&["outbox", "relay", &db, "--broker", &redis_url(), "--once"]);
    assert!(
        text(&o.stdout).contains("published 0 row(s)"),
        "{}",
        text(&o.stdout)
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let got = rt.block_on(drain_redis(&queue));
    assert_eq!(got, envs.iter().map(Envelope::encode).collect::<Vec<_>>());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs Redis (BABELQUEUE_REDIS_URL) and PostgreSQL (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
fn relays_a_postgres_outbox_to_redis() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let queue = unique("pg");
    let table = unique("table");
    let envs = envelopes(&queue);
    rt.block_on(async {
        let store = babelqueue_postgres::PostgresStore::connect(&postgres_url())
            .await
            .unwrap();
        let outbox =
            babelqueue_postgres::PostgresOutbox::with_table(store.pool().clone(), &table).unwrap();
        outbox.migrate().await.unwrap();
        let mut client = store.pool().get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        for env in &envs {
            outbox.save(&tx, env).await.unwrap();
        }
        tx.commit().await.unwrap();
    });

    let o = run(&[
        "outbox",
        "relay",
        &postgres_url(),
        "--table",
        &table,
        "--broker",
        &redis_url(),
        "--once",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("published 3 row(s)"),
        "{}",
        text(&o.stdout)
    );
    let got = rt.block_on(drain_redis(&queue));
    assert_eq!(got, envs.iter().map(Envelope::encode).collect::<Vec<_>>());
    rt.block_on(async {
        let store = babelqueue_postgres::PostgresStore::connect(&postgres_url())
            .await
            .unwrap();
        let client = store.pool().get().await.unwrap();
        client
            .batch_execute(&format!("DROP TABLE \"{table}\""))
            .await
            .unwrap();
    });
}
