//! In-flight lease mode: atomic claims that stop two workers running the same id at once.
//!
//! The seen-set contract is post-success dedupe: two workers that both check `seen` before
//! either remembers both run the handler. A store that can claim atomically implements
//! [`LeaseStore`] / [`AsyncLeaseStore`], and the [`Guard`](crate::Guard) in lease mode
//! (`Guard::new(&store).lease(length)`, or `#[idempotent(lease = "30s")]`) then:
//!
//! 1. claims the id as in flight, with a lease that expires by itself;
//! 2. an id already completed → skip (acked);
//! 3. an id in flight elsewhere → returns [`InFlight`] (do not run, do not ack: retry later);
//! 4. handler ok → [`complete`](LeaseStore::complete) (marks it seen, with the TTL if any);
//!    handler error → [`release`](LeaseStore::release) so the retry runs.
//!
//! Only the holder of the [`LeaseToken`] can complete, release or renew a claim.
//!
//! # Leases that hold
//!
//! While the handler runs, the guard **renews** the lease every third of its length
//! ([`renew`](LeaseStore::renew), a compare-and-extend on the holder's token), from a task
//! beside an async handler or a thread beside a blocking one. So a handler slower than
//! its lease keeps the id to itself: other deliveries get [`InFlight`] until it completes,
//! then skip. A renewal that fails is never silent: each store error is logged
//! (`tracing::warn!` with the id), and a renewal the store refuses (the lease already
//! ended and the id may be running elsewhere) is logged and reported in the guard's
//! typed report ([`Guarded::lease`](crate::Guarded::lease)). When
//! `complete` is refused because the lease was lost, the guard still remembers the id if
//! no other worker holds it (a plain `remember`), so a later duplicate is skipped.
//!
//! # Fencing tokens
//!
//! Every successful claim carries a **fencing token** ([`LeaseToken::fence`]): a number
//! that increases with every claim of the same id (in-memory: a per-store counter;
//! SQLite: a counter row in the file; PostgreSQL: a sequence; Redis: a per-id counter key
//! beside the id's key, in the same cluster slot). While the handler runs it can read its
//! token with [`current_fencing_token`] and send it with its downstream writes; a
//! downstream that keeps the highest token it has seen per resource and refuses lower
//! ones rejects a holder that lost its lease (paused, partitioned) after a newer holder
//! wrote.
//!
//! # What lease mode guarantees, and what it cannot
//!
//! * Two workers never run the handler for one id at the same time **while the holder's
//!   renewals reach the store**: the lease is extended long before it ends.
//! * A holder that dies stops renewing: its lease ends after at most its length and the
//!   next delivery runs.
//! * It cannot undo an effect that happened just before a crash: a holder that charged a
//!   card and died before `complete` leaves the id unmarked, and the redelivery charges
//!   again after the lease ends. Closing that window needs the effect and the mark in one
//!   transaction, or a downstream that dedupes on the id or the fencing token.
//! * A holder cut off from the store (a partition longer than the lease) keeps running
//!   while another worker may claim the id: the loss is reported, and only a fencing
//!   token checked downstream stops the stale holder's writes.

use std::cell::Cell;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use crate::outcome::HandlerResult;
use crate::store::{AsyncStore, Store};

/// An opaque token proving who holds a claim, with the claim's fencing token.
///
/// Two tokens are equal when their text is (the fencing token follows from the claim).
#[derive(Debug, Clone)]
pub struct LeaseToken {
    token: String,
    fence: Option<u64>,
}

impl PartialEq for LeaseToken {
    fn eq(&self, other: &Self) -> bool {
        self.token == other.token
    }
}

impl Eq for LeaseToken {}

impl std::hash::Hash for LeaseToken {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.token.hash(state);
    }
}

impl LeaseToken {
    /// A fresh random token (UUID v4), without a fencing token.
    pub fn new() -> Self {
        LeaseToken {
            token: uuid::Uuid::new_v4().simple().to_string(),
            fence: None,
        }
    }

    /// Wraps a token read back from a store.
    pub fn from_string(token: impl Into<String>) -> Self {
        LeaseToken {
            token: token.into(),
            fence: None,
        }
    }

    /// The same token carrying the claim's fencing token (what a store's `claim` sets).
    ///
    /// ```
    /// let t = babelqueue_core::lease::LeaseToken::new().with_fence(7);
    /// assert_eq!(t.fence(), Some(7));
    /// ```
    #[must_use]
    pub fn with_fence(mut self, fence: u64) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The claim's fencing token: larger for every later claim of the same id.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// The token as text (what a store writes).
    pub fn as_str(&self) -> &str {
        &self.token
    }
}

impl Default for LeaseToken {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.token)
    }
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This caller holds the id until the lease ends; run the handler.
    Acquired(LeaseToken),
    /// The id was already processed: skip.
    Completed,
    /// Another worker holds an unexpired lease on the id.
    InFlight,
}

/// The id is being processed by another worker right now: do not run and do not ack;
/// the message should be retried later (the other worker may still fail).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message {id} is in flight on another worker (lease not expired); retry later")]
pub struct InFlight {
    /// The key that is in flight.
    pub id: String,
}

/// A blocking store that can claim ids atomically.
///
/// While a claim is held (not yet completed or released, lease not ended), `seen`
/// reports the id as seen, which is how the shared Redis and PostgreSQL layouts show it to
/// every SDK's seen-set consumer; `forget` drops a held claim (its holder can then no
/// longer complete it). `babelqueue-testing` (the store test suite) checks all of this.
pub trait LeaseStore: Store {
    /// Atomically: completed → [`Claim::Completed`]; held under an unexpired lease →
    /// [`Claim::InFlight`]; otherwise claim it for `lease` → [`Claim::Acquired`].
    fn claim(&self, id: &str, lease: Duration) -> Result<Claim, Self::Error>;

    /// Marks a claimed id completed (seen, for `ttl` or the store default) if `token`
    /// still holds it. Returns whether it did.
    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Result<bool, Self::Error>;

    /// Releases a claim if `token` still holds it, so the next delivery runs. Returns
    /// whether it did.
    fn release(&self, id: &str, token: &LeaseToken) -> Result<bool, Self::Error>;

    /// Extends a held claim to end `lease` from now, if `token` still holds it and its
    /// lease has not ended. Returns whether it did (`false`: the lease is lost). The guard
    /// calls it every third of the lease while the handler runs.
    ///
    /// The default cannot renew and answers `false`, so the guard reports the lease as
    /// lost at the first renewal: every store of this project overrides it.
    fn renew(&self, id: &str, token: &LeaseToken, lease: Duration) -> Result<bool, Self::Error> {
        let _ = (id, token, lease);
        Ok(false)
    }
}

/// The async counterpart of [`LeaseStore`].
pub trait AsyncLeaseStore: AsyncStore {
    /// See [`LeaseStore::claim`].
    fn claim(
        &self,
        id: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, Self::Error>> + Send;

    /// See [`LeaseStore::complete`].
    fn complete(
        &self,
        id: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// See [`LeaseStore::release`].
    fn release(
        &self,
        id: &str,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// See [`LeaseStore::renew`] (the default likewise answers `false`).
    fn renew(
        &self,
        id: &str,
        token: &LeaseToken,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        let _ = (id, token, lease);
        std::future::ready(Ok(false))
    }
}

macro_rules! forward_lease {
    ($(impl[$($g:tt)*] for $ty:ty;)*) => {$(
        impl<$($g)*> LeaseStore for $ty {
            fn claim(&self, id: &str, lease: Duration) -> Result<Claim, Self::Error> {
                S::claim(self, id, lease)
            }
            fn complete(&self, id: &str, token: &LeaseToken, ttl: Option<Duration>)
                -> Result<bool, Self::Error> {
                S::complete(self, id, token, ttl)
            }
            fn release(&self, id: &str, token: &LeaseToken) -> Result<bool, Self::Error> {
                S::release(self, id, token)
            }
            fn renew(&self, id: &str, token: &LeaseToken, lease: Duration)
                -> Result<bool, Self::Error> {
                S::renew(self, id, token, lease)
            }
        }
    )*};
}

macro_rules! forward_async_lease {
    ($(impl[$($g:tt)*] for $ty:ty;)*) => {$(
        impl<$($g)*> AsyncLeaseStore for $ty {
            fn claim(&self, id: &str, lease: Duration)
                -> impl Future<Output = Result<Claim, Self::Error>> + Send {
                S::claim(self, id, lease)
            }
            fn complete(&self, id: &str, token: &LeaseToken, ttl: Option<Duration>)
                -> impl Future<Output = Result<bool, Self::Error>> + Send {
                S::complete(self, id, token, ttl)
            }
            fn release(&self, id: &str, token: &LeaseToken)
                -> impl Future<Output = Result<bool, Self::Error>> + Send {
                S::release(self, id, token)
            }
            fn renew(&self, id: &str, token: &LeaseToken, lease: Duration)
                -> impl Future<Output = Result<bool, Self::Error>> + Send {
                S::renew(self, id, token, lease)
            }
        }
    )*};
}

forward_lease! {
    impl[S: LeaseStore + ?Sized] for &S;
    impl[S: LeaseStore + ?Sized] for Box<S>;
    impl[S: LeaseStore + ?Sized] for std::sync::Arc<S>;
    impl[S: LeaseStore, F: FnOnce() -> S] for std::sync::LazyLock<S, F>;
    impl[S: LeaseStore, F: FnOnce() -> S] for once_cell::sync::Lazy<S, F>;
}

forward_async_lease! {
    impl[S: AsyncLeaseStore + ?Sized] for &S;
    impl[S: AsyncLeaseStore + ?Sized] for Box<S>;
    impl[S: AsyncLeaseStore + ?Sized] for std::sync::Arc<S>;
    impl[S: AsyncLeaseStore, F: FnOnce() -> S + Send] for std::sync::LazyLock<S, F>;
    impl[S: AsyncLeaseStore, F: FnOnce() -> S + Send] for once_cell::sync::Lazy<S, F>;
}

// ---------------------------------------------------------------------------------------
// Fencing token of the running handler
// ---------------------------------------------------------------------------------------

tokio::task_local! {
    static FENCE: Option<u64>;
}

thread_local! {
    static FENCE_SYNC: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The fencing token of the lease the current handler runs under, when it runs inside
/// a [`Guard`](crate::Guard) in lease mode (or `#[idempotent(lease = …)]`) and the store hands out fencing tokens (all of this
/// project's do). `None` outside a leased handler.
///
/// Send it with the handler's downstream writes: the token is larger for every later
/// claim of the same id, so a downstream keeping the highest token per resource refuses
/// a stale holder. Read it in the handler's own task (async) or thread (blocking): a task
/// the handler spawns does not inherit it.
///
/// ```
/// use std::time::Duration;
/// use babelqueue_core::lease::current_fencing_token;
/// use babelqueue_core::{Guard, InFlight, InMemoryStore};
///
/// #[derive(Debug)]
/// struct Busy;
/// impl From<InFlight> for Busy { fn from(_: InFlight) -> Self { Busy } }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// assert_eq!(current_fencing_token(), None);
/// Guard::new(&store).lease(Duration::from_secs(30)).run_async("pay_7f3a", async {
///     let fence = current_fencing_token().expect("set while the leased handler runs");
///     assert!(fence >= 1);
///     Ok::<(), Busy>(())
/// })
/// .await
/// .unwrap();
/// # });
/// ```
pub fn current_fencing_token() -> Option<u64> {
    FENCE
        .try_with(|f| *f)
        .ok()
        .flatten()
        .or_else(|| FENCE_SYNC.with(Cell::get))
}

/// Sets the blocking handler's fencing token on this thread while `f` runs.
fn with_fence_sync<T>(fence: Option<u64>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<u64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FENCE_SYNC.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(FENCE_SYNC.with(|c| c.replace(fence)));
    f()
}

// ---------------------------------------------------------------------------------------
// Renewal and the typed report
// ---------------------------------------------------------------------------------------

/// Why a lease was lost while (or right after) its handler ran.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseLostCause {
    /// A renewal was refused: the lease had already ended (renewals did not reach the
    /// store in time, or the id was forgotten), and another worker may run the id.
    RenewRefused,
    /// `complete` was refused: the lease had ended by the time the handler finished.
    CompleteRefused,
    /// `complete` failed with a store error (its text); the id may not be marked.
    CompleteFailed(String),
}

impl std::fmt::Display for LeaseLostCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseLostCause::RenewRefused => f.write_str("a renewal was refused"),
            LeaseLostCause::CompleteRefused => f.write_str("complete was refused"),
            LeaseLostCause::CompleteFailed(e) => write!(f, "complete failed: {e}"),
        }
    }
}

/// What happened to the lease of one guarded delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseHealth {
    /// No lease was taken (no key, a skipped duplicate).
    NotClaimed,
    /// The lease held from claim to `complete` / `release`.
    Held,
    /// The lease was lost; the handler may have run elsewhere too.
    Lost(LeaseLostCause),
}

/// How often a lease is renewed: every third of it.
pub(crate) fn renew_interval(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

fn renew_refused(key: &str) {
    tracing::warn!(
        key,
        "lease lost: the store refused to renew it (it had already ended); \
         another worker may run this id"
    );
}

fn renew_failed(key: &str, err: &dyn std::error::Error) {
    tracing::warn!(
        key,
        error = %err,
        "renewing the lease failed; retrying (the lease ends if no renewal reaches the store)"
    );
}

/// Runs a blocking handler under a held claim, renewing it from a thread beside it.
/// Returns the handler's result and the cause if a renewal was refused.
pub(crate) fn run_renewing_sync<S, F, R>(
    store: &S,
    key: &str,
    token: &LeaseToken,
    lease: Duration,
    handler: F,
) -> (Result<(), R::Error>, Option<LeaseLostCause>)
where
    S: LeaseStore + Sync + ?Sized,
    F: FnOnce() -> R,
    R: HandlerResult,
{
    let every = renew_interval(lease);
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let renewer = scope.spawn(move || {
            loop {
                match stopped.recv_timeout(every) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return None,
                }
                match store.renew(key, token, lease) {
                    Ok(true) => {}
                    Ok(false) => {
                        renew_refused(key);
                        return Some(LeaseLostCause::RenewRefused);
                    }
                    Err(e) => renew_failed(key, &e),
                }
            }
        });
        let result = with_fence_sync(token.fence(), || handler().into_result());
        drop(stop);
        let lost = renewer.join().unwrap_or(None);
        (result, lost)
    })
}

/// Runs an async handler under a held claim, renewing it beside the handler in the same
/// task. Returns the handler's result and the cause if a renewal was refused.
pub(crate) async fn run_renewing_async<S, Fut, R>(
    store: &S,
    key: &str,
    token: &LeaseToken,
    lease: Duration,
    handler: Fut,
) -> (Result<(), R::Error>, Option<LeaseLostCause>)
where
    S: AsyncLeaseStore + ?Sized,
    Fut: Future<Output = R>,
    R: HandlerResult,
{
    let handler = FENCE.scope(token.fence(), handler);
    if tokio::runtime::Handle::try_current().is_err() {
        tracing::warn!(
            key,
            "no tokio runtime: the lease cannot be renewed while the handler runs"
        );
        return (handler.await.into_result(), None);
    }
    let lost: Mutex<Option<LeaseLostCause>> = Mutex::new(None);
    let renewals = async {
        let every = renew_interval(lease);
        loop {
            tokio::time::sleep(every).await;
            match store.renew(key, token, lease).await {
                Ok(true) => {}
                Ok(false) => {
                    renew_refused(key);
                    *lost.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(LeaseLostCause::RenewRefused);
                    return;
                }
                Err(e) => renew_failed(key, &e),
            }
        }
    };
    tokio::pin!(handler);
    let out = tokio::select! {
        biased;
        out = &mut handler => out,
        () = renewals => (&mut handler).await,
    };
    let lost = lost.into_inner().unwrap_or_else(|e| e.into_inner());
    (out.into_result(), lost)
}
