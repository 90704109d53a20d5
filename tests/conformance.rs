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
                k if BINDING_BLOCKS.contains(&k) => "run against babelqueue::binding",
                "payload_schema" => "run against babelqueue::schema (family dialect and draft-07)",
                _ => "not run: unknown block (this runner does not know it)",
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
    out.extend(bindings::trials(dir, manifest)?);
    out.extend(payload_schema_trials(dir, manifest)?);
    Ok(out)
}

/// The `payload_schema` block (ADR-0024): one trial per case, in the family's dialect (the
/// subset every SDK's validator implements, the default of `babelqueue::schema`) and in
/// full draft-07; both must agree with the case's `valid`.
fn payload_schema_trials(_dir: &Path, manifest: &Value) -> Result<Vec<Trial>, String> {
    use babelqueue::schema::{Dialect, InMemoryProvider, Schemas};
    const URN: &str = "urn:conformance:payload";
    let Some(block) = manifest.get("payload_schema") else {
        return Ok(Vec::new());
    };
    let schema = block
        .get("schema")
        .cloned()
        .ok_or("payload_schema has no `schema`")?;
    let cases = block["cases"]
        .as_array()
        .ok_or("payload_schema has no `cases` array")?;
    let mut out = Vec::new();
    for (dialect, label) in [(Dialect::Family, "family"), (Dialect::Draft07, "draft07")] {
        for case in cases {
            let name = case["name"]
                .as_str()
                .ok_or("a payload_schema case has no name")?;
            let valid = case["valid"]
                .as_bool()
                .ok_or_else(|| format!("payload_schema case {name} has no boolean `valid`"))?;
            let data = case["data"].clone();
            let schema = schema.clone();
            out.push(Trial::test(
                format!("payload_schema::{label}::{name}"),
                move || {
                    let schemas =
                        Schemas::new(InMemoryProvider::new().with(URN, schema)).dialect(dialect);
                    let got = match schemas.validate(URN, &data) {
                        Ok(()) => true,
                        Err(e) if e.is_violation() => false,
                        Err(e) => return Err(fail(format!("the schema did not load: {e}"))),
                    };
                    if got == valid {
                        Ok(())
                    } else {
                        Err(fail(format!("valid = {got}, the suite says {valid}")))
                    }
                },
            ));
        }
    }
    Ok(out)
}

/// The manifest blocks of the broker bindings, each run by [`bindings::trials`].
const BINDING_BLOCKS: [&str; 7] = [
    "rabbitmq", "sqs", "asb", "pulsar", "kafka", "artemis", "redis",
];

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
    check_eq("data", &Value::from(env.data.clone()), &expect["data"])?;
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

/// The broker bindings' blocks (`rabbitmq`, `sqs`, `asb`, `pulsar`, `kafka`, `artemis`,
/// `redis`), run against `babelqueue::binding`: one trial per projection and per
/// reconciliation case, named `<block>::<sub-block>[::<case>]`. A sub-block this runner
/// does not know becomes a failing trial, so nothing in a binding block is skipped.
mod bindings {
    use std::path::Path;

    use babelqueue::Envelope;
    use babelqueue::binding::{amqp, artemis, asb, kafka, pulsar, redis, sqs};
    use libtest_mimic::{Failed, Trial};
    use serde_json::{Map, Value, json};

    use super::{BINDING_BLOCKS, check_eq, fail, read};

    type Check = fn(&Path, &Value) -> Result<(), Failed>;

    /// The projection sub-block of each binding and its check.
    const PROJECTIONS: [(&str, &str, Check); 7] = [
        ("rabbitmq", "property_projection", rabbitmq_projection),
        ("sqs", "attribute_projection", sqs_projection),
        ("asb", "property_projection", asb_projection),
        ("pulsar", "property_projection", pulsar_projection),
        ("kafka", "property_projection", kafka_projection),
        ("artemis", "property_projection", artemis_projection),
        ("redis", "payload_identity", redis_payload_identity),
    ];

    pub(super) fn trials(dir: &Path, manifest: &Value) -> Result<Vec<Trial>, String> {
        let mut out = Vec::new();
        for block in BINDING_BLOCKS {
            let Some(obj) = manifest.get(block) else {
                continue;
            };
            let obj = obj
                .as_object()
                .ok_or_else(|| format!("block `{block}` is not an object"))?;
            for (sub, value) in obj {
                if sub == "description" {
                    continue;
                }
                if let Some((_, _, check)) =
                    PROJECTIONS.iter().find(|(b, s, _)| *b == block && s == sub)
                {
                    let (dir, value, check) = (dir.to_owned(), value.clone(), *check);
                    out.push(Trial::test(format!("{block}::{sub}"), move || {
                        check(&dir, &value)
                    }));
                } else if sub == "attempts_reconciliation"
                    && block != "redis"
                    && block != "rabbitmq"
                {
                    let cases = value["cases"]
                        .as_array()
                        .ok_or_else(|| format!("`{block}.{sub}` has no cases"))?;
                    for case in cases {
                        let name = case["name"]
                            .as_str()
                            .ok_or_else(|| format!("a case of `{block}.{sub}` has no name"))?;
                        let case = case.clone();
                        out.push(Trial::test(format!("{block}::{sub}::{name}"), move || {
                            reconciliation(block, &case)
                        }));
                    }
                } else {
                    let (b, s) = (block, sub.clone());
                    out.push(Trial::test(format!("{block}::{sub}"), move || {
                        Err(fail(format!(
                            "`{b}.{s}` is a sub-block this runner does not know: teach it"
                        )))
                    }));
                }
            }
        }
        Ok(out)
    }

    fn fixture(dir: &Path, block: &Value) -> Result<(Vec<u8>, Envelope), Failed> {
        let bytes = read(dir, &block["envelope_file"])?;
        let env = Envelope::decode(&bytes).map_err(|e| fail(format!("fixture rejected: {e}")))?;
        Ok((bytes, env))
    }

    /// `got` must have exactly the keys and (typed) values of `want`.
    fn same_object(what: &str, got: &Map<String, Value>, want: &Value) -> Result<(), Failed> {
        let want = want
            .as_object()
            .ok_or_else(|| fail(format!("manifest `{what}` is not an object")))?;
        for (k, v) in want {
            match got.get(k) {
                Some(g) => check_eq(&format!("{what}.{k}"), g, v)?,
                None => return Err(fail(format!("{what}: `{k}` is missing (got {got:?})"))),
            }
        }
        if let Some(extra) = got.keys().find(|k| !want.contains_key(*k)) {
            return Err(fail(format!("{what}: `{extra}` is not in the manifest")));
        }
        Ok(())
    }

    fn typed(v: &amqp::HeaderValue) -> Value {
        match v {
            amqp::HeaderValue::Int(i) => json!(i),
            amqp::HeaderValue::Str(s) => json!(s),
        }
    }

    fn strings<'a>(
        pairs: impl IntoIterator<Item = &'a (&'static str, String)>,
    ) -> Map<String, Value> {
        pairs
            .into_iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect()
    }

    /// The lenient projection of the fixture's raw bytes must equal the typed one.
    fn lenient_agrees<T: PartialEq + std::fmt::Debug>(
        typed: &T,
        lenient: Option<T>,
    ) -> Result<(), Failed> {
        match lenient {
            Some(l) if &l == typed => Ok(()),
            other => Err(fail(format!(
                "project_body of the fixture bytes gives {other:?}, project gives {typed:?}"
            ))),
        }
    }

    fn rabbitmq_projection(dir: &Path, block: &Value) -> Result<(), Failed> {
        let (bytes, env) = fixture(dir, block)?;
        let p = amqp::project(&env);
        let props: Map<String, Value> = [
            ("type", json!(p.kind)),
            ("correlation_id", json!(p.correlation_id)),
            ("message_id", json!(p.message_id)),
            ("app_id", json!(p.app_id)),
            ("content_type", json!(p.content_type)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        same_object("properties", &props, &block["properties"])?;
        let headers: Map<String, Value> = p
            .headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), typed(v)))
            .collect();
        same_object("headers", &headers, &block["headers"])?;
        if p.delivery_mode != 2 {
            return Err(fail(format!(
                "delivery_mode {} is not persistent (2)",
                p.delivery_mode
            )));
        }
        lenient_agrees(&p, amqp::project_body(&bytes))
    }

    fn sqs_projection(dir: &Path, block: &Value) -> Result<(), Failed> {
        let (bytes, env) = fixture(dir, block)?;
        let attrs = sqs::message_attributes(&env);
        let got: Map<String, Value> = attrs
            .iter()
            .map(|(k, a)| {
                (
                    (*k).to_owned(),
                    json!({"DataType": a.data_type, "StringValue": a.string_value}),
                )
            })
            .collect();
        same_object("message_attributes", &got, &block["message_attributes"])?;
        lenient_agrees(&attrs, sqs::project_body(&bytes))
    }

    fn asb_projection(dir: &Path, block: &Value) -> Result<(), Failed> {
        let (bytes, env) = fixture(dir, block)?;
        let m = asb::project(&env);
        let message: Map<String, Value> = [
            ("subject", json!(m.subject)),
            ("correlation_id", json!(m.correlation_id)),
            ("message_id", json!(m.message_id)),
            ("content_type", json!(m.content_type)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        same_object("message", &message, &block["message"])?;
        let props: Map<String, Value> = m
            .application_properties
            .iter()
            .map(|(k, v)| ((*k).to_owned(), typed(v)))
            .collect();
        same_object(
            "application_properties",
            &props,
            &block["application_properties"],
        )?;
        lenient_agrees(&m, asb::project_body(&bytes))
    }

    fn pulsar_projection(dir: &Path, block: &Value) -> Result<(), Failed> {
        let (bytes, env) = fixture(dir, block)?;
        let props = pulsar::properties(&env);
        same_object("properties", &strings(&props), &block["properties"])?;
        lenient_agrees(&props, pulsar::project_body(&bytes))
    }

    fn kafka_projection(dir: &Path, block: &Value) -> Result<(), Failed> {
        let (bytes, env) = fixture(dir, block)?;
        let headers = kafka::headers(&env);
        same_object("headers", &strings(&headers), &block["headers"])?;
        // "the record timestamp mirrors meta.created_at (Unix ms)"
        let created_at = env.meta.created_at;
        if kafka::timestamp_ms(&env) != Some(created_at) {
            return Err(fail(format!(
                "record timestamp {:?}, meta.created_at {created_at}",
                kafka::timestamp_ms(&env)
            )));
        }
        let record = kafka::Record {
            headers,
            timestamp_ms: Some(created_at),
        };
        lenient_agrees(&record, kafka::project_body(&bytes))
    }

    fn artemis_projection(dir: &Path, block: &Value) -> Result<(), Failed> {
        let (bytes, env) = fixture(dir, block)?;
        let p = artemis::project(&env);
        check_eq(
            "jms_type_annotation",
            &json!(artemis::JMS_TYPE_ANNOTATION),
            &block["jms_type_annotation"],
        )?;
        check_eq("jms_type", &json!(p.jms_type), &block["jms_type"])?;
        check_eq(
            "correlation_id",
            &json!(p.correlation_id),
            &block["correlation_id"],
        )?;
        same_object("properties", &strings(&p.properties), &block["properties"])?;
        // "creation-time = meta.created_at (JMSTimestamp, Unix ms)"
        if p.creation_time_ms != Some(env.meta.created_at) {
            return Err(fail(format!(
                "creation-time {:?}, meta.created_at {}",
                p.creation_time_ms, env.meta.created_at
            )));
        }
        lenient_agrees(&p, artemis::project_body(&bytes))
    }

    fn redis_payload_identity(dir: &Path, block: &Value) -> Result<(), Failed> {
        let bytes = read(dir, &block["envelope_file"])?;
        // produce: the element is the envelope, byte for byte (no headers, no frame) ...
        let element = redis::encode_element(&bytes, None)
            .map_err(|e| fail(format!("encode_element: {e}")))?;
        if element != bytes {
            return Err(fail("the list element is not the envelope byte for byte"));
        }
        // ... and reserve hands the same bytes back, unwrapped and unchanged.
        if redis::unframe(&element).is_some() {
            return Err(fail("a bare envelope was read as a header frame"));
        }
        if redis::element_body(&element).as_ref() != &bytes[..] {
            return Err(fail("the reserved body differs from the produced bytes"));
        }
        Envelope::decode(&redis::element_body(&element))
            .map(|_| ())
            .map_err(|e| {
                fail(format!(
                    "the reserved body is not an accepted envelope: {e}"
                ))
            })
    }

    fn u32_field(case: &Value, key: &str) -> Result<u32, Failed> {
        case[key]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| fail(format!("`{key}` is not a u32: {}", case[key])))
    }

    fn reconciliation(block: &str, case: &Value) -> Result<(), Failed> {
        let body = u32_field(case, "body_attempts")?;
        let want = u32_field(case, "expected_attempts")?;
        let got = match block {
            "sqs" => {
                let count = &case["approximate_receive_count"];
                match count {
                    Value::Null => sqs::reconcile_attempts(body, None),
                    Value::String(s) => sqs::reconcile_attempts(body, Some(s)),
                    other => return Err(fail(format!("approximate_receive_count {other}"))),
                }
            }
            "asb" => asb::reconcile_attempts(body, u32_field(case, "delivery_count")?),
            "pulsar" => pulsar::reconcile_attempts(body, u32_field(case, "redelivery_count")?),
            "artemis" => artemis::reconcile_attempts(body, u32_field(case, "delivery_count")?),
            "kafka" => {
                // Kafka headers are bytes: the manifest's number travels as its decimal text.
                let header = match &case["header_attempts"] {
                    Value::Null => None,
                    Value::Number(n) => Some(n.to_string()),
                    Value::String(s) => Some(s.clone()),
                    other => return Err(fail(format!("header_attempts {other}"))),
                };
                kafka::reconcile_attempts(body, header.as_deref().map(str::as_bytes))
            }
            other => return Err(fail(format!("no reconciliation rule for `{other}`"))),
        };
        if got != want {
            return Err(fail(format!(
                "attempts {got}, expected {want} (case {case})"
            )));
        }
        Ok(())
    }
}
