//! One test suite for every idempotency store (the facade's feature `testing`).
//!
//! The same cases run against the in-memory, SQLite, Redis and PostgreSQL stores of this
//! project, and against yours: implement [`StoreFactory`] (how to make a store for a
//! fresh, isolated namespace) and generate the tests with [`store_suite!`](crate::store_suite).
//!
//! ```
//! use babelqueue_testing::{StoreFactory, StoreSpec};
//! use babelqueue_core::InMemoryStore;
//!
//! struct Memory;
//! impl StoreFactory for Memory {
//!     type Store = InMemoryStore;
//!     async fn create(&self, spec: &StoreSpec) -> InMemoryStore {
//!         match spec.ttl {
//!             Some(ttl) => InMemoryStore::with_ttl(ttl),
//!             None => InMemoryStore::new(),
//!         }
//!     }
//! }
//!
//! // In tests/it/store_memory.rs:
//! babelqueue_testing::store_suite! {
//!     mod memory_suite = Memory;
//!     kinds = [async_store, async_lease, sync_store, sync_lease];
//! }
//! # fn main() {}
//! ```
//!
//! # What it checks
//!
//! * `async_store` / `sync_store` ([`AsyncStore`] / [`Store`]): the conformance
//!   idempotency sequences through the guard; `seen` / `remember` / `forget`; per-call and
//!   default TTL expiry; namespace (prefix / table) isolation; awkward ids (unicode,
//!   spaces, newlines, quotes, SQL and glob metacharacters, [`MAX_ID_LEN`] bytes); ids
//!   that break [the id rule](babelqueue_core::key::id_is_storable) (over [`MAX_ID_LEN`] bytes, or
//!   with a NUL) refused with a typed error before any I/O; 16 concurrent
//!   `remember`s of one id, and, when [`StoreFactory::claim_once`] is given, exactly one
//!   claim winner among them.
//! * `async_lease` / `sync_lease` ([`AsyncLeaseStore`] / [`LeaseStore`]): the sequences
//!   through the lease guard; 16 concurrent deliveries of one id → exactly one effect; a
//!   failed holder lets the next delivery run; an expired lease lets a new claim win; a
//!   stranger's token can neither complete nor release; TTL on completion; an id is
//!   `seen` while held (as on the shared stores, where other SDKs see the held key or
//!   row), not after a release; `forget` drops a held claim; a lease of 300 ms with a
//!   handler of 1.2 s and 8 concurrent deliveries → one run (renewal), the id completed
//!   afterwards; `renew` only for the holder of an unexpired lease; fencing tokens
//!   increase across release, expiry and forget; the id rule on every lease call.
//! * `sync_lease` also runs the renewal case with 8 threads and a blocking handler.
//! * [`renewed_lease_across_processes`]: the same renewal race across two processes.
//! * [`faults`]: the fault kit, a store wrapper that fails chosen calls and a helper that
//!   delivers one envelope n times through the real guard.
//! * [`lease_across_processes`]: two OS processes race on one id (the test binary runs
//!   itself twice): exactly one effect.
//!
//! # Conformance sequences
//!
//! Read from `<dir>/manifest.json` (`idempotency.sequences.cases`, the format of the
//! canonical cross-SDK suite), where `<dir>` is `$BABELQUEUE_CONFORMANCE_DIR` if set, else
//! `tests/conformance-local` of the crate running the tests. Missing data fails the test.

use std::cell::Cell;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;

use babelqueue_core::envelope::Envelope;
use babelqueue_core::guard::{Guard, Guarded, Outcome};
use babelqueue_core::key::{MAX_ID_LEN, UnstorableId, id_is_storable};
use babelqueue_core::lease::{AsyncLeaseStore, Claim, InFlight, LeaseStore, LeaseToken};
use babelqueue_core::store::{AsyncStore, IntoHandlerError, Store};
use babelqueue_core::store_error::find_unstorable_id;
use babelqueue_runtime::handler::{BoxError, BoxFuture};

pub mod faults;

/// Environment variable naming the conformance directory (holding `manifest.json`).
pub const CONFORMANCE_DIR_ENV: &str = "BABELQUEUE_CONFORMANCE_DIR";

/// What the suite asks a factory for: a store on a fresh namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSpec {
    /// A fresh name, unique per store the suite creates (`bqt_` + 20 hex digits, a valid
    /// SQL identifier and Redis prefix). Two specs with the same namespace must give two
    /// views of the same data; different namespaces must never share an id.
    pub namespace: String,
    /// The store's default TTL for remembered ids (`None`: forever).
    pub ttl: Option<Duration>,
}

impl StoreSpec {
    /// A spec with a fresh namespace and no TTL.
    pub fn fresh() -> Self {
        let hex = uuid::Uuid::new_v4().simple().to_string();
        StoreSpec {
            namespace: format!("bqt_{}", &hex[..20]),
            ttl: None,
        }
    }

    /// The same spec with a default TTL.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

/// Makes stores for the suite.
pub trait StoreFactory: Send + Sync + 'static {
    /// The store under test.
    type Store: Send + Sync + 'static;

    /// A store on `spec.namespace` (prefix, table, …) with default TTL `spec.ttl`.
    /// Panic if the backend is unreachable: the test must fail, not skip.
    fn create(&self, spec: &StoreSpec) -> impl Future<Output = Self::Store> + Send;

    /// The store's atomic "remember if absent" (Redis `SET NX`, the SQL
    /// `INSERT … ON CONFLICT … RETURNING`): `Some(future)` resolving to whether this call
    /// added `id`. `None` (the default) when the store has none; the concurrency case then
    /// only checks that concurrent `remember`s leave the id seen.
    fn claim_once<'a>(
        &'a self,
        store: &'a Self::Store,
        id: &'a str,
    ) -> Option<BoxFuture<'a, bool>> {
        let _ = (store, id);
        None
    }

    /// Removes what a passing case left in `spec.namespace` (keys, tables, files).
    fn cleanup(&self, spec: &StoreSpec) -> impl Future<Output = ()> + Send {
        let _ = spec;
        async {}
    }
}

/// Runs `fut` to completion on a fresh multi-threaded tokio runtime (4 workers), so the
/// concurrency cases run in parallel. What the generated tests call.
pub fn run<F: Future>(fut: F) -> F::Output {
    runtime().block_on(fut)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a tokio runtime for the store suite: {e}"))
}

/// The value of a joined task or blocking call; a panic inside it is re-raised with its
/// own message.
fn join<T>(r: Result<T, tokio::task::JoinError>) -> T {
    match r {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("task failed: {e}"),
    }
}

// ---------------------------------------------------------------------------------------
// Conformance sequences
// ---------------------------------------------------------------------------------------

/// One idempotency sequence of the conformance manifest.
#[derive(Debug, Clone, Deserialize)]
pub struct Sequence {
    /// Case name.
    pub name: String,
    /// Deliveries, in order.
    pub deliveries: Vec<Delivery>,
    /// How many deliveries must have invoked the handler.
    pub expected_effects: usize,
}

/// One delivery of a [`Sequence`].
#[derive(Debug, Clone, Deserialize)]
pub struct Delivery {
    /// The envelope's `meta.id` (empty or absent: no usable id).
    #[serde(default)]
    pub meta_id: String,
    /// `run` or `skip`.
    pub expect_effect: Effect,
    /// For a run: `ok` or `throw`.
    #[serde(default)]
    pub outcome: Option<HandlerOutcome>,
    /// Forget the id before this delivery.
    #[serde(default)]
    pub forget_before: bool,
}

/// Whether a delivery runs the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The handler is invoked.
    Run,
    /// The handler is not invoked; the delivery is acked.
    Skip,
}

/// What the handler does when it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandlerOutcome {
    /// Succeeds.
    Ok,
    /// Fails.
    Throw,
}

#[derive(Deserialize)]
struct Manifest {
    idempotency: Idempotency,
}
#[derive(Deserialize)]
struct Idempotency {
    sequences: Sequences,
}
#[derive(Deserialize)]
struct Sequences {
    cases: Vec<Sequence>,
}

/// The conformance directory: `$BABELQUEUE_CONFORMANCE_DIR` if set, else
/// `<manifest_dir>/tests/conformance-local`.
pub fn conformance_dir(manifest_dir: &str) -> PathBuf {
    match std::env::var_os(CONFORMANCE_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(manifest_dir)
            .join("tests")
            .join("conformance-local"),
    }
}

/// Reads the idempotency sequences of `<dir>/manifest.json`.
pub fn load_sequences(dir: &Path) -> Result<Vec<Sequence>, String> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: no idempotency.sequences.cases in the expected format: {e}",
            path.display()
        )
    })?;
    if manifest.idempotency.sequences.cases.is_empty() {
        return Err(format!("{}: no idempotency sequences", path.display()));
    }
    Ok(manifest.idempotency.sequences.cases)
}

/// [`load_sequences`] of [`conformance_dir`], panicking with the reason (what a test
/// wants).
pub fn sequences_for(manifest_dir: &str) -> Vec<Sequence> {
    let dir = conformance_dir(manifest_dir);
    load_sequences(&dir).unwrap_or_else(|e| {
        panic!("store suite: {e} (set {CONFORMANCE_DIR_ENV} to a directory holding the conformance manifest.json)")
    })
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// The error a suite handler fails with.
#[derive(Debug, thiserror::Error)]
#[error("handler failed on purpose (store suite)")]
pub struct Boom;

fn check<T, E: std::fmt::Debug>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what} failed: {e:?}"))
}

fn envelope(meta_id: &str) -> Envelope {
    let mut env = Envelope::new("urn:babel:testing:store-suite", serde_json::json!({}))
        .unwrap_or_else(|e| panic!("building an envelope: {e}"));
    env.meta.id = meta_id.to_owned();
    env
}

fn is_in_flight(e: &BoxError) -> bool {
    e.downcast_ref::<InFlight>().is_some()
}

/// Creates stores for one case and cleans their namespaces up if the case passes.
struct Ctx<'a, F: StoreFactory> {
    factory: &'a F,
    specs: Vec<StoreSpec>,
}

impl<'a, F: StoreFactory> Ctx<'a, F> {
    fn new(factory: &'a F) -> Self {
        Ctx {
            factory,
            specs: Vec::new(),
        }
    }

    async fn store(&mut self, ttl: Option<Duration>) -> F::Store {
        let spec = StoreSpec {
            ttl,
            ..StoreSpec::fresh()
        };
        self.store_for(spec).await
    }

    async fn store_for(&mut self, spec: StoreSpec) -> F::Store {
        let store = self.factory.create(&spec).await;
        if !self.specs.contains(&spec) {
            self.specs.push(spec);
        }
        store
    }

    async fn done(self) {
        for spec in &self.specs {
            self.factory.cleanup(spec).await;
        }
    }
}

/// TTL used by the expiry cases, and how long they wait for it to pass.
const SHORT_TTL: Duration = Duration::from_millis(700);
const PAST_SHORT_TTL: Duration = Duration::from_millis(1500);
const LONG_LEASE: Duration = Duration::from_secs(30);
/// A handler slow enough that concurrent deliveries overlap it.
const SLOW_HANDLER: Duration = Duration::from_millis(300);
/// The short lease of the renewal cases, and a handler far past it.
const SHORT_LEASE: Duration = Duration::from_millis(300);
const HANDLER_PAST_LEASE: Duration = Duration::from_millis(1200);
/// How long a delivery retrying `InFlight` may keep trying.
const RETRY_FOR: Duration = Duration::from_secs(30);

/// The awkward ids: pairs of near-identical spellings that must stay distinct ids (the
/// longest is exactly [`MAX_ID_LEN`] bytes).
pub fn awkward_id_pairs() -> Vec<(String, String)> {
    let mut long = String::with_capacity(MAX_ID_LEN);
    while long.len() < MAX_ID_LEN - 16 {
        long.push_str("order/42 é \"q\" ");
    }
    while long.len() < MAX_ID_LEN {
        long.push('x');
    }
    let mut long_twin = long.clone();
    long_twin.pop();
    long_twin.push('y');
    [
        (
            "f1e2d3c4-b5a6-4789-90ab-cdef01234567",
            "F1E2D3C4-B5A6-4789-90AB-CDEF01234567",
        ),
        ("pay_€_日本語_🦀", "pay_€_日本語_"),
        ("with spaces\tand tab", "with  spaces\tand tab"),
        ("line1\nline2", "line1\r\nline2"),
        ("quote's \"double\" `tick` \\", "quote's \"double\" `tick` "),
        ("x'); DROP TABLE bq; --", "x"),
        ("100% _match_ * ? [a-z]", "100x _match_ * ? [a-z]"),
        ("lease:not-a-lease", "lease:"),
        ("bq:idemp:nested", "bq:idemp:"),
        (" ", "  "),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .chain(std::iter::once((long, long_twin)))
    .collect()
}

// ---------------------------------------------------------------------------------------
// Async cases
// ---------------------------------------------------------------------------------------

/// The cases for an [`AsyncStore`] (`kinds = [async_store]`).
pub mod async_cases {
    use super::*;

    /// Every conformance sequence through [`Guard::run_async`](babelqueue_core::Guard), a fresh store each.
    pub async fn conformance_sequences<F>(factory: F, sequences: Vec<Sequence>)
    where
        F: StoreFactory,
        F::Store: AsyncStore,
        <F::Store as AsyncStore>::Error: IntoHandlerError<BoxError>,
    {
        let mut ctx = Ctx::new(&factory);
        for seq in &sequences {
            let store = ctx.store(None).await;
            let mut effects = 0;
            for (i, d) in seq.deliveries.iter().enumerate() {
                let at = format!("sequence {:?} delivery {i}", seq.name);
                if d.forget_before {
                    check(store.forget(&d.meta_id).await, &at);
                }
                let ran = Cell::new(false);
                let fail = d.outcome == Some(HandlerOutcome::Throw);
                let result = Guard::new(&store)
                    .run_async(&envelope(&d.meta_id), async {
                        ran.set(true);
                        if fail {
                            Err(BoxError::from(Boom))
                        } else {
                            Ok(())
                        }
                    })
                    .await;
                effects += usize::from(ran.get());
                expect_delivery(d, ran.get(), result, &at);
            }
            assert_eq!(
                effects, seq.expected_effects,
                "sequence {:?}: handler invocations",
                seq.name
            );
        }
        ctx.done().await;
    }

    /// seen / remember / forget, and that `remember` of a remembered id changes nothing.
    pub async fn seen_remember_forget<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        assert!(
            !check(s.seen("id-A").await, "seen"),
            "fresh store: id-A not seen"
        );
        check(s.remember("id-A").await, "remember");
        assert!(
            check(s.seen("id-A").await, "seen"),
            "remembered id-A is seen"
        );
        assert!(
            !check(s.seen("id-B").await, "seen"),
            "id-B was never remembered"
        );
        check(s.remember("id-A").await, "remember again");
        assert!(check(s.seen("id-A").await, "seen"), "still seen");
        check(s.forget("id-A").await, "forget");
        assert!(
            !check(s.seen("id-A").await, "seen"),
            "forgotten id-A is not seen"
        );
        check(s.forget("never-remembered").await, "forget of an absent id");
        check(s.remember("id-A").await, "remember after forget");
        assert!(
            check(s.seen("id-A").await, "seen"),
            "re-remembered id-A is seen"
        );
        ctx.done().await;
    }

    /// `remember_for(id, Some(ttl))` expires; `None` with no default never does; an
    /// expired id can be remembered again.
    pub async fn remember_for_ttl_expires<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        check(
            s.remember_for("short", Some(SHORT_TTL)).await,
            "remember_for",
        );
        check(s.remember_for("forever", None).await, "remember_for");
        assert!(check(s.seen("short").await, "seen"), "seen before its TTL");
        tokio::time::sleep(PAST_SHORT_TTL).await;
        assert!(
            !check(s.seen("short").await, "seen"),
            "not seen after its TTL"
        );
        assert!(check(s.seen("forever").await, "seen"), "no TTL: still seen");
        check(s.remember("short").await, "remember an expired id");
        assert!(
            check(s.seen("short").await, "seen"),
            "an expired id is remembered again"
        );
        ctx.done().await;
    }

    /// The store's default TTL applies to `remember`, and a per-call TTL overrides it.
    pub async fn default_ttl_expires<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(Some(SHORT_TTL)).await;
        check(s.remember("default").await, "remember");
        check(
            s.remember_for("longer", Some(Duration::from_secs(120)))
                .await,
            "remember_for",
        );
        assert!(
            check(s.seen("default").await, "seen"),
            "seen before the default TTL"
        );
        tokio::time::sleep(PAST_SHORT_TTL).await;
        assert!(
            !check(s.seen("default").await, "seen"),
            "expired with the default TTL"
        );
        assert!(
            check(s.seen("longer").await, "seen"),
            "the per-call TTL overrides the default"
        );
        ctx.done().await;
    }

    /// Two namespaces (prefixes, tables) never share an id; two stores on one namespace
    /// share them.
    pub async fn namespaces_are_isolated<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncStore,
    {
        let mut ctx = Ctx::new(&factory);
        let a = ctx.store(None).await;
        let b = ctx.store(None).await;
        check(a.remember("shared-id").await, "remember in A");
        assert!(check(a.seen("shared-id").await, "seen"), "seen in A");
        assert!(
            !check(b.seen("shared-id").await, "seen"),
            "A's id leaked into B"
        );
        check(b.remember("shared-id").await, "remember in B");
        check(a.forget("shared-id").await, "forget in A");
        assert!(!check(a.seen("shared-id").await, "seen"), "forgotten in A");
        assert!(
            check(b.seen("shared-id").await, "seen"),
            "A's forget reached B"
        );
        ctx.done().await;
    }

    /// Awkward ids ([`awkward_id_pairs`]) round-trip and stay distinct from their
    /// near-twins.
    pub async fn awkward_ids<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        for (id, twin) in awkward_id_pairs() {
            let at = |what: &str| format!("{what} of {:?}", truncate(&id));
            assert!(
                !check(s.seen(&id).await, &at("seen")),
                "{} seen before",
                at("id")
            );
            check(s.remember(&id).await, &at("remember"));
            assert!(
                check(s.seen(&id).await, &at("seen")),
                "{} not seen",
                at("id")
            );
            assert!(
                !check(s.seen(&twin).await, &at("seen twin")),
                "{:?} seen after remembering {:?}",
                truncate(&twin),
                truncate(&id)
            );
            check(s.remember(&twin).await, &at("remember twin"));
            check(s.forget(&id).await, &at("forget"));
            assert!(
                !check(s.seen(&id).await, &at("seen")),
                "{} still seen",
                at("forgotten id")
            );
            assert!(
                check(s.seen(&twin).await, &at("seen twin")),
                "forgetting {} dropped its twin",
                at("id")
            );
        }
        ctx.done().await;
    }

    /// Ids that break [the id rule](babelqueue_core::key::id_is_storable) (one byte over
    /// [`MAX_ID_LEN`], a NUL) are refused by `seen`, `remember`, `remember_for` and
    /// `forget` with an error whose source chain holds the [`UnstorableId`] reason; an id of
    /// exactly [`MAX_ID_LEN`] bytes is stored. A store that cannot fail (error type
    /// [`Infallible`](std::convert::Infallible), the in-memory store) holds no such id
    /// instead: it is never seen, so the guard fails open for it.
    pub async fn unstorable_ids_are_refused<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        let longest = "é".repeat(MAX_ID_LEN / 2);
        assert_eq!(longest.len(), MAX_ID_LEN);
        check(s.remember(&longest).await, "remember of a MAX_ID_LEN id");
        assert!(
            check(s.seen(&longest).await, "seen"),
            "a MAX_ID_LEN id is stored"
        );
        let fallible = !is_infallible::<<F::Store as AsyncStore>::Error>();
        for bad in unstorable_ids() {
            let why = id_is_storable(&bad).expect_err("the rule refuses it");
            let at = truncate(&bad);
            if fallible {
                expect_unstorable(s.seen(&bad).await, &why, &format!("seen {at:?}"));
                expect_unstorable(s.remember(&bad).await, &why, &format!("remember {at:?}"));
                expect_unstorable(
                    s.remember_for(&bad, Some(LONG_LEASE)).await,
                    &why,
                    &format!("remember_for {at:?}"),
                );
                expect_unstorable(s.forget(&bad).await, &why, &format!("forget {at:?}"));
            } else {
                check(s.remember(&bad).await, "remember");
                assert!(
                    !check(s.seen(&bad).await, "seen"),
                    "{at:?}: an infallible store held an unusable id"
                );
            }
        }
        ctx.done().await;
    }

    /// 16 tasks `remember` one id at once: all succeed and it is seen; with
    /// [`StoreFactory::claim_once`], 16 concurrent claims of a fresh id have exactly one
    /// winner, and after a `forget` exactly one again.
    pub async fn concurrent_remember_one_id<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncStore,
    {
        let factory = Arc::new(factory);
        let mut ctx = Ctx::new(&*factory);
        let store = Arc::new(ctx.store(None).await);
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .remember("contended")
                        .await
                        .map_err(|e| format!("{e:?}"))
                })
            })
            .collect();
        for t in tasks {
            check(join(t.await), "concurrent remember");
        }
        assert!(
            check(store.seen("contended").await, "seen"),
            "contended id is seen"
        );

        if factory.claim_once(&store, "probe-claim").is_some() {
            for round in 0..2 {
                let winners = Arc::new(AtomicUsize::new(0));
                let tasks: Vec<_> = (0..16)
                    .map(|_| {
                        let (store, barrier, factory, winners) = (
                            Arc::clone(&store),
                            Arc::clone(&barrier),
                            Arc::clone(&factory),
                            Arc::clone(&winners),
                        );
                        tokio::spawn(async move {
                            barrier.wait().await;
                            if let Some(claim) = factory.claim_once(&store, "claimed")
                                && claim.await
                            {
                                winners.fetch_add(1, Ordering::SeqCst);
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    join(t.await);
                }
                assert_eq!(
                    winners.load(Ordering::SeqCst),
                    1,
                    "round {round}: claim winners"
                );
                check(store.forget("claimed").await, "forget");
            }
        }
        ctx.done().await;
    }
}

/// Ids that break the id rule: one byte over [`MAX_ID_LEN`], and ids with a NUL.
pub fn unstorable_ids() -> Vec<String> {
    vec![
        "x".repeat(MAX_ID_LEN + 1),
        "a\0b".to_owned(),
        "\0".to_owned(),
    ]
}

fn is_infallible<E: 'static>() -> bool {
    std::any::TypeId::of::<E>() == std::any::TypeId::of::<std::convert::Infallible>()
}

fn expect_unstorable<T: std::fmt::Debug, E: std::error::Error + 'static>(
    r: Result<T, E>,
    why: &UnstorableId,
    at: &str,
) {
    match r {
        Ok(v) => panic!("{at}: an unusable id was accepted ({v:?})"),
        Err(e) => assert_eq!(
            find_unstorable_id(&e),
            Some(why),
            "{at}: the error does not carry the UnstorableId reason: {e:?}"
        ),
    }
}

fn truncate(id: &str) -> String {
    if id.len() <= 40 {
        return id.to_owned();
    }
    let mut end = 40;
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &id[..end], id.len())
}

fn expect_delivery(d: &Delivery, ran: bool, result: Result<Guarded, BoxError>, at: &str) {
    let result = result.map(Outcome::from);
    match d.expect_effect {
        Effect::Run => {
            assert!(ran, "{at}: expected the handler to run");
            match d.outcome {
                Some(HandlerOutcome::Throw) => match result {
                    Err(e) if e.downcast_ref::<Boom>().is_some() => {}
                    other => panic!("{at}: expected the handler's error, got {other:?}"),
                },
                _ => {
                    let out = result.unwrap_or_else(|e| panic!("{at}: guard failed: {e:?}"));
                    assert!(
                        matches!(out, Outcome::Ran | Outcome::RanWithoutKey),
                        "{at}: outcome {out:?}"
                    );
                    if d.meta_id.is_empty() {
                        assert_eq!(out, Outcome::RanWithoutKey, "{at}: no id fails open");
                    }
                }
            }
        }
        Effect::Skip => {
            assert!(!ran, "{at}: expected a skip, the handler ran");
            let out = result.unwrap_or_else(|e| panic!("{at}: guard failed: {e:?}"));
            assert_eq!(out, Outcome::Skipped, "{at}");
        }
    }
}

/// The cases for an [`AsyncLeaseStore`] (`kinds = [async_lease]`).
pub mod async_lease_cases {
    use super::*;

    /// Every conformance sequence through the lease-mode [`Guard`] (async).
    pub async fn lease_conformance_sequences<F>(factory: F, sequences: Vec<Sequence>)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
        <F::Store as AsyncStore>::Error: IntoHandlerError<BoxError>,
    {
        let mut ctx = Ctx::new(&factory);
        for seq in &sequences {
            let store = ctx.store(None).await;
            let mut effects = 0;
            for (i, d) in seq.deliveries.iter().enumerate() {
                let at = format!("lease sequence {:?} delivery {i}", seq.name);
                if d.forget_before {
                    check(store.forget(&d.meta_id).await, &at);
                }
                let ran = Cell::new(false);
                let fail = d.outcome == Some(HandlerOutcome::Throw);
                let result = Guard::new(&store)
                    .lease(LONG_LEASE)
                    .run_async(&envelope(&d.meta_id), async {
                        ran.set(true);
                        if fail {
                            Err(BoxError::from(Boom))
                        } else {
                            Ok(())
                        }
                    })
                    .await;
                effects += usize::from(ran.get());
                expect_delivery(d, ran.get(), result, &at);
            }
            assert_eq!(
                effects, seq.expected_effects,
                "lease sequence {:?}",
                seq.name
            );
        }
        ctx.done().await;
    }

    /// 16 concurrent deliveries of one id (a slow handler; `InFlight` deliveries retry):
    /// exactly one effect, one `Ran`, fifteen `Skipped`, and some delivery saw `InFlight`.
    pub async fn lease_one_effect_across_16_tasks<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
        <F::Store as AsyncStore>::Error: IntoHandlerError<BoxError>,
    {
        let mut ctx = Ctx::new(&factory);
        let store = Arc::new(ctx.store(None).await);
        let (ran, skipped, in_flight) =
            race_deliveries(Arc::clone(&store), "one-effect", 16, true, Race::LONG).await;
        assert_eq!(ran, 1, "exactly one effect");
        assert_eq!(
            skipped, 15,
            "every other delivery skipped once it completed"
        );
        assert!(
            in_flight > 0,
            "no delivery saw the id in flight: the race did not happen"
        );
        ctx.done().await;
    }

    /// A holder that fails releases its claim: the id is not seen and the next delivery
    /// runs; a released token can no longer release.
    pub async fn lease_failed_holder_lets_next_run<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
        <F::Store as AsyncStore>::Error: IntoHandlerError<BoxError>,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        let r = Guard::new(&s)
            .lease(LONG_LEASE)
            .run_async("fails-once", async { Err::<(), BoxError>(Boom.into()) })
            .await;
        assert!(
            matches!(&r, Err(e) if e.downcast_ref::<Boom>().is_some()),
            "{r:?}"
        );
        assert!(
            !check(s.seen("fails-once").await, "seen"),
            "a failed delivery left the id marked"
        );
        let r = Guard::new(&s)
            .lease(LONG_LEASE)
            .run_async("fails-once", async { Ok::<(), BoxError>(()) })
            .await;
        assert_eq!(check(r, "second delivery"), Outcome::Ran);
        let r = Guard::new(&s)
            .lease(LONG_LEASE)
            .run_async("fails-once", async { Ok::<(), BoxError>(()) })
            .await;
        assert_eq!(check(r, "third delivery"), Outcome::Skipped);

        let Claim::Acquired(t) = check(s.claim("released", LONG_LEASE).await, "claim") else {
            panic!("a fresh id must be acquired")
        };
        assert!(
            check(s.release("released", &t).await, "release"),
            "the holder releases"
        );
        assert!(
            !check(s.release("released", &t).await, "release"),
            "released twice"
        );
        assert!(matches!(
            check(s.claim("released", LONG_LEASE).await, "claim"),
            Claim::Acquired(_)
        ));
        ctx.done().await;
    }

    /// A lease that ends (the holder died) lets a new claim win; the old holder can then
    /// neither complete nor release.
    pub async fn lease_expired_lets_new_claim_win<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        let Claim::Acquired(old) = check(s.claim("abandoned", SHORT_TTL).await, "claim") else {
            panic!("a fresh id must be acquired")
        };
        assert_eq!(
            check(s.claim("abandoned", LONG_LEASE).await, "claim"),
            Claim::InFlight
        );
        tokio::time::sleep(PAST_SHORT_TTL).await;
        assert!(
            !check(s.seen("abandoned").await, "seen"),
            "an expired claim is still seen"
        );
        let Claim::Acquired(new) = check(s.claim("abandoned", LONG_LEASE).await, "claim") else {
            panic!("an expired lease must let a new claim win")
        };
        assert_ne!(old, new);
        assert!(
            !check(s.complete("abandoned", &old, None).await, "complete"),
            "the old holder completed"
        );
        assert!(
            !check(s.release("abandoned", &old).await, "release"),
            "the old holder released"
        );
        assert_eq!(
            check(s.claim("abandoned", LONG_LEASE).await, "claim"),
            Claim::InFlight
        );
        assert!(check(s.complete("abandoned", &new, None).await, "complete"));
        assert_eq!(
            check(s.claim("abandoned", LONG_LEASE).await, "claim"),
            Claim::Completed
        );
        ctx.done().await;
    }

    /// A token that does not hold the claim cannot complete or release it, and a late
    /// `release` never un-completes an id.
    pub async fn lease_stranger_token_cannot_finish<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        let Claim::Acquired(t) = check(s.claim("held", LONG_LEASE).await, "claim") else {
            panic!("a fresh id must be acquired")
        };
        let stranger = LeaseToken::new();
        assert!(
            !check(s.complete("held", &stranger, None).await, "complete"),
            "a stranger completed"
        );
        assert!(
            !check(s.release("held", &stranger).await, "release"),
            "a stranger released"
        );
        assert!(
            !check(s.complete("never-claimed", &t, None).await, "complete"),
            "completed an unclaimed id"
        );
        assert_eq!(
            check(s.claim("held", LONG_LEASE).await, "claim"),
            Claim::InFlight
        );
        assert!(
            check(s.complete("held", &t, None).await, "complete"),
            "the holder completes"
        );
        assert!(
            !check(s.complete("held", &t, None).await, "complete"),
            "completed twice"
        );
        assert!(
            !check(s.release("held", &t).await, "release"),
            "released a completed id"
        );
        assert_eq!(
            check(s.claim("held", LONG_LEASE).await, "claim"),
            Claim::Completed
        );
        assert!(
            check(s.seen("held").await, "seen"),
            "a completed id is seen"
        );
        ctx.done().await;
    }

    /// `complete` with a TTL (or the store's default) expires; then the id runs again.
    pub async fn lease_complete_ttl_expires<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(Some(SHORT_TTL)).await;
        for (id, ttl) in [("per-call", Some(SHORT_TTL)), ("default", None)] {
            let Claim::Acquired(t) = check(s.claim(id, LONG_LEASE).await, "claim") else {
                panic!("a fresh id must be acquired")
            };
            assert!(check(s.complete(id, &t, ttl).await, "complete"));
        }
        let Claim::Acquired(t) = check(s.claim("kept", LONG_LEASE).await, "claim") else {
            panic!("a fresh id must be acquired")
        };
        assert!(check(
            s.complete("kept", &t, Some(Duration::from_secs(120))).await,
            "complete"
        ));
        assert_eq!(
            check(s.claim("per-call", LONG_LEASE).await, "claim"),
            Claim::Completed
        );
        tokio::time::sleep(PAST_SHORT_TTL).await;
        for id in ["per-call", "default"] {
            assert!(
                !check(s.seen(id).await, "seen"),
                "{id}: completed id did not expire"
            );
            assert!(
                matches!(
                    check(s.claim(id, LONG_LEASE).await, "claim"),
                    Claim::Acquired(_)
                ),
                "{id}"
            );
        }
        assert_eq!(
            check(s.claim("kept", LONG_LEASE).await, "claim"),
            Claim::Completed
        );
        ctx.done().await;
    }

    /// A held id is seen (what other SDKs see on the shared stores), a released one is
    /// not; `forget` drops a held claim, so its holder can no longer complete.
    pub async fn lease_visibility_and_forget<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        let Claim::Acquired(t) = check(s.claim("visible", LONG_LEASE).await, "claim") else {
            panic!("a fresh id must be acquired")
        };
        assert!(check(s.seen("visible").await, "seen"), "a held id is seen");
        assert!(check(s.release("visible", &t).await, "release"));
        assert!(
            !check(s.seen("visible").await, "seen"),
            "a released id is not seen"
        );

        let Claim::Acquired(t) = check(s.claim("forgotten", LONG_LEASE).await, "claim") else {
            panic!("a fresh id must be acquired")
        };
        check(s.forget("forgotten").await, "forget");
        assert!(!check(s.seen("forgotten").await, "seen"));
        assert!(
            !check(s.complete("forgotten", &t, None).await, "complete"),
            "completed a forgotten claim"
        );
        assert!(matches!(
            check(s.claim("forgotten", LONG_LEASE).await, "claim"),
            Claim::Acquired(_)
        ));
        ctx.done().await;
    }
}

/// The renewal, fencing and id-rule cases for an [`AsyncLeaseStore`] (part of
/// `kinds = [async_lease]`).
pub mod async_renewal_cases {
    use super::*;

    /// A lease of 300 ms, a handler of 1.2 s, 8 concurrent deliveries of one id: the
    /// lease is renewed while the handler runs, so exactly one delivery runs it and seven
    /// skip once it completed; the id is completed afterwards.
    pub async fn renewed_lease_one_run_across_8_tasks<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
        <F::Store as AsyncStore>::Error: IntoHandlerError<BoxError>,
    {
        let mut ctx = Ctx::new(&factory);
        let store = Arc::new(ctx.store(None).await);
        let (ran, skipped, in_flight) =
            race_deliveries(Arc::clone(&store), "renewed", 8, true, Race::RENEWED).await;
        assert_eq!(
            ran, 1,
            "exactly one run although the handler outlived its lease"
        );
        assert_eq!(skipped, 7, "every other delivery skipped once it completed");
        assert!(in_flight > 0, "the race did not happen");
        assert_eq!(
            check(store.claim("renewed", LONG_LEASE).await, "claim"),
            Claim::Completed,
            "the id is remembered afterwards"
        );
        ctx.done().await;
    }

    /// `renew` extends the holder's lease past its first end; a stranger, a released or
    /// a completed claim cannot be renewed.
    pub async fn renew_extends_only_the_holders_lease<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        let Claim::Acquired(t) = check(s.claim("renewed", SHORT_TTL).await, "claim") else {
            panic!("a fresh id must be acquired")
        };
        assert!(check(s.renew("renewed", &t, LONG_LEASE).await, "renew"));
        assert!(
            !check(
                s.renew("renewed", &LeaseToken::new(), LONG_LEASE).await,
                "renew"
            ),
            "a stranger renewed"
        );
        tokio::time::sleep(PAST_SHORT_TTL).await;
        assert_eq!(
            check(s.claim("renewed", LONG_LEASE).await, "claim"),
            Claim::InFlight,
            "the renewed lease ended with its first length"
        );
        assert!(
            check(s.seen("renewed").await, "seen"),
            "a renewed claim is seen"
        );
        assert!(check(s.complete("renewed", &t, None).await, "complete"));
        assert!(
            !check(s.renew("renewed", &t, LONG_LEASE).await, "renew"),
            "renewed a completed id"
        );
        let Claim::Acquired(t) = check(s.claim("released", LONG_LEASE).await, "claim") else {
            panic!("a fresh id must be acquired")
        };
        assert!(check(s.release("released", &t).await, "release"));
        assert!(
            !check(s.renew("released", &t, LONG_LEASE).await, "renew"),
            "renewed a released claim"
        );
        let Claim::Acquired(t) = check(s.claim("lapsed", SHORT_TTL).await, "claim") else {
            panic!("a fresh id must be acquired")
        };
        tokio::time::sleep(PAST_SHORT_TTL).await;
        assert!(
            !check(s.renew("lapsed", &t, LONG_LEASE).await, "renew"),
            "renewed a lease that had ended"
        );
        ctx.done().await;
    }

    /// Every claim carries a fencing token, larger for every later claim of the same id:
    /// after a release, after a lease that ended, after a completed id was forgotten.
    pub async fn fencing_tokens_increase<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        let mut last = 0;
        let mut next = |claim: Claim, what: &str| -> LeaseToken {
            let Claim::Acquired(t) = claim else {
                panic!("{what}: expected an acquired claim, got {claim:?}")
            };
            let fence = t
                .fence()
                .unwrap_or_else(|| panic!("{what}: no fencing token"));
            assert!(fence > last, "{what}: fencing token {fence} after {last}");
            last = fence;
            t
        };
        let t = next(
            check(s.claim("f", LONG_LEASE).await, "claim"),
            "first claim",
        );
        assert!(check(s.release("f", &t).await, "release"));
        let _t = next(
            check(s.claim("f", SHORT_TTL).await, "claim"),
            "after release",
        );
        tokio::time::sleep(PAST_SHORT_TTL).await;
        let t = next(
            check(s.claim("f", LONG_LEASE).await, "claim"),
            "after expiry",
        );
        assert!(check(s.complete("f", &t, None).await, "complete"));
        check(s.forget("f").await, "forget");
        next(
            check(s.claim("f", LONG_LEASE).await, "claim"),
            "after forget",
        );
        ctx.done().await;
    }

    /// `claim`, `complete`, `release` and `renew` refuse ids that break the id rule with
    /// an error carrying the [`UnstorableId`] reason (a store that cannot fail never holds
    /// them: not seen after a claim).
    pub async fn lease_unstorable_ids_are_refused<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: AsyncLeaseStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = ctx.store(None).await;
        let fallible = !is_infallible::<<F::Store as AsyncStore>::Error>();
        let token = LeaseToken::new();
        for bad in unstorable_ids() {
            let why = id_is_storable(&bad).expect_err("the rule refuses it");
            let at = truncate(&bad);
            if fallible {
                expect_unstorable(
                    s.claim(&bad, LONG_LEASE).await,
                    &why,
                    &format!("claim {at:?}"),
                );
                expect_unstorable(
                    s.complete(&bad, &token, None).await,
                    &why,
                    &format!("complete {at:?}"),
                );
                expect_unstorable(
                    s.release(&bad, &token).await,
                    &why,
                    &format!("release {at:?}"),
                );
                expect_unstorable(
                    s.renew(&bad, &token, LONG_LEASE).await,
                    &why,
                    &format!("renew {at:?}"),
                );
            } else {
                check(s.claim(&bad, LONG_LEASE).await, "claim");
                assert!(!check(s.seen(&bad).await, "seen"), "{at:?} held");
            }
        }
        ctx.done().await;
    }
}

/// The renewal case for a blocking [`LeaseStore`] (part of `kinds = [sync_lease]`).
pub mod sync_renewal_cases {
    use super::*;

    /// A lease of 300 ms, a blocking handler of 1.2 s, 8 threads delivering one id: the
    /// guard's renewal thread keeps the lease, so exactly one thread runs it; the id is
    /// completed afterwards.
    pub async fn sync_renewed_lease_one_run_across_8_threads<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: LeaseStore,
        <F::Store as Store>::Error: IntoHandlerError<BoxError>,
    {
        let mut ctx = Ctx::new(&factory);
        let s = Arc::new(ctx.store(None).await);
        join(
            tokio::task::spawn_blocking(move || {
                let barrier = std::sync::Barrier::new(8);
                let effects = AtomicUsize::new(0);
                let (ran, skipped) = (AtomicUsize::new(0), AtomicUsize::new(0));
                std::thread::scope(|scope| {
                    for _ in 0..8 {
                        scope.spawn(|| {
                            barrier.wait();
                            let started = Instant::now();
                            loop {
                                let r = Guard::new(&*s).lease(SHORT_LEASE).run("renewed", || {
                                    effects.fetch_add(1, Ordering::SeqCst);
                                    assert!(
                                        babelqueue_core::lease::current_fencing_token().is_some()
                                    );
                                    std::thread::sleep(HANDLER_PAST_LEASE);
                                    Ok::<(), BoxError>(())
                                });
                                match r.map(Outcome::from) {
                                    Ok(Outcome::Ran) => {
                                        ran.fetch_add(1, Ordering::SeqCst);
                                        return;
                                    }
                                    Ok(Outcome::Skipped) => {
                                        skipped.fetch_add(1, Ordering::SeqCst);
                                        return;
                                    }
                                    Ok(other) => panic!("unexpected outcome {other:?}"),
                                    Err(e) if is_in_flight(&e) && started.elapsed() < RETRY_FOR => {
                                        std::thread::sleep(Duration::from_millis(25));
                                    }
                                    Err(e) => panic!("delivery failed: {e:?}"),
                                }
                            }
                        });
                    }
                });
                assert_eq!(effects.load(Ordering::SeqCst), 1, "exactly one run");
                assert_eq!(ran.load(Ordering::SeqCst), 1);
                assert_eq!(skipped.load(Ordering::SeqCst), 7);
                assert_eq!(
                    check(s.claim("renewed", LONG_LEASE), "claim"),
                    Claim::Completed
                );
            })
            .await,
        );
        ctx.done().await;
    }
}

/// Races `n` deliveries of `id` through the lease-mode [`Guard`] (async) with a slow handler;
/// deliveries told `InFlight` retry. Returns (ran, skipped, in-flight answers seen).
/// The lease and the handler's duration of a race.
#[derive(Debug, Clone, Copy)]
struct Race {
    lease: Duration,
    handler: Duration,
}

impl Race {
    /// A lease far longer than the handler.
    const LONG: Race = Race {
        lease: LONG_LEASE,
        handler: SLOW_HANDLER,
    };
    /// A handler several times longer than its lease: only renewal keeps it alone.
    const RENEWED: Race = Race {
        lease: SHORT_LEASE,
        handler: HANDLER_PAST_LEASE,
    };
}

async fn race_deliveries<S>(
    store: Arc<S>,
    id: &str,
    n: usize,
    same_process: bool,
    race: Race,
) -> (usize, usize, usize)
where
    S: AsyncLeaseStore + 'static,
    S::Error: IntoHandlerError<BoxError>,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let effects = Arc::new(AtomicUsize::new(0));
    // Set when the handler has finished: a `Skipped` earlier means the store called an
    // id completed while its holder was still running.
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (store, barrier, effects, finished, id) = (
                Arc::clone(&store),
                Arc::clone(&barrier),
                Arc::clone(&effects),
                Arc::clone(&finished),
                id.to_owned(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                let started = Instant::now();
                let mut in_flight = 0;
                loop {
                    let (effects, done) = (Arc::clone(&effects), Arc::clone(&finished));
                    let r = Guard::new(&*store)
                        .lease(race.lease)
                        .run_async(id.as_str(), async move {
                            effects.fetch_add(1, Ordering::SeqCst);
                            assert!(
                                babelqueue_core::lease::current_fencing_token().is_some(),
                                "no fencing token inside the leased handler"
                            );
                            tokio::time::sleep(race.handler).await;
                            done.store(true, Ordering::SeqCst);
                            Ok::<(), BoxError>(())
                        })
                        .await;
                    match r.map(Outcome::from) {
                        Ok(Outcome::Skipped) => {
                            // (Only meaningful when the holder runs in this process.)
                            assert!(
                                !same_process || finished.load(Ordering::SeqCst),
                                "skipped as completed while the holder was still running"
                            );
                            return (Outcome::Skipped, in_flight);
                        }
                        Ok(out) => return (out, in_flight),
                        Err(e) if is_in_flight(&e) && started.elapsed() < RETRY_FOR => {
                            in_flight += 1;
                            tokio::time::sleep(Duration::from_millis(25)).await;
                        }
                        Err(e) => panic!("delivery failed: {e:?}"),
                    }
                }
            })
        })
        .collect();
    let (mut ran, mut skipped, mut in_flight) = (0, 0, 0);
    for t in tasks {
        let (out, seen_in_flight) = join(t.await);
        in_flight += seen_in_flight;
        match out {
            Outcome::Ran => ran += 1,
            Outcome::Skipped => skipped += 1,
            Outcome::RanWithoutKey => panic!("a keyed delivery ran without key"),
        }
    }
    assert_eq!(
        effects.load(Ordering::SeqCst),
        ran,
        "handler invocations vs Ran outcomes"
    );
    (ran, skipped, in_flight)
}

// ---------------------------------------------------------------------------------------
// Sync cases
// ---------------------------------------------------------------------------------------

/// The cases for a blocking [`Store`] (`kinds = [sync_store]`).
pub mod sync_cases {
    use super::*;

    /// Every conformance sequence through the blocking [`Guard::run`](babelqueue_core::Guard).
    pub async fn sync_conformance_sequences<F>(factory: F, sequences: Vec<Sequence>)
    where
        F: StoreFactory,
        F::Store: Store,
        <F::Store as Store>::Error: IntoHandlerError<BoxError>,
    {
        let mut ctx = Ctx::new(&factory);
        for seq in &sequences {
            let store = ctx.store(None).await;
            let seq = seq.clone();
            let store = Arc::new(store);
            join(
                tokio::task::spawn_blocking(move || {
                    let mut effects = 0;
                    for (i, d) in seq.deliveries.iter().enumerate() {
                        let at = format!("sync sequence {:?} delivery {i}", seq.name);
                        if d.forget_before {
                            check(store.forget(&d.meta_id), &at);
                        }
                        let mut ran = false;
                        let fail = d.outcome == Some(HandlerOutcome::Throw);
                        let result = Guard::new(&*store).run(&envelope(&d.meta_id), || {
                            ran = true;
                            if fail {
                                Err(BoxError::from(Boom))
                            } else {
                                Ok(())
                            }
                        });
                        effects += usize::from(ran);
                        expect_delivery(d, ran, result, &at);
                    }
                    assert_eq!(
                        effects, seq.expected_effects,
                        "sync sequence {:?}",
                        seq.name
                    );
                })
                .await,
            );
        }
        ctx.done().await;
    }

    /// Blocking seen / remember / forget and TTL expiry.
    pub async fn sync_seen_remember_forget_ttl<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: Store,
    {
        let mut ctx = Ctx::new(&factory);
        let s = Arc::new(ctx.store(None).await);
        join(
            tokio::task::spawn_blocking(move || {
                assert!(!check(s.seen("id-A"), "seen"));
                check(s.remember("id-A"), "remember");
                assert!(check(s.seen("id-A"), "seen"));
                check(s.forget("id-A"), "forget");
                assert!(!check(s.seen("id-A"), "seen"));
                check(s.remember_for("short", Some(SHORT_TTL)), "remember_for");
                assert!(check(s.seen("short"), "seen"));
                std::thread::sleep(PAST_SHORT_TTL);
                assert!(!check(s.seen("short"), "seen"), "not seen after its TTL");
            })
            .await,
        );
        ctx.done().await;
    }

    /// 16 threads `remember` one id at once: all succeed, it is seen.
    pub async fn sync_concurrent_remember_16_threads<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: Store,
    {
        let mut ctx = Ctx::new(&factory);
        let s = Arc::new(ctx.store(None).await);
        join(
            tokio::task::spawn_blocking(move || {
                let barrier = std::sync::Barrier::new(16);
                std::thread::scope(|scope| {
                    for _ in 0..16 {
                        scope.spawn(|| {
                            barrier.wait();
                            check(s.remember("contended"), "concurrent remember");
                        });
                    }
                });
                assert!(check(s.seen("contended"), "seen"));
            })
            .await,
        );
        ctx.done().await;
    }
}

/// The cases for a blocking [`LeaseStore`] (`kinds = [sync_lease]`).
pub mod sync_lease_cases {
    use super::*;

    /// Every conformance sequence through the blocking lease-mode [`Guard`].
    pub async fn sync_lease_conformance_sequences<F>(factory: F, sequences: Vec<Sequence>)
    where
        F: StoreFactory,
        F::Store: LeaseStore,
        <F::Store as Store>::Error: IntoHandlerError<BoxError>,
    {
        let mut ctx = Ctx::new(&factory);
        for seq in &sequences {
            let store = Arc::new(ctx.store(None).await);
            let seq = seq.clone();
            join(
                tokio::task::spawn_blocking(move || {
                    let mut effects = 0;
                    for (i, d) in seq.deliveries.iter().enumerate() {
                        let at = format!("sync lease sequence {:?} delivery {i}", seq.name);
                        if d.forget_before {
                            check(store.forget(&d.meta_id), &at);
                        }
                        let mut ran = false;
                        let fail = d.outcome == Some(HandlerOutcome::Throw);
                        let result = Guard::new(&*store).lease(LONG_LEASE).run(
                            &envelope(&d.meta_id),
                            || {
                                ran = true;
                                if fail {
                                    Err(BoxError::from(Boom))
                                } else {
                                    Ok(())
                                }
                            },
                        );
                        effects += usize::from(ran);
                        expect_delivery(d, ran, result, &at);
                    }
                    assert_eq!(
                        effects, seq.expected_effects,
                        "sync lease sequence {:?}",
                        seq.name
                    );
                })
                .await,
            );
        }
        ctx.done().await;
    }

    /// 16 threads deliver one id at once through the lease-mode [`Guard`]: exactly one effect.
    pub async fn sync_lease_one_effect_across_16_threads<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: LeaseStore,
        <F::Store as Store>::Error: IntoHandlerError<BoxError>,
    {
        let mut ctx = Ctx::new(&factory);
        let s = Arc::new(ctx.store(None).await);
        join(
            tokio::task::spawn_blocking(move || {
                let barrier = std::sync::Barrier::new(16);
                let effects = AtomicUsize::new(0);
                let finished = std::sync::atomic::AtomicBool::new(false);
                let (ran, skipped, in_flight) = (
                    AtomicUsize::new(0),
                    AtomicUsize::new(0),
                    AtomicUsize::new(0),
                );
                std::thread::scope(|scope| {
                    for _ in 0..16 {
                        scope.spawn(|| {
                            barrier.wait();
                            let started = Instant::now();
                            loop {
                                let r = Guard::new(&*s).lease(LONG_LEASE).run("one-effect", || {
                                    effects.fetch_add(1, Ordering::SeqCst);
                                    std::thread::sleep(SLOW_HANDLER);
                                    finished.store(true, Ordering::SeqCst);
                                    Ok::<(), BoxError>(())
                                });
                                match r.map(Outcome::from) {
                                    Ok(Outcome::Ran) => {
                                        ran.fetch_add(1, Ordering::SeqCst);
                                        return;
                                    }
                                    Ok(Outcome::Skipped) => {
                                        assert!(
                                            finished.load(Ordering::SeqCst),
                                            "skipped as completed while the holder was running"
                                        );
                                        skipped.fetch_add(1, Ordering::SeqCst);
                                        return;
                                    }
                                    Ok(other) => panic!("unexpected outcome {other:?}"),
                                    Err(e) if is_in_flight(&e) && started.elapsed() < RETRY_FOR => {
                                        in_flight.fetch_add(1, Ordering::SeqCst);
                                        std::thread::sleep(Duration::from_millis(25));
                                    }
                                    Err(e) => panic!("delivery failed: {e:?}"),
                                }
                            }
                        });
                    }
                });
                assert_eq!(effects.load(Ordering::SeqCst), 1, "exactly one effect");
                assert_eq!(ran.load(Ordering::SeqCst), 1);
                assert_eq!(skipped.load(Ordering::SeqCst), 15);
                assert!(
                    in_flight.load(Ordering::SeqCst) > 0,
                    "the race did not happen"
                );
            })
            .await,
        );
        ctx.done().await;
    }

    /// Blocking claim / complete / release: stranger tokens, expiry, completion.
    pub async fn sync_lease_tokens_and_expiry<F>(factory: F)
    where
        F: StoreFactory,
        F::Store: LeaseStore,
    {
        let mut ctx = Ctx::new(&factory);
        let s = Arc::new(ctx.store(None).await);
        join(
            tokio::task::spawn_blocking(move || {
                let Claim::Acquired(old) = check(s.claim("x", SHORT_TTL), "claim") else {
                    panic!("a fresh id must be acquired")
                };
                assert_eq!(check(s.claim("x", LONG_LEASE), "claim"), Claim::InFlight);
                assert!(check(s.seen("x"), "seen"), "a held id is seen");
                let stranger = LeaseToken::new();
                assert!(!check(s.complete("x", &stranger, None), "complete"));
                assert!(!check(s.release("x", &stranger), "release"));
                std::thread::sleep(PAST_SHORT_TTL);
                let Claim::Acquired(new) = check(s.claim("x", LONG_LEASE), "claim") else {
                    panic!("an expired lease must let a new claim win")
                };
                assert!(
                    !check(s.complete("x", &old, None), "complete"),
                    "expired holder completed"
                );
                assert!(check(s.complete("x", &new, None), "complete"));
                assert!(
                    !check(s.release("x", &new), "release"),
                    "released a completed id"
                );
                assert_eq!(check(s.claim("x", LONG_LEASE), "claim"), Claim::Completed);
            })
            .await,
        );
        ctx.done().await;
    }
}

// ---------------------------------------------------------------------------------------
// Two processes
// ---------------------------------------------------------------------------------------

const CHILD_ENV: &str = "BABELQUEUE_SUITE_CHILD";
const NS_ENV: &str = "BABELQUEUE_SUITE_NAMESPACE";
const ID_ENV: &str = "BABELQUEUE_SUITE_ID";
const START_ENV: &str = "BABELQUEUE_SUITE_START_MS";
const RESULT_TAG: &str = "BABELQUEUE_SUITE_RESULT";
const TASKS_PER_PROCESS: usize = 8;

/// Lease mode across two OS processes: the test binary runs itself twice (as
/// `<exe> <test_name> --exact --include-ignored --nocapture`, with environment variables
/// telling the copies they are children); both race [`TASKS_PER_PROCESS`](self) = 8
/// deliveries each of one id on one namespace, starting at the same instant; exactly
/// one delivery in all runs the handler and the other fifteen skip.
///
/// Call it from a test function named `test_name` (its full path as libtest prints it)
/// that does nothing else; in the children the same call plays the child's part.
pub fn lease_across_processes<F>(factory: F, test_name: &str)
where
    F: StoreFactory,
    F::Store: AsyncLeaseStore,
    <F::Store as AsyncStore>::Error: IntoHandlerError<BoxError>,
{
    race_across_processes(factory, test_name, Race::LONG);
}

/// [`lease_across_processes`] with a lease of 300 ms and a handler of 1.2 s: only the
/// renewal of the lease while the handler runs keeps the other fifteen deliveries (in two
/// processes) from running it too. Exactly one run, fifteen skips, and the id completed
/// afterwards (a later claim answers [`Claim::Completed`]).
pub fn renewed_lease_across_processes<F>(factory: F, test_name: &str)
where
    F: StoreFactory,
    F::Store: AsyncLeaseStore,
    <F::Store as AsyncStore>::Error: IntoHandlerError<BoxError>,
{
    race_across_processes(factory, test_name, Race::RENEWED);
}

fn race_across_processes<F>(factory: F, test_name: &str, race: Race)
where
    F: StoreFactory,
    F::Store: AsyncLeaseStore,
    <F::Store as AsyncStore>::Error: IntoHandlerError<BoxError>,
{
    if std::env::var_os(CHILD_ENV).is_some() {
        return run(child(factory, race));
    }
    let rt = runtime();
    let spec = StoreSpec::fresh();
    let id = format!("xproc-{}", uuid::Uuid::new_v4());
    // Make the namespace (tables…) before the children start.
    let parent_store = rt.block_on(factory.create(&spec));
    let start = babelqueue_core::envelope::now_millis() + 3000;
    let exe = std::env::current_exe()
        .unwrap_or_else(|e| panic!("cannot find the test binary to re-run: {e}"));
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([test_name, "--exact", "--include-ignored", "--nocapture"])
                .args(["--test-threads", "1"])
                .env(CHILD_ENV, "1")
                .env(NS_ENV, &spec.namespace)
                .env(ID_ENV, &id)
                .env(START_ENV, start.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start a child process: {e}"))
        })
        .collect();
    let (mut ran, mut skipped, mut in_flight) = (0, 0, 0);
    for child in children {
        let out = wait_with_deadline(child, Duration::from_secs(90));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find_map(|l| l.find(RESULT_TAG).map(|at| &l[at + RESULT_TAG.len()..]))
            .unwrap_or_else(|| {
                panic!(
                    "child printed no result (was {test_name:?} the test's exact name?):\n{stdout}"
                )
            });
        let nums: Vec<usize> = line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('=').and_then(|(_, v)| v.parse().ok()))
            .collect();
        let [r, s, f] = nums[..] else {
            panic!("bad child result line {line:?}")
        };
        ran += r;
        skipped += s;
        in_flight += f;
    }
    assert_eq!(ran, 1, "exactly one effect across two processes");
    assert_eq!(
        skipped,
        2 * TASKS_PER_PROCESS - 1,
        "every other delivery skipped"
    );
    assert!(
        in_flight > 0,
        "no delivery saw the id in flight: the race did not happen"
    );
    let claim = rt.block_on(async { parent_store.claim(&id, LONG_LEASE).await });
    assert_eq!(check(claim, "claim after the race"), Claim::Completed);
    rt.block_on(factory.cleanup(&spec));
}

async fn child<F>(factory: F, race: Race)
where
    F: StoreFactory,
    F::Store: AsyncLeaseStore,
    <F::Store as AsyncStore>::Error: IntoHandlerError<BoxError>,
{
    let var =
        |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("child: {name} is not set"));
    let spec = StoreSpec {
        namespace: var(NS_ENV),
        ttl: None,
    };
    let id = var(ID_ENV);
    let start: i64 = var(START_ENV)
        .parse()
        .unwrap_or_else(|e| panic!("child: bad {START_ENV}: {e}"));
    let store = Arc::new(factory.create(&spec).await);
    let wait = start - babelqueue_core::envelope::now_millis();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())).await;
    }
    let (ran, skipped, in_flight) =
        race_deliveries(store, &id, TASKS_PER_PROCESS, false, race).await;
    println!("\n{RESULT_TAG} ran={ran} skipped={skipped} in_flight={in_flight}");
}

fn wait_with_deadline(mut child: std::process::Child, limit: Duration) -> std::process::Output {
    use std::io::Read;
    // Drain both pipes while waiting: a child writing more than a pipe holds (a panic
    // with a backtrace) would otherwise block forever.
    fn drain<R: Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    }
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                break child
                    .wait()
                    .unwrap_or_else(|e| panic!("waiting for a killed child process: {e}"));
            }
            Err(e) => panic!("waiting for a child process: {e}"),
        }
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

// ---------------------------------------------------------------------------------------
// The macro
// ---------------------------------------------------------------------------------------

/// Generates the store suite as a module of `#[test]`s.
///
/// ```text
/// babelqueue_testing::store_suite! {
///     #[ignore = "needs Redis"]          // optional attributes, put on every test
///     mod redis_suite = RedisFactory;    // module name = a StoreFactory value
///     kinds = [async_store, async_lease]; // any of async_store, async_lease,
///                                         // sync_store, sync_lease
/// }
/// ```
///
/// The conformance sequences come from [`sequences_for`]`(env!("CARGO_MANIFEST_DIR"))`.
/// Each test builds the factory expression afresh and runs on [`run`].
#[macro_export]
macro_rules! store_suite {
    (
        $(#[$attr:meta])*
        mod $name:ident = $factory:expr;
        kinds = [$($kind:ident),+ $(,)?];
    ) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::store_suite!(@expand [$(#[$attr])*] ($factory) $($kind)+);
        }
    };
    (@expand $attrs:tt ($factory:expr) $kind:ident $($rest:ident)*) => {
        $crate::store_suite!(@$kind $attrs ($factory));
        $crate::store_suite!(@expand $attrs ($factory) $($rest)*);
    };
    (@expand $attrs:tt ($factory:expr)) => {};
    (@async_store $attrs:tt ($factory:expr)) => {
        $crate::store_suite!(@seq $attrs conformance_sequences
            $crate::async_cases::conformance_sequences, ($factory));
        $crate::store_suite!(@case $attrs async_cases {
            seen_remember_forget, remember_for_ttl_expires, default_ttl_expires,
            namespaces_are_isolated, awkward_ids, unstorable_ids_are_refused,
            concurrent_remember_one_id
        } ($factory));
    };
    (@async_lease $attrs:tt ($factory:expr)) => {
        $crate::store_suite!(@seq $attrs lease_conformance_sequences
            $crate::async_lease_cases::lease_conformance_sequences, ($factory));
        $crate::store_suite!(@case $attrs async_lease_cases {
            lease_one_effect_across_16_tasks, lease_failed_holder_lets_next_run,
            lease_expired_lets_new_claim_win, lease_stranger_token_cannot_finish,
            lease_complete_ttl_expires, lease_visibility_and_forget
        } ($factory));
        $crate::store_suite!(@case $attrs async_renewal_cases {
            renewed_lease_one_run_across_8_tasks, renew_extends_only_the_holders_lease,
            fencing_tokens_increase, lease_unstorable_ids_are_refused
        } ($factory));
    };
    (@sync_store $attrs:tt ($factory:expr)) => {
        $crate::store_suite!(@seq $attrs sync_conformance_sequences
            $crate::sync_cases::sync_conformance_sequences, ($factory));
        $crate::store_suite!(@case $attrs sync_cases {
            sync_seen_remember_forget_ttl, sync_concurrent_remember_16_threads
        } ($factory));
    };
    (@sync_lease $attrs:tt ($factory:expr)) => {
        $crate::store_suite!(@seq $attrs sync_lease_conformance_sequences
            $crate::sync_lease_cases::sync_lease_conformance_sequences, ($factory));
        $crate::store_suite!(@case $attrs sync_lease_cases {
            sync_lease_one_effect_across_16_threads, sync_lease_tokens_and_expiry
        } ($factory));
        $crate::store_suite!(@case $attrs sync_renewal_cases {
            sync_renewed_lease_one_run_across_8_threads
        } ($factory));
    };
    (@seq [$(#[$attr:meta])*] $test:ident $path:path, ($factory:expr)) => {
        #[test]
        $(#[$attr])*
        fn $test() {
            let sequences = $crate::sequences_for(env!("CARGO_MANIFEST_DIR"));
            $crate::run($path($factory, sequences));
        }
    };
    (@case $attrs:tt $module:ident { $($case:ident),+ $(,)? } ($factory:expr)) => {
        $( $crate::store_suite!(@one $attrs $module $case ($factory)); )+
    };
    (@one [$(#[$attr:meta])*] $module:ident $case:ident ($factory:expr)) => {
        #[test]
        $(#[$attr])*
        fn $case() {
            $crate::run($crate::$module::$case($factory));
        }
    };
}
