//! Settlement as a pure decision: what happened to a delivery × its attempts × the
//! configured policy → one [`Action`]. No I/O here; the executor carries actions out.
//!
//! | what happened | action |
//! | --- | --- |
//! | handler ok, or duplicate skipped by the guard | ack |
//! | handler error / panic / timeout, `attempts + 1 < max_attempts` | retry after backoff, `attempts + 1` |
//! | handler error / panic / timeout, at the limit | dead-letter `failed` (drop if dead-lettering is off) |
//! | handler error marked [`Permanent`](super::Permanent) | dead-letter `failed` at once |
//! | unknown URN, `Fail` | as a handler error, reason `unknown_urn` |
//! | unknown URN, `Delete` | drop (ack) |
//! | unknown URN, `Release`, released < `max_releases` | put back after `release_delay`, release count + 1 |
//! | unknown URN, `Release`, at the cap | dead-letter `unknown_urn` |
//! | unknown URN, `DeadLetter` | dead-letter `unknown_urn` |
//! | id in flight on another worker (lease) | put back after `in_flight_delay`, no attempt counted |
//! | dedupe store unavailable or timed out | put back after the store backoff, no attempt counted |
//! | bad message (not an envelope, over the size limit, unusable `meta.id`) | dead-letter `poison`, bytes intact |
//! | recovered from dead consumers `max_recoveries` times | dead-letter `failed` |

use std::time::Duration;

use babelqueue_core::envelope::DeadLetterReason;

/// What to do with a message whose URN has no registered handler (the four strategies
/// every BabelQueue SDK offers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownUrnStrategy {
    /// Treat it as a handler failure: retried up to `max_attempts`, then dead-lettered
    /// with reason `unknown_urn` (the default).
    #[default]
    Fail,
    /// Ack and drop it.
    Delete,
    /// Republish it unchanged (for a consumer that knows the URN) and ack this copy.
    Release,
    /// Dead-letter it at once with reason `unknown_urn`.
    DeadLetter,
}

/// How failed handlers are retried: exponential backoff with jitter, up to a number of
/// deliveries.
///
/// The delay before the retry that follows the `n`-th failed attempt is
/// `min(initial × factor^(n-1), max_delay)`, then lengthened by a random share of up to
/// `jitter` of itself (never shortened, so the spacing is at least the exponential base),
/// and never over `max_delay`.
///
/// ```
/// use std::time::Duration;
/// use babelqueue_runtime::RetryPolicy;
/// let p = RetryPolicy::default()
///     .initial(Duration::from_millis(100))
///     .factor(2.0)
///     .jitter(0.0);
/// assert_eq!(p.delay(1, 0.5), Duration::from_millis(100));
/// assert_eq!(p.delay(2, 0.5), Duration::from_millis(200));
/// assert_eq!(p.delay(3, 0.5), Duration::from_millis(400));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// The first retry's delay (default 1 s).
    pub initial: Duration,
    /// The growth factor per further attempt (default 2.0; below 1.0 is read as 1.0).
    pub factor: f64,
    /// The longest delay (default 5 min).
    pub max_delay: Duration,
    /// Deliveries per message before it is dead-lettered (default 3; at least 1).
    pub max_attempts: u32,
    /// Random lengthening, as a share of the delay, in `0.0..=1.0` (default 0.2).
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_secs(1),
            factor: 2.0,
            max_delay: Duration::from_secs(300),
            max_attempts: 3,
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// Sets [`initial`](Self::initial).
    #[must_use]
    pub fn initial(mut self, d: Duration) -> Self {
        self.initial = d;
        self
    }

    /// Sets [`factor`](Self::factor).
    #[must_use]
    pub fn factor(mut self, f: f64) -> Self {
        self.factor = f;
        self
    }

    /// Sets [`max_delay`](Self::max_delay).
    #[must_use]
    pub fn max_delay(mut self, d: Duration) -> Self {
        self.max_delay = d;
        self
    }

    /// Sets [`max_attempts`](Self::max_attempts) (0 is read as 1).
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Sets [`jitter`](Self::jitter) (clamped to `0.0..=1.0`).
    #[must_use]
    pub fn jitter(mut self, j: f64) -> Self {
        self.jitter = if j.is_nan() { 0.0 } else { j.clamp(0.0, 1.0) };
        self
    }

    /// The delay after the `failures`-th failed attempt (1-based), for a uniform random
    /// sample `sample` in `0.0..1.0`.
    pub fn delay(&self, failures: u32, sample: f64) -> Duration {
        let exp = failures.saturating_sub(1).min(64) as i32;
        let factor = if self.factor.is_finite() {
            self.factor.max(1.0)
        } else {
            1.0
        };
        let max = self.max_delay.as_secs_f64();
        let base = (self.initial.as_secs_f64() * factor.powi(exp)).min(max);
        let jitter = self.jitter.clamp(0.0, 1.0) * sample.clamp(0.0, 1.0);
        let d = (base * (1.0 + jitter)).min(max.max(base));
        Duration::try_from_secs_f64(d).unwrap_or(self.max_delay)
    }
}

/// What happened to one delivery, as far as settling it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Happened {
    /// The handler ran and succeeded.
    Succeeded,
    /// The guard skipped a duplicate.
    Skipped,
    /// The handler failed (error, panic, timeout); `permanent` when marked so.
    Failed { permanent: bool },
    /// No handler for the URN.
    UnknownUrn,
    /// Lease mode: the id is in flight on another worker.
    InFlightElsewhere,
    /// The dedupe store could not answer (error or timeout).
    StoreUnavailable,
    /// Not usable as a message at all.
    Poison,
    /// Recovered from dead consumers too many times.
    Exhausted,
}

/// Why a message is put back without counting an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PutBack {
    InFlight,
    StoreDown,
    Release,
}

/// The one thing to do with a delivery.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Ack it.
    Ack,
    /// Requeue it with `attempts` set to this value, after `delay`.
    Retry { attempts: u32, delay: Duration },
    /// Requeue it unchanged (a release also counts the release) after `delay`.
    PutBack { why: PutBack, delay: Duration },
    /// Publish to the dead-letter queue and ack; `attempts` is the count to write (and,
    /// with `set_attempts`, to set on the envelope).
    DeadLetter {
        reason: DeadLetterReason,
        attempts: u32,
        set_attempts: bool,
    },
    /// Ack and drop (dead-lettering off, or unknown URN deleted).
    Drop,
}

/// The policy part of the decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    pub retry: RetryPolicy,
    pub unknown_urn: UnknownUrnStrategy,
    pub dead_letter: bool,
    pub in_flight_delay: Duration,
    pub release_delay: Duration,
    pub max_releases: u32,
}

/// The decision. `attempts` is the delivery's `attempts` field, `releases` how many times
/// it was released already, `store_pause` the current store backoff, `sample` a uniform
/// random number in `0.0..1.0` for the jitter.
pub(crate) fn decide(
    happened: Happened,
    attempts: u32,
    releases: u32,
    store_pause: Duration,
    sample: f64,
    p: &Policy,
) -> Action {
    let dead = |reason, attempts, set_attempts| {
        if p.dead_letter {
            Action::DeadLetter {
                reason,
                attempts,
                set_attempts,
            }
        } else {
            Action::Drop
        }
    };
    let failed = |reason, permanent: bool| {
        let next = attempts.saturating_add(1);
        if !permanent && next < p.retry.max_attempts {
            Action::Retry {
                attempts: next,
                delay: p.retry.delay(next, sample),
            }
        } else {
            dead(reason, next, true)
        }
    };
    match happened {
        Happened::Succeeded | Happened::Skipped => Action::Ack,
        Happened::Failed { permanent } => failed(DeadLetterReason::Failed, permanent),
        Happened::UnknownUrn => match p.unknown_urn {
            UnknownUrnStrategy::Fail => failed(DeadLetterReason::UnknownUrn, false),
            UnknownUrnStrategy::Delete => Action::Drop,
            UnknownUrnStrategy::Release if releases < p.max_releases => Action::PutBack {
                why: PutBack::Release,
                delay: p.release_delay,
            },
            UnknownUrnStrategy::Release | UnknownUrnStrategy::DeadLetter => {
                dead(DeadLetterReason::UnknownUrn, attempts, false)
            }
        },
        Happened::InFlightElsewhere => Action::PutBack {
            why: PutBack::InFlight,
            delay: p.in_flight_delay,
        },
        Happened::StoreUnavailable => Action::PutBack {
            why: PutBack::StoreDown,
            delay: store_pause,
        },
        Happened::Poison => dead(DeadLetterReason::Poison, attempts, false),
        Happened::Exhausted => dead(DeadLetterReason::Failed, attempts, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeadLetterReason as R;
    use Happened as H;
    use UnknownUrnStrategy as U;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn policy(unknown: U, dead_letter: bool) -> Policy {
        Policy {
            retry: RetryPolicy::default()
                .initial(MS(100))
                .factor(2.0)
                .max_delay(MS(1000))
                .max_attempts(3)
                .jitter(0.5),
            unknown_urn: unknown,
            dead_letter,
            in_flight_delay: MS(500),
            release_delay: MS(700),
            max_releases: 2,
        }
    }

    fn dl(reason: R, attempts: u32, set_attempts: bool) -> Action {
        Action::DeadLetter {
            reason,
            attempts,
            set_attempts,
        }
    }

    /// Every row of the settlement table, with dead-lettering on and off.
    #[test]
    fn the_settlement_table() {
        let pause = MS(3000);
        #[rustfmt::skip]
        let rows: Vec<(H, u32, u32, U, Action, Action)> = vec![
            // happened, attempts, releases, unknown strategy, action (dlq on), action (dlq off)
            (H::Succeeded, 0, 0, U::Fail, Action::Ack, Action::Ack),
            (H::Succeeded, 7, 0, U::Fail, Action::Ack, Action::Ack),
            (H::Skipped, 1, 0, U::Fail, Action::Ack, Action::Ack),
            (H::Failed { permanent: false }, 0, 0, U::Fail, Action::Retry { attempts: 1, delay: MS(100) }, Action::Retry { attempts: 1, delay: MS(100) }),
            (H::Failed { permanent: false }, 1, 0, U::Fail, Action::Retry { attempts: 2, delay: MS(200) }, Action::Retry { attempts: 2, delay: MS(200) }),
            (H::Failed { permanent: false }, 2, 0, U::Fail, dl(R::Failed, 3, true), Action::Drop),
            (H::Failed { permanent: false }, 9, 0, U::Fail, dl(R::Failed, 10, true), Action::Drop),
            (H::Failed { permanent: true }, 0, 0, U::Fail, dl(R::Failed, 1, true), Action::Drop),
            (H::UnknownUrn, 0, 0, U::Fail, Action::Retry { attempts: 1, delay: MS(100) }, Action::Retry { attempts: 1, delay: MS(100) }),
            (H::UnknownUrn, 2, 0, U::Fail, dl(R::UnknownUrn, 3, true), Action::Drop),
            (H::UnknownUrn, 0, 0, U::Delete, Action::Drop, Action::Drop),
            (H::UnknownUrn, 0, 0, U::Release, Action::PutBack { why: PutBack::Release, delay: MS(700) }, Action::PutBack { why: PutBack::Release, delay: MS(700) }),
            (H::UnknownUrn, 0, 1, U::Release, Action::PutBack { why: PutBack::Release, delay: MS(700) }, Action::PutBack { why: PutBack::Release, delay: MS(700) }),
            (H::UnknownUrn, 0, 2, U::Release, dl(R::UnknownUrn, 0, false), Action::Drop),
            (H::UnknownUrn, 1, 0, U::DeadLetter, dl(R::UnknownUrn, 1, false), Action::Drop),
            (H::InFlightElsewhere, 2, 0, U::Fail, Action::PutBack { why: PutBack::InFlight, delay: MS(500) }, Action::PutBack { why: PutBack::InFlight, delay: MS(500) }),
            (H::StoreUnavailable, 2, 0, U::Fail, Action::PutBack { why: PutBack::StoreDown, delay: pause }, Action::PutBack { why: PutBack::StoreDown, delay: pause }),
            (H::StoreUnavailable, 99, 0, U::Fail, Action::PutBack { why: PutBack::StoreDown, delay: pause }, Action::PutBack { why: PutBack::StoreDown, delay: pause }),
            (H::Poison, 0, 0, U::Fail, dl(R::Poison, 0, false), Action::Drop),
            (H::Exhausted, 1, 0, U::Fail, dl(R::Failed, 1, false), Action::Drop),
        ];
        for (i, (h, attempts, releases, unknown, on, off)) in rows.into_iter().enumerate() {
            // sample 0: jitter adds nothing, so the delays are the exponential base.
            let got = decide(h, attempts, releases, pause, 0.0, &policy(unknown, true));
            assert_eq!(
                got, on,
                "row {i} ({h:?}, attempts {attempts}, dead-letter on)"
            );
            let got = decide(h, attempts, releases, pause, 0.0, &policy(unknown, false));
            assert_eq!(
                got, off,
                "row {i} ({h:?}, attempts {attempts}, dead-letter off)"
            );
        }
    }

    #[test]
    fn backoff_grows_is_capped_and_jitter_only_lengthens() {
        let p = policy(U::Fail, true).retry;
        assert_eq!(p.delay(1, 0.0), MS(100));
        assert_eq!(p.delay(2, 0.0), MS(200));
        assert_eq!(p.delay(4, 0.0), MS(800));
        assert_eq!(p.delay(5, 0.0), MS(1000), "capped");
        assert_eq!(
            p.delay(40, 0.99),
            MS(1000),
            "jitter never goes over the cap"
        );
        assert_eq!(p.delay(1, 1.0), MS(150), "jitter 0.5 adds up to half");
        for i in 0..100 {
            let d = p.delay(2, f64::from(i) / 100.0);
            assert!(d >= MS(200) && d <= MS(300), "{d:?}");
        }
        // A huge failure count neither overflows nor panics.
        assert_eq!(p.delay(u32::MAX, 0.5), MS(1000));
        let weird = RetryPolicy::default().factor(f64::NAN).initial(MS(10));
        assert_eq!(weird.jitter(0.0).delay(5, 0.0), MS(10));
    }
}
