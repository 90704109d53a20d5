//! Retention: how long a store keeps the ids this library writes.
//!
//! Nothing this library writes is kept forever by default. Every store remembers an id
//! for [`DEFAULT_RETENTION`] (7 days) unless told otherwise:
//!
//! | store | default | override | keep forever | how expired ids leave |
//! | --- | --- | --- | --- | --- |
//! | `InMemoryStore` | 7 days | `builder().ttl(d)` | `builder().keep_forever()` | evicted from the front of its ring as it goes (and by `capacity`) |
//! | `RedisStore` | 7 days | `builder(url).ttl(d)` / `with_ttl(Some(d))` | `keep_forever()` / `with_ttl(None)` | Redis expires the key (`PX`) |
//! | `PostgresStore` | 7 days | `builder(url).ttl(d)` / `with_ttl(Some(d))` | `keep_forever()` / `with_ttl(None)` | ignored once expired; deleted by `purge_expired()` or the background `spawn_purger(interval)` |
//! | `SqliteStore` | 7 days | `builder(path).ttl(d)` | `keep_forever()` | ignored once expired; deleted by `purge_expired()` or `spawn_purger(interval)` |
//!
//! `#[idempotent(ttl = "24h")]` (or the `ttl` argument of the guard functions) overrides the
//! store's default for one handler.
//!
//! **Guarantees**: an id is seen for at least its retention (a redelivery within it is
//! skipped); after it, it is not seen (the delivery runs again). **Does not**: rows and
//! keys written by another SDK keep that SDK's expiry (often none); the SQL purgers only
//! delete rows whose `expires_at` has passed, never a row without one.
//!
//! Pick a retention longer than the longest time a message can be redelivered (broker
//! retention, dead-letter replays): an id forgotten before its last redelivery runs again.

use std::time::Duration;

/// How long every store of this library keeps an id it writes, unless configured
/// otherwise: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
