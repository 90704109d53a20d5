//! The newcomer's check: every `rust` code block of `README.md` compiles, as it stands,
//! in a fresh crate whose `[dependencies]` are exactly the README's `toml` block (with
//! `babelqueue` pointed at this checkout). The doctest build of the README (src/lib.rs)
//! has every dev-dependency of this package at hand; this one has only what a user who
//! copies the README has.
//!
//! Ignored by default (it builds a crate from scratch: minutes when cold); CI runs it.
//! The build directory is `target/readme-check`, kept between runs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fenced blocks of `markdown`: (info string, body).
fn blocks(markdown: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        match current.as_mut() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    current = Some((info.trim().to_owned(), String::new()));
                }
            }
            Some((_, body)) => {
                if trimmed.starts_with("```") {
                    out.push(current.take().unwrap());
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    out
}

fn is_rust(info: &str) -> bool {
    let mut parts = info.split(',').map(str::trim);
    parts.next() == Some("rust") && !info.contains("ignore")
}

/// The README's dependency block with `babelqueue` taken from `root` by path.
fn manifest(readme_toml: &str, root: &Path) -> String {
    let mut deps = String::new();
    let mut found = false;
    for line in readme_toml.lines() {
        let code = line.split(" #").next().unwrap_or(line).trim_end();
        if code.trim() == "[dependencies]" || code.trim().is_empty() {
            continue;
        }
        if let Some(rest) = code.strip_prefix("babelqueue = {") {
            found = true;
            deps.push_str(&format!(
                "babelqueue = {{ path = {:?},{rest}\n",
                root.display().to_string()
            ));
        } else {
            deps.push_str(code);
            deps.push('\n');
        }
    }
    assert!(
        found,
        "the README's toml block must list `babelqueue = {{ … }}`"
    );
    format!(
        "[package]\nname = \"readme-check\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [workspace]\n\n[dependencies]\n{deps}"
    )
}

#[test]
fn block_extraction() {
    let md = "x\n```toml\n[dependencies]\na = \"1\"\n```\n\n```rust,no_run\nfn main() {}\n```\n```text\nout\n```\n";
    let b = blocks(md);
    assert_eq!(b.len(), 3);
    assert!(is_rust(&b[1].0) && !is_rust(&b[0].0) && !is_rust(&b[2].0));
    let m = manifest(
        "[dependencies]\nbabelqueue = { version = \"0.1\", features = [\"full\"] } # note\ntokio = \"1\"\n",
        Path::new("/r"),
    );
    assert!(
        m.contains("babelqueue = { path = \"/r\", version = \"0.1\", features = [\"full\"] }\n")
    );
    assert!(m.contains("\ntokio = \"1\"\n"));
}

#[test]
#[ignore = "slow: builds a fresh crate with exactly the README's dependencies; CI runs it with --ignored"]
fn readme_blocks_compile_with_exactly_the_listed_dependencies() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let all = blocks(&readme);
    let tomls: Vec<&String> = all
        .iter()
        .filter(|(info, body)| info == "toml" && body.contains("[dependencies]"))
        .map(|(_, body)| body)
        .collect();
    assert_eq!(
        tomls.len(),
        1,
        "the README lists its dependencies in exactly one ```toml block"
    );
    let rust: Vec<&String> = all
        .iter()
        .filter(|(info, _)| is_rust(info))
        .map(|(_, body)| body)
        .collect();
    assert!(!rust.is_empty());

    let dir = root.join("target").join("readme-check");
    let krate = dir.join("crate");
    let _ = std::fs::remove_dir_all(&krate);
    std::fs::create_dir_all(krate.join("src/bin")).unwrap();
    std::fs::write(krate.join("Cargo.toml"), manifest(tomls[0], &root)).unwrap();
    // The workspace's lock file: the same versions as the tests, builds reused.
    std::fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    for (i, body) in rust.iter().enumerate() {
        assert!(
            body.contains("fn main"),
            "README rust block {} has no `fn main`: a reader cannot run it as it stands",
            i + 1
        );
        std::fs::write(krate.join(format!("src/bin/block{}.rs", i + 1)), body).unwrap();
    }
    let out = Command::new(env!("CARGO"))
        .args(["check", "--bins", "--quiet", "--message-format", "short"])
        .current_dir(&krate)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "README blocks do not compile with the README's dependencies:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
