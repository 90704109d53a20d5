//! The runtime's side of the guard's seam ([`babelqueue_core::hooks`]): one
//! [`StoreProbe`] per delivery, installed around the handler call, holding what the
//! guard told (store failed, in flight elsewhere, the phase it is in, the writes it
//! handed over) for the runtime to settle by.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use babelqueue_core::hooks::{GuardHooks, KeyTurn, OwedRetry, Phase};
use babelqueue_core::pipelined::PipelinedWrite;
use tokio::sync::Notify;
use tokio::time::Instant;

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
    /// sent with the ack (see [`babelqueue_core::pipelined`]).
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
}

impl GuardHooks for StoreProbe {
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

    fn handler_started(&self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .handler_started = Some(Instant::now());
        self.changed.notify_one();
    }

    fn mark_store_failed(&self) {
        self.store_failed.store(true, Ordering::SeqCst);
    }

    fn mark_in_flight(&self) {
        self.in_flight.store(true, Ordering::SeqCst);
    }

    fn owed_retry(&self) -> Option<OwedRetry> {
        self.owed
    }

    fn store_down(&self, down: bool) {
        if let Some(hook) = &self.store_down {
            (hook.0)(down);
        }
    }

    fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    fn pipeline_server(&self) -> Option<&str> {
        self.pipeline_server.as_deref()
    }

    fn defer(&self, write: PipelinedWrite, turn: Option<KeyTurn>) {
        let mut d = self.deferred.lock().unwrap_or_else(PoisonError::into_inner);
        d.writes.push(write);
        d.turns.extend(turn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        probe.enter(Phase::Idle);
        let (phase, _, own) = probe.phase();
        assert_eq!(phase, Phase::Idle);
        assert_eq!(own, Some(started + Duration::from_millis(3100)));
        // A wait for the key's turn that ends later counts from its end, as before.
        tokio::time::advance(Duration::from_secs(1)).await;
        probe.enter(Phase::Waiting);
        tokio::time::advance(Duration::from_secs(1)).await;
        probe.enter(Phase::Idle);
        assert_eq!(probe.phase().2, Some(started + Duration::from_millis(5100)));
    }
}
