//! Memory per remembered id in the in-memory store, measured with a counting allocator.
//!
//! `cargo bench --bench memory_per_id` prints live heap bytes per id after remembering
//! 1,000,000 UUID v4 ids, for `InMemoryStore` and, as the baseline in the same run, a
//! `HashSet<String>` holding the same ids.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashSet;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use babelqueue::{InMemoryStore, Store};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const N: usize = 1_000_000;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn measure<T>(label: &str, ids: &[String], build: impl FnOnce(&[String]) -> T) -> f64 {
    let before = live();
    let kept = build(ids);
    let per_id = (live() - before) as f64 / ids.len() as f64;
    println!("{label:<48} {per_id:>7.1} bytes/id");
    drop(kept);
    per_id
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it quickly with --test-ish args.
    let quick = std::env::args().any(|a| a == "--test");
    let n = if quick { 10_000 } else { N };
    let uuids: Vec<String> = (0..n).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let texts: Vec<String> = (0..n).map(|i| format!("order-{i:08}")).collect();
    println!("memory per remembered id, {n} ids (live heap bytes / ids):");
    let baseline = measure("HashSet<String> (baseline), UUID ids", &uuids, |ids| {
        ids.iter().cloned().collect::<HashSet<String>>()
    });
    let store = measure("InMemoryStore::new(), UUID ids", &uuids, |ids| {
        let s = InMemoryStore::new();
        for id in ids {
            Store::remember(&s, id).unwrap();
        }
        s
    });
    measure(
        "InMemoryStore ttl 24h + capacity 2M, UUID ids",
        &uuids,
        |ids| {
            let s = InMemoryStore::builder()
                .ttl(Duration::from_secs(86_400))
                .capacity(2 * N)
                .build();
            for id in ids {
                Store::remember(&s, id).unwrap();
            }
            s
        },
    );
    measure(
        "HashSet<String> (baseline), 14-byte text ids",
        &texts,
        |ids| ids.iter().cloned().collect::<HashSet<String>>(),
    );
    measure("InMemoryStore::new(), 14-byte text ids", &texts, |ids| {
        let s = InMemoryStore::new();
        for id in ids {
            Store::remember(&s, id).unwrap();
        }
        s
    });
    println!(
        "ratio InMemoryStore / HashSet<String> (UUID ids): {:.2}",
        store / baseline
    );
}
