//! `babelqueue dlq redrive`, the built binary end to end: its help, usage errors, and a
//! dry run then a real run with `--bypass` over the local Redis (ignored; CI runs it).

use std::process::{Command, Output};

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

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

#[test]
fn help_shows_redrive_and_its_options() {
    let o = run(&["dlq", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("redrive"), "{}", stdout(&o));
    let o = run(&["dlq", "redrive", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = stdout(&o);
    for flag in [
        "--to",
        "--max",
        "--dry-run",
        "--reason",
        "--urn",
        "--bypass",
        "--json",
        "--dlq",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    let o = run(&["dlq", "redrive"]);
    assert_eq!(o.status.code(), Some(2), "the queue is required");
    let o = run(&["dlq", "redrive", "q", "--max", "many"]);
    assert_eq!(o.status.code(), Some(2));
}

/// Deletes the queue's keys at the end.
struct Keys(String);

impl Drop for Keys {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(redis_url())
            && let Ok(mut c) = client.get_connection()
        {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("*{}*", self.0))
                .query(&mut c)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut c);
            }
        }
    }
}

#[test]
#[ignore = "needs Redis; CI runs it with --ignored"]
fn dry_run_then_redrive_with_bypass() {
    let q = format!("bq_cli_redrive_{}", uuid::Uuid::new_v4().simple());
    let _keys = Keys(q.clone());
    let dlq = format!("{q}.dlq");
    let client = redis::Client::open(redis_url()).unwrap();
    let mut c = client.get_connection().expect("Redis must be reachable");
    let dead = json!({
        "job": "urn:babel:payments:charge", "trace_id": "t-1", "data": {"amount": 4200},
        "meta": {"id": "m-1", "queue": q, "lang": "python", "schema_version": 1, "created_at": 1},
        "attempts": 3,
        "dead_letter": {"reason": "failed", "error": "declined", "exception": null,
                        "failed_at": 2, "original_queue": q, "attempts": 3, "lang": "python"}
    })
    .to_string();
    let _: () = redis::cmd("RPUSH")
        .arg(&dlq)
        .arg(&dead)
        .arg("not json")
        .query(&mut c)
        .unwrap();
    let url = redis_url();

    let o = run(&["dlq", "redrive", &q, "--url", &url, "--dry-run"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.starts_with(&format!("DRY RUN on {dlq}")), "{out}");
    assert!(out.contains("planned"), "{out}");
    assert!(
        out.contains(&format!("{dlq}: 2 taken, 0 redriven")),
        "{out}"
    );
    let left: Vec<String> = redis::cmd("LRANGE")
        .arg(&dlq)
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(left, [dead.clone(), "not json".to_owned()]);

    let o = run(&["dlq", "redrive", &q, "--url", &url, "--bypass", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let result: Value = serde_json::from_str(stdout(&o).trim()).expect("one JSON object");
    assert_eq!(result["redriven"], 1);
    assert_eq!(result["restored"], 1);
    assert_eq!(result["items"][0]["bypassed"], true);
    assert_eq!(result["items"][0]["status"], "redriven");
    assert_eq!(result["items"][1]["status"], "undecodable");
    let target: Vec<String> = redis::cmd("LRANGE")
        .arg(&q)
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(target.len(), 1);
    let frame: Value = serde_json::from_str(&target[0]).unwrap();
    assert_eq!(frame["headers"]["bq-replay-bypass"], "1");
    let body: Value = serde_json::from_str(frame["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["attempts"], 0);
    assert!(body.get("dead_letter").is_none());
    let left: Vec<String> = redis::cmd("LRANGE")
        .arg(&dlq)
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(left, ["not json"]);
}
