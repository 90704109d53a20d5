//! The seam between the idempotency guard and what runs it.
//!
//! A guard called by hand (a test, a script) talks to its store and nothing else. Under
//! the consume runtime it also tells the runtime what happens inside the handler call,
//! through the [`GuardHooks`] the runtime installs around that call with [`scope`]
//! (and [`sync_scope`] on the thread of a sync handler). Every method of the trait has
//! a no-op default, and outside a scope the guard asks nothing: this module is the only
//! link from the guard to a runtime, and the runtime is the only implementor.
//!
//! What goes through it:
//!
//! - **Per-key turn.** Inside a scope, every guard call first takes its key's turn in
//!   this process ([`KeyTurn`]): a delivery whose key is being handled by another task
//!   waits until that one has finished (remembered or failed), then takes the normal path
//!   (a remembered key is skipped). Without it, two copies of one message reserved by two
//!   workers of one consumer could both pass `seen` before either `remember`s, and the
//!   effect would happen twice.
//! - **Store unavailable.** When the store's `seen` / `claim` fails, the guard calls
//!   [`GuardHooks::mark_store_failed`] before returning the store's error converted into
//!   the handler's error: the runtime knows, by type and not by the error's text, that the
//!   message is not at fault. A lease held elsewhere is [`GuardHooks::mark_in_flight`].
//! - **Phase.** [`GuardHooks::enter`] tells whether the guard is waiting on the store (so
//!   a store call that hangs, e.g. behind a table lock, can be cut by the runtime's store
//!   timeout and treated as the store being unavailable).
//! - **Owed writes.** After a successful handler, the guard's `remember` / `complete` is
//!   retried by the [`OwedRetry`] the hooks give, until it lands; or, when the hooks name
//!   the store's server ([`GuardHooks::pipeline_server`]), handed over with
//!   [`GuardHooks::defer`] to be sent with the ack (see [`crate::pipelined`]).
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicBool, Ordering}};
//! use babelqueue_core::hooks::{self, GuardHooks};
//! use babelqueue_core::{AsyncStore, Envelope, Guard, InMemoryStore};
//!
//! /// Hooks that only note a failed store lookup.
//! #[derive(Default)]
//! struct Noted(AtomicBool);
//! impl GuardHooks for Noted {
//!     fn mark_store_failed(&self) {
//!         self.0.store(true, Ordering::SeqCst);
//!     }
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let noted = Arc::new(Noted::default());
//! let store = InMemoryStore::new();
//! let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}))?;
//! let guarded = Guard::new(&store).run_async(&env, async { Ok::<(), std::io::Error>(()) });
//! let out = hooks::scope(noted.clone(), guarded).await;
//! assert!(out.is_ok());
//! assert!(!noted.0.load(Ordering::SeqCst), "the store answered");
//! assert!(store.seen(&env.meta.id).await?, "remembered");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, PoisonError};

use hashbrown::{DefaultHashBuilder, HashTable};

use tokio::sync::Notify;

use crate::pipelined::PipelinedWrite;

// ---------------------------------------------------------------------------------------
// Per-key turn
// ---------------------------------------------------------------------------------------

const SHARDS: usize = 32;

/// One key whose turn is taken.
struct Held {
    hash: u64,
    key: Box<str>,
    /// Tells this holder's [`KeyTurn`] from a later holder of the same key.
    ticket: u64,
    /// What async waiters of the key wait on: made by the first of them (a key nobody
    /// waits for needs none).
    notify: Option<Arc<Notify>>,
}

#[derive(Default)]
struct Table {
    held: HashTable<Held>,
    /// Blocking waiters (of any key of the shard) parked on its condvar: a release wakes
    /// them only when there are some (a wake is a system call).
    blocked: usize,
    next_ticket: u64,
}

impl Table {
    fn find(&self, hash: u64, key: &str) -> Option<&Held> {
        self.held.find(hash, |h| *h.key == *key)
    }

    fn take(&mut self, hash: u64, key: &str) -> KeyTurn {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let held = Held {
            hash,
            key: key.into(),
            ticket,
            notify: None,
        };
        self.held.insert_unique(hash, held, |h| h.hash);
        KeyTurn { hash, ticket }
    }
}

struct Shard {
    table: Mutex<Table>,
    /// Blocking waiters of any key of this shard.
    cond: Condvar,
}

struct Turns {
    shards: Vec<Shard>,
    hasher: DefaultHashBuilder,
}

static TURNS: LazyLock<Turns> = LazyLock::new(|| Turns {
    shards: (0..SHARDS)
        .map(|_| Shard {
            table: Mutex::new(Table::default()),
            cond: Condvar::new(),
        })
        .collect(),
    hasher: DefaultHashBuilder::default(),
});

/// The hash of `key` in the turn tables (foldhash, seeded per process).
fn turn_hash(key: &str) -> u64 {
    TURNS.hasher.hash_one(key)
}

fn shard(hash: u64) -> &'static Shard {
    // Bits the table's probing does not use (it takes the low bits and the top seven).
    &TURNS.shards[(hash >> 32) as usize % SHARDS]
}

fn lock_table(s: &Shard) -> MutexGuard<'_, Table> {
    s.table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// This task's turn on one key: while it lives, no other guard call of this process with
/// the same key proceeds (they wait). Released on drop, also when the guarded future is
/// cancelled.
#[must_use = "the turn is released when dropped"]
pub struct KeyTurn {
    hash: u64,
    ticket: u64,
}

impl Drop for KeyTurn {
    fn drop(&mut self) {
        let s = shard(self.hash);
        let (notify, blocked) = {
            let mut table = lock_table(s);
            let notify = match table
                .held
                .find_entry(self.hash, |h| h.ticket == self.ticket)
            {
                Ok(entry) => entry.remove().0.notify,
                Err(_) => None,
            };
            (notify, table.blocked > 0)
        };
        // Wake every waiter of this key: the first to re-lock the shard takes the turn,
        // the others wait again.
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
        if blocked {
            s.cond.notify_all();
        }
    }
}

/// Whether the turn on `key` is taken (for tests).
#[cfg(test)]
fn is_held(key: &str) -> bool {
    let hash = turn_hash(key);
    lock_table(shard(hash)).find(hash, key).is_some()
}

/// Waits (asynchronously) for the turn on `key`.
pub(crate) async fn turn_async(key: &str) -> KeyTurn {
    let hash = turn_hash(key);
    let s = shard(hash);
    loop {
        let notify = {
            let mut table = lock_table(s);
            match table.held.find_mut(hash, |h| *h.key == *key) {
                None => return table.take(hash, key),
                Some(held) => Arc::clone(held.notify.get_or_insert_with(Default::default)),
            }
        };
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // The holder may have finished between the two locks; if its slot is still there,
        // its release (which removes the slot under the lock) comes after our `enable`.
        let still_held = lock_table(s)
            .find(hash, key)
            .and_then(|h| h.notify.as_ref())
            .is_some_and(|n| Arc::ptr_eq(n, &notify));
        if still_held {
            let hooked = with_current(|h| h.enter(Phase::Waiting)).is_some();
            notified.await;
            if hooked {
                with_current(|h| h.enter(Phase::Idle));
            }
        }
    }
}

/// The turn on `key` for a guard call made by the consume runtime (a delivery of this
/// consumer: the runtime's probe is set); `None`, without waiting, for a guard called
/// directly (a test, a handler called by hand), which keeps its plain store semantics
/// (e.g. lease mode answering `InFlight` to a concurrent call).
pub(crate) async fn consumer_turn(key: &str) -> Option<KeyTurn> {
    with_current(|_| ())?;
    Some(turn_async(key).await)
}

/// Waits (blocking the thread) for the turn on `key`, when the sync guard runs inside a
/// handler capture (how the runtime runs sync handlers: on tokio's blocking pool). A sync
/// guard called directly from async code takes no turn (blocking a runtime thread on a key
/// an async task holds could deadlock).
pub(crate) fn turn_blocking(key: &str) -> Option<KeyTurn> {
    if !crate::outcome::capturing_sync() {
        return None;
    }
    Some(turn_blocking_always(key))
}

fn turn_blocking_always(key: &str) -> KeyTurn {
    let hash = turn_hash(key);
    let s = shard(hash);
    let mut table = lock_table(s);
    while table.find(hash, key).is_some() {
        table.blocked += 1;
        table = s.cond.wait(table).unwrap_or_else(PoisonError::into_inner);
        table.blocked -= 1;
    }
    table.take(hash, key)
}

// ---------------------------------------------------------------------------------------
// The hooks: what the guard tells its runner
// ---------------------------------------------------------------------------------------

/// Where the guard of the current call is, as told to [`GuardHooks::enter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not in a store call (the phase after every other one ends).
    Idle,
    /// Waiting on the store before the handler (`seen` / `claim`).
    StoreBefore,
    /// Waiting on the store after the handler succeeded (`remember` / `complete`).
    StoreAfter,
    /// Waiting for another task of this process to finish with the same key.
    Waiting,
}

/// How a guard retries the store write it owes after a successful handler (`remember` /
/// `complete`) inside a runner: each try is cut at `timeout`, the next follows after a
/// backoff from `min` doubling to `max`. It stops only when the write succeeds or the
/// runner gives the call up ([`GuardHooks::abandoned`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwedRetry {
    /// Each try is cut after this long (async guards; a blocking try cannot be cut).
    pub timeout: std::time::Duration,
    /// The first wait between tries.
    pub min: std::time::Duration,
    /// The longest wait between tries.
    pub max: std::time::Duration,
}

/// What a guard tells, and asks, the runner of the handler call it guards (the consume
/// runtime). Installed around a call with [`scope`] (async) or [`sync_scope`] (a sync
/// handler's thread); every method has a no-op default.
///
/// Methods are called from the guard's task or thread while the handler call runs; they
/// should return at once (record, notify), never block.
pub trait GuardHooks: Send + Sync {
    /// The guard entered `phase` ([`Phase::Idle`] when a store call or a wait ended).
    fn enter(&self, phase: Phase) {
        let _ = phase;
    }

    /// The guarded handler body is about to run.
    fn handler_started(&self) {}

    /// The store's `seen` / `claim` failed: the store is unavailable, the message is not
    /// at fault (the guard still returns the store's error to the handler's caller).
    fn mark_store_failed(&self) {}

    /// A lease guard found the key in flight on another worker.
    fn mark_in_flight(&self) {}

    /// How the owed write after a successful handler is retried; `None` (the default): it
    /// is tried once and its answer returned.
    fn owed_retry(&self) -> Option<OwedRetry> {
        None
    }

    /// An owed write failed (`true`), or landed after failing (`false`).
    fn store_down(&self, down: bool) {
        let _ = down;
    }

    /// Whether the runner gave the call up (a blocking owed-write loop then stops).
    fn abandoned(&self) -> bool {
        false
    }

    /// The server the runner can send a store write on, with the message's ack (see
    /// [`crate::pipelined`]); `None` (the default): the guard writes itself.
    fn pipeline_server(&self) -> Option<&str> {
        None
    }

    /// Takes over a `remember` the guard handed over (its server is
    /// [`pipeline_server`](Self::pipeline_server)), with the turn on its key: the runner
    /// sends the write before the ack and drops the turn after.
    fn defer(&self, write: PipelinedWrite, turn: Option<KeyTurn>) {
        drop((write, turn));
    }
}

tokio::task_local! {
    static HOOKS: Arc<dyn GuardHooks>;
}

/// Runs `fut` with `hooks` visible to every guard inside it (the consume runtime wraps
/// each handler call in this).
pub fn scope<F: Future>(hooks: Arc<dyn GuardHooks>, fut: F) -> impl Future<Output = F::Output> {
    // Not an `async fn`: its future would hold `fut` twice.
    HOOKS.scope(hooks, fut)
}

/// The hooks of the current [`scope`], to be carried to a sync handler's thread
/// ([`sync_scope`]); `None` outside one.
pub fn current() -> Option<Arc<dyn GuardHooks>> {
    HOOKS.try_with(Arc::clone).ok()
}

/// `f` on the current scope's hooks (`None` outside a scope), without cloning the `Arc`:
/// the guard asks several times per call.
fn with_current<T>(f: impl FnOnce(&dyn GuardHooks) -> T) -> Option<T> {
    HOOKS.try_with(|h| f(&**h)).ok()
}

const SYNC_STORE_FAILED: u8 = 1;
const SYNC_IN_FLIGHT: u8 = 2;

/// Sync handlers run on tokio's blocking pool, where the runtime's task-local is not
/// visible: a sync guard running inside a capture (`capture_outcome_sync`, which every sync
/// handler runs in) records its markers here under its key instead, and the runner takes
/// them by the envelope's `meta.id` (the default key) with [`take_sync_marks`]. A sync
/// handler keyed on something else is not recognised this way: its store failure counts as
/// a handler failure (retried with backoff) unless the handler returns an error that says
/// the store is unavailable.
static SYNC_MARKS: LazyLock<Mutex<HashMap<String, u8>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static SYNC_MARKS_LEN: AtomicUsize = AtomicUsize::new(0);

/// Passes the markers a sync guard recorded for `key` (on the blocking pool, outside the
/// task-local scope) to `hooks`, and forgets them.
pub fn take_sync_marks(key: &str, hooks: &dyn GuardHooks) {
    if SYNC_MARKS_LEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    let mut map = SYNC_MARKS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(bits) = map.remove(key) {
        SYNC_MARKS_LEN.fetch_sub(1, Ordering::Relaxed);
        if bits & SYNC_STORE_FAILED != 0 {
            hooks.mark_store_failed();
        }
        if bits & SYNC_IN_FLIGHT != 0 {
            hooks.mark_in_flight();
        }
    }
}

fn mark(key: &str, bit: u8) {
    let marked = with_current(|h| {
        if bit == SYNC_STORE_FAILED {
            h.mark_store_failed();
        } else {
            h.mark_in_flight();
        }
    });
    match marked {
        Some(()) => {}
        None if crate::outcome::capturing_sync() => {
            let mut map = SYNC_MARKS.lock().unwrap_or_else(PoisonError::into_inner);
            let bits = map.entry(key.to_owned()).or_insert_with(|| {
                SYNC_MARKS_LEN.fetch_add(1, Ordering::Relaxed);
                0
            });
            *bits |= bit;
        }
        None => {}
    }
}

/// After a successful handler: hands the guard's `remember` over to the runner (to be
/// sent with the ack), with the turn on the key, when the hooks name a server the store
/// offers a write for. `Err(turn)`: not handed over, the guard remembers itself.
pub(crate) fn defer_remember(
    turn: Option<KeyTurn>,
    offer: impl FnOnce(&str) -> Option<PipelinedWrite>,
) -> Result<(), Option<KeyTurn>> {
    let mut turn = turn;
    let handed = with_current(|hooks| {
        let Some(server) = hooks.pipeline_server() else {
            return false;
        };
        match offer(server) {
            Some(write) if write.server() == server => {
                hooks.defer(write, turn.take());
                true
            }
            _ => false,
        }
    });
    if handed == Some(true) {
        Ok(())
    } else {
        Err(turn)
    }
}

/// Whether a guard call runs inside a [`scope`], looked up once per call: outside one,
/// the guard's other steps skip the task-local lookups they would each make.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scoped(bool);

/// Looks up [`Scoped`] for the current guard call.
pub(crate) fn scoped() -> Scoped {
    Scoped(with_current(|_| ()).is_some())
}

impl Scoped {
    /// Whether this call runs inside a scope: if so, the guard takes the turn on its key
    /// and reports to the hooks ([`turn_async`], [`store_before`], [`handler_runs`],
    /// [`defer_remember`], [`owed_write`]); if not, it calls the store directly and
    /// passes what `seen` answered through [`store_answer`](Self::store_answer).
    pub(crate) fn yes(self) -> bool {
        self.0
    }

    /// Outside a scope: records a failed `seen` / `claim` (for a sync capture, see
    /// [`mark`]), as [`store_before`] does.
    pub(crate) fn store_answer<T, E>(self, key: &str, out: Result<T, E>) -> Result<T, E> {
        if out.is_err() {
            mark(key, SYNC_STORE_FAILED);
        }
        out
    }
}

/// Called by the lease guard when the key is in flight on another worker.
pub(crate) fn in_flight_elsewhere(key: &str) {
    mark(key, SYNC_IN_FLIGHT);
}

/// Called by the guard when its handler body is about to run.
pub(crate) fn handler_runs() {
    with_current(|h| h.handler_started());
}

/// Runs the guard's store call before the handler (`seen` / `claim`): phase told for the
/// runner's store timeout, failure recorded as the typed store-unavailable marker.
pub(crate) async fn store_before<T, E, F>(key: &str, fut: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let hooked = with_current(|h| h.enter(Phase::StoreBefore)).is_some();
    let out = fut.await;
    if hooked {
        with_current(|h| h.enter(Phase::Idle));
    }
    if out.is_err() {
        mark(key, SYNC_STORE_FAILED);
    }
    out
}

/// The blocking counterpart of [`store_before`].
pub(crate) fn store_before_sync<T, E>(key: &str, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    let out = f();
    if out.is_err() {
        mark(key, SYNC_STORE_FAILED);
    }
    out
}

/// The waits between an owed write's tries: `min` doubling to `max`, or to `cap` where
/// that is shorter (a lease's renewal interval).
struct OwedBackoff {
    next: std::time::Duration,
    max: std::time::Duration,
}

impl OwedBackoff {
    fn new(retry: &OwedRetry, cap: Option<std::time::Duration>) -> Self {
        let max = cap.map_or(retry.max, |cap| retry.max.min(cap));
        OwedBackoff {
            next: retry.min.min(max),
            max,
        }
    }

    /// The wait before the next try.
    fn wait(&mut self) -> std::time::Duration {
        let wait = self.next;
        self.next = (wait * 2).min(self.max);
        wait
    }
}

/// Runs the store write a guard owes after a successful handler (`remember` /
/// `complete`, `what` names it in the log).
///
/// Inside a scope whose hooks give an [`OwedRetry`] the write is **kept with the
/// message**: it is tried, each try cut at the retry's timeout, and tried again after
/// the backoff until the store answers. Meanwhile the handler's future has not returned,
/// so the message stays unacknowledged and the guard keeps the turn on its key (a
/// duplicate in this process waits). Only the runner dropping the call (a shutdown past
/// its grace period) ends it, leaving the message unacked for recovery. Elsewhere (a
/// guard called by hand) the write is tried once and its answer returned.
pub(crate) async fn owed_write<T, E, F, Fut>(key: &str, what: &'static str, op: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    owed_write_within(key, what, None, op).await
}

/// [`owed_write`] with the retries at most `cap` apart (`None`: the backoff's maximum).
/// A lease guard passes its renewal interval: its `complete` must land before the lease
/// ends, so a store back between two cuts is not missed by a backoff that grew to the
/// lease's own length.
pub(crate) async fn owed_write_within<T, E, F, Fut>(
    key: &str,
    what: &'static str,
    cap: Option<std::time::Duration>,
    mut op: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let Some(Some(retry)) = with_current(|h| {
        h.enter(Phase::StoreAfter);
        h.owed_retry()
    }) else {
        let out = op().await;
        with_current(|h| h.enter(Phase::Idle));
        return out;
    };
    let mut backoff = OwedBackoff::new(&retry, cap);
    let mut failed = false;
    loop {
        let delay = backoff.wait();
        match tokio::time::timeout(retry.timeout, op()).await {
            Ok(Ok(v)) => {
                with_current(|h| {
                    if failed {
                        h.store_down(false);
                    }
                    h.enter(Phase::Idle);
                });
                return Ok(v);
            }
            Ok(Err(error)) => owed_failed(key, what, &error, delay),
            Err(_) => owed_failed(key, what, &"no answer within the store timeout", delay),
        }
        if !failed {
            failed = true;
            with_current(|h| h.store_down(true));
        }
        tokio::time::sleep(delay).await;
    }
}

fn owed_failed(key: &str, what: &str, error: &dyn std::fmt::Display, delay: std::time::Duration) {
    tracing::warn!(
        key,
        op = what,
        %error,
        retry_in_ms = delay.as_millis() as u64,
        "the handler succeeded but its store write failed; the message stays unacknowledged \
         and the write is retried"
    );
}

thread_local! {
    /// The hooks of the runner's call, for a sync handler on the blocking pool (where the
    /// task-local is not visible): only the owed-write loop reads them.
    static SYNC_HOOKS: std::cell::RefCell<Option<Arc<dyn GuardHooks>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` (a sync handler, on the blocking pool) with `hooks` (from [`current`], taken
/// on the handler call's task) visible to its sync guards' owed writes; the previous
/// value is restored on exit and on panic.
pub fn sync_scope<T>(hooks: Option<Arc<dyn GuardHooks>>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Arc<dyn GuardHooks>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0.take();
            SYNC_HOOKS.with(|p| *p.borrow_mut() = old);
        }
    }
    let old = SYNC_HOOKS.with(|p| p.replace(hooks));
    let _restore = Restore(old);
    f()
}

/// The blocking counterpart of [`owed_write`], for sync guards: inside a runner's sync
/// handler the write is retried after the backoff until it succeeds or the runner gives
/// the call up (then the last error is returned and the message, already dropped by the
/// runner, stays unacked). A blocking try cannot be cut: the store's own timeouts bound
/// it. Elsewhere the write is tried once.
pub(crate) fn owed_write_sync<T, E: std::fmt::Display>(
    key: &str,
    what: &'static str,
    op: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    owed_write_sync_within(key, what, None, op)
}

/// [`owed_write_sync`] with the retries at most `cap` apart (see [`owed_write_within`]).
pub(crate) fn owed_write_sync_within<T, E: std::fmt::Display>(
    key: &str,
    what: &'static str,
    cap: Option<std::time::Duration>,
    mut op: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let hooks = if crate::outcome::capturing_sync() {
        SYNC_HOOKS.with(|p| p.borrow().clone())
    } else {
        None
    };
    let Some((hooks, retry)) = hooks.and_then(|h| h.owed_retry().map(|r| (h, r))) else {
        return op();
    };
    // The runner's watchdog sees the phase too: no handler timeout while the write is
    // owed.
    hooks.enter(Phase::StoreAfter);
    let mut backoff = OwedBackoff::new(&retry, cap);
    let mut failed = false;
    loop {
        let delay = backoff.wait();
        match op() {
            Ok(v) => {
                if failed {
                    hooks.store_down(false);
                }
                hooks.enter(Phase::Idle);
                return Ok(v);
            }
            Err(error) => {
                if hooks.abandoned() {
                    hooks.enter(Phase::Idle);
                    return Err(error);
                }
                owed_failed(key, what, &error, delay);
                if !failed {
                    failed = true;
                    hooks.store_down(true);
                }
            }
        }
        std::thread::sleep(delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32};
    use std::time::Duration;

    /// The owed write's waits, async and blocking alike: the store backoff doubling to its
    /// maximum, or to a lease's renewal interval where that is shorter.
    #[test]
    fn owed_waits_double_to_the_backoff_maximum_or_the_cap() {
        let ms = Duration::from_millis;
        let retry = OwedRetry {
            timeout: Duration::from_secs(10),
            min: ms(100),
            max: ms(5_000),
        };
        let waits = |cap| {
            let mut b = OwedBackoff::new(&retry, cap);
            (0..8).map(|_| b.wait()).collect::<Vec<_>>()
        };
        let uncapped = [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000].map(ms);
        assert_eq!(waits(None), uncapped);
        assert_eq!(waits(Some(ms(60_000))), uncapped, "a cap above the maximum");
        let lease_3s = [100, 200, 400, 800, 1_000, 1_000, 1_000, 1_000].map(ms);
        assert_eq!(waits(Some(ms(1_000))), lease_3s);
        assert_eq!(waits(Some(ms(30))), [ms(30); 8], "a cap below the minimum");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_task_per_key_at_a_time() {
        let inside = Arc::new(AtomicU32::new(0));
        let max = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (inside, max) = (inside.clone(), max.clone());
            tasks.push(tokio::spawn(async move {
                let key = format!("inflight-test-{}", i % 4);
                let _turn = turn_async(&key).await;
                let _ = key;
                let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // 4 distinct keys: at most 4 inside at once, never two of one key (checked below).
        assert!(max.load(Ordering::SeqCst) <= 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn same_key_is_serialized_across_async_and_blocking_callers() {
        let inside = Arc::new(AtomicU32::new(0));
        let overlap = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for i in 0..16 {
            let (inside, overlap) = (inside.clone(), overlap.clone());
            let body = move || {
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlap.store(true, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(2));
                inside.fetch_sub(1, Ordering::SeqCst);
            };
            if i % 2 == 0 {
                tasks.push(tokio::spawn(async move {
                    let _t = turn_async("inflight-test-same").await;
                    body();
                }));
            } else {
                tasks.push(tokio::task::spawn_blocking(move || {
                    let _t = turn_blocking_always("inflight-test-same");
                    body();
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(!overlap.load(Ordering::SeqCst));
        assert!(!is_held("inflight-test-same"));
    }

    #[tokio::test]
    async fn turns_taken_and_released_in_a_row_leave_nothing_held() {
        // The uncontended path, async and blocking: nothing waits, so a release wakes
        // nobody (no condvar, no `Notify`), and every slot is gone afterwards.
        for i in 0..10_000 {
            let key = format!("inflight-test-row-{}", i % 7);
            if i % 2 == 0 {
                drop(turn_async(&key).await);
            } else {
                drop(turn_blocking_always(&key));
            }
        }
        assert!((0..7).all(|i| !is_held(&format!("inflight-test-row-{i}"))));
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_no_trace() {
        let held = turn_async("inflight-test-cancel").await;
        let waiter = tokio::time::timeout(
            Duration::from_millis(10),
            turn_async("inflight-test-cancel"),
        )
        .await;
        assert!(waiter.is_err());
        drop(held);
        let again =
            tokio::time::timeout(Duration::from_secs(5), turn_async("inflight-test-cancel"))
                .await
                .expect("free again");
        drop(again);
        assert!(!is_held("inflight-test-cancel"));
    }
}
