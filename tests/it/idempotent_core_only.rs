//! The generated code names the runtime crate by the name the user's `Cargo.toml` gives
//! it: this builds and runs two small crates of their own, one depending on
//! `babelqueue-core` + `babelqueue-runtime` + `babelqueue-macros` only (no facade), one depending on the facade
//! under another name (`bq = { package = "babelqueue" }`), both using the macros
//! without `crate = ...`.
//!
//! Ignored by default because it compiles the dependency graph again (about a minute the
//! first time); CI runs it with `--include-ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

const MAIN_CORE_ONLY: &str = r#"
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue_core::{Envelope, InMemoryStore, Outcome};
use babelqueue_runtime::Router;
use babelqueue_macros::{handler, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGED: AtomicU32 = AtomicU32::new(0);

#[handler("urn:babel:payments:charge")]
#[idempotent(store = STORE, ttl = "1h")]
async fn charge(env: &Envelope) -> Result<(), std::io::Error> {
    let _ = env;
    CHARGED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[idempotent(store = STORE)]
fn refund(env: &Envelope) {
    let _ = env;
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
        charge(&env).await.unwrap();
        let router = Router::new().register(charge {});
        let out = router.dispatch(env.clone()).await.unwrap().unwrap();
        assert_eq!(out, Some(Outcome::Skipped));
        refund(&env);
        assert_eq!(CHARGED.load(Ordering::SeqCst), 1);
        println!("runtime-only ok");
    });
}
"#;

const MAIN_RENAMED_FACADE: &str = r#"
use std::sync::LazyLock;

use bq::{Envelope, InMemoryStore, Router, handler, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[handler("urn:babel:payments:refund")]
#[idempotent(store = STORE)]
fn refund(env: &Envelope) {
    let _ = env;
}

fn main() {
    let env = Envelope::new("urn:babel:payments:refund", serde_json::json!({})).unwrap();
    refund(&env);
    assert!(Router::new().register(refund {}).get("urn:babel:payments:refund").is_some());
    println!("renamed facade ok");
}
"#;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Writes a crate with `dependencies` and `main`, then `cargo run`s it offline, reusing
/// this workspace's lock file so the same dependency versions are used.
fn build_and_run(name: &str, dependencies: &str, main: &str) -> String {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("macro-crate-paths");
    let dir = tmp.join(name);
    std::fs::create_dir_all(dir.join("src")).expect("create crate dir");
    let manifest = format!(
        "[package]\nname = \"{name}\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [dependencies]\n{dependencies}\nserde_json = \"1\"\n\
         tokio = {{ version = \"1\", features = [\"rt\"] }}\n\n[workspace]\n"
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).expect("write Cargo.toml");
    std::fs::write(dir.join("src/main.rs"), main).expect("write main.rs");
    std::fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).expect("copy Cargo.lock");
    let out = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args(["run", "--offline", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", tmp.join("target"))
        .env_remove("CARGO_TARGET_TMPDIR")
        .output()
        .expect("run cargo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} failed to build or run:\n{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn dep(name: &str, path: &Path) -> String {
    format!("{name} = {{ path = {:?} }}", path.display().to_string())
}

#[test]
#[ignore = "compiles two crates of its own (about a minute); CI runs it with --include-ignored"]
fn a_crate_without_the_facade_needs_no_crate_argument() {
    let deps = format!(
        "{}\n{}\n{}",
        dep("babelqueue-core", &root().join("babelqueue-core")),
        dep("babelqueue-runtime", &root().join("babelqueue-runtime")),
        dep("babelqueue-macros", &root().join("babelqueue-macros")),
    );
    let stdout = build_and_run("runtime-only-user", &deps, MAIN_CORE_ONLY);
    assert_eq!(stdout.trim(), "runtime-only ok");
}

#[test]
#[ignore = "compiles two crates of its own (about a minute); CI runs it with --include-ignored"]
fn a_renamed_facade_is_found() {
    let deps = format!(
        "bq = {{ package = \"babelqueue\", path = {:?} }}",
        root().display().to_string()
    );
    let stdout = build_and_run("renamed-facade-user", &deps, MAIN_RENAMED_FACADE);
    assert_eq!(stdout.trim(), "renamed facade ok");
}
