//! Scheduled, batched deletion of expired rows, on a thread of its own.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{SqliteStore, SqliteStoreError};

/// Rows deleted per statement by [`SqliteStore::spawn_purger`].
pub const DEFAULT_PURGE_BATCH: usize = 1000;

/// What a [`Purger`] has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Completed passes (a pass deletes batches until one comes back short).
    pub passes: u64,
    /// Rows deleted over all passes.
    pub deleted: u64,
    /// The error of the last pass, if it failed (retried at the next interval).
    pub last_error: Option<String>,
}

type Shared = Arc<(Mutex<PurgeReport>, Condvar)>;

/// A background thread deleting expired rows every interval
/// ([`SqliteStore::spawn_purger`]). It runs while this handle lives: dropping it (or
/// [`stop`](Self::stop)) stops the thread after its current batch and joins it.
#[derive(Debug)]
#[must_use = "the purger stops when its handle is dropped"]
pub struct Purger {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    shared: Shared,
}

impl Purger {
    /// What it has done so far.
    pub fn report(&self) -> PurgeReport {
        self.shared
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Blocks until at least `passes` passes have completed (successfully or not).
    pub fn wait_for_passes(&self, passes: u64) -> PurgeReport {
        if self.thread.is_none() {
            // The thread could not be started (logged): no pass will ever come.
            return self.report();
        }
        let (lock, cond) = &*self.shared;
        let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        cond.wait_while(guard, |r| r.passes < passes)
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the thread and waits for it.
    pub fn stop(self) {}
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl SqliteStore {
    /// Deletes up to `limit` expired rows in one statement (one short write transaction)
    /// and returns how many. Blocking.
    pub fn purge_expired_batch(&self, limit: usize) -> Result<usize, SqliteStoreError> {
        self.inner.purge_batch(limit)
    }

    /// Starts a thread that deletes expired rows now and then every `every`, in batches
    /// of [`DEFAULT_PURGE_BATCH`] rows: each batch is its own short write transaction, so
    /// handlers' writes (which wait for SQLite's write lock) get their turn between
    /// batches instead of behind one long delete. A failed pass is logged
    /// (`tracing::warn!`) and retried at the next interval. Needs no async runtime.
    ///
    /// Only rows whose `expires_at` has passed are deleted; rows kept forever stay.
    ///
    /// ```
    /// use std::time::Duration;
    /// let path = std::env::temp_dir().join(format!("bq-doc-purge-{}.db", std::process::id()));
    /// let store = babelqueue_sqlite::SqliteStore::open(&path)?;
    /// let purger = store.spawn_purger(Duration::from_secs(3600));
    /// assert_eq!(purger.wait_for_passes(1).passes, 1); // the first pass runs at once
    /// purger.stop();
    /// # drop(store);
    /// # for ext in ["", "-wal", "-shm"] { let _ = std::fs::remove_file(format!("{}{ext}", path.display())); }
    /// # Ok::<(), babelqueue_sqlite::SqliteStoreError>(())
    /// ```
    pub fn spawn_purger(&self, every: Duration) -> Purger {
        self.spawn_purger_with(every, DEFAULT_PURGE_BATCH)
    }

    /// [`spawn_purger`](Self::spawn_purger) with another batch size.
    pub fn spawn_purger_with(&self, every: Duration, batch: usize) -> Purger {
        let store = self.clone();
        let batch = batch.max(1);
        let shared: Shared = Arc::default();
        let (stop, stopped) = mpsc::channel::<()>();
        let report = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("babelqueue-purge-{}", self.table()))
            .spawn(move || {
                loop {
                    let result = store.purge_pass(batch);
                    if let Err(e) = &result {
                        tracing::warn!(table = store.table(), error = %e, "purging expired ids failed");
                    }
                    {
                        let mut r = report.0.lock().unwrap_or_else(PoisonError::into_inner);
                        r.passes += 1;
                        match &result {
                            Ok(n) => {
                                r.deleted += *n as u64;
                                r.last_error = None;
                            }
                            Err(e) => r.last_error = Some(e.to_string()),
                        }
                    }
                    report.1.notify_all();
                    match stopped.recv_timeout(every) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
            .ok();
        if thread.is_none() {
            tracing::warn!(table = self.table(), "could not start the purge thread");
        }
        Purger {
            stop: Some(stop),
            thread,
            shared,
        }
    }

    fn purge_pass(&self, batch: usize) -> Result<usize, SqliteStoreError> {
        let mut total = 0;
        loop {
            let n = self.purge_expired_batch(batch)?;
            total += n;
            if n < batch {
                return Ok(total);
            }
            std::thread::yield_now();
        }
    }
}
