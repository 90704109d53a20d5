//! The idempotency guard: the function form `#[idempotent]` expands to.
//!
//! The contract every BabelQueue SDK's guard follows, for a key `k` (by default the envelope's `meta.id`):
//!
//! 1. no usable key (absent or empty) → run the handler, remember nothing (**fail open**);
//! 2. `seen(k)` → skip: do not call the handler, return `Ok(Outcome::Skipped)` so the
//!    runtime acks;
//! 3. otherwise run the handler; only on success `remember(k)`; an error leaves `k`
//!    unmarked so retry and dead-letter still apply;
//! 4. `seen` fails → the store's error is returned (converted into the handler's error
//!    type) and the handler does not run; `remember` fails after a successful handler →
//!    logged with `tracing::warn!` and the call still succeeds (the known at-least-once
//!    window).
//!
//! ```
//! use babelqueue_core::{guard, Envelope, InMemoryStore, Outcome};
//!
//! let store = InMemoryStore::new();
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
//! let mut charges = 0;
//! let first = guard(&store, &env, || -> Result<(), std::io::Error> { charges += 1; Ok(()) })?;
//! let second = guard(&store, &env, || -> Result<(), std::io::Error> { charges += 1; Ok(()) })?;
//! assert_eq!((first, second, charges), (Outcome::Ran, Outcome::Skipped, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use crate::inflight;
use crate::key::DedupeKey;
use crate::lease::{
    self, AsyncLeaseStore, Claim, InFlight, LeaseHealth, LeaseLostCause, LeaseStore, LeaseToken,
    LeasedOutcome,
};
use crate::store::{AsyncStore, IntoHandlerError, Store};

/// What the guard did with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The handler ran and succeeded; its key is now remembered (or a `remember` failure
    /// was logged).
    Ran,
    /// The delivery had no usable key: the handler ran and succeeded, nothing was
    /// remembered (fail open).
    RanWithoutKey,
    /// The key was already seen: the handler did not run. Ack the message.
    Skipped,
}

impl Outcome {
    /// Whether the handler was invoked.
    pub fn ran(self) -> bool {
        !matches!(self, Outcome::Skipped)
    }
}

/// What a guarded handler may return: `()` (cannot fail) or `Result<(), E>`.
///
/// A skipped duplicate has no result to replay, so there is no `Result<T, E>` for other
/// `T`.
pub trait HandlerResult {
    /// The handler's error type (`Infallible` for `()`).
    type Error;
    /// The result as a `Result`.
    fn into_result(self) -> Result<(), Self::Error>;
}

impl HandlerResult for () {
    type Error = Infallible;
    fn into_result(self) -> Result<(), Infallible> {
        Ok(())
    }
}

impl<E> HandlerResult for Result<(), E> {
    type Error = E;
    fn into_result(self) -> Result<(), E> {
        self
    }
}

tokio::task_local! {
    static CURRENT: Cell<Option<Outcome>>;
}

thread_local! {
    static CURRENT_SYNC: Cell<Option<(u64, Outcome)>> = const { Cell::new(None) };
    static CAPTURE_DEPTH: Cell<u64> = const { Cell::new(0) };
}

/// Whether a sync handler capture ([`capture_outcome_sync`]) is active on this thread.
#[inline]
pub(crate) fn capturing_sync() -> bool {
    CAPTURE_DEPTH.with(Cell::get) > 0
}

fn record(outcome: Outcome) {
    if CURRENT.try_with(|c| c.set(Some(outcome))).is_err() {
        let depth = CAPTURE_DEPTH.with(Cell::get);
        if depth > 0 {
            CURRENT_SYNC.with(|c| c.set(Some((depth, outcome))));
        }
    }
}

/// Runs `fut` and returns what the (last) guard inside it decided, if any guard ran.
///
/// This is how a runtime learns that a handler's `Ok(())` was a skipped duplicate:
/// the guard records its [`Outcome`] in a task-local slot.
///
/// ```
/// use babelqueue_core::{guard::capture_outcome, guard_async, InMemoryStore, Outcome};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let handler = || async {
///     guard_async(&store, "id-A", async { Ok::<(), std::io::Error>(()) }).await.map(|_| ())
/// };
/// assert_eq!(capture_outcome(handler()).await.1, Some(Outcome::Ran));
/// assert_eq!(capture_outcome(handler()).await.1, Some(Outcome::Skipped));
/// # });
/// ```
#[doc(hidden)]
pub async fn capture_outcome<F: Future>(fut: F) -> (F::Output, Option<Outcome>) {
    CURRENT
        .scope(Cell::new(None), async move {
            let out = fut.await;
            (out, CURRENT.with(Cell::get))
        })
        .await
}

/// The blocking counterpart of [`capture_outcome`], for sync handlers.
///
/// ```
/// use babelqueue_core::{guard::capture_outcome_sync, guard, InMemoryStore, Outcome};
/// let store = InMemoryStore::new();
/// let run = || guard(&store, "id-A", || ()).map(|_| ());
/// assert_eq!(capture_outcome_sync(run).1, Some(Outcome::Ran));
/// assert_eq!(capture_outcome_sync(run).1, Some(Outcome::Skipped));
/// ```
#[doc(hidden)]
pub fn capture_outcome_sync<T>(f: impl FnOnce() -> T) -> (T, Option<Outcome>) {
    let depth = CAPTURE_DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get()
    });
    let out = f();
    CAPTURE_DEPTH.with(|d| d.set(depth - 1));
    let got = CURRENT_SYNC.with(|c| match c.get() {
        Some((d, o)) if d == depth => {
            c.set(None);
            Some(o)
        }
        _ => None,
    });
    (out, got)
}

pub(crate) fn skipped(key: &str) -> Outcome {
    tracing::debug!(key, "duplicate skipped: already processed");
    record(Outcome::Skipped);
    Outcome::Skipped
}

pub(crate) fn remember_failed(key: &str, err: &dyn std::error::Error) {
    tracing::warn!(
        key,
        error = %err,
        "handler succeeded but remembering the key failed; a redelivery may run it again"
    );
}

pub(crate) fn done(outcome: Outcome) -> Outcome {
    record(outcome);
    outcome
}

/// Guards a blocking handler with a blocking [`Store`], keyed on `key` (pass `&envelope`
/// to key on `meta.id`). See the [module docs](self) for the contract.
///
/// The store's error must convert into the handler's error (`S::Error: IntoHandlerError<R::Error>`);
/// with an infallible store such as [`InMemoryStore`](crate::InMemoryStore) a handler
/// returning `()` works too.
pub fn guard<S, K, F, R>(store: &S, key: K, handler: F) -> Result<Outcome, R::Error>
where
    S: Store + ?Sized,
    K: DedupeKey,
    F: FnOnce() -> R,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
{
    guard_ttl(store, key, None, handler)
}

/// [`guard`] with a TTL for the remembered key (`None`: the store's default).
pub fn guard_ttl<S, K, F, R>(
    store: &S,
    key: K,
    ttl: Option<Duration>,
    handler: F,
) -> Result<Outcome, R::Error>
where
    S: Store + ?Sized,
    K: DedupeKey,
    F: FnOnce() -> R,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
{
    let Some(key) = key.dedupe_key() else {
        handler().into_result()?;
        return Ok(done(Outcome::RanWithoutKey));
    };
    let _turn = inflight::turn_blocking(&key);
    if inflight::store_before_sync(&key, || store.seen(&key))
        .map_err(IntoHandlerError::into_handler_error)?
    {
        return Ok(skipped(&key));
    }
    inflight::handler_runs();
    handler().into_result()?;
    if let Err(err) = store.remember_for(&key, ttl) {
        remember_failed(&key, &err);
    }
    Ok(done(Outcome::Ran))
}

/// Guards an async handler (pass its future, which is only polled if it must run) with
/// an [`AsyncStore`]. See the [module docs](self) for the contract.
///
/// Returns a future that does nothing until polled (the key is read and the store asked
/// on the first poll), may be dropped at any point (the handler's future with it), and is
/// `Send` when the store, the key and the handler's future are.
///
/// ```
/// use babelqueue_core::{guard_async, Envelope, InMemoryStore, Outcome};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
/// let out = guard_async(&store, &env, async { Ok::<(), std::io::Error>(()) }).await?;
/// assert_eq!(out, Outcome::Ran);
/// let out = guard_async(&store, &env, async { Ok::<(), std::io::Error>(()) }).await?;
/// assert_eq!(out, Outcome::Skipped);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub fn guard_async<S, K, Fut, R>(
    store: &S,
    key: K,
    handler: Fut,
) -> impl Future<Output = Result<Outcome, R::Error>>
where
    S: AsyncStore + ?Sized,
    K: DedupeKey,
    Fut: Future<Output = R>,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
{
    guard_ttl_async(store, key, None, handler)
}

/// The name the `#[idempotent]` expansion of earlier releases calls; use
/// [`guard_ttl_async`].
#[doc(hidden)]
pub use guard_ttl_async as guard_async_ttl;

/// [`guard_async`] with a TTL for the remembered key (`None`: the store's default).
pub fn guard_ttl_async<S, K, Fut, R>(
    store: &S,
    key: K,
    ttl: Option<Duration>,
    handler: Fut,
) -> impl Future<Output = Result<Outcome, R::Error>>
where
    S: AsyncStore + ?Sized,
    K: DedupeKey,
    Fut: Future<Output = R>,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
{
    // A plain `fn` returning an `async` block, not an `async fn`, and written so that
    // nothing is copied again once the future runs (see `benches/guard.rs`): an `async fn`
    // moves each argument from the future into a local of its body, and `handler.await`
    // moves the handler's future once more; such a copy, a 16-byte load right after the
    // narrower stores that wrote the value, stalls the CPU (store-to-load forwarding
    // fails) and cost a duplicate ~20 ns more than the sync guard. So the handler's future
    // is polled where it was captured, the key is read through a reference to the
    // `dedupe_key` answer, and a store's answer is awaited before `key` is passed with it.
    let mut handler = handler;
    async move {
        // SAFETY: `handler` is a variable this future captured, so it stays where it is
        // while the future is pinned (which it is from its first poll, when this runs)
        // and is dropped there. It is shadowed at once: nothing can move it afterwards.
        // (`pin!(handler)` would be the same, after moving it into a new local.)
        let mut handler = unsafe { std::pin::Pin::new_unchecked(&mut handler) };
        let answer = key.dedupe_key();
        let Some(key) = &answer else {
            handler.as_mut().await.into_result()?;
            return Ok(done(Outcome::RanWithoutKey));
        };
        // Outside a runtime delivery (no turn, no probe), the store is called directly,
        // with no task-local lookup per step.
        let delivery = inflight::delivery();
        let runtime = delivery.of_runtime();
        let turn = if runtime {
            Some(inflight::turn_async(key).await)
        } else {
            None
        };
        let seen = if runtime {
            inflight::store_before(key, store.seen(key)).await
        } else {
            let answer = store.seen(key).await;
            delivery.store_answer(key, answer)
        };
        if seen.map_err(IntoHandlerError::into_handler_error)? {
            return Ok(skipped(key));
        }
        if runtime {
            inflight::handler_runs();
        }
        handler.as_mut().await.into_result()?;
        let remembered = if runtime {
            // With the store on the transport's server: the `remember` is sent with the
            // ack, in one round trip (the turn on the key is held until then).
            let _turn = match inflight::defer_remember(turn, |server| {
                store.pipelined_remember(key, ttl, server)
            }) {
                Ok(()) => return Ok(done(Outcome::Ran)),
                Err(turn) => turn,
            };
            inflight::store_after(store.remember_for(key, ttl)).await
        } else {
            store.remember_for(key, ttl).await
        };
        if let Err(err) = remembered {
            remember_failed(key, &err);
        }
        Ok(done(Outcome::Ran))
    }
}

fn release_failed(key: &str, err: &dyn std::error::Error) {
    tracing::warn!(
        key,
        error = %err,
        "handler failed and releasing its claim failed; the id stays blocked until the lease ends"
    );
}

/// Guards a blocking handler in **lease mode** (see [`crate::lease`]): claims the key
/// for `lease` before running, renews the claim every third of `lease` from a thread
/// beside the handler, so two workers never run it at the same moment, and marks it
/// completed when the handler succeeds.
///
/// An id in flight elsewhere returns [`InFlight`] converted into the handler's error
/// (so the handler's error type must implement `From<InFlight>`): do not ack, retry
/// later. A lost lease is logged (`tracing::warn!` with the id);
/// [`guard_lease_report`] returns it typed. The handler reads its fencing token with
/// [`current_fencing_token`](crate::lease::current_fencing_token).
///
/// ```
/// use std::time::Duration;
/// use babelqueue_core::{guard_lease, InFlight, InMemoryStore, Outcome};
///
/// #[derive(Debug)]
/// enum Error { Busy(InFlight) }
/// impl From<InFlight> for Error { fn from(e: InFlight) -> Self { Error::Busy(e) } }
///
/// let store = InMemoryStore::new();
/// let out = guard_lease(&store, "id-A", Duration::from_secs(30), None, || Ok::<(), Error>(()));
/// assert_eq!(out.unwrap(), Outcome::Ran);
/// let out = guard_lease(&store, "id-A", Duration::from_secs(30), None, || Ok::<(), Error>(()));
/// assert_eq!(out.unwrap(), Outcome::Skipped);
/// ```
pub fn guard_lease<S, K, F, R>(
    store: &S,
    key: K,
    lease: Duration,
    ttl: Option<Duration>,
    handler: F,
) -> Result<Outcome, R::Error>
where
    S: LeaseStore + Sync + ?Sized,
    K: DedupeKey,
    F: FnOnce() -> R,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
    R::Error: From<InFlight>,
{
    guard_lease_report(store, key, lease, ttl, handler).map(|r| r.outcome)
}

/// [`guard_lease`] returning the typed [`LeasedOutcome`]: the outcome, the claim's
/// fencing token, and whether the lease held ([`LeaseHealth`]).
///
/// ```
/// use std::time::Duration;
/// use babelqueue_core::guard::guard_lease_report;
/// use babelqueue_core::lease::LeaseHealth;
/// use babelqueue_core::{InFlight, InMemoryStore, Outcome};
///
/// #[derive(Debug)]
/// struct Busy;
/// impl From<InFlight> for Busy { fn from(_: InFlight) -> Self { Busy } }
///
/// let store = InMemoryStore::new();
/// let r = guard_lease_report(&store, "id-A", Duration::from_secs(30), None, || Ok::<(), Busy>(()))
///     .unwrap();
/// assert_eq!((r.outcome, r.lease), (Outcome::Ran, LeaseHealth::Held));
/// assert!(r.fencing_token.is_some());
/// ```
pub fn guard_lease_report<S, K, F, R>(
    store: &S,
    key: K,
    lease: Duration,
    ttl: Option<Duration>,
    handler: F,
) -> Result<LeasedOutcome, R::Error>
where
    S: LeaseStore + Sync + ?Sized,
    K: DedupeKey,
    F: FnOnce() -> R,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
    R::Error: From<InFlight>,
{
    let Some(key) = key.dedupe_key() else {
        handler().into_result()?;
        return Ok(unclaimed(done(Outcome::RanWithoutKey)));
    };
    let _turn = inflight::turn_blocking(&key);
    let token = match inflight::store_before_sync(&key, || store.claim(&key, lease))
        .map_err(IntoHandlerError::into_handler_error)?
    {
        Claim::Completed => return Ok(unclaimed(skipped(&key))),
        Claim::InFlight => {
            inflight::in_flight_elsewhere(&key);
            return Err(InFlight {
                id: key.into_owned(),
            }
            .into());
        }
        Claim::Acquired(token) => token,
    };
    inflight::handler_runs();
    let (result, lost) = lease::run_renewing_sync(store, &key, &token, lease, handler);
    match result {
        Ok(()) => {
            let completed = store.complete(&key, &token, ttl);
            let lost = settle_lease(&key, completed, lost, || store.remember_for(&key, ttl));
            Ok(leased(done(Outcome::Ran), &token, lost))
        }
        Err(e) => {
            if let Err(err) = store.release(&key, &token) {
                release_failed(&key, &err);
            }
            Err(e)
        }
    }
}

/// The async counterpart of [`guard_lease`], for an [`AsyncLeaseStore`]: the lease is
/// renewed beside the handler, in the same task.
pub async fn guard_lease_async<S, K, Fut, R>(
    store: &S,
    key: K,
    lease: Duration,
    ttl: Option<Duration>,
    handler: Fut,
) -> Result<Outcome, R::Error>
where
    S: AsyncLeaseStore + ?Sized,
    K: DedupeKey,
    Fut: Future<Output = R>,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
    R::Error: From<InFlight>,
{
    guard_lease_report_async(store, key, lease, ttl, handler)
        .await
        .map(|r| r.outcome)
}

/// [`guard_lease_async`] returning the typed [`LeasedOutcome`] (see
/// [`guard_lease_report`]).
pub async fn guard_lease_report_async<S, K, Fut, R>(
    store: &S,
    key: K,
    lease: Duration,
    ttl: Option<Duration>,
    handler: Fut,
) -> Result<LeasedOutcome, R::Error>
where
    S: AsyncLeaseStore + ?Sized,
    K: DedupeKey,
    Fut: Future<Output = R>,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
    R::Error: From<InFlight>,
{
    guard_lease_report_async_with(store, key, lease, ttl, handler, R::Error::from).await
}

/// [`guard_lease_report_async`] with the conversion of [`InFlight`] into the handler's
/// error given as a value (`in_flight`) instead of the bound `R::Error: From<InFlight>`.
/// What the `#[idempotent(lease = ...)]` expansion of an `async fn` calls: it passes a
/// closure that names `From<InFlight>` at the user's return type, so an error type
/// without it is reported there, once, and not again at the guard's `impl Future`.
#[doc(hidden)]
pub async fn guard_lease_report_async_with<S, K, Fut, R, C>(
    store: &S,
    key: K,
    lease: Duration,
    ttl: Option<Duration>,
    handler: Fut,
    in_flight: C,
) -> Result<LeasedOutcome, R::Error>
where
    S: AsyncLeaseStore + ?Sized,
    K: DedupeKey,
    Fut: Future<Output = R>,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
    C: FnOnce(InFlight) -> R::Error,
{
    let Some(key) = key.dedupe_key() else {
        handler.await.into_result()?;
        return Ok(unclaimed(done(Outcome::RanWithoutKey)));
    };
    let _turn = inflight::consumer_turn(&key).await;
    let token = match inflight::store_before(&key, store.claim(&key, lease))
        .await
        .map_err(IntoHandlerError::into_handler_error)?
    {
        Claim::Completed => return Ok(unclaimed(skipped(&key))),
        Claim::InFlight => {
            inflight::in_flight_elsewhere(&key);
            return Err(in_flight(InFlight {
                id: key.into_owned(),
            }));
        }
        Claim::Acquired(token) => token,
    };
    inflight::handler_runs();
    let (result, lost) = lease::run_renewing_async(store, &key, &token, lease, handler).await;
    match result {
        Ok(()) => {
            let completed = inflight::store_after(store.complete(&key, &token, ttl)).await;
            let fallback = match &completed {
                Ok(false) => Some(store.remember_for(&key, ttl).await),
                _ => None,
            };
            let lost = settle_lease(&key, completed, lost, || fallback.unwrap_or_else(|| Ok(())));
            Ok(leased(done(Outcome::Ran), &token, lost))
        }
        Err(e) => {
            if let Err(err) = store.release(&key, &token).await {
                release_failed(&key, &err);
            }
            Err(e)
        }
    }
}

fn unclaimed(outcome: Outcome) -> LeasedOutcome {
    LeasedOutcome {
        outcome,
        fencing_token: None,
        lease: LeaseHealth::NotClaimed,
    }
}

fn leased(outcome: Outcome, token: &LeaseToken, lost: Option<LeaseLostCause>) -> LeasedOutcome {
    LeasedOutcome {
        outcome,
        fencing_token: token.fence(),
        lease: lost.map_or(LeaseHealth::Held, LeaseHealth::Lost),
    }
}

/// After a successful handler: logs what `complete` answered and, when the lease was lost
/// (complete refused), remembers the id if nobody holds it (`remember`), so a later
/// duplicate is skipped. Returns why the lease was lost, if it was.
fn settle_lease<E: std::error::Error, E2: std::error::Error>(
    key: &str,
    completed: Result<bool, E>,
    renew_lost: Option<LeaseLostCause>,
    remember: impl FnOnce() -> Result<(), E2>,
) -> Option<LeaseLostCause> {
    match completed {
        Ok(true) => renew_lost,
        Ok(false) => {
            let remembered = remember();
            tracing::warn!(
                key,
                remembered = remembered.is_ok(),
                "handler succeeded after its lease was lost; the id was remembered unless \
                 another worker holds it (that worker may run it too)"
            );
            if let Err(err) = remembered {
                remember_failed(key, &err);
            }
            Some(renew_lost.unwrap_or(LeaseLostCause::CompleteRefused))
        }
        Err(err) => {
            remember_failed(key, &err);
            Some(LeaseLostCause::CompleteFailed(err.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::pin::{Pin, pin};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Waker};

    use super::*;
    use crate::inflight::{StoreProbe, with_probe};
    use crate::pipelined::PipelinedWrite;
    use crate::{Envelope, InMemoryStore};

    /// An async store that counts its calls, can fail `seen` or `remember`, answers
    /// `Pending` once before each answer (so the guard holds the store's future across a
    /// poll), and can offer its `remember` to a pipeline on `server`.
    #[derive(Default)]
    struct TestStore {
        ids: Mutex<HashSet<String>>,
        seen_calls: AtomicUsize,
        remember_calls: AtomicUsize,
        fail_seen: bool,
        fail_remember: bool,
        server: Option<&'static str>,
    }

    impl TestStore {
        fn has(&self, id: &str) -> bool {
            self.ids.lock().unwrap().contains(id)
        }
    }

    /// Ready with `value` on its second poll (it wakes its task at once on the first).
    struct Later<T>(bool, Option<T>);

    fn later<T>(value: T) -> Later<T> {
        Later(true, Some(value))
    }

    impl<T: Unpin> Future for Later<T> {
        type Output = T;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
            if std::mem::take(&mut self.0) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(self.1.take().expect("polled after completion"))
        }
    }

    fn down() -> std::io::Error {
        std::io::Error::other("store down")
    }

    impl AsyncStore for TestStore {
        type Error = std::io::Error;

        fn seen(&self, id: &str) -> impl Future<Output = Result<bool, std::io::Error>> + Send {
            self.seen_calls.fetch_add(1, Ordering::SeqCst);
            later(if self.fail_seen {
                Err(down())
            } else {
                Ok(self.has(id))
            })
        }

        fn remember(&self, id: &str) -> impl Future<Output = Result<(), std::io::Error>> + Send {
            self.remember_calls.fetch_add(1, Ordering::SeqCst);
            later(if self.fail_remember {
                Err(down())
            } else {
                self.ids.lock().unwrap().insert(id.to_owned());
                Ok(())
            })
        }

        fn forget(&self, id: &str) -> impl Future<Output = Result<(), std::io::Error>> + Send {
            self.ids.lock().unwrap().remove(id);
            later(Ok(()))
        }

        fn pipelined_remember(
            &self,
            id: &str,
            _ttl: Option<Duration>,
            server: &str,
        ) -> Option<PipelinedWrite> {
            (self.server == Some(server)).then(|| PipelinedWrite::new(server, ["SET", id]))
        }
    }

    /// Set when the value is dropped: captured by a handler's future, tells whether
    /// that future was dropped.
    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A handler's future that counts its runs, returns `result`, and sets `dropped` when
    /// dropped.
    fn handler(
        runs: &AtomicUsize,
        dropped: &Arc<AtomicBool>,
        result: Result<(), std::io::Error>,
    ) -> impl Future<Output = Result<(), std::io::Error>> {
        let flag = DropFlag(Arc::clone(dropped));
        async move {
            let _flag = flag;
            runs.fetch_add(1, Ordering::SeqCst);
            result
        }
    }

    fn poll_once<F: Future>(fut: Pin<&mut F>) -> Poll<F::Output> {
        fut.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[tokio::test]
    async fn first_then_duplicate_outside_the_runtime() {
        let store = TestStore::default();
        let runs = AtomicUsize::new(0);
        let dropped = Arc::new(AtomicBool::new(false));
        let (out, recorded) = capture_outcome(guard_async(
            &store,
            "id-A",
            handler(&runs, &dropped, Ok(())),
        ))
        .await;
        assert_eq!((out.unwrap(), recorded), (Outcome::Ran, Some(Outcome::Ran)));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 1);
        assert!(store.has("id-A"));

        let dropped = Arc::new(AtomicBool::new(false));
        let (out, recorded) = capture_outcome(guard_async(
            &store,
            "id-A",
            handler(&runs, &dropped, Ok(())),
        ))
        .await;
        assert_eq!(
            (out.unwrap(), recorded),
            (Outcome::Skipped, Some(Outcome::Skipped))
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "a duplicate does not run");
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(store.seen_calls.load(Ordering::SeqCst), 2);
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn no_key_runs_the_handler_and_leaves_the_store_alone() {
        let store = TestStore::default();
        let runs = AtomicUsize::new(0);
        let dropped = Arc::new(AtomicBool::new(false));
        for key in ["", ""] {
            let (out, recorded) =
                capture_outcome(guard_async(&store, key, handler(&runs, &dropped, Ok(())))).await;
            assert_eq!(
                (out.unwrap(), recorded),
                (Outcome::RanWithoutKey, Some(Outcome::RanWithoutKey))
            );
        }
        // A `None` key too.
        let out = guard_async(&store, None::<&str>, handler(&runs, &dropped, Ok(()))).await;
        assert_eq!(out.unwrap(), Outcome::RanWithoutKey);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(store.seen_calls.load(Ordering::SeqCst), 0);
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 0);
        // A failing handler without a key: its error is returned.
        let out = guard_async(&store, "", handler(&runs, &dropped, Err(down()))).await;
        assert_eq!(out.unwrap_err().to_string(), "store down");
    }

    #[tokio::test]
    async fn a_handler_error_leaves_the_key_unremembered() {
        let store = TestStore::default();
        let runs = AtomicUsize::new(0);
        let dropped = Arc::new(AtomicBool::new(false));
        let failed = std::io::Error::other("charge declined");
        let (out, recorded) = capture_outcome(guard_async(
            &store,
            "id-B",
            handler(&runs, &dropped, Err(failed)),
        ))
        .await;
        assert_eq!(out.unwrap_err().to_string(), "charge declined");
        assert_eq!(recorded, None, "a failed handler records no outcome");
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 0);
        assert!(!store.has("id-B"));
        // The retry runs.
        let out = guard_async(&store, "id-B", handler(&runs, &dropped, Ok(()))).await;
        assert_eq!(
            (out.unwrap(), runs.load(Ordering::SeqCst)),
            (Outcome::Ran, 2)
        );
    }

    #[tokio::test]
    async fn a_seen_failure_is_returned_and_the_handler_does_not_run() {
        let store = TestStore {
            fail_seen: true,
            ..TestStore::default()
        };
        let runs = AtomicUsize::new(0);
        let dropped = Arc::new(AtomicBool::new(false));
        let out = guard_async(&store, "id-C", handler(&runs, &dropped, Ok(()))).await;
        assert_eq!(out.unwrap_err().to_string(), "store down");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        // Inside the runtime, the typed marker is set too.
        let probe = Arc::new(StoreProbe::default());
        let out = with_probe(
            Arc::clone(&probe),
            guard_async(&store, "id-C", handler(&runs, &dropped, Ok(()))),
        )
        .await;
        assert!(out.is_err());
        assert!(probe.store_failed());
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_remember_failure_is_logged_and_the_call_succeeds() {
        let store = TestStore {
            fail_remember: true,
            ..TestStore::default()
        };
        let runs = AtomicUsize::new(0);
        let dropped = Arc::new(AtomicBool::new(false));
        for _ in 0..2 {
            let out = guard_ttl_async(
                &store,
                "id-D",
                Some(Duration::from_secs(60)),
                handler(&runs, &dropped, Ok(())),
            )
            .await;
            assert_eq!(out.unwrap(), Outcome::Ran);
        }
        // Not remembered: the redelivery ran again (the known at-least-once window).
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn nothing_runs_before_the_first_poll_and_a_dropped_guard_drops_its_handler() {
        let store = TestStore::default();
        let runs = AtomicUsize::new(0);
        let dropped = Arc::new(AtomicBool::new(false));
        let fut = guard_async(&store, "id-E", handler(&runs, &dropped, Ok(())));
        drop(fut);
        assert_eq!(store.seen_calls.load(Ordering::SeqCst), 0);
        assert!(dropped.load(Ordering::SeqCst));

        // Dropped while waiting on `seen` (its first poll answered `Pending`).
        let dropped = Arc::new(AtomicBool::new(false));
        {
            let mut fut = pin!(guard_async(
                &store,
                "id-E",
                handler(&runs, &dropped, Ok(()))
            ));
            assert!(poll_once(fut.as_mut()).is_pending());
            assert_eq!(store.seen_calls.load(Ordering::SeqCst), 1);
        }
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(runs.load(Ordering::SeqCst), 0);

        // Dropped while the handler waits: nothing remembered.
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(Arc::clone(&dropped));
        {
            let mut fut = pin!(guard_async(&store, "id-E", async move {
                let _flag = flag;
                std::future::pending::<Result<(), std::io::Error>>().await
            }));
            for _ in 0..3 {
                assert!(poll_once(fut.as_mut()).is_pending());
            }
        }
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_handler_future_is_dropped_when_the_guard_completes() {
        let store = InMemoryStore::new();
        let runs = AtomicUsize::new(0);
        for outcome in [Outcome::Ran, Outcome::Skipped] {
            let dropped = Arc::new(AtomicBool::new(false));
            let mut fut = pin!(guard_async(
                &store,
                "id-F",
                handler(&runs, &dropped, Ok(()))
            ));
            match poll_once(fut.as_mut()) {
                Poll::Ready(out) => assert_eq!(out.unwrap(), outcome),
                Poll::Pending => panic!("the in-memory store never waits"),
            }
            assert!(dropped.load(Ordering::SeqCst), "{outcome:?}");
        }
    }

    #[tokio::test]
    async fn inside_the_runtime_the_turn_is_held_until_the_key_is_remembered() {
        let store = TestStore::default();
        let runs = AtomicUsize::new(0);
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let first = with_probe(
            Arc::new(StoreProbe::default()),
            guard_async(&store, "id-G", async {
                runs.fetch_add(1, Ordering::SeqCst);
                wait.await.map_err(std::io::Error::other)
            }),
        );
        let probe = Arc::new(StoreProbe::default());
        let dropped = Arc::new(AtomicBool::new(false));
        let second = with_probe(
            Arc::clone(&probe),
            guard_async(&store, "id-G", handler(&runs, &dropped, Ok(()))),
        );
        let mut first = pin!(first);
        let mut second = pin!(second);
        // The first takes the turn and waits in its handler; the second waits for the turn.
        for _ in 0..4 {
            assert!(poll_once(first.as_mut()).is_pending());
            assert!(poll_once(second.as_mut()).is_pending());
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(store.seen_calls.load(Ordering::SeqCst), 1);
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap(), Outcome::Ran);
        assert!(store.has("id-G"));
        // The second then finds the key remembered.
        assert_eq!(second.await.unwrap(), Outcome::Skipped);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(!probe.store_failed());
    }

    #[tokio::test]
    async fn inside_the_runtime_the_handler_start_is_reported() {
        let store = InMemoryStore::new();
        let probe = Arc::new(StoreProbe::default());
        assert_eq!(probe.phase().2, None);
        let out = with_probe(
            Arc::clone(&probe),
            guard_async(&store, "id-H", async { Ok::<(), std::io::Error>(()) }),
        )
        .await;
        assert_eq!(out.unwrap(), Outcome::Ran);
        assert!(
            probe.phase().2.is_some(),
            "the handler's start was recorded"
        );
        let probe = Arc::new(StoreProbe::default());
        let out = with_probe(
            Arc::clone(&probe),
            guard_async(&store, "id-H", async { Ok::<(), std::io::Error>(()) }),
        )
        .await;
        assert_eq!(out.unwrap(), Outcome::Skipped);
        assert_eq!(probe.phase().2, None, "a duplicate's handler did not start");
    }

    #[tokio::test]
    async fn inside_the_runtime_remember_is_handed_over_to_the_pipeline() {
        let store = TestStore {
            server: Some("srv"),
            ..TestStore::default()
        };
        let runs = AtomicUsize::new(0);
        let dropped = Arc::new(AtomicBool::new(false));
        let probe = Arc::new(StoreProbe::with_pipeline(Some("srv".into())));
        let (out, recorded) = capture_outcome(with_probe(
            Arc::clone(&probe),
            guard_async(&store, "id-I", handler(&runs, &dropped, Ok(()))),
        ))
        .await;
        assert_eq!((out.unwrap(), recorded), (Outcome::Ran, Some(Outcome::Ran)));
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 0);
        let deferred = probe.take_deferred();
        assert_eq!(
            deferred.writes,
            vec![PipelinedWrite::new("srv", ["SET", "id-I"])]
        );
        // The turn on the key is held with the write: another delivery waits for it.
        let next = with_probe(
            Arc::new(StoreProbe::default()),
            guard_async(&store, "id-I", handler(&runs, &dropped, Ok(()))),
        );
        let mut next = pin!(next);
        assert!(poll_once(next.as_mut()).is_pending());
        assert_eq!(store.seen_calls.load(Ordering::SeqCst), 1);
        drop(deferred);
        // (The write was not sent here, so the key is not remembered: it runs again.)
        assert_eq!(next.await.unwrap(), Outcome::Ran);
        assert_eq!(runs.load(Ordering::SeqCst), 2);

        // A probe on another server: the guard remembers itself.
        let probe = Arc::new(StoreProbe::with_pipeline(Some("other".into())));
        let out = with_probe(
            Arc::clone(&probe),
            guard_async(&store, "id-J", handler(&runs, &dropped, Ok(()))),
        )
        .await;
        assert_eq!(out.unwrap(), Outcome::Ran);
        assert!(probe.take_deferred().is_empty());
        assert!(store.has("id-J"));
    }

    /// The guard's future is `Send` whenever its parts are (checked at compile time, for
    /// any store, key and handler).
    #[allow(dead_code)]
    fn guard_future_is_send<S, K, Fut, R>(
        store: &S,
        key: K,
        handler: Fut,
    ) -> impl Future<Output = Result<Outcome, R::Error>> + Send
    where
        S: AsyncStore + ?Sized,
        K: DedupeKey + Send,
        Fut: Future<Output = R> + Send,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
    {
        guard_ttl_async(store, key, None, handler)
    }

    #[test]
    fn guard_future_is_send_for_the_in_memory_store() {
        fn assert_send<T: Send>(_: &T) {}
        let store = InMemoryStore::new();
        let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
        let fut = guard_async(&store, &env, async { Ok::<(), std::io::Error>(()) });
        assert_send(&fut);
        let fut = guard_future_is_send(&store, 42u64, async {});
        assert_send(&fut);
    }
}
