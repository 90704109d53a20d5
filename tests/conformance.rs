//! Runs a BabelQueue conformance manifest generically, one named test per case.
//!
//! * `BABELQUEUE_CONFORMANCE_DIR=../shared/conformance cargo test --test conformance` runs
//!   the canonical cross-SDK suite (CI does);
//! * without the variable it runs the project's own cases in `tests/conformance-local`.
//!
//! A variable pointing at a directory that does not exist fails the run loudly.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use babelqueue::{DedupeKey, Envelope, Guard, InMemoryStore, Outcome, Store};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::Value;

fn manifest_dir() -> Result<PathBuf, String> {
    match std::env::var_os("BABELQUEUE_CONFORMANCE_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            let dir = if dir.is_relative() {
                // cargo runs tests from the package root; resolve from there explicitly.
                Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)
            } else {
                dir
            };
            if !dir.join("manifest.json").is_file() {
                return Err(format!(
                    "BABELQUEUE_CONFORMANCE_DIR={} has no manifest.json (does the directory exist?)",
                    dir.display()
                ));
            }
            Ok(dir)
        }
        None => Ok(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance-local")),
    }
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let dir = match manifest_dir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("conformance: {e}");
            return ExitCode::FAILURE;
        }
    };
    let manifest: Value = match std::fs::read(dir.join("manifest.json"))
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(v) => v,
        Err(e) => {
            eprintln!(
                "conformance: cannot read {}/manifest.json: {e}",
                dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "conformance: running manifest {}",
        dir.join("manifest.json").display()
    );
    if let Some(obj) = manifest.as_object() {
        for key in obj.keys() {
            let note = match key.as_str() {
                "schema_version" | "description" | "cases" | "idempotency" => continue,
                "redis" => "run by tests/redis_transport.rs (needs a Redis server)",
                "payload_schema" => {
                    "not run: this SDK has no payload validator (optional, ADR-0024)"
                }
                _ => "not run: this SDK has no such transport",
            };
            eprintln!("conformance: block `{key}`: {note}");
        }
    }
    let trials = match trials(&dir, &manifest) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("conformance: malformed manifest: {e}");
            return ExitCode::FAILURE;
        }
    };
    if trials.is_empty() {
        eprintln!("conformance: the manifest has no cases");
        return ExitCode::FAILURE;
    }
    libtest_mimic::run(&args, trials).exit_code()
}

fn trials(dir: &Path, manifest: &Value) -> Result<Vec<Trial>, String> {
    let mut out = Vec::new();
    let cases = manifest["cases"].as_array().ok_or("no `cases` array")?;
    for case in cases {
        let name = case["name"]
            .as_str()
            .ok_or("a case has no name")?
            .to_owned();
        let case = case.clone();
        let dir = dir.to_owned();
        out.push(Trial::test(format!("envelope::{name}"), move || {
            envelope_case(&dir, &case)
        }));
    }
    let idem = &manifest["idempotency"];
    if let Some(dk) = idem.get("dedup_key") {
        let dk = dk.clone();
        let dir = dir.to_owned();
        out.push(Trial::test("idempotency::dedup_key", move || {
            dedup_key_case(&dir, &dk)
        }));
    }
    if let Some(seqs) = idem["sequences"]["cases"].as_array() {
        for seq in seqs {
            let name = seq["name"]
                .as_str()
                .ok_or("a sequence has no name")?
                .to_owned();
            let s1 = seq.clone();
            out.push(Trial::test(
                format!("idempotency::sequence::{name}::sync"),
                move || sequence_sync(&s1),
            ));
            let s2 = seq.clone();
            out.push(Trial::test(
                format!("idempotency::sequence::{name}::async"),
                move || sequence_async(&s2),
            ));
        }
    }
    Ok(out)
}

fn fail(msg: impl Into<String>) -> Failed {
    Failed::from(msg.into())
}

fn read(dir: &Path, file: &Value) -> Result<Vec<u8>, Failed> {
    let file = file.as_str().ok_or_else(|| fail("case has no `file`"))?;
    std::fs::read(dir.join(file)).map_err(|e| fail(format!("cannot read {file}: {e}")))
}

fn envelope_case(dir: &Path, case: &Value) -> Result<(), Failed> {
    let bytes = read(dir, &case["file"])?;
    let valid = case["valid"]
        .as_bool()
        .ok_or_else(|| fail("case has no boolean `valid`"))?;
    let decoded = Envelope::decode(&bytes);
    if Envelope::accepts(&bytes) != valid {
        return Err(fail(format!(
            "accepts() = {}, manifest says valid = {valid} ({:?})",
            !valid,
            decoded.err()
        )));
    }
    if !valid {
        return match decoded {
            Err(_) => Ok(()),
            Ok(env) => Err(fail(format!("decoded an invalid envelope: {env:?}"))),
        };
    }
    let env = decoded.map_err(|e| fail(format!("valid case rejected: {e}")))?;
    let expect = &case["expect"];
    check_eq("urn", &Value::from(env.urn()), &expect["urn"])?;
    check_eq("data", &Value::Object(env.data.clone()), &expect["data"])?;
    check_eq("attempts", &Value::from(env.attempts), &expect["attempts"])?;
    check_eq(
        "lang",
        &Value::from(env.meta.lang.as_str()),
        &expect["lang"],
    )?;
    check_eq(
        "schema_version",
        &Value::from(env.meta.schema_version),
        &expect["schema_version"],
    )?;
    if let Some(dl_expect) = expect.get("dead_letter").and_then(Value::as_object) {
        let dl = env
            .dead_letter
            .as_ref()
            .ok_or_else(|| fail("expected a dead_letter block, decoded none"))?;
        let dl = serde_json::to_value(dl).map_err(|e| fail(e.to_string()))?;
        for (k, v) in dl_expect {
            check_eq(&format!("dead_letter.{k}"), &dl[k], v)?;
        }
    }
    // Every accepted envelope survives an encode/decode round trip unchanged.
    let again = Envelope::decode(&env.encode()).map_err(|e| fail(format!("re-decode: {e}")))?;
    if again != env {
        return Err(fail(format!(
            "round trip changed the envelope:\n{env:?}\n{again:?}"
        )));
    }
    if case["byte_identical"].as_bool() == Some(true) {
        let trimmed = bytes.trim_ascii_end();
        if env.encode() != trimmed {
            return Err(fail(format!(
                "re-encoding is not byte-identical:\n file: {}\n ours: {}",
                String::from_utf8_lossy(trimmed),
                env.encode_string()
            )));
        }
    }
    Ok(())
}

fn check_eq(what: &str, got: &Value, want: &Value) -> Result<(), Failed> {
    if got != want {
        return Err(fail(format!("{what}: got {got}, expected {want}")));
    }
    Ok(())
}

fn dedup_key_case(dir: &Path, dk: &Value) -> Result<(), Failed> {
    if dk["key_field"].as_str() != Some("meta.id") {
        return Err(fail(format!(
            "unsupported key_field {}; this SDK keys on meta.id",
            dk["key_field"]
        )));
    }
    let env = Envelope::decode(&read(dir, &dk["envelope_file"])?)
        .map_err(|e| fail(format!("envelope rejected: {e}")))?;
    let want = dk["expected_key"]
        .as_str()
        .ok_or_else(|| fail("no expected_key"))?;
    let got = env.dedupe_key();
    if got.as_deref() != Some(want) {
        return Err(fail(format!("key {got:?}, expected {want}")));
    }
    if got.as_deref() == Some(env.trace_id.as_str()) {
        return Err(fail("the key must not be the trace_id"));
    }
    Ok(())
}

/// One delivery of a sequence, parsed.
struct Delivery {
    meta_id: String,
    forget_before: bool,
    expect_run: bool,
    ok: bool,
}

fn deliveries(seq: &Value) -> Result<(Vec<Delivery>, u64), Failed> {
    let list = seq["deliveries"]
        .as_array()
        .ok_or_else(|| fail("sequence has no deliveries"))?;
    let mut out = Vec::new();
    for d in list {
        let expect_run = match d["expect_effect"].as_str() {
            Some("run") => true,
            Some("skip") => false,
            other => return Err(fail(format!("unknown expect_effect {other:?}"))),
        };
        let ok = match d["outcome"].as_str() {
            Some("ok") | None => true,
            Some("throw") => false,
            Some(other) => return Err(fail(format!("unknown outcome {other}"))),
        };
        out.push(Delivery {
            meta_id: d["meta_id"].as_str().unwrap_or_default().to_owned(),
            forget_before: d["forget_before"].as_bool().unwrap_or(false),
            expect_run,
            ok,
        });
    }
    let expected = seq["expected_effects"]
        .as_u64()
        .ok_or_else(|| fail("sequence has no expected_effects"))?;
    Ok((out, expected))
}

fn envelope_with_id(id: &str) -> Result<Envelope, Failed> {
    let mut env = Envelope::new("urn:babel:conformance:effect", serde_json::json!({}))
        .map_err(|e| fail(e.to_string()))?;
    env.meta.id = id.to_owned();
    Ok(env)
}

#[derive(Debug, thiserror::Error)]
#[error("handler threw (as the sequence asks)")]
struct Thrown;

fn check_delivery(i: usize, d: &Delivery, ran: bool, result_ok: bool) -> Result<(), Failed> {
    if ran != d.expect_run {
        return Err(fail(format!(
            "delivery {i} (meta_id {:?}): expected {}, the guard {}",
            d.meta_id,
            if d.expect_run { "run" } else { "skip" },
            if ran { "ran the handler" } else { "skipped it" }
        )));
    }
    if result_ok != (d.ok || !d.expect_run) {
        return Err(fail(format!(
            "delivery {i}: the guard returned {} for a handler outcome {}",
            if result_ok { "Ok" } else { "Err" },
            if d.ok { "ok" } else { "throw" }
        )));
    }
    Ok(())
}

fn sequence_sync(seq: &Value) -> Result<(), Failed> {
    let (list, expected) = deliveries(seq)?;
    let store = InMemoryStore::new();
    let mut effects = 0u64;
    for (i, d) in list.iter().enumerate() {
        if d.forget_before {
            Store::forget(&store, &d.meta_id).map_err(|e| fail(e.to_string()))?;
        }
        let env = envelope_with_id(&d.meta_id)?;
        let mut ran = false;
        let result = Guard::new(&store).run(&env, || {
            ran = true;
            effects += 1;
            if d.ok { Ok(()) } else { Err(Thrown) }
        });
        if let Ok(outcome) = &result
            && outcome.ran() != ran
        {
            return Err(fail(format!(
                "delivery {i}: Outcome {outcome:?} but ran = {ran}"
            )));
        }
        check_delivery(i, d, ran, result.is_ok())?;
    }
    if effects != expected {
        return Err(fail(format!(
            "{effects} handler invocations, expected_effects = {expected}"
        )));
    }
    Ok(())
}

fn sequence_async(seq: &Value) -> Result<(), Failed> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| fail(e.to_string()))?;
    rt.block_on(async {
        let (list, expected) = deliveries(seq)?;
        let store = InMemoryStore::new();
        let mut effects = 0u64;
        for (i, d) in list.iter().enumerate() {
            if d.forget_before {
                babelqueue::AsyncStore::forget(&store, &d.meta_id)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
            }
            let env = envelope_with_id(&d.meta_id)?;
            let mut ran = false;
            let result = Guard::new(&store)
                .run_async(&env, async {
                    ran = true;
                    effects += 1;
                    if d.ok { Ok(()) } else { Err(Thrown) }
                })
                .await;
            if let Ok(outcome) = &result
                && (*outcome == Outcome::Skipped) == ran
            {
                return Err(fail(format!(
                    "delivery {i}: Outcome {outcome:?} but ran = {ran}"
                )));
            }
            check_delivery(i, d, ran, result.is_ok())?;
        }
        if effects != expected {
            return Err(fail(format!(
                "{effects} handler invocations, expected_effects = {expected}"
            )));
        }
        Ok(())
    })
}
