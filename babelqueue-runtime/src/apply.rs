//! The executor: a [`Verdict`] is decided into one [`Action`] by the pure settlement table
//! ([`decide`]), then carried out against the transport by one short function per action.
//! A delivery goes through it once, forward: decide → (owed writes) → apply → report.

use std::time::Duration;

use serde_json::Value;

use super::ctx::{Ctx, RELEASES_HEADER};
use super::dead_letter::{self, Block};
use super::report::{Disposition, Report};
use super::settle::{Action, Happened, PutBack, UnknownUrnStrategy, decide};
use super::transport::{Delivery, Headers, Republish, TransportError};
use crate::probe::Deferred;
use babelqueue_core::envelope::{DeadLetterReason, Envelope};

/// The outcome of a delivery before settling.
pub(crate) struct Verdict {
    pub happened: Happened,
    pub error: Option<String>,
    pub exception: Option<String>,
}

impl Verdict {
    pub(crate) fn ok(happened: Happened) -> Self {
        Verdict {
            happened,
            error: None,
            exception: None,
        }
    }
}

/// Builds the dead-letter body of a poison message (called once per publish attempt, so a
/// large body is never held twice).
pub(crate) type PoisonBody<'a> = &'a (dyn Fn() -> Vec<u8> + Send + Sync);

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

/// The dedupe store's answer feeds its health: a failure pauses reserving (and is the
/// put-back delay), an answer ends the pause.
fn store_pause(ctx: &Ctx, happened: Happened) -> Duration {
    match happened {
        Happened::StoreUnavailable => {
            ctx.readiness.store(&ctx.config.queue, true);
            ctx.store
                .failed(ctx.config.store_backoff_min, ctx.config.store_backoff_max)
        }
        Happened::Succeeded | Happened::Skipped | Happened::Failed { .. } => {
            ctx.store.ok();
            ctx.readiness.store(&ctx.config.queue, false);
            Duration::ZERO
        }
        _ => Duration::ZERO,
    }
}

/// Decides the action for a verdict (the pure table of [`decide`]).
fn action_for(ctx: &Ctx, d: &Delivery, attempts: u32, happened: Happened) -> Action {
    let pause = store_pause(ctx, happened);
    let sample = if matches!(happened, Happened::Failed { .. } | Happened::UnknownUrn) {
        jitter_sample()
    } else {
        0.0
    };
    decide(
        happened,
        attempts,
        release_count(d),
        pause,
        sample,
        &ctx.policy,
    )
}

/// Decides, then carries the action out. `poison` builds the dead-letter body of a poison
/// message. `deferred`: store writes the guards handed over (sent before, or with, the
/// ack). With `defer_ack`, an ack is not sent but returned (with the writes) for the
/// worker to send with its next reserve.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn settle(
    ctx: &Ctx,
    d: &Delivery,
    envelope: Option<Envelope>,
    attempts: u32,
    v: Verdict,
    poison: Option<PoisonBody<'_>>,
    deferred: Deferred,
    defer_ack: bool,
) -> (Report, Option<Deferred>) {
    let action = action_for(ctx, d, attempts, v.happened);
    let deferred = if action == Action::Ack {
        deferred
    } else {
        send_owed_writes(ctx, deferred).await
    };
    let mut pending = None;
    let result = match action {
        Action::Ack if defer_ack => {
            pending = Some(deferred);
            Ok(acked(v.happened))
        }
        Action::Ack => ctx.ack_with(d, &deferred).await.map(|()| acked(v.happened)),
        Action::Drop => drop_message(ctx, d, &v).await,
        Action::Retry { attempts, delay } => retry(ctx, d, &v, attempts, delay).await,
        Action::PutBack { why, delay } => put_back(ctx, d, &v, why, delay).await,
        Action::DeadLetter {
            reason,
            attempts,
            set_attempts,
        } => dead_letter(ctx, d, &v, poison, reason, attempts, set_attempts).await,
    };
    (report(ctx, d, envelope, v, result), pending)
}

/// A guard inside the handler succeeded (its id must be remembered) but the delivery is
/// not acked: the writes go on their own, first.
async fn send_owed_writes(ctx: &Ctx, deferred: Deferred) -> Deferred {
    if !deferred.is_empty()
        && let Err(error) = ctx
            .until_done("remember", || ctx.transport.apply_writes(&deferred.writes))
            .await
    {
        // Retried until done: only the end of the shutdown grace period stops it (the
        // settlement that follows stops there too and leaves the message unacked).
        tracing::warn!(%error, "remembering a guarded id was cut by the shutdown; the message is left for recovery");
    }
    Deferred::default()
}

fn acked(happened: Happened) -> Disposition {
    if happened == Happened::Skipped {
        tracing::info!("duplicate skipped by the idempotency guard; acked");
        Disposition::Skipped
    } else {
        tracing::debug!("acked");
        Disposition::Succeeded
    }
}

async fn drop_message(ctx: &Ctx, d: &Delivery, v: &Verdict) -> Result<Disposition, TransportError> {
    if v.happened != Happened::UnknownUrn {
        tracing::error!(error = ?v.error, "dead-lettering is off: message dropped");
    }
    ctx.until_done("ack", || ctx.transport.ack(d))
        .await
        .map(|()| Disposition::Dropped)
}

async fn retry(
    ctx: &Ctx,
    d: &Delivery,
    v: &Verdict,
    attempts: u32,
    delay: Duration,
) -> Result<Disposition, TransportError> {
    let Some(body) = dead_letter::with_attempts(d.body(), u64::from(attempts)) else {
        return Err(TransportError::backend("the body is not a JSON object"));
    };
    tracing::warn!(error = ?v.error, exception = ?v.exception, attempts, retry_in_ms = delay.as_millis() as u64, "handler failed; retrying");
    let republish = Republish::with_body(body);
    ctx.until_done("requeue", || {
        ctx.transport.requeue(d, republish.clone(), delay)
    })
    .await
    .map(|()| Disposition::Retried { attempts })
}

async fn put_back(
    ctx: &Ctx,
    d: &Delivery,
    v: &Verdict,
    why: PutBack,
    delay: Duration,
) -> Result<Disposition, TransportError> {
    let delay_ms = delay.as_millis() as u64;
    let republish = match why {
        PutBack::InFlight => {
            tracing::info!(error = ?v.error, delay_ms, "in flight on another worker; deferred");
            Republish::unchanged()
        }
        PutBack::StoreDown => {
            tracing::warn!(error = ?v.error, delay_ms, "the dedupe store is unavailable; put back without counting an attempt");
            Republish::unchanged()
        }
        PutBack::Release => {
            let releases = release_count(d).saturating_add(1);
            tracing::info!(releases, "unknown URN released");
            let mut h = d.headers().cloned().unwrap_or_else(Headers::new);
            h.insert(RELEASES_HEADER.to_owned(), Value::from(releases));
            Republish::with_headers(h)
        }
    };
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

/// Publishes the dead letter (the body with the family's block, or a poison record) to
/// the dead-letter queue, with the delivery's out-of-band headers, then acks.
async fn dead_letter(
    ctx: &Ctx,
    d: &Delivery,
    v: &Verdict,
    poison: Option<PoisonBody<'_>>,
    reason: DeadLetterReason,
    attempts: u32,
    set_attempts: bool,
) -> Result<Disposition, TransportError> {
    // Built per attempt and moved into the publish: a large body is never held twice (a
    // broker outage rebuilds it for the next try).
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
    // With headers, the transport's own `publish_with_headers` (a frame on the list
    // transports, native headers elsewhere); without, the body is moved.
    let headers = d.headers().filter(|h| !h.is_empty());
    let mut first = Some(build()?);
    ctx.until_done("dead-letter", || {
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
    .await?;
    tracing::error!(dead_letter_queue = %ctx.dlq, reason = reason.as_str(), error = ?v.error, "dead-lettered");
    ctx.until_done("ack", || ctx.transport.ack(d))
        .await
        .map(|()| Disposition::DeadLettered { reason })
}

fn report(
    ctx: &Ctx,
    d: &Delivery,
    envelope: Option<Envelope>,
    v: Verdict,
    result: Result<Disposition, TransportError>,
) -> Report {
    let failed = matches!(v.happened, Happened::Failed { .. })
        || (v.happened == Happened::UnknownUrn
            && ctx.config.unknown_urn == UnknownUrnStrategy::Fail);
    let (disposition, acked, error) = match result {
        Ok(disp) => (disp, true, v.error),
        Err(e) => {
            tracing::error!(error = %e, "the message could not be settled; it stays in flight for recovery");
            (Disposition::Stranded, false, Some(e.to_string()))
        }
    };
    Report {
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
    }
}
