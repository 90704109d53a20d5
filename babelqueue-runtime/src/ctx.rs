//! What every worker of one consume shares ([`Ctx`]): the transport, the router, the
//! settings, the dedupe store's health, the shutdown's hard stop, and retrying a broker
//! operation until it is done.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::{Config, Observer};
use super::settle::Policy;
use super::transport::{Delivery, Transport, TransportError};
use crate::handler::Router;
use crate::probe::Deferred;

/// The frame header carrying how many times a message was released (unknown URN under
/// [`UnknownUrnStrategy::Release`](super::UnknownUrnStrategy::Release)).
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
    pub(crate) fn failed(&self, min: Duration, max: Duration) -> Duration {
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
    pub(crate) fn ok(&self) {
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

/// What [`Readiness`](super::Readiness) reads: shared by an app's clones and runs.
#[derive(Debug, Default)]
pub(crate) struct ReadinessState {
    pub(crate) consuming: AtomicU32,
    pub(crate) store_down: AtomicBool,
}

impl ReadinessState {
    pub(crate) fn get(&self) -> super::report::Readiness {
        super::report::Readiness {
            consuming: self.consuming.load(Ordering::SeqCst) > 0,
            store_available: !self.store_down.load(Ordering::SeqCst),
        }
    }

    /// The store failed (`down`) or answered: logs and gauges a change.
    pub(crate) fn store(&self, queue: &str, down: bool) {
        if self.store_down.swap(down, Ordering::SeqCst) == down {
            return;
        }
        if down {
            tracing::warn!(
                queue,
                "the dedupe store is unavailable: this consumer is not ready (reserving pauses; messages stay on the queue until the store answers)"
            );
        } else {
            tracing::info!(queue, "the dedupe store answers again: ready");
        }
        super::metrics::ready(queue, self.get().is_ready());
    }

    /// A consume started (`true`) or ended.
    pub(crate) fn consuming(&self, queue: &str, on: bool) {
        if on {
            self.consuming.fetch_add(1, Ordering::SeqCst);
        } else {
            self.consuming.fetch_sub(1, Ordering::SeqCst);
        }
        super::metrics::ready(queue, self.get().is_ready());
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
    pub store: Arc<StoreHealth>,
    /// The shutdown grace period ended: stop retrying, leave messages in flight.
    pub hard_stop: AtomicBool,
    pub hard_notify: Notify,
    /// The transport's server, for stores whose `remember` can be sent with the ack.
    pub pipeline_server: Option<Arc<str>>,
    /// Acks wait for the worker's next reserve and go with it (one round trip).
    pub defer_acks: bool,
    /// The app's readiness (shared with its clones).
    pub readiness: Arc<ReadinessState>,
    /// What a guard's owed write tells (see [`store_down_hook`](Self::store_down_hook)),
    /// built once: every delivery's probe gets a clone.
    store_down: crate::probe::StoreDownHook,
}

impl Ctx {
    pub(crate) fn new(
        transport: Arc<dyn Transport>,
        router: Arc<Router>,
        dlq: String,
        config: Config,
        observer: Option<Observer>,
        readiness: Arc<ReadinessState>,
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
        let store: Arc<StoreHealth> = Arc::default();
        let store_down = {
            let (health, readiness) = (Arc::clone(&store), Arc::clone(&readiness));
            let (queue, min, max) = (
                config.queue.clone(),
                config.store_backoff_min,
                config.store_backoff_max,
            );
            crate::probe::StoreDownHook(Arc::new(move |down| {
                if down {
                    health.failed(min, max);
                } else {
                    health.ok();
                }
                readiness.store(&queue, down);
            }))
        };
        Ctx {
            pipeline_server,
            defer_acks,
            transport,
            router,
            dlq,
            config,
            observer,
            policy,
            store,
            hard_stop: AtomicBool::new(false),
            hard_notify: Notify::new(),
            readiness,
            store_down,
        }
    }

    /// What a guard's owed write tells when it fails (`true`: the store is down, reserving
    /// pauses for the store backoff, not ready) and when it lands after failing.
    pub(crate) fn store_down_hook(&self) -> crate::probe::StoreDownHook {
        self.store_down.clone()
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
    pub(crate) async fn until_done<T, F, Fut>(
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

#[cfg(test)]
mod tests {
    use super::*;

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
