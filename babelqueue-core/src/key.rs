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
