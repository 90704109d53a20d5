//! Pipelining on the Redis transport: a worker's ack goes with its next reserve, and the
//! guard's `remember` for a Redis store on the same server goes just before that ack, in
//! the same round trip. Over a real Redis; ignored without one (CI runs them with
//! `--include-ignored`). Every test uses its own queue and key prefix.

use crate::fleet_support;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use babelqueue::pipelined::PipelinedWrite;
use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::redis::{RedisStore, RedisTransport, keys::queue_keys};
use babelqueue::runtime::{App, Permanent, Transport};
use babelqueue::{AsyncStore, Envelope, Guard};
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";

fn redis_url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A unique queue name and key prefix, deleted at the end.
struct Names {
    queue: String,
    prefix: String,
}

impl Names {
    fn new(tag: &str) -> Self {
        let u = uuid::Uuid::new_v4().simple().to_string();
        Names {
            queue: format!("bq-test:pipe:{tag}:{u}"),
            prefix: format!("bq-test:pipe-idemp:{u}:"),
        }
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(redis_url())
            && let Ok(mut c) = client.get_connection()
        {
            let mut keys = queue_keys(&self.queue);
            keys.push(format!("{}.dlq", self.queue));
            for pattern in [format!("{{{}}}:*", self.queue), format!("{}*", self.prefix)] {
                let found: Vec<String> = redis::cmd("KEYS")
                    .arg(pattern)
                    .query(&mut c)
                    .unwrap_or_default();
                keys.extend(found);
            }
            let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut c);
        }
    }
}

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis must be reachable for this test")
}

async fn store(prefix: &str) -> RedisStore {
    RedisStore::builder(redis_url())
        .prefix(prefix)
        .ttl(Duration::from_secs(600))
        .connect()
        .await
        .expect("Redis must be reachable for this test")
}

/// Counts the store calls the guard makes itself, forwarding everything (also the offer
/// to pipeline `remember`).
struct Counting<S> {
    inner: S,
    remembers: AtomicUsize,
}

impl<S: AsyncStore> AsyncStore for Counting<S> {
    type Error = S::Error;
    fn seen(&self, id: &str) -> impl Future<Output = Result<bool, S::Error>> + Send {
        self.inner.seen(id)
    }
    fn remember(&self, id: &str) -> impl Future<Output = Result<(), S::Error>> + Send {
        self.remembers.fetch_add(1, Ordering::SeqCst);
        self.inner.remember(id)
    }
    fn remember_for(
        &self,
        id: &str,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<(), S::Error>> + Send {
        self.remembers.fetch_add(1, Ordering::SeqCst);
        self.inner.remember_for(id, ttl)
    }
    fn forget(&self, id: &str) -> impl Future<Output = Result<(), S::Error>> + Send {
        self.inner.forget(id)
    }
    fn pipelined_remember(
        &self,
        id: &str,
        ttl: Option<Duration>,
        server: &str,
    ) -> Option<PipelinedWrite> {
        self.inner.pipelined_remember(id, ttl, server)
    }
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error(transparent)]
    Store(#[from] babelqueue::redis::RedisStoreError),
    #[error("declined")]
    Declined(#[source] Permanent),
}
babelqueue::handler_error_from!(ChargeError);

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_store_offers_its_remember_only_to_a_transport_on_its_server() {
    let names = Names::new("offer");
    let t = RedisTransport::connect(&redis_url()).await.unwrap();
    let server = t.pipeline_server().expect("one server: pipelining is on");
    assert!(t.combines_ack_and_reserve());
    let s = store(&names.prefix).await;
    let w = s
        .pipelined_remember("id-A", None, server)
        .expect("same server and database");
    assert_eq!(w.server(), server);
    let args: Vec<String> = w
        .args()
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert_eq!(
        args,
        [
            "SET",
            &format!("{}id-A", names.prefix),
            "1",
            "NX",
            "PX",
            "600000"
        ]
    );
    // Another database of the same server is another keyspace.
    let other_db = RedisStore::builder("redis://127.0.0.1:6379/1")
        .connect()
        .await
        .unwrap();
    assert!(other_db.pipelined_remember("id-A", None, server).is_none());
    // A store over a bare connection does not know its server.
    let bare = RedisStore::from_connection(raw().await);
    assert!(bare.pipelined_remember("id-A", None, server).is_none());
    // An id no store can hold is never handed over (the guard reports it).
    assert!(s.pipelined_remember("a\0b", None, server).is_none());
    // Pipelining off: nothing is offered to, and acks go at once.
    let off = RedisTransport::connect(&redis_url())
        .await
        .unwrap()
        .pipelining(false);
    assert_eq!(off.pipeline_server(), None);
    assert!(!off.combines_ack_and_reserve());
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn ack_and_reserve_writes_then_acks_then_reserves_in_one_call() {
    let names = Names::new("unit");
    let q = names.queue.as_str();
    let t = RedisTransport::connect(&redis_url()).await.unwrap();
    t.publish_raw(q, b"first".to_vec()).await.unwrap();
    t.publish_raw(q, b"second".to_vec()).await.unwrap();
    let first = t
        .reserve(q, Duration::ZERO)
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(first.element(), b"first");
    let key = format!("{}id-A", names.prefix);
    let write = PipelinedWrite::new(
        t.pipeline_server().unwrap(),
        ["SET", key.as_str(), "1", "NX"],
    );
    let next = t
        .ack_and_reserve(&first, std::slice::from_ref(&write), Some(q))
        .await
        .unwrap()
        .expect("the second message");
    assert_eq!(next.element(), b"second");
    let v: Option<String> = raw().await.get(&key).await.unwrap();
    assert_eq!(v.as_deref(), Some("1"), "the write reached the server");
    assert_eq!(
        t.processing_len(q).await.unwrap(),
        1,
        "first acked, second held"
    );
    assert_eq!(t.len(q).await.unwrap(), 0);
    // The last one: acked, and nothing more to reserve.
    assert!(
        t.ack_and_reserve(&next, &[], Some(q))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(t.processing_len(q).await.unwrap(), 0);
    // Writes for another server are refused, not sent elsewhere.
    let elsewhere = PipelinedWrite::new("10.0.0.1:6379/0", ["SET", key.as_str(), "2"]);
    let off = RedisTransport::connect(&redis_url())
        .await
        .unwrap()
        .pipelining(false);
    assert!(off.apply_writes(&[elsewhere]).await.is_err());
    let v: Option<String> = raw().await.get(&key).await.unwrap();
    assert_eq!(v.as_deref(), Some("1"));
}

/// Runs `n` payments plus `d` byte-identical copies through `concurrency` workers,
/// guarded by a counting Redis store; returns (effects, stats, remember calls).
async fn drain_payments(
    names: &Names,
    transport: RedisTransport,
    n: usize,
    d: usize,
    concurrency: usize,
) -> (usize, babelqueue::runtime::Stats, usize) {
    let s = Arc::new(Counting {
        inner: store(&names.prefix).await,
        remembers: AtomicUsize::new(0),
    });
    let effects = Arc::new(AtomicUsize::new(0));
    let (st, fx) = (s.clone(), effects.clone());
    let app = App::new(transport)
        .queue(&names.queue)
        .concurrency(concurrency)
        .route_async(CHARGE, move |env: Envelope| {
            let (st, fx) = (st.clone(), fx.clone());
            async move {
                Guard::new(&*st)
                    .run_async(&env, async {
                        fx.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), ChargeError>(())
                    })
                    .await
                    .map(drop)
            }
        });
    let mut bodies = Vec::new();
    for i in 0..n {
        let env = Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i:04}")}))
            .unwrap()
            .with_queue(&names.queue);
        bodies.push(env.encode());
    }
    // Each copy right behind its original: two workers hold the pair at once.
    let mut list = Vec::new();
    for (i, b) in bodies.iter().enumerate() {
        list.push(b.clone());
        if i < d {
            list.push(b.clone());
        }
    }
    for b in list {
        app.publish_raw(b).await.unwrap();
    }
    let stats = app.drain().await.unwrap();
    (
        effects.load(Ordering::SeqCst),
        stats,
        s.remembers.load(Ordering::SeqCst),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn concurrent_duplicates_run_once_with_remember_sent_with_the_ack() {
    let names = Names::new("drain");
    let t = RedisTransport::connect(&redis_url()).await.unwrap();
    let (effects, stats, remembers) = drain_payments(&names, t.clone(), 200, 100, 8).await;
    assert_eq!(effects, 200, "one effect per payment");
    assert_eq!(
        (stats.succeeded, stats.skipped, stats.acked),
        (200, 100, 300)
    );
    assert_eq!(
        remembers, 0,
        "every remember went with an ack, none on its own"
    );
    assert_eq!(t.processing_len(&names.queue).await.unwrap(), 0);
    assert_eq!(t.len(&names.queue).await.unwrap(), 0);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", names.prefix))
        .query_async(&mut raw().await)
        .await
        .unwrap();
    assert_eq!(keys.len(), 200, "every id remembered");
    let ttl: i64 = raw().await.pttl(&keys[0]).await.unwrap();
    assert!(ttl > 0 && ttl <= 600_000, "the store's TTL applies: {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn without_pipelining_the_guard_remembers_itself() {
    let names = Names::new("off");
    let t = RedisTransport::connect(&redis_url())
        .await
        .unwrap()
        .pipelining(false);
    let (effects, stats, remembers) = drain_payments(&names, t, 50, 25, 4).await;
    assert_eq!(effects, 50);
    assert_eq!((stats.succeeded, stats.skipped), (50, 25));
    assert_eq!(remembers, 50);
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_handler_failing_after_its_guard_succeeded_still_remembers_the_id() {
    let names = Names::new("fail-after");
    let s = Arc::new(store(&names.prefix).await);
    let st = s.clone();
    let app = App::new(RedisTransport::connect(&redis_url()).await.unwrap())
        .queue(&names.queue)
        .route_async(CHARGE, move |env: Envelope| {
            let st = st.clone();
            async move {
                Guard::new(&*st)
                    .run_async(&env, async { Ok::<(), ChargeError>(()) })
                    .await?;
                // The guarded effect happened; what follows fails for good.
                Err::<(), _>(ChargeError::Declined(Permanent::new("card declined")))
            }
        });
    let env = Envelope::new(CHARGE, json!({"payment_id": "pay_1"}))
        .unwrap()
        .with_queue(&names.queue);
    app.publish_raw(env.encode()).await.unwrap();
    let stats = app.drain().await.unwrap();
    assert_eq!(stats.dead_lettered, 1);
    assert!(
        s.seen(&env.meta.id).await.unwrap(),
        "the guarded id is remembered although the delivery was not acked as a success"
    );
}

/// Drains `n` payments and `n / 2` byte-identical copies one at a time on a server of its
/// own; returns (server reads, command calls) during the drain.
async fn one_at_a_time(
    server: &fleet_support::RedisServer,
    pipelining: bool,
    n: usize,
) -> (u64, std::collections::HashMap<String, u64>) {
    let queue = format!("rt-{pipelining}");
    let store = RedisStore::builder(server.url())
        .prefix(format!("bq:idemp:rt-{pipelining}:"))
        .connect()
        .await
        .unwrap();
    let effects = Arc::new(AtomicUsize::new(0));
    let fx = effects.clone();
    let store = Arc::new(store);
    let transport = RedisTransport::connect(&server.url())
        .await
        .unwrap()
        .pipelining(pipelining);
    // Heartbeat, depth sample and recovery far apart: the count is of the per-delivery
    // round trips, not of the periodic ones a slow (loaded) run would add.
    let app = App::new(transport)
        .queue(&queue)
        .heartbeat(Duration::from_secs(60), Duration::from_secs(180))
        .recovery_interval(Duration::from_secs(60))
        .route_async(CHARGE, move |env: Envelope| {
            let (st, fx) = (store.clone(), fx.clone());
            async move {
                Guard::new(&*st)
                    .run_async(&env, async {
                        fx.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), ChargeError>(())
                    })
                    .await
                    .map(drop)
            }
        });
    for i in 0..n {
        let env = Envelope::new(CHARGE, json!({"payment_id": format!("pay_{i:04}")}))
            .unwrap()
            .with_queue(&queue);
        app.publish_raw(env.encode()).await.unwrap();
        if i % 2 == 0 {
            app.publish_raw(env.encode()).await.unwrap();
        }
    }
    let (reads, calls) = (server.reads_processed(), server.command_calls());
    let stats = app.drain().await.unwrap();
    let (reads_after, calls_after) = (server.reads_processed(), server.command_calls());
    assert_eq!(effects.load(Ordering::SeqCst), n);
    assert_eq!(
        (stats.succeeded, stats.skipped),
        (n as u64, n.div_ceil(2) as u64)
    );
    let delta = calls_after
        .iter()
        .map(|(k, v)| (k.clone(), v - calls.get(k).copied().unwrap_or(0)))
        .collect();
    // The INFO call between the marks is one read.
    (reads_after - reads - 1, delta)
}

/// The round-trip target, counted by the server: seen-set mode on Redis costs 2 round trips
/// per delivery (first or duplicate) with pipelining, and 4 / 3 without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server on the PATH (starts its own on port 17120); CI runs it with --include-ignored"]
async fn one_at_a_time_a_delivery_costs_two_round_trips() {
    let server = tokio::task::spawn_blocking(|| fleet_support::RedisServer::start(17120, &[]))
        .await
        .unwrap();
    let n = 300;
    let deliveries = (n + n / 2) as u64;
    let (reads, calls) = one_at_a_time(&server, true, n).await;
    let count = |c: &str| calls.get(c).copied().unwrap_or(0);
    assert_eq!(count("exists"), deliveries, "one check per delivery");
    // (The heartbeat script's own `SET`s are counted too.)
    let sets = count("set");
    assert!(
        (n as u64..n as u64 + 5).contains(&sets),
        "one remember per payment: {sets}"
    );
    assert_eq!(count("lrem"), deliveries, "one ack per delivery");
    // Start-up (connections, registration, orphan check, recovery) and shutdown add a
    // handful of round trips; per delivery it is 2.
    assert!(
        reads <= 2 * deliveries + 30,
        "{reads} round trips for {deliveries} deliveries"
    );
    let (reads_off, calls_off) = one_at_a_time(&server, false, n).await;
    let sets_off = calls_off.get("set").copied().unwrap_or(0);
    assert!((n as u64..n as u64 + 5).contains(&sets_off), "{sets_off}");
    assert!(
        reads_off >= 3 * deliveries,
        "without pipelining every command is a round trip: {reads_off} for {deliveries}"
    );
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn settle_and_reserve_acks_a_batch_and_refills_it_in_queue_order() {
    use babelqueue::runtime::Settled;
    let names = Names::new("batch");
    let q = names.queue.as_str();
    let t = RedisTransport::connect(&redis_url()).await.unwrap();
    assert_eq!(t.batch_hint(), 16);
    for i in 0..5 {
        t.publish_raw(q, format!("m{i}").into_bytes())
            .await
            .unwrap();
    }
    // A refill with nothing to settle: three at once, in queue order.
    let first = t.settle_and_reserve(&[], Some((q, 3))).await.unwrap();
    let bodies: Vec<&[u8]> = first.iter().map(|d| d.element()).collect();
    assert_eq!(bodies, [&b"m0"[..], b"m1", b"m2"]);
    assert_eq!(t.processing_len(q).await.unwrap(), 3);
    assert_eq!(t.len(q).await.unwrap(), 2);
    // m0 has a recovery counter: the batch ack drops it with the element.
    let counters = format!("{{{q}}}:recoveries");
    let sha: String = redis::cmd("EVAL")
        .arg("return redis.sha1hex(ARGV[1])")
        .arg(0)
        .arg("m0")
        .query_async(&mut raw().await)
        .await
        .unwrap();
    let _: () = raw().await.hset(&counters, &sha, 1).await.unwrap();
    // Two settled (the first with a store write), the refill asks for ten: two come.
    let key = format!("{}id-B", names.prefix);
    let write = PipelinedWrite::new(
        t.pipeline_server().unwrap(),
        ["SET", key.as_str(), "1", "NX"],
    );
    let settled = [
        Settled {
            delivery: &first[0],
            writes: std::slice::from_ref(&write),
        },
        Settled::ack(&first[1]),
    ];
    let more = t.settle_and_reserve(&settled, Some((q, 10))).await.unwrap();
    let bodies: Vec<&[u8]> = more.iter().map(|d| d.element()).collect();
    assert_eq!(bodies, [&b"m3"[..], b"m4"]);
    let v: Option<String> = raw().await.get(&key).await.unwrap();
    assert_eq!(v.as_deref(), Some("1"), "the write reached the server");
    let left: bool = raw().await.hexists(&counters, &sha).await.unwrap();
    assert!(!left, "the acked element's recovery counter is gone");
    assert_eq!(t.processing_len(q).await.unwrap(), 3, "m2, m3, m4 held");
    assert_eq!(t.len(q).await.unwrap(), 0);
    // The rest settled with no refill; an empty queue refills nothing.
    let rest: Vec<Settled<'_>> = [&first[2], &more[0], &more[1]]
        .into_iter()
        .map(Settled::ack)
        .collect();
    assert!(t.settle_and_reserve(&rest, None).await.unwrap().is_empty());
    assert!(
        t.settle_and_reserve(&[], Some((q, 4)))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(t.processing_len(q).await.unwrap(), 0);
    let _: () = raw().await.del(&counters).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn several_batch_workers_run_each_payment_once() {
    let names = Names::new("batches");
    let t = RedisTransport::connect(&redis_url()).await.unwrap();
    // 32 places: the transport's batch of 16, at most an eighth of them: 8 workers of 4.
    let (effects, stats, remembers) = drain_payments(&names, t.clone(), 400, 200, 32).await;
    assert_eq!(effects, 400, "one effect per payment");
    assert_eq!(
        (stats.succeeded, stats.skipped, stats.acked, stats.unacked),
        (400, 200, 600, 0)
    );
    assert_eq!(remembers, 0, "every remember went with a batch's acks");
    assert_eq!(t.processing_len(&names.queue).await.unwrap(), 0);
    assert_eq!(t.len(&names.queue).await.unwrap(), 0);
}

#[tokio::test]
#[ignore = "needs redis-server on the PATH (starts its own on port 17464, stopped by pid)"]
async fn a_server_without_the_batch_scripts_gets_them_and_the_batch_goes_through() {
    use babelqueue::runtime::Settled;
    // A fresh server has an empty script cache, as one restarted mid-run has: the first
    // batch that needs a script (a refill of more than 8 places) meets NOSCRIPT, loads the
    // scripts and is sent again.
    let server = fleet_support::RedisServer::start(17464, &[]);
    let q = "bq-test:pipe:noscript";
    let t = RedisTransport::connect(&server.url()).await.unwrap();
    for i in 0..12 {
        t.publish_raw(q, format!("m{i}").into_bytes())
            .await
            .unwrap();
    }
    let loads = || {
        server
            .command_calls()
            .get("script|load")
            .copied()
            .unwrap_or(0)
    };
    let got = t.settle_and_reserve(&[], Some((q, 10))).await.unwrap();
    assert_eq!(got.len(), 10, "reserved once the scripts were loaded");
    let after_first = loads();
    assert!(after_first >= 2, "the batch scripts were loaded");
    // Loaded once: the next batch finds them.
    let acks: Vec<Settled<'_>> = got.iter().map(Settled::ack).collect();
    let rest = t.settle_and_reserve(&acks, Some((q, 10))).await.unwrap();
    let bodies: Vec<&[u8]> = rest.iter().map(|d| d.element()).collect();
    assert_eq!(bodies, [&b"m10"[..], b"m11"]);
    assert_eq!(loads(), after_first, "no second load");
    assert_eq!(t.processing_len(q).await.unwrap(), 2, "ten acked, two held");
    // The cache emptied mid-run (as by a restart): the batch (an ack and a refill that
    // finds one) is sent again after both scripts are loaded, and nothing is lost.
    let mut c = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut c)
        .await
        .unwrap();
    t.publish_raw(q, b"m12".to_vec()).await.unwrap();
    let last = t
        .settle_and_reserve(&[Settled::ack(&rest[0])], Some((q, 10)))
        .await
        .unwrap();
    assert_eq!(loads(), after_first + 2, "both batch scripts loaded again");
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].element(), b"m12");
    assert_eq!(
        t.processing_len(q).await.unwrap(),
        2,
        "m10 acked, m11 and m12 held"
    );
    assert_eq!(t.len(q).await.unwrap(), 0);
}

#[tokio::test]
#[ignore = "needs redis-server on the PATH (starts its own on port 17465, stopped by pid)"]
async fn a_batch_without_recovery_counters_is_plain_commands() {
    use babelqueue::runtime::Settled;
    // Up to 8 places and no recovery counters known: one `LREM` per ack and one `LMOVE`
    // per place, no script call (a script costs the server several plain commands).
    let server = fleet_support::RedisServer::start(17465, &[]);
    let q = "bq-test:pipe:plain";
    let t = RedisTransport::connect(&server.url()).await.unwrap();
    for i in 0..6 {
        t.publish_raw(q, format!("m{i}").into_bytes())
            .await
            .unwrap();
    }
    let calls = |name: &str| server.command_calls().get(name).copied().unwrap_or(0);
    let got = t.settle_and_reserve(&[], Some((q, 4))).await.unwrap();
    let bodies: Vec<&[u8]> = got.iter().map(|d| d.element()).collect();
    assert_eq!(bodies, [&b"m0"[..], b"m1", b"m2", b"m3"], "in queue order");
    // The commands the batch scripts run inside them (the ack script's `EXISTS` of the
    // counters, the reserve script's `LRANGE` and `LTRIM`): none may run. (The transport's
    // own upkeep before a reserve may call other scripts, so `EVALSHA` is not counted.)
    let names = ["lmove", "lrem", "exists", "lrange", "ltrim"];
    let before: Vec<u64> = names.iter().map(|n| calls(n)).collect();
    // Three acked (one with its store write first), and a refill of 5 places that finds
    // the 2 left: the other 3 moves answer nil.
    let key = "bq-test:pipe-idemp:plain:id-P";
    let write = PipelinedWrite::new(t.pipeline_server().unwrap(), ["SET", key, "1", "NX"]);
    let settled = [
        Settled {
            delivery: &got[0],
            writes: std::slice::from_ref(&write),
        },
        Settled::ack(&got[1]),
        Settled::ack(&got[2]),
    ];
    let more = t.settle_and_reserve(&settled, Some((q, 5))).await.unwrap();
    let bodies: Vec<&[u8]> = more.iter().map(|d| d.element()).collect();
    assert_eq!(bodies, [&b"m4"[..], b"m5"]);
    let ran: Vec<u64> = names
        .iter()
        .zip(&before)
        .map(|(n, b)| calls(n) - b)
        .collect();
    assert_eq!(
        ran,
        [5, 3, 0, 0, 0],
        "one LMOVE per place, one LREM per ack, no batch script ({names:?})"
    );
    let mut c = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let v: Option<String> = c.get(key).await.unwrap();
    assert_eq!(v.as_deref(), Some("1"), "the write reached the server");
    // m3, m4, m5 held; the own list holds exactly them, in order.
    let own = babelqueue::redis::consumer_processing_list(q, t.id());
    let held: Vec<String> = c.lrange(&own, 0, -1).await.unwrap();
    assert_eq!(held, ["m3", "m4", "m5"]);
    let rest: Vec<Settled<'_>> = [&got[3], &more[0], &more[1]]
        .into_iter()
        .map(Settled::ack)
        .collect();
    assert!(
        t.settle_and_reserve(&rest, Some((q, 3)))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(t.processing_len(q).await.unwrap(), 0);
    assert_eq!(t.len(q).await.unwrap(), 0);
}

#[tokio::test]
#[ignore = "needs redis-server on the PATH (starts its own on port 17466, stopped by pid)"]
async fn a_refill_beside_a_refused_ack_goes_back_to_the_queue_before_the_next_reserve() {
    use babelqueue::runtime::Settled;
    // The acks of a round trip are refused while the reserve beside them runs (a user
    // that may not `LREM`: `NOPERM`): the reserve's reply is not read, so what it moved
    // sits in the own list with no task holding it. The orphan check must return it to
    // the queue before the next reserve, or it waits there for the next start.
    let server = fleet_support::RedisServer::start(17466, &[]);
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let acl = |rules: &[&str]| {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg("acker").arg(rules);
        cmd
    };
    let _: () = acl(&["on", ">pw", "~*", "&*", "+@all", "-lrem"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let q = "bq-test:pipe:refused-ack";
    let own = |t: &RedisTransport| babelqueue::redis::consumer_processing_list(q, t.id());
    let t = RedisTransport::connect("redis://acker:pw@127.0.0.1:17466/0")
        .await
        .unwrap();
    for i in 0..6 {
        t.publish_raw(q, format!("m{i}").into_bytes())
            .await
            .unwrap();
    }
    let held = |c: &mut redis::aio::MultiplexedConnection, own: String| {
        let mut c = c.clone();
        async move { c.lrange::<_, Vec<String>>(own, 0, -1).await.unwrap() }
    };

    // A batch: the ack of m0 refused, the refill of 2 places moved m2 and m3.
    let got = t.settle_and_reserve(&[], Some((q, 2))).await.unwrap();
    let bodies: Vec<&[u8]> = got.iter().map(|d| d.element()).collect();
    assert_eq!(bodies, [&b"m0"[..], b"m1"]);
    let err = t
        .settle_and_reserve(&[Settled::ack(&got[0])], Some((q, 2)))
        .await
        .expect_err("the ack is refused");
    assert!(format!("{err:?}").contains("NoPerm"), "{err:?}");
    assert_eq!(held(&mut admin, own(&t)).await, ["m0", "m1", "m2", "m3"]);
    let _: () = acl(&["+lrem"]).query_async(&mut admin).await.unwrap();
    // Acked again with the next refill: m2 and m3 went back to the queue's head first,
    // so the refill takes them, in order, and the own list holds only what is held.
    let more = t
        .settle_and_reserve(&[Settled::ack(&got[0])], Some((q, 2)))
        .await
        .unwrap();
    let bodies: Vec<&[u8]> = more.iter().map(|d| d.element()).collect();
    assert_eq!(bodies, [&b"m2"[..], b"m3"], "the orphans come first");
    assert_eq!(held(&mut admin, own(&t)).await, ["m1", "m2", "m3"]);

    // One message at a time: the ack of m1 refused, the reserve beside it moved m4.
    let _: () = acl(&["-lrem"]).query_async(&mut admin).await.unwrap();
    let err = t
        .ack_and_reserve(&got[1], &[], Some(q))
        .await
        .expect_err("the ack is refused");
    assert!(format!("{err:?}").contains("NoPerm"), "{err:?}");
    assert_eq!(held(&mut admin, own(&t)).await, ["m1", "m2", "m3", "m4"]);
    let _: () = acl(&["+lrem"]).query_async(&mut admin).await.unwrap();
    let next = t
        .ack_and_reserve(&got[1], &[], Some(q))
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(next.element(), b"m4", "the orphan comes first");
    assert_eq!(held(&mut admin, own(&t)).await, ["m2", "m3", "m4"]);

    // The rest: nothing lost, nothing left.
    let acks: Vec<Settled<'_>> = [&more[0], &more[1], &next]
        .into_iter()
        .map(Settled::ack)
        .collect();
    let last = t.settle_and_reserve(&acks, Some((q, 3))).await.unwrap();
    let bodies: Vec<&[u8]> = last.iter().map(|d| d.element()).collect();
    assert_eq!(bodies, [&b"m5"[..]]);
    assert!(
        t.settle_and_reserve(&[Settled::ack(&last[0])], None)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(t.processing_len(q).await.unwrap(), 0);
    assert_eq!(t.len(q).await.unwrap(), 0);
}
