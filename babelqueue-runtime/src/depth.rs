//! [`QueueDepth`]: how many messages a queue holds, by state.

/// How many messages a queue holds, by state, as [`Transport::depth`](super::Transport::depth)
/// saw them at one moment.
///
/// ```
/// use babelqueue_runtime::{InMemoryTransport, QueueDepth, Transport};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let t = InMemoryTransport::new();
/// t.publish_raw("jobs", b"a".to_vec()).await?;
/// t.publish_raw("jobs", b"b".to_vec()).await?;
/// let _reserved = t.reserve("jobs", std::time::Duration::ZERO).await?;
/// assert_eq!(t.depth("jobs").await?, QueueDepth::new(1, 0, 1));
/// # Ok::<(), babelqueue_runtime::TransportError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueDepth {
    /// Waiting to be reserved.
    pub ready: u64,
    /// Waiting for a retry or deferral delay to pass.
    pub delayed: u64,
    /// Reserved and not yet settled, by every consumer of the queue.
    pub in_flight: u64,
}

impl QueueDepth {
    /// A depth (the struct is `#[non_exhaustive]`, so other crates build it here).
    pub fn new(ready: u64, delayed: u64, in_flight: u64) -> Self {
        QueueDepth {
            ready,
            delayed,
            in_flight,
        }
    }
}

/// Messages in flight with *another* consumer of a queue, in its own list
/// ([`Transport::held_elsewhere`](super::Transport::held_elsewhere)): what a one-shot
/// [`drain`](super::App::drain) waits for before it ends, and reports in
/// [`Stats::left_in_flight`](super::Stats::left_in_flight) when the wait ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldElsewhere {
    /// The consumer's id (Redis: its processing list is `{<queue>}:processing:<id>`).
    pub consumer: String,
    /// How many messages its list holds.
    pub messages: u64,
    /// How long until its heartbeat expires as registered (zero: already expired, or it
    /// left with messages: the next recovery pass returns them to the queue).
    pub expires_in: std::time::Duration,
}

impl HeldElsewhere {
    /// The messages `consumer` holds (the struct is `#[non_exhaustive]`, so other crates
    /// build it here).
    pub fn new(
        consumer: impl Into<String>,
        messages: u64,
        expires_in: std::time::Duration,
    ) -> Self {
        HeldElsewhere {
            consumer: consumer.into(),
            messages,
            expires_in,
        }
    }
}
