//! The idempotency guard: [`Guard`], what `#[idempotent]` expands to.
//!
//! One type holds the store and the options (a TTL for the remembered key, lease mode with
//! its length, a payload fingerprint, a transaction) and runs a blocking closure
//! ([`run`](Guard::run)) or an async future ([`run_async`](Guard::run_async)); every mode
//! returns a [`Guarded`] report.
//!
//! The contract every BabelQueue SDK's guard follows, for a key `k` (by default the
//! envelope's `meta.id`):
//!
//! 1. no usable key (absent or empty) → run the handler, remember nothing (**fail open**);
//! 2. `seen(k)` → skip: do not call the handler, return [`Outcome::Skipped`] so the
//!    runtime acks;
//! 3. otherwise run the handler; only on success `remember(k)`; an error leaves `k`
//!    unmarked so retry and dead-letter still apply;
//! 4. `seen` fails → the store's error is returned (converted into the handler's error
//!    type) and the handler does not run; `remember` fails after a successful handler →
//!    logged with `tracing::warn!` and the call still succeeds (the known at-least-once
//!    window). Inside the consume runtime the write is not given up: it is retried with
//!    the store backoff while the message stays unacknowledged and the key's turn stays
//!    held, and only a shutdown past its grace period (or a crash) leaves it, the message
//!    then being left unacked for recovery (see `ARCHITECTURE.md`, *Owed writes*).
//!
//! ```
//! use babelqueue_core::{Envelope, Guard, InMemoryStore, Outcome};
//!
//! let store = InMemoryStore::new();
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
//! let mut charges = 0;
//! let guard = Guard::new(&store);
//! let first = guard.run(&env, || -> Result<(), std::io::Error> { charges += 1; Ok(()) })?;
//! let second = guard.run(&env, || -> Result<(), std::io::Error> { charges += 1; Ok(()) })?;
//! assert_eq!((first.outcome, second.outcome, charges), (Outcome::Ran, Outcome::Skipped, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use crate::fingerprint::{
    self, AsyncFingerprintStore, Fingerprint, FingerprintStore, PayloadMismatch,
};
use crate::hooks;
use crate::key::DedupeKey;
use crate::lease::{
    self, AsyncLeaseStore, Claim, InFlight, LeaseHealth, LeaseLostCause, LeaseStore, LeaseToken,
};
use crate::outcome::{done, remember_failed, skipped};
use crate::store::{AsyncStore, IntoHandlerError, Store};
use crate::txn::{AsyncTransactionalStore, TransactionalStore};

pub use crate::outcome::{HandlerResult, Outcome, capture_outcome, capture_outcome_sync};

/// The idempotency guard over the store `S`, in the mode `M`: [`Dedupe`] (the seen set,
/// the default), [`Leased`] (claim the key before running), [`Fingerprinted`] (refuse a
/// duplicate whose payload differs) or [`Transactional`] (run the handler in one database
/// transaction with the key's row).
///
/// Built with [`Guard::new`] and the options [`ttl`](Guard::ttl),
/// [`lease`](Guard::lease), [`fingerprint`](Guard::fingerprint) and
/// [`transaction`](Guard::transaction); it is `Copy`, so one value can guard many calls.
/// Each mode's [`run`](Guard::run) takes a blocking closure and its
/// [`run_async`](Guard::run_async) a future (only polled if the handler must run); both
/// return [`Guarded`]: the [`Outcome`], and in lease mode the claim's fencing token and
/// whether the lease held.
///
/// The store's error must convert into the handler's error
/// (`S::Error: IntoHandlerError<R::Error>`); with a store that cannot fail, such as
/// [`InMemoryStore`](crate::InMemoryStore), a handler returning `()` works too.
///
/// ```
/// use std::time::Duration;
/// use babelqueue_core::{Guard, InMemoryStore, Outcome};
///
/// let store = InMemoryStore::new();
/// let guard = Guard::new(&store).ttl(Duration::from_secs(3600));
/// assert_eq!(guard.run("id-A", || ())?, Outcome::Ran);
/// assert_eq!(guard.run("id-A", || ())?, Outcome::Skipped);
/// # Ok::<(), std::convert::Infallible>(())
/// ```
pub struct Guard<'s, S: ?Sized, M = Dedupe> {
    store: &'s S,
    ttl: Option<Duration>,
    mode: M,
}

impl<S: ?Sized, M: Clone> Clone for Guard<'_, S, M> {
    fn clone(&self) -> Self {
        Guard {
            store: self.store,
            ttl: self.ttl,
            mode: self.mode.clone(),
        }
    }
}

impl<S: ?Sized, M: Copy> Copy for Guard<'_, S, M> {}

impl<S: ?Sized, M: std::fmt::Debug> std::fmt::Debug for Guard<'_, S, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("store", &std::any::type_name::<S>())
            .field("ttl", &self.ttl)
            .field("mode", &self.mode)
            .finish()
    }
}

/// The seen-set mode of a [`Guard`] (the default): skip a key already remembered,
/// remember it after the handler succeeds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dedupe;

/// Lease mode (see [`crate::lease`]): the key is claimed for the lease's length before the
/// handler runs and renewed beside it, so two workers never run it at the same moment.
#[derive(Debug, Clone, Copy)]
pub struct Leased {
    length: Duration,
}

/// Fingerprint mode (see [`crate::fingerprint`]): a duplicate whose payload fingerprint
/// differs from the first delivery's is refused with [`PayloadMismatch`].
#[derive(Debug, Clone, Copy)]
pub struct Fingerprinted {
    fingerprint: Fingerprint,
}

/// Transaction mode (see [`crate::txn`]): the handler receives the store's transaction,
/// committed with the key's row. `P` is `()`, or the [`Fingerprint`] stored and checked
/// with the row.
#[derive(Debug, Clone, Copy)]
pub struct Transactional<P = ()> {
    fingerprint: P,
}

impl<'s, S: ?Sized> Guard<'s, S> {
    /// The seen-set guard over `store`, with the store's default TTL.
    #[inline]
    pub const fn new(store: &'s S) -> Self {
        Guard {
            store,
            ttl: None,
            mode: Dedupe,
        }
    }

    /// Lease mode: claims the key for `length` before running the handler, renews the
    /// claim every third of `length` beside it, and marks the key completed when the
    /// handler succeeds. An id in flight elsewhere returns [`InFlight`] converted into the
    /// handler's error (so that error type must implement `From<InFlight>`): do not ack,
    /// retry later. The store must implement [`LeaseStore`] / [`AsyncLeaseStore`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use babelqueue_core::lease::LeaseHealth;
    /// use babelqueue_core::{Guard, InFlight, InMemoryStore, Outcome};
    ///
    /// #[derive(Debug)]
    /// struct Busy;
    /// impl From<InFlight> for Busy { fn from(_: InFlight) -> Self { Busy } }
    ///
    /// let store = InMemoryStore::new();
    /// let guard = Guard::new(&store).lease(Duration::from_secs(30));
    /// let r = guard.run("id-A", || Ok::<(), Busy>(())).unwrap();
    /// assert_eq!((r.outcome, r.lease), (Outcome::Ran, LeaseHealth::Held));
    /// assert!(r.fencing_token.is_some());
    /// assert_eq!(guard.run("id-A", || Ok::<(), Busy>(())).unwrap(), Outcome::Skipped);
    /// ```
    #[inline]
    pub const fn lease(self, length: Duration) -> Guard<'s, S, Leased> {
        Guard {
            store: self.store,
            ttl: self.ttl,
            mode: Leased { length },
        }
    }

    /// Fingerprint mode: a seen key whose stored fingerprint differs from `fingerprint`
    /// returns [`PayloadMismatch`] (converted into the handler's error) instead of
    /// skipping; on success the key is remembered with `fingerprint`. The store must
    /// implement [`FingerprintStore`] / [`AsyncFingerprintStore`].
    ///
    /// ```
    /// use babelqueue_core::fingerprint::{Fingerprint, PayloadMismatch};
    /// use babelqueue_core::{Guard, InMemoryStore, Outcome};
    ///
    /// let store = InMemoryStore::new();
    /// let fp = |amount: u32| Fingerprint::of_data(&serde_json::json!({"amount": amount}));
    /// let ok = || Ok::<(), PayloadMismatch>(());
    /// assert_eq!(Guard::new(&store).fingerprint(fp(1)).run("k", ok)?, Outcome::Ran);
    /// assert_eq!(Guard::new(&store).fingerprint(fp(1)).run("k", ok)?, Outcome::Skipped);
    /// let err = Guard::new(&store).fingerprint(fp(2)).run("k", ok).unwrap_err();
    /// assert!(err.to_string().contains("differs from the first delivery"));
    /// # Ok::<(), PayloadMismatch>(())
    /// ```
    #[inline]
    pub const fn fingerprint(self, fingerprint: Fingerprint) -> Guard<'s, S, Fingerprinted> {
        Guard {
            store: self.store,
            ttl: self.ttl,
            mode: Fingerprinted { fingerprint },
        }
    }

    /// Transaction mode: the handler receives the store's open transaction, committed
    /// together with the key's row (see [`crate::txn`]). The store must implement
    /// [`TransactionalStore`] (SQLite) / [`AsyncTransactionalStore`] (PostgreSQL).
    #[inline]
    pub const fn transaction(self) -> Guard<'s, S, Transactional> {
        Guard {
            store: self.store,
            ttl: self.ttl,
            mode: Transactional { fingerprint: () },
        }
    }
}

impl<'s, S: ?Sized> Guard<'s, S, Fingerprinted> {
    /// Transaction mode storing and checking the fingerprint with the key's row.
    #[inline]
    pub const fn transaction(self) -> Guard<'s, S, Transactional<Fingerprint>> {
        Guard {
            store: self.store,
            ttl: self.ttl,
            mode: Transactional {
                fingerprint: self.mode.fingerprint,
            },
        }
    }
}

impl<'s, S: ?Sized> Guard<'s, S, Transactional> {
    /// Stores `fingerprint` with the key's row and refuses a duplicate whose payload
    /// differs (see [`Guard::fingerprint`]).
    #[inline]
    pub const fn fingerprint(
        self,
        fingerprint: Fingerprint,
    ) -> Guard<'s, S, Transactional<Fingerprint>> {
        Guard {
            store: self.store,
            ttl: self.ttl,
            mode: Transactional { fingerprint },
        }
    }
}

impl<S: ?Sized, M> Guard<'_, S, M> {
    /// How long the store keeps the key once the handler succeeded (`None`, the default:
    /// the store's own retention). Takes a `Duration` or an `Option<Duration>`.
    #[inline]
    #[must_use]
    pub fn ttl(mut self, ttl: impl Into<Option<Duration>>) -> Self {
        self.ttl = ttl.into();
        self
    }

    /// The store this guard asks.
    #[inline]
    pub fn store(&self) -> &S {
        self.store
    }
}

/// What a [`Guard`] did with one delivery: its [`Outcome`], and in lease mode the claim's
/// fencing token and whether the lease held. Compares equal to its [`Outcome`]
/// (`guard.run(..)? == Outcome::Ran`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guarded {
    /// What the guard did with the delivery.
    pub outcome: Outcome,
    /// The fencing token of the claim the handler ran under (`None`: no claim; always
    /// `None` outside lease mode).
    pub fencing_token: Option<u64>,
    /// Whether the lease held ([`LeaseHealth::NotClaimed`] outside lease mode, for a
    /// delivery without a key, and for a skipped duplicate).
    pub lease: LeaseHealth,
}

impl Guarded {
    /// A report with no claim: what every mode but lease mode returns.
    #[inline]
    pub const fn unclaimed(outcome: Outcome) -> Self {
        Guarded {
            outcome,
            fencing_token: None,
            lease: LeaseHealth::NotClaimed,
        }
    }

    /// Whether the handler was invoked.
    #[inline]
    pub fn ran(&self) -> bool {
        self.outcome.ran()
    }
}

impl PartialEq<Outcome> for Guarded {
    fn eq(&self, other: &Outcome) -> bool {
        self.outcome == *other
    }
}

impl From<Guarded> for Outcome {
    fn from(g: Guarded) -> Outcome {
        g.outcome
    }
}

// --- seen-set mode ---------------------------------------------------------------------

impl<S: Store + ?Sized> Guard<'_, S, Dedupe> {
    /// Guards a blocking handler, keyed on `key` (pass `&envelope` to key on `meta.id`).
    /// See the [module docs](self) for the contract.
    pub fn run<K, F, R>(self, key: K, handler: F) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        F: FnOnce() -> R,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
    {
        self.run_converting(key, handler, IntoHandlerError::into_handler_error)
    }

    /// [`run`](Self::run) with the conversion of the store's error into the handler's
    /// error given as a value (`store_error`) instead of the bound
    /// `S::Error: IntoHandlerError<R::Error>`. What the `#[idempotent]` expansion calls:
    /// it names the conversion at the user's return type, so a store error that does not
    /// convert is reported there, once.
    #[doc(hidden)]
    pub fn run_converting<K, F, R, C>(
        self,
        key: K,
        handler: F,
        store_error: C,
    ) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        F: FnOnce() -> R,
        R: HandlerResult,
        C: FnOnce(S::Error) -> R::Error,
    {
        let (store, ttl) = (self.store, self.ttl);
        let Some(key) = key.dedupe_key() else {
            handler().into_result()?;
            return Ok(Guarded::unclaimed(done(Outcome::RanWithoutKey)));
        };
        let _turn = hooks::turn_blocking(&key);
        if hooks::store_before_sync(&key, || store.seen(&key)).map_err(store_error)? {
            return Ok(Guarded::unclaimed(skipped(&key)));
        }
        hooks::handler_runs();
        handler().into_result()?;
        if let Err(err) = hooks::owed_write_sync(&key, "remember", || store.remember_for(&key, ttl))
        {
            remember_failed(&key, &err);
        }
        Ok(Guarded::unclaimed(done(Outcome::Ran)))
    }
}

impl<S: AsyncStore + ?Sized> Guard<'_, S, Dedupe> {
    /// Guards an async handler (pass its future, which is only polled if it must run).
    /// See the [module docs](self) for the contract.
    ///
    /// Returns a future that does nothing until polled (the key is read and the store
    /// asked on the first poll), may be dropped at any point (the handler's future with
    /// it), and is `Send` when the store, the key and the handler's future are.
    ///
    /// ```
    /// use babelqueue_core::{Envelope, Guard, InMemoryStore, Outcome};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let store = InMemoryStore::new();
    /// let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
    /// let out = Guard::new(&store).run_async(&env, async { Ok::<(), std::io::Error>(()) }).await?;
    /// assert_eq!(out, Outcome::Ran);
    /// let out = Guard::new(&store).run_async(&env, async { Ok::<(), std::io::Error>(()) }).await?;
    /// assert_eq!(out, Outcome::Skipped);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn run_async<K, Fut, R>(
        self,
        key: K,
        handler: Fut,
    ) -> impl Future<Output = Result<Guarded, R::Error>>
    where
        K: DedupeKey,
        Fut: Future<Output = R>,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
    {
        self.run_async_converting(key, handler, IntoHandlerError::into_handler_error)
    }

    /// [`run_async`](Self::run_async) with the conversion of the store's error into the
    /// handler's error given as a value (`store_error`) instead of the bound
    /// `S::Error: IntoHandlerError<R::Error>`. What the `#[idempotent]` expansion of an
    /// `async fn` calls: it names the conversion at the user's return type, so a store
    /// error that does not convert is reported there, once.
    #[doc(hidden)]
    pub fn run_async_converting<K, Fut, R, C>(
        self,
        key: K,
        handler: Fut,
        store_error: C,
    ) -> impl Future<Output = Result<Guarded, R::Error>>
    where
        K: DedupeKey,
        Fut: Future<Output = R>,
        R: HandlerResult,
        C: FnOnce(S::Error) -> R::Error,
    {
        let (store, ttl) = (self.store, self.ttl);
        // A plain `fn` returning an `async` block, not an `async fn`: the key is read
        // through a reference to the `dedupe_key` answer, and a store's answer is awaited
        // before `key` is passed with it. The handler's future is pinned (moved into the
        // block's own frame) only once it is known to run: a duplicate never touches it.
        async move {
            let answer = key.dedupe_key();
            let Some(key) = &answer else {
                pin!(handler).await.into_result()?;
                return Ok(Guarded::unclaimed(done(Outcome::RanWithoutKey)));
            };
            // Outside a runtime delivery (no turn, no probe), the store is called
            // directly, with no task-local lookup per step.
            let scoped = hooks::scoped();
            let runtime = scoped.yes();
            let turn = if runtime {
                Some(hooks::turn_async(key).await)
            } else {
                None
            };
            let seen = if runtime {
                hooks::store_before(key, store.seen(key)).await
            } else {
                let answer = store.seen(key).await;
                scoped.store_answer(key, answer)
            };
            if seen.map_err(store_error)? {
                return Ok(Guarded::unclaimed(skipped(key)));
            }
            if runtime {
                hooks::handler_runs();
            }
            pin!(handler).await.into_result()?;
            let remembered = if runtime {
                // With the store on the transport's server: the `remember` is sent with
                // the ack, in one round trip (the turn on the key is held until then).
                let _turn = match hooks::defer_remember(turn, |server| {
                    store.pipelined_remember(key, ttl, server)
                }) {
                    Ok(()) => return Ok(Guarded::unclaimed(done(Outcome::Ran))),
                    Err(turn) => turn,
                };
                hooks::owed_write(key, "remember", || store.remember_for(key, ttl)).await
            } else {
                store.remember_for(key, ttl).await
            };
            if let Err(err) = remembered {
                remember_failed(key, &err);
            }
            Ok(Guarded::unclaimed(done(Outcome::Ran)))
        }
    }
}

// --- lease mode ------------------------------------------------------------------------

impl<S: LeaseStore + Sync + ?Sized> Guard<'_, S, Leased> {
    /// Guards a blocking handler in lease mode (see [`Guard::lease`]): the claim is
    /// renewed from a thread beside the handler. A lost lease is logged
    /// (`tracing::warn!` with the id) and reported in [`Guarded::lease`]. The handler
    /// reads its fencing token with
    /// [`current_fencing_token`](crate::lease::current_fencing_token).
    pub fn run<K, F, R>(self, key: K, handler: F) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        F: FnOnce() -> R,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
        R::Error: From<InFlight>,
    {
        let (store, ttl, length) = (self.store, self.ttl, self.mode.length);
        let Some(key) = key.dedupe_key() else {
            handler().into_result()?;
            return Ok(Guarded::unclaimed(done(Outcome::RanWithoutKey)));
        };
        let _turn = hooks::turn_blocking(&key);
        let token = match hooks::store_before_sync(&key, || store.claim(&key, length))
            .map_err(IntoHandlerError::into_handler_error)?
        {
            Claim::Completed => return Ok(Guarded::unclaimed(skipped(&key))),
            Claim::InFlight => {
                hooks::in_flight_elsewhere(&key);
                return Err(InFlight {
                    id: key.into_owned(),
                }
                .into());
            }
            Claim::Acquired(token) => token,
        };
        hooks::handler_runs();
        let (result, lost) = lease::run_renewing_sync(store, &key, &token, length, handler);
        match result {
            Ok(()) => {
                let every = Some(lease::renew_interval(length));
                let completed = hooks::owed_write_sync_within(&key, "complete", every, || {
                    store.complete(&key, &token, ttl)
                });
                let lost = settle_lease(&key, completed, lost, || {
                    hooks::owed_write_sync_within(&key, "remember", every, || {
                        store.remember_for(&key, ttl)
                    })
                });
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
}

impl<S: AsyncLeaseStore + ?Sized> Guard<'_, S, Leased> {
    /// Guards an async handler in lease mode (see [`Guard::lease`]): the lease is renewed
    /// beside the handler, in the same task.
    pub async fn run_async<K, Fut, R>(self, key: K, handler: Fut) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        Fut: Future<Output = R>,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
        R::Error: From<InFlight>,
    {
        self.run_async_with(key, handler, R::Error::from).await
    }

    /// [`run_async`](Self::run_async) with the conversion of [`InFlight`] into the
    /// handler's error given as a value (`in_flight`) instead of the bound
    /// `R::Error: From<InFlight>`. What the `#[idempotent(lease = ...)]` expansion of an
    /// `async fn` calls: it passes a closure that names `From<InFlight>` at the user's
    /// return type, so an error type without it is reported there, once, and not again
    /// at the guard's `impl Future`.
    #[doc(hidden)]
    pub async fn run_async_with<K, Fut, R, C>(
        self,
        key: K,
        handler: Fut,
        in_flight: C,
    ) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        Fut: Future<Output = R>,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
        C: FnOnce(InFlight) -> R::Error,
    {
        let (store, ttl, length) = (self.store, self.ttl, self.mode.length);
        let Some(key) = key.dedupe_key() else {
            handler.await.into_result()?;
            return Ok(Guarded::unclaimed(done(Outcome::RanWithoutKey)));
        };
        let _turn = hooks::consumer_turn(&key).await;
        let token = match hooks::store_before(&key, store.claim(&key, length))
            .await
            .map_err(IntoHandlerError::into_handler_error)?
        {
            Claim::Completed => return Ok(Guarded::unclaimed(skipped(&key))),
            Claim::InFlight => {
                hooks::in_flight_elsewhere(&key);
                return Err(in_flight(InFlight {
                    id: key.into_owned(),
                }));
            }
            Claim::Acquired(token) => token,
        };
        hooks::handler_runs();
        let (result, lost) = lease::run_renewing_async(store, &key, &token, length, handler).await;
        match result {
            Ok(()) => {
                // Retried at least every renewal interval: the lease ends unless it lands.
                let every = Some(lease::renew_interval(length));
                let completed = hooks::owed_write_within(&key, "complete", every, || {
                    store.complete(&key, &token, ttl)
                })
                .await;
                let fallback = match &completed {
                    Ok(false) => Some(
                        hooks::owed_write_within(&key, "remember", every, || {
                            store.remember_for(&key, ttl)
                        })
                        .await,
                    ),
                    _ => None,
                };
                let lost =
                    settle_lease(&key, completed, lost, || fallback.unwrap_or_else(|| Ok(())));
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
}

fn leased(outcome: Outcome, token: &LeaseToken, lost: Option<LeaseLostCause>) -> Guarded {
    Guarded {
        outcome,
        fencing_token: token.fence(),
        lease: lost.map_or(LeaseHealth::Held, LeaseHealth::Lost),
    }
}

// --- fingerprint mode ------------------------------------------------------------------

impl<S: FingerprintStore + ?Sized> Guard<'_, S, Fingerprinted> {
    /// Guards a blocking handler in fingerprint mode (see [`Guard::fingerprint`]).
    pub fn run<K, F, R>(self, key: K, handler: F) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        F: FnOnce() -> R,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
        R::Error: From<PayloadMismatch>,
    {
        let (store, ttl, fp) = (self.store, self.ttl, &self.mode.fingerprint);
        let Some(key) = key.dedupe_key() else {
            handler().into_result()?;
            return Ok(Guarded::unclaimed(done(Outcome::RanWithoutKey)));
        };
        let _turn = hooks::turn_blocking(&key);
        let found = hooks::store_before_sync(&key, || store.lookup(&key))
            .map_err(IntoHandlerError::into_handler_error)?;
        if fingerprint::check(&key, found, fp)? {
            return Ok(Guarded::unclaimed(skipped(&key)));
        }
        hooks::handler_runs();
        handler().into_result()?;
        if let Err(err) = hooks::owed_write_sync(&key, "remember", || {
            store.remember_fingerprint(&key, fp, ttl)
        }) {
            remember_failed(&key, &err);
        }
        Ok(Guarded::unclaimed(done(Outcome::Ran)))
    }
}

impl<S: AsyncFingerprintStore + ?Sized> Guard<'_, S, Fingerprinted> {
    /// Guards an async handler in fingerprint mode (see [`Guard::fingerprint`]).
    pub async fn run_async<K, Fut, R>(self, key: K, handler: Fut) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        Fut: Future<Output = R>,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
        R::Error: From<PayloadMismatch>,
    {
        let (store, ttl, fp) = (self.store, self.ttl, self.mode.fingerprint);
        let Some(key) = key.dedupe_key() else {
            handler.await.into_result()?;
            return Ok(Guarded::unclaimed(done(Outcome::RanWithoutKey)));
        };
        // The same runtime hooks as the seen-set mode: the per-key turn, the typed
        // store-unavailable marker, the handler phase.
        let _turn = hooks::consumer_turn(&key).await;
        let found = hooks::store_before(&key, store.lookup(&key))
            .await
            .map_err(IntoHandlerError::into_handler_error)?;
        if fingerprint::check(&key, found, &fp)? {
            return Ok(Guarded::unclaimed(skipped(&key)));
        }
        hooks::handler_runs();
        handler.await.into_result()?;
        if let Err(err) = hooks::owed_write(&key, "remember", || {
            store.remember_fingerprint(&key, &fp, ttl)
        })
        .await
        {
            remember_failed(&key, &err);
        }
        Ok(Guarded::unclaimed(done(Outcome::Ran)))
    }
}

// --- transaction mode ------------------------------------------------------------------

/// The transactional store's answer as the guard's: with no fingerprint given there is
/// no mismatch to report.
fn without_mismatch<E>(answer: Result<Result<Outcome, PayloadMismatch>, E>) -> Result<Guarded, E> {
    match answer? {
        Ok(outcome) => Ok(Guarded::unclaimed(outcome)),
        // The store compares fingerprints only when one is given, and none was.
        Err(_) => Ok(Guarded::unclaimed(Outcome::Skipped)),
    }
}

fn with_mismatch<E: From<PayloadMismatch>>(
    answer: Result<Result<Outcome, PayloadMismatch>, E>,
) -> Result<Guarded, E> {
    match answer? {
        Ok(outcome) => Ok(Guarded::unclaimed(outcome)),
        Err(mismatch) => Err(mismatch.into()),
    }
}

impl<S: TransactionalStore + ?Sized> Guard<'_, S, Transactional> {
    /// Runs the blocking `handler` in a transaction with the row of `key` (see
    /// [`Guard::transaction`]); `handler` receives the transaction.
    pub fn run<K, F, R>(self, key: K, handler: F) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        F: FnOnce(&S::Tx<'_>) -> R,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
    {
        let key = key.dedupe_key();
        without_mismatch(
            self.store
                .transaction_guard(key.as_deref(), self.ttl, None, handler),
        )
    }
}

impl<S: TransactionalStore + ?Sized> Guard<'_, S, Transactional<Fingerprint>> {
    /// [`Guard::run`] of transaction mode, storing and checking the fingerprint.
    pub fn run<K, F, R>(self, key: K, handler: F) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        F: FnOnce(&S::Tx<'_>) -> R,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
        R::Error: From<PayloadMismatch>,
    {
        let key = key.dedupe_key();
        let fp = Some(self.mode.fingerprint);
        with_mismatch(
            self.store
                .transaction_guard(key.as_deref(), self.ttl, fp, handler),
        )
    }
}

impl<S: AsyncTransactionalStore + ?Sized> Guard<'_, S, Transactional> {
    /// Runs the async closure `handler` in a transaction with the row of `key` (see
    /// [`Guard::transaction`]); `handler` receives the transaction.
    pub async fn run_async<K, F, R>(self, key: K, handler: F) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        F: AsyncFnOnce(&S::Tx<'_>) -> R,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
    {
        let key = key.dedupe_key();
        let answer = self
            .store
            .transaction_guard(key.as_deref(), self.ttl, None, handler)
            .await;
        without_mismatch(answer)
    }
}

impl<S: AsyncTransactionalStore + ?Sized> Guard<'_, S, Transactional<Fingerprint>> {
    /// [`Guard::run_async`] of transaction mode, storing and checking the fingerprint.
    pub async fn run_async<K, F, R>(self, key: K, handler: F) -> Result<Guarded, R::Error>
    where
        K: DedupeKey,
        F: AsyncFnOnce(&S::Tx<'_>) -> R,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
        R::Error: From<PayloadMismatch>,
    {
        let key = key.dedupe_key();
        let fp = Some(self.mode.fingerprint);
        let answer = self
            .store
            .transaction_guard(key.as_deref(), self.ttl, fp, handler)
            .await;
        with_mismatch(answer)
    }
}

fn release_failed(key: &str, err: &dyn std::error::Error) {
    tracing::warn!(
        key,
        error = %err,
        "handler failed and releasing its claim failed; the id stays blocked until the lease ends"
    );
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
    use crate::hooks::{GuardHooks, KeyTurn};
    use crate::pipelined::PipelinedWrite;
    use crate::{Envelope, InMemoryStore};

    /// Test hooks: what the runtime's probe records of a guard call.
    #[derive(Default)]
    struct StoreProbe {
        failed: AtomicBool,
        started: AtomicBool,
        server: Option<Arc<str>>,
        deferred: Mutex<Deferred>,
    }

    #[derive(Default)]
    struct Deferred {
        writes: Vec<PipelinedWrite>,
        _turns: Vec<KeyTurn>,
    }

    impl Deferred {
        fn is_empty(&self) -> bool {
            self.writes.is_empty()
        }
    }

    impl StoreProbe {
        fn with_pipeline(server: Option<Arc<str>>) -> Self {
            StoreProbe {
                server,
                ..StoreProbe::default()
            }
        }
        fn store_failed(&self) -> bool {
            self.failed.load(Ordering::SeqCst)
        }
        fn started(&self) -> bool {
            self.started.load(Ordering::SeqCst)
        }
        fn take_deferred(&self) -> Deferred {
            std::mem::take(&mut *self.deferred.lock().unwrap())
        }
    }

    impl GuardHooks for StoreProbe {
        fn mark_store_failed(&self) {
            self.failed.store(true, Ordering::SeqCst);
        }
        fn handler_started(&self) {
            self.started.store(true, Ordering::SeqCst);
        }
        fn pipeline_server(&self) -> Option<&str> {
            self.server.as_deref()
        }
        fn defer(&self, write: PipelinedWrite, turn: Option<KeyTurn>) {
            let mut d = self.deferred.lock().unwrap();
            d.writes.push(write);
            d._turns.extend(turn);
        }
    }

    fn with_probe<F: Future>(probe: Arc<StoreProbe>, fut: F) -> impl Future<Output = F::Output> {
        crate::hooks::scope(probe, fut)
    }

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
        let (out, recorded) =
            capture_outcome(Guard::new(&store).run_async("id-A", handler(&runs, &dropped, Ok(()))))
                .await;
        assert_eq!(
            (out.unwrap().outcome, recorded),
            (Outcome::Ran, Some(Outcome::Ran))
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 1);
        assert!(store.has("id-A"));

        let dropped = Arc::new(AtomicBool::new(false));
        let (out, recorded) =
            capture_outcome(Guard::new(&store).run_async("id-A", handler(&runs, &dropped, Ok(()))))
                .await;
        assert_eq!(
            (out.unwrap().outcome, recorded),
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
            let (out, recorded) = capture_outcome(
                Guard::new(&store).run_async(key, handler(&runs, &dropped, Ok(()))),
            )
            .await;
            assert_eq!(
                (out.unwrap().outcome, recorded),
                (Outcome::RanWithoutKey, Some(Outcome::RanWithoutKey))
            );
        }
        // A `None` key too.
        let out = Guard::new(&store)
            .run_async(None::<&str>, handler(&runs, &dropped, Ok(())))
            .await;
        assert_eq!(out.unwrap().outcome, Outcome::RanWithoutKey);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(store.seen_calls.load(Ordering::SeqCst), 0);
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 0);
        // A failing handler without a key: its error is returned.
        let out = Guard::new(&store)
            .run_async("", handler(&runs, &dropped, Err(down())))
            .await;
        assert_eq!(out.unwrap_err().to_string(), "store down");
    }

    #[tokio::test]
    async fn a_handler_error_leaves_the_key_unremembered() {
        let store = TestStore::default();
        let runs = AtomicUsize::new(0);
        let dropped = Arc::new(AtomicBool::new(false));
        let failed = std::io::Error::other("charge declined");
        let (out, recorded) = capture_outcome(
            Guard::new(&store).run_async("id-B", handler(&runs, &dropped, Err(failed))),
        )
        .await;
        assert_eq!(out.unwrap_err().to_string(), "charge declined");
        assert_eq!(recorded, None, "a failed handler records no outcome");
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 0);
        assert!(!store.has("id-B"));
        // The retry runs.
        let out = Guard::new(&store)
            .run_async("id-B", handler(&runs, &dropped, Ok(())))
            .await;
        assert_eq!(
            (out.unwrap().outcome, runs.load(Ordering::SeqCst)),
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
        let out = Guard::new(&store)
            .run_async("id-C", handler(&runs, &dropped, Ok(())))
            .await;
        assert_eq!(out.unwrap_err().to_string(), "store down");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        // Inside the runtime, the typed marker is set too.
        let probe = Arc::new(StoreProbe::default());
        let out = with_probe(
            Arc::clone(&probe),
            Guard::new(&store).run_async("id-C", handler(&runs, &dropped, Ok(()))),
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
            let out = Guard::new(&store)
                .ttl(Duration::from_secs(60))
                .run_async("id-D", handler(&runs, &dropped, Ok(())))
                .await;
            assert_eq!(out.unwrap().outcome, Outcome::Ran);
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
        let fut = Guard::new(&store).run_async("id-E", handler(&runs, &dropped, Ok(())));
        drop(fut);
        assert_eq!(store.seen_calls.load(Ordering::SeqCst), 0);
        assert!(dropped.load(Ordering::SeqCst));

        // Dropped while waiting on `seen` (its first poll answered `Pending`).
        let dropped = Arc::new(AtomicBool::new(false));
        {
            let mut fut =
                pin!(Guard::new(&store).run_async("id-E", handler(&runs, &dropped, Ok(()))));
            assert!(poll_once(fut.as_mut()).is_pending());
            assert_eq!(store.seen_calls.load(Ordering::SeqCst), 1);
        }
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(runs.load(Ordering::SeqCst), 0);

        // Dropped while the handler waits: nothing remembered.
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(Arc::clone(&dropped));
        {
            let mut fut = pin!(Guard::new(&store).run_async("id-E", async move {
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
            let mut fut =
                pin!(Guard::new(&store).run_async("id-F", handler(&runs, &dropped, Ok(()))));
            match poll_once(fut.as_mut()) {
                Poll::Ready(out) => assert_eq!(out.unwrap().outcome, outcome),
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
            Guard::new(&store).run_async("id-G", async {
                runs.fetch_add(1, Ordering::SeqCst);
                wait.await.map_err(std::io::Error::other)
            }),
        );
        let probe = Arc::new(StoreProbe::default());
        let dropped = Arc::new(AtomicBool::new(false));
        let second = with_probe(
            Arc::clone(&probe),
            Guard::new(&store).run_async("id-G", handler(&runs, &dropped, Ok(()))),
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
        assert!(!probe.started());
        let out = with_probe(
            Arc::clone(&probe),
            Guard::new(&store).run_async("id-H", async { Ok::<(), std::io::Error>(()) }),
        )
        .await;
        assert_eq!(out.unwrap().outcome, Outcome::Ran);
        assert!(probe.started(), "the handler's start was recorded");
        let probe = Arc::new(StoreProbe::default());
        let out = with_probe(
            Arc::clone(&probe),
            Guard::new(&store).run_async("id-H", async { Ok::<(), std::io::Error>(()) }),
        )
        .await;
        assert_eq!(out.unwrap().outcome, Outcome::Skipped);
        assert!(!probe.started(), "a duplicate's handler did not start");
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
            Guard::new(&store).run_async("id-I", handler(&runs, &dropped, Ok(()))),
        ))
        .await;
        assert_eq!(
            (out.unwrap().outcome, recorded),
            (Outcome::Ran, Some(Outcome::Ran))
        );
        assert_eq!(store.remember_calls.load(Ordering::SeqCst), 0);
        let deferred = probe.take_deferred();
        assert_eq!(
            deferred.writes,
            vec![PipelinedWrite::new("srv", ["SET", "id-I"])]
        );
        // The turn on the key is held with the write: another delivery waits for it.
        let next = with_probe(
            Arc::new(StoreProbe::default()),
            Guard::new(&store).run_async("id-I", handler(&runs, &dropped, Ok(()))),
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
            Guard::new(&store).run_async("id-J", handler(&runs, &dropped, Ok(()))),
        )
        .await;
        assert_eq!(out.unwrap().outcome, Outcome::Ran);
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
    ) -> impl Future<Output = Result<Guarded, R::Error>> + Send
    where
        S: AsyncStore + ?Sized,
        K: DedupeKey + Send,
        Fut: Future<Output = R> + Send,
        R: HandlerResult,
        S::Error: IntoHandlerError<R::Error>,
    {
        Guard::new(store).run_async(key, handler)
    }

    #[test]
    fn guard_future_is_send_for_the_in_memory_store() {
        fn assert_send<T: Send>(_: &T) {}
        let store = InMemoryStore::new();
        let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
        let fut = Guard::new(&store).run_async(&env, async { Ok::<(), std::io::Error>(()) });
        assert_send(&fut);
        let fut = guard_future_is_send(&store, 42u64, async {});
        assert_send(&fut);
    }
}
