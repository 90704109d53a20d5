//! The background work of the list-based transports (Redis, in-memory): a heartbeat, the
//! recovery of dead consumers' in-flight messages, and the promotion of due delayed
//! messages. A transport that needs it starts it from its own
//! [`Transport::start_consumer`] and stops it in [`Transport::leave`]; the runtime's
//! worker loop knows nothing of it. Brokers that redeliver and delay natively (RabbitMQ,
//! SQS, Kafka) do not use it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::transport::{ConsumerEvent, ConsumerOptions, Delivery, Transport, TransportError};
use crate::handler::BoxFuture;

/// Delayed messages promoted per call.
const PROMOTE_BATCH: usize = 1000;

/// What one recovery pass did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Recovered {
    /// Messages of dead consumers put back on the queue.
    pub requeued: usize,
    /// Messages recovered too many times: moved into this consumer's in-flight state, for
    /// the runtime to dead-letter (and ack).
    pub exhausted: Vec<Delivery>,
}

impl Recovered {
    /// A result (the struct is `#[non_exhaustive]`, so other crates build it here).
    pub fn new(requeued: usize, exhausted: Vec<Delivery>) -> Self {
        Recovered {
            requeued,
            exhausted,
        }
    }
}

/// The two operations of a list-based transport that only its own background work calls:
/// liveness and recovery. (Promotion uses [`Transport::promote_due`] and
/// [`Transport::next_due`].)
pub trait ListMaintenance: Transport + Clone {
    /// Renews this consumer's heartbeat on `queue`, valid for `ttl`.
    fn heartbeat<'a>(
        &'a self,
        queue: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Recovers the in-flight messages of consumers of `queue` whose heartbeat expired
    /// (never those of a live consumer): each is put back on the queue, except one already
    /// recovered `max_recoveries` times, which is moved into **this** consumer's in-flight
    /// state and returned in [`Recovered::exhausted`]. Safe when several consumers recover
    /// at once.
    fn recover<'a>(
        &'a self,
        queue: &'a str,
        max_recoveries: u32,
    ) -> BoxFuture<'a, Result<Recovered, TransportError>>;
}

/// A running maintenance task of one consumer on one queue.
///
/// ```
/// use babelqueue_runtime::{ConsumerOptions, InMemoryTransport, Transport};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let t = InMemoryTransport::new();
/// // `start_consumer` starts it (heartbeat, recovery, promotion); `leave` stops it.
/// t.start_consumer("jobs", &ConsumerOptions::new(1)).await?;
/// t.leave("jobs").await?;
/// # Ok::<(), babelqueue_runtime::TransportError>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Maintenance {
    wake: Arc<Notify>,
    stop: Arc<(AtomicBool, Notify)>,
    task: Option<JoinHandle<()>>,
}

/// Reports a recovery pass to the runtime.
fn report(options: &ConsumerOptions, recovered: Result<Recovered, TransportError>) {
    let events = options.events();
    match recovered {
        Ok(r) => {
            if r.requeued > 0 {
                events.send(ConsumerEvent::Recovered(r.requeued));
            }
            for d in r.exhausted {
                events.send(ConsumerEvent::Exhausted(d, options.max_recoveries()));
            }
        }
        Err(e) => events.send(ConsumerEvent::Error(e)),
    }
}

impl Maintenance {
    /// Registers the consumer (a first heartbeat), takes back what dead consumers left
    /// (one recovery pass, before the first reserve), then runs the rest in a task:
    /// heartbeats every [`ConsumerOptions::heartbeat_interval`], recovery every
    /// [`ConsumerOptions::recovery_interval`], promotion when the earliest delayed message
    /// is due. Failures are reported as [`ConsumerEvent::Error`] and tried again.
    pub async fn start<T: ListMaintenance>(
        transport: T,
        queue: &str,
        options: &ConsumerOptions,
    ) -> Maintenance {
        if let Err(e) = transport.heartbeat(queue, options.heartbeat_ttl()).await {
            options.events().send(ConsumerEvent::Error(e));
        }
        report(
            options,
            transport.recover(queue, options.max_recoveries()).await,
        );
        let wake = Arc::new(Notify::new());
        let stop = Arc::new((AtomicBool::new(false), Notify::new()));
        let task = tokio::spawn(run(
            transport,
            queue.to_owned(),
            options.clone(),
            Arc::clone(&wake),
            Arc::clone(&stop),
        ));
        Maintenance {
            wake,
            stop,
            task: Some(task),
        }
    }

    /// A delayed message was added: look at the earliest due time again.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Stops the task and waits for it.
    pub async fn stop(mut self) {
        self.stop.0.store(true, Ordering::SeqCst);
        self.stop.1.notify_one();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn run<T: ListMaintenance>(
    t: T,
    queue: String,
    options: ConsumerOptions,
    wake: Arc<Notify>,
    stop: Arc<(AtomicBool, Notify)>,
) {
    let queue = queue.as_str();
    let events = options.events();
    let retry = options.backoff_max_delay().min(Duration::from_secs(1));
    let now = Instant::now();
    let mut next_heartbeat = now + options.heartbeat_interval();
    let mut next_recovery = now + options.recovery_interval();
    // Promotion failed: not before this.
    let mut promote_after: Option<Instant> = None;
    loop {
        if stop.0.load(Ordering::SeqCst) {
            return;
        }
        let due = match t.next_due(queue).await {
            Ok(due) => due.map(|d| Instant::now() + d),
            Err(e) => {
                events.send(ConsumerEvent::Error(e));
                Some(Instant::now() + retry)
            }
        };
        let due = match (due, promote_after) {
            (Some(d), Some(p)) => Some(d.max(p)),
            (d, _) => d,
        };
        let mut at = next_heartbeat.min(next_recovery);
        if let Some(d) = due {
            at = at.min(d);
        }
        tokio::select! {
            () = tokio::time::sleep_until(at) => {}
            () = wake.notified() => {}
            () = stop.1.notified() => return,
        }
        if stop.0.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        if now >= next_heartbeat {
            if let Err(e) = t.heartbeat(queue, options.heartbeat_ttl()).await {
                events.send(ConsumerEvent::Error(e));
            }
            next_heartbeat = now + options.heartbeat_interval();
        }
        if now >= next_recovery {
            report(&options, t.recover(queue, options.max_recoveries()).await);
            next_recovery = Instant::now() + options.recovery_interval();
        }
        if due.is_some_and(|d| d <= now) {
            promote_after = None;
            loop {
                match t.promote_due(queue, PROMOTE_BATCH).await {
                    Ok(n) if n >= PROMOTE_BATCH => continue,
                    Ok(n) => {
                        if n > 0 {
                            events.send(ConsumerEvent::Ready);
                        }
                        break;
                    }
                    Err(e) => {
                        events.send(ConsumerEvent::Error(e));
                        promote_after = Some(Instant::now() + retry);
                        break;
                    }
                }
            }
        }
    }
}
