//! [`QueueDepth`]: how many messages a queue holds, by state.

/// How many messages a queue holds, by state, as [`Transport::depth`](super::Transport::depth)
/// saw them at one moment.
///
/// ```
/// use babelqueue_core::runtime::{InMemoryTransport, QueueDepth, Transport};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let t = InMemoryTransport::new();
/// t.publish_raw("jobs", b"a".to_vec()).await?;
/// t.publish_raw("jobs", b"b".to_vec()).await?;
/// let _reserved = t.reserve("jobs", std::time::Duration::ZERO).await?;
/// assert_eq!(t.depth("jobs").await?, QueueDepth::new(1, 0, 1));
/// # Ok::<(), babelqueue_core::runtime::TransportError>(())
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
