//! The Redis keys of a queue, in one place.
//!
//! Producers only ever see the bare list `<queue>`. Everything this SDK's consumers keep
//! beside it is hash-tagged `{<queue>}`: a key with a `{…}` tag hashes only the tag's
//! content, so on a Redis Cluster `payments` and `{payments}:delayed` live in the same slot
//! and one Lua script may touch both. (Hence a queue name used on a Cluster must not itself
//! contain `{` or `}`.)
//!
//! | key | type | written by | deleted by |
//! | --- | --- | --- | --- |
//! | `<queue>` | LIST | producers (`RPUSH`), requeue, promotion, recovery | consumers (`BLMOVE`) |
//! | `{<queue>}:processing:<consumer-id>` | LIST | its consumer's reserve | its consumer's ack/requeue; recovery when its heartbeat expired |
//! | `{<queue>}:delayed` | ZSET (score: due Unix ms, member: 32 hex token + element) | requeue with a delay | promotion (every consumer) |
//! | `{<queue>}:consumers` | ZSET (member: consumer id, score: heartbeat expiry Unix ms) | heartbeat | `leave` (own list empty) or recovery of that consumer |
//! | `{<queue>}:heartbeat:<consumer-id>` | STRING with a TTL (`PX`) | heartbeat | expiry, `leave` |
//! | `{<queue>}:recoveries` | HASH (field: SHA-1 hex of the element, value: times recovered) | recovery | ack / requeue of that element; the whole hash expires 24 h after the last recovery |
//! | `<queue>:processing` | LIST | the other SDKs' consumers | their acks; [`requeue_processing`](babelqueue_runtime::Transport::requeue_processing) |

/// The processing list the other BabelQueue SDKs share: `<queue>:processing`. This SDK's
/// consumers do not reserve into it (each has its own, [`consumer_processing_list`]); only
/// the explicit [`requeue_processing`](babelqueue_runtime::Transport::requeue_processing)
/// moves its messages back to the queue.
///
/// ```
/// assert_eq!(babelqueue_redis::processing_list("payments"), "payments:processing");
/// ```
pub fn processing_list(queue: &str) -> String {
    format!("{queue}:processing")
}

/// The processing list of one consumer: `{<queue>}:processing:<consumer-id>`.
///
/// ```
/// assert_eq!(
///     babelqueue_redis::consumer_processing_list("payments", "c1"),
///     "{payments}:processing:c1"
/// );
/// ```
pub fn consumer_processing_list(queue: &str, consumer: &str) -> String {
    format!("{{{queue}}}:processing:{consumer}")
}

/// The delayed set of a queue: `{<queue>}:delayed` (ZSET scored by due time, Unix ms).
///
/// ```
/// assert_eq!(babelqueue_redis::delayed_set("payments"), "{payments}:delayed");
/// ```
pub fn delayed_set(queue: &str) -> String {
    format!("{{{queue}}}:delayed")
}

/// The consumer registry of a queue: `{<queue>}:consumers` (ZSET: consumer id scored by
/// the Unix ms its heartbeat expires).
///
/// ```
/// assert_eq!(babelqueue_redis::consumers_registry("payments"), "{payments}:consumers");
/// ```
pub fn consumers_registry(queue: &str) -> String {
    format!("{{{queue}}}:consumers")
}

/// The heartbeat key of one consumer: `{<queue>}:heartbeat:<consumer-id>` (a string with a
/// TTL; the consumer is alive while it exists).
///
/// ```
/// assert_eq!(
///     babelqueue_redis::heartbeat_key("payments", "c1"),
///     "{payments}:heartbeat:c1"
/// );
/// ```
pub fn heartbeat_key(queue: &str, consumer: &str) -> String {
    format!("{{{queue}}}:heartbeat:{consumer}")
}

/// The recovery counters of a queue: `{<queue>}:recoveries` (HASH: SHA-1 hex of an element
/// → how many times it was recovered from consumers that died holding it).
///
/// ```
/// assert_eq!(babelqueue_redis::recoveries_hash("payments"), "{payments}:recoveries");
/// ```
pub fn recoveries_hash(queue: &str) -> String {
    format!("{{{queue}}}:recoveries")
}

/// Every key of `queue` this SDK knows by name (not the per-consumer lists and heartbeats,
/// whose names depend on the consumer ids): the queue, the shared legacy processing list,
/// the delayed set, the registry and the recovery counters. Useful to clean up a test queue.
pub fn queue_keys(queue: &str) -> Vec<String> {
    vec![
        queue.to_owned(),
        processing_list(queue),
        delayed_set(queue),
        consumers_registry(queue),
        recoveries_hash(queue),
    ]
}

/// Redis Cluster's hash slot of `key` (CRC16/XMODEM of the hash tag, or of the whole key,
/// modulo 16384).
///
/// ```
/// use babelqueue_redis::{hash_slot, delayed_set, consumer_processing_list};
/// let slot = hash_slot("payments");
/// assert_eq!(hash_slot(&delayed_set("payments")), slot);
/// assert_eq!(hash_slot(&consumer_processing_list("payments", "c1")), slot);
/// assert_ne!(hash_slot("payments.dlq"), slot);
/// ```
pub fn hash_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16_xmodem(tagged.unwrap_or(bytes)) % 16384
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_slots_match_redis() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(hash_slot("foo"), 12182);
        assert_eq!(hash_slot("{user1000}.following"), hash_slot("user1000"));
        assert_eq!(hash_slot("123456789"), 12739);
        // An empty tag `{}` hashes the whole key.
        assert_eq!(hash_slot("{}x"), crc16_xmodem(b"{}x") % 16384);
    }

    #[test]
    fn every_consumer_key_shares_the_queue_slot() {
        for q in ["payments", "bq-test:a:1", "x"] {
            let s = hash_slot(q);
            for k in [
                consumer_processing_list(q, "id"),
                delayed_set(q),
                consumers_registry(q),
                heartbeat_key(q, "id"),
                recoveries_hash(q),
            ] {
                assert_eq!(hash_slot(&k), s, "{k}");
            }
        }
    }
}
