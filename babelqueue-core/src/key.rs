//! What a dedupe key can be made from: [`DedupeKey`].

use std::borrow::Cow;

use serde_json::Value;

use crate::envelope::Envelope;

/// A value the guard can key its seen-set on.
///
/// An [`Envelope`] gives its `meta.id`; strings give themselves; integers their decimal
/// form; a JSON value its string or number; `Option::None` gives no key. An absent or
/// empty key makes the guard **fail open** (the handler runs, nothing is remembered).
///
/// ```
/// use babelqueue_core::DedupeKey;
/// assert_eq!("pay_7f3a".dedupe_key().as_deref(), Some("pay_7f3a"));
/// assert_eq!(42u64.dedupe_key().as_deref(), Some("42"));
/// assert_eq!(None::<&str>.dedupe_key(), None);
/// assert_eq!("".dedupe_key(), None);
/// ```
pub trait DedupeKey {
    /// The key, or `None` when there is no usable key.
    fn dedupe_key(&self) -> Option<Cow<'_, str>>;
}

fn non_empty(s: &str) -> Option<Cow<'_, str>> {
    (!s.is_empty()).then_some(Cow::Borrowed(s))
}

impl DedupeKey for Envelope {
    fn dedupe_key(&self) -> Option<Cow<'_, str>> {
        non_empty(&self.meta.id)
    }
}

impl DedupeKey for str {
    fn dedupe_key(&self) -> Option<Cow<'_, str>> {
        non_empty(self)
    }
}

impl DedupeKey for String {
    fn dedupe_key(&self) -> Option<Cow<'_, str>> {
        non_empty(self)
    }
}

impl DedupeKey for Cow<'_, str> {
    fn dedupe_key(&self) -> Option<Cow<'_, str>> {
        non_empty(self)
    }
}

impl DedupeKey for Value {
    fn dedupe_key(&self) -> Option<Cow<'_, str>> {
        match self {
            Value::String(s) => non_empty(s),
            Value::Number(n) => Some(Cow::Owned(n.to_string())),
            _ => None,
        }
    }
}

impl DedupeKey for uuid::Uuid {
    fn dedupe_key(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Owned(self.to_string()))
    }
}

impl<T: DedupeKey + ?Sized> DedupeKey for &T {
    fn dedupe_key(&self) -> Option<Cow<'_, str>> {
        T::dedupe_key(self)
    }
}

impl<T: DedupeKey> DedupeKey for Option<T> {
    fn dedupe_key(&self) -> Option<Cow<'_, str>> {
        self.as_ref().and_then(T::dedupe_key)
    }
}

macro_rules! int_key {
    ($($t:ty),*) => {$(
        impl DedupeKey for $t {
            fn dedupe_key(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Owned(self.to_string()))
            }
        }
    )*};
}
int_key!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

/// The longest `meta.id` (in bytes) a message may carry to be handled: every store of this
/// library can hold a key of this length (PostgreSQL and SQLite index it, Redis prefixes
/// it). A longer id makes the message `poison` (see [`id_is_storable`]).
pub const MAX_ID_LEN: usize = 512;

/// Why an id cannot be stored by every store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnstorableId {
    /// Longer than [`MAX_ID_LEN`] bytes.
    #[error("meta.id is {len} bytes long, over the limit of {max} bytes")]
    TooLong {
        /// The id's length in bytes.
        len: usize,
        /// [`MAX_ID_LEN`].
        max: usize,
    },
    /// Contains a NUL character (PostgreSQL text cannot hold it).
    #[error("meta.id contains a NUL character")]
    Nul,
}

/// The one rule for ids that a store can hold, the same in every store: at most
/// [`MAX_ID_LEN`] bytes and no NUL character. (An empty id is not a key at all: the guard
/// fails open.) The runtime dead-letters a message whose `meta.id` breaks it as `poison`,
/// with the reason in `dead_letter.error`; a store refuses such a key with an error.
///
/// ```
/// use babelqueue_core::key::{id_is_storable, UnstorableId, MAX_ID_LEN};
/// assert!(id_is_storable("pay_7f3a").is_ok());
/// assert_eq!(id_is_storable("a\0b"), Err(UnstorableId::Nul));
/// assert!(matches!(id_is_storable(&"x".repeat(MAX_ID_LEN + 1)), Err(UnstorableId::TooLong { .. })));
/// ```
pub fn id_is_storable(id: &str) -> Result<(), UnstorableId> {
    if id.len() > MAX_ID_LEN {
        return Err(UnstorableId::TooLong {
            len: id.len(),
            max: MAX_ID_LEN,
        });
    }
    if id.as_bytes().contains(&0) {
        return Err(UnstorableId::Nul);
    }
    Ok(())
}
