//! The expanded `#[idempotent]` handler behaves exactly like the hand-written guard on the
//! conformance manifest's idempotency sequences, sync and async.
//!
//! The sequences are read from `$BABELQUEUE_CONFORMANCE_DIR/manifest.json` when the
//! variable is set (CI sets the canonical cross-SDK suite, `../shared/conformance`), else
//! from the project's own `tests/conformance-local/manifest.json`. For every delivery the
//! four runners (macro and hand-written guard, sync and async) must make the same
//! run/skip decision, the one the manifest expects, and end with the expected number of
//! effects.

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue::{AsyncStore, Envelope, Guard, InMemoryStore, Store, idempotent};
use serde_json::Value;

/// One delivery of a sequence.
#[derive(Debug, Clone)]
struct Delivery {
    meta_id: String,
    expect_run: bool,
    throws: bool,
    forget_before: bool,
}

#[derive(Debug, Clone)]
struct Sequence {
    name: String,
    deliveries: Vec<Delivery>,
    expected_effects: u32,
}

fn manifest_path() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("BABELQUEUE_CONFORMANCE_DIR") {
        Some(dir) => root.join(dir).join("manifest.json"),
        None => root.join("tests/conformance-local/manifest.json"),
    }
}

fn sequences() -> Vec<Sequence> {
    let path = manifest_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let manifest: Value = serde_json::from_str(&text).expect("manifest is JSON");
    let cases = manifest["idempotency"]["sequences"]["cases"]
        .as_array()
        .expect("idempotency.sequences.cases is an array");
    let sequences: Vec<Sequence> = cases
        .iter()
        .map(|case| Sequence {
            name: case["name"].as_str().expect("case name").to_owned(),
            expected_effects: case["expected_effects"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .expect("expected_effects"),
            deliveries: case["deliveries"]
                .as_array()
                .expect("deliveries")
                .iter()
                .map(|d| {
                    let effect = d["expect_effect"].as_str().expect("expect_effect");
                    assert!(
                        effect == "run" || effect == "skip",
                        "unknown effect {effect}"
                    );
                    Delivery {
                        meta_id: d["meta_id"].as_str().unwrap_or_default().to_owned(),
                        expect_run: effect == "run",
                        throws: d["outcome"].as_str() == Some("throw"),
                        forget_before: d["forget_before"].as_bool().unwrap_or(false),
                    }
                })
                .collect(),
        })
        .collect();
    assert!(
        !sequences.is_empty(),
        "no idempotency sequences in {}",
        path.display()
    );
    sequences
}

fn envelope(d: &Delivery) -> Envelope {
    let mut env = Envelope::new(
        "urn:babel:conformance:sequence",
        serde_json::json!({"outcome": if d.throws { "throw" } else { "ok" }}),
    )
    .expect("valid envelope");
    env.meta.id = d.meta_id.clone();
    env
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("the handler threw")]
struct Thrown;

/// What a runner observed: the run/skip decision of each delivery and the effect count
/// (handler invocations, ok or thrown, as the manifest counts them).
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    runs: Vec<bool>,
    effects: u32,
}

// ---- the handler under test, expanded by the macro -------------------------------------

/// The store is a parameter (`store = store`), so each sequence gets a fresh one.
#[idempotent(store = store)]
fn handle_sync(store: &InMemoryStore, effects: &Cell<u32>, env: &Envelope) -> Result<(), Thrown> {
    effects.set(effects.get() + 1);
    if env.data["outcome"] == "throw" {
        return Err(Thrown);
    }
    Ok(())
}

#[idempotent(store = store)]
async fn handle_async(
    store: &InMemoryStore,
    effects: &AtomicU32,
    env: Envelope,
) -> Result<(), Thrown> {
    tokio::task::yield_now().await;
    effects.fetch_add(1, Ordering::SeqCst);
    if env.data["outcome"] == "throw" {
        return Err(Thrown);
    }
    Ok(())
}

// ---- the runners -------------------------------------------------------------------------

fn run_sync_macro(seq: &Sequence) -> Observed {
    let store = InMemoryStore::new();
    let effects = Cell::new(0);
    let mut runs = Vec::new();
    for d in &seq.deliveries {
        if d.forget_before {
            Store::forget(&store, &d.meta_id).unwrap_or_else(|e| match e {});
        }
        let before = effects.get();
        let result = handle_sync(&store, &effects, &envelope(d));
        assert_eq!(
            result.is_err(),
            d.throws && effects.get() > before,
            "{}",
            seq.name
        );
        runs.push(effects.get() > before);
    }
    Observed {
        runs,
        effects: effects.get(),
    }
}

fn run_sync_hand_written(seq: &Sequence) -> Observed {
    let store = InMemoryStore::new();
    let mut effects = 0;
    let mut runs = Vec::new();
    for d in &seq.deliveries {
        if d.forget_before {
            Store::forget(&store, &d.meta_id).unwrap_or_else(|e| match e {});
        }
        let env = envelope(d);
        let before = effects;
        let result = Guard::new(&store).run(&env, || {
            effects += 1;
            if env.data["outcome"] == "throw" {
                Err(Thrown)
            } else {
                Ok(())
            }
        });
        assert_eq!(
            result.is_err(),
            d.throws && effects > before,
            "{}",
            seq.name
        );
        runs.push(effects > before);
    }
    Observed { runs, effects }
}

async fn run_async_macro(seq: &Sequence) -> Observed {
    let store = InMemoryStore::new();
    let effects = AtomicU32::new(0);
    let mut runs = Vec::new();
    for d in &seq.deliveries {
        if d.forget_before {
            AsyncStore::forget(&store, &d.meta_id)
                .await
                .unwrap_or_else(|e| match e {});
        }
        let before = effects.load(Ordering::SeqCst);
        let result = handle_async(&store, &effects, envelope(d)).await;
        let ran = effects.load(Ordering::SeqCst) > before;
        assert_eq!(result.is_err(), d.throws && ran, "{}", seq.name);
        runs.push(ran);
    }
    Observed {
        runs,
        effects: effects.load(Ordering::SeqCst),
    }
}

async fn run_async_hand_written(seq: &Sequence) -> Observed {
    let store = InMemoryStore::new();
    let effects = AtomicU32::new(0);
    let mut runs = Vec::new();
    for d in &seq.deliveries {
        if d.forget_before {
            AsyncStore::forget(&store, &d.meta_id)
                .await
                .unwrap_or_else(|e| match e {});
        }
        let env = envelope(d);
        let before = effects.load(Ordering::SeqCst);
        let result = Guard::new(&store)
            .run_async(&env, async {
                tokio::task::yield_now().await;
                effects.fetch_add(1, Ordering::SeqCst);
                if env.data["outcome"] == "throw" {
                    Err(Thrown)
                } else {
                    Ok(())
                }
            })
            .await;
        let ran = effects.load(Ordering::SeqCst) > before;
        assert_eq!(result.is_err(), d.throws && ran, "{}", seq.name);
        runs.push(ran);
    }
    Observed {
        runs,
        effects: effects.load(Ordering::SeqCst),
    }
}

fn expected(seq: &Sequence) -> Observed {
    Observed {
        runs: seq.deliveries.iter().map(|d| d.expect_run).collect(),
        effects: seq.expected_effects,
    }
}

#[test]
fn sync_macro_matches_hand_written_guard_and_manifest() {
    for seq in sequences() {
        let by_macro = run_sync_macro(&seq);
        let by_hand = run_sync_hand_written(&seq);
        assert_eq!(by_macro, by_hand, "sequence `{}`: macro vs guard", seq.name);
        assert_eq!(
            by_macro,
            expected(&seq),
            "sequence `{}`: vs manifest",
            seq.name
        );
    }
}

#[tokio::test]
async fn async_macro_matches_hand_written_guard_and_manifest() {
    for seq in sequences() {
        let by_macro = run_async_macro(&seq).await;
        let by_hand = run_async_hand_written(&seq).await;
        assert_eq!(by_macro, by_hand, "sequence `{}`: macro vs guard", seq.name);
        assert_eq!(
            by_macro,
            expected(&seq),
            "sequence `{}`: vs manifest",
            seq.name
        );
    }
}

/// The runners can fail: a sequence whose expectation is flipped is not matched.
#[test]
fn a_wrong_expectation_is_detected() {
    let mut seq = sequences().remove(0);
    seq.expected_effects += 1;
    assert_ne!(run_sync_macro(&seq), expected(&seq));
}
