//! Replay-bypass (the family's ADR-0027): a handler tells a deliberate replay from a first
//! delivery, and skips the external side effects that already fired.
//!
//! A [`redrive`](crate::redrive) with `bypass` stamps the transport header
//! [`HEADER`] (`bq-replay-bypass: "1"`) on each message it re-publishes: out of band (the
//! Redis header frame, the broker's native header table), never in the envelope. The
//! runtime reads it from every delivery and makes it visible to the handler for the span
//! of that call: as the [`Replay`] argument, or [`is_replay()`] anywhere in the handler's
//! code, sync or async. The idempotent core of a handler runs on a replay; its external,
//! non-idempotent side (a card charge, an email) goes in [`bypass_external_effects`] (or
//! [`bypass_external_effects_async`]), which skips it on a replay.
//!
//! ```
//! use babelqueue_runtime::replay::{self, Replay};
//! use babelqueue_core::{BoxError, Envelope};
//!
//! fn charge_card(_amount: u64) -> Result<(), BoxError> { Ok(()) }
//! fn write_ledger(_env: &Envelope) {}
//!
//! // #[handler("urn:babel:payments:charge")]  (works with #[idempotent] unchanged)
//! fn charge(env: &Envelope, replay: Replay) -> Result<(), BoxError> {
//!     write_ledger(env); // the idempotent core: always runs
//!     // The external effect: skipped (None) when the message is a replay.
//!     replay::bypass_external_effects(|| charge_card(4200)).transpose()?;
//!     if replay.0 {
//!         println!("replay: the card was not charged again");
//!     }
//!     Ok(())
//! }
//! # let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({}))?;
//! # charge(&env, Replay(false))?;
//! # Ok::<(), BoxError>(())
//! ```
//!
//! Which header values count: the family's producers write the string `"1"`. A header
//! present with a *truthy* value is a replay: a non-empty string other than `"0"` and
//! `"false"` (any case), a non-zero number, `true`. Absent, or any other value: not a
//! replay. [`header_is_replay`] is that rule.
//!
//! Scope: the flag is set by the runtime around one handler call. A sync handler runs on
//! tokio's blocking pool; the runtime carries the flag into that thread, so
//! [`is_replay()`] works there too. A task the handler spawns itself (`tokio::spawn`,
//! `std::thread::spawn`) does not inherit it: read [`is_replay()`] (or take [`Replay`])
//! first and move the `bool` into the task. Outside a handler, [`is_replay()`] is `false`;
//! [`scope`] and [`sync_scope`] set it by hand (a test, a handler called directly).

use std::cell::Cell;
use std::future::Future;

use serde_json::Value;

/// The transport header that marks a deliberate replay: `bq-replay-bypass`.
pub const HEADER: &str = "bq-replay-bypass";

/// The value a redrive with bypass writes: `"1"` (what every SDK of the family writes).
pub const HEADER_VALUE: &str = "1";

tokio::task_local! {
    static REPLAY: bool;
}

thread_local! {
    static REPLAY_SYNC: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether the message being handled is a deliberate replay: it was redriven with
/// `bypass` and carries the [`HEADER`] transport header.
///
/// Works in async handlers and in sync handlers (which run on tokio's blocking pool: the
/// runtime carries the flag there). `false` outside a handler call.
///
/// ```
/// use babelqueue_runtime::replay::{is_replay, scope, sync_scope};
/// assert!(!is_replay());
/// assert!(sync_scope(true, is_replay));
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// assert!(scope(true, async { is_replay() }).await);
/// assert!(!scope(false, async { is_replay() }).await);
/// # });
/// ```
pub fn is_replay() -> bool {
    if let Some(flag) = REPLAY_SYNC.with(Cell::get) {
        return flag;
    }
    REPLAY.try_with(|f| *f).unwrap_or(false)
}

/// Runs `effect` unless the message being handled is a replay ([`is_replay()`]); `None`
/// when it was skipped. Wrap the external, non-idempotent side of a handler in it (a card
/// charge, an email, a call to a third party): a replay re-runs the idempotent core and
/// skips what already fired.
///
/// ```
/// use babelqueue_runtime::replay::{bypass_external_effects, sync_scope};
/// assert_eq!(bypass_external_effects(|| "charged"), Some("charged"));
/// assert_eq!(sync_scope(true, || bypass_external_effects(|| "charged")), None);
/// ```
pub fn bypass_external_effects<T>(effect: impl FnOnce() -> T) -> Option<T> {
    if is_replay() { None } else { Some(effect()) }
}

/// The async form of [`bypass_external_effects`]: awaits `effect` unless the message is a
/// replay; `None` when it was skipped (the future is then dropped unpolled).
///
/// ```
/// use babelqueue_runtime::replay::{bypass_external_effects_async, scope};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// assert_eq!(bypass_external_effects_async(async { 7 }).await, Some(7));
/// let skipped = scope(true, bypass_external_effects_async(async { 7 })).await;
/// assert_eq!(skipped, None);
/// # });
/// ```
pub async fn bypass_external_effects_async<F: Future>(effect: F) -> Option<F::Output> {
    if is_replay() {
        None
    } else {
        Some(effect.await)
    }
}

/// Runs `fut` with [`is_replay()`] answering `replay` inside it (the runtime wraps every
/// handler call in this; a test can too).
pub fn scope<F: Future>(replay: bool, fut: F) -> impl Future<Output = F::Output> {
    // The task-local's own future, not an `async fn` around it: that would hold `fut`
    // twice (before and after it starts), doubling the size of every handler call.
    REPLAY.scope(replay, fut)
}

/// Runs `f` on this thread with [`is_replay()`] answering `replay` inside it; the previous
/// value comes back afterwards, also when `f` panics. (The runtime runs every sync
/// handler on the blocking pool inside this.)
pub fn sync_scope<R>(replay: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            REPLAY_SYNC.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(REPLAY_SYNC.with(|c| c.replace(Some(replay))));
    f()
}

/// The family's rule for a [`HEADER`] value (see the [module docs](self)).
///
/// ```
/// use babelqueue_runtime::replay::header_is_replay;
/// use serde_json::json;
/// assert!(header_is_replay(&json!("1")));
/// assert!(header_is_replay(&json!("true")));
/// assert!(header_is_replay(&json!(1)));
/// assert!(header_is_replay(&json!(true)));
/// assert!(!header_is_replay(&json!("0")));
/// assert!(!header_is_replay(&json!("")));
/// assert!(!header_is_replay(&json!(false)));
/// assert!(!header_is_replay(&json!(null)));
/// ```
pub fn header_is_replay(value: &Value) -> bool {
    match value {
        Value::String(s) => {
            let s = s.trim();
            !s.is_empty() && s != "0" && !s.eq_ignore_ascii_case("false")
        }
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        _ => false,
    }
}

/// Whether a delivery's out-of-band headers mark it as a replay.
pub fn headers_are_replay(headers: Option<&serde_json::Map<String, Value>>) -> bool {
    headers
        .and_then(|h| h.get(HEADER))
        .is_some_and(header_is_replay)
}

/// A handler argument: whether this delivery is a deliberate replay (the same as
/// [`is_replay()`] at the start of the call).
///
/// ```
/// use babelqueue_runtime::replay::Replay;
/// use babelqueue_core::Envelope;
/// // #[handler("urn:babel:mail:send")]
/// fn send(env: &Envelope, Replay(replay): Replay) {
///     if replay {
///         return; // the email went out the first time
///     }
///     # let _ = env;
/// }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replay(pub bool);

impl Replay {
    /// Whether the delivery is a replay.
    pub fn is_replay(self) -> bool {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_scope_nests_and_restores() {
        assert!(!is_replay());
        sync_scope(true, || {
            assert!(is_replay());
            sync_scope(false, || assert!(!is_replay()));
            assert!(is_replay());
        });
        assert!(!is_replay());
        let r = std::panic::catch_unwind(|| sync_scope(true, || panic!("boom")));
        assert!(r.is_err());
        assert!(!is_replay(), "restored after a panic");
    }

    #[tokio::test]
    async fn async_scope_is_per_task() {
        let inner = scope(true, async {
            let spawned = tokio::spawn(async { is_replay() }).await.unwrap();
            (is_replay(), spawned)
        })
        .await;
        assert_eq!(inner, (true, false));
        assert!(!is_replay());
    }
}
