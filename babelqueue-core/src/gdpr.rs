//! Personal data encrypted field by field inside `data` (the family's GDPR field
//! encryption), byte-compatible with the Go and Python SDKs.
//!
//! A per-URN JSON Schema marks personal fields with `"x-gdpr-sensitive": true` or
//! `"x-gdpr-sensitive": "<category>"`. [`sensitive_paths`] reads those marks as dotted paths
//! (`email`, `card.number`, `addresses[].line`); [`protect`] replaces each marked value
//! present in `data` by the [`Cipher`]'s token of its [canonical JSON](canonical_json), a
//! string; [`unprotect`] puts the values back. The envelope's frame, `trace_id`, `meta`
//! and every unmarked value are left as they are: the frame and `trace_id` are *not*
//! protected, only the marked values inside `data`.
//!
//! - A marked path absent from a message, or meeting a value of another shape (a string
//!   where the schema has an object), is skipped.
//! - A whole object or array may be marked: it is sealed as one token.
//! - A mark on the schema's root (path `""`) addresses nothing.
//! - [`unprotect`] leaves a marked value that is not a string as it is (it was never
//!   sealed, or is restored already); a string the cipher cannot open, or that opens to
//!   something other than JSON, is a [`DecryptError`], and the message must fail (retry,
//!   dead letter), never reach a handler with unreadable personal data. So running it
//!   again is safe where the restored values are not strings; a restored string is read
//!   as a token again, and refused.
//! - Either call changes nothing when it fails: `data` is as it was before the call.
//! - Validate cleartext: a schema's `minLength` or `enum` on a marked field would refuse
//!   the token. Validate before [`protect`] on produce, after [`unprotect`] on consume.
//! - For logs, [`mask`] gives a copy of `data` with each marked value cut to its first
//!   character and `***`.
//!
//! The cipher is the caller's: a KMS, a vault's transit engine, or the family's reference
//! `AesGcmCipher` (AES-256-GCM, behind the `gdpr` feature).
//!
//! Two limits shared with the Go and Python SDKs: a path through an array of arrays
//! (`matrix[][]`) addresses nothing, and a mark inside a marked object or array is sealed
//! with it, but on the way back the inner mark meets its restored cleartext and fails to
//! open it: mark either the container or its fields, not both.
//!
//! ```
//! use babelqueue_core::Envelope;
//! use babelqueue_core::gdpr::{self, Cipher, CipherError};
//! use serde_json::json;
//! # /// A stand-in for a real cipher, which the `gdpr` feature's `AesGcmCipher` is.
//! # struct Sealed;
//! # impl Cipher for Sealed {
//! #     fn encrypt(&self, plaintext: &[u8]) -> Result<String, CipherError> {
//! #         Ok(format!("sealed:{}", String::from_utf8_lossy(plaintext)))
//! #     }
//! #     fn decrypt(&self, token: &str) -> Result<Vec<u8>, CipherError> {
//! #         let text = token.strip_prefix("sealed:").ok_or_else(|| CipherError::new("not sealed"))?;
//! #         Ok(text.as_bytes().to_vec())
//! #     }
//! # }
//! # let cipher = Sealed;
//!
//! let schema = json!({
//!     "type": "object",
//!     "properties": {
//!         "email": {"type": "string", "x-gdpr-sensitive": "contact"},
//!         "card": {"properties": {"number": {"x-gdpr-sensitive": true}}},
//!         "amount": {"type": "integer"}
//!     }
//! });
//! let paths = gdpr::sensitive_paths(&schema);
//!
//! // Producer: protect, then encode.
//! let mut env = Envelope::new(
//!     "urn:babel:payments:charge",
//!     json!({"email": "alice@example.com", "card": {"number": "4111", "exp": "12/30"}, "amount": 4200}),
//! )?;
//! gdpr::protect_envelope(&mut env, &paths, &cipher)?;
//! assert_eq!(env.data["email"], r#"sealed:"alice@example.com""#);
//! assert_eq!(env.data["card"]["exp"], "12/30");
//! let bytes = env.encode();
//!
//! // Consumer: decode, then unprotect.
//! let mut got = Envelope::decode(&bytes)?;
//! gdpr::unprotect_envelope(&mut got, &paths, &cipher)?;
//! assert_eq!(got.data["card"]["number"], "4111");
//! assert_eq!(gdpr::mask(&got.data, &paths)["email"], "a***");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::envelope::Envelope;

#[cfg(feature = "gdpr")]
mod aes;
mod canonical;

#[cfg(feature = "gdpr")]
pub use aes::{AES_GCM_KEY_LEN, AesGcmCipher, InvalidKeyLength};
pub use canonical::canonical_json;

/// The schema keyword that marks a personal field.
pub const SENSITIVE_KEYWORD: &str = "x-gdpr-sensitive";

/// What a masked value is, after the first character of a string.
pub const MASK: &str = "***";

/// One field a schema marked `x-gdpr-sensitive`, found by [`sensitive_paths`].
///
/// The path is dotted from `data`'s root (`profile.full_name`), an array's elements
/// written `field[]` (`addresses[].line`); a mark on the schema's root is the path `""`.
///
/// ```
/// use babelqueue_core::gdpr::SensitivePath;
///
/// let path = SensitivePath::new("addresses[].line");
/// assert_eq!(path.path, "addresses[].line");
/// assert_eq!(path.category, None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SensitivePath {
    /// The dotted path (`card.number`, `addresses[].line`, `""` for the root).
    pub path: String,
    /// The category of `"x-gdpr-sensitive": "<category>"`, `None` for `true`.
    pub category: Option<String>,
}

impl SensitivePath {
    /// A path without a category, as a schema's `"x-gdpr-sensitive": true` gives.
    pub fn new(path: impl Into<String>) -> Self {
        SensitivePath {
            path: path.into(),
            category: None,
        }
    }
}

/// Every field `schema` marks `x-gdpr-sensitive`, sorted by path.
///
/// A node is marked by `"x-gdpr-sensitive": true` or by a non-empty string (its
/// category); `false`, `""`, a number or anything else leaves it unmarked. Marks are found
/// through `properties` (`profile.full_name`) and `items` when it is one schema
/// (`addresses[].line`); nothing else is descended (`allOf`, `$ref`, `definitions`, a
/// tuple `items`), nor is a node that is not an object. A mark on the root is the path
/// `""`. As the Python and Go SDKs read a schema, so two of them find the same paths.
///
/// ```
/// use babelqueue_core::gdpr::sensitive_paths;
/// use serde_json::json;
///
/// let schema = json!({"properties": {
///     "profile": {"properties": {"full_name": {"x-gdpr-sensitive": "identity"}}},
///     "addresses": {"items": {"properties": {"line": {"x-gdpr-sensitive": true}}}},
///     "email": {"x-gdpr-sensitive": true},
///     "note": {"x-gdpr-sensitive": false}
/// }});
/// let paths: Vec<_> = sensitive_paths(&schema).into_iter().map(|p| (p.path, p.category)).collect();
/// assert_eq!(paths, [
///     ("addresses[].line".to_owned(), None),
///     ("email".to_owned(), None),
///     ("profile.full_name".to_owned(), Some("identity".to_owned())),
/// ]);
/// ```
pub fn sensitive_paths(schema: &Value) -> Vec<SensitivePath> {
    let mut out = Vec::new();
    collect(schema, String::new(), &mut out);
    // Stable: two marks of one path keep the schema's order, as Python's sort keeps it.
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

fn collect(schema: &Value, path: String, out: &mut Vec<SensitivePath>) {
    let Value::Object(node) = schema else {
        return;
    };
    match node.get(SENSITIVE_KEYWORD) {
        Some(Value::Bool(true)) => out.push(SensitivePath {
            path: path.clone(),
            category: None,
        }),
        Some(Value::String(category)) if !category.is_empty() => out.push(SensitivePath {
            path: path.clone(),
            category: Some(category.clone()),
        }),
        _ => {}
    }
    if let Some(Value::Object(properties)) = node.get("properties") {
        for (name, sub) in properties {
            let child = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            collect(sub, child, out);
        }
    }
    if let Some(items @ Value::Object(_)) = node.get("items") {
        collect(items, format!("{path}[]"), out);
    }
}

/// The caller's field cipher: seals one value's canonical JSON into a string that can sit
/// in a JSON document, and opens it again.
///
/// - [`encrypt`](Cipher::encrypt) gets the [canonical JSON](canonical_json) bytes of one
///   value and returns a string (base64, say). The same bytes may give another string
///   each time (a random nonce is expected).
/// - [`decrypt`](Cipher::decrypt) returns exactly the bytes `encrypt` was given; for a
///   string it did not make, or made with another key, it must return an error, never
///   other bytes (an authenticated cipher does).
/// - Both are called from many tasks at once.
///
/// The family's reference is `AesGcmCipher` (the `gdpr` feature); a KMS, a vault's
/// transit engine or a tokenisation service fits behind the same two calls.
///
/// ```
/// use babelqueue_core::gdpr::{Cipher, CipherError};
///
/// /// Not a cipher: a token that shows its plaintext, for a test.
/// struct Visible;
///
/// impl Cipher for Visible {
///     fn encrypt(&self, plaintext: &[u8]) -> Result<String, CipherError> {
///         String::from_utf8(plaintext.to_vec()).map_err(|e| CipherError::with_source("not UTF-8", e))
///     }
///     fn decrypt(&self, token: &str) -> Result<Vec<u8>, CipherError> {
///         Ok(token.as_bytes().to_vec())
///     }
/// }
/// assert_eq!(Visible.decrypt(&Visible.encrypt(b"42")?)?, b"42");
/// # Ok::<(), CipherError>(())
/// ```
pub trait Cipher: Send + Sync {
    /// Seals `plaintext` (one value's canonical JSON) into a JSON-safe string.
    fn encrypt(&self, plaintext: &[u8]) -> Result<String, CipherError>;

    /// Opens a string [`encrypt`](Cipher::encrypt) made, returning exactly its bytes; an
    /// error for anything else.
    fn decrypt(&self, token: &str) -> Result<Vec<u8>, CipherError>;
}

impl<C: Cipher + ?Sized> Cipher for &C {
    fn encrypt(&self, plaintext: &[u8]) -> Result<String, CipherError> {
        (**self).encrypt(plaintext)
    }

    fn decrypt(&self, token: &str) -> Result<Vec<u8>, CipherError> {
        (**self).decrypt(token)
    }
}

impl<C: Cipher + ?Sized> Cipher for Box<C> {
    fn encrypt(&self, plaintext: &[u8]) -> Result<String, CipherError> {
        (**self).encrypt(plaintext)
    }

    fn decrypt(&self, token: &str) -> Result<Vec<u8>, CipherError> {
        (**self).decrypt(token)
    }
}

impl<C: Cipher + ?Sized> Cipher for Arc<C> {
    fn encrypt(&self, plaintext: &[u8]) -> Result<String, CipherError> {
        (**self).encrypt(plaintext)
    }

    fn decrypt(&self, token: &str) -> Result<Vec<u8>, CipherError> {
        (**self).decrypt(token)
    }
}

/// A [`Cipher`] could not seal or open a value.
///
/// ```
/// use babelqueue_core::gdpr::CipherError;
/// use std::error::Error;
///
/// let plain = CipherError::new("the KMS refused the key");
/// assert_eq!(plain.to_string(), "the KMS refused the key");
/// let io = std::io::Error::other("connection reset");
/// let wrapped = CipherError::with_source("the KMS is unreachable", io);
/// assert_eq!(wrapped.to_string(), "the KMS is unreachable: connection reset");
/// assert!(wrapped.source().is_some());
/// ```
#[derive(Debug)]
pub struct CipherError {
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl CipherError {
    /// An error saying `message`.
    pub fn new(message: impl Into<String>) -> Self {
        CipherError {
            message: message.into(),
            source: None,
        }
    }

    /// An error saying `message`, caused by `source` (whose text follows it in the
    /// error's own).
    pub fn with_source(
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        CipherError {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

impl fmt::Display for CipherError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for CipherError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// [`protect`] could not seal a marked value: the cipher failed. `data` is unchanged;
/// the message must not be published.
#[derive(Debug)]
pub struct EncryptError {
    path: String,
    cause: CipherError,
}

impl EncryptError {
    /// The marked path whose value could not be sealed (`card.number`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What the cipher said.
    pub fn cipher_error(&self) -> &CipherError {
        &self.cause
    }
}

impl fmt::Display for EncryptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot encrypt the protected field `{}`: {}",
            self.path, self.cause
        )
    }
}

impl StdError for EncryptError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.cause)
    }
}

/// [`unprotect`] met a marked string it cannot restore: the cipher refused it (another
/// key, altered bytes, not a token at all), or it opened to bytes that are not JSON.
/// `data` is unchanged; the message must fail (retry, dead letter), and its handler not
/// run.
///
/// ```
/// use babelqueue_core::gdpr::{self, Cipher, CipherError, DecryptErrorKind, SensitivePath};
/// use serde_json::json;
/// # struct Refuses;
/// # impl Cipher for Refuses {
/// #     fn encrypt(&self, _: &[u8]) -> Result<String, CipherError> { Err(CipherError::new("no")) }
/// #     fn decrypt(&self, _: &str) -> Result<Vec<u8>, CipherError> { Err(CipherError::new("wrong key")) }
/// # }
///
/// let mut data = json!({"email": "bm90IGEgdG9rZW4="}).as_object().cloned().unwrap();
/// let err = gdpr::unprotect(&mut data, &[SensitivePath::new("email")], &Refuses).unwrap_err();
/// assert_eq!(err.path(), "email");
/// assert!(matches!(err.kind(), DecryptErrorKind::Cipher(_)));
/// assert_eq!(err.to_string(), "cannot decrypt the protected field `email`: wrong key");
/// assert_eq!(data["email"], "bm90IGEgdG9rZW4=", "unchanged");
/// ```
#[derive(Debug)]
pub struct DecryptError {
    path: String,
    kind: DecryptErrorKind,
}

/// Why a marked string could not be restored (see [`DecryptError`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum DecryptErrorKind {
    /// The cipher refused the string: another key, altered bytes, or not a token.
    Cipher(CipherError),
    /// The string opened, but to bytes that are not one JSON value.
    NotJson(serde_json::Error),
}

impl DecryptError {
    /// The marked path whose value could not be restored (`addresses[].line`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Why.
    pub fn kind(&self) -> &DecryptErrorKind {
        &self.kind
    }
}

impl fmt::Display for DecryptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            DecryptErrorKind::Cipher(e) => {
                write!(f, "cannot decrypt the protected field `{}`: {e}", self.path)
            }
            DecryptErrorKind::NotJson(e) => write!(
                f,
                "the protected field `{}` decrypted to bytes that are not JSON: {e}",
                self.path
            ),
        }
    }
}

impl StdError for DecryptError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            DecryptErrorKind::Cipher(e) => Some(e),
            DecryptErrorKind::NotJson(e) => Some(e),
        }
    }
}

/// One step of a path: a key, and whether its value is an array whose every element the
/// rest of the path is applied to.
struct Segment<'a> {
    key: &'a str,
    array: bool,
}

/// `path`'s steps, split as the Go and Python SDKs split them: on every `.`, a part's
/// trailing `[]` making it an array step (`matrix[][]` is the array step of the key
/// `matrix[]`); the root `""` has none.
fn segments(path: &str) -> Vec<Segment<'_>> {
    if path.is_empty() {
        return Vec::new();
    }
    path.split('.')
        .map(|part| match part.strip_suffix("[]") {
            Some(key) => Segment { key, array: true },
            None => Segment {
                key: part,
                array: false,
            },
        })
        .collect()
}

/// Runs `op` on each value `segs` reaches in `node`, counting those it changed.
fn apply_at<E>(
    node: &mut Map<String, Value>,
    segs: &[Segment<'_>],
    op: &mut dyn FnMut(&mut Value) -> Result<bool, E>,
    changed: &mut usize,
) -> Result<(), E> {
    let Some((seg, rest)) = segs.split_first() else {
        return Ok(());
    };
    let Some(child) = node.get_mut(seg.key) else {
        return Ok(());
    };
    if seg.array {
        let Value::Array(items) = child else {
            return Ok(());
        };
        for item in items {
            if rest.is_empty() {
                *changed += usize::from(op(item)?);
            } else if let Value::Object(inner) = item {
                apply_at(inner, rest, op, changed)?;
            }
        }
    } else if rest.is_empty() {
        *changed += usize::from(op(child)?);
    } else if let Value::Object(inner) = child {
        apply_at(inner, rest, op, changed)?;
    }
    Ok(())
}

/// Whether a value `segs` reaches in `node` satisfies `pred`.
fn any_at(node: &Map<String, Value>, segs: &[Segment<'_>], pred: &dyn Fn(&Value) -> bool) -> bool {
    let Some((seg, rest)) = segs.split_first() else {
        return false;
    };
    let Some(child) = node.get(seg.key) else {
        return false;
    };
    let deeper = |value: &Value| match value {
        _ if rest.is_empty() => pred(value),
        Value::Object(inner) => any_at(inner, rest, pred),
        _ => false,
    };
    match child {
        Value::Array(items) if seg.array => items.iter().any(deeper),
        _ if seg.array => false,
        _ => deeper(child),
    }
}

/// Runs `op` over every path in order; on an error puts back the top-level values it may
/// have changed and returns the error with its path.
fn apply_all<E>(
    data: &mut Map<String, Value>,
    paths: &[SensitivePath],
    mut op: impl FnMut(&mut Value) -> Result<bool, E>,
) -> Result<usize, (String, E)> {
    // Every change is under the first key of its path: keep those values to put back.
    let mut saved: Vec<(&str, Value)> = Vec::new();
    for sp in paths {
        if let Some(first) = segments(&sp.path).first()
            && !saved.iter().any(|(key, _)| *key == first.key)
            && let Some(value) = data.get(first.key)
        {
            saved.push((first.key, value.clone()));
        }
    }
    let mut changed = 0;
    for sp in paths {
        if let Err(e) = apply_at(data, &segments(&sp.path), &mut op, &mut changed) {
            for (key, value) in saved {
                if let Some(slot) = data.get_mut(key) {
                    *slot = value;
                }
            }
            return Err((sp.path.clone(), e));
        }
    }
    Ok(changed)
}

/// Seals every value of `data` at a marked path: each becomes `cipher`'s token (a string)
/// of the value's [canonical JSON](canonical_json); a whole object or array is sealed as
/// one. Returns how many values were sealed.
///
/// Absent paths and values of another shape than the path (a string where it descends
/// into an object, an object where it descends into an array) are skipped; every other
/// value is left as it is. On an error nothing is changed. Run it on the cleartext after
/// validating it, before encoding the envelope; [`protect_envelope`] does it on an
/// envelope.
///
/// ```
/// use babelqueue_core::gdpr::{self, SensitivePath};
/// use serde_json::json;
/// # use babelqueue_core::gdpr::{Cipher, CipherError};
/// # struct Sealed;
/// # impl Cipher for Sealed {
/// #     fn encrypt(&self, p: &[u8]) -> Result<String, CipherError> { Ok(format!("sealed:{}", String::from_utf8_lossy(p))) }
/// #     fn decrypt(&self, t: &str) -> Result<Vec<u8>, CipherError> { Ok(t.strip_prefix("sealed:").ok_or_else(|| CipherError::new("no"))?.as_bytes().to_vec()) }
/// # }
/// # let cipher = Sealed;
///
/// let paths = [SensitivePath::new("addresses[].line"), SensitivePath::new("profile")];
/// let mut data = json!({
///     "addresses": [{"line": "1 Main St", "city": "Oslo"}, {"city": "Bergen"}],
///     "profile": {"name": "Ann", "age": 41},
///     "amount": 4200
/// }).as_object().cloned().unwrap();
///
/// assert_eq!(gdpr::protect(&mut data, &paths, &cipher)?, 2);
/// assert_eq!(data["addresses"][0]["line"], r#"sealed:"1 Main St""#);
/// assert_eq!(data["addresses"][1], json!({"city": "Bergen"}));
/// assert_eq!(data["profile"], r#"sealed:{"age":41,"name":"Ann"}"#);
/// assert_eq!(data["amount"], 4200);
///
/// assert_eq!(gdpr::unprotect(&mut data, &paths, &cipher)?, 2);
/// assert_eq!(data["profile"], json!({"name": "Ann", "age": 41}));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn protect<C: Cipher + ?Sized>(
    data: &mut Map<String, Value>,
    paths: &[SensitivePath],
    cipher: &C,
) -> Result<usize, EncryptError> {
    apply_all(data, paths, |value| {
        let plaintext = canonical_json(value);
        *value = Value::String(cipher.encrypt(plaintext.as_bytes())?);
        Ok(true)
    })
    .map_err(|(path, cause)| EncryptError { path, cause })
}

/// Restores every marked value of `data` that [`protect`] sealed: each string at a marked
/// path is opened by `cipher` and read as JSON. Returns how many values were restored.
///
/// A marked value that is not a string is left as it is (it was never sealed, or is
/// restored already), so running it again changes nothing where the restored values are
/// not strings; a restored string is read as a token again, and refused (as in the Go
/// and Python SDKs: a marked string is always taken for a token). Absent paths and
/// values of another shape are skipped. A string the cipher refuses, or that opens to
/// bytes that are not JSON, is a [`DecryptError`] and nothing is changed. Run it after decoding, before
/// validating the cleartext and before the handler; [`unprotect_envelope`] does it on an
/// envelope.
///
/// ```
/// use babelqueue_core::gdpr::{self, DecryptErrorKind, SensitivePath};
/// use serde_json::json;
/// # use babelqueue_core::gdpr::{Cipher, CipherError};
/// # struct Sealed;
/// # impl Cipher for Sealed {
/// #     fn encrypt(&self, p: &[u8]) -> Result<String, CipherError> { Ok(format!("sealed:{}", String::from_utf8_lossy(p))) }
/// #     fn decrypt(&self, t: &str) -> Result<Vec<u8>, CipherError> { Ok(t.strip_prefix("sealed:").ok_or_else(|| CipherError::new("no"))?.as_bytes().to_vec()) }
/// # }
/// # let cipher = Sealed;
///
/// let paths = [SensitivePath::new("email"), SensitivePath::new("phone")];
/// let mut data = json!({"email": r#"sealed:"a@b.c""#, "phone": 5550100}).as_object().cloned().unwrap();
/// assert_eq!(gdpr::unprotect(&mut data, &paths, &cipher)?, 1);
/// assert_eq!(data, *json!({"email": "a@b.c", "phone": 5550100}).as_object().unwrap());
///
/// // A token that opens to something other than JSON.
/// let mut bad = json!({"email": "sealed:not json"}).as_object().cloned().unwrap();
/// let err = gdpr::unprotect(&mut bad, &paths, &cipher).unwrap_err();
/// assert!(matches!(err.kind(), DecryptErrorKind::NotJson(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn unprotect<C: Cipher + ?Sized>(
    data: &mut Map<String, Value>,
    paths: &[SensitivePath],
    cipher: &C,
) -> Result<usize, DecryptError> {
    apply_all(data, paths, |value| {
        let Value::String(token) = value else {
            return Ok(false);
        };
        let plaintext = cipher.decrypt(token).map_err(DecryptErrorKind::Cipher)?;
        *value = serde_json::from_slice(&plaintext).map_err(DecryptErrorKind::NotJson)?;
        Ok(true)
    })
    .map_err(|(path, kind)| DecryptError { path, kind })
}

/// [`protect`] on an envelope's `data`: its frame, `job`, `trace_id`, `meta` and
/// `attempts` are not touched. An envelope with nothing to seal keeps its `data` as it
/// arrived.
///
/// ```
/// use babelqueue_core::Envelope;
/// use babelqueue_core::gdpr::{self, SensitivePath};
/// use serde_json::json;
/// # use babelqueue_core::gdpr::{Cipher, CipherError};
/// # struct Sealed;
/// # impl Cipher for Sealed {
/// #     fn encrypt(&self, p: &[u8]) -> Result<String, CipherError> { Ok(format!("sealed:{}", String::from_utf8_lossy(p))) }
/// #     fn decrypt(&self, t: &str) -> Result<Vec<u8>, CipherError> { Ok(t.strip_prefix("sealed:").ok_or_else(|| CipherError::new("no"))?.as_bytes().to_vec()) }
/// # }
/// # let cipher = Sealed;
///
/// let mut env = Envelope::new("urn:babel:users:registered", json!({"email": "é@x.io"}))?
///     .with_trace_id("trace-1");
/// gdpr::protect_envelope(&mut env, &[SensitivePath::new("email")], &cipher)?;
/// assert_eq!(env.data["email"], r#"sealed:"\u00e9@x.io""#);
/// assert_eq!(env.trace_id, "trace-1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn protect_envelope<C: Cipher + ?Sized>(
    env: &mut Envelope,
    paths: &[SensitivePath],
    cipher: &C,
) -> Result<usize, EncryptError> {
    if !reaches_any(env.data.as_map(), paths, &|_| true) {
        return Ok(0);
    }
    protect(env.data.as_map_mut(), paths, cipher)
}

/// [`unprotect`] on an envelope's `data`: its frame, `job`, `trace_id`, `meta` and
/// `attempts` are not touched. An envelope with no marked string keeps its `data` as it
/// arrived (not parsed again).
///
/// ```
/// use babelqueue_core::Envelope;
/// use babelqueue_core::gdpr::{self, SensitivePath};
/// use serde_json::json;
/// # use babelqueue_core::gdpr::{Cipher, CipherError};
/// # struct Sealed;
/// # impl Cipher for Sealed {
/// #     fn encrypt(&self, p: &[u8]) -> Result<String, CipherError> { Ok(format!("sealed:{}", String::from_utf8_lossy(p))) }
/// #     fn decrypt(&self, t: &str) -> Result<Vec<u8>, CipherError> { Ok(t.strip_prefix("sealed:").ok_or_else(|| CipherError::new("no"))?.as_bytes().to_vec()) }
/// # }
/// # let cipher = Sealed;
///
/// let body = br#"{"job":"urn:babel:users:registered","trace_id":"t","data":{"email":"sealed:\"a@b.c\""},
///   "meta":{"id":"m","queue":"users","lang":"python","schema_version":1,"created_at":0},"attempts":0}"#;
/// let mut env = Envelope::decode(body)?;
/// gdpr::unprotect_envelope(&mut env, &[SensitivePath::new("email")], &cipher)?;
/// assert_eq!(env.data["email"], "a@b.c");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn unprotect_envelope<C: Cipher + ?Sized>(
    env: &mut Envelope,
    paths: &[SensitivePath],
    cipher: &C,
) -> Result<usize, DecryptError> {
    if !reaches_any(env.data.as_map(), paths, &|value| value.is_string()) {
        return Ok(0);
    }
    unprotect(env.data.as_map_mut(), paths, cipher)
}

fn reaches_any(
    data: &Map<String, Value>,
    paths: &[SensitivePath],
    pred: &dyn Fn(&Value) -> bool,
) -> bool {
    paths
        .iter()
        .any(|sp| any_at(data, &segments(&sp.path), pred))
}

/// A copy of `data` for logs, each marked value masked by [`mask_value`]: a string cut to
/// its first character and `***`, any other value (a number, `null`, a whole object or
/// array) `***`. Unmarked values are copied as they are.
///
/// It masks at least what [`protect`] seals, and more where a log is safer for it: a
/// mark on the schema's root masks the whole of `data` (the answer is then the string
/// `***`), and a path through arrays of arrays (`matrix[][]`) masks each innermost
/// element. As the Go registry's `Mask`.
///
/// ```
/// use babelqueue_core::gdpr::{mask, SensitivePath};
/// use serde_json::json;
///
/// let data = json!({"email": "alice@example.com", "card": {"number": 4111}, "tags": ["vip"], "name": ""});
/// let paths = ["email", "card.number", "tags[]", "name"].map(SensitivePath::new);
/// assert_eq!(
///     mask(data.as_object().unwrap(), &paths),
///     json!({"email": "a***", "card": {"number": "***"}, "tags": ["v***"], "name": "***"})
/// );
/// assert_eq!(mask(data.as_object().unwrap(), &[SensitivePath::new("")]), json!("***"));
/// ```
pub fn mask(data: &Map<String, Value>, paths: &[SensitivePath]) -> Value {
    if paths.iter().any(|sp| sp.path.is_empty()) {
        return Value::String(MASK.to_owned());
    }
    let mut copy = data.clone();
    for sp in paths {
        let segs: Vec<(&str, usize)> = sp
            .path
            .split('.')
            .map(|part| {
                let mut key = part;
                let mut depth = 0;
                while let Some(shorter) = key.strip_suffix("[]") {
                    key = shorter;
                    depth += 1;
                }
                (key, depth)
            })
            .collect();
        mask_at(&mut copy, &segs);
    }
    Value::Object(copy)
}

fn mask_at(node: &mut Map<String, Value>, segs: &[(&str, usize)]) {
    let Some((&(key, depth), rest)) = segs.split_first() else {
        return;
    };
    if let Some(child) = node.get_mut(key) {
        mask_in(child, depth, rest);
    }
}

/// Masks `value` (after descending `depth` levels of arrays), or goes on with `rest`.
fn mask_in(value: &mut Value, depth: usize, rest: &[(&str, usize)]) {
    if depth > 0 {
        if let Value::Array(items) = value {
            for item in items {
                mask_in(item, depth - 1, rest);
            }
        }
        return;
    }
    if rest.is_empty() {
        *value = mask_value(value);
    } else if let Value::Object(inner) = value {
        mask_at(inner, rest);
    }
}

/// One value masked for a log: a non-empty string is its first character and `***`,
/// anything else (an empty string, a number, a boolean, `null`, an object, an array) is
/// `***`.
///
/// ```
/// use babelqueue_core::gdpr::mask_value;
/// use serde_json::json;
///
/// assert_eq!(mask_value(&json!("Øyvind")), json!("Ø***"));
/// assert_eq!(mask_value(&json!("")), json!("***"));
/// assert_eq!(mask_value(&json!({"a": 1})), json!("***"));
/// ```
pub fn mask_value(value: &Value) -> Value {
    match value {
        Value::String(s) => match s.chars().next() {
            Some(first) => Value::String(format!("{first}{MASK}")),
            None => Value::String(MASK.to_owned()),
        },
        _ => Value::String(MASK.to_owned()),
    }
}
