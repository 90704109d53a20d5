//! A 64 MiB body is dead-lettered as `poison` (over the size limit, not decoded) and the
//! consumer's memory grows by at most 1.5 times the body while it does so, in
//! memory; over Redis the growth is measured and bounded (see that test for why it is more).
//!
//! What is measured: the bytes live on the heap of this test process, counted by a global
//! allocator wrapper (peak of `allocated - freed`), from the moment the body sits in the
//! in-memory queue (the baseline: the broker's own copy) until the drain returned. The
//! in-memory transport shares the reserved element with the delivery, so this is the
//! consumer's own overhead: the dead-letter body it builds, plus bookkeeping. This binary
//! holds this one test only, so no other test allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use babelqueue::Envelope;
use babelqueue::runtime::{App, InMemoryTransport, Transport, recover_poison};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only adds counters.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let now = CURRENT.fetch_add(new_size - layout.size(), Ordering::SeqCst)
                    + (new_size - layout.size());
                PEAK.fetch_max(now, Ordering::SeqCst);
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const MIB: usize = 1024 * 1024;

/// The tests of this binary take turns: the allocator counts the whole process.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A real envelope whose data holds ~64 MiB of JSON text (quotes included, so the
/// dead-letter copy has escaping to do).
fn big_body() -> Vec<u8> {
    let chunk = r#"{"sku":"A-1","note":"a \"quoted\" word"},"#;
    let mut items = String::with_capacity(64 * MIB + 1024);
    while items.len() < 64 * MIB - chunk.len() {
        items.push_str(chunk);
    }
    items.pop();
    format!(
        r#"{{"job":"urn:babel:orders:import","trace_id":"t-1","data":{{"items":[{items}]}},"meta":{{"id":"big-1","queue":"q","lang":"rust","schema_version":1,"created_at":1}},"attempts":0}}"#
    )
    .into_bytes()
}

#[tokio::test(flavor = "current_thread")]
#[ignore = "slow: builds and scans 64 MiB (about 45 s in a debug build); CI runs it with --include-ignored"]
async fn a_64_mib_body_is_poison_and_memory_grows_at_most_one_and_a_half_times_the_body() {
    let _turn = TURN.lock().await;
    let body = big_body();
    let size = body.len();
    assert!(size >= 64 * MIB - 1024 && Envelope::decode(&body).is_ok());

    let t = InMemoryTransport::new();
    let app = App::new(t.clone())
        .queue("q")
        .route_sync("urn:babel:orders:import", |_: &Envelope| ());
    // Moved into the queue: the broker's copy is part of the baseline.
    t.publish_raw("q", body.clone()).await.unwrap();

    let baseline = CURRENT.load(Ordering::SeqCst);
    PEAK.store(baseline, Ordering::SeqCst);
    let stats = app.drain().await.unwrap();
    let peak = PEAK.load(Ordering::SeqCst);
    let growth = peak - baseline;
    eprintln!(
        "body {:.1} MiB, peak growth while consuming {:.1} MiB ({:.2}x the body)",
        size as f64 / MIB as f64,
        growth as f64 / MIB as f64,
        growth as f64 / size as f64
    );
    assert_eq!((stats.poison, stats.dead_lettered), (1, 1));
    assert!(
        growth * 2 <= 3 * size,
        "peak growth {growth} > 1.5 x {size}"
    );

    let dlq = t.messages("q.dlq");
    let dead = Envelope::decode(&dlq[0]).unwrap();
    assert_eq!(
        dead.dead_letter.unwrap().reason,
        babelqueue::DeadLetterReason::Poison
    );
    assert!(recover_poison(&dlq[0]).unwrap() == body, "bytes intact");
}

#[tokio::test(flavor = "current_thread")]
#[ignore = "needs Redis (BABELQUEUE_REDIS_URL) and builds 64 MiB; CI runs it with --run-ignored"]
async fn over_redis_a_64_mib_poison_body_is_dead_lettered_intact_and_its_memory_bounded() {
    use babelqueue::redis::RedisTransport;
    use babelqueue::redis::redis;
    let _turn = TURN.lock().await;
    let url =
        std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let queue = format!("bq-test-bigbody-{}", uuid::Uuid::new_v4().simple());
    let body = big_body();
    let size = body.len();
    let t = RedisTransport::connect(&url).await.unwrap();
    t.publish_raw(&queue, body.clone()).await.unwrap();
    let app = App::new(t.clone())
        .queue(&queue)
        .route_sync("urn:babel:orders:import", |_: &Envelope| ());
    let baseline = CURRENT.load(Ordering::SeqCst);
    PEAK.store(baseline, Ordering::SeqCst);
    let stats = app.drain().await.unwrap();
    let growth = PEAK.load(Ordering::SeqCst) - baseline;
    eprintln!(
        "over Redis: body {:.1} MiB, peak growth while consuming {:.1} MiB ({:.2}x the body)",
        size as f64 / MIB as f64,
        growth as f64 / MIB as f64,
        growth as f64 / size as f64
    );
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let dead: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(format!("{queue}.dlq"))
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{queue}*"))
        .query_async(&mut c)
        .await
        .unwrap();
    for k in keys {
        let _: () = redis::cmd("DEL").arg(k).query_async(&mut c).await.unwrap();
    }
    assert_eq!((stats.poison, stats.dead_lettered), (1, 1));
    assert_eq!(dead.len(), 1);
    assert!(recover_poison(&dead[0]).unwrap() == body, "bytes intact");
    // About 6.6x over Redis: the reply's read buffer and the element (2x), the
    // dead-letter body (1x), and every byte sent twice (the redis crate packs a command
    // into a second buffer): the dead letter, and the element again as the argument of the
    // `LREM` that removes it from the processing list (4x). The 1.5x of the in-memory path
    // is not reached over Redis; this bound guards against it getting worse.
    assert!(growth < 8 * size, "peak growth {growth} >= 8 x {size}");
}
