//! One delivery, from reserved to settled: the checks, the handler call (exactly one
//! function calls handlers: [`call`]), the classification into a
//! [`Happened`](super::settle::Happened), and the executor that carries the decided
//! [`Action`] out against the transport.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use super::apply::{self, Verdict};
use super::ctx::Ctx;
pub use super::ctx::RELEASES_HEADER;
use super::dead_letter::{self, Block};
use super::errors::{HandlerTimeout, Permanent, StoreTimeout, StoreUnavailable, in_chain};
use super::observe;
use super::report::Report;
use super::settle::Happened;
use super::transport::{Delivery, Transport};
use crate::handler::{BoxFuture, Handler, HandlerError, HandlerOutput, UnknownUrn};
use crate::probe::{Deferred, StoreProbe};
use babelqueue_core::envelope::{DeadLetterReason, Envelope};
use babelqueue_core::guard::Outcome;
use babelqueue_core::hooks::{self, OwedRetry, Phase};
use babelqueue_core::lease::InFlight;

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
    HandlerTimeout(Duration),
}

/// Calls the handler with a probe the guard reports to, cutting store calls at the store
/// timeout and the handler at the handler timeout.
async fn run_handler(
    ctx: &Ctx,
    handler: &dyn Handler,
    env: Envelope,
    probe: &Arc<StoreProbe>,
    replay: bool,
) -> Called {
    // However this call ends (returned, cut by a timeout, or dropped at the end of the
    // shutdown grace period), a sync guard still retrying its owed write stops.
    struct Abandon<'a>(&'a StoreProbe);
    impl Drop for Abandon<'_> {
        fn drop(&mut self) {
            self.0.abandon();
        }
    }
    let _abandon = Abandon(probe);
    let started = Instant::now();
    let store_timeout = ctx.config.store_timeout;
    let handler_timeout = ctx.config.handler_timeout;
    // The delivery's `bq-replay-bypass` header, visible to the handler as `is_replay()`.
    let fut = crate::replay::scope(
        replay,
        hooks::scope(
            Arc::clone(probe) as Arc<dyn hooks::GuardHooks>,
            call(handler, env),
        ),
    );
    tokio::pin!(fut);
    loop {
        let (phase, since, own) = probe.phase();
        let wake = match phase {
            Phase::StoreBefore => Some(since + store_timeout),
            // The guard retries the write it owes itself, each try cut at the store
            // timeout, until the store answers (the message stays unacked meanwhile).
            Phase::StoreAfter | Phase::Waiting => None,
            Phase::Idle => handler_timeout.map(|t| own.unwrap_or(started).max(started) + t),
        };
        if let Some(at) = wake
            && at <= Instant::now()
        {
            return match phase {
                Phase::StoreBefore => Called::StoreTimeout(store_timeout),
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

fn classify(called: Called, probe: &StoreProbe) -> Verdict {
    match called {
        Called::Output(Ok(Some(Outcome::Skipped))) => Verdict::ok(Happened::Skipped),
        Called::Output(Ok(_)) => Verdict::ok(Happened::Succeeded),
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
            let happened = if babelqueue_core::store_error::find_unstorable_id(inner).is_some() {
                // A dedupe key no store can hold (a custom `key =` over the length limit
                // or with a NUL): the message is bad, not the store.
                Happened::Poison
            } else if probe.in_flight() || in_chain::<InFlight>(inner) {
                Happened::InFlightElsewhere
            } else if probe.store_failed()
                || in_chain::<StoreUnavailable>(inner)
                || babelqueue_core::store_error::is_unavailable(inner)
            {
                Happened::StoreUnavailable
            } else {
                // A payload that does not deserialize into the handler's `Json<T>` fails
                // the same way on every delivery: dead-lettered at once, not retried.
                Happened::Failed {
                    permanent: in_chain::<Permanent>(inner)
                        || in_chain::<crate::extract::PayloadError>(inner)
                        || in_chain::<babelqueue_core::fingerprint::PayloadMismatch>(inner),
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
        return Box::pin(settle_poison(ctx, &delivery, None, &body, error.clone()))
            .await
            .into();
    }
    let mut envelope = match Envelope::decode(delivery.body()) {
        Ok(env) => env,
        Err(error) => {
            tracing::warn!(%error, bytes = size, "poison message");
            let body = || dead_letter::poison_body(delivery.body(), &error, delivery.queue());
            return Box::pin(settle_poison(
                ctx,
                &delivery,
                None,
                &body,
                error.to_string(),
            ))
            .await
            .into();
        }
    };
    // The binding's rule: the body's count, reconciled with the broker's own counter.
    envelope.attempts = ctx.transport.attempts(envelope.attempts, &delivery);
    observe::record_envelope(&envelope);

    if let Err(e) = babelqueue_core::key::id_is_storable(&envelope.meta.id) {
        let error = e.to_string();
        tracing::warn!(%error, "poison message: unusable meta.id");
        let attempts = u64::from(envelope.attempts);
        let body = || {
            let block = Block {
                reason: DeadLetterReason::Poison.as_str(),
                error: Some(error.clone()),
                exception: Some(std::any::type_name::<babelqueue_core::key::UnstorableId>()),
                attempts,
            };
            dead_letter::dead_lettered(delivery.body(), delivery.queue(), false, &block)
                .unwrap_or_default()
        };
        let env = ctx.observer.is_some().then_some(envelope);
        return Box::pin(settle_poison(ctx, &delivery, env, &body, error.clone()))
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
        let mut report = Box::pin(settle(ctx, &delivery, env, attempts, verdict, None)).await;
        report.unknown_urn = true;
        return report.into();
    };
    #[cfg(feature = "schema")]
    if let Some(verdict) = check_schema(ctx, &envelope) {
        let env = ctx.observer.is_some().then_some(envelope);
        return Box::pin(settle(ctx, &delivery, env, attempts, verdict, None))
            .await
            .into();
    }
    let id = envelope.meta.id.clone();
    let keep = ctx.observer.is_some().then(|| envelope.clone());
    let probe = Arc::new(
        StoreProbe::with_pipeline(ctx.pipeline_server.clone())
            .owed_retry(OwedRetry {
                timeout: ctx.config.store_timeout,
                min: ctx.config.store_backoff_min,
                max: ctx.config.store_backoff_max,
            })
            .on_store_down(ctx.store_down_hook()),
    );
    let urn = handler.urn().to_owned();
    let started = Instant::now();
    let replay = crate::replay::headers_are_replay(delivery.headers());
    let called = run_handler(ctx, handler.as_ref(), envelope, &probe, replay).await;
    let duration = started.elapsed();
    hooks::take_sync_marks(&id, &*probe);
    let verdict = classify(called, &probe);
    let deferred = probe.take_deferred();
    let (mut report, pending) = apply::settle(
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

/// The consumer-side safety net of payload schemas (`App::validate_on_consume`): a payload
/// that breaks its URN's schema fails permanently (dead-lettered at once as `failed`, the
/// violation in `dead_letter.error`: a retry cannot fix it); a schema that cannot be
/// loaded fails the delivery like a handler error (retried: a fixed configuration picks
/// it up). `None`: valid, or no schema check.
#[cfg(feature = "schema")]
fn check_schema(ctx: &Ctx, envelope: &Envelope) -> Option<Verdict> {
    use babelqueue_core::schema::SchemaError;
    let schemas = ctx.config.consume_schemas.as_ref()?;
    let error = schemas.check(envelope).err()?;
    let permanent = matches!(error, SchemaError::Violation(_));
    tracing::warn!(%error, "payload breaks its schema");
    Some(Verdict {
        happened: Happened::Failed { permanent },
        error: Some(error.to_string()),
        exception: Some(std::any::type_name::<SchemaError>().to_owned()),
    })
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
        exception: Some("babelqueue_runtime::Recovered".to_owned()),
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

/// [`apply::settle`] with no handed-over writes and the ack sent at once.
async fn settle(
    ctx: &Ctx,
    d: &Delivery,
    envelope: Option<Envelope>,
    attempts: u32,
    v: Verdict,
    poison: Option<&(dyn Fn() -> Vec<u8> + Send + Sync)>,
) -> Report {
    apply::settle(
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
        Wrapped2(#[source] babelqueue_core::store_error::StoreUnavailable),
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
        let down = babelqueue_core::store_error::StoreUnavailable::new(
            "redis",
            "seen",
            babelqueue_core::store_error::UnavailableKind::Timeout,
        );
        assert_eq!(
            verdict(HandlerError::new(MyError::Wrapped2(down))),
            Happened::StoreUnavailable
        );
        let unstorable = babelqueue_core::key::id_is_storable("a\0b").expect_err("NUL is refused");
        assert_eq!(verdict(HandlerError::new(unstorable)), Happened::Poison);
        // A payload that does not deserialize is permanent.
        use crate::extract::{FromEnvelope, Json, StateMap};
        let env =
            babelqueue_core::Envelope::new("urn:x", serde_json::json!({"amount": "not a number"}))
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
}
