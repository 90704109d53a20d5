//! Payload schemas (ADR-0024): an opt-in JSON Schema (draft-07) per URN for an envelope's
//! `data`, checked before publishing and, opt-in, as a safety net on consume.
//!
//! - A [`SchemaProvider`] supplies the schema of a URN: [`InMemoryProvider`] (schemas in
//!   code), [`DirProvider`] (a babelqueue-registry `registry.json` manifest,
//!   `{"schemas": [{"urn": …, "schema": "<path relative to the manifest>"}]}`).
//! - [`Schemas`] compiles each URN's schema once (with the [`jsonschema`] crate, draft-07,
//!   no remote or file `$ref` retrieval) and validates `data`: [`Schemas::validate`] for a
//!   URN and a value, [`Schemas::check`] for an envelope. A URN without a schema is never
//!   checked (opt-in).
//! - A violation is a [`SchemaViolation`]: the URN, the JSON Pointer of the offending value
//!   inside `data` (`""` for `data` itself), the rule (the JSON Schema keyword) and a message.
//!
//! ## Dialects: the family's subset or full draft-07
//!
//! The other BabelQueue SDKs (Go, Python, PHP, …) implement a subset of JSON Schema —
//! `type`, `required`, `properties`, `additionalProperties`, `items`, `enum`, `const`,
//! `minLength`, `minimum`, an integer may be written `7.0` — and **ignore every other
//! keyword**. A full validator is stricter (`maxLength`, `pattern`, `oneOf`, `format`, …),
//! and a consumer stricter than its producers dead-letters messages every other SDK accepts.
//! So the default, [`Dialect::Family`], validates against the schema **pruned to the
//! family's subset with the family's rules** (a keyword counts only under the `type` that
//! uses it: `required`/`properties`/`additionalProperties` under `"object"`, `items` under
//! `"array"`, `minLength` under `"string"`, `minimum` under `"integer"`/`"number"`; only
//! `additionalProperties: false` restricts; a non-object subschema is ignored), and runs the
//! pruned schema through the full validator. Its verdicts are the family's on every case of
//! the conformance suite's `payload_schema` block. One documented difference remains:
//! `enum`/`const` compare numbers by value as JSON Schema says (`1` equals `1.0`), where the
//! Python validator also compares the number's type.
//!
//! [`Dialect::Draft07`] validates against the whole schema, every draft-07 keyword
//! enforced (`format` as an annotation, as draft-07 specifies). Use it on the producer side
//! when your schemas use keywords beyond the subset and you want them enforced before the
//! message leaves; keep consumers on [`Dialect::Family`] unless every producer is as strict.
//!
//! ```
//! use babelqueue_core::schema::{InMemoryProvider, Schemas};
//! use serde_json::json;
//!
//! let schemas = Schemas::new(InMemoryProvider::new().with(
//!     "urn:babel:orders:created",
//!     json!({"type": "object", "required": ["order_id"],
//!            "properties": {"order_id": {"type": "integer", "minimum": 1}}}),
//! ));
//! schemas.validate("urn:babel:orders:created", &json!({"order_id": 7}))?;
//! let err = schemas
//!     .validate("urn:babel:orders:created", &json!({"order_id": 0}))
//!     .unwrap_err();
//! let violation = err.violation().expect("a violation, not a loading error");
//! assert_eq!((violation.path(), violation.rule()), ("/order_id", "minimum"));
//! // No schema for the URN: not checked.
//! schemas.validate("urn:babel:other", &json!({"anything": true}))?;
//! # Ok::<(), babelqueue_core::schema::SchemaError>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value};

use crate::envelope::Envelope;

/// A schema could not be loaded or compiled, or `data` broke it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The data does not match the URN's schema. A retry cannot fix it: a consumer
    /// dead-letters the message at once.
    #[error(transparent)]
    Violation(#[from] SchemaViolation),
    /// The manifest or a schema file could not be read.
    #[error("schema: cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A manifest or a schema is not what it must be (not JSON, not an object, not a valid
    /// draft-07 schema, an unresolvable `$ref`, …).
    #[error("schema: {what}: {reason}")]
    Invalid {
        /// The manifest path or the URN whose schema is invalid.
        what: String,
        /// Why.
        reason: String,
    },
}

impl SchemaError {
    /// The violation, when the data broke the schema (`None` for a loading error).
    pub fn violation(&self) -> Option<&SchemaViolation> {
        match self {
            SchemaError::Violation(v) => Some(v),
            _ => None,
        }
    }

    /// Whether the data broke the schema (as opposed to a schema that could not be loaded:
    /// a configuration error a redelivery may outlive).
    pub fn is_violation(&self) -> bool {
        matches!(self, SchemaError::Violation(_))
    }

    fn invalid(what: impl Into<String>, reason: impl fmt::Display) -> Self {
        SchemaError::Invalid {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}

/// `data` does not match the schema registered for its URN: where and which rule.
///
/// Its message reads `` `<urn>` data at `<path>` breaks `<rule>`: <detail> ``; the path is
/// a JSON Pointer into `data` (`<root>` in the message for `data` itself).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{urn}` data at `{}` breaks `{rule}`: {message}", if path.is_empty() { "<root>" } else { path.as_str() })]
pub struct SchemaViolation {
    urn: String,
    path: String,
    rule: String,
    message: String,
}

impl SchemaViolation {
    /// The message URN whose schema was broken.
    pub fn urn(&self) -> &str {
        &self.urn
    }

    /// The JSON Pointer of the offending value inside `data` (`""`: `data` itself), e.g.
    /// `/items/0/sku`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The broken rule: the JSON Schema keyword (`type`, `required`, `minimum`, …).
    pub fn rule(&self) -> &str {
        &self.rule
    }

    /// The validator's description of the failure.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A source of per-URN `data` schemas.
///
/// Implement it to read schemas from anywhere (a registry service, a database); the
/// [`Schemas`] value asks once per URN and caches the compiled schema.
pub trait SchemaProvider: Send + Sync + 'static {
    /// The JSON Schema registered for `urn`, `Ok(None)` when none is (the URN is then
    /// not checked), or an error when it exists but cannot be read.
    fn schema_for(&self, urn: &str) -> Result<Option<Value>, SchemaError>;
}

impl<P: SchemaProvider + ?Sized> SchemaProvider for Arc<P> {
    fn schema_for(&self, urn: &str) -> Result<Option<Value>, SchemaError> {
        (**self).schema_for(urn)
    }
}

/// Schemas held in memory, for tests and for schemas embedded in code.
///
/// ```
/// use babelqueue_core::schema::{InMemoryProvider, SchemaProvider};
/// use serde_json::json;
/// let p = InMemoryProvider::new().with("urn:a", json!({"type": "object"}));
/// assert!(p.schema_for("urn:a")?.is_some());
/// assert!(p.schema_for("urn:b")?.is_none());
/// # Ok::<(), babelqueue_core::schema::SchemaError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct InMemoryProvider {
    schemas: HashMap<String, Value>,
}

impl InMemoryProvider {
    /// An empty provider.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `schema` for `urn` (replacing any earlier one).
    #[must_use]
    pub fn with(mut self, urn: impl Into<String>, schema: Value) -> Self {
        self.insert(urn, schema);
        self
    }

    /// Registers `schema` for `urn` (replacing any earlier one).
    pub fn insert(&mut self, urn: impl Into<String>, schema: Value) {
        self.schemas.insert(urn.into(), schema);
    }
}

impl SchemaProvider for InMemoryProvider {
    fn schema_for(&self, urn: &str) -> Result<Option<Value>, SchemaError> {
        Ok(self.schemas.get(urn).cloned())
    }
}

/// The schemas of a babelqueue-registry manifest (`registry.json`):
/// `{"schemas": [{"urn": "urn:babel:orders:created", "schema": "orders/created.json"}]}`,
/// each schema path relative to the manifest's directory (or absolute).
///
/// The manifest is read when the provider is opened (an unreadable or malformed manifest
/// is an error then); a schema file is read when its URN is first asked for (a missing file
/// is an error then, not a silent skip). Entries that are not `{urn, schema}` strings are
/// ignored, as the other SDKs do.
///
/// ```
/// use babelqueue_core::schema::{DirProvider, SchemaProvider};
/// let dir = std::env::temp_dir().join(format!("bq-doc-registry-{}", std::process::id()));
/// std::fs::create_dir_all(dir.join("orders"))?;
/// std::fs::write(
///     dir.join("registry.json"),
///     r#"{"schemas": [{"urn": "urn:babel:orders:created", "schema": "orders/created.json"}]}"#,
/// )?;
/// std::fs::write(dir.join("orders/created.json"), r#"{"type": "object"}"#)?;
///
/// let provider = DirProvider::open(dir.join("registry.json"))?;
/// assert_eq!(provider.urns().collect::<Vec<_>>(), ["urn:babel:orders:created"]);
/// assert!(provider.schema_for("urn:babel:orders:created")?.is_some());
/// assert!(provider.schema_for("urn:babel:unknown")?.is_none());
/// std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct DirProvider {
    manifest: PathBuf,
    files: HashMap<String, PathBuf>,
}

impl DirProvider {
    /// Reads the manifest at `manifest_path`.
    pub fn open(manifest_path: impl AsRef<Path>) -> Result<Self, SchemaError> {
        let manifest = manifest_path.as_ref().to_path_buf();
        let text = std::fs::read_to_string(&manifest).map_err(|source| SchemaError::Io {
            path: manifest.clone(),
            source,
        })?;
        let what = || format!("manifest {}", manifest.display());
        let value: Value =
            serde_json::from_str(&text).map_err(|e| SchemaError::invalid(what(), e))?;
        let Value::Object(root) = value else {
            return Err(SchemaError::invalid(what(), "not a JSON object"));
        };
        let dir = manifest.parent().unwrap_or(Path::new("")).to_path_buf();
        let mut files = HashMap::new();
        match root.get("schemas") {
            None | Some(Value::Null) => {}
            Some(Value::Array(entries)) => {
                for entry in entries {
                    let (Some(urn), Some(file)) = (
                        entry.get("urn").and_then(Value::as_str),
                        entry.get("schema").and_then(Value::as_str),
                    ) else {
                        continue;
                    };
                    if urn.is_empty() || file.is_empty() {
                        continue;
                    }
                    files.insert(urn.to_owned(), dir.join(file));
                }
            }
            Some(_) => return Err(SchemaError::invalid(what(), "`schemas` is not an array")),
        }
        Ok(DirProvider { manifest, files })
    }

    /// The manifest's path.
    pub fn manifest(&self) -> &Path {
        &self.manifest
    }

    /// The URNs the manifest lists (in no particular order).
    pub fn urns(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }
}

impl SchemaProvider for DirProvider {
    fn schema_for(&self, urn: &str) -> Result<Option<Value>, SchemaError> {
        let Some(path) = self.files.get(urn) else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|source| SchemaError::Io {
            path: path.clone(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| SchemaError::invalid(format!("schema of {urn}"), e))?;
        if !value.is_object() {
            return Err(SchemaError::invalid(
                format!("schema of {urn} ({})", path.display()),
                "not a JSON object",
            ));
        }
        Ok(Some(value))
    }
}

/// How a schema is applied (see the [module docs](self#dialects-the-familys-subset-or-full-draft-07)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Dialect {
    /// The family's subset (`type`, `required`, `properties`, `additionalProperties`,
    /// `items`, `enum`, `const`, `minLength`, `minimum`), other keywords ignored: the
    /// verdicts of every other BabelQueue SDK. The default.
    #[default]
    Family,
    /// Every draft-07 keyword: stricter than the other SDKs.
    Draft07,
}

type Compiled = Option<Arc<jsonschema::Validator>>;

/// The validator: a [`SchemaProvider`], a [`Dialect`] and a cache of compiled schemas
/// (each URN's schema is fetched and compiled once; a loading error is not cached, so a
/// fixed file is picked up on the next check).
///
/// Cheap to share: wrap it in an `Arc` (as `App::schemas`
/// does).
pub struct Schemas {
    provider: Box<dyn SchemaProvider>,
    dialect: Dialect,
    compiled: RwLock<HashMap<String, Compiled>>,
}

impl fmt::Debug for Schemas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schemas")
            .field("dialect", &self.dialect)
            .finish_non_exhaustive()
    }
}

impl Schemas {
    /// Validates with `provider`'s schemas in the [`Dialect::Family`] dialect.
    pub fn new(provider: impl SchemaProvider) -> Self {
        Schemas {
            provider: Box::new(provider),
            dialect: Dialect::Family,
            compiled: RwLock::new(HashMap::new()),
        }
    }

    /// Chooses the dialect (default [`Dialect::Family`]).
    ///
    /// ```
    /// use babelqueue_core::schema::{Dialect, InMemoryProvider, Schemas};
    /// use serde_json::json;
    /// let provider = InMemoryProvider::new()
    ///     .with("urn:a", json!({"type": "object", "properties": {"s": {"maxLength": 2}}}));
    /// let data = json!({"s": "long"});
    /// // `maxLength` is not in the family's subset: ignored by default, enforced by draft-07.
    /// assert!(Schemas::new(provider.clone()).validate("urn:a", &data).is_ok());
    /// let strict = Schemas::new(provider).dialect(Dialect::Draft07);
    /// assert_eq!(strict.validate("urn:a", &data).unwrap_err().violation().unwrap().rule(), "maxLength");
    /// ```
    #[must_use]
    pub fn dialect(mut self, dialect: Dialect) -> Self {
        self.dialect = dialect;
        self.compiled = RwLock::new(HashMap::new());
        self
    }

    /// The dialect in use.
    pub fn current_dialect(&self) -> Dialect {
        self.dialect
    }

    /// Validates `data` against `urn`'s schema: `Ok(())` when it matches or when no schema
    /// is registered for `urn`; [`SchemaError::Violation`] naming the path and the rule;
    /// another [`SchemaError`] when the schema cannot be loaded or compiled.
    pub fn validate(&self, urn: &str, data: &Value) -> Result<(), SchemaError> {
        let Some(validator) = self.compiled(urn)? else {
            return Ok(());
        };
        validator.validate(data).map_err(|e| {
            SchemaError::Violation(SchemaViolation {
                urn: urn.to_owned(),
                path: e.instance_path().to_string(),
                rule: e.kind().keyword().to_owned(),
                message: e.to_string(),
            })
        })
    }

    /// Validates a JSON object (an envelope's `data` block) against `urn`'s schema; see
    /// [`validate`](Self::validate).
    pub fn validate_object(&self, urn: &str, data: &Map<String, Value>) -> Result<(), SchemaError> {
        let Some(validator) = self.compiled(urn)? else {
            return Ok(());
        };
        // The validator takes a `Value`; only a failing check pays for the copy's use.
        let value = Value::Object(data.clone());
        if validator.is_valid(&value) {
            return Ok(());
        }
        self.validate(urn, &value)
    }

    /// Validates an envelope's `data` against the schema of its URN (`job`).
    ///
    /// The consumer-side safety net: on [`SchemaError::Violation`] the runtime dead-letters
    /// the message at once as `failed`, the violation in `dead_letter.error` (a retry cannot
    /// fix it); on another error (a schema that cannot be loaded) it fails the delivery like
    /// a handler error, so a fixed configuration picks it up on a redelivery.
    ///
    /// ```
    /// use babelqueue_core::Envelope;
    /// use babelqueue_core::schema::{InMemoryProvider, Schemas};
    /// use serde_json::json;
    /// let schemas = Schemas::new(InMemoryProvider::new()
    ///     .with("urn:a", json!({"type": "object", "required": ["id"]})));
    /// let env = Envelope::new("urn:a", json!({"other": 1}))?;
    /// let err = schemas.check(&env).unwrap_err();
    /// assert_eq!(err.to_string(), "`urn:a` data at `<root>` breaks `required`: \"id\" is a required property");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(&self, envelope: &Envelope) -> Result<(), SchemaError> {
        self.validate_object(&envelope.job, &envelope.data)
    }

    fn compiled(&self, urn: &str) -> Result<Compiled, SchemaError> {
        if let Some(hit) = self
            .compiled
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(urn)
        {
            return Ok(hit.clone());
        }
        let compiled = match self.provider.schema_for(urn)? {
            None => None,
            Some(schema) => {
                let schema = match self.dialect {
                    Dialect::Family => family_subset(&schema),
                    Dialect::Draft07 => schema,
                };
                let validator = jsonschema::draft7::new(&schema)
                    .map_err(|e| SchemaError::invalid(format!("schema of {urn}"), e))?;
                Some(Arc::new(validator))
            }
        };
        self.compiled
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(urn.to_owned(), compiled.clone());
        Ok(compiled)
    }
}

const FAMILY_TYPES: [&str; 7] = [
    "object", "array", "string", "integer", "number", "boolean", "null",
];

/// The part of `schema` the family's validators enforce, with their rules: a keyword is
/// kept only under the `type` that uses it, only `additionalProperties: false` restricts,
/// a subschema that is not an object is ignored (an empty schema accepts everything).
fn family_subset(schema: &Value) -> Value {
    let Value::Object(node) = schema else {
        return Value::Object(Map::new());
    };
    let mut out = Map::new();
    if let Some(c) = node.get("const") {
        out.insert("const".into(), c.clone());
    }
    if let Some(e @ Value::Array(_)) = node.get("enum") {
        out.insert("enum".into(), e.clone());
    }
    let Some(ty) = node
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| FAMILY_TYPES.contains(t))
    else {
        return Value::Object(out);
    };
    out.insert("type".into(), Value::from(ty));
    match ty {
        "object" => {
            if let Some(Value::Array(required)) = node.get("required") {
                let names: Vec<Value> =
                    required.iter().filter(|r| r.is_string()).cloned().collect();
                if !names.is_empty() {
                    out.insert("required".into(), Value::Array(names));
                }
            }
            if let Some(Value::Object(props)) = node.get("properties") {
                // A property whose schema is not an object counts as undeclared (so
                // `additionalProperties: false` refuses it), as in the other SDKs.
                let props: Map<String, Value> = props
                    .iter()
                    .filter(|(_, s)| s.is_object())
                    .map(|(k, s)| (k.clone(), family_subset(s)))
                    .collect();
                out.insert("properties".into(), Value::Object(props));
            }
            if node.get("additionalProperties") == Some(&Value::Bool(false)) {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
        }
        "array" => {
            if let Some(items @ Value::Object(_)) = node.get("items") {
                out.insert("items".into(), family_subset(items));
            }
        }
        "string" => {
            // The family truncates a fractional minLength and ignores a negative one.
            if let Some(n) = node.get("minLength").and_then(Value::as_f64)
                && n >= 1.0
                && n.is_finite()
            {
                out.insert("minLength".into(), Value::from(n.trunc() as u64));
            }
        }
        "integer" | "number" => {
            if let Some(m @ Value::Number(_)) = node.get("minimum") {
                out.insert("minimum".into(), m.clone());
            }
        }
        _ => {}
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn family(schema: Value, data: Value) -> Result<(), SchemaError> {
        Schemas::new(InMemoryProvider::new().with("urn:t", schema)).validate("urn:t", &data)
    }

    fn rule_of(r: Result<(), SchemaError>) -> (String, String) {
        let err = r.expect_err("a violation");
        let v = err.violation().expect("a violation");
        (v.path().to_owned(), v.rule().to_owned())
    }

    #[test]
    fn an_integer_may_be_written_with_a_zero_fraction() {
        let s = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        assert!(family(s.clone(), json!({"n": 7.0})).is_ok());
        assert_eq!(
            rule_of(family(s, json!({"n": 7.5}))),
            ("/n".into(), "type".into())
        );
    }

    #[test]
    fn keywords_outside_the_subset_are_ignored_by_the_family_dialect() {
        let s = json!({"type": "object", "properties": {
            "s": {"type": "string", "pattern": "^a$", "maxLength": 1},
            "n": {"type": "number", "maximum": 1, "multipleOf": 3},
        }, "oneOf": [{"required": ["zzz"]}]});
        assert!(family(s, json!({"s": "bbbb", "n": 5})).is_ok());
    }

    #[test]
    fn keywords_count_only_under_their_type() {
        // No `type`: the family ignores `required`, `minimum`, `minLength`.
        assert!(family(json!({"required": ["a"]}), json!({})).is_ok());
        let s = json!({"type": "object", "properties": {
            "a": {"minimum": 5}, "b": {"minLength": 3}}});
        assert!(family(s, json!({"a": 1, "b": ""})).is_ok());
    }

    #[test]
    fn nested_paths_and_rules_are_reported() {
        let s = json!({"type": "object", "properties": {"items": {"type": "array", "items": {
            "type": "object", "required": ["sku"],
            "properties": {"sku": {"type": "string", "minLength": 2}},
            "additionalProperties": false}}}});
        assert_eq!(
            rule_of(family(
                s.clone(),
                json!({"items": [{"sku": "ab"}, {"sku": "a"}]})
            )),
            ("/items/1/sku".into(), "minLength".into())
        );
        assert_eq!(
            rule_of(family(s.clone(), json!({"items": [{"sku": "ab", "x": 1}]}))),
            ("/items/0".into(), "additionalProperties".into())
        );
        assert_eq!(
            rule_of(family(s, json!({"items": [{}]}))),
            ("/items/0".into(), "required".into())
        );
    }

    #[test]
    fn additional_properties_restrict_only_when_false() {
        let s = json!({"type": "object", "properties": {"a": {}},
            "additionalProperties": {"type": "string"}});
        assert!(family(s, json!({"b": 1})).is_ok());
        let s = json!({"type": "object", "properties": {"a": true},
            "additionalProperties": false});
        // A non-object property schema counts as undeclared.
        assert_eq!(
            rule_of(family(s, json!({"a": 1}))),
            ("".into(), "additionalProperties".into())
        );
    }

    #[test]
    fn enum_and_const_apply_without_a_type() {
        assert_eq!(
            rule_of(family(json!({"const": "x"}), json!({"a": 1}))).1,
            "const"
        );
        assert_eq!(rule_of(family(json!({"enum": [1]}), json!({}))).1, "enum");
        assert!(family(json!({"enum": [{"a": 1}]}), json!({"a": 1})).is_ok());
    }

    #[test]
    fn an_invalid_schema_is_a_loading_error_not_a_violation() {
        let err = family(
            json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 1}}, "$ref": "http://example.invalid/x"}),
            json!({}),
        );
        // `$ref` is outside the subset: pruned, so the family dialect accepts.
        assert!(err.is_ok());
        let strict = Schemas::new(
            InMemoryProvider::new().with("urn:t", json!({"$ref": "http://example.invalid/x"})),
        )
        .dialect(Dialect::Draft07);
        let err = strict.validate("urn:t", &json!({})).unwrap_err();
        assert!(!err.is_violation(), "{err}");
        assert!(err.to_string().contains("schema of urn:t"), "{err}");
    }

    #[test]
    fn a_loading_error_is_not_cached() {
        struct Flaky(std::sync::atomic::AtomicUsize);
        impl SchemaProvider for Flaky {
            fn schema_for(&self, _: &str) -> Result<Option<Value>, SchemaError> {
                if self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                    Err(SchemaError::invalid("x", "not yet"))
                } else {
                    Ok(Some(json!({"type": "object", "required": ["a"]})))
                }
            }
        }
        let s = Schemas::new(Flaky(0.into()));
        assert!(!s.validate("urn:t", &json!({})).unwrap_err().is_violation());
        assert!(s.validate("urn:t", &json!({})).unwrap_err().is_violation());
        assert!(s.validate("urn:t", &json!({"a": 1})).is_ok());
    }
}
