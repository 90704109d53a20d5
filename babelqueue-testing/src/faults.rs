//! The fault kit: a store that fails on purpose, and a helper that delivers one envelope
//! several times through the real guard.
//!
//! * [`FaultyStore`] wraps any store and fails chosen calls (`seen`, `remember`, `forget`,
//!   `claim`, `complete`, `release`, `renew`): the *n*th call of a kind, every call of a
//!   kind while a switch is on, or every call while the whole store is "down". An injected
//!   failure is a [`FaultError::Injected`] carrying a
//!   [`StoreUnavailable`] (kind [`UnavailableKind::Injected`]), so code that recognises an
//!   unavailable store by type (the runtime, your own) sees exactly what a real outage
//!   gives it.
//! * [`Redelivery`] delivers one envelope *n* times, one after another or all at once,
//!   through [`Guard::run_async`](babelqueue_core::Guard) or
//!   the lease-mode [`Guard`] (async) and your handler, and reports what
//!   happened ([`Deliveries`]: effects, runs, skips, in-flight answers, errors).
//!
//! ```
//! use babelqueue_testing::faults::{FaultyStore, Redelivery, StoreCall};
//! use babelqueue_core::{BoxError, Envelope, InMemoryStore};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = FaultyStore::new(InMemoryStore::new());
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
//!
//! // The first `remember` fails: the handler ran but the id was not marked, so the
//! // redelivery runs it again (the at-least-once window of the seen-set guard).
//! store.faults().fail_nth(StoreCall::Remember, 1);
//! let report = Redelivery::of(&env)
//!     .times(2)
//!     .through_guard(&store, |_env| async { Ok::<(), BoxError>(()) })
//!     .await;
//! assert_eq!((report.effects, report.ran, report.skipped), (2, 2, 0));
//!
//! // The store is down: nothing runs, every delivery fails with a typed "unavailable".
//! store.faults().set_down(true);
//! let report = Redelivery::of(&env)
//!     .times(3)
//!     .through_guard(&store, |_env| async { Ok::<(), BoxError>(()) })
//!     .await;
//! assert_eq!(report.effects, 0);
//! assert_eq!(report.unavailable(), 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use babelqueue_core::envelope::Envelope;
use babelqueue_core::guard::{Guard, Guarded, Outcome};
use babelqueue_core::lease::{AsyncLeaseStore, Claim, InFlight, LeaseStore, LeaseToken};
use babelqueue_core::store::{AsyncStore, IntoHandlerError, Store};
use babelqueue_core::store_error::{StoreUnavailable, UnavailableKind, find_unavailable};
use babelqueue_runtime::handler::BoxError;

/// A store call the fault kit can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreCall {
    /// `seen`.
    Seen,
    /// `remember` / `remember_for`.
    Remember,
    /// `forget`.
    Forget,
    /// `claim` (lease mode).
    Claim,
    /// `complete` (lease mode).
    Complete,
    /// `release` (lease mode).
    Release,
    /// `renew` (lease mode).
    Renew,
}

impl StoreCall {
    /// Every call kind.
    pub const ALL: [StoreCall; 7] = [
        StoreCall::Seen,
        StoreCall::Remember,
        StoreCall::Forget,
        StoreCall::Claim,
        StoreCall::Complete,
        StoreCall::Release,
        StoreCall::Renew,
    ];

    /// The call's name (`seen`, `remember`, …), as in the injected error.
    pub fn name(self) -> &'static str {
        match self {
            StoreCall::Seen => "seen",
            StoreCall::Remember => "remember",
            StoreCall::Forget => "forget",
            StoreCall::Claim => "claim",
            StoreCall::Complete => "complete",
            StoreCall::Release => "release",
            StoreCall::Renew => "renew",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Default)]
struct CallPlan {
    /// 1-based call numbers that fail.
    nth: Vec<usize>,
    /// Fail every call of this kind while on.
    switch: bool,
}

#[derive(Debug, Default)]
struct Plan {
    down: bool,
    calls: [CallPlan; 7],
}

/// The shared control of a [`FaultyStore`]: what fails, and counters of what was called.
/// Cheap to clone; every clone controls the same store.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    plan: Arc<Mutex<Plan>>,
    calls: Arc<[AtomicUsize; 7]>,
    injected: Arc<[AtomicUsize; 7]>,
}

impl Faults {
    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `n`th call (1-based, counted from the store's creation) of `call` fails.
    /// Call it several times to fail several calls.
    pub fn fail_nth(&self, call: StoreCall, n: usize) -> &Self {
        self.plan().calls[call.index()].nth.push(n);
        self
    }

    /// The next call of `call` fails (the one after the calls made so far).
    pub fn fail_next(&self, call: StoreCall) -> &Self {
        let next = self.calls(call) + 1;
        self.fail_nth(call, next)
    }

    /// While `on`, every call of `call` fails.
    pub fn fail_while(&self, call: StoreCall, on: bool) -> &Self {
        self.plan().calls[call.index()].switch = on;
        self
    }

    /// While `down`, every call fails (the store is unreachable).
    pub fn set_down(&self, down: bool) -> &Self {
        self.plan().down = down;
        self
    }

    /// Clears every planned failure and switch (counters are kept).
    pub fn heal(&self) -> &Self {
        *self.plan() = Plan::default();
        self
    }

    /// How many calls of `call` were made (failed ones included).
    pub fn calls(&self, call: StoreCall) -> usize {
        self.calls[call.index()].load(Ordering::SeqCst)
    }

    /// How many calls of `call` failed on purpose.
    pub fn injected(&self, call: StoreCall) -> usize {
        self.injected[call.index()].load(Ordering::SeqCst)
    }

    /// Counts the call and decides whether it fails.
    fn enter(&self, call: StoreCall) -> Result<(), StoreUnavailable> {
        let n = self.calls[call.index()].fetch_add(1, Ordering::SeqCst) + 1;
        let fail = {
            let plan = self.plan();
            let p = &plan.calls[call.index()];
            plan.down || p.switch || p.nth.contains(&n)
        };
        if fail {
            self.injected[call.index()].fetch_add(1, Ordering::SeqCst);
            Err(StoreUnavailable::new(
                "faulty",
                call.name(),
                UnavailableKind::Injected,
            ))
        } else {
            Ok(())
        }
    }
}

/// The error of a [`FaultyStore`]: an injected failure, or the wrapped store's own error.
#[derive(Debug, thiserror::Error)]
pub enum FaultError<E> {
    /// A failure the fault kit injected (an unavailable store, as far as anyone can
    /// tell by type).
    #[error("store unavailable (injected by the fault kit)")]
    Injected(#[source] StoreUnavailable),
    /// The wrapped store's own error.
    #[error(transparent)]
    Store(E),
}

impl<E> FaultError<E> {
    /// Whether the failure was injected.
    pub fn is_injected(&self) -> bool {
        matches!(self, FaultError::Injected(_))
    }
}

impl<E, H: From<FaultError<E>>> IntoHandlerError<H> for FaultError<E> {
    fn into_handler_error(self) -> H {
        H::from(self)
    }
}

/// Any store, failing the calls you choose (see the [module docs](self)).
///
/// Implements whichever of [`Store`], [`AsyncStore`], [`LeaseStore`] and
/// [`AsyncLeaseStore`] the wrapped store implements; its error is [`FaultError`].
///
/// ```
/// use babelqueue_testing::faults::{FaultyStore, StoreCall};
/// use babelqueue_core::store_error::find_unavailable;
/// use babelqueue_core::{InMemoryStore, Store};
///
/// let store = FaultyStore::new(InMemoryStore::new());
/// store.faults().fail_while(StoreCall::Seen, true);
/// let err = store.seen("pay_7f3a").unwrap_err();
/// assert!(find_unavailable(&err).is_some(), "typed as an unavailable store");
/// store.faults().fail_while(StoreCall::Seen, false);
/// assert!(!store.seen("pay_7f3a").unwrap());
/// assert_eq!(store.faults().calls(StoreCall::Seen), 2);
/// ```
#[derive(Debug, Clone)]
pub struct FaultyStore<S> {
    inner: S,
    faults: Faults,
}

impl<S> FaultyStore<S> {
    /// Wraps `inner`; nothing fails until you plan it with [`faults`](Self::faults).
    pub fn new(inner: S) -> Self {
        FaultyStore {
            inner,
            faults: Faults::default(),
        }
    }

    /// The control of this store's failures (a cheap clone to keep).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

fn injected<E>(e: StoreUnavailable) -> FaultError<E> {
    FaultError::Injected(e)
}

impl<S: Store> Store for FaultyStore<S> {
    type Error = FaultError<S::Error>;

    fn seen(&self, id: &str) -> Result<bool, Self::Error> {
        self.faults.enter(StoreCall::Seen).map_err(injected)?;
        self.inner.seen(id).map_err(FaultError::Store)
    }

    fn remember(&self, id: &str) -> Result<(), Self::Error> {
        self.faults.enter(StoreCall::Remember).map_err(injected)?;
        self.inner.remember(id).map_err(FaultError::Store)
    }

    fn remember_for(&self, id: &str, ttl: Option<Duration>) -> Result<(), Self::Error> {
        self.faults.enter(StoreCall::Remember).map_err(injected)?;
        self.inner.remember_for(id, ttl).map_err(FaultError::Store)
    }

    fn forget(&self, id: &str) -> Result<(), Self::Error> {
        self.faults.enter(StoreCall::Forget).map_err(injected)?;
        self.inner.forget(id).map_err(FaultError::Store)
    }
}

impl<S: AsyncStore> AsyncStore for FaultyStore<S> {
    type Error = FaultError<S::Error>;

    async fn seen(&self, id: &str) -> Result<bool, Self::Error> {
        self.faults.enter(StoreCall::Seen).map_err(injected)?;
        self.inner.seen(id).await.map_err(FaultError::Store)
    }

    async fn remember(&self, id: &str) -> Result<(), Self::Error> {
        self.faults.enter(StoreCall::Remember).map_err(injected)?;
        self.inner.remember(id).await.map_err(FaultError::Store)
    }

    async fn remember_for(&self, id: &str, ttl: Option<Duration>) -> Result<(), Self::Error> {
        self.faults.enter(StoreCall::Remember).map_err(injected)?;
        self.inner
            .remember_for(id, ttl)
            .await
            .map_err(FaultError::Store)
    }

    async fn forget(&self, id: &str) -> Result<(), Self::Error> {
        self.faults.enter(StoreCall::Forget).map_err(injected)?;
        self.inner.forget(id).await.map_err(FaultError::Store)
    }
}

impl<S: LeaseStore> LeaseStore for FaultyStore<S> {
    fn claim(&self, id: &str, lease: Duration) -> Result<Claim, Self::Error> {
        self.faults.enter(StoreCall::Claim).map_err(injected)?;
        LeaseStore::claim(&self.inner, id, lease).map_err(FaultError::Store)
    }

    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Result<bool, Self::Error> {
        self.faults.enter(StoreCall::Complete).map_err(injected)?;
        LeaseStore::complete(&self.inner, id, token, ttl).map_err(FaultError::Store)
    }

    fn release(&self, id: &str, token: &LeaseToken) -> Result<bool, Self::Error> {
        self.faults.enter(StoreCall::Release).map_err(injected)?;
        LeaseStore::release(&self.inner, id, token).map_err(FaultError::Store)
    }

    fn renew(&self, id: &str, token: &LeaseToken, lease: Duration) -> Result<bool, Self::Error> {
        self.faults.enter(StoreCall::Renew).map_err(injected)?;
        LeaseStore::renew(&self.inner, id, token, lease).map_err(FaultError::Store)
    }
}

impl<S: AsyncLeaseStore> AsyncLeaseStore for FaultyStore<S> {
    async fn claim(&self, id: &str, lease: Duration) -> Result<Claim, Self::Error> {
        self.faults.enter(StoreCall::Claim).map_err(injected)?;
        AsyncLeaseStore::claim(&self.inner, id, lease)
            .await
            .map_err(FaultError::Store)
    }

    async fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Result<bool, Self::Error> {
        self.faults.enter(StoreCall::Complete).map_err(injected)?;
        AsyncLeaseStore::complete(&self.inner, id, token, ttl)
            .await
            .map_err(FaultError::Store)
    }

    async fn release(&self, id: &str, token: &LeaseToken) -> Result<bool, Self::Error> {
        self.faults.enter(StoreCall::Release).map_err(injected)?;
        AsyncLeaseStore::release(&self.inner, id, token)
            .await
            .map_err(FaultError::Store)
    }

    async fn renew(
        &self,
        id: &str,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<bool, Self::Error> {
        self.faults.enter(StoreCall::Renew).map_err(injected)?;
        AsyncLeaseStore::renew(&self.inner, id, token, lease)
            .await
            .map_err(FaultError::Store)
    }
}

// ---------------------------------------------------------------------------------------
// Redelivery
// ---------------------------------------------------------------------------------------

/// What one delivery ended with.
#[derive(Debug)]
pub enum DeliveryResult {
    /// The guard ran the handler, which succeeded.
    Ran,
    /// The delivery had no usable key: the handler ran, nothing was remembered.
    RanWithoutKey,
    /// A duplicate: the handler did not run.
    Skipped,
    /// Lease mode: the id was in flight elsewhere (the runtime would retry later).
    InFlight,
    /// The guard returned an error (the handler's, or the store's converted).
    Failed(BoxError),
}

/// What [`Redelivery`] observed.
#[derive(Debug, Default)]
pub struct Deliveries {
    /// How many times the handler was invoked (its effects).
    pub effects: usize,
    /// Deliveries that ran the handler successfully (with or without a key).
    pub ran: usize,
    /// Deliveries skipped as duplicates.
    pub skipped: usize,
    /// `InFlight` answers (lease mode; each retry of a delivery counts).
    pub in_flight: usize,
    /// Each delivery's final result, in delivery order.
    pub results: Vec<DeliveryResult>,
}

impl Deliveries {
    /// The errors the guard returned, in delivery order.
    pub fn errors(&self) -> impl Iterator<Item = &BoxError> {
        self.results.iter().filter_map(|r| match r {
            DeliveryResult::Failed(e) => Some(e),
            _ => None,
        })
    }

    /// How many errors say the store was unavailable (by type: a
    /// [`StoreUnavailable`] in the error's chain).
    pub fn unavailable(&self) -> usize {
        self.errors()
            .filter(|e| find_unavailable(e.as_ref()).is_some())
            .count()
    }
}

/// Delivers one envelope several times through the real guard and your handler (see the
/// [module docs](self)).
#[derive(Debug, Clone)]
pub struct Redelivery<'a> {
    envelope: &'a Envelope,
    times: usize,
    at_once: bool,
    ttl: Option<Duration>,
    retry_in_flight: Option<Duration>,
}

impl<'a> Redelivery<'a> {
    /// Deliveries of `envelope` (keyed on its `meta.id`): once, by default.
    pub fn of(envelope: &'a Envelope) -> Self {
        Redelivery {
            envelope,
            times: 1,
            at_once: false,
            ttl: None,
            retry_in_flight: None,
        }
    }

    /// How many deliveries (default 1).
    #[must_use]
    pub fn times(mut self, n: usize) -> Self {
        self.times = n;
        self
    }

    /// All deliveries at once (started together, interleaved at every await), instead
    /// of one after another.
    #[must_use]
    pub fn all_at_once(mut self) -> Self {
        self.at_once = true;
        self
    }

    /// The TTL passed to the guard for the remembered id.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Lease mode: a delivery told `InFlight` tries again after `every` (as the runtime
    /// would redeliver it later) instead of ending with [`DeliveryResult::InFlight`].
    #[must_use]
    pub fn retry_in_flight(mut self, every: Duration) -> Self {
        self.retry_in_flight = Some(every);
        self
    }

    /// Through the seen-set guard ([`Guard::run_async`](babelqueue_core::Guard)).
    pub async fn through_guard<S, H, Fut>(self, store: &S, handler: H) -> Deliveries
    where
        S: AsyncStore + ?Sized,
        S::Error: IntoHandlerError<BoxError>,
        H: Fn(Envelope) -> Fut,
        Fut: Future<Output = Result<(), BoxError>>,
    {
        let effects = AtomicUsize::new(0);
        let one = |_: usize| async {
            let env = self.envelope.clone();
            let fut = handler(env);
            let r = Guard::new(store)
                .ttl(self.ttl)
                .run_async(self.envelope, async {
                    effects.fetch_add(1, Ordering::SeqCst);
                    fut.await
                })
                .await;
            (to_result(r), 0)
        };
        let results = self.drive(one).await;
        self.report(effects.load(Ordering::SeqCst), results)
    }

    /// Through the lease guard (the lease-mode [`Guard`] (async)) with `lease`.
    pub async fn through_lease_guard<S, H, Fut>(
        self,
        store: &S,
        lease: Duration,
        handler: H,
    ) -> Deliveries
    where
        S: AsyncLeaseStore + ?Sized,
        S::Error: IntoHandlerError<BoxError>,
        H: Fn(Envelope) -> Fut,
        Fut: Future<Output = Result<(), BoxError>>,
    {
        let effects = AtomicUsize::new(0);
        let one = |_: usize| async {
            let mut in_flight = 0;
            loop {
                let fut = handler(self.envelope.clone());
                let r = Guard::new(store)
                    .ttl(self.ttl)
                    .lease(lease)
                    .run_async(self.envelope, async {
                        effects.fetch_add(1, Ordering::SeqCst);
                        fut.await
                    })
                    .await;
                let r = to_result(r);
                match (&r, self.retry_in_flight) {
                    (DeliveryResult::InFlight, Some(every)) => {
                        in_flight += 1;
                        tokio::time::sleep(every).await;
                    }
                    (DeliveryResult::InFlight, None) => return (r, in_flight + 1),
                    _ => return (r, in_flight),
                }
            }
        };
        let results = self.drive(one).await;
        self.report(effects.load(Ordering::SeqCst), results)
    }

    async fn drive<Fut>(&self, one: impl Fn(usize) -> Fut) -> Vec<(DeliveryResult, usize)>
    where
        Fut: Future<Output = (DeliveryResult, usize)>,
    {
        if !self.at_once {
            let mut out = Vec::with_capacity(self.times);
            for i in 0..self.times {
                out.push(one(i).await);
            }
            return out;
        }
        join_all((0..self.times).map(one).collect()).await
    }

    fn report(&self, effects: usize, results: Vec<(DeliveryResult, usize)>) -> Deliveries {
        let mut d = Deliveries {
            effects,
            ..Deliveries::default()
        };
        for (r, in_flight) in results {
            d.in_flight += in_flight;
            match r {
                DeliveryResult::Ran | DeliveryResult::RanWithoutKey => d.ran += 1,
                DeliveryResult::Skipped => d.skipped += 1,
                DeliveryResult::InFlight | DeliveryResult::Failed(_) => {}
            }
            d.results.push(r);
        }
        d
    }
}

fn to_result(r: Result<Guarded, BoxError>) -> DeliveryResult {
    match r.map(Outcome::from) {
        Ok(Outcome::Ran) => DeliveryResult::Ran,
        Ok(Outcome::RanWithoutKey) => DeliveryResult::RanWithoutKey,
        Ok(Outcome::Skipped) => DeliveryResult::Skipped,
        Err(e) if e.downcast_ref::<InFlight>().is_some() => DeliveryResult::InFlight,
        Err(e) => DeliveryResult::Failed(e),
    }
}

/// Polls every future until all are done (in one task), returning their outputs in order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
