//! Payload fingerprints: a replayed key with a different payload is refused, not skipped.
//!
//! The seen-set skips every delivery whose key it has seen. With a custom key (say a
//! `payment_id`), a bug that reuses the key for a *different* payload (another amount)
//! would be skipped silently. A fingerprinting guard ([`Guard::fingerprint`](crate::Guard::fingerprint),
//! `#[idempotent(fingerprint)]`) stores a digest of the
//! payload with the key, and a later delivery of the same key:
//!
//! * with the same payload → skipped, as usual;
//! * with a different payload → the handler does not run, and the guard returns
//!   [`PayloadMismatch`] (converted into the handler's error): the runtime retries and then
//!   dead-letters it as `failed`, with the error saying the payload differs from the first
//!   delivery of that key;
//! * whose key was written without a fingerprint (by another SDK: Redis value `1`, a
//!   PostgreSQL row whose `fingerprint` is NULL; or by a handler without `fingerprint`) →
//!   skipped: "no fingerprint" is honoured, never reported as a mismatch.
//!
//! The digest is SHA-256 over the **canonical JSON** of `data`: compact, object keys sorted
//! (by code point) at every depth, numbers and strings as `serde_json` writes them. Two
//! payloads that differ only in key order are the same payload; `1` and `1.0` are not.
//! It is stored as text, `sha256:<64 hex digits>`.
//!
//! SHA-256 (the RustCrypto `sha2` crate) rather than std's hashers: the digest is persisted
//! and compared across processes, versions and machines, and std documents that its
//! `DefaultHasher` may change between releases; a 64-bit hash would also make accidental
//! collisions between payloads of one key a real possibility over billions of keys.
//!
//! ```
//! use babelqueue_core::fingerprint::{Fingerprint, PayloadMismatch};
//! use babelqueue_core::{Envelope, Guard, InMemoryStore, Outcome};
//!
//! #[derive(Debug)]
//! enum Error { Replay(PayloadMismatch) }
//! impl From<PayloadMismatch> for Error { fn from(e: PayloadMismatch) -> Self { Error::Replay(e) } }
//!
//! let store = InMemoryStore::new();
//! let first = Envelope::new("urn:babel:payments:charge", serde_json::json!({"payment_id": "pay_7f3a", "amount": 4200}))?;
//! let bad = Envelope::new("urn:babel:payments:charge", serde_json::json!({"payment_id": "pay_7f3a", "amount": 9900}))?;
//! let run = |env: &Envelope| {
//!     Guard::new(&store)
//!         .fingerprint(Fingerprint::of_envelope(env))
//!         .run("pay_7f3a", || Ok::<(), Error>(()))
//! };
//! assert_eq!(run(&first).unwrap(), Outcome::Ran);
//! assert_eq!(run(&first).unwrap(), Outcome::Skipped);
//! assert!(matches!(run(&bad), Err(Error::Replay(_))));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Guarantees**: a key first processed with a fingerprint is never skipped for a
//! different payload while the store remembers it. **Does not**: detect a mismatch when
//! the first delivery was remembered without a fingerprint; compare anything outside
//! `data` (headers, `trace_id`); combine with lease mode (not supported yet).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::envelope::Envelope;
use crate::store::{AsyncStore, Store};

/// The text prefix of a stored fingerprint: `sha256:<hex>`.
pub const PREFIX: &str = "sha256:";

/// A SHA-256 digest of a payload's canonical JSON.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a `data` value: SHA-256 of its canonical JSON (keys sorted).
    ///
    /// ```
    /// use babelqueue_core::fingerprint::Fingerprint;
    /// use serde_json::json;
    /// assert_eq!(
    ///     Fingerprint::of_data(&json!({"a": 1, "b": [true, null]})),
    ///     Fingerprint::of_data(&json!({"b": [true, null], "a": 1})),
    /// );
    /// assert_ne!(Fingerprint::of_data(&json!({"a": 1})), Fingerprint::of_data(&json!({"a": 2})));
    /// ```
    pub fn of_data(data: &Value) -> Self {
        let mut buf = Vec::with_capacity(128);
        canonical(data, &mut buf);
        Self::of_bytes(&buf)
    }

    /// The fingerprint of an envelope's `data`.
    pub fn of_envelope(env: &Envelope) -> Self {
        let mut buf = Vec::with_capacity(128);
        canonical_map(&env.data, &mut buf);
        Self::of_bytes(&buf)
    }

    /// SHA-256 of raw bytes.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Fingerprint(Sha256::digest(bytes).into())
    }

    /// The 32 digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses a stored fingerprint (`sha256:<64 lowercase hex>`); anything else (such as
    /// the value `1` other SDKs write) is `None`: no fingerprint.
    ///
    /// ```
    /// use babelqueue_core::fingerprint::Fingerprint;
    /// let fp = Fingerprint::of_bytes(b"x");
    /// assert_eq!(Fingerprint::parse(&fp.to_string()), Some(fp));
    /// assert_eq!(Fingerprint::parse("1"), None);
    /// ```
    pub fn parse(text: &str) -> Option<Self> {
        let hex = text.strip_prefix(PREFIX)?.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
        }
        Some(Fingerprint(out))
    }
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PREFIX)?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Canonical JSON: compact, object keys sorted at every depth.
fn canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(map) => canonical_map(map, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(v, out);
            }
            out.push(b']');
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

fn canonical_map(map: &serde_json::Map<String, Value>, out: &mut Vec<u8>) {
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push(b'{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Writing a string or a scalar into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, k);
        out.push(b':');
        canonical(v, out);
    }
    out.push(b'}');
}

/// The payload of a delivery differs from the payload first processed under its key.
///
/// Returned (converted into the handler's error) by a fingerprinting guard instead of
/// skipping the delivery: it is a replay bug or a key collision, not a duplicate. The
/// runtime treats it as a handler failure: retried, then dead-lettered with reason
/// `failed` and this message in `dead_letter.error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "payload of key {key} differs from the first delivery of that key \
     (first {stored}, this one {received}); not skipped as a duplicate"
)]
pub struct PayloadMismatch {
    /// The dedupe key (as stored, namespace included).
    pub key: String,
    /// The fingerprint stored by the first delivery.
    pub stored: Fingerprint,
    /// This delivery's fingerprint.
    pub received: Fingerprint,
}

/// What a store knows about a key: unseen, or seen with the fingerprint stored with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Not remembered (or expired, or forgotten).
    Unseen,
    /// Remembered (or held in flight); `fingerprint` is `None` when it was written without
    /// one (another SDK, a handler without fingerprints).
    Seen {
        /// The stored fingerprint, if any.
        fingerprint: Option<Fingerprint>,
    },
}

/// A blocking [`Store`] that keeps a fingerprint with a remembered id.
pub trait FingerprintStore: Store {
    /// Whether `id` is live, and its stored fingerprint.
    fn lookup(&self, id: &str) -> Result<Lookup, Self::Error>;

    /// Remembers `id` with `fingerprint`, for `ttl` (`None`: the store's default). Like
    /// `remember`, it does not overwrite a live id.
    fn remember_fingerprint(
        &self,
        id: &str,
        fingerprint: &Fingerprint,
        ttl: Option<Duration>,
    ) -> Result<(), Self::Error>;
}

/// An [`AsyncStore`] that keeps a fingerprint with a remembered id.
pub trait AsyncFingerprintStore: AsyncStore {
    /// See [`FingerprintStore::lookup`].
    fn lookup(&self, id: &str) -> impl Future<Output = Result<Lookup, Self::Error>> + Send;

    /// See [`FingerprintStore::remember_fingerprint`].
    fn remember_fingerprint(
        &self,
        id: &str,
        fingerprint: &Fingerprint,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

macro_rules! forward {
    ($(impl[$($g:tt)*] for $ty:ty;)*) => {$(
        impl<$($g)*> FingerprintStore for $ty {
            fn lookup(&self, id: &str) -> Result<Lookup, Self::Error> { S::lookup(self, id) }
            fn remember_fingerprint(&self, id: &str, fp: &Fingerprint, ttl: Option<Duration>)
                -> Result<(), Self::Error> {
                S::remember_fingerprint(self, id, fp, ttl)
            }
        }
    )*};
}

macro_rules! forward_async {
    ($(impl[$($g:tt)*] for $ty:ty;)*) => {$(
        impl<$($g)*> AsyncFingerprintStore for $ty {
            fn lookup(&self, id: &str) -> impl Future<Output = Result<Lookup, Self::Error>> + Send {
                S::lookup(self, id)
            }
            fn remember_fingerprint(&self, id: &str, fp: &Fingerprint, ttl: Option<Duration>)
                -> impl Future<Output = Result<(), Self::Error>> + Send {
                S::remember_fingerprint(self, id, fp, ttl)
            }
        }
    )*};
}

forward! {
    impl[S: FingerprintStore + ?Sized] for &S;
    impl[S: FingerprintStore + ?Sized] for Box<S>;
    impl[S: FingerprintStore + ?Sized] for std::sync::Arc<S>;
    impl[S: FingerprintStore, F: FnOnce() -> S] for std::sync::LazyLock<S, F>;
    impl[S: FingerprintStore, F: FnOnce() -> S] for once_cell::sync::Lazy<S, F>;
}

forward_async! {
    impl[S: AsyncFingerprintStore + ?Sized] for &S;
    impl[S: AsyncFingerprintStore + ?Sized] for Box<S>;
    impl[S: AsyncFingerprintStore + ?Sized] for std::sync::Arc<S>;
    impl[S: AsyncFingerprintStore, F: FnOnce() -> S + Send] for std::sync::LazyLock<S, F>;
    impl[S: AsyncFingerprintStore, F: FnOnce() -> S + Send] for once_cell::sync::Lazy<S, F>;
}

/// Decides what a lookup means for a delivery with `received`: `Ok(true)` skip,
/// `Ok(false)` run, `Err` a mismatch.
pub fn check(key: &str, lookup: Lookup, received: &Fingerprint) -> Result<bool, PayloadMismatch> {
    match lookup {
        Lookup::Unseen => Ok(false),
        Lookup::Seen { fingerprint: None } => Ok(true),
        Lookup::Seen {
            fingerprint: Some(stored),
        } if stored == *received => Ok(true),
        Lookup::Seen {
            fingerprint: Some(stored),
        } => Err(PayloadMismatch {
            key: key.to_owned(),
            stored,
            received: *received,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let mut buf = Vec::new();
        canonical(
            &json!({"b": {"y": 1, "x": [{"d": "é/", "c": 1.5}]}, "a": null}),
            &mut buf,
        );
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            r#"{"a":null,"b":{"x":[{"c":1.5,"d":"é/"}],"y":1}}"#
        );
    }

    #[test]
    fn known_digest_and_text_round_trip() {
        // sha256("{}")
        let fp = Fingerprint::of_data(&json!({}));
        assert_eq!(
            fp.to_string(),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_eq!(Fingerprint::parse(&fp.to_string()), Some(fp));
        for not_fp in [
            "",
            "1",
            "sha256:",
            "sha256:XY",
            "lease:abc",
            &fp.to_string()[1..],
        ] {
            assert_eq!(Fingerprint::parse(not_fp), None, "{not_fp:?}");
        }
        let upper = fp.to_string().to_uppercase().replace("SHA256", "sha256");
        assert_eq!(
            Fingerprint::parse(&upper),
            None,
            "only the written form parses"
        );
    }

    #[test]
    fn check_decides() {
        let a = Fingerprint::of_bytes(b"a");
        let b = Fingerprint::of_bytes(b"b");
        assert_eq!(check("k", Lookup::Unseen, &a), Ok(false));
        assert_eq!(check("k", Lookup::Seen { fingerprint: None }, &a), Ok(true));
        assert_eq!(
            check(
                "k",
                Lookup::Seen {
                    fingerprint: Some(a)
                },
                &a
            ),
            Ok(true)
        );
        let err = check(
            "k",
            Lookup::Seen {
                fingerprint: Some(a),
            },
            &b,
        )
        .unwrap_err();
        assert_eq!((err.stored, err.received), (a, b));
        assert!(
            err.to_string()
                .starts_with("payload of key k differs from the first delivery")
        );
    }
}
