//! The cost of the idempotency guard on the in-memory store, against a bare call.
//!
//! ```text
//! cargo bench --bench guard
//! cargo bench --bench guard -- --measurement-time 3 --warm-up-time 1   # on a busy machine
//! ```
//!
//! Criterion groups (`async` and `sync`), each on an `InMemoryStore` with a capacity of
//! 100,000 ids (the steady state of a long-running consumer: every first delivery also
//! evicts the oldest id):
//!
//! * `bare`: the handler called directly, no guard;
//! * `guard/first`: the hand-written guard (`guard_async` / `guard`) on a new `meta.id`
//!   (`seen` answers false, the handler runs, `remember`);
//! * `guard/duplicate`: the same on an id already remembered (`seen` answers true, skip);
//! * `idempotent/first`, `idempotent/duplicate`: an `#[idempotent(store = ...)]` fn with
//!   the same body, on the same kind of store.
//!
//! A first delivery needs a new envelope per call: those variants (and `bare/batched`, their
//! baseline) use `iter_batched_ref` over envelopes built outside the timed part; a
//! duplicate (and `bare`, its baseline) calls with one envelope in a plain loop. An async
//! handler's future is polled once with a no-op waker (the in-memory store never waits),
//! so the figures hold no executor cost. Criterion writes each median to
//! `target/criterion/<group>/<name>/new/estimates.json`. Before the
//! criterion groups, the binary prints the **heap allocations per call** of each variant,
//! counted by a global allocator over 10,000 calls; the `alloc` group times those
//! allocations alone (the owned key `String`, and the boxed future of the async expansion).
//!
//! The guard is called outside the consume runtime, as a handler called by hand: it takes
//! no per-key turn (the runtime's guard calls do; see `babelqueue_core::hooks`), and a
//! first delivery's cost includes the eviction of the store's oldest id.
//!
//! On a shared machine, count instructions instead (deterministic): with
//! `GUARD_BENCH_CALLS=<variant>,<first|duplicate>,<n>` the binary warms the variant's store,
//! makes `n` calls and exits, and `callgrind --toggle-collect='guard::calls'` counts only
//! those calls (see [`calls_mode`]):
//!
//! ```text
//! cargo bench --bench guard --no-run      # prints the binary's path
//! GUARD_BENCH_CALLS=sync/guard,duplicate,20000 valgrind --tool=callgrind --dump-instr=no \
//!     --toggle-collect='guard::calls' target/release/deps/guard-<hash>
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use babelqueue::{Envelope, Guard, InMemoryStore, Outcome, idempotent};
use criterion::{BatchSize, Criterion, criterion_group};

// --- allocation counting -----------------------------------------------------------------

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// --- the handlers ------------------------------------------------------------------------

const URN: &str = "urn:babel:payments:charge";
const CAPACITY: usize = 100_000;

fn store() -> InMemoryStore {
    InMemoryStore::builder().capacity(CAPACITY).build()
}

static HAND: LazyLock<InMemoryStore> = LazyLock::new(store);
static MACRO: LazyLock<InMemoryStore> = LazyLock::new(store);
static HAND_SYNC: LazyLock<InMemoryStore> = LazyLock::new(store);
static MACRO_SYNC: LazyLock<InMemoryStore> = LazyLock::new(store);

/// The handler body every variant runs.
#[inline(never)]
fn body(env: &Envelope) -> Result<(), std::io::Error> {
    black_box(env.meta.id.len());
    Ok(())
}

async fn bare_async(env: &Envelope) -> Result<(), std::io::Error> {
    body(env)
}

async fn hand_async(env: &Envelope) -> Result<(), std::io::Error> {
    Guard::new(&*HAND)
        .run_async(env, async { body(env) })
        .await
        .map(|_| ())
}

#[idempotent(store = MACRO)]
async fn macro_async(env: &Envelope) -> Result<(), std::io::Error> {
    body(env)
}

fn bare_sync(env: &Envelope) -> Result<(), std::io::Error> {
    body(env)
}

fn hand_sync(env: &Envelope) -> Result<(), std::io::Error> {
    Guard::new(&*HAND_SYNC).run(env, || body(env)).map(|_| ())
}

#[idempotent(store = MACRO_SYNC)]
fn macro_sync(env: &Envelope) -> Result<(), std::io::Error> {
    body(env)
}

/// Polls a future that is ready at once (the in-memory store never waits).
fn now<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => unreachable!("the in-memory guard never waits"),
    }
}

fn envelope() -> Envelope {
    Envelope::new(
        URN,
        serde_json::json!({"payment_id": "pay_00000001", "amount": 4200, "currency": "EUR"}),
    )
    .expect("a valid envelope")
}

/// One already-remembered envelope per store, for the duplicate variants.
fn duplicate(run: impl Fn(&Envelope) -> Result<(), std::io::Error>) -> Envelope {
    let env = envelope();
    run(&env).expect("first delivery");
    env
}

type Variant = (
    &'static str,
    Box<dyn Fn(&Envelope) -> Result<(), std::io::Error>>,
);

fn variants() -> Vec<Variant> {
    vec![
        ("async/bare", Box::new(|e| now(bare_async(e)))),
        ("async/guard", Box::new(|e| now(hand_async(e)))),
        ("async/idempotent", Box::new(|e| now(macro_async(e)))),
        ("sync/bare", Box::new(bare_sync)),
        ("sync/guard", Box::new(hand_sync)),
        ("sync/idempotent", Box::new(macro_sync)),
    ]
}

/// Heap allocations per call of each variant, first deliveries and duplicates.
fn count_allocations(calls: usize) {
    println!("heap allocations per call ({calls} calls each; InMemoryStore, UUID meta.id):");
    for (name, run) in variants() {
        let fresh: Vec<Envelope> = (0..calls).map(|_| envelope()).collect();
        let dup = duplicate(&run);
        // Warm the store to its capacity so ring and index growth is not counted.
        for _ in 0..CAPACITY {
            run(&envelope()).expect("warm-up");
        }
        let count = |envs: &mut dyn Iterator<Item = &Envelope>| {
            ALLOCS.store(0, Ordering::Relaxed);
            COUNTING.store(true, Ordering::Relaxed);
            for env in envs {
                black_box(run(black_box(env))).expect("handler");
            }
            COUNTING.store(false, Ordering::Relaxed);
            ALLOCS.load(Ordering::Relaxed) as f64 / calls as f64
        };
        let first = count(&mut fresh.iter());
        let dups = count(&mut std::iter::repeat_n(&dup, calls));
        println!("  {name:<18} first delivery {first:>5.2}   duplicate {dups:>5.2}");
    }
}

// --- criterion ---------------------------------------------------------------------------

fn bench(c: &mut Criterion) {
    for (name, run) in variants() {
        let (group, kind) = name.split_once('/').expect("group/kind");
        let mut g = c.benchmark_group(group);
        if kind == "bare" {
            // The same envelope every time, as the duplicates below.
            let env = envelope();
            g.bench_function("bare", |b| b.iter(|| run(black_box(&env))));
            // Timed like the first deliveries (a new envelope each, built untimed).
            g.bench_function("bare/batched", |b| {
                b.iter_batched_ref(envelope, |env| run(env), BatchSize::SmallInput)
            });
        } else {
            g.bench_function(format!("{kind}/first"), |b| {
                b.iter_batched_ref(envelope, |env| run(env), BatchSize::SmallInput)
            });
            let dup = duplicate(&run);
            g.bench_function(format!("{kind}/duplicate"), |b| {
                b.iter(|| run(black_box(&dup)))
            });
        }
        g.finish();
    }
}

/// What the `#[idempotent]` expansion allocates per call, alone: the owned key (a
/// `String` of the 36-byte `meta.id`; sync and async) and the boxed guard future (async).
fn expansion_allocations(c: &mut Criterion) {
    let env = envelope();
    let mut g = c.benchmark_group("alloc");
    g.bench_function("key_string", |b| {
        b.iter(|| black_box(black_box(env.meta.id.as_str()).to_owned()))
    });
    g.bench_function("key_string+boxed_future", |b| {
        b.iter(|| {
            let key = black_box(env.meta.id.as_str()).to_owned();
            let fut = Box::pin(async move { black_box(key.len()) });
            black_box(now(fut))
        })
    });
    g.finish();
}

criterion_group!(benches, bench, expansion_allocations);

/// Runs `run` once per envelope of `envs`: the only function `callgrind` collects in the
/// `GUARD_BENCH_CALLS` mode (`--toggle-collect='guard::calls'`), so its instruction count
/// divided by the number of calls is the cost of one call, without the setup.
#[inline(never)]
fn calls(run: &dyn Fn(&Envelope) -> Result<(), std::io::Error>, envs: &[&Envelope]) {
    for env in envs {
        black_box(run(black_box(env))).expect("handler");
    }
}

/// `GUARD_BENCH_CALLS=<variant>,<first|duplicate>,<n>` (a variant: `sync/guard`,
/// `async/bare`, ...): warm the variant's store to its capacity, then make `n` calls of
/// it, first deliveries (each a new envelope, built beforehand) or one duplicate, in
/// [`calls`], and exit. For instruction counts per call, which do not depend on the load of
/// the machine:
///
/// ```text
/// GUARD_BENCH_CALLS=sync/guard,duplicate,100000 valgrind --tool=callgrind \
///     --dump-instr=no --toggle-collect='guard::calls' target/release/deps/guard-<hash>
/// ```
///
/// (`callgrind_annotate` then shows where they go; `bare` with `duplicate` is the
/// baseline of a duplicate, `bare` with `first` that of a first delivery.)
fn calls_mode(spec: &str) {
    let mut parts = spec.split(',');
    let (Some(name), Some(kind), Some(n), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        panic!("GUARD_BENCH_CALLS=<variant>,<first|duplicate>,<n>, not {spec:?}");
    };
    let n: usize = n.parse().expect("a number of calls");
    let run = variants()
        .into_iter()
        .find_map(|(v, run)| (v == name).then_some(run))
        .unwrap_or_else(|| panic!("no variant {name:?}"));
    for _ in 0..CAPACITY {
        run(&envelope()).expect("warm-up");
    }
    let (fresh, dup): (Vec<Envelope>, Envelope) = match kind {
        "first" => ((0..n).map(|_| envelope()).collect(), envelope()),
        "duplicate" => (Vec::new(), duplicate(&run)),
        _ => panic!("first or duplicate, not {kind:?}"),
    };
    let envs: Vec<&Envelope> = match kind {
        "first" => fresh.iter().collect(),
        _ => vec![&dup; n],
    };
    calls(&*run, &envs);
    println!("{n} calls of {name} ({kind})");
}

fn main() {
    if let Ok(spec) = std::env::var("GUARD_BENCH_CALLS") {
        calls_mode(&spec);
        return;
    }
    // `cargo bench` passes `--bench`; `cargo bench -- --test` (and `cargo test --benches`)
    // check each benchmark once: count allocations over fewer calls then.
    let quick =
        std::env::args().any(|a| a == "--test") || !std::env::args().any(|a| a == "--bench");
    count_allocations(if quick { 1_000 } else { 10_000 });
    // The guard's outcome, checked once so the figures are of the path they claim.
    let env = envelope();
    assert_eq!(
        now(Guard::new(&*HAND).run_async(&env, async { body(&env) }))
            .ok()
            .map(Outcome::from),
        Some(Outcome::Ran)
    );
    assert_eq!(
        now(Guard::new(&*HAND).run_async(&env, async { body(&env) }))
            .ok()
            .map(Outcome::from),
        Some(Outcome::Skipped)
    );
    benches();
    Criterion::default().configure_from_args().final_summary();
}
