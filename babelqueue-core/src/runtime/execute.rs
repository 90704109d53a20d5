//! One delivery, from reserved to settled: the checks, the handler call (exactly one
//! function calls handlers: [`call`]), the classification into a
//! [`Happened`](super::settle::Happened), and the executor that carries the decided
//! [`Action`] out against the transport.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::app::{Config, Observer, UnknownUrnStrategy};
use super::dead_letter::{self, Block};
use super::errors::{HandlerTimeout, Permanent, StoreTimeout, StoreUnavailable, in_chain};
use super::observe;
use super::report::{Disposition, Report};
use super::settle::{Action, Happened, Policy, PutBack, decide};
use super::transport::{Delivery, Headers, Republish, Transport, TransportError};
use crate::envelope::{DeadLetterReason, Envelope};
use crate::guard::Outcome;
use crate::handler::{BoxFuture, Handler, HandlerError, HandlerOutput, Router, UnknownUrn};
use crate::inflight::{self, Deferred, Phase, StoreProbe};
use crate::lease::InFlight;

/// The frame header carrying how many times a message was released (unknown URN under
/// [`UnknownUrnStrategy::Release`]).
pub const RELEASES_HEADER: &str = "x-babelqueue-releases";

/// The dedupe store's health as this consumer sees it: consecutive failures and the pause
/// they impose on reserving.
#[derive(Default)]
pub(crate) struct StoreHealth {
    failures: AtomicU32,
    paused_until: Mutex<Option<Instant>>,
}

impl StoreHealth {
    /// Records a failure; returns the pause (also the put-back delay).
    fn failed(&self, min: Duration, max: Duration) -> Duration {
        let n = self
            .failures
            .fetch_add(1, Ordering::SeqCst)
            .saturating_add(1);
        let pause = min
            .checked_mul(1u32 << (n - 1).min(20))
            .unwrap_or(max)
            .min(max);
        *self
            .paused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + pause);
        pause
    }

    /// The store answered: no more pause.
    fn ok(&self) {
        if self.failures.load(Ordering::Relaxed) > 0 {
            self.failures.store(0, Ordering::SeqCst);
            *self
                .paused_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    /// Until when reserving pauses, if it does.
    pub(crate) fn paused_until(&self) -> Option<Instant> {
        if self.failures.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let until = *self
            .paused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        until.filter(|&u| u > Instant::now())
    }
}

/// What every worker of one consume shares.
pub(crate) struct Ctx {
    pub transport: Arc<dyn Transport>,
    pub router: Arc<Router>,
    pub dlq: String,
    pub config: Config,
    pub observer: Option<Observer>,
    pub policy: Policy,
    pub store: StoreHealth,
    /// The shutdown grace period ended: stop retrying, leave messages in flight.
    pub hard_stop: AtomicBool,
    pub hard_notify: Notify,
    /// The transport's server, for stores whose `remember` can be sent with the ack.
    pub pipeline_server: Option<Arc<str>>,
    /// Acks wait for the worker's next reserve and go with it (one round trip).
    pub defer_acks: bool,
}

impl Ctx {
    pub(crate) fn new(
        transport: Arc<dyn Transport>,
        router: Arc<Router>,
        dlq: String,
        config: Config,
        observer: Option<Observer>,
    ) -> Self {
        let policy = Policy {
            retry: config.retry,
            unknown_urn: config.unknown_urn,
            dead_letter: config.dead_letter,
            in_flight_delay: config.in_flight_delay,
            release_delay: config.release_delay,
            max_releases: config.max_releases,
        };
        let pipeline_server = transport.pipeline_server().map(Arc::from);
        let defer_acks = transport.combines_ack_and_reserve();
        Ctx {
            pipeline_server,
            defer_acks,
            transport,
            router,
            dlq,
            config,
            observer,
            policy,
            store: StoreHealth::default(),
            hard_stop: AtomicBool::new(false),
            hard_notify: Notify::new(),
        }
    }

    pub(crate) fn hard_stopped(&self) -> bool {
        self.hard_stop.load(Ordering::SeqCst)
    }

    /// Completes once the grace period ended.
    pub(crate) async fn wait_hard_stop(&self) {
        loop {
            let n = self.hard_notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.hard_stopped() {
                return;
            }
            n.await;
        }
    }

    /// Sends a delivery's handed-over store writes and its ack (one round trip where the
    /// transport allows), retried until done.
    pub(crate) async fn ack_with(
        &self,
        d: &Delivery,
        deferred: &Deferred,
    ) -> Result<(), TransportError> {
        if deferred.is_empty() {
            self.until_done("ack", || self.transport.ack(d)).await
        } else {
            self.until_done("ack", || {
                self.transport.ack_and_reserve(d, &deferred.writes, None)
            })
            .await
            .map(drop)
        }
    }

    /// Runs a transport operation until it succeeds: a broker outage is not the message's
    /// fault and settling must not be given up. Only the end of the shutdown grace period
    /// (the message then stays in flight, for recovery) or an error no retry can fix
    /// stops it.
    async fn until_done<T, F, Fut>(
        &self,
        what: &'static str,
        mut op: F,
    ) -> Result<T, TransportError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TransportError>>,
    {
        let mut delay = self.config.backoff_min;
        loop {
            let err = tokio::select! {
                biased;
                () = self.wait_hard_stop() => {
                    return Err(TransportError::backend("the shutdown grace period ended"));
                }
                r = op() => match r {
                    Ok(v) => return Ok(v),
                    Err(e) => e,
                },
            };
            if matches!(
                err,
                TransportError::Unsupported(_) | TransportError::BodyNotUtf8
            ) {
                return Err(err);
            }
            tracing::warn!(error = %err, op = what, retry_in_ms = delay.as_millis() as u64, "broker failed while settling; retrying");
            tokio::select! {
                biased;
                () = self.wait_hard_stop() => {
                    return Err(err);
                }
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(self.config.backoff_max);
        }
    }
}

/// A handler's future with panics turned into a failure.
struct CatchUnwind(BoxFuture<'static, HandlerOutput>);

impl Future for CatchUnwind {
    type Output = HandlerOutput;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<HandlerOutput> {
        let fut = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(poll) => poll,
            Err(payload) => Poll::Ready(Err(panic_error(payload.as_ref()))),
        }
    }
}

fn panic_error(payload: &(dyn std::any::Any + Send)) -> HandlerError {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned());
    HandlerError::with_type_name(format!("handler panicked: {msg}").into(), "panic")
}

/// The one place that calls a handler.
pub(crate) async fn call(handler: &dyn Handler, env: Envelope) -> HandlerOutput {
    match std::panic::catch_unwind(AssertUnwindSafe(|| handler.call(env))) {
        Ok(fut) => CatchUnwind(fut).await,
        Err(payload) => Err(panic_error(payload.as_ref())),
    }
}

/// How a handler call ended.
enum Called {
    Output(HandlerOutput),
    /// `seen` / `claim` did not answer within the store timeout.
    StoreTimeout(Duration),
    /// `remember` / `complete` did not answer within the store timeout (the handler had
    /// succeeded).
    RememberTimeout,
    HandlerTimeout(Duration),
}

/// Calls the handler with a probe the guard reports to, cutting store calls at the store
/// timeout and the handler at the handler timeout.
async fn run_handler(
    ctx: &Ctx,
    handler: &dyn Handler,
    env: Envelope,
    probe: &Arc<StoreProbe>,
) -> Called {
    let started = Instant::now();
    let store_timeout = ctx.config.store_timeout;
    let handler_timeout = ctx.config.handler_timeout;
    let fut = inflight::with_probe(Arc::clone(probe), call(handler, env));
    tokio::pin!(fut);
    loop {
        let (phase, since, own) = probe.phase();
        let wake = match phase {
            Phase::StoreBefore | Phase::StoreAfter => Some(since + store_timeout),
            Phase::Waiting => None,
            Phase::Idle => handler_timeout.map(|t| own.unwrap_or(started).max(started) + t),
        };
        if let Some(at) = wake
            && at <= Instant::now()
        {
            return match phase {
                Phase::StoreBefore => Called::StoreTimeout(store_timeout),
                Phase::StoreAfter => Called::RememberTimeout,
                _ => Called::HandlerTimeout(handler_timeout.unwrap_or_default()),
            };
        }
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            out = &mut fut => return Called::Output(out),
            () = probe.changed() => {}
            () = sleep => {}
        }
    }
}

/// The outcome of a delivery before settling.
struct Verdict {
    happened: Happened,
    error: Option<String>,
    exception: Option<String>,
}

impl Verdict {
    fn ok(happened: Happened) -> Self {
        Verdict {
            happened,
            error: None,
            exception: None,
        }
    }
}

fn classify(called: Called, probe: &StoreProbe) -> Verdict {
    match called {
        Called::Output(Ok(Some(Outcome::Skipped))) => Verdict::ok(Happened::Skipped),
        Called::Output(Ok(_)) => Verdict::ok(Happened::Succeeded),
        Called::RememberTimeout => {
            tracing::warn!(
                "the handler succeeded but remembering its id did not answer in time; acking (a redelivery may run it again)"
            );
            Verdict::ok(Happened::Succeeded)
        }
        Called::StoreTimeout(t) => {
            let e = StoreTimeout(t);
            Verdict {
                happened: Happened::StoreUnavailable,
                error: Some(e.to_string()),
                exception: Some(std::any::type_name::<StoreTimeout>().to_owned()),
            }
        }
        Called::HandlerTimeout(t) => Verdict {
            happened: Happened::Failed { permanent: false },
            error: Some(HandlerTimeout(t).to_string()),
            exception: Some(std::any::type_name::<HandlerTimeout>().to_owned()),
        },
        Called::Output(Err(e)) => {
            let inner = e.error();
            let happened = if crate::store_error::find_unstorable_id(inner).is_some() {
                // A dedupe key no store can hold (a custom `key =` over the length limit
                // or with a NUL): the message is bad, not the store.
                Happened::Poison
            } else if probe.in_flight() || in_chain::<InFlight>(inner) {
                Happened::InFlightElsewhere
            } else if probe.store_failed()
                || in_chain::<StoreUnavailable>(inner)
                || crate::store_error::is_unavailable(inner)
            {
                Happened::StoreUnavailable
            } else {
                // A payload that does not deserialize into the handler's `Json<T>` fails
                // the same way on every delivery: dead-lettered at once, not retried.
                Happened::Failed {
                    permanent: in_chain::<Permanent>(inner)
                        || in_chain::<crate::extract::PayloadError>(inner)
                        || in_chain::<crate::fingerprint::PayloadMismatch>(inner),
                }
            };
            Verdict {
                happened,
                error: Some(observe::error_chain(inner)),
                exception: Some(e.type_name().to_owned()),
            }
        }
    }
}

fn release_count(d: &Delivery) -> u32 {
    d.headers()
        .and_then(|h| h.get(RELEASES_HEADER))
        .and_then(Value::as_u64)
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

fn jitter_sample() -> f64 {
    // A fresh random 53-bit fraction (uuid v4 draws from the OS generator).
    let bits = uuid::Uuid::new_v4().as_u128() as u64 >> 11;
    bits as f64 / (1u64 << 53) as f64
}

/// A delivery whose ack (and the store writes its guards handed over) waits to be sent
/// with the worker's next reserve. Its report is final once that is done.
pub(crate) struct PendingAck {
    pub delivery: Delivery,
    pub deferred: Deferred,
    pub report: Report,
}

/// How [`process`] left a delivery.
pub(crate) enum Processed {
    /// Settled.
    Done(Report),
    /// To be acked with the next reserve (only when `defer_ack` was asked for).
    AckPending(PendingAck),
}

impl From<Report> for Processed {
    fn from(r: Report) -> Self {
        Processed::Done(r)
    }
}

/// Processes one delivery, from checks to settled (or, with `defer_ack`, to an ack
/// that waits for the worker's next reserve).
pub(crate) async fn process(ctx: &Ctx, delivery: Delivery, defer_ack: bool) -> Processed {
    let size = delivery.body().len();
    if size > ctx.config.max_body_size {
        let error = format!(
            "the body is {size} bytes, over the limit of {} bytes; not decoded",
            ctx.config.max_body_size
        );
        tracing::warn!(bytes = size, "poison message: body over the size limit");
        let body = || dead_letter::poison_oversized(delivery.body(), &error, delivery.queue());
        return settle_poison(ctx, &delivery, None, &body, error.clone())
            .await
            .into();
    }
    let mut envelope = match Envelope::decode(delivery.body()) {
        Ok(env) => env,
        Err(error) => {
            tracing::warn!(%error, bytes = size, "poison message");
            let body = || dead_letter::poison_body(delivery.body(), &error, delivery.queue());
            return settle_poison(ctx, &delivery, None, &body, error.to_string())
                .await
                .into();
        }
    };
    // The binding's rule: the body's count, reconciled with the broker's own counter.
    envelope.attempts = ctx.transport.attempts(envelope.attempts, &delivery);
    observe::record_envelope(&envelope);

    if let Err(e) = crate::key::id_is_storable(&envelope.meta.id) {
        let error = e.to_string();
        tracing::warn!(%error, "poison message: unusable meta.id");
        let attempts = u64::from(envelope.attempts);
        let body = || {
            let block = Block {
                reason: DeadLetterReason::Poison.as_str(),
                error: Some(error.clone()),
                exception: Some(std::any::type_name::<crate::key::UnstorableId>()),
                attempts,
            };
            dead_letter::dead_lettered(delivery.body(), delivery.queue(), false, &block)
                .unwrap_or_default()
        };
        let env = ctx.observer.is_some().then_some(envelope);
        return settle_poison(ctx, &delivery, env, &body, error.clone())
            .await
            .into();
    }

    let attempts = envelope.attempts;
    let Some(handler) = ctx.router.get(envelope.urn()).cloned() else {
        let error = UnknownUrn(envelope.job.clone()).to_string();
        tracing::warn!(strategy = ?ctx.config.unknown_urn, "{error}");
        let verdict = Verdict {
            happened: Happened::UnknownUrn,
            error: Some(error),
            exception: Some(std::any::type_name::<UnknownUrn>().to_owned()),
        };
        let env = ctx.observer.is_some().then_some(envelope);
        let mut report = settle(ctx, &delivery, env, attempts, verdict, None).await;
        report.unknown_urn = true;
        return report.into();
    };
    let id = envelope.meta.id.clone();
    let keep = ctx.observer.is_some().then(|| envelope.clone());
    let probe = Arc::new(StoreProbe::with_pipeline(ctx.pipeline_server.clone()));
    let urn = handler.urn().to_owned();
    let started = Instant::now();
    let called = run_handler(ctx, handler.as_ref(), envelope, &probe).await;
    let duration = started.elapsed();
    inflight::take_sync_marks(&id, &probe);
    let verdict = classify(called, &probe);
    let deferred = probe.take_deferred();
    let (mut report, pending) = settle_full(
        ctx, &delivery, keep, attempts, verdict, None, deferred, defer_ack,
    )
    .await;
    report.urn = Some(urn);
    report.duration = Some(duration);
    match pending {
        Some(deferred) => Processed::AckPending(PendingAck {
            delivery,
            deferred,
            report,
        }),
        None => Processed::Done(report),
    }
}

/// Dead-letters a message recovered from dead consumers too many times.
pub(crate) async fn settle_exhausted(ctx: &Ctx, delivery: Delivery, max_recoveries: u32) -> Report {
    let error = format!(
        "recovered {max_recoveries} times from consumers that died handling it; not retried again"
    );
    tracing::error!(%error, "dead-lettering a message that keeps killing consumers");
    let verdict = Verdict {
        happened: Happened::Exhausted,
        error: Some(error),
        exception: Some("babelqueue_core::runtime::Recovered".to_owned()),
    };
    match Envelope::decode(delivery.body()) {
        Ok(env) => {
            let attempts = env.attempts;
            let env = ctx.observer.is_some().then_some(env);
            settle(ctx, &delivery, env, attempts, verdict, None).await
        }
        Err(e) => {
            let body = || dead_letter::poison_body(delivery.body(), &e, delivery.queue());
            settle_poison(ctx, &delivery, None, &body, e.to_string()).await
        }
    }
}

async fn settle_poison(
    ctx: &Ctx,
    delivery: &Delivery,
    env: Option<Envelope>,
    body: &(dyn Fn() -> Vec<u8> + Send + Sync),
    error: String,
) -> Report {
    let verdict = Verdict {
        happened: Happened::Poison,
        error: Some(error),
        exception: None,
    };
    settle(ctx, delivery, env, 0, verdict, Some(body)).await
}

/// [`settle_full`] with no handed-over writes and the ack sent at once.
async fn settle(
    ctx: &Ctx,
    d: &Delivery,
    envelope: Option<Envelope>,
    attempts: u32,
    v: Verdict,
    poison: Option<&(dyn Fn() -> Vec<u8> + Send + Sync)>,
) -> Report {
    settle_full(
        ctx,
        d,
        envelope,
        attempts,
        v,
        poison,
        Deferred::default(),
        false,
    )
    .await
    .0
}

/// The executor: decides, then carries the action out. `poison` builds the dead-letter
/// body of a poison message. `deferred`: store writes the guards handed over (sent
/// before, or with, the ack). With `defer_ack`, an ack is not sent but returned (with the
/// writes) for the worker to send with its next reserve.
#[allow(clippy::too_many_arguments)]
async fn settle_full(
    ctx: &Ctx,
    d: &Delivery,
    envelope: Option<Envelope>,
    attempts: u32,
    v: Verdict,
    poison: Option<&(dyn Fn() -> Vec<u8> + Send + Sync)>,
    mut deferred: Deferred,
    defer_ack: bool,
) -> (Report, Option<Deferred>) {
    let pause = match v.happened {
        Happened::StoreUnavailable => ctx
            .store
            .failed(ctx.config.store_backoff_min, ctx.config.store_backoff_max),
        Happened::Succeeded | Happened::Skipped | Happened::Failed { .. } => {
            ctx.store.ok();
            Duration::ZERO
        }
        _ => Duration::ZERO,
    };
    let releases = release_count(d);
    let sample = if matches!(v.happened, Happened::Failed { .. } | Happened::UnknownUrn) {
        jitter_sample()
    } else {
        0.0
    };
    let action = decide(v.happened, attempts, releases, pause, sample, &ctx.policy);
    let failed = matches!(v.happened, Happened::Failed { .. })
        || (v.happened == Happened::UnknownUrn
            && ctx.config.unknown_urn == UnknownUrnStrategy::Fail);
    if !deferred.is_empty() && action != Action::Ack {
        // A guard inside the handler succeeded (its id must be remembered) but the
        // delivery is not acked: the writes go on their own, first.
        if let Err(error) = ctx
            .until_done("remember", || ctx.transport.apply_writes(&deferred.writes))
            .await
        {
            tracing::warn!(%error, "remembering a guarded id failed; a redelivery may run it again");
        }
        deferred = Deferred::default();
    }
    let mut pending = None;
    let result: Result<Disposition, TransportError> = match action {
        Action::Ack => {
            let acked = if defer_ack {
                pending = Some(std::mem::take(&mut deferred));
                Ok(())
            } else {
                ctx.ack_with(d, &deferred).await
            };
            acked.map(|()| {
                if v.happened == Happened::Skipped {
                    tracing::info!("duplicate skipped by the idempotency guard; acked");
                    Disposition::Skipped
                } else {
                    tracing::debug!("acked");
                    Disposition::Succeeded
                }
            })
        }
        Action::Drop => {
            if v.happened != Happened::UnknownUrn {
                tracing::error!(error = ?v.error, "dead-lettering is off: message dropped");
            }
            ctx.until_done("ack", || ctx.transport.ack(d))
                .await
                .map(|()| Disposition::Dropped)
        }
        Action::Retry { attempts, delay } => {
            match dead_letter::with_attempts(d.body(), u64::from(attempts)) {
                Some(body) => {
                    tracing::warn!(error = ?v.error, exception = ?v.exception, attempts, retry_in_ms = delay.as_millis() as u64, "handler failed; retrying");
                    let republish = Republish::with_body(body);
                    ctx.until_done("requeue", || {
                        ctx.transport.requeue(d, republish.clone(), delay)
                    })
                    .await
                    .map(|()| Disposition::Retried { attempts })
                }
                None => Err(TransportError::backend("the body is not a JSON object")),
            }
        }
        Action::PutBack { why, delay } => {
            let republish = match why {
                PutBack::Release => {
                    let mut h = d.headers().cloned().unwrap_or_else(Headers::new);
                    h.insert(
                        RELEASES_HEADER.to_owned(),
                        Value::from(releases.saturating_add(1)),
                    );
                    Republish::with_headers(h)
                }
                PutBack::InFlight | PutBack::StoreDown => Republish::unchanged(),
            };
            {
                {
                    match why {
                        PutBack::InFlight => {
                            tracing::info!(error = ?v.error, delay_ms = delay.as_millis() as u64, "in flight on another worker; deferred")
                        }
                        PutBack::StoreDown => {
                            tracing::warn!(error = ?v.error, delay_ms = delay.as_millis() as u64, "the dedupe store is unavailable; put back without counting an attempt")
                        }
                        PutBack::Release => {
                            tracing::info!(releases = releases + 1, "unknown URN released")
                        }
                    }
                    ctx.until_done("requeue", || {
                        ctx.transport.requeue(d, republish.clone(), delay)
                    })
                    .await
                    .map(|()| match why {
                        PutBack::InFlight => Disposition::Deferred,
                        PutBack::StoreDown => Disposition::Requeued,
                        PutBack::Release => Disposition::Released,
                    })
                }
            }
        }
        Action::DeadLetter {
            reason,
            attempts,
            set_attempts,
        } => {
            // Built per attempt and moved into the publish: a large body is never held
            // twice (a broker outage rebuilds it for the next try).
            let build = || -> Result<Vec<u8>, TransportError> {
                let body = match poison {
                    Some(f) => Some(f()),
                    None => {
                        let block = Block {
                            reason: reason.as_str(),
                            error: v.error.clone(),
                            exception: v.exception.as_deref(),
                            attempts: u64::from(attempts),
                        };
                        dead_letter::dead_lettered(d.body(), d.queue(), set_attempts, &block)
                    }
                };
                body.filter(|b| !b.is_empty())
                    .ok_or_else(|| TransportError::backend("the body is not a JSON object"))
            };
            // With headers, the transport's own `publish_with_headers` (a frame on the
            // list transports, native headers elsewhere); without, the body is moved.
            let headers = d.headers().filter(|h| !h.is_empty());
            match build() {
                Ok(first) => {
                    let mut first = Some(first);
                    let published = ctx
                        .until_done("dead-letter", || {
                            let body = first.take().map_or_else(build, Ok);
                            async move {
                                let body = body?;
                                match headers {
                                    Some(h) => {
                                        ctx.transport
                                            .publish_with_headers(&ctx.dlq, &body, Some(h))
                                            .await
                                    }
                                    None => ctx.transport.publish_raw(&ctx.dlq, body).await,
                                }
                            }
                        })
                        .await;
                    match published {
                        Ok(()) => {
                            tracing::error!(dead_letter_queue = %ctx.dlq, reason = reason.as_str(), error = ?v.error, "dead-lettered");
                            ctx.until_done("ack", || ctx.transport.ack(d))
                                .await
                                .map(|()| Disposition::DeadLettered { reason })
                        }
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        }
    };
    let (disposition, acked, error) = match result {
        Ok(disp) => (disp, true, v.error),
        Err(e) => {
            tracing::error!(error = %e, "the message could not be settled; it stays in flight for recovery");
            (Disposition::Stranded, false, Some(e.to_string()))
        }
    };
    let report = Report {
        queue: d.queue().to_owned(),
        envelope,
        disposition,
        acked,
        failed,
        unknown_urn: false,
        error,
        urn: None,
        duration: None,
        headers: d.headers().cloned(),
    };
    (report, pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum MyError {
        #[error("charge failed")]
        Wrapped(#[source] InFlight),
        #[error("declined")]
        Declined(#[source] Permanent),
        #[error("boom")]
        Boom,
        #[error("store")]
        Wrapped2(#[source] crate::store_error::StoreUnavailable),
    }

    fn verdict(e: HandlerError) -> Happened {
        classify(Called::Output(Err(e)), &StoreProbe::default()).happened
    }

    #[test]
    fn error_kinds_are_found_by_type_in_the_source_chain() {
        let busy = || InFlight { id: "x".into() };
        assert_eq!(
            verdict(HandlerError::new(busy())),
            Happened::InFlightElsewhere
        );
        assert_eq!(
            verdict(HandlerError::new(MyError::Wrapped(busy()))),
            Happened::InFlightElsewhere
        );
        assert_eq!(
            verdict(HandlerError::new(MyError::Declined(Permanent::new("no")))),
            Happened::Failed { permanent: true }
        );
        assert_eq!(
            verdict(HandlerError::new(Permanent::new(MyError::Boom))),
            Happened::Failed { permanent: true }
        );
        assert_eq!(
            verdict(HandlerError::new(StoreUnavailable::new(MyError::Boom))),
            Happened::StoreUnavailable
        );
        assert_eq!(
            verdict(HandlerError::new(MyError::Boom)),
            Happened::Failed { permanent: false }
        );
        // A store's own typed unavailability is found too, and an id no store can hold
        // is the message's fault.
        let down = crate::store_error::StoreUnavailable::new(
            "redis",
            "seen",
            crate::store_error::UnavailableKind::Timeout,
        );
        assert_eq!(
            verdict(HandlerError::new(MyError::Wrapped2(down))),
            Happened::StoreUnavailable
        );
        let unstorable = crate::key::id_is_storable("a\0b").expect_err("NUL is refused");
        assert_eq!(verdict(HandlerError::new(unstorable)), Happened::Poison);
        // A payload that does not deserialize is permanent.
        use crate::extract::{FromEnvelope, Json, StateMap};
        let env = crate::Envelope::new("urn:x", serde_json::json!({"amount": "not a number"}))
            .expect("an envelope");
        let payload = Json::<u32>::from_envelope(&env, &StateMap::default())
            .expect_err("a string is not a u32");
        assert_eq!(
            verdict(HandlerError::new(payload)),
            Happened::Failed { permanent: true }
        );
        // Text that merely looks like a marker is not one.
        let lookalike = std::io::Error::other(busy().to_string());
        assert_eq!(
            verdict(HandlerError::new(lookalike)),
            Happened::Failed { permanent: false }
        );
    }

    #[tokio::test]
    async fn panics_become_failures() {
        struct Panicky;
        impl Handler for Panicky {
            fn urn(&self) -> &str {
                "urn:x"
            }
            fn call(&self, _: Envelope) -> BoxFuture<'static, HandlerOutput> {
                Box::pin(async { panic!("kaboom") })
            }
        }
        let env = Envelope::new("urn:x", serde_json::json!({})).unwrap();
        let err = call(&Panicky, env).await.unwrap_err();
        assert_eq!(err.type_name(), "panic");
        assert!(err.to_string().contains("kaboom"));
    }

    #[test]
    fn store_backoff_grows_caps_and_resets() {
        let h = StoreHealth::default();
        let ms = Duration::from_millis;
        assert_eq!(h.failed(ms(100), ms(1000)), ms(100));
        assert_eq!(h.failed(ms(100), ms(1000)), ms(200));
        assert_eq!(h.failed(ms(100), ms(1000)), ms(400));
        assert_eq!(h.failed(ms(100), ms(1000)), ms(800));
        assert_eq!(h.failed(ms(100), ms(1000)), ms(1000));
        for _ in 0..100 {
            h.failed(ms(100), ms(1000));
        }
        assert_eq!(h.failed(ms(100), ms(1000)), ms(1000));
        assert!(h.paused_until().is_some());
        h.ok();
        assert!(h.paused_until().is_none());
        assert_eq!(h.failed(ms(100), ms(1000)), ms(100));
    }
}
