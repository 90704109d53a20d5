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
pub async fn guard_async<S, K, Fut, R>(store: &S, key: K, handler: Fut) -> Result<Outcome, R::Error>
where
    S: AsyncStore + ?Sized,
    K: DedupeKey,
    Fut: Future<Output = R>,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
{
    guard_ttl_async(store, key, None, handler).await
}

/// The name the `#[idempotent]` expansion of earlier releases calls; use
/// [`guard_ttl_async`].
#[doc(hidden)]
pub use guard_ttl_async as guard_async_ttl;

/// [`guard_async`] with a TTL for the remembered key (`None`: the store's default).
pub async fn guard_ttl_async<S, K, Fut, R>(
    store: &S,
    key: K,
    ttl: Option<Duration>,
    handler: Fut,
) -> Result<Outcome, R::Error>
where
    S: AsyncStore + ?Sized,
    K: DedupeKey,
    Fut: Future<Output = R>,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
{
    let Some(key) = key.dedupe_key() else {
        handler.await.into_result()?;
        return Ok(done(Outcome::RanWithoutKey));
    };
    // Outside a runtime delivery (no turn, no probe), the store is called directly, with no
    // task-local lookup per step.
    let delivery = inflight::delivery();
    let runtime = delivery.of_runtime();
    let turn = if runtime {
        Some(inflight::turn_async(&key).await)
    } else {
        None
    };
    let seen = if runtime {
        inflight::store_before(&key, store.seen(&key)).await
    } else {
        delivery.store_answer(&key, store.seen(&key).await)
    };
    if seen.map_err(IntoHandlerError::into_handler_error)? {
        return Ok(skipped(&key));
    }
    if runtime {
        inflight::handler_runs();
    }
    handler.await.into_result()?;
    let remembered = if runtime {
        // With the store on the transport's server: the `remember` is sent with the ack,
        // in one round trip (the turn on the key is held until then).
        let _turn = match inflight::defer_remember(turn, |server| {
            store.pipelined_remember(&key, ttl, server)
        }) {
            Ok(()) => return Ok(done(Outcome::Ran)),
            Err(turn) => turn,
        };
        inflight::store_after(store.remember_for(&key, ttl)).await
    } else {
        store.remember_for(&key, ttl).await
    };
    if let Err(err) = remembered {
        remember_failed(&key, &err);
    }
    Ok(done(Outcome::Ran))
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
