//! Payload schemas (ADR-0024), one named test per case:
//!
//! * `payload_schema::<dialect>::<case>`: every case of the canonical suite's
//!   `payload_schema` block (`BABELQUEUE_CONFORMANCE_DIR=../shared/conformance cargo test
//!   --test schema_conformance`), in both dialects; without the variable they are skipped,
//!   with the reason printed;
//! * `dir_provider::*`: the suite's schema (or a local one) served from a `registry.json`
//!   in a temporary directory;
//! * `producer::*`: `App::publish` refuses invalid data and names the path and the rule;
//! * `python_verdicts::*`: edge cases of the family's subset, checked against the upstream
//!   Python SDK's validator (`BABELQUEUE_PYTHON`, else `target/interop-venv/bin/python`,
//!   with `babelqueue==1.24.0`); skipped, with the reason printed, when it is not there.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;

use babelqueue::runtime::{App, InMemoryTransport, PublishError};
use babelqueue::schema::{Dialect, DirProvider, InMemoryProvider, Schemas};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::{Value, json};

fn suite_dir() -> Result<Option<PathBuf>, String> {
    let Some(dir) = std::env::var_os("BABELQUEUE_CONFORMANCE_DIR") else {
        return Ok(None);
    };
    let dir = PathBuf::from(dir);
    let dir = if dir.is_relative() {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)
    } else {
        dir
    };
    if !dir.join("manifest.json").is_file() {
        return Err(format!(
            "BABELQUEUE_CONFORMANCE_DIR={} has no manifest.json",
            dir.display()
        ));
    }
    Ok(Some(dir))
}

/// The `payload_schema` block: its schema and its `(name, valid, data)` cases.
struct Block {
    schema: Value,
    cases: Vec<(String, bool, Value)>,
}

fn read_block(dir: &Path) -> Result<Block, String> {
    let text = std::fs::read_to_string(dir.join("manifest.json")).map_err(|e| e.to_string())?;
    let manifest: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let block = manifest
        .get("payload_schema")
        .ok_or("the manifest has no `payload_schema` block")?;
    let schema = block
        .get("schema")
        .filter(|s| s.is_object())
        .ok_or("`payload_schema.schema` is not an object")?
        .clone();
    let cases = block
        .get("cases")
        .and_then(Value::as_array)
        .ok_or("`payload_schema.cases` is not an array")?
        .iter()
        .map(|c| {
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .ok_or("a case without a name")?;
            let valid = c
                .get("valid")
                .and_then(Value::as_bool)
                .ok_or_else(|| format!("case {name}: no boolean `valid`"))?;
            let data = c
                .get("data")
                .cloned()
                .ok_or_else(|| format!("case {name}: no `data`"))?;
            Ok((name.to_owned(), valid, data))
        })
        .collect::<Result<Vec<_>, String>>()?;
    if cases.is_empty() {
        return Err("`payload_schema` has no cases".into());
    }
    Ok(Block { schema, cases })
}

const URN: &str = "urn:babel:orders:created";

fn verdict(schemas: &Schemas, data: &Value) -> Result<bool, Failed> {
    match schemas.validate(URN, data) {
        Ok(()) => Ok(true),
        Err(e) if e.is_violation() => Ok(false),
        Err(e) => Err(format!("the schema did not load: {e}").into()),
    }
}

fn suite_trials(block: &Block) -> Vec<Trial> {
    let mut out = Vec::new();
    for (dialect, label) in [(Dialect::Family, "family"), (Dialect::Draft07, "draft07")] {
        let schemas = Arc::new(
            Schemas::new(InMemoryProvider::new().with(URN, block.schema.clone())).dialect(dialect),
        );
        for (name, valid, data) in &block.cases {
            let (schemas, valid, data) = (schemas.clone(), *valid, data.clone());
            out.push(Trial::test(
                format!("payload_schema::{label}::{name}"),
                move || {
                    let got = verdict(&schemas, &data)?;
                    if got != valid {
                        return Err(format!("valid = {got}, the suite says {valid}").into());
                    }
                    Ok(())
                },
            ));
        }
    }
    out
}

/// A `registry.json` in a fresh temporary directory, with `schema` at `orders/created.json`.
struct Registry(PathBuf);

impl Registry {
    fn new(tag: &str, schema: &Value) -> Registry {
        let dir =
            std::env::temp_dir().join(format!("bq-schema-registry-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("orders")).unwrap();
        std::fs::write(
            dir.join("registry.json"),
            serde_json::to_vec(&json!({"schemas": [
                {"urn": URN, "schema": "orders/created.json"},
                {"urn": "urn:babel:orders:missing", "schema": "orders/missing.json"},
                {"urn": 7, "schema": "ignored.json"},
            ]}))
            .unwrap(),
        )
        .unwrap();
        std::fs::write(
            dir.join("orders/created.json"),
            serde_json::to_vec(schema).unwrap(),
        )
        .unwrap();
        Registry(dir)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn local_schema() -> Value {
    json!({"type": "object", "required": ["order_id"],
           "properties": {"order_id": {"type": "integer", "minimum": 1},
                          "currency": {"enum": ["USD", "EUR"]}},
           "additionalProperties": false})
}

fn dir_provider_trials(block: Option<&Block>) -> Vec<Trial> {
    let (schema, cases) = match block {
        Some(b) => (b.schema.clone(), b.cases.clone()),
        None => (
            local_schema(),
            vec![
                (
                    "valid".to_owned(),
                    true,
                    json!({"order_id": 3, "currency": "EUR"}),
                ),
                ("below-minimum".to_owned(), false, json!({"order_id": 0})),
                (
                    "additional".to_owned(),
                    false,
                    json!({"order_id": 3, "x": 1}),
                ),
            ],
        ),
    };
    vec![
        Trial::test(
            "dir_provider::verdicts_from_a_registry_in_a_temp_dir",
            move || {
                let reg = Registry::new("verdicts", &schema);
                let provider = DirProvider::open(reg.0.join("registry.json"))?;
                let mut urns: Vec<&str> = provider.urns().collect();
                urns.sort_unstable();
                if urns != [URN, "urn:babel:orders:missing"] {
                    return Err(format!("urns {urns:?}").into());
                }
                let schemas = Schemas::new(provider);
                for (name, valid, data) in &cases {
                    if verdict(&schemas, data)? != *valid {
                        return Err(format!("case {name}: the verdict is not {valid}").into());
                    }
                }
                // A URN the manifest does not list is not checked.
                schemas.validate("urn:babel:unlisted", &json!({"anything": 1}))?;
                Ok(())
            },
        ),
        Trial::test("dir_provider::a_missing_schema_file_is_an_error", || {
            let reg = Registry::new("missing", &local_schema());
            let schemas = Schemas::new(DirProvider::open(reg.0.join("registry.json"))?);
            let err = schemas
                .validate("urn:babel:orders:missing", &json!({}))
                .expect_err("a listed URN whose file is missing must not pass silently");
            if err.is_violation() || !err.to_string().contains("missing.json") {
                return Err(format!("unexpected error: {err}").into());
            }
            Ok(())
        }),
        Trial::test("dir_provider::a_malformed_manifest_is_an_error", || {
            let reg = Registry::new("malformed", &local_schema());
            std::fs::write(reg.0.join("registry.json"), b"{\"schemas\": 3}").unwrap();
            let err = DirProvider::open(reg.0.join("registry.json")).unwrap_err();
            if !err.to_string().contains("not an array") {
                return Err(format!("unexpected error: {err}").into());
            }
            std::fs::write(reg.0.join("registry.json"), b"not json").unwrap();
            DirProvider::open(reg.0.join("registry.json")).unwrap_err();
            DirProvider::open(reg.0.join("absent.json")).unwrap_err();
            Ok(())
        }),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn producer_trials() -> Vec<Trial> {
    vec![
        Trial::test("producer::publish_refuses_invalid_data", || {
            runtime().block_on(async {
                let transport = InMemoryTransport::new();
                let app = App::new(transport.clone())
                    .queue("orders")
                    .schemas(Arc::new(Schemas::new(
                        InMemoryProvider::new().with(URN, local_schema()),
                    )));
                let err = app
                    .publish(URN, &json!({"order_id": 7, "currency": "GBP"}))
                    .await
                    .expect_err("GBP is not in the enum");
                let PublishError::Schema(e) = &err else {
                    return Err(format!("not a schema refusal: {err}").into());
                };
                let v = e.violation().ok_or("not a violation")?;
                if (v.urn(), v.path(), v.rule()) != (URN, "/currency", "enum") {
                    return Err(format!("wrong violation: {err}").into());
                }
                if !err.to_string().contains("/currency") || !err.to_string().contains("enum") {
                    return Err(format!("the message names neither path nor rule: {err}").into());
                }
                if transport.len("orders") != 0 {
                    return Err("an invalid payload was published".into());
                }
                // Valid data and URNs without a schema go out.
                app.publish(URN, &json!({"order_id": 7, "currency": "EUR"}))
                    .await?;
                app.publish("urn:babel:other", &json!({"free": "form"}))
                    .await?;
                if transport.len("orders") != 2 {
                    return Err("valid payloads were not published".into());
                }
                Ok(())
            })
        }),
        Trial::test("producer::check_names_the_path_for_the_consumer", || {
            let schemas = Schemas::new(InMemoryProvider::new().with(URN, local_schema()));
            let env = babelqueue::Envelope::new(URN, json!({"order_id": "seven"}))?;
            let err = schemas.check(&env).expect_err("a string is not an integer");
            let v = err.violation().ok_or("not a violation")?;
            if (v.path(), v.rule()) != ("/order_id", "type") {
                return Err(format!("wrong violation: {err}").into());
            }
            Ok(())
        }),
    ]
}

fn python() -> PathBuf {
    match std::env::var_os("BABELQUEUE_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/interop-venv/bin/python"),
    }
}

/// Edge cases of the subset where a full validator and the family differ, or where the
/// family's rules are easy to get wrong.
fn edge_cases() -> Vec<(&'static str, Value, Value)> {
    let obj = |props: Value| json!({"type": "object", "properties": props});
    vec![
        (
            "integer_written_7_0",
            obj(json!({"n": {"type": "integer"}})),
            json!({"n": 7.0}),
        ),
        (
            "integer_fraction",
            obj(json!({"n": {"type": "integer"}})),
            json!({"n": 7.5}),
        ),
        (
            "bool_is_not_integer",
            obj(json!({"n": {"type": "integer"}})),
            json!({"n": true}),
        ),
        (
            "bool_is_not_number",
            obj(json!({"n": {"type": "number"}})),
            json!({"n": false}),
        ),
        (
            "max_length_ignored",
            obj(json!({"s": {"type": "string", "maxLength": 1}})),
            json!({"s": "long"}),
        ),
        (
            "pattern_ignored",
            obj(json!({"s": {"type": "string", "pattern": "^x$"}})),
            json!({"s": "y"}),
        ),
        (
            "one_of_ignored",
            json!({"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}),
            json!({}),
        ),
        (
            "required_without_type_ignored",
            json!({"required": ["a"]}),
            json!({}),
        ),
        (
            "minimum_without_type_ignored",
            obj(json!({"n": {"minimum": 5}})),
            json!({"n": 1}),
        ),
        (
            "min_length_without_type_ignored",
            obj(json!({"s": {"minLength": 5}})),
            json!({"s": "a"}),
        ),
        (
            "min_length_counts_chars",
            obj(json!({"s": {"type": "string", "minLength": 2}})),
            json!({"s": "é"}),
        ),
        (
            "min_length_met",
            obj(json!({"s": {"type": "string", "minLength": 2}})),
            json!({"s": "éé"}),
        ),
        (
            "additional_schema_does_not_restrict",
            json!({"type": "object", "properties": {}, "additionalProperties": {"type": "string"}}),
            json!({"x": 1}),
        ),
        (
            "additional_false_restricts",
            json!({"type": "object", "properties": {"a": {}}, "additionalProperties": false}),
            json!({"a": 1, "b": 2}),
        ),
        (
            "nested_items",
            obj(json!({"l": {"type": "array", "items": {"type": "object", "required": ["sku"]}}})),
            json!({"l": [{"sku": 1}, {}]}),
        ),
        (
            "items_ok",
            obj(json!({"l": {"type": "array", "items": {"type": "integer", "minimum": 0}}})),
            json!({"l": [0, 1, 2]}),
        ),
        (
            "not_an_array",
            obj(json!({"l": {"type": "array"}})),
            json!({"l": {}}),
        ),
        (
            "const_string",
            obj(json!({"k": {"const": "v1"}})),
            json!({"k": "v2"}),
        ),
        (
            "const_object",
            obj(json!({"k": {"const": {"a": [1, 2]}}})),
            json!({"k": {"a": [1, 2]}}),
        ),
        (
            "enum_null",
            obj(json!({"k": {"enum": [null, "x"]}})),
            json!({"k": null}),
        ),
        (
            "enum_bool_vs_int",
            obj(json!({"k": {"enum": [1]}})),
            json!({"k": true}),
        ),
        (
            "null_type",
            obj(json!({"k": {"type": "null"}})),
            json!({"k": 0}),
        ),
        (
            "unknown_type_ignored",
            obj(json!({"k": {"type": "decimal"}})),
            json!({"k": "x"}),
        ),
        (
            "type_list_ignored",
            obj(json!({"k": {"type": ["string", "null"]}})),
            json!({"k": 5}),
        ),
        (
            "minimum_negative_ok",
            obj(json!({"n": {"type": "number", "minimum": -1.5}})),
            json!({"n": -1.5}),
        ),
        (
            "minimum_below",
            obj(json!({"n": {"type": "number", "minimum": -1.5}})),
            json!({"n": -1.6}),
        ),
        (
            "deep_object",
            obj(
                json!({"a": {"type": "object", "properties": {"b": {"type": "object", "required": ["c"]}}}}),
            ),
            json!({"a": {"b": {}}}),
        ),
    ]
}

const PY_JUDGE: &str = r#"
import json, sys
from babelqueue.schema import validate_schema
cases = json.load(sys.stdin)
print(json.dumps([validate_schema(schema, data) is None for schema, data in cases]))
"#;

fn python_trials() -> Result<Vec<Trial>, String> {
    let py = python();
    let cases = edge_cases();
    let input = serde_json::to_vec(
        &cases
            .iter()
            .map(|(_, s, d)| json!([s, d]))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let mut child = Command::new(&py)
        .args(["-c", PY_JUDGE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", py.display()))?;
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&input)
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{} cannot run babelqueue.schema: {}",
            py.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let verdicts: Vec<bool> = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(cases
        .into_iter()
        .zip(verdicts)
        .map(|((name, schema, data), python_valid)| {
            Trial::test(format!("python_verdicts::{name}"), move || {
                let schemas = Schemas::new(InMemoryProvider::new().with(URN, schema));
                let ours = verdict(&schemas, &data)?;
                if ours != python_valid {
                    return Err(format!(
                        "the family dialect says valid = {ours}, the Python SDK {python_valid}"
                    )
                    .into());
                }
                Ok(())
            })
        })
        .collect())
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let block = match suite_dir() {
        Err(e) => {
            eprintln!("schema_conformance: {e}");
            return ExitCode::FAILURE;
        }
        Ok(None) => {
            eprintln!(
                "schema_conformance: BABELQUEUE_CONFORMANCE_DIR is unset: the suite's \
                 payload_schema cases are skipped (set it to ../shared/conformance to run them)"
            );
            None
        }
        Ok(Some(dir)) => match read_block(&dir) {
            Ok(b) => Some(b),
            Err(e) => {
                eprintln!("schema_conformance: {}/manifest.json: {e}", dir.display());
                return ExitCode::FAILURE;
            }
        },
    };
    let mut trials = Vec::new();
    if let Some(b) = &block {
        trials.extend(suite_trials(b));
    }
    trials.extend(dir_provider_trials(block.as_ref()));
    trials.extend(producer_trials());
    match python_trials() {
        Ok(t) => trials.extend(t),
        Err(e) => eprintln!(
            "schema_conformance: the upstream Python validator is not available ({e}): \
             the python_verdicts cases are skipped"
        ),
    }
    libtest_mimic::run(&args, trials).exit_code()
}
