//! The child processes of the kill and fleet tests: one example binary of this package,
//! `test_children` (`tests/children/`), whose first argument names the child
//! (`fleet-consumer`, `amqp-consumer`, `sqs-consumer`, `kafka-consumer`, `outbox-relay`,
//! `redrive`). It is built by the same cargo (target dir, profile, and the test binary's
//! `kafka` feature) as the test that starts it, so it is never stale.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The `test_children` binary, built on first use.
pub fn exe() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // <target>/<profile>/deps/<this test>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test executable lives in <target>/<profile>/deps");
        let mut build = Command::new(env!("CARGO"));
        build
            .args([
                "build",
                "--quiet",
                "-p",
                "babelqueue",
                "--example",
                "test_children",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if cfg!(feature = "kafka") {
            build.args(["--features", "kafka"]);
        }
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build
            .status()
            .expect("run cargo build --example test_children");
        assert!(
            status.success(),
            "cargo build --example test_children failed"
        );
        profile_dir
            .join("examples")
            .join(format!("test_children{}", std::env::consts::EXE_SUFFIX))
    })
}
