//! [`Metered`]: a dedupe store wrapper that times every call.

use std::borrow::Cow;
use std::future::Future;
use std::time::{Duration, Instant};

use super::{STORE_CALL_DURATION_SECONDS, STORE_ERRORS_TOTAL};
use babelqueue_core::lease::{AsyncLeaseStore, Claim, LeaseStore, LeaseToken};
use babelqueue_core::store::{AsyncStore, Store};

/// A dedupe store that records the latency of every call in
/// `babelqueue_store_call_duration_seconds{store, op}` and its failures in
/// `babelqueue_store_errors_total{store, op}` (feature `metrics`), and otherwise behaves
/// exactly like the store it wraps: it implements [`Store`], [`AsyncStore`],
/// [`LeaseStore`] and [`AsyncLeaseStore`] whenever the inner store does, so it goes
/// wherever the inner store went (`#[idempotent(store = …)]`, [`Guard`](babelqueue_core::Guard),
/// [`DynStore`](babelqueue_core::dyn_store::DynStore)).
///
/// `op` is `seen`, `remember` (also for `remember_for`), `forget`, `claim`, `complete` or
/// `release`; `store` is the name given to [`new`](Self::new).
///
/// ```
/// use babelqueue_core::{Guard, Envelope, InMemoryStore};
/// use babelqueue_runtime::metrics::Metered;
///
/// let store = Metered::new(InMemoryStore::new(), "memory");
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
/// Guard::new(&store).run(&env, || ())?; // one `seen` and one `remember`, both timed
/// assert_eq!(store.name(), "memory");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Metered<S> {
    inner: S,
    name: Cow<'static, str>,
}

impl<S> Metered<S> {
    /// Wraps `inner`; its calls are labelled `store = name` (e.g. `"redis"`).
    pub fn new(inner: S, name: impl Into<Cow<'static, str>>) -> Self {
        Metered {
            inner,
            name: name.into(),
        }
    }

    /// The `store` label.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The wrapped store, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }

    fn record<T, E>(&self, op: &'static str, started: Instant, r: &Result<T, E>) {
        let elapsed: Duration = started.elapsed();
        metrics::histogram!(STORE_CALL_DURATION_SECONDS, "store" => self.name.clone(), "op" => op)
            .record(elapsed.as_secs_f64());
        if r.is_err() {
            metrics::counter!(STORE_ERRORS_TOTAL, "store" => self.name.clone(), "op" => op)
                .increment(1);
        }
    }

    fn timed<T, E>(&self, op: &'static str, f: impl FnOnce(&S) -> Result<T, E>) -> Result<T, E> {
        let started = Instant::now();
        let r = f(&self.inner);
        self.record(op, started, &r);
        r
    }

    async fn timed_async<T, E>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let r = fut.await;
        self.record(op, started, &r);
        r
    }
}

impl<S: Store> Store for Metered<S> {
    type Error = S::Error;

    fn seen(&self, id: &str) -> Result<bool, Self::Error> {
        self.timed("seen", |s| s.seen(id))
    }

    fn remember(&self, id: &str) -> Result<(), Self::Error> {
        self.timed("remember", |s| s.remember(id))
    }

    fn remember_for(&self, id: &str, ttl: Option<Duration>) -> Result<(), Self::Error> {
        self.timed("remember", |s| s.remember_for(id, ttl))
    }

    fn forget(&self, id: &str) -> Result<(), Self::Error> {
        self.timed("forget", |s| s.forget(id))
    }
}

impl<S: LeaseStore> LeaseStore for Metered<S> {
    fn claim(&self, id: &str, lease: Duration) -> Result<Claim, Self::Error> {
        self.timed("claim", |s| s.claim(id, lease))
    }

    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Result<bool, Self::Error> {
        self.timed("complete", |s| s.complete(id, token, ttl))
    }

    fn release(&self, id: &str, token: &LeaseToken) -> Result<bool, Self::Error> {
        self.timed("release", |s| s.release(id, token))
    }
}

impl<S: AsyncStore> AsyncStore for Metered<S> {
    type Error = S::Error;

    fn seen(&self, id: &str) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        self.timed_async("seen", self.inner.seen(id))
    }

    fn remember(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.timed_async("remember", self.inner.remember(id))
    }

    fn remember_for(
        &self,
        id: &str,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.timed_async("remember", self.inner.remember_for(id, ttl))
    }

    fn forget(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.timed_async("forget", self.inner.forget(id))
    }
}

impl<S: AsyncLeaseStore> AsyncLeaseStore for Metered<S> {
    fn claim(
        &self,
        id: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, Self::Error>> + Send {
        self.timed_async("claim", self.inner.claim(id, lease))
    }

    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        self.timed_async("complete", self.inner.complete(id, token, ttl))
    }

    fn release(
        &self,
        id: &str,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        self.timed_async("release", self.inner.release(id, token))
    }
}
