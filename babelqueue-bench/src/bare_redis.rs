//! `--broker redis --bare`: the commands the runtime sends for each delivery in seen-set
//! mode, sent by a loop with no runtime, no envelope decoding, no guard and no store
//! client: the server's ceiling for the consumer's own command mix, and the floor of a
//! client's cost on the same connections.
//!
//! Each worker holds the places the runtime would give it (`App::batch`'s default, or
//! `--batch`) and loops over two round trips, as a runtime batch worker does:
//!
//! 1. on the transport's connection, one pipeline: the `SET <key> 1 NX PX <ttl>` of every
//!    first delivery of its last batch, their acks and the refill of its places: up to 8
//!    places one `LREM` per ack and one `LMOVE` per place, above that the transport's
//!    batch-ack and batch-reserve scripts;
//! 2. on the store's connection, one pipeline of an `EXISTS` per delivery reserved.
//!
//! The id is `meta.id`, found in the compact encoding by its place (`"meta":{"id":"`)
//! rather than decoded. Two copies of one payment held at once by two workers are told
//! apart by a process-wide set, as the runtime's per-key turn makes the second wait and
//! skip. A worker stops when a refill finds the queue empty (the pipeline that found it
//! also carried its last acks).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use babelqueue::BoxError;
use babelqueue::redis::batch_scripts::{ACK_MANY_SOURCE, RESERVE_MANY_SOURCE};
use babelqueue::redis::redis::{self, Script, Value, aio::MultiplexedConnection};
use babelqueue::redis::{consumer_processing_list, recoveries_hash};

/// The runtime's batch size on Redis with pipelining when none is set (`BATCH_HINT` of the
/// transport): at most this, and at most an eighth of `concurrency`.
const RUNTIME_BATCH_HINT: usize = 16;

/// Up to this many places the transport refills with one `LMOVE` per place and acks with
/// one `LREM` each (no recovery counters); above it, with its batch scripts.
const PLAIN_MAX: usize = 8;

/// What a bare drain did.
#[derive(Debug)]
pub(crate) struct Drained {
    pub(crate) secs: f64,
    /// First deliveries (their `SET … NX` sent with the ack).
    pub(crate) effects: u64,
    /// Deliveries whose id was seen (`EXISTS` answered 1, or another worker had it).
    pub(crate) skips: u64,
}

/// The places of each worker, as the runtime shares `concurrency` among batch workers
/// (`--batch k`, or by default `min(16, concurrency / 8)`; `k = 1`: one-message workers).
pub(crate) fn places(concurrency: usize, batch: Option<usize>) -> Vec<usize> {
    let c = concurrency.max(1);
    let k = batch.map_or_else(
        || RUNTIME_BATCH_HINT.clamp(1, (c / 8).max(1)),
        |k| k.clamp(1, c),
    );
    let workers = c.div_ceil(k);
    (0..workers)
        .map(|i| c / workers + usize::from(i < c % workers))
        .collect()
}

/// `meta.id` of a compact envelope, as the bytes of the dedupe key `prefix` + id.
fn key_of(prefix: &str, element: &[u8]) -> Result<Vec<u8>, BoxError> {
    const AT: &[u8] = br#""meta":{"id":""#;
    let start = element
        .windows(AT.len())
        .position(|w| w == AT)
        .map(|i| i + AT.len())
        .ok_or("a body without `\"meta\":{\"id\":\"` (not the bench's compact encoding)")?;
    let len = element[start..]
        .iter()
        .position(|&b| b == b'"')
        .ok_or("a body whose meta.id does not end")?;
    let mut key = Vec::with_capacity(prefix.len() + len);
    key.extend_from_slice(prefix.as_bytes());
    key.extend_from_slice(&element[start..start + len]);
    Ok(key)
}

/// The elements a refill moved: a batch-reserve script's array, or `LMOVE`'s one (or nil).
fn moved(reply: Value) -> Result<Vec<Vec<u8>>, BoxError> {
    match reply {
        Value::Nil => Ok(Vec::new()),
        Value::BulkString(e) => Ok(vec![e]),
        Value::Array(elements) => elements
            .into_iter()
            .map(|e| match e {
                Value::BulkString(e) => Ok(e),
                other => Err(format!("unexpected element in a refill: {other:?}").into()),
            })
            .collect(),
        other => Err(format!("unexpected reply to a refill: {other:?}").into()),
    }
}

/// What the workers share.
struct Shared {
    queue: String,
    own: String,
    recoveries: String,
    prefix: String,
    ttl_ms: u64,
    ack_many: String,
    reserve_many: String,
    /// Ids a worker ran here: a second copy held at the same time is a skip.
    ran: Mutex<HashSet<Vec<u8>>>,
}

async fn worker(
    shared: Arc<Shared>,
    places: usize,
    mut transport: MultiplexedConnection,
    mut store: MultiplexedConnection,
) -> Result<(u64, u64), BoxError> {
    let (mut effects, mut skips) = (0u64, 0u64);
    // As the transport: plain `LREM`s and `LMOVE`s up to `PLAIN_MAX` places, the batch
    // scripts above.
    let plain = places <= PLAIN_MAX;
    // The last batch: each element and, for a first delivery, the key to remember.
    let mut settled: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::with_capacity(places);
    loop {
        let mut pipe = redis::pipe();
        for key in settled.iter().filter_map(|(_, key)| key.as_ref()) {
            pipe.cmd("SET")
                .arg(key)
                .arg(1)
                .arg("NX")
                .arg("PX")
                .arg(shared.ttl_ms)
                .ignore();
        }
        match &settled[..] {
            [] => {}
            few if plain || few.len() == 1 => {
                for (element, _) in few {
                    pipe.cmd("LREM")
                        .arg(&shared.own)
                        .arg(1)
                        .arg(element)
                        .ignore();
                }
            }
            many => {
                let cmd = pipe
                    .cmd("EVALSHA")
                    .arg(&shared.ack_many)
                    .arg(2)
                    .arg(&shared.own)
                    .arg(&shared.recoveries);
                for (element, _) in many {
                    cmd.arg(element);
                }
                cmd.ignore();
            }
        }
        if plain {
            for _ in 0..places {
                pipe.cmd("LMOVE")
                    .arg(&shared.queue)
                    .arg(&shared.own)
                    .arg("LEFT")
                    .arg("RIGHT");
            }
        } else {
            pipe.cmd("EVALSHA")
                .arg(&shared.reserve_many)
                .arg(2)
                .arg(&shared.queue)
                .arg(&shared.own)
                .arg(places);
        }
        let refills: Vec<Value> = pipe.query_async(&mut transport).await?;
        settled.clear();
        let mut got = Vec::with_capacity(places);
        for refill in refills {
            got.extend(moved(refill)?);
        }
        if got.is_empty() {
            return Ok((effects, skips));
        }
        let keys = got
            .iter()
            .map(|e| key_of(&shared.prefix, e))
            .collect::<Result<Vec<_>, _>>()?;
        let mut lookups = redis::pipe();
        for key in &keys {
            lookups.cmd("EXISTS").arg(key);
        }
        let seen: Vec<i64> = lookups.query_async(&mut store).await?;
        if seen.len() != keys.len() {
            return Err(format!("{} EXISTS answered {} replies", keys.len(), seen.len()).into());
        }
        for ((element, key), seen) in got.into_iter().zip(keys).zip(seen) {
            let first = seen == 0
                && shared
                    .ran
                    .lock()
                    .map_err(|_| "a worker panicked")?
                    .insert(key.clone());
            if first {
                effects += 1;
                settled.push((element, Some(key)));
            } else {
                skips += 1;
                settled.push((element, None));
            }
        }
    }
}

/// Drains `queue` on the server of `url` with the bare loop (`concurrency` places, shared
/// as the runtime would with `batch`), remembering ids under `prefix` for `ttl_ms`.
/// Connections are opened and the scripts loaded before the clock starts.
pub(crate) async fn drain(
    url: &str,
    queue: &str,
    concurrency: usize,
    batch: Option<usize>,
    prefix: String,
    ttl_ms: u64,
) -> Result<Drained, BoxError> {
    let client = redis::Client::open(url)?;
    // One connection for the transport's commands and one for the store's, as the `App`
    // with a Redis store has.
    let transport = client.get_multiplexed_async_connection().await?;
    let store = client.get_multiplexed_async_connection().await?;
    let mut admin = transport.clone();
    for source in [ACK_MANY_SOURCE, RESERVE_MANY_SOURCE] {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(source)
            .query_async(&mut admin)
            .await?;
    }
    let consumer = format!("bare-{}", uuid::Uuid::new_v4().simple());
    let shared = Arc::new(Shared {
        queue: queue.to_owned(),
        own: consumer_processing_list(queue, &consumer),
        recoveries: recoveries_hash(queue),
        prefix,
        ttl_ms,
        ack_many: Script::new(ACK_MANY_SOURCE).get_hash().to_owned(),
        reserve_many: Script::new(RESERVE_MANY_SOURCE).get_hash().to_owned(),
        ran: Mutex::new(HashSet::new()),
    });
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for n in places(concurrency, batch) {
        workers.spawn(worker(
            Arc::clone(&shared),
            n,
            transport.clone(),
            store.clone(),
        ));
    }
    let (mut effects, mut skips) = (0, 0);
    while let Some(done) = workers.join_next().await {
        let (e, s) = done??;
        effects += e;
        skips += s;
    }
    Ok(Drained {
        secs: start.elapsed().as_secs_f64(),
        effects,
        skips,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_shared_as_the_runtime_shares_them() {
        assert_eq!(places(1, None), vec![1]);
        assert_eq!(places(8, None), vec![1; 8]);
        assert_eq!(places(32, None), vec![4; 8]);
        assert_eq!(places(32, Some(16)), vec![16, 16]);
        assert_eq!(places(10, Some(4)), vec![4, 3, 3]);
        assert_eq!(places(8, Some(1)), vec![1; 8]);
    }

    #[test]
    fn the_key_is_the_prefix_and_meta_id() {
        let body = babelqueue::Envelope::new(
            "urn:babel:payments:charge",
            serde_json::json!({"payment_id": "pay_1"}),
        )
        .unwrap()
        .encode();
        let env = babelqueue::Envelope::decode(&body).unwrap();
        let key = key_of("bq:idemp:x:", &body).unwrap();
        assert_eq!(key, format!("bq:idemp:x:{}", env.meta.id).into_bytes());
        assert!(key_of("p:", br#"{"job":"x"}"#).is_err());
        assert!(key_of("p:", br#"{"meta":{"id":"unterminated"#).is_err());
    }
}
