//! The worker loop (reserve → process → settle, `concurrency` at once), the background
//! task beside it (the transport's events, the depth gauge), shutdown with a grace period,
//! and the drain's end.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use super::ctx::Ctx;
use super::depth::HeldElsewhere;
use super::execute::{PendingAck, Processed, process, settle_exhausted};
use super::report::{Disposition, DrainError, Report, Stats};
use super::transport::{
    ConsumerEvent, ConsumerOptions, Delivery, EventSink, Settled, TransportError,
};
use super::{metrics, observe};

/// How a consume ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// When the queue, its delayed messages and this consumer's in-flight messages are
    /// all empty.
    Drain,
    /// When the shutdown future completes.
    Run,
}

/// Delayed messages promoted per call.
const PROMOTE_BATCH: usize = 1000;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Shared {
    ctx: Ctx,
    mode: Mode,
    /// Stop reserving.
    stop: AtomicBool,
    /// Notified when a message was settled (it may have been put back) and on stop.
    wake: Notify,
    /// Workers reserving or handling (drain: the last one to go idle checks the end).
    busy: AtomicUsize,
    /// One blocking reserve at a time (a `BLMOVE` holds its connection).
    blocking: tokio::sync::Mutex<()>,
    gave_up: Mutex<Option<TransportError>>,
    maint_stop: AtomicBool,
    /// Stops the background task.
    bg_stop: Notify,
    /// Drain: until when it waits for other consumers' lists (set when first seen).
    held_deadline: Mutex<Option<Instant>>,
    /// Drain: what it ended without (other consumers' lists, after the wait).
    left: Mutex<Vec<HeldElsewhere>>,
}

impl Shared {
    fn halt(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Completes once [`halt`](Self::halt) was called.
    async fn stopped(&self) {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.stopping() {
                return;
            }
            notified.await;
        }
    }

    /// Reserves the next message; a pending ack goes with it (one round trip where the
    /// transport allows) and its delivery is reported.
    async fn reserve(
        &self,
        pending: Option<PendingAck>,
        stats: &mut Stats,
    ) -> Result<Option<Delivery>, TransportError> {
        let queue = &self.ctx.config.queue;
        let got = match pending {
            None => self.ctx.transport.reserve(queue, Duration::ZERO).await?,
            Some(p) => match self
                .ctx
                .transport
                .ack_and_reserve(&p.delivery, &p.deferred.writes, Some(queue))
                .await
            {
                Ok(got) => {
                    self.finish(p, Ok(()), stats);
                    got
                }
                Err(error) => {
                    // Which parts were done is unknown: the writes and the ack again, on
                    // their own (each is idempotent).
                    tracing::warn!(%error, "ack with the next reserve failed; acking on its own");
                    self.flush(p, stats).await;
                    return Err(error);
                }
            },
        };
        if got.is_some() || self.mode == Mode::Drain {
            return Ok(got);
        }
        // Nothing waiting: block, one worker at a time, until a message arrives or the
        // poll timeout ends (never cancelled halfway, so nothing is stranded).
        let _turn = tokio::select! {
            biased;
            () = self.stopped() => return Ok(None),
            turn = self.blocking.lock() => turn,
        };
        if self.stopping() {
            return Ok(None);
        }
        self.ctx
            .transport
            .reserve(queue, self.ctx.config.poll_timeout)
            .await
    }

    fn observe(&self, report: &Report, stats: &mut Stats) {
        if let Some(observer) = &self.ctx.observer
            && std::panic::catch_unwind(AssertUnwindSafe(|| observer(report))).is_err()
        {
            tracing::error!("the on_delivery observer panicked");
        }
        metrics::delivery(report);
        stats.record(report);
    }

    /// Processes a delivery; an ack left for the next reserve is returned.
    async fn handle(&self, delivery: Delivery, stats: &mut Stats) -> Option<PendingAck> {
        let span = observe::message_span(&self.ctx.config.queue, &delivery);
        let _in_flight = metrics::InFlightGauge::enter(&self.ctx.config.queue);
        let defer = self.ctx.defer_acks && !self.stopping();
        match process(&self.ctx, delivery, defer).instrument(span).await {
            Processed::Done(report) => {
                self.observe(&report, stats);
                self.wake.notify_waiters();
                None
            }
            Processed::AckPending(p) => Some(p),
        }
    }

    /// Sends a pending ack on its own (retried until done), then reports its delivery.
    async fn flush(&self, p: PendingAck, stats: &mut Stats) {
        let r = self.ctx.ack_with(&p.delivery, &p.deferred).await;
        self.finish(p, r, stats);
    }

    /// Reports a delivery whose pending ack was sent (or could not be).
    fn finish(&self, p: PendingAck, sent: Result<(), TransportError>, stats: &mut Stats) {
        let PendingAck {
            deferred,
            mut report,
            ..
        } = p;
        // The turns on the guarded keys end once their ids are remembered.
        drop(deferred);
        if let Err(e) = sent {
            tracing::error!(error = %e, "the message could not be settled; it stays in flight for recovery");
            report.disposition = Disposition::Stranded;
            report.acked = false;
            report.error = Some(e.to_string());
        }
        self.observe(&report, stats);
        self.wake.notify_waiters();
    }

    /// Drain: the last idle worker found the queue empty. `Ok(true)`: the drain is over;
    /// `Ok(false)`: delayed messages were waited for and promoted, keep going.
    async fn drain_end(&self) -> Result<bool, TransportError> {
        let queue = &self.ctx.config.queue;
        match self.ctx.transport.next_due(queue).await? {
            // The maintenance task may have promoted a delayed message to the queue since
            // this worker's last reserve came back empty (its wake-up found no worker
            // waiting): the queue is looked at again before the drain ends.
            None if self.ready_again(queue).await => Ok(false),
            None => self.drain_end_elsewhere().await,
            Some(wait) => {
                tracing::debug!(queue = %queue, wait_ms = wait.as_millis() as u64, "drain: waiting for delayed messages");
                tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
                self.ctx.transport.promote_due(queue, PROMOTE_BATCH).await?;
                Ok(false)
            }
        }
    }
}

impl Shared {
    /// Drain: whether `queue` holds ready messages again (a transport that cannot tell
    /// its depth answers no).
    async fn ready_again(&self, queue: &str) -> bool {
        matches!(self.ctx.transport.depth(queue).await, Ok(d) if d.ready > 0)
    }

    /// The state `workers` workers of one consume share (all counted busy at first).
    fn new(ctx: Ctx, mode: Mode, workers: usize) -> Arc<Self> {
        Arc::new(Shared {
            ctx,
            mode,
            stop: AtomicBool::new(false),
            wake: Notify::new(),
            busy: AtomicUsize::new(workers),
            blocking: tokio::sync::Mutex::new(()),
            gave_up: Mutex::new(None),
            maint_stop: AtomicBool::new(false),
            bg_stop: Notify::new(),
            held_deadline: Mutex::new(None),
            left: Mutex::new(Vec::new()),
        })
    }

    /// Drain, the queue looked empty ([`idle_in_drain`](Self::idle_in_drain)); a failed
    /// check is counted and waited out. `true`: the drain is over.
    async fn idle(&self, backoff: &mut Duration, stats: &mut Stats) -> bool {
        match self.idle_in_drain().await {
            Ok(over) => over,
            Err(error) => {
                stats.transport_errors += 1;
                tracing::warn!(%error, "checking delayed messages failed");
                tokio::time::sleep(*backoff).await;
                *backoff = (*backoff * 2).min(self.ctx.config.backoff_max);
                false
            }
        }
    }

    /// A reserve failed: counted, logged, and waited out with a growing backoff; a drain
    /// failing for longer than `give_up_after` gives up. `true`: stop this worker.
    async fn reserve_failed(
        &self,
        error: TransportError,
        backoff: &mut Duration,
        failing_since: &mut Option<Instant>,
        stats: &mut Stats,
    ) -> bool {
        let config = &self.ctx.config;
        stats.transport_errors += 1;
        let since = *failing_since.get_or_insert_with(Instant::now);
        tracing::warn!(
            queue = %config.queue,
            %error,
            retry_in_ms = backoff.as_millis() as u64,
            "reserve failed; reconnecting"
        );
        if self.mode == Mode::Drain && since.elapsed() >= config.give_up_after {
            lock(&self.gave_up).get_or_insert(error);
            self.halt();
            return true;
        }
        tokio::select! {
            biased;
            () = self.stopped() => {}
            () = tokio::time::sleep(*backoff) => {}
        }
        *backoff = (*backoff * 2).min(config.backoff_max);
        false
    }

    /// Drain, the queue looked empty: waits while another worker is still busy (its
    /// message may come back as a retry); the last one to go idle checks the delayed
    /// messages and ends the drain when there are none. `Ok(true)`: the drain is over
    /// (halted); `Ok(false)`: look again.
    async fn idle_in_drain(&self) -> Result<bool, TransportError> {
        let notified = self.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // The drain may have ended while this worker was still reserving (the last idle
        // worker found the queue empty after this one had been woken and counted busy
        // again): nothing would wake it any more, and it would wait forever.
        // (`halt` sets the flag before it wakes: checked after `enable`, one of the two
        // is seen.)
        if self.stopping() {
            return Ok(true);
        }
        let r = if self.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            match self.drain_end().await {
                Ok(true) => {
                    self.halt();
                    Ok(true)
                }
                other => other,
            }
        } else {
            notified.await;
            Ok(false)
        };
        if !matches!(r, Ok(true)) {
            self.busy.fetch_add(1, Ordering::SeqCst);
        }
        r
    }

    /// Drain, nothing left here: messages in other consumers' lists (a killed consumer
    /// whose heartbeat has not expired yet) are waited for, until the bound (the longest
    /// heartbeat time left when first seen, plus two recovery intervals: time for the
    /// maintenance to return them to the queue); then they are logged and reported.
    async fn drain_end_elsewhere(&self) -> Result<bool, TransportError> {
        let config = &self.ctx.config;
        let queue = &config.queue;
        let held = self.ctx.transport.held_elsewhere(queue).await?;
        if held.is_empty() {
            return Ok(true);
        }
        let now = Instant::now();
        let deadline = *lock(&self.held_deadline).get_or_insert_with(|| {
            let longest = held.iter().map(|h| h.expires_in).max().unwrap_or_default();
            let until = now + longest + config.recovery_interval * 2;
            let messages: u64 = held.iter().map(|h| h.messages).sum();
            tracing::info!(
                queue = %queue,
                messages,
                consumers = held.len(),
                wait_ms = (until - now).as_millis() as u64,
                "drain: the queue is empty but other consumers hold messages; waiting for their heartbeats to expire and their lists to be recovered"
            );
            until
        });
        if now < deadline {
            let step = (config.recovery_interval / 4)
                .clamp(Duration::from_millis(10), Duration::from_secs(1))
                .min(deadline - now);
            tokio::time::sleep(step).await;
            return Ok(false);
        }
        for h in &held {
            tracing::warn!(
                queue = %queue,
                consumer = %h.consumer,
                messages = h.messages,
                heartbeat_expires_in_ms = h.expires_in.as_millis() as u64,
                "drain ended leaving messages in the in-flight list of another consumer (its heartbeat has not expired): a consumer running once it expires recovers them"
            );
        }
        *lock(&self.left) = held;
        Ok(true)
    }
}

/// One consumer loop; `concurrency` of them run at once. Returns what it did.
async fn worker(shared: Arc<Shared>) -> Stats {
    let config = &shared.ctx.config;
    let mut stats = Stats::default();
    let mut backoff = config.backoff_min;
    let mut failing_since: Option<Instant> = None;
    // An ack waiting to go with the next reserve.
    let mut pending: Option<PendingAck> = None;
    while !shared.stopping() {
        // The dedupe store is down: pause reserving (it resumes by itself).
        if let Some(until) = shared.ctx.store.paused_until() {
            if let Some(p) = pending.take() {
                shared.flush(p, &mut stats).await;
            }
            tokio::select! {
                biased;
                () = shared.stopped() => break,
                () = tokio::time::sleep_until(until) => {}
            }
            continue;
        }
        match shared.reserve(pending.take(), &mut stats).await {
            Ok(Some(delivery)) => {
                backoff = config.backoff_min;
                failing_since = None;
                tokio::select! {
                    biased;
                    p = shared.handle(delivery, &mut stats) => pending = p,
                    () = shared.ctx.wait_hard_stop() => {
                        tracing::warn!(queue = %config.queue, "shutdown grace period over: a message is left in flight for recovery");
                        stats.processed += 1;
                        stats.unacked += 1;
                        break;
                    }
                }
            }
            Ok(None) => {
                backoff = config.backoff_min;
                failing_since = None;
                if shared.mode == Mode::Run {
                    continue;
                }
                if shared.idle(&mut backoff, &mut stats).await {
                    break;
                }
            }
            Err(error) => {
                if shared
                    .reserve_failed(error, &mut backoff, &mut failing_since, &mut stats)
                    .await
                {
                    break;
                }
            }
        }
    }
    if let Some(p) = pending.take() {
        shared.flush(p, &mut stats).await;
    }
    stats
}

/// Processes one delivery of a batch worker; the worker reports it.
async fn process_one(shared: Arc<Shared>, delivery: Delivery) -> Processed {
    let span = observe::message_span(&shared.ctx.config.queue, &delivery);
    let _in_flight = metrics::InFlightGauge::enter(&shared.ctx.config.queue);
    let defer = shared.ctx.defer_acks && !shared.stopping();
    process(&shared.ctx, delivery, defer).instrument(span).await
}

/// The handlers a batch worker runs, all in its own task.
type Running<F> = FuturesUnordered<F>;

/// Awaits `fut` while the worker's handlers go on; what they finish meanwhile is put in
/// `finished`.
async fn beside<T, F>(
    fut: impl Future<Output = T>,
    running: &mut Running<F>,
    finished: &mut Vec<Processed>,
) -> T
where
    F: Future<Output = Processed>,
{
    tokio::pin!(fut);
    loop {
        tokio::select! {
            biased;
            out = &mut fut => return out,
            Some(p) = running.next(), if !running.is_empty() => finished.push(p),
        }
    }
}

impl Shared {
    /// Reports what the handlers finished: a settled delivery at once, one whose ack
    /// waits into `acks`.
    fn absorb(&self, finished: &mut Vec<Processed>, acks: &mut Vec<PendingAck>, stats: &mut Stats) {
        for p in finished.drain(..) {
            match p {
                Processed::Done(report) => {
                    self.observe(&report, stats);
                    self.wake.notify_waiters();
                }
                Processed::AckPending(p) => acks.push(p),
            }
        }
    }
}

/// A worker holding up to `places` messages at once (see `App::batch`): the acks of what
/// its handlers finished and the refill of its free places go to the broker in one round
/// trip, as soon as anything finished; its handlers run in its own task, so their store
/// calls leave together. Nothing waits for a batch to fill.
async fn batch_worker(shared: Arc<Shared>, places: usize) -> Stats {
    let config = &shared.ctx.config;
    let queue = config.queue.as_str();
    let mut stats = Stats::default();
    let mut backoff = config.backoff_min;
    let mut failing_since: Option<Instant> = None;
    let mut running = FuturesUnordered::new();
    // Sized once for the worker's places, and kept (drained, never replaced), so that no
    // batch grows them again: their elements are large (a delivery and its report).
    let mut finished: Vec<Processed> = Vec::with_capacity(places);
    // Handled, their acks to send (with their store writes) in the next round trip.
    let mut acks: Vec<PendingAck> = Vec::with_capacity(places);
    // The acks of the round trip in progress (swapped with `acks`, so both keep theirs).
    let mut sending: Vec<PendingAck> = Vec::with_capacity(places);
    // The last refill found fewer messages than places: refill again only with acks.
    let mut dry = false;
    loop {
        shared.absorb(&mut finished, &mut acks, &mut stats);
        let stopping = shared.stopping();
        let paused = shared.ctx.store.paused_until();
        let free = if stopping || paused.is_some() {
            0
        } else {
            places - running.len()
        };
        if !acks.is_empty() || (free > 0 && !dry) {
            std::mem::swap(&mut sending, &mut acks);
            let next = (free > 0).then_some((queue, free));
            let r = {
                let settled: Vec<Settled<'_>> = sending
                    .iter()
                    .map(|p| Settled {
                        delivery: &p.delivery,
                        writes: &p.deferred.writes,
                    })
                    .collect();
                let fut = shared.ctx.transport.settle_and_reserve(&settled, next);
                beside(fut, &mut running, &mut finished).await
            };
            match r {
                Ok(got) => {
                    backoff = config.backoff_min;
                    failing_since = None;
                    for p in sending.drain(..) {
                        shared.finish(p, Ok(()), &mut stats);
                    }
                    dry = free > 0 && got.len() < free;
                    for d in got {
                        running.push(process_one(Arc::clone(&shared), d));
                    }
                }
                Err(error) => {
                    stats.transport_errors += 1;
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    tracing::warn!(
                        queue = %config.queue,
                        %error,
                        acks = sending.len(),
                        retry_in_ms = backoff.as_millis() as u64,
                        "settling a batch failed; acking each on its own, then reconnecting"
                    );
                    // Which parts were done is unknown: the writes and the acks again, each
                    // on its own (each is idempotent), retried until done.
                    for p in sending.drain(..) {
                        let r = beside(
                            shared.ctx.ack_with(&p.delivery, &p.deferred),
                            &mut running,
                            &mut finished,
                        )
                        .await;
                        shared.finish(p, r, &mut stats);
                    }
                    if shared.mode == Mode::Drain && since.elapsed() >= config.give_up_after {
                        lock(&shared.gave_up).get_or_insert(error);
                        shared.halt();
                    }
                    let pause = async {
                        tokio::select! {
                            biased;
                            () = shared.stopped() => {}
                            () = tokio::time::sleep(backoff) => {}
                        }
                    };
                    beside(pause, &mut running, &mut finished).await;
                    backoff = (backoff * 2).min(config.backoff_max);
                }
            }
            continue;
        }
        if !running.is_empty() {
            // Wait for a handler, then take every one that is done too.
            tokio::select! {
                biased;
                Some(p) = running.next() => {
                    finished.push(p);
                    while let Some(Some(p)) = running.next().now_or_never() {
                        finished.push(p);
                    }
                }
                () = shared.ctx.wait_hard_stop() => {
                    let left = running.len() as u64;
                    tracing::warn!(queue = %config.queue, messages = left, "shutdown grace period over: messages are left in flight for recovery");
                    stats.processed += left;
                    stats.unacked += left;
                    break;
                }
            }
            continue;
        }
        // Nothing running, nothing to settle.
        if stopping {
            break;
        }
        if let Some(until) = paused {
            tokio::select! {
                biased;
                () = shared.stopped() => break,
                () = tokio::time::sleep_until(until) => {}
            }
            continue;
        }
        // The queue looked empty: wait as a one-message worker does.
        dry = false;
        match shared.reserve(None, &mut stats).await {
            Ok(Some(delivery)) => {
                backoff = config.backoff_min;
                failing_since = None;
                running.push(process_one(Arc::clone(&shared), delivery));
            }
            Ok(None) => {
                backoff = config.backoff_min;
                failing_since = None;
                if shared.mode == Mode::Run {
                    continue;
                }
                if shared.idle(&mut backoff, &mut stats).await {
                    break;
                }
            }
            Err(error) => {
                if shared
                    .reserve_failed(error, &mut backoff, &mut failing_since, &mut stats)
                    .await
                {
                    break;
                }
            }
        }
    }
    shared.absorb(&mut finished, &mut acks, &mut stats);
    for p in acks {
        shared.flush(p, &mut stats).await;
    }
    stats
}

/// Acts on what the transport's background work reported.
async fn on_event(shared: &Shared, event: ConsumerEvent, stats: &mut Stats) {
    let ctx = &shared.ctx;
    match event {
        ConsumerEvent::Ready => shared.wake.notify_waiters(),
        ConsumerEvent::Recovered(n) => {
            tracing::warn!(queue = %ctx.config.queue, requeued = n, "recovered the in-flight messages of dead consumers");
            stats.recovered += n as u64;
            shared.wake.notify_waiters();
        }
        ConsumerEvent::Exhausted(d, max) => {
            let report = settle_exhausted(ctx, d, max).await;
            shared.observe(&report, stats);
        }
        ConsumerEvent::Error(error) => {
            stats.transport_errors += 1;
            tracing::warn!(%error, "the transport's background work failed; it tries again");
        }
    }
}

/// Beside the workers: the transport's events, and the queue depth gauge (sampled once a
/// heartbeat interval, never per message). Whatever a broker needs beside the message
/// loop (Redis: heartbeat, recovery, promotion) is the transport's own background work.
async fn background(shared: Arc<Shared>, mut events: UnboundedReceiver<ConsumerEvent>) -> Stats {
    let ctx = &shared.ctx;
    let queue = ctx.config.queue.as_str();
    let interval = ctx.config.heartbeat_interval;
    let mut stats = Stats::default();
    let mut next_sample = Instant::now() + interval;
    let mut open = true;
    loop {
        let stop = shared.bg_stop.notified();
        tokio::pin!(stop);
        stop.as_mut().enable();
        if shared.maint_stop.load(Ordering::SeqCst) {
            break;
        }
        tokio::select! {
            event = events.recv(), if open => match event {
                Some(event) => on_event(&shared, event, &mut stats).await,
                None => open = false,
            },
            () = tokio::time::sleep_until(next_sample) => {
                metrics::sample_depth(ctx.transport.as_ref(), queue).await;
                next_sample = Instant::now() + interval;
            }
            () = stop => break,
        }
    }
    while let Ok(event) = events.try_recv() {
        on_event(&shared, event, &mut stats).await;
    }
    stats
}

/// The places of each batch worker (`ceil(concurrency / k)` workers sharing the
/// `concurrency` places evenly), or `None`: one message per worker (`k` is 1). By
/// default (no `App::batch`) `k` is the transport's hint, and at most an eighth of the
/// places, so that at least eight workers overlap their round trips (a worker waits for
/// its settle-and-refill round trip before it takes more). Swept on Redis, seen-set and
/// lease mode, `k` of 1 to 16 at concurrency 8, 16 and 32: the best was 1 below 16 and
/// 2 to 4 at 16 and 32 (seen-set; lease mode: 1, then 2 to 4 within 10 %); two workers
/// sharing the places (the earlier default) were 0.57× to 0.80× of it.
fn batch_places(config: &super::config::Config, hint: usize) -> Option<Vec<usize>> {
    let c = config.concurrency.max(1);
    let k = match config.batch {
        Some(k) => k.clamp(1, c),
        None => hint.clamp(1, (c / 8).max(1)),
    };
    if k == 1 {
        return None;
    }
    let workers = c.div_ceil(k);
    Some(
        (0..workers)
            .map(|i| c / workers + usize::from(i < c % workers))
            .collect(),
    )
}

/// Runs a drain or a run of `app`.
pub(crate) async fn consume<S>(ctx: Ctx, mode: Mode, shutdown: S) -> Result<Stats, DrainError>
where
    S: Future<Output = ()> + Send,
{
    let config = ctx.config.clone();
    let queue = config.queue.clone();
    let transport = Arc::clone(&ctx.transport);
    let places = batch_places(&config, transport.batch_hint());
    let shared = Shared::new(
        ctx,
        mode,
        places.as_ref().map_or(config.concurrency, Vec::len),
    );
    let mut stats = Stats::default();

    // The transport starts what its broker needs beside the message loop (Redis: it
    // registers, and takes back what dead consumers left, before the first reserve).
    let (sink, events) = EventSink::channel();
    let options = ConsumerOptions::new(config.concurrency)
        .heartbeat(config.heartbeat_interval, config.heartbeat_ttl)
        .recovery(config.recovery_interval, config.max_recoveries)
        .backoff_max(config.backoff_max)
        .with_events(sink);
    if let Err(error) = transport.start_consumer(&queue, &options).await {
        stats.transport_errors += 1;
        tracing::warn!(%error, "starting the consumer failed; reserving anyway");
    }
    drop(options);
    shared.ctx.readiness.consuming(&queue, true);
    let maint = tokio::spawn(background(Arc::clone(&shared), events));

    let mut workers = JoinSet::new();
    match places {
        None => {
            for _ in 0..config.concurrency {
                workers.spawn(worker(Arc::clone(&shared)));
            }
        }
        Some(places) => {
            for n in places {
                workers.spawn(batch_worker(Arc::clone(&shared), n));
            }
        }
    }
    let merge = |done: Result<Stats, tokio::task::JoinError>, stats: &mut Stats| match done {
        Ok(s) => stats.merge(&s),
        Err(e) => {
            // A bug, not a handler failure (those are caught): stop rather than let a
            // drain wait for the lost worker. Its message stays in flight.
            tracing::error!(error = %e, "consumer worker failed; stopping");
            shared.halt();
        }
    };
    let shut_down = tokio::select! {
        biased;
        () = shutdown => true,
        () = async {
            while let Some(done) = workers.join_next().await {
                merge(done, &mut stats);
            }
        } => false,
    };
    if shut_down {
        tracing::info!(queue = %queue, grace_ms = config.shutdown_grace.as_millis() as u64, "shutting down: finishing in-flight messages");
        shared.halt();
        let grace = tokio::time::sleep(config.shutdown_grace);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                biased;
                done = workers.join_next() => match done {
                    Some(done) => merge(done, &mut stats),
                    None => break,
                },
                () = &mut grace, if !shared.ctx.hard_stopped() => {
                    tracing::warn!(queue = %queue, "shutdown grace period over: leaving the remaining in-flight messages for recovery");
                    shared.ctx.hard_stop.store(true, Ordering::SeqCst);
                    shared.ctx.hard_notify.notify_waiters();
                }
            }
        }
    }
    while let Some(done) = workers.join_next().await {
        merge(done, &mut stats);
    }
    shared.ctx.readiness.consuming(&queue, false);
    if let Err(error) = transport.leave(&queue).await {
        tracing::warn!(%error, "leaving the consumer registry failed; the heartbeat expires by itself");
    }
    shared.maint_stop.store(true, Ordering::SeqCst);
    shared.bg_stop.notify_one();
    match maint.await {
        Ok(s) => stats.merge(&s),
        Err(e) => tracing::error!(error = %e, "the consumer's background task failed"),
    }
    stats
        .left_in_flight
        .extend(std::mem::take(&mut *lock(&shared.left)));
    let gave_up = lock(&shared.gave_up).take();
    match gave_up {
        Some(error) => Err(DrainError { error, stats }),
        None => Ok(stats),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(concurrency: usize, batch: Option<usize>, hint: usize) -> Option<Vec<usize>> {
        let mut config = crate::App::new(crate::InMemoryTransport::new())
            .concurrency(concurrency)
            .config;
        config.batch = batch;
        batch_places(&config, hint)
    }

    /// The hang seen in `babelqueue-bench --mode lease --concurrency 8` (5 drains in about
    /// 130 on a loaded 2-core machine): the last idle worker ends the drain while
    /// another, woken just before, is still reserving; that one then finds the queue
    /// empty and goes idle after the drain ended. It must end too, not wait for a wake-up
    /// that never comes (paused time: a wait would run into the timeout at once).
    #[tokio::test(start_paused = true)]
    async fn a_worker_going_idle_after_the_drain_ended_ends_too() {
        let app = crate::App::new(crate::InMemoryTransport::new()).concurrency(2);
        let shared = Shared::new(app.ctx(), Mode::Drain, 2);
        // Worker 1 was the last idle one and ended the drain (worker 2 counted busy).
        shared.halt();
        // Worker 2's reserve then found nothing.
        let over = tokio::time::timeout(Duration::from_secs(3600), shared.idle_in_drain()).await;
        assert!(
            matches!(over, Ok(Ok(true))),
            "a worker idle after the drain ended must end it too: {over:?}"
        );
    }

    #[test]
    fn workers_share_the_places_evenly_and_by_default_at_least_eight_overlap() {
        // The transport's hint, at most an eighth of the places.
        assert_eq!(places(32, None, 16), Some(vec![4; 8]));
        assert_eq!(places(16, None, 16), Some(vec![2; 8]));
        assert_eq!(places(128, None, 16), Some(vec![16; 8]));
        assert_eq!(places(256, None, 16), Some(vec![16; 16]));
        assert_eq!(places(20, None, 16), Some(vec![2; 10]));
        assert_eq!(places(8, None, 16), None, "one message per worker below 16");
        assert_eq!(places(15, None, 16), None);
        assert_eq!(places(2, None, 16), None, "batches of one");
        assert_eq!(places(1, None, 16), None);
        assert_eq!(places(32, None, 1), None, "a transport without batches");
        // App::batch wins, never above the concurrency.
        assert_eq!(places(8, Some(8), 16), Some(vec![8]));
        assert_eq!(places(10, Some(4), 1), Some(vec![4, 3, 3]));
        assert_eq!(places(4, Some(64), 1), Some(vec![4]));
        assert_eq!(places(8, Some(1), 16), None);
    }
}
