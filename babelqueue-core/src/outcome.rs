//! What a handler returns and what the guard did with a delivery: the bottom layer the
//! stores, the lease and transaction modes and the guard all build on (it imports no
//! other module of the crate). The public paths are [`crate::guard`]'s.

use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;

/// A boxed, thread-safe error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A boxed `Send` future.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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
/// use babelqueue_core::guard::{capture_outcome, Guard};
/// use babelqueue_core::{InMemoryStore, Outcome};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let handler = || async {
///     Guard::new(&store).run_async("id-A", async { Ok::<(), std::io::Error>(()) }).await.map(|_| ())
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
/// use babelqueue_core::guard::{capture_outcome_sync, Guard};
/// use babelqueue_core::{InMemoryStore, Outcome};
/// let store = InMemoryStore::new();
/// let run = || Guard::new(&store).run("id-A", || ()).map(|_| ());
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
