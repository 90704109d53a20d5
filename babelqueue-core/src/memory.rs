//! [`InMemoryStore`]: a process-local, bounded, sharded seen-set.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashTable};

/// The seeded hash of the index and of the shard choice (hashbrown's default, foldhash:
/// a per-store random seed, several times cheaper than SipHash on a 16-byte key).
type RandomState = DefaultHashBuilder;

use crate::fingerprint::{AsyncFingerprintStore, Fingerprint, FingerprintStore, Lookup};
use crate::lease::{AsyncLeaseStore, Claim, LeaseStore, LeaseToken};
use crate::retention::DEFAULT_RETENTION;
use crate::store::{AsyncStore, Store};

mod clock;

use clock::Clock;
pub use clock::StoreClock;

/// Capacities below this use one shard, so "oldest first" eviction is exact.
const EXACT_FIFO_BELOW: usize = 4096;
const DEFAULT_SHARDS: usize = 32;
/// `expires` value of an entry that never expires.
const NEVER: u64 = 0;
/// `expires` value of a forgotten entry waiting to leave the ring.
const DEAD: u64 = u64::MAX;
/// The most entries one shard's ring holds (the index keeps 32-bit sequence numbers,
/// which identify a ring slot while the ring is shorter than 2³²); beyond it the oldest
/// entry is evicted, as with a capacity. (At 32 bytes an entry, that is 128 GiB a shard.)
/// Live front entries moved to the back per eviction pass (see `Shard::evict`).
const ROTATIONS: usize = 2;

/// Whether an entry expiring at `a` outlives one expiring at `b` ([`NEVER`] outlives every
/// deadline; a forgotten entry, [`DEAD`], outlives nothing and is outlived by nothing).
fn outlives(a: u64, b: u64) -> bool {
    match (a, b) {
        (DEAD, _) | (_, DEAD) => false,
        (NEVER, b) => b != NEVER,
        (_, NEVER) => false,
        (a, b) => a > b,
    }
}

const RING_LIMIT: usize = if cfg!(test) { 128 } else { u32::MAX as usize };

/// A process-local seen-set: for tests and a single process (a fleet needs a shared
/// store such as Redis or PostgreSQL).
///
/// * **Cannot fail**: its error type is [`Infallible`], so a handler returning `()` can
///   use it, and it implements both [`Store`] and [`AsyncStore`] (no call ever blocks on
///   I/O).
/// * **Concurrent**: ids are spread over independent shards (32 by default), each behind
///   its own mutex, so many threads do not contend on one lock.
/// * **Bounded**: a TTL (a remembered id stops being seen after it; by default
///   [`DEFAULT_RETENTION`], 7 days; [`InMemoryStoreBuilder::keep_forever`] for none) and an
///   optional capacity (the oldest ids are evicted first), so a consumer running for
///   months does not grow without limit. With a capacity below 4096 the store uses a single
///   shard and eviction is exactly oldest-first; above, each shard holds
///   `capacity / shards` ids and evicts its own oldest.
/// * **Small**: an id in the canonical UUID form (lowercase, hyphenated, what every
///   BabelQueue SDK mints) is stored as its 16 bytes, not as a string. One remembered UUID
///   id costs 32 bytes in the insertion ring plus 5 bytes in the hash index, before the
///   spare room that growing collections keep: **measured 44.0 bytes per id at 1,000,000
///   ids** (`cargo bench --bench memory_per_id`), against 88.4 bytes for a
///   `HashSet<String>` of the same ids in the same run. Other ids are stored as a
///   `Box<str>` (plus their length on the heap).
/// * **Clock** ([`StoreClock`]): TTLs and leases are measured on the system's monotonic
///   clock, and a duplicate far (over 50 ms) from its deadline is confirmed from the
///   kernel's coarse clock, without an exact read. Built on a tokio runtime whose clock is
///   paused (`#[tokio::test(start_paused = true)]`), the store follows tokio's clock
///   instead, so `tokio::time::advance` expires its ids; [`InMemoryStoreBuilder::clock`]
///   chooses explicitly.
///
/// ```
/// use std::time::Duration;
/// use babelqueue_core::{InMemoryStore, Store};
///
/// let store = InMemoryStore::builder()
///     .ttl(Duration::from_secs(24 * 3600))
///     .capacity(1_000_000)
///     .build();
/// store.remember("f1e2d3c4-b5a6-4789-90ab-cdef01234567").unwrap();
/// assert!(store.seen("f1e2d3c4-b5a6-4789-90ab-cdef01234567").unwrap());
/// assert_eq!(store.len(), 1);
/// ```
pub struct InMemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    ttl: Option<Duration>,
    per_shard_capacity: Option<usize>,
    clock: Clock,
    /// The last fencing token handed out (one counter for every id: increasing per id).
    fences: AtomicU64,
}

/// Builds an [`InMemoryStore`] with a TTL and/or a capacity.
#[derive(Debug, Default, Clone)]
pub struct InMemoryStoreBuilder {
    ttl: Option<Duration>,
    forever: bool,
    capacity: Option<usize>,
    shards: Option<usize>,
    clock: StoreClock,
}

impl InMemoryStoreBuilder {
    /// How long a remembered id is seen (default [`DEFAULT_RETENTION`], 7 days).
    /// `remember_for` overrides it per id.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self.forever = false;
        self
    }

    /// Remembered ids never expire (only `capacity` and `forget` remove them).
    ///
    /// ```
    /// let store = babelqueue_core::InMemoryStore::builder().keep_forever().build();
    /// assert_eq!(store.ttl(), None);
    /// assert_eq!(babelqueue_core::InMemoryStore::new().ttl(), Some(babelqueue_core::retention::DEFAULT_RETENTION));
    /// ```
    #[must_use]
    pub fn keep_forever(mut self) -> Self {
        self.ttl = None;
        self.forever = true;
        self
    }

    /// The most ids kept; beyond it the oldest are evicted (default: unbounded).
    #[must_use]
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = Some(capacity.max(1));
        self
    }

    /// The number of shards (rounded up to a power of two; default 32, or 1 for a
    /// capacity below 4096).
    #[must_use]
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards.clamp(1, 1 << 16).next_power_of_two());
        self
    }

    /// The clock TTLs and leases are measured on (default [`StoreClock::Auto`]: tokio's
    /// when the store is built on a paused tokio runtime, the system's otherwise). Set
    /// [`StoreClock::Tokio`] for a store that must follow paused time but is built before
    /// `tokio::time::pause()` or off the runtime.
    ///
    /// ```
    /// use babelqueue_core::{InMemoryStore, memory::StoreClock};
    /// let store = InMemoryStore::builder().clock(StoreClock::System).build();
    /// assert_eq!(store.clock(), StoreClock::System);
    /// ```
    #[must_use]
    pub fn clock(mut self, clock: StoreClock) -> Self {
        self.clock = clock;
        self
    }

    /// Builds the store.
    pub fn build(self) -> InMemoryStore {
        let shards = match (self.shards, self.capacity) {
            (Some(n), _) => n,
            (None, Some(c)) if c < EXACT_FIFO_BELOW => 1,
            (None, _) => DEFAULT_SHARDS,
        };
        InMemoryStore {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::default(),
            ttl: if self.forever {
                None
            } else {
                Some(self.ttl.unwrap_or(DEFAULT_RETENTION))
            },
            per_shard_capacity: self.capacity.map(|c| (c / shards).max(1)),
            clock: Clock::new(self.clock),
            fences: AtomicU64::new(0),
        }
    }
}

impl Default for InMemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for InMemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryStore")
            .field("shards", &self.shards.len())
            .field("ttl", &self.ttl)
            .field("per_shard_capacity", &self.per_shard_capacity)
            .field("clock", &self.clock.kind())
            .field("len", &self.len())
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Uuid([u8; 16]),
    Text(Box<str>),
}

/// A key as looked up: a UUID as two words (the 16 bytes of [`Key::Uuid`], little-endian),
/// so that moving it is two aligned 8-byte copies (a `[u8; 16]` next to the tag sat at
/// offset 1 and was moved in overlapping pieces, which stalled store-to-load forwarding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyRef<'a> {
    Uuid([u64; 2]),
    Text(&'a str),
}

impl Key {
    fn as_ref(&self) -> KeyRef<'_> {
        match self {
            Key::Uuid(b) => KeyRef::Uuid(uuid_words(b)),
            Key::Text(s) => KeyRef::Text(s),
        }
    }
}

impl KeyRef<'_> {
    fn parse(id: &str) -> KeyRef<'_> {
        // Only the canonical lowercase hyphenated form is packed, so two spellings of
        // one UUID stay two ids, as they are in every other store.
        match canonical_uuid(id.as_bytes()) {
            Some(words) => KeyRef::Uuid(words),
            None => KeyRef::Text(id),
        }
    }

    fn to_owned(self) -> Key {
        match self {
            KeyRef::Uuid(w) => Key::Uuid(uuid_bytes(w)),
            KeyRef::Text(s) => Key::Text(s.into()),
        }
    }

    fn hash_with(self, state: &RandomState) -> u64 {
        // No variant tag: a UUID key never equals a text key, so a shared hash is only a
        // collision, which the index resolves by comparing keys.
        let mut h = state.build_hasher();
        match self {
            KeyRef::Uuid([lo, hi]) => h.write_u128(u128::from(lo) | (u128::from(hi) << 64)),
            KeyRef::Text(s) => {
                h.write(s.as_bytes());
                h.write_u8(0xff);
            }
        }
        h.finish()
    }
}

/// The 16 bytes of `id`, as two little-endian words ([`uuid_bytes`] spells them), if it is
/// a UUID in the canonical form (36 characters, lowercase hex digits, hyphens at 8, 13, 18
/// and 23). The 32 digits are gathered into four eight-digit words, then checked and
/// decoded sixteen at a time with SSE2 (every x86-64 CPU has it), or eight at a time in a
/// `u64` elsewhere ([`canonical_uuid_swar`]); either way without a branch per digit.
#[inline]
fn canonical_uuid(id: &[u8]) -> Option<[u64; 2]> {
    let words = uuid_digit_words(id)?;
    // SAFETY: SSE2, the only feature `decode_sse2` enables, is part of the x86-64
    // baseline: every x86-64 CPU has it.
    #[cfg(target_arch = "x86_64")]
    return unsafe { decode_sse2(words) };
    #[cfg(not(target_arch = "x86_64"))]
    return decode_swar(words);
}

/// The 32 digits of a 36-byte id with hyphens at 8, 13, 18 and 23, as four words of eight
/// digits (the first digit in the lowest byte): 0..8, 9..13 + 14..18, 19..23 + 24..28,
/// 28..36. `None` for another length or a missing hyphen.
#[inline]
fn uuid_digit_words(id: &[u8]) -> Option<[u64; 4]> {
    let id: &[u8; 36] = id.try_into().ok()?;
    if id[8] != b'-' || id[13] != b'-' || id[18] != b'-' || id[23] != b'-' {
        return None;
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&id[at..at + 8]);
        u64::from_le_bytes(w)
    };
    Some([
        word(0),
        (word(9) & 0xFFFF_FFFF) | (word(14) << 32),
        (word(19) & 0xFFFF_FFFF) | (word(24) << 32),
        word(28),
    ])
}

/// [`canonical_uuid`] without SSE2: each eight-digit word decoded and checked by [`hex8`].
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn canonical_uuid_swar(id: &[u8]) -> Option<[u64; 2]> {
    decode_swar(uuid_digit_words(id)?)
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn decode_swar([w0, w1, w2, w3]: [u64; 4]) -> Option<[u64; 2]> {
    let (a, wrong_a) = hex8(w0);
    let (b, wrong_b) = hex8(w1);
    let (c, wrong_c) = hex8(w2);
    let (d, wrong_d) = hex8(w3);
    let words = [
        u64::from(a) | (u64::from(b) << 32),
        u64::from(c) | (u64::from(d) << 32),
    ];
    (wrong_a | wrong_b | wrong_c | wrong_d == 0).then_some(words)
}

/// Sixteen digits a vector, in three steps:
///
/// 1. check: a byte is a digit when `byte - '0'` is at most 9 or `byte - 'a'` at most 5
///    (unsigned, by a saturating subtraction that leaves zero);
/// 2. value: `byte - '0'` for `0-9`, `byte - 'a' + 10` for `a-f`;
/// 3. pack: each 16-bit lane (first digit low) becomes `first << 4 | second`, and
///    `packus` narrows the lanes of both vectors to the 16 bytes, in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
#[inline]
fn decode_sse2([w0, w1, w2, w3]: [u64; 4]) -> Option<[u64; 2]> {
    use std::arch::x86_64::*;
    // The intrinsics below only compute on registers.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn lanes(x: __m128i) -> (__m128i, __m128i) {
        let from_zero = _mm_sub_epi8(x, _mm_set1_epi8(b'0' as i8));
        let from_a = _mm_sub_epi8(x, _mm_set1_epi8(b'a' as i8));
        let is_digit = _mm_cmpeq_epi8(
            _mm_subs_epu8(from_zero, _mm_set1_epi8(9)),
            _mm_setzero_si128(),
        );
        let is_letter =
            _mm_cmpeq_epi8(_mm_subs_epu8(from_a, _mm_set1_epi8(5)), _mm_setzero_si128());
        let values = _mm_or_si128(
            _mm_and_si128(is_digit, from_zero),
            _mm_and_si128(is_letter, _mm_add_epi8(from_a, _mm_set1_epi8(10))),
        );
        let packed = _mm_or_si128(
            _mm_slli_epi16(_mm_and_si128(values, _mm_set1_epi16(0x00FF)), 4),
            _mm_srli_epi16(values, 8),
        );
        (packed, _mm_or_si128(is_digit, is_letter))
    }
    let (first, ok_first) = lanes(_mm_set_epi64x(w1 as i64, w0 as i64));
    let (second, ok_second) = lanes(_mm_set_epi64x(w3 as i64, w2 as i64));
    if _mm_movemask_epi8(_mm_and_si128(ok_first, ok_second)) != 0xFFFF {
        return None;
    }
    let bytes = _mm_packus_epi16(first, second);
    let lo = _mm_cvtsi128_si64(bytes) as u64;
    let hi = _mm_cvtsi128_si64(_mm_unpackhi_epi64(bytes, bytes)) as u64;
    Some([lo, hi])
}

/// The 16 bytes a UUID's two words stand for.
fn uuid_bytes([lo, hi]: [u64; 2]) -> [u8; 16] {
    (u128::from(lo) | (u128::from(hi) << 64)).to_le_bytes()
}

/// The two words of a UUID's 16 bytes (the inverse of [`uuid_bytes`]).
fn uuid_words(bytes: &[u8; 16]) -> [u64; 2] {
    let n = u128::from_le_bytes(*bytes);
    [n as u64, (n >> 64) as u64]
}

/// Eight lowercase hex digits, the first in the lowest byte of `x`, as the four bytes they
/// spell (the first in the lowest byte), and a word that is not zero when a byte of `x` is
/// not `0-9` or `a-f` (the four bytes mean nothing then).
///
/// Each byte `c` is decoded as `(c & 0xf) + 9 * bit6(c)` (exact for `0-9` and `a-f`), then
/// checked by spelling the value back: a byte is a digit exactly when its value is below
/// 16 and spells `c` again. No step of the check carries into the next byte (values stay
/// below 25).
fn hex8(x: u64) -> (u32, u64) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let letters = (x >> 6) & ONES;
    let values = (x & (ONES * 0x0F)) + letters * 9;
    let over_nine = ((values + ONES * (0x80 - 10)) >> 7) & ONES;
    let spelled = values + ONES * u64::from(b'0') + over_nine * u64::from(b'a' - b'0' - 10);
    let over_fifteen = (values + ONES * (0x80 - 16)) & (ONES * 0x80);
    let not_digits = (spelled ^ x) | over_fifteen;
    // Each 16-bit lane: (first digit << 4) | second digit, in its low byte; then the four
    // low bytes side by side. (Wrapping: for bytes that are not digits the sum may carry.)
    const LOW_BYTES: u64 = 0x00FF_00FF_00FF_00FF;
    let pairs = (values << 4).wrapping_add(values >> 8) & LOW_BYTES;
    let packed = (pairs | (pairs >> 8)) & 0x0000_FFFF_0000_FFFF;
    (((packed | (packed >> 16)) & 0xFFFF_FFFF) as u32, not_digits)
}

#[derive(Debug)]
struct Entry {
    key: Key,
    /// Deadline in store milliseconds, [`NEVER`], or [`DEAD`] once forgotten.
    expires: u64,
}

/// One shard: entries in insertion order (a ring) and a hash index of their sequence
/// numbers, so each key is stored once.
///
/// The index holds the low 32 bits of a sequence number (5 bytes a bucket with its
/// control byte, against 9 for a `u64`): the ring never holds more than [`RING_LIMIT`]
/// entries, so `low - base` (wrapping) is the slot in the ring.
#[derive(Debug, Default)]
struct Shard {
    ring: VecDeque<Entry>,
    /// Sequence number of `ring[0]`.
    base: u64,
    index: HashTable<u32>,
    /// In-flight claims of lease mode: key → (token, lease deadline).
    inflight: HashMap<Box<str>, (LeaseToken, u64)>,
    /// `inflight` size at which expired claims (holders that died or finished too
    /// late) are swept, so abandoned claims do not accumulate.
    sweep_inflight_at: usize,
    /// Payload fingerprints of the entries remembered with one, by sequence number
    /// (empty, and free, when no handler uses fingerprints).
    fingerprints: HashMap<u64, Fingerprint>,
}

/// The ring slot of the entry whose sequence number ends in `low`.
fn slot(base: u64, low: u32) -> usize {
    // `base as u32` truncates on purpose: the ring is shorter than 2³² (`RING_LIMIT`).
    let off = low.wrapping_sub(base as u32);
    off as usize
}

impl Shard {
    fn find(&self, hash: u64, key: KeyRef<'_>) -> Option<u64> {
        let Shard {
            ring, base, index, ..
        } = self;
        // One comparison per kind of key, so a UUID's probe compares 16 bytes inline.
        let found = match key {
            KeyRef::Uuid(words) => {
                let bytes = uuid_bytes(words);
                index.find(
                    hash,
                    |&low| matches!(&ring[slot(*base, low)].key, Key::Uuid(b) if *b == bytes),
                )
            }
            KeyRef::Text(text) => index.find(
                hash,
                |&low| matches!(&ring[slot(*base, low)].key, Key::Text(t) if **t == *text),
            ),
        };
        found.map(|&low| *base + slot(*base, low) as u64)
    }

    fn remove_index(&mut self, hash: u64, seq: u64) {
        let low = seq as u32;
        if let Ok(e) = self.index.find_entry(hash, |&s| s == low) {
            e.remove();
        }
        if !self.fingerprints.is_empty() {
            self.fingerprints.remove(&seq);
        }
    }

    fn entry(&mut self, seq: u64) -> &mut Entry {
        &mut self.ring[(seq - self.base) as usize]
    }

    /// Whether `key` is live at `now`; drops it when expired.
    fn seen(&mut self, hash: u64, key: KeyRef<'_>, now: u64) -> bool {
        self.seen_at(hash, key, |expires| now < expires)
    }

    /// [`seen`](Self::seen), asking the clock (`before`: whether it has not yet reached a
    /// deadline) only for an entry that may have expired: a key that is not there, or
    /// never expires, needs no time.
    fn seen_at(&mut self, hash: u64, key: KeyRef<'_>, before: impl FnOnce(u64) -> bool) -> bool {
        let Some(seq) = self.find(hash, key) else {
            return false;
        };
        let expires = self.entry(seq).expires;
        if expires == NEVER || before(expires) {
            return true;
        }
        self.entry(seq).expires = DEAD;
        self.remove_index(hash, seq);
        false
    }

    /// Remembers `key`, with its payload fingerprint if any; returns whether this call
    /// added it (a `SET NX`). The fingerprint is filed under the new entry's sequence
    /// number before eviction runs: eviction may move a long-lived front entry behind the
    /// new one, so the new entry is not always the last afterwards.
    #[allow(clippy::too_many_arguments)]
    fn remember(
        &mut self,
        hash: u64,
        key: KeyRef<'_>,
        expires: u64,
        now: u64,
        cap: Option<usize>,
        hasher: &RandomState,
        fingerprint: Option<&Fingerprint>,
    ) -> bool {
        if self.seen(hash, key, now) {
            return false;
        }
        if self.ring.len() >= RING_LIMIT {
            self.pop_front(hasher);
        }
        let seq = self.base + self.ring.len() as u64;
        self.ring.push_back(Entry {
            key: key.to_owned(),
            expires,
        });
        let Shard {
            ring, base, index, ..
        } = self;
        index.insert_unique(hash, seq as u32, |&low| {
            ring[slot(*base, low)].key.as_ref().hash_with(hasher)
        });
        if let Some(fp) = fingerprint {
            self.fingerprints.insert(seq, *fp);
        }
        self.evict(now, cap, hasher);
        true
    }

    /// Drops the oldest entry of the ring (and its index entry unless it was forgotten).
    fn pop_front(&mut self, hasher: &RandomState) {
        let Some(front) = self.ring.front() else {
            return;
        };
        if front.expires == DEAD {
            if !self.fingerprints.is_empty() {
                self.fingerprints.remove(&self.base);
            }
        } else {
            let hash = front.key.as_ref().hash_with(hasher);
            self.remove_index(hash, self.base);
        }
        self.ring.pop_front();
        self.base += 1;
    }

    /// Moves the live front entry to the back of the ring, under a new sequence number
    /// (its index entry and fingerprint follow it).
    fn rotate_front(&mut self, hasher: &RandomState) {
        let Some(entry) = self.ring.pop_front() else {
            return;
        };
        let old = self.base;
        self.base += 1;
        let hash = entry.key.as_ref().hash_with(hasher);
        let low = old as u32;
        if let Ok(e) = self.index.find_entry(hash, |&s| s == low) {
            e.remove();
        }
        let fingerprint = if self.fingerprints.is_empty() {
            None
        } else {
            self.fingerprints.remove(&old)
        };
        let seq = self.base + self.ring.len() as u64;
        self.ring.push_back(entry);
        if let Some(fp) = fingerprint {
            self.fingerprints.insert(seq, fp);
        }
        let Shard {
            ring, base, index, ..
        } = self;
        index.insert_unique(hash, seq as u32, |&low| {
            ring[slot(*base, low)].key.as_ref().hash_with(hasher)
        });
    }

    fn forget(&mut self, hash: u64, key: KeyRef<'_>) {
        if let Some(seq) = self.find(hash, key) {
            self.entry(seq).expires = DEAD;
            self.remove_index(hash, seq);
        }
    }

    /// Pops forgotten and expired entries off the front, and the oldest live ones while
    /// over capacity. A live front entry that outlives the newest one (a long TTL among
    /// short ones) would hold back every expired entry behind it: it is moved to the back
    /// instead (at most [`ROTATIONS`] a call), so each id leaves on its own TTL and memory
    /// follows the ids that are live, not the longest TTL.
    fn evict(&mut self, now: u64, cap: Option<usize>, hasher: &RandomState) {
        let mut rotations = 0;
        while let Some(front) = self.ring.front() {
            let dead = front.expires == DEAD;
            let expired = front.expires != NEVER && now >= front.expires;
            let over = cap.is_some_and(|c| self.index.len() > c);
            if dead || expired || over {
                self.pop_front(hasher);
                continue;
            }
            let outlives_newest = self
                .ring
                .back()
                .is_some_and(|back| outlives(front.expires, back.expires));
            if rotations < ROTATIONS && outlives_newest {
                rotations += 1;
                self.rotate_front(hasher);
                continue;
            }
            break;
        }
        if self.ring.capacity() > 64 && self.ring.len() < self.ring.capacity() / 4 {
            self.ring.shrink_to(self.ring.len() * 2);
        }
    }
}

impl InMemoryStore {
    /// A store with the default retention ([`DEFAULT_RETENTION`], 7 days) and no
    /// capacity: right for tests and short-lived processes. Use
    /// [`builder`](Self::builder) to bound a long-running consumer.
    pub fn new() -> Self {
        InMemoryStoreBuilder::default().build()
    }

    /// A builder for a bounded store.
    pub fn builder() -> InMemoryStoreBuilder {
        InMemoryStoreBuilder::default()
    }

    /// The default TTL of remembered ids (`None`: kept until evicted or forgotten).
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// A store whose ids expire after `ttl`.
    pub fn with_ttl(ttl: Duration) -> Self {
        Self::builder().ttl(ttl).build()
    }

    /// A store keeping at most `capacity` ids (oldest evicted first).
    pub fn with_capacity(capacity: usize) -> Self {
        Self::builder().capacity(capacity).build()
    }

    /// The number of ids currently remembered (expired ids not yet swept included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).index.len()).sum()
    }

    /// Whether no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every id.
    pub fn clear(&self) {
        for s in self.shards.iter() {
            *lock(s) = Shard::default();
        }
    }

    /// Remembers `id` and returns whether this call added it (`false`: it was already
    /// remembered) — the in-memory twin of Redis' `SET NX`.
    ///
    /// ```
    /// let store = babelqueue_core::InMemoryStore::new();
    /// assert!(store.claim("id-A"));
    /// assert!(!store.claim("id-A"));
    /// ```
    pub fn claim(&self, id: &str) -> bool {
        self.insert(id, None)
    }

    /// The clock this store measures TTLs and leases on: [`StoreClock::System`] or
    /// [`StoreClock::Tokio`] (what [`StoreClock::Auto`] chose when it was built).
    ///
    /// ```
    /// use babelqueue_core::{InMemoryStore, memory::StoreClock};
    /// assert_eq!(InMemoryStore::new().clock(), StoreClock::System);
    /// ```
    pub fn clock(&self) -> StoreClock {
        self.clock.kind()
    }

    fn now(&self) -> u64 {
        // +1 so that no deadline is ever NEVER (0).
        self.clock.now()
    }

    fn deadline(&self, now: u64, ttl: Option<Duration>) -> u64 {
        match ttl.or(self.ttl) {
            None => NEVER,
            Some(t) => now
                .saturating_add(u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
                .min(DEAD - 1),
        }
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        let i = (hash >> 40) as usize & (self.shards.len() - 1);
        lock(&self.shards[i])
    }

    fn insert(&self, id: &str, ttl: Option<Duration>) -> bool {
        let Some(key) = storable_key_to_remember(id) else {
            return false;
        };
        let hash = key.hash_with(&self.hasher);
        let now = self.now();
        let expires = self.deadline(now, ttl);
        self.shard(hash).remember(
            hash,
            key,
            expires,
            now,
            self.per_shard_capacity,
            &self.hasher,
            None,
        )
    }

    /// Whether `id` is remembered, or held by an unexpired lease (as on the shared
    /// stores, where an in-flight id is seen by every reader until it is released or
    /// its lease ends).
    fn is_seen(&self, id: &str) -> bool {
        let Some(key) = storable_key(id) else {
            return false;
        };
        let hash = key.hash_with(&self.hasher);
        // The clock is read under the shard's lock, and only when an entry was found:
        // a first delivery's `seen` reads no time, and a duplicate far from its deadline
        // only the coarse clock (`Clock::before`).
        let mut shard = self.shard(hash);
        let seen = shard.seen_at(hash, key, |expires| self.clock.before(expires))
            || (!shard.inflight.is_empty()
                && shard
                    .inflight
                    .get(id)
                    .is_some_and(|(_, d)| self.clock.before(*d)));
        drop(shard);
        if !seen {
            note_unseen(id, key);
        }
        seen
    }

    fn insert_fingerprint(&self, id: &str, fp: &Fingerprint, ttl: Option<Duration>) {
        let key = KeyRef::parse(id);
        let hash = key.hash_with(&self.hasher);
        let now = self.now();
        let expires = self.deadline(now, ttl);
        self.shard(hash).remember(
            hash,
            key,
            expires,
            now,
            self.per_shard_capacity,
            &self.hasher,
            Some(fp),
        );
    }

    fn find_fingerprint(&self, id: &str) -> Lookup {
        let key = KeyRef::parse(id);
        let hash = key.hash_with(&self.hasher);
        let now = self.now();
        let mut shard = self.shard(hash);
        if shard.seen(hash, key, now) {
            let fingerprint = shard
                .find(hash, key)
                .and_then(|seq| shard.fingerprints.get(&seq).copied());
            return Lookup::Seen { fingerprint };
        }
        if shard.inflight.get(id).is_some_and(|(_, d)| now < *d) {
            return Lookup::Seen { fingerprint: None };
        }
        Lookup::Unseen
    }

    fn remove(&self, id: &str) {
        let key = KeyRef::parse(id);
        let hash = key.hash_with(&self.hasher);
        let mut shard = self.shard(hash);
        shard.forget(hash, key);
        shard.inflight.remove(id);
    }

    fn try_claim(&self, id: &str, lease: Duration) -> Claim {
        if !storable(id) {
            // Never held (see `storable`): the holder runs, and cannot complete.
            return Claim::Acquired(
                LeaseToken::new().with_fence(self.fences.fetch_add(1, Ordering::Relaxed) + 1),
            );
        }
        let key = KeyRef::parse(id);
        let hash = key.hash_with(&self.hasher);
        let now = self.now();
        let mut shard = self.shard(hash);
        if shard.seen(hash, key, now) {
            return Claim::Completed;
        }
        if let Some((_, deadline)) = shard.inflight.get(id)
            && now < *deadline
        {
            return Claim::InFlight;
        }
        if shard.inflight.len() >= shard.sweep_inflight_at {
            shard.inflight.retain(|_, (_, d)| now < *d);
            shard.sweep_inflight_at = (shard.inflight.len() * 2).max(64);
        }
        let token = LeaseToken::new().with_fence(self.fences.fetch_add(1, Ordering::Relaxed) + 1);
        let deadline = self.deadline(now, Some(lease));
        shard.inflight.insert(id.into(), (token.clone(), deadline));
        Claim::Acquired(token)
    }

    /// Extends a held, unexpired claim of `token` to end `lease` from now.
    fn extend(&self, id: &str, token: &LeaseToken, lease: Duration) -> bool {
        if !storable(id) {
            return false;
        }
        let key = KeyRef::parse(id);
        let hash = key.hash_with(&self.hasher);
        let now = self.now();
        let until = self.deadline(now, Some(lease));
        let mut shard = self.shard(hash);
        match shard.inflight.get_mut(id) {
            Some((t, d)) if t == token && now < *d => {
                *d = until;
                true
            }
            _ => false,
        }
    }

    fn finish(&self, id: &str, token: &LeaseToken, complete: Option<Option<Duration>>) -> bool {
        let key = KeyRef::parse(id);
        let hash = key.hash_with(&self.hasher);
        let now = self.now();
        let mut shard = self.shard(hash);
        let holds = matches!(shard.inflight.get(id), Some((t, d)) if t == token && now < *d);
        if !holds {
            return false;
        }
        shard.inflight.remove(id);
        if let Some(ttl) = complete {
            let expires = self.deadline(now, ttl);
            shard.remember(
                hash,
                key,
                expires,
                now,
                self.per_shard_capacity,
                &self.hasher,
                None,
            );
        }
        true
    }
}

/// The in-memory store cannot fail, so it applies the id rule
/// ([`id_is_storable`](crate::key::id_is_storable)) by never holding an id that breaks it:
/// such an id is never seen and never remembered (the guard fails open for it, as for an
/// empty id), where the other stores refuse it with a typed error. The runtime dead-letters
/// such messages as poison before any store is asked.
fn storable(id: &str) -> bool {
    crate::key::id_is_storable(id).is_ok()
}

/// `id` as a key of the index if it is [`storable`]: a canonical UUID always is (36 hex
/// digits and hyphens), so only text ids are scanned for the rule.
fn storable_key(id: &str) -> Option<KeyRef<'_>> {
    match KeyRef::parse(id) {
        key @ KeyRef::Uuid(_) => Some(key),
        key @ KeyRef::Text(_) => storable(id).then_some(key),
    }
}

thread_local! {
    /// The last canonical UUID id a `seen` of this thread did not find, with its 16 bytes:
    /// the guard's `remember` of a first delivery follows with the same id, and finds it
    /// here instead of decoding it again. (A pure function's last result, keyed by its
    /// whole input: it cannot be stale.)
    static LAST_UNSEEN_UUID: Cell<Option<([u8; 36], [u64; 2])>> = const { Cell::new(None) };
}

/// Notes that `seen` did not find `key` (spelled `id`), for [`storable_key_to_remember`].
fn note_unseen(id: &str, key: KeyRef<'_>) {
    if let (KeyRef::Uuid(bytes), Ok(text)) = (key, <[u8; 36]>::try_from(id.as_bytes())) {
        LAST_UNSEEN_UUID.with(|c| c.set(Some((text, bytes))));
    }
}

/// [`storable_key`], for a `remember` (which usually follows a `seen` of the same id that
/// found nothing).
fn storable_key_to_remember(id: &str) -> Option<KeyRef<'_>> {
    if id.len() == 36
        && let Some((text, bytes)) = LAST_UNSEEN_UUID.with(Cell::get)
        && text.as_slice() == id.as_bytes()
    {
        return Some(KeyRef::Uuid(bytes));
    }
    storable_key(id)
}

/// A poisoned shard only means another thread panicked while holding it; the data is a
/// plain set and stays consistent, so keep using it.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store for InMemoryStore {
    type Error = Infallible;

    fn seen(&self, id: &str) -> Result<bool, Infallible> {
        Ok(self.is_seen(id))
    }

    fn remember(&self, id: &str) -> Result<(), Infallible> {
        self.insert(id, None);
        Ok(())
    }

    fn remember_for(&self, id: &str, ttl: Option<Duration>) -> Result<(), Infallible> {
        self.insert(id, ttl);
        Ok(())
    }

    fn forget(&self, id: &str) -> Result<(), Infallible> {
        self.remove(id);
        Ok(())
    }
}

impl AsyncStore for InMemoryStore {
    type Error = Infallible;

    fn seen(&self, id: &str) -> impl Future<Output = Result<bool, Infallible>> + Send {
        std::future::ready(Ok(self.is_seen(id)))
    }

    fn remember(&self, id: &str) -> impl Future<Output = Result<(), Infallible>> + Send {
        self.insert(id, None);
        std::future::ready(Ok(()))
    }

    fn remember_for(
        &self,
        id: &str,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<(), Infallible>> + Send {
        self.insert(id, ttl);
        std::future::ready(Ok(()))
    }

    fn forget(&self, id: &str) -> impl Future<Output = Result<(), Infallible>> + Send {
        self.remove(id);
        std::future::ready(Ok(()))
    }
}

impl FingerprintStore for InMemoryStore {
    fn lookup(&self, id: &str) -> Result<Lookup, Infallible> {
        Ok(self.find_fingerprint(id))
    }

    fn remember_fingerprint(
        &self,
        id: &str,
        fingerprint: &Fingerprint,
        ttl: Option<Duration>,
    ) -> Result<(), Infallible> {
        self.insert_fingerprint(id, fingerprint, ttl);
        Ok(())
    }
}

impl AsyncFingerprintStore for InMemoryStore {
    fn lookup(&self, id: &str) -> impl Future<Output = Result<Lookup, Infallible>> + Send {
        std::future::ready(Ok(self.find_fingerprint(id)))
    }

    fn remember_fingerprint(
        &self,
        id: &str,
        fingerprint: &Fingerprint,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<(), Infallible>> + Send {
        self.insert_fingerprint(id, fingerprint, ttl);
        std::future::ready(Ok(()))
    }
}

impl LeaseStore for InMemoryStore {
    fn claim(&self, id: &str, lease: Duration) -> Result<Claim, Infallible> {
        Ok(self.try_claim(id, lease))
    }

    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Result<bool, Infallible> {
        Ok(self.finish(id, token, Some(ttl)))
    }

    fn release(&self, id: &str, token: &LeaseToken) -> Result<bool, Infallible> {
        Ok(self.finish(id, token, None))
    }

    fn renew(&self, id: &str, token: &LeaseToken, lease: Duration) -> Result<bool, Infallible> {
        Ok(self.extend(id, token, lease))
    }
}

impl AsyncLeaseStore for InMemoryStore {
    fn claim(
        &self,
        id: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, Infallible>> + Send {
        std::future::ready(Ok(self.try_claim(id, lease)))
    }

    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<bool, Infallible>> + Send {
        std::future::ready(Ok(self.finish(id, token, Some(ttl))))
    }

    fn release(
        &self,
        id: &str,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool, Infallible>> + Send {
        std::future::ready(Ok(self.finish(id, token, None)))
    }

    fn renew(
        &self,
        id: &str,
        token: &LeaseToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, Infallible>> + Send {
        std::future::ready(Ok(self.extend(id, token, lease)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U1: &str = "f1e2d3c4-b5a6-4789-90ab-cdef01234567";

    /// `canonical_uuid`, as the 16 bytes its words stand for; checked against the
    /// portable decoder on every call, so both are tested on x86-64.
    fn canonical_uuid_bytes(id: &[u8]) -> Option<[u8; 16]> {
        let fast = canonical_uuid(id);
        assert_eq!(
            fast,
            canonical_uuid_swar(id),
            "{:?}",
            String::from_utf8_lossy(id)
        );
        fast.map(uuid_bytes)
    }

    #[test]
    fn uuid_words_and_bytes_are_inverses() {
        for _ in 0..100 {
            let u = uuid::Uuid::new_v4();
            assert_eq!(uuid_bytes(uuid_words(u.as_bytes())), *u.as_bytes());
        }
    }

    #[test]
    fn canonical_uuid_parses_exactly_the_canonical_form() {
        for _ in 0..200 {
            let u = uuid::Uuid::new_v4();
            let id = u.to_string();
            assert_eq!(canonical_uuid_bytes(id.as_bytes()), Some(*u.as_bytes()));
            assert_eq!(canonical_uuid_bytes(id.to_uppercase().as_bytes()), None);
            assert_eq!(
                canonical_uuid_bytes(u.simple().to_string().as_bytes()),
                None
            );
            assert_eq!(
                canonical_uuid_bytes(u.braced().to_string().as_bytes()),
                None
            );
        }
        assert_eq!(
            canonical_uuid_bytes(b"00000000-0000-0000-0000-000000000000"),
            Some([0; 16])
        );
        for bad in [
            "f1e2d3c4-b5a6-4789-90ab-cdef0123456g",
            "f1e2d3c4-b5a6-4789-90ab-cdef0123456",
            "f1e2d3c4xb5a6-4789-90ab-cdef01234567",
            "f1e2d3c4-b5a6-4789-90ab-cdef01234567 ",
            "f1e2d3c4-b5a6-4789-90ab-cdef0123456é",
            "-1e2d3c4-b5a6-4789-90ab-cdef01234567",
        ] {
            assert_eq!(canonical_uuid_bytes(bad.as_bytes()), None, "{bad}");
        }
    }

    /// The digit-at-a-time parser `canonical_uuid` replaced, as the reference.
    fn canonical_uuid_reference(id: &[u8]) -> Option<[u8; 16]> {
        fn nibble(c: u8) -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            }
        }
        if id.len() != 36 || [8, 13, 18, 23].iter().any(|&i| id[i] != b'-') {
            return None;
        }
        let digits: Vec<u8> = id.iter().copied().filter(|&c| c != b'-').collect();
        if digits.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = (nibble(digits[2 * i])? << 4) | nibble(digits[2 * i + 1])?;
        }
        Some(out)
    }

    #[test]
    fn canonical_uuid_agrees_with_the_reference_on_every_one_byte_change() {
        // Every byte value at every position of a few UUIDs (including the hyphens'
        // positions): the word-at-a-time checks must reject and decode exactly as the
        // digit-at-a-time reference does.
        let ids = [
            "00000000-0000-0000-0000-000000000000".to_owned(),
            "ffffffff-ffff-ffff-ffff-ffffffffffff".to_owned(),
            "0123abcd-4567-89ef-a0b1-c2d3e4f56789".to_owned(),
            uuid::Uuid::new_v4().to_string(),
        ];
        for id in &ids {
            assert_eq!(
                canonical_uuid_bytes(id.as_bytes()),
                canonical_uuid_reference(id.as_bytes())
            );
            assert!(canonical_uuid_bytes(id.as_bytes()).is_some(), "{id}");
            for at in 0..36 {
                for b in 0..=255u8 {
                    let mut bytes = id.clone().into_bytes();
                    bytes[at] = b;
                    assert_eq!(
                        canonical_uuid_bytes(&bytes),
                        canonical_uuid_reference(&bytes),
                        "{id} with byte {b:#04x} at {at}"
                    );
                }
            }
        }
        for len in [0, 35, 37] {
            assert_eq!(canonical_uuid_bytes(&vec![b'0'; len]), None);
        }
    }

    #[test]
    fn remember_after_an_unseen_uuid_stores_that_uuid() {
        // `seen` notes the last unseen UUID of the thread for the `remember` after it; a
        // `remember` of another id (or the same id in another case) must not take it.
        let s = InMemoryStore::new();
        let other = "0123abcd-4567-89ef-a0b1-c2d3e4f56789";
        assert!(!s.is_seen(U1));
        assert!(s.insert(other, None));
        assert!(s.is_seen(other) && !s.is_seen(U1));
        assert!(!s.is_seen(U1));
        assert!(s.insert(&U1.to_uppercase(), None));
        assert!(!s.is_seen(U1));
        assert!(s.insert(U1, None));
        assert!(s.is_seen(U1) && s.is_seen(&U1.to_uppercase()) && s.is_seen(other));
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn uuid_and_text_ids_are_distinct_spellings() {
        let s = InMemoryStore::new();
        s.insert(U1, None);
        assert!(s.is_seen(U1));
        assert!(!s.is_seen(&U1.to_uppercase()));
        s.insert("plain id", None);
        assert!(s.is_seen("plain id"));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn sequence_numbers_wrap_past_32_bits_and_the_ring_stays_under_its_limit() {
        // One shard whose sequence numbers cross 2³²: the index's 32-bit numbers must
        // still name the right slots, and the ring is cut at RING_LIMIT (128 under test).
        let s = InMemoryStore::builder().shards(1).build();
        lock(&s.shards[0]).base = u64::from(u32::MAX) - 10;
        for i in 0..40 {
            assert!(s.insert(&format!("id-{i}"), None));
        }
        s.remove("id-3");
        assert!(!s.is_seen("id-3"));
        assert!(
            (0..40)
                .filter(|&i| i != 3)
                .all(|i| s.is_seen(&format!("id-{i}")))
        );
        for i in 40..200 {
            assert!(s.insert(&format!("id-{i}"), None));
        }
        let ring = lock(&s.shards[0]).ring.len();
        assert!(ring <= RING_LIMIT, "ring {ring} over its limit");
        assert!(
            !s.is_seen("id-71"),
            "the oldest entries leave at the ring limit"
        );
        assert!((72..200).all(|i| s.is_seen(&format!("id-{i}"))));
        assert_eq!(s.len(), 128);
        assert!(!s.insert("id-199", None), "a live id is not added twice");
    }

    #[test]
    fn capacity_evicts_oldest_first() {
        let s = InMemoryStore::with_capacity(3);
        for id in ["a", "b", "c", "d"] {
            s.insert(id, None);
        }
        assert!(!s.is_seen("a"));
        assert!(s.is_seen("b") && s.is_seen("c") && s.is_seen("d"));
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn forget_then_remember_keeps_fifo_order() {
        let s = InMemoryStore::with_capacity(2);
        s.insert("a", None);
        s.remove("a");
        s.insert("b", None);
        s.insert("a", None);
        s.insert("c", None);
        // "b" is the oldest live id; the stale ring slot of the first "a" must not
        // evict the second "a".
        assert!(!s.is_seen("b"));
        assert!(s.is_seen("a") && s.is_seen("c"));
    }

    #[tokio::test(start_paused = true)]
    async fn ttl_expires_and_frees_memory() {
        // The store reads tokio's clock: paused time makes the expiry exact. One shard, so
        // the insert below sweeps the shard that holds the expired ids (with 32 shards the
        // shard of "fresh" may hold none of them).
        let s = InMemoryStore::builder()
            .ttl(Duration::from_millis(500))
            .shards(1)
            .build();
        for i in 0..100 {
            s.insert(&format!("id-{i}"), None);
        }
        assert!(s.is_seen("id-0"));
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(!s.is_seen("id-0"));
        s.insert("fresh", None);
        let ring: usize = s.shards.iter().map(|sh| lock(sh).ring.len()).sum();
        assert!(ring < 100, "expired entries were not swept: {ring}");
    }

    #[tokio::test(start_paused = true)]
    async fn each_id_expires_on_its_own_ttl_behind_long_lived_ones() {
        // 64 long-lived ids must not keep the expired ones behind them alive; memory must
        // follow the live ids, not the longest TTL. One shard, ring limit 128 in tests: the
        // count stays far below the ids inserted.
        let s = InMemoryStore::builder()
            .ttl(Duration::from_millis(50))
            .shards(1)
            .build();
        let mut max_ring = 0;
        for i in 0..20_000 {
            if i % 1000 == 0 {
                s.insert(&format!("long-{i}"), Some(Duration::from_secs(3600)));
            }
            s.insert(&format!("short-{i}"), None);
            if i % 10 == 0 {
                tokio::time::advance(Duration::from_millis(10)).await;
            }
            max_ring = max_ring.max(lock(&s.shards[0]).ring.len());
        }
        let long = (0..20_000).step_by(1000).count();
        // About 50 ms of short ids (50 of them) plus the long ones are live at a time.
        assert!(
            max_ring <= 50 + long + 16,
            "expired ids were kept behind long-lived ones: ring {max_ring}"
        );
        for i in (0..20_000).step_by(1000) {
            assert!(
                s.is_seen(&format!("long-{i}")),
                "a long-lived id stays: {i}"
            );
        }
        assert!(!s.is_seen("short-0"));
        assert!(s.is_seen("short-19999"));
    }

    #[tokio::test(start_paused = true)]
    async fn per_call_ttl_overrides_default() {
        let s = InMemoryStore::new();
        s.insert("short", Some(Duration::from_millis(10)));
        s.insert("long", None);
        tokio::time::advance(Duration::from_millis(25)).await;
        assert!(!s.is_seen("short"));
        assert!(s.is_seen("long"));
    }

    #[test]
    fn held_ids_are_seen_and_abandoned_claims_are_swept() {
        let s = InMemoryStore::builder().shards(1).build();
        let Claim::Acquired(t) = s.try_claim("held", Duration::from_secs(30)) else {
            panic!("first claim must win")
        };
        assert!(s.is_seen("held"), "an in-flight id is seen");
        assert!(s.finish("held", &t, None));
        assert!(!s.is_seen("held"), "a released id is not seen");
        // 1000 holders that never finish, in batches whose leases lapse in between.
        for i in 0..1000 {
            if i % 50 == 0 {
                std::thread::sleep(Duration::from_millis(3));
            }
            assert!(matches!(
                s.try_claim(&format!("dead-{i}"), Duration::from_millis(1)),
                Claim::Acquired(_)
            ));
        }
        assert!(!s.is_seen("dead-0"), "an expired claim is not seen");
        let left = lock(&s.shards[0]).inflight.len();
        assert!(left <= 128, "abandoned claims were not swept: {left} left");
    }

    /// A fingerprinted id with a TTL remembered behind a longer-lived one in its shard:
    /// eviction moves the longer-lived front entry behind the new one, and the new
    /// fingerprint must stay with its own id, not be filed under the moved entry (else a
    /// replay with another payload would run again when the two ids share a shard).
    #[test]
    fn a_fingerprint_stays_with_its_id_when_eviction_rotates_the_front() {
        let s = InMemoryStore::builder().shards(1).build();
        let fp = Fingerprint::of_bytes(b"first payload");
        s.insert_fingerprint("pay_fp", &Fingerprint::of_bytes(b"other"), None);
        s.insert_fingerprint(U1, &fp, Some(Duration::from_secs(3600)));
        assert_eq!(
            s.find_fingerprint(U1),
            Lookup::Seen {
                fingerprint: Some(fp)
            }
        );
        assert_eq!(
            s.find_fingerprint("pay_fp"),
            Lookup::Seen {
                fingerprint: Some(Fingerprint::of_bytes(b"other"))
            }
        );
    }

    #[test]
    fn fingerprints_follow_their_entries() {
        let s = InMemoryStore::builder().capacity(2).build();
        let (a, b) = (Fingerprint::of_bytes(b"a"), Fingerprint::of_bytes(b"b"));
        s.insert_fingerprint("x", &a, None);
        s.insert("plain", None);
        assert_eq!(
            s.find_fingerprint("x"),
            Lookup::Seen {
                fingerprint: Some(a)
            }
        );
        assert_eq!(
            s.find_fingerprint("plain"),
            Lookup::Seen { fingerprint: None }
        );
        assert_eq!(s.find_fingerprint("nope"), Lookup::Unseen);
        // A live id is not rewritten (SET NX).
        s.insert_fingerprint("x", &b, None);
        assert_eq!(
            s.find_fingerprint("x"),
            Lookup::Seen {
                fingerprint: Some(a)
            }
        );
        // Forgotten, then remembered without one: no stale fingerprint.
        s.remove("x");
        s.insert("x", None);
        assert_eq!(s.find_fingerprint("x"), Lookup::Seen { fingerprint: None });
        // Evicted by capacity: its fingerprint goes with it.
        s.insert_fingerprint("y", &b, None);
        s.insert("z", None);
        s.insert("w", None);
        let left: usize = s.shards.iter().map(|sh| lock(sh).fingerprints.len()).sum();
        assert_eq!(left, 0, "fingerprints of evicted entries must be dropped");
    }

    #[test]
    fn lease_claims() {
        let s = InMemoryStore::new();
        let Claim::Acquired(t) = s.try_claim("x", Duration::from_secs(30)) else {
            panic!("first claim must win")
        };
        assert_eq!(s.try_claim("x", Duration::from_secs(30)), Claim::InFlight);
        assert!(
            !s.finish("x", &LeaseToken::new(), Some(None)),
            "stranger completed"
        );
        assert!(s.finish("x", &t, Some(None)));
        assert_eq!(s.try_claim("x", Duration::from_secs(30)), Claim::Completed);
        let Claim::Acquired(t2) = s.try_claim("y", Duration::from_millis(10)) else {
            panic!()
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(matches!(
            s.try_claim("y", Duration::from_secs(1)),
            Claim::Acquired(_)
        ));
        assert!(!s.finish("y", &t2, None), "expired holder released");
    }
}
