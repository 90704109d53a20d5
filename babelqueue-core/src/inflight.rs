//! What the idempotency guard tells the runtime beside its [`Outcome`](crate::Outcome),
//! and the in-process per-key turn that keeps two tasks of one process from handling the
//! same key at once.
//!
//! - **Per-key turn.** Every guard call the consume runtime makes with a key first takes
//!   that key's turn in this process ([`KeyTurn`]): a delivery whose key is being handled by another task waits
//!   until that one has finished (remembered or failed), then takes the normal path (a
//!   remembered key is skipped). Without it, two copies of one message reserved by two
//!   workers of one consumer could both pass `seen` before either `remember`s, and the
//!   effect would happen twice.
//! - **Store unavailable.** When the store's `seen` / `claim` fails, the guard records a
//!   typed marker (read by the runtime with [`StoreProbe::store_failed`]) before returning
//!   the store's error converted into the handler's error. The runtime then knows, by type
//!   and not by the error's text, that the message is not at fault: it is put back on the
//!   queue without counting an attempt.
//! - **Phase.** The probe also tells whether the guard is waiting on the store (so a
//!   store call that hangs, e.g. behind a table lock, can be cut by the runtime's store
//!   timeout and treated as the store being unavailable).

use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, PoisonError};

use hashbrown::{DefaultHashBuilder, HashTable};

use tokio::time::Instant;

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
pub(crate) struct KeyTurn {
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
            let probed = with_current(|p| p.enter(Phase::Waiting)).is_some();
            notified.await;
            if probed {
                with_current(StoreProbe::leave);
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
// Probe: what the guard tells the runtime
// ---------------------------------------------------------------------------------------

/// Where the guard of the current delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Not in a store call.
    Idle,
    /// Waiting on the store before the handler (`seen` / `claim`).
    StoreBefore,
    /// Waiting on the store after the handler succeeded (`remember` / `complete`).
    StoreAfter,
    /// Waiting for another task of this process to finish with the same key.
    Waiting,
}

#[derive(Debug)]
struct ProbeState {
    phase: Phase,
    since: Instant,
    handler_started: Option<Instant>,
    /// When the last wait for the key's turn ended.
    waited_until: Option<Instant>,
    /// When the last write after the handler (`StoreAfter`) ended: the handler's own time
    /// counts again from there, so a sync guard whose owed write outlasted the handler
    /// timeout is not cut in the moment between its write and its return.
    wrote_until: Option<Instant>,
}

/// Shared between the runtime (which creates one per delivery) and the guard running in
/// that delivery's handler: the typed markers the runtime settles by.
#[derive(Debug)]
pub(crate) struct StoreProbe {
    state: Mutex<ProbeState>,
    store_failed: AtomicBool,
    in_flight: AtomicBool,
    /// Notified on every phase change (the runtime's watchdog re-arms its timer).
    changed: Notify,
    /// The transport's server, when a store there may hand its `remember` over to be
    /// sent with the ack (see [`crate::pipelined`]).
    pipeline_server: Option<Arc<str>>,
    /// Writes handed over by guards of this delivery, each with the turn on its key (held
    /// until the write is sent).
    deferred: Mutex<Deferred>,
    /// How a guard retries the write it owes after a successful handler (`remember` /
    /// `complete`): set by the runtime; `None` (a probe of a test) tries once.
    owed: Option<OwedRetry>,
    /// The runtime gave the delivery up (its future was dropped: the shutdown grace period
    /// ended, or a handler timeout): a sync guard's owed-write loop stops.
    abandoned: AtomicBool,
    /// Told when an owed write fails (`true`) and when it lands after failing (`false`):
    /// the runtime's store health (reserving pauses) and readiness.
    store_down: Option<StoreDownHook>,
}

/// See [`StoreProbe::on_store_down`].
#[derive(Clone)]
pub(crate) struct StoreDownHook(pub(crate) Arc<dyn Fn(bool) + Send + Sync>);

impl std::fmt::Debug for StoreDownHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreDownHook")
    }
}

/// How an owed store write (after a successful handler) is retried inside the runtime:
/// each try is cut at `timeout`, the next follows after the store backoff (`min`
/// doubling to `max`). It stops only when the write succeeds or the delivery is given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwedRetry {
    pub(crate) timeout: std::time::Duration,
    pub(crate) min: std::time::Duration,
    pub(crate) max: std::time::Duration,
}

/// The waits between an owed write's tries: the store backoff's `min` doubling to its
/// `max`, or to `cap` where that is shorter (a lease's renewal interval).
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

/// Store writes a delivery's guards handed over to the runtime, and the turns on their
/// keys (released when dropped: after the writes were sent).
#[derive(Default)]
pub(crate) struct Deferred {
    pub(crate) writes: Vec<PipelinedWrite>,
    turns: Vec<KeyTurn>,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred")
            .field("writes", &self.writes)
            .field("turns", &self.turns.len())
            .finish()
    }
}

impl Deferred {
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}

impl Default for StoreProbe {
    fn default() -> Self {
        StoreProbe {
            state: Mutex::new(ProbeState {
                phase: Phase::Idle,
                since: Instant::now(),
                handler_started: None,
                waited_until: None,
                wrote_until: None,
            }),
            store_failed: AtomicBool::new(false),
            in_flight: AtomicBool::new(false),
            changed: Notify::new(),
            pipeline_server: None,
            deferred: Mutex::new(Deferred::default()),
            owed: None,
            abandoned: AtomicBool::new(false),
            store_down: None,
        }
    }
}

impl StoreProbe {
    /// A probe whose guards may hand their `remember` over when the store lives on
    /// `server` (the transport's).
    pub(crate) fn with_pipeline(server: Option<Arc<str>>) -> Self {
        StoreProbe {
            pipeline_server: server,
            ..StoreProbe::default()
        }
    }

    /// The same probe, with owed writes retried by `retry` (the runtime's settings).
    pub(crate) fn owed_retry(mut self, retry: OwedRetry) -> Self {
        self.owed = Some(retry);
        self
    }

    /// The same probe, telling `hook` when an owed write fails (`true`) and when it lands
    /// after failing (`false`).
    pub(crate) fn on_store_down(mut self, hook: StoreDownHook) -> Self {
        self.store_down = Some(hook);
        self
    }

    fn store_down(&self, down: bool) {
        if let Some(hook) = &self.store_down {
            (hook.0)(down);
        }
    }

    /// The delivery was given up: a sync guard still retrying its owed write stops.
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
    }

    /// Takes the writes (and key turns) the guards handed over.
    pub(crate) fn take_deferred(&self) -> Deferred {
        std::mem::take(&mut *self.deferred.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether a guard's `seen` / `claim` failed during this delivery.
    pub(crate) fn store_failed(&self) -> bool {
        self.store_failed.load(Ordering::SeqCst)
    }

    /// Whether a lease guard found the key in flight elsewhere.
    pub(crate) fn in_flight(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The current phase, since when, and from when the handler's own time counts (its
    /// body's start, else the end of the last wait for the key's turn, if any; the end of
    /// the last write after the handler when that is later).
    pub(crate) fn phase(&self) -> (Phase, Instant, Option<Instant>) {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let own = st.handler_started.or(st.waited_until).max(st.wrote_until);
        (st.phase, st.since, own)
    }

    /// Completes on the next phase change (a permit is kept if none is waiting).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    fn enter(&self, phase: Phase) {
        {
            let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            match st.phase {
                Phase::Waiting => st.waited_until = Some(now),
                Phase::StoreAfter => st.wrote_until = Some(now),
                _ => {}
            }
            st.phase = phase;
            st.since = now;
        }
        self.changed.notify_one();
    }

    fn leave(&self) {
        self.enter(Phase::Idle);
    }
}

tokio::task_local! {
    static PROBE: Arc<StoreProbe>;
}

const SYNC_STORE_FAILED: u8 = 1;
const SYNC_IN_FLIGHT: u8 = 2;

/// Sync handlers run on tokio's blocking pool, where the runtime's task-local is not
/// visible: a sync guard running inside a capture (`capture_outcome_sync`, which every sync
/// handler runs in) records its markers here under its key instead, and the runtime takes
/// them by the envelope's `meta.id` (the default key). A sync handler keyed on something
/// else is not recognised this way: its store failure counts as a handler failure (retried
/// with backoff) unless the handler wraps it in
/// [`StoreUnavailable`](crate::runtime::StoreUnavailable).
static SYNC_MARKS: LazyLock<Mutex<HashMap<String, u8>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static SYNC_MARKS_LEN: AtomicUsize = AtomicUsize::new(0);

/// Runs `fut` with `probe` visible to every guard inside it (the runtime wraps each
/// handler call in this).
pub(crate) fn with_probe<F: Future>(
    probe: Arc<StoreProbe>,
    fut: F,
) -> impl Future<Output = F::Output> {
    // Not an `async fn`: its future would hold `fut` twice (see `replay::scope`).
    PROBE.scope(probe, fut)
}

/// `f` on the current delivery's probe (`None` outside a runtime delivery), without
/// cloning the `Arc`: the guard asks several times per call.
fn with_current<T>(f: impl FnOnce(&StoreProbe) -> T) -> Option<T> {
    PROBE.try_with(|p| f(p)).ok()
}

/// Moves a sync guard's markers for `key` (recorded on the blocking pool) into `probe`.
pub(crate) fn take_sync_marks(key: &str, probe: &StoreProbe) {
    if SYNC_MARKS_LEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    let mut map = SYNC_MARKS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(bits) = map.remove(key) {
        SYNC_MARKS_LEN.fetch_sub(1, Ordering::Relaxed);
        if bits & SYNC_STORE_FAILED != 0 {
            probe.store_failed.store(true, Ordering::SeqCst);
        }
        if bits & SYNC_IN_FLIGHT != 0 {
            probe.in_flight.store(true, Ordering::SeqCst);
        }
    }
}

fn mark(key: &str, bit: u8) {
    let marked = with_current(|p| {
        let flag = if bit == SYNC_STORE_FAILED {
            &p.store_failed
        } else {
            &p.in_flight
        };
        flag.store(true, Ordering::SeqCst);
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

/// After a successful handler: hands the guard's `remember` over to the runtime (to be
/// sent with the ack), with the turn on the key, when this is a runtime delivery whose
/// transport shares the store's server. `Err(turn)`: not handed over, the guard
/// remembers itself.
pub(crate) fn defer_remember(
    turn: Option<KeyTurn>,
    offer: impl FnOnce(&str) -> Option<PipelinedWrite>,
) -> Result<(), Option<KeyTurn>> {
    let mut turn = turn;
    let handed = with_current(|probe| {
        let Some(server) = probe.pipeline_server.as_deref() else {
            return false;
        };
        match offer(server) {
            Some(write) if write.server() == server => {
                let mut d = probe
                    .deferred
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                d.writes.push(write);
                d.turns.extend(turn.take());
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

/// Whether a guard call runs in a delivery of the consume runtime (the runtime's probe is
/// visible), looked up once per call: outside one, the guard's other steps skip the
/// task-local lookups they would each make.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Delivery(bool);

/// Looks up [`Delivery`] for the current guard call.
pub(crate) fn delivery() -> Delivery {
    Delivery(with_current(|_| ()).is_some())
}

impl Delivery {
    /// Whether this is a delivery of the runtime: if so, the guard takes the turn on its
    /// key and reports to the probe ([`turn_async`], [`store_before`], [`handler_runs`],
    /// [`defer_remember`], [`owed_write`]); if not, it calls the store directly and
    /// passes what `seen` answered through [`store_answer`](Self::store_answer).
    pub(crate) fn of_runtime(self) -> bool {
        self.0
    }

    /// Outside a runtime delivery: records a failed `seen` / `claim` (for a sync capture,
    /// see [`mark`]), as [`store_before`] does.
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
    with_current(|p| {
        p.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .handler_started = Some(Instant::now());
        p.changed.notify_one();
    });
}

/// Runs the guard's store call before the handler (`seen` / `claim`): phase marked for
/// the runtime's store timeout, failure recorded as the typed store-unavailable marker.
pub(crate) async fn store_before<T, E, F>(key: &str, fut: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let probed = with_current(|p| p.enter(Phase::StoreBefore)).is_some();
    let out = fut.await;
    if probed {
        with_current(StoreProbe::leave);
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

/// Runs the store write a guard owes after a successful handler (`remember` /
/// `complete`, `what` names it in the log).
///
/// Inside a runtime delivery the write is **kept with the message**: it is tried, each
/// try cut at the store timeout, and tried again after the store backoff until the store
/// answers. Meanwhile the handler's future has not returned, so the message stays
/// unacknowledged and the guard keeps the turn on its key (a duplicate in this process
/// waits). Only the runtime dropping the delivery (a shutdown past its grace period) ends
/// it, leaving the message unacked for recovery. Outside a runtime delivery (a guard
/// called by hand) the write is tried once and its answer returned.
pub(crate) async fn owed_write<T, E, F, Fut>(key: &str, what: &'static str, op: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    owed_write_within(key, what, None, op).await
}

/// [`owed_write`] with the retries at most `cap` apart (`None`: the store backoff's
/// maximum). A lease guard passes its renewal interval: its `complete` must land before
/// the lease ends, so a store back between two cuts is not missed by a backoff that grew
/// to the lease's own length.
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
    let Some(Some(retry)) = with_current(|p| {
        p.enter(Phase::StoreAfter);
        p.owed
    }) else {
        let out = op().await;
        with_current(StoreProbe::leave);
        return out;
    };
    let mut backoff = OwedBackoff::new(&retry, cap);
    let mut failed = false;
    loop {
        let delay = backoff.wait();
        match tokio::time::timeout(retry.timeout, op()).await {
            Ok(Ok(v)) => {
                with_current(|p| {
                    if failed {
                        p.store_down(false);
                    }
                    p.leave();
                });
                return Ok(v);
            }
            Ok(Err(error)) => owed_failed(key, what, &error, delay),
            Err(_) => owed_failed(key, what, &"no answer within the store timeout", delay),
        }
        if !failed {
            failed = true;
            with_current(|p| p.store_down(true));
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
    /// The runtime delivery's probe, for a sync handler on the blocking pool (where the
    /// task-local is not visible): only the owed-write loop reads it.
    static SYNC_PROBE: std::cell::RefCell<Option<Arc<StoreProbe>>> =
        const { std::cell::RefCell::new(None) };
}

/// The current runtime delivery's probe, to be carried to a sync handler's thread.
pub(crate) fn current_probe() -> Option<Arc<StoreProbe>> {
    PROBE.try_with(Arc::clone).ok()
}

/// Runs `f` (a sync handler, on the blocking pool) with `probe` visible to
/// [`owed_write_sync`]; restored on exit and on panic.
pub(crate) fn sync_probe_scope<T>(probe: Option<Arc<StoreProbe>>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Arc<StoreProbe>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0.take();
            SYNC_PROBE.with(|p| *p.borrow_mut() = old);
        }
    }
    let old = SYNC_PROBE.with(|p| p.replace(probe));
    let _restore = Restore(old);
    f()
}

/// The blocking counterpart of [`owed_write`], for sync guards: inside a runtime
/// delivery's sync handler the write is retried after the store backoff until it
/// succeeds or the runtime gives the delivery up (then the last error is returned and the
/// message, already dropped by the runtime, stays unacked). A blocking try cannot be cut:
/// the store's own timeouts bound it. Elsewhere the write is tried once.
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
    let probe = if crate::outcome::capturing_sync() {
        SYNC_PROBE.with(|p| p.borrow().clone())
    } else {
        None
    };
    let Some((probe, retry)) = probe.and_then(|p| p.owed.map(|r| (p, r))) else {
        return op();
    };
    // The runtime's watchdog sees the phase too: no handler timeout while the write is
    // owed.
    probe.enter(Phase::StoreAfter);
    let mut backoff = OwedBackoff::new(&retry, cap);
    let mut failed = false;
    loop {
        let delay = backoff.wait();
        match op() {
            Ok(v) => {
                if failed {
                    probe.store_down(false);
                }
                probe.leave();
                return Ok(v);
            }
            Err(error) => {
                if probe.abandoned.load(Ordering::SeqCst) {
                    probe.leave();
                    return Err(error);
                }
                owed_failed(key, what, &error, delay);
                if !failed {
                    failed = true;
                    probe.store_down(true);
                }
            }
        }
        std::thread::sleep(delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    /// After a write that followed the handler (an owed write that outlasted the handler
    /// timeout), the handler's own time counts from the write's end: the runtime's watchdog,
    /// waking in the moment between a sync guard's write and its return, does not find the
    /// handler timeout long past (what `a_sync_guard_retries_its_remember_past_the_
    /// handler_timeout` checks over a real store).
    #[tokio::test(start_paused = true)]
    async fn the_handlers_own_time_counts_again_after_its_write() {
        let probe = StoreProbe::default();
        let started = Instant::now();
        assert_eq!(probe.phase().2, None);
        tokio::time::advance(Duration::from_millis(100)).await;
        probe.enter(Phase::StoreAfter);
        tokio::time::advance(Duration::from_secs(3)).await;
        probe.leave();
        let (phase, _, own) = probe.phase();
        assert_eq!(phase, Phase::Idle);
        assert_eq!(own, Some(started + Duration::from_millis(3100)));
        // A wait for the key's turn that ends later counts from its end, as before.
        tokio::time::advance(Duration::from_secs(1)).await;
        probe.enter(Phase::Waiting);
        tokio::time::advance(Duration::from_secs(1)).await;
        probe.leave();
        assert_eq!(probe.phase().2, Some(started + Duration::from_millis(5100)));
    }

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
