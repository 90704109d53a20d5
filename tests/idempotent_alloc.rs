//! What the `#[idempotent]` expansion costs beyond the hand-written guard on the
//! in-memory path: no heap allocation of its own per call (the key is kept inline, the
//! async guard's future is pinned in place, not boxed), sync and async, first deliveries
//! and duplicates, for `meta.id` and for a namespaced `key = ...` (the store itself may
//! allocate for a key longer than a UUID; that is the same for both).
//!
//! The allocations are counted by a global allocator, on the test's own thread only.
//!
//! The `#[ignore]`d `callgrind_*` tests are loops for instruction counts, one variant
//! each (`CALLS` calls of one handler on a store warmed to its capacity):
//!
//! ```text
//! cargo test --release --test idempotent_alloc --no-run        # prints the binary's path
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*loop_macro_async*' \
//!     target/release/deps/idempotent_alloc-<hash> --ignored --exact callgrind_macro_async
//! ```
//!
//! (`loop_hand_async`, `loop_macro_sync`, `loop_hand_sync` likewise); the `Ir` total over
//! `CALLS` is the instructions per call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::LazyLock;
use std::task::{Context, Poll, Waker};

use babelqueue::{Envelope, Guard, InMemoryStore, idempotent};

// --- allocation counting, per thread ------------------------------------------------------

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note_alloc() {
    // `try_with`: the thread-locals may be gone while a thread shuts down.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The heap allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    ALLOCS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCS.with(Cell::get)
}

// --- the handlers: each pair has its own store ----------------------------------------------

const CAPACITY: usize = 1_000;
const URN: &str = "urn:babel:payments:charge";

fn store() -> InMemoryStore {
    InMemoryStore::builder().capacity(CAPACITY).build()
}

static HAND_ASYNC: LazyLock<InMemoryStore> = LazyLock::new(store);
static MACRO_ASYNC: LazyLock<InMemoryStore> = LazyLock::new(store);
static HAND_SYNC: LazyLock<InMemoryStore> = LazyLock::new(store);
static MACRO_SYNC: LazyLock<InMemoryStore> = LazyLock::new(store);
static HAND_KEYED: LazyLock<InMemoryStore> = LazyLock::new(store);
static MACRO_KEYED: LazyLock<InMemoryStore> = LazyLock::new(store);

#[inline(never)]
fn body(env: &Envelope) -> Result<(), std::io::Error> {
    black_box(env.meta.id.len());
    Ok(())
}

async fn hand_async(env: &Envelope) -> Result<(), std::io::Error> {
    Guard::new(&*HAND_ASYNC)
        .run_async(env, async { body(env) })
        .await
        .map(|_| ())
}

#[idempotent(store = MACRO_ASYNC)]
async fn macro_async(env: &Envelope) -> Result<(), std::io::Error> {
    body(env)
}

fn hand_sync(env: &Envelope) -> Result<(), std::io::Error> {
    Guard::new(&*HAND_SYNC).run(env, || body(env)).map(|_| ())
}

#[idempotent(store = MACRO_SYNC)]
fn macro_sync(env: &Envelope) -> Result<(), std::io::Error> {
    body(env)
}

/// The hand-written equivalent of a namespaced `key = ...`: the key is built by hand,
/// in a `String`.
async fn hand_keyed(env: &Envelope) -> Result<(), std::io::Error> {
    let key = env.data["payment_id"].as_str().map(|id| {
        let mut key = String::with_capacity(env.job.len() + 1 + id.len());
        key.push_str(&env.job);
        key.push('#');
        key.push_str(id);
        key
    });
    Guard::new(&*HAND_KEYED)
        .run_async(key, async { body(env) })
        .await
        .map(|_| ())
}

#[idempotent(store = MACRO_KEYED, key = env.data.get("payment_id"))]
async fn macro_keyed(env: &Envelope) -> Result<(), std::io::Error> {
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

fn envelope(n: usize) -> Envelope {
    Envelope::new(
        URN,
        serde_json::json!({"payment_id": format!("pay_{n:08}"), "amount": 4200}),
    )
    .expect("a valid envelope")
}

type Handler = fn(&Envelope) -> Result<(), std::io::Error>;

/// Allocations per 100 calls of `run`, on first deliveries and on duplicates, after the
/// store is warmed to its capacity (so the store's own growth is not counted). `base`
/// keeps the payment ids of the tests (which share the stores) apart.
fn per_call(run: Handler, base: usize) -> (u64, u64) {
    for n in 0..2 * CAPACITY {
        run(&envelope(base + 1_000_000 + n)).expect("warm-up");
    }
    let fresh: Vec<Envelope> = (base..base + 100).map(envelope).collect();
    let first = allocations(|| {
        for env in &fresh {
            run(black_box(env)).expect("first delivery");
        }
    });
    let dups = allocations(|| {
        for env in &fresh {
            run(black_box(env)).expect("duplicate");
        }
    });
    (first, dups)
}

#[test]
fn idempotent_allocates_nothing_beyond_the_hand_written_guard() {
    let cases: [(&str, Handler, Handler); 3] = [
        ("async", |e| now(hand_async(e)), |e| now(macro_async(e))),
        ("sync", hand_sync, macro_sync),
        (
            "async key =",
            |e| now(hand_keyed(e)),
            |e| now(macro_keyed(e)),
        ),
    ];
    for (name, hand, mac) in cases {
        let (hand_first, hand_dup) = per_call(hand, 0);
        let (macro_first, macro_dup) = per_call(mac, 0);
        // The hand-written `key =` builds its `String` per call (one allocation); the
        // macro's is inline.
        let key_strings = if name == "async key =" { 100 } else { 0 };
        assert_eq!(
            macro_first + key_strings,
            hand_first,
            "{name}: first deliveries (macro {macro_first}, hand {hand_first} per 100 calls)"
        );
        assert_eq!(
            macro_dup + key_strings,
            hand_dup,
            "{name}: duplicates (macro {macro_dup}, hand {hand_dup} per 100 calls)"
        );
    }
}

#[test]
fn idempotent_makes_no_heap_allocation_on_the_in_memory_path() {
    // The in-memory store allocates nothing per call for a UUID `meta.id` once warm:
    // neither may the guard. (It may for a longer key, e.g. a namespaced `key = ...`:
    // the comparison with the hand-written guard above covers that case.)
    for (name, run) in [
        ("async", (|e| now(macro_async(e))) as Handler),
        ("sync", macro_sync),
    ] {
        let (first, dup) = per_call(run, 100_000_000);
        assert_eq!((first, dup), (0, 0), "{name}: allocations per 100 calls");
    }
}

// --- loops for callgrind -------------------------------------------------------------------

const CALLS: usize = 100_000;

fn ids(offset: usize) -> Vec<Envelope> {
    (0..CALLS).map(|n| envelope(offset + n)).collect()
}

#[inline(never)]
fn loop_hand_async(envs: &[Envelope]) {
    for env in envs {
        black_box(now(hand_async(black_box(env)))).expect("handler");
    }
}

#[inline(never)]
fn loop_macro_async(envs: &[Envelope]) {
    for env in envs {
        black_box(now(macro_async(black_box(env)))).expect("handler");
    }
}

#[inline(never)]
fn loop_hand_sync(envs: &[Envelope]) {
    for env in envs {
        black_box(hand_sync(black_box(env))).expect("handler");
    }
}

#[inline(never)]
fn loop_macro_sync(envs: &[Envelope]) {
    for env in envs {
        black_box(macro_sync(black_box(env))).expect("handler");
    }
}

/// `CALLS` first deliveries, then `CALLS` duplicates of the last `CAPACITY` of them,
/// through `run`, after warming its store.
fn callgrind(run: fn(&[Envelope]), warm: Handler) {
    for n in 0..2 * CAPACITY {
        warm(&envelope(10_000_000 + n)).expect("warm-up");
    }
    let envs = ids(0);
    run(&envs);
    let dups: Vec<Envelope> = envs[CALLS - CAPACITY..]
        .iter()
        .cycle()
        .take(CALLS)
        .cloned()
        .collect();
    run(&dups);
}

#[test]
#[ignore = "a loop for callgrind (see the module docs)"]
fn callgrind_hand_async() {
    callgrind(loop_hand_async, |e| now(hand_async(e)));
}

#[test]
#[ignore = "a loop for callgrind (see the module docs)"]
fn callgrind_macro_async() {
    callgrind(loop_macro_async, |e| now(macro_async(e)));
}

#[test]
#[ignore = "a loop for callgrind (see the module docs)"]
fn callgrind_hand_sync() {
    callgrind(loop_hand_sync, hand_sync);
}

#[test]
#[ignore = "a loop for callgrind (see the module docs)"]
fn callgrind_macro_sync() {
    callgrind(loop_macro_sync, macro_sync);
}
