//! Scheduled, batched deletion of expired rows.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::store::{PostgresStore, PostgresStoreError};

/// Rows deleted per statement by [`PostgresStore::spawn_purger`].
pub const DEFAULT_PURGE_BATCH: i64 = 1000;

/// What a [`Purger`] has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Completed passes (a pass deletes batches until one comes back short).
    pub passes: u64,
    /// Rows deleted over all passes.
    pub deleted: u64,
    /// The error of the last failed pass, if the last pass failed (it is retried at the
    /// next interval).
    pub last_error: Option<String>,
}

/// A background task deleting expired rows every interval
/// ([`PostgresStore::spawn_purger`]). It runs while this handle lives: dropping it (or
/// [`stop`](Self::stop)) ends the task.
#[derive(Debug)]
#[must_use = "the purger stops when its handle is dropped"]
pub struct Purger {
    task: JoinHandle<()>,
    report: watch::Receiver<PurgeReport>,
}

impl Purger {
    /// What it has done so far.
    pub fn report(&self) -> PurgeReport {
        self.report.borrow().clone()
    }

    /// Waits until at least `passes` passes have completed (successfully or not).
    pub async fn wait_for_passes(&self, passes: u64) -> PurgeReport {
        let mut rx = self.report.clone();
        match rx.wait_for(|r| r.passes >= passes).await {
            Ok(r) => r.clone(),
            // The task ended (it only does when aborted): report what it did.
            Err(_) => self.report(),
        }
    }

    /// Stops the task (a batch in progress is abandoned; its statement is rolled back).
    pub fn stop(self) {}
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PostgresStore {
    /// Deletes up to `limit` expired rows in one statement and returns how many. Rows
    /// locked by a transaction in progress (a transactional handler taking an expired id
    /// over) are skipped (`FOR UPDATE SKIP LOCKED`), so this never waits on a handler.
    pub async fn purge_expired_batch(&self, limit: i64) -> Result<u64, PostgresStoreError> {
        self.execute("purge", &self.ext.purge_batch, &[&limit.max(1)])
            .await
    }

    /// Starts a tokio task that deletes expired rows now and then every `every`, in
    /// batches of [`DEFAULT_PURGE_BATCH`] rows (one short statement each, so handlers'
    /// statements interleave and a large backlog never holds a long lock). A failed pass
    /// is logged (`tracing::warn!`) and retried at the next interval. Runs while the
    /// returned [`Purger`] lives.
    ///
    /// Only rows whose `expires_at` has passed are deleted (every row this library writes
    /// has one, by default [`babelqueue_core::retention::DEFAULT_RETENTION`] ahead); rows without an
    /// expiry (kept forever, or written so by another SDK) stay.
    ///
    /// ```no_run
    /// # async fn demo(store: babelqueue_postgres::PostgresStore) {
    /// let purger = store.spawn_purger(std::time::Duration::from_secs(3600));
    /// // … serve; the purger stops when `purger` is dropped.
    /// # drop(purger);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime (it spawns a task, like `tokio::spawn`).
    pub fn spawn_purger(&self, every: Duration) -> Purger {
        self.spawn_purger_with(every, DEFAULT_PURGE_BATCH)
    }

    /// [`spawn_purger`](Self::spawn_purger) with another batch size.
    pub fn spawn_purger_with(&self, every: Duration, batch: i64) -> Purger {
        let store = self.clone();
        let batch = batch.max(1);
        let (tx, rx) = watch::channel(PurgeReport::default());
        let tx = Arc::new(tx);
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every.max(Duration::from_millis(1)));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let result = store.purge_pass(batch).await;
                if let Err(e) = &result {
                    tracing::warn!(table = %store.table(), error = %e, "purging expired ids failed");
                }
                tx.send_modify(|r| {
                    r.passes += 1;
                    match &result {
                        Ok(n) => {
                            r.deleted += n;
                            r.last_error = None;
                        }
                        Err(e) => r.last_error = Some(e.to_string()),
                    }
                });
            }
        });
        Purger { task, report: rx }
    }

    async fn purge_pass(&self, batch: i64) -> Result<u64, PostgresStoreError> {
        let mut total = 0;
        loop {
            let n = self.purge_expired_batch(batch).await?;
            total += n;
            if n < batch as u64 {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }
}
