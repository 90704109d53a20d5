//! `cargo run --example ledger` end to end: a consumer crashing before its commit leaves
//! one ledger row in transactional mode and two with the seen-set guard. Needs Redis and
//! PostgreSQL; ignored by default, CI runs it with `--include-ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The example binary, built by the same cargo (target dir and profile) as this test.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/<profile>/deps/<this test>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in <target>/<profile>/deps");
    let mut build = Command::new(env!("CARGO"));
    build
        .args(["build", "--quiet", "--example", "ledger"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    assert!(
        build.status().expect("run cargo build").success(),
        "cargo build --example ledger failed"
    );
    profile_dir
        .join("examples")
        .join(format!("ledger{}", std::env::consts::EXE_SUFFIX))
}

#[test]
#[ignore = "needs Redis at 127.0.0.1:6379 and PostgreSQL at 127.0.0.1:5432 (BABELQUEUE_REDIS_URL, BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
fn the_ledger_example_prints_one_row_then_two_with_the_seen_set_guard() {
    let mut cmd = Command::new(example());
    if let Ok(url) = std::env::var("BABELQUEUE_REDIS_URL") {
        cmd.env("BROKER_URL", url);
    }
    if let Ok(url) = std::env::var("BABELQUEUE_POSTGRES_URL") {
        cmd.env("POSTGRES_URL", url);
    }
    let out = cmd.output().expect("run the ledger example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("ledger rows for "))
        .collect();
    assert_eq!(
        lines,
        [
            "ledger rows for pay_7f3a: 1",
            "ledger rows for pay_7f3a (seen-set guard): 2"
        ],
        "{stdout}"
    );
    // Both rounds really crashed a consumer and recovered its message.
    assert_eq!(stdout.matches("consumer 1 died").count(), 2, "{stdout}");
    assert_eq!(
        stdout
            .matches("consumer 2: recovered 1 in-flight message(s)")
            .count(),
        2,
        "{stdout}"
    );
}
