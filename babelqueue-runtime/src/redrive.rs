//! Redrive (the family's ADR-0026): dead letters back to work, over any [`Transport`].
//!
//! [`redrive`] reads the messages of a dead-letter queue and re-publishes each to its
//! source queue (`dead_letter.original_queue`, else `meta.queue`) or to a chosen queue,
//! **reset for reprocessing**: the `dead_letter` block removed and `attempts` set to 0;
//! every other field (`job`, `trace_id`, `data`, `meta`, fields this SDK does not know) is
//! kept as it was, in its order. With [`bypass`](RedriveOptions::bypass) each re-published
//! message carries the transport header `bq-replay-bypass: "1"` (see [`crate::replay`]):
//! the consuming handler re-runs its idempotent core and skips its external effects.
//!
//! The rules, in the order they apply:
//!
//! 1. **Drain, then process.** Up to [`max`](RedriveOptions::max) messages (0: all) are
//!    reserved off the DLQ first; only then is each handled. A message put back during the
//!    run (not selected, a dry run, a restore) is therefore not met again in this run.
//! 2. **Restored as it was, never dropped, never repaired**: a body that is not an accepted
//!    envelope ([`ItemStatus::Undecodable`]), a poison record (`job` = `urn:babel:poison`
//!    or `dead_letter.reason` = `poison`: [`ItemStatus::Poison`]; `babelqueue dlq
//!    recover-poison` is the tool for those), a message whose `attempts` is not a number
//!    ([`ItemStatus::NonNumericAttempts`]), one without a target queue
//!    ([`ItemStatus::NoTarget`]) and one the selection leaves out
//!    ([`ItemStatus::NotSelected`]) go back to the DLQ byte for byte (with the transport's
//!    put-back: [`Transport::requeue`] unchanged, no delay).
//! 3. **A dry run changes nothing**: every drained message is restored, and the result is
//!    the plan ([`ItemStatus::Planned`], with the target each would go to).
//! 4. **Ack after publish.** A DLQ message is acknowledged only after its re-publish
//!    succeeded. A failed publish restores that message and every one not handled yet,
//!    and returns [`RedriveError`] with what was done so far.
//!
//! Where the messages are during a run: reserved off the DLQ they are in the broker's
//! in-flight state of the DLQ (Redis: this process's processing list
//! `{<dlq>}:processing:<consumer-id>`, kept alive by a heartbeat; RabbitMQ: unacked). If the
//! process dies, the broker's recovery puts them back on the DLQ (RabbitMQ at once; Redis
//! when the heartbeat has expired, by the next consumer of the DLQ — the next redrive —
//! which recovers dead consumers' lists when it starts). A crash between a re-publish and
//! its ack leaves that message **in both** the target queue and the DLQ: the documented
//! at-least-once window; the next redrive sends it again, and the idempotency guard (same
//! `meta.id`) absorbs the duplicate.
//!
//! ```
//! use babelqueue_runtime::redrive::{redrive, RedriveOptions, ItemStatus};
//! use babelqueue_runtime::{InMemoryTransport, Transport};
//! use babelqueue_core::Envelope;
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let t = InMemoryTransport::new();
//! let dead = r#"{"job":"urn:babel:payments:charge","trace_id":"t-1","data":{"amount":4200},
//!   "meta":{"id":"m-1","queue":"payments","lang":"python","schema_version":1,"created_at":1},
//!   "attempts":3,"dead_letter":{"reason":"failed","error":"declined","exception":null,
//!   "failed_at":2,"original_queue":"payments","attempts":3,"lang":"python"}}"#;
//! t.publish_raw("payments.dlq", dead.as_bytes().to_vec()).await?;
//!
//! // The plan first: nothing moves.
//! let plan = redrive(&t, "payments.dlq", &RedriveOptions::new().dry_run(true)).await?;
//! assert_eq!(plan.items[0].status, ItemStatus::Planned);
//! assert_eq!(plan.items[0].to.as_deref(), Some("payments"));
//!
//! // Then for real, as a replay.
//! let done = redrive(&t, "payments.dlq", &RedriveOptions::new().bypass(true)).await?;
//! assert_eq!((done.redriven, done.items[0].bypassed), (1, true));
//! let d = t.reserve("payments", std::time::Duration::ZERO).await?.expect("redriven");
//! assert_eq!(d.headers().unwrap()["bq-replay-bypass"], "1");
//! let env = Envelope::decode(d.body())?;
//! assert_eq!((env.attempts, env.dead_letter.is_none()), (0, true));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::replay;
use crate::{
    ConsumerEvent, ConsumerOptions, Delivery, EventSink, Headers, RELEASES_HEADER, Republish,
    Transport, TransportError,
};
use babelqueue_core::envelope::Envelope;

/// The URN of the wrapper a non-object poison body is dead-lettered in.
const POISON_URN: &str = crate::POISON_URN;

/// How long a drain goes on waiting, without a message arriving, while the transport
/// says more is on its way ([`Transport::next_due`]).
const DRAIN_PATIENCE: Duration = Duration::from_secs(30);

type Predicate = Arc<dyn Fn(&Envelope) -> bool + Send + Sync>;
type Progress = Arc<dyn Fn(&RedriveItem) + Send + Sync>;

/// What a [`redrive`] does: target, limit, dry run, selection, bypass.
///
/// ```
/// use babelqueue_runtime::redrive::RedriveOptions;
/// let opts = RedriveOptions::new()
///     .to("payments.sandbox")          // not each message's own queue
///     .max(100)                        // at most 100 messages off the DLQ
///     .reason("failed")                // only these…
///     .urn("urn:babel:payments:charge") // …and only these
///     .select(|env| env.data.get("amount").and_then(|a| a.as_u64()) < Some(10_000))
///     .bypass(true);                   // handlers see is_replay()
/// assert!(!opts.is_dry_run());
/// ```
#[derive(Clone)]
pub struct RedriveOptions {
    to: Option<String>,
    max: usize,
    dry_run: bool,
    bypass: bool,
    reasons: Vec<String>,
    urns: Vec<String>,
    predicates: Vec<Predicate>,
    wait: Duration,
    heartbeat: (Duration, Duration),
    progress: Option<Progress>,
}

impl fmt::Debug for RedriveOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedriveOptions")
            .field("to", &self.to)
            .field("max", &self.max)
            .field("dry_run", &self.dry_run)
            .field("bypass", &self.bypass)
            .field("reasons", &self.reasons)
            .field("urns", &self.urns)
            .field("predicates", &self.predicates.len())
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl Default for RedriveOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl RedriveOptions {
    /// Every message back to its own source queue, no limit, no selection, no bypass.
    pub fn new() -> Self {
        RedriveOptions {
            to: None,
            max: 0,
            dry_run: false,
            bypass: false,
            reasons: Vec::new(),
            urns: Vec::new(),
            predicates: Vec::new(),
            wait: Duration::from_millis(500),
            heartbeat: (Duration::from_secs(2), Duration::from_secs(10)),
            progress: None,
        }
    }

    /// Re-publish every message to `queue` (a sandbox) instead of its own source queue.
    pub fn to(mut self, queue: impl Into<String>) -> Self {
        self.to = Some(queue.into()).filter(|q| !q.is_empty());
        self
    }

    /// Take at most `n` messages off the DLQ in this run (0: all). The ones taken but
    /// not redriven (not selected, restored) count too, as in every SDK of the family.
    pub fn max(mut self, n: usize) -> Self {
        self.max = n;
        self
    }

    /// Report the plan, change nothing: every message is restored.
    pub fn dry_run(mut self, on: bool) -> Self {
        self.dry_run = on;
        self
    }

    /// Stamp the `bq-replay-bypass` header on each re-published message.
    pub fn bypass(mut self, on: bool) -> Self {
        self.bypass = on;
        self
    }

    /// Only messages whose `dead_letter.reason` is `reason` (`failed`, `unknown_urn`);
    /// several calls: any of them.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reasons.push(reason.into());
        self
    }

    /// Only messages of this URN (`job`); several calls: any of them.
    pub fn urn(mut self, urn: impl Into<String>) -> Self {
        self.urns.push(urn.into());
        self
    }

    /// Only messages `predicate` accepts (it sees the dead letter, `dead_letter` block
    /// included); several calls: all of them.
    pub fn select(mut self, predicate: impl Fn(&Envelope) -> bool + Send + Sync + 'static) -> Self {
        self.predicates.push(Arc::new(predicate));
        self
    }

    /// How long the drain waits for the next message before it decides the DLQ is empty
    /// (default 500 ms; a broker that pushes, like RabbitMQ, needs a moment).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The liveness of this run as a consumer of the DLQ, on brokers with consumer
    /// heartbeats (Redis): renewed every `interval`, valid `ttl` (default 2 s / 10 s). The
    /// messages of a redrive that died are returned to the DLQ once its heartbeat expired,
    /// by the next redrive of that DLQ.
    pub fn heartbeat(mut self, interval: Duration, ttl: Duration) -> Self {
        self.heartbeat = (interval, ttl);
        self
    }

    /// Called with each message's item as soon as it is settled (progress output).
    pub fn on_item(mut self, f: impl Fn(&RedriveItem) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(f));
        self
    }

    /// Whether this is a dry run.
    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    fn selects(&self, env: &Envelope) -> bool {
        let reason = env.dead_letter.as_ref().map(|d| d.reason.as_str());
        (self.reasons.is_empty() || self.reasons.iter().any(|r| Some(r.as_str()) == reason))
            && (self.urns.is_empty() || self.urns.iter().any(|u| u == env.urn()))
            && self.predicates.iter().all(|p| p(env))
    }
}

/// What happened to one message of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ItemStatus {
    /// Re-published to its target and acknowledged on the DLQ.
    Redriven,
    /// Dry run: it would have gone to its target; restored.
    Planned,
    /// Left out by the selection; restored.
    NotSelected,
    /// Not an accepted envelope; restored as it was.
    Undecodable,
    /// A poison record; restored as it was (see `babelqueue dlq recover-poison`).
    Poison,
    /// `attempts` is not a number; restored as it was.
    NonNumericAttempts,
    /// No `--to`, no `dead_letter.original_queue`, no `meta.queue`; restored.
    NoTarget,
    /// Not handled in this run, restored: the run stopped on a broker error first, or the
    /// message reached this run's in-flight state after the drain (handed over by the
    /// broker's recovery).
    Aborted,
}

impl ItemStatus {
    /// The status as a short word (`redriven`, `planned`, `not_selected`, `undecodable`,
    /// `poison`, `non_numeric_attempts`, `no_target`, `aborted`).
    pub fn as_str(self) -> &'static str {
        match self {
            ItemStatus::Redriven => "redriven",
            ItemStatus::Planned => "planned",
            ItemStatus::NotSelected => "not_selected",
            ItemStatus::Undecodable => "undecodable",
            ItemStatus::Poison => "poison",
            ItemStatus::NonNumericAttempts => "non_numeric_attempts",
            ItemStatus::NoTarget => "no_target",
            ItemStatus::Aborted => "aborted",
        }
    }
}

impl fmt::Display for ItemStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message of a run: who it is and what happened to it (the family's result shape:
/// id, trace id, URN, reason, from, to, redriven, bypassed). Fields the message does not
/// have (an undecodable body) are empty strings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedriveItem {
    /// `meta.id`.
    pub message_id: String,
    /// `trace_id`.
    pub trace_id: String,
    /// The URN (`job`).
    pub urn: String,
    /// `dead_letter.reason`.
    pub reason: String,
    /// The DLQ it was read from.
    pub from: String,
    /// Where it went (or would go, on a dry run); `None` when it stays in the DLQ for
    /// another reason.
    pub to: Option<String>,
    /// Whether it was re-published and acknowledged on the DLQ.
    pub redriven: bool,
    /// Whether the `bq-replay-bypass` header was stamped on it.
    pub bypassed: bool,
    /// What happened.
    pub status: ItemStatus,
}

impl RedriveItem {
    /// The item as a JSON object (the CLI's `--json` line).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "message_id": self.message_id,
            "trace_id": self.trace_id,
            "urn": self.urn,
            "reason": self.reason,
            "from": self.from,
            "to": self.to,
            "redriven": self.redriven,
            "bypassed": self.bypassed,
            "status": self.status.as_str(),
        })
    }
}

/// The result of a run: one item per message taken off the DLQ, in the order taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedriveResult {
    /// Messages re-published and acknowledged.
    pub redriven: usize,
    /// Messages put back on the DLQ (dry run, not selected, not redrivable).
    pub restored: usize,
    /// Whether it was a dry run.
    pub dry_run: bool,
    /// Each message.
    pub items: Vec<RedriveItem>,
}

impl RedriveResult {
    /// The result as a JSON object: `{"dry_run":…,"redriven":n,"restored":n,"items":[…]}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "dry_run": self.dry_run,
            "redriven": self.redriven,
            "restored": self.restored,
            "items": self.items.iter().map(RedriveItem::to_json).collect::<Vec<_>>(),
        })
    }
}

/// A run stopped on a broker error. What was done before is in
/// [`result`](Self::result); the message being handled and every one not handled yet were
/// restored to the DLQ where that was possible (else they stay in the DLQ's in-flight state,
/// which the broker's recovery returns to the DLQ).
#[derive(Debug, thiserror::Error)]
#[error("redrive of `{dlq}` stopped: {stage}")]
pub struct RedriveError {
    dlq: String,
    stage: &'static str,
    result: RedriveResult,
    #[source]
    source: TransportError,
}

impl RedriveError {
    /// What the run did before it stopped.
    pub fn result(&self) -> &RedriveResult {
        &self.result
    }

    /// The broker error.
    pub fn transport_error(&self) -> &TransportError {
        &self.source
    }
}

/// Why a drained message is not re-published.
enum Classified {
    /// Redrivable: its item and the reset body.
    Ready(RedriveItem, Vec<u8>),
    /// Restored as it was.
    Keep(RedriveItem),
}

fn str_at<'a>(obj: &'a Map<String, Value>, path: &[&str]) -> &'a str {
    let mut cur = obj;
    for (i, key) in path.iter().enumerate() {
        match cur.get(*key) {
            Some(Value::String(s)) if i + 1 == path.len() => return s,
            Some(Value::Object(m)) if i + 1 < path.len() => cur = m,
            _ => return "",
        }
    }
    ""
}

fn classify(dlq: &str, body: &[u8], options: &RedriveOptions) -> Classified {
    let mut item = RedriveItem {
        message_id: String::new(),
        trace_id: String::new(),
        urn: String::new(),
        reason: String::new(),
        from: dlq.to_owned(),
        to: None,
        redriven: false,
        bypassed: false,
        status: ItemStatus::Undecodable,
    };
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(body) else {
        return Classified::Keep(item);
    };
    item.message_id = str_at(&obj, &["meta", "id"]).to_owned();
    item.trace_id = str_at(&obj, &["trace_id"]).to_owned();
    item.urn = str_at(&obj, &["job"]).to_owned();
    item.reason = str_at(&obj, &["dead_letter", "reason"]).to_owned();
    if item.urn == POISON_URN || item.reason == "poison" {
        item.status = ItemStatus::Poison;
        return Classified::Keep(item);
    }
    if obj.get("attempts").is_some_and(|a| !a.is_number()) {
        item.status = ItemStatus::NonNumericAttempts;
        return Classified::Keep(item);
    }
    let Ok(env) = Envelope::decode(body) else {
        return Classified::Keep(item);
    };
    if !options.selects(&env) {
        item.status = ItemStatus::NotSelected;
        return Classified::Keep(item);
    }
    let target = options
        .to
        .clone()
        .or_else(|| Some(str_at(&obj, &["dead_letter", "original_queue"]).to_owned()))
        .filter(|q| !q.is_empty())
        .or_else(|| Some(str_at(&obj, &["meta", "queue"]).to_owned()))
        .filter(|q| !q.is_empty());
    let Some(target) = target else {
        item.status = ItemStatus::NoTarget;
        return Classified::Keep(item);
    };
    item.to = Some(target);
    if options.dry_run {
        item.status = ItemStatus::Planned;
        return Classified::Keep(item);
    }
    let Some(reset) = reset_text(body, true) else {
        item.status = ItemStatus::Undecodable;
        item.to = None;
        return Classified::Keep(item);
    };
    item.status = ItemStatus::Redriven;
    Classified::Ready(item, reset)
}

/// A dead letter's body reset for reprocessing, by editing its text: every top-level
/// `dead_letter` member taken out and, with `reset_attempts`, `attempts` set to `0`;
/// every other byte (numbers of any size and spelling, key order, repeated keys,
/// whitespace, escapes) stays as it was. `None` unless `body` is a JSON object.
///
/// ```
/// use babelqueue_runtime::redrive::reset_text;
/// let dead = br#"{"job":"urn:x","data":{"big":92345678901234567890,"e":1.0E2},"attempts":3,"dead_letter":{"reason":"failed"}}"#;
/// assert_eq!(
///     reset_text(dead, true).unwrap(),
///     br#"{"job":"urn:x","data":{"big":92345678901234567890,"e":1.0E2},"attempts":0}"#
/// );
/// assert_eq!(reset_text(b"not json", true), None);
/// ```
pub fn reset_text(body: &[u8], reset_attempts: bool) -> Option<Vec<u8>> {
    use crate::json_text;
    let body = json_text::remove_member(body, "dead_letter")?;
    if reset_attempts {
        json_text::set_member(&body, "attempts", b"0")
    } else {
        Some(body)
    }
}

/// The headers of the re-published message: the dead letter's own (trace context), minus
/// the runtime's release count and any earlier replay mark, plus the replay mark when
/// `bypass`.
fn headers_for(delivery: &Delivery, bypass: bool) -> Option<Headers> {
    let mut h = delivery.headers().cloned().unwrap_or_default();
    h.shift_remove(replay::HEADER);
    h.shift_remove(RELEASES_HEADER);
    if bypass {
        h.insert(replay::HEADER.to_owned(), replay::HEADER_VALUE.into());
    }
    (!h.is_empty()).then_some(h)
}

/// Puts a drained message back on the DLQ as it was.
async fn restore<T: Transport + ?Sized>(t: &T, d: &Delivery) -> Result<(), TransportError> {
    t.requeue(d, Republish::unchanged(), Duration::ZERO).await
}

/// Redrives the dead letters of `dlq` over `transport`; see the [module docs](self).
///
/// # Errors
///
/// [`RedriveError`] when the broker fails a reserve, a re-publish, an ack or a restore;
/// it carries the result so far.
pub async fn redrive<T: Transport + ?Sized>(
    transport: &T,
    dlq: &str,
    options: &RedriveOptions,
) -> Result<RedriveResult, RedriveError> {
    let mut result = RedriveResult {
        dry_run: options.dry_run,
        ..RedriveResult::default()
    };
    let fail = |result: RedriveResult, stage: &'static str, source: TransportError| RedriveError {
        dlq: dlq.to_owned(),
        stage,
        result,
        source,
    };
    // As a consumer of the DLQ: a prefetch large enough to drain (brokers that push), a
    // heartbeat that keeps our in-flight messages ours, and one recovery pass that returns
    // what a redrive that died left in flight (Redis).
    let prefetch = if options.max == 0 {
        usize::from(u16::MAX)
    } else {
        options.max
    };
    let (events, mut rx) = EventSink::channel();
    let consumer = ConsumerOptions::new(prefetch)
        .heartbeat(options.heartbeat.0, options.heartbeat.1)
        .with_events(events);
    if let Err(e) = transport.start_consumer(dlq, &consumer).await {
        return Err(fail(result, "starting a consumer of the DLQ failed", e));
    }

    // 1. Drain.
    let mut batch: Vec<Delivery> = Vec::new();
    let mut idle_since = tokio::time::Instant::now();
    let drained = loop {
        if options.max != 0 && batch.len() >= options.max {
            break Ok(());
        }
        match transport.reserve(dlq, options.wait).await {
            Ok(Some(d)) => {
                batch.push(d);
                idle_since = tokio::time::Instant::now();
            }
            // Nothing came within `wait`: the DLQ is drained, unless the broker says more
            // is on its way (Kafka: the group has not assigned the partitions yet, or
            // records are not fetched yet), for at most DRAIN_PATIENCE without a message.
            Ok(None) => match transport.next_due(dlq).await {
                Ok(Some(_)) if idle_since.elapsed() < DRAIN_PATIENCE => {}
                _ => break Ok(()),
            },
            Err(e) => break Err(e),
        }
    };
    // Messages recovered too many times were moved into our in-flight state: they are
    // dead letters like the others.
    while let Ok(event) = rx.try_recv() {
        if let ConsumerEvent::Exhausted(d, _) = event {
            batch.push(d);
        }
    }
    if let Err(e) = drained {
        let restored = restore_all(transport, dlq, &batch, &mut result).await;
        let _ = transport.leave(dlq).await;
        return Err(fail(
            result,
            "reserving off the DLQ failed",
            restored.err().unwrap_or(e),
        ));
    }

    // 2. Process.
    let mut outcome = Ok(());
    let mut rest = batch.iter();
    for d in rest.by_ref() {
        match classify(dlq, d.body(), options) {
            Classified::Keep(item) => {
                if let Err(e) = restore(transport, d).await {
                    outcome = Err(("restoring a message to the DLQ failed", e));
                    push_aborted(&mut result, item);
                    break;
                }
                result.restored += 1;
                report(options, &mut result, item);
            }
            Classified::Ready(mut item, body) => {
                let target = item.to.clone().unwrap_or_default();
                let headers = headers_for(d, options.bypass);
                if let Err(e) = transport
                    .publish_with_headers(&target, &body, headers.as_ref())
                    .await
                {
                    let _ = restore(transport, d).await;
                    item.status = ItemStatus::Aborted;
                    item.to = None;
                    push_aborted(&mut result, item);
                    outcome = Err(("re-publishing a message failed; it was restored", e));
                    break;
                }
                // Published: only now is it taken off the DLQ. A failed ack leaves it in
                // both places (the documented window); it is not restored (that would
                // copy it), and the run stops.
                if let Err(e) = transport.ack(d).await {
                    item.redriven = true;
                    item.bypassed = options.bypass;
                    result.redriven += 1;
                    report(options, &mut result, item);
                    outcome = Err((
                        "acknowledging a re-published message failed; it is in its target and still in the DLQ",
                        e,
                    ));
                    break;
                }
                item.redriven = true;
                item.bypassed = options.bypass;
                result.redriven += 1;
                report(options, &mut result, item);
            }
        }
    }
    if let Err((stage, e)) = outcome {
        let rest: Vec<Delivery> = rest.cloned().collect();
        let _ = restore_all(transport, dlq, &rest, &mut result).await;
        let _ = transport.leave(dlq).await;
        return Err(fail(result, stage, e));
    }
    if let Err(e) = transport.leave(dlq).await {
        tracing::warn!(dlq, error = %e, "leaving the DLQ's consumer failed");
    }
    // A message the background recovery handed over during the processing (recovered too
    // often) is in our in-flight state: back to the DLQ, not stranded.
    while let Ok(event) = rx.try_recv() {
        if let ConsumerEvent::Exhausted(d, _) = event {
            let item = match classify(dlq, d.body(), &RedriveOptions::new().dry_run(true)) {
                Classified::Keep(item) | Classified::Ready(item, _) => item,
            };
            push_aborted(&mut result, item);
            match restore(transport, &d).await {
                Ok(()) => result.restored += 1,
                Err(e) => {
                    tracing::warn!(dlq, error = %e, "restoring a recovered message failed; it stays in flight for the next recovery");
                }
            }
        }
    }
    Ok(result)
}

fn report(options: &RedriveOptions, result: &mut RedriveResult, item: RedriveItem) {
    if let Some(p) = &options.progress {
        p(&item);
    }
    result.items.push(item);
}

fn push_aborted(result: &mut RedriveResult, mut item: RedriveItem) {
    item.status = ItemStatus::Aborted;
    item.redriven = false;
    item.bypassed = false;
    result.items.push(item);
}

/// Restores every message of `batch` (after an error), recording them as aborted.
async fn restore_all<T: Transport + ?Sized>(
    t: &T,
    dlq: &str,
    batch: &[Delivery],
    result: &mut RedriveResult,
) -> Result<(), TransportError> {
    let mut first_err = None;
    for d in batch {
        let item = match classify(dlq, d.body(), &RedriveOptions::new().dry_run(true)) {
            Classified::Keep(item) | Classified::Ready(item, _) => item,
        };
        match restore(t, d).await {
            Ok(()) => result.restored += 1,
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
        push_aborted(result, item);
    }
    first_err.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(attempts: &str, reason: &str) -> Vec<u8> {
        format!(
            r#"{{"job":"urn:x","trace_id":"t","data":{{"a":1.50}},"meta":{{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":1}},"attempts":{attempts},"extra":[1],"dead_letter":{{"reason":"{reason}","error":null,"exception":null,"failed_at":1,"original_queue":"orig","attempts":3,"lang":"go"}}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn reset_keeps_every_other_field_in_order() {
        let Classified::Ready(item, body) =
            classify("q.dlq", &dead("3", "failed"), &RedriveOptions::new())
        else {
            panic!("redrivable")
        };
        assert_eq!(item.to.as_deref(), Some("orig"));
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"job":"urn:x","trace_id":"t","data":{"a":1.50},"meta":{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":1},"attempts":0,"extra":[1]}"#
        );
    }

    #[test]
    fn the_rules_keep_what_is_not_redrivable() {
        let status = |body: &[u8], o: &RedriveOptions| match classify("q.dlq", body, o) {
            Classified::Keep(i) => i.status,
            Classified::Ready(i, _) => i.status,
        };
        let o = RedriveOptions::new();
        assert_eq!(status(b"\xff not json", &o), ItemStatus::Undecodable);
        assert_eq!(status(b"[1,2]", &o), ItemStatus::Undecodable);
        assert_eq!(
            status(&dead("\"3\"", "failed"), &o),
            ItemStatus::NonNumericAttempts
        );
        assert_eq!(status(&dead("3", "poison"), &o), ItemStatus::Poison);
        assert_eq!(
            status(&dead("3", "failed"), &o.clone().reason("unknown_urn")),
            ItemStatus::NotSelected
        );
        assert_eq!(
            status(&dead("3", "failed"), &o.clone().urn("urn:y")),
            ItemStatus::NotSelected
        );
        assert_eq!(
            status(
                &dead("3", "failed"),
                &o.clone().urn("urn:x").reason("failed")
            ),
            ItemStatus::Redriven
        );
        assert_eq!(
            status(&dead("3", "failed"), &o.clone().select(|_| false)),
            ItemStatus::NotSelected
        );
        assert_eq!(
            status(&dead("3", "failed"), &o.clone().dry_run(true)),
            ItemStatus::Planned
        );
    }

    #[test]
    fn reset_edits_the_text_and_keeps_every_other_byte() {
        let dead = br#"{"job":"urn:x", "trace_id":"t","data":{"amount":4200,"big":92345678901234567890,"z":-0,"e":1.0E2,"d":1,"d":2,"s":"caf\u00e9\/"},"meta":{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":1} ,"attempts" : 3,"extra":[1.10],"dead_letter":{"reason":"failed","error":null,"exception":null,"failed_at":1,"original_queue":"orig","attempts":3,"lang":"go"}}"#;
        let Classified::Ready(item, body) = classify("q.dlq", dead, &RedriveOptions::new()) else {
            panic!("redrivable")
        };
        assert_eq!(item.to.as_deref(), Some("orig"));
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"job":"urn:x", "trace_id":"t","data":{"amount":4200,"big":92345678901234567890,"z":-0,"e":1.0E2,"d":1,"d":2,"s":"caf\u00e9\/"},"meta":{"id":"m","queue":"q","lang":"go","schema_version":1,"created_at":1} ,"attempts" : 0,"extra":[1.10]}"#
        );
    }
}
