//! The generic store suite against the embedded SQLite store (blocking and async, seen-set
//! and lease), plus what only a file can show: a restart, tables in one file, WAL mode,
//! and two processes on one file.

use std::path::PathBuf;
use std::time::Duration;

use babelqueue::sqlite::rusqlite;
use babelqueue::sqlite::{SqliteStore, SqliteStoreError};
use babelqueue::testing::{StoreFactory, StoreSpec};
use babelqueue::{LeaseStore, Store, lease::Claim};

fn file_for(namespace: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{namespace}.sqlite3"))
}

fn remove_files(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// A store on `<tmp>/<namespace>.sqlite3`, table `<namespace>`.
struct Sqlite;

impl StoreFactory for Sqlite {
    type Store = SqliteStore;

    async fn create(&self, spec: &StoreSpec) -> SqliteStore {
        let mut b = SqliteStore::builder(file_for(&spec.namespace)).table(&spec.namespace);
        if let Some(ttl) = spec.ttl {
            b = b.ttl(ttl);
        }
        b.open().expect("open the SQLite store")
    }

    fn claim_once<'a>(
        &'a self,
        store: &'a SqliteStore,
        id: &'a str,
    ) -> Option<babelqueue::BoxFuture<'a, bool>> {
        Some(Box::pin(async move {
            store.claim_async(id, None).await.expect("claim")
        }))
    }

    async fn cleanup(&self, spec: &StoreSpec) {
        remove_files(&file_for(&spec.namespace));
    }
}

babelqueue::store_suite! {
    mod sqlite = Sqlite;
    kinds = [async_store, async_lease, sync_store, sync_lease];
}

#[test]
fn lease_across_two_processes() {
    babelqueue::testing::lease_across_processes(Sqlite, "store_sqlite::lease_across_two_processes");
}

#[test]
fn renewed_lease_across_two_processes() {
    babelqueue::testing::renewed_lease_across_processes(
        Sqlite,
        "store_sqlite::renewed_lease_across_two_processes",
    );
}

#[test]
fn a_locked_file_answers_within_the_busy_timeout() -> Result<(), Box<dyn std::error::Error>> {
    let file = Scratch::new();
    let store = SqliteStore::builder(&file.0)
        .busy_timeout(Duration::from_millis(300))
        .open()?;
    // Another connection holds the write lock.
    let locker = rusqlite::Connection::open(&file.0)?;
    locker.execute_batch("BEGIN IMMEDIATE")?;
    let started = std::time::Instant::now();
    let err = store
        .remember("locked-out")
        .expect_err("the file is locked");
    let took = started.elapsed();
    assert!(err.is_timeout(), "{err:?}");
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    let err = LeaseStore::claim(&store, "locked-out", Duration::from_secs(5)).expect_err("locked");
    assert!(err.is_unavailable(), "{err:?}");
    let boxed: babelqueue::BoxError = Box::new(err);
    assert!(babelqueue::store_error::is_unavailable(&*boxed));
    locker.execute_batch("ROLLBACK")?;
    store.remember("locked-out")?;
    assert!(store.seen("locked-out")?);
    Ok(())
}

/// A scratch file removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        Scratch(file_for(&StoreSpec::fresh().namespace))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        remove_files(&self.0);
    }
}

#[test]
fn remembered_ids_survive_a_restart() -> Result<(), SqliteStoreError> {
    let file = Scratch::new();
    {
        let store = SqliteStore::open(&file.0)?;
        store.remember("kept")?;
        store.remember_for("short", Some(Duration::from_millis(300)))?;
        let Claim::Acquired(t) = LeaseStore::claim(&store, "leased", Duration::from_secs(30))?
        else {
            panic!("fresh id must be acquired")
        };
        assert!(store.complete("leased", &t, None)?);
        let Claim::Acquired(_) = LeaseStore::claim(&store, "held", Duration::from_secs(30))? else {
            panic!("fresh id must be acquired")
        };
        // The process "dies" holding "held".
    }
    let store = SqliteStore::open(&file.0)?;
    assert!(store.seen("kept")?, "a remembered id survives the restart");
    assert_eq!(
        LeaseStore::claim(&store, "leased", Duration::from_secs(30))?,
        Claim::Completed
    );
    assert_eq!(
        LeaseStore::claim(&store, "held", Duration::from_secs(30))?,
        Claim::InFlight,
        "a claim survives the restart until its lease ends"
    );
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        !store.seen("short")?,
        "a TTL still expires after the restart"
    );
    Ok(())
}

#[test]
fn tables_in_one_file_are_separate_stores() -> Result<(), SqliteStoreError> {
    let file = Scratch::new();
    let a = SqliteStore::builder(&file.0).table("app_a").open()?;
    let b = SqliteStore::builder(&file.0).table("app_b").open()?;
    a.remember("same-id")?;
    assert!(a.seen("same-id")?);
    assert!(!b.seen("same-id")?, "table app_a leaked into app_b");
    assert!(b.claim("same-id", None)?);
    a.forget("same-id")?;
    assert!(b.seen("same-id")?);
    Ok(())
}

/// `created_at`, `expires_at`, `lease_token`, `lease_expires_at` of one row.
type RawRow = (i64, Option<i64>, Option<String>, Option<i64>);

#[test]
fn file_is_in_wal_mode_with_the_documented_layout() -> Result<(), Box<dyn std::error::Error>> {
    let file = Scratch::new();
    let store = SqliteStore::builder(&file.0)
        .ttl(Duration::from_secs(3600))
        .open()?;
    store.remember("with-ttl")?;
    store.remember_for("default-ttl", None)?;
    let Claim::Acquired(token) = LeaseStore::claim(&store, "in-flight", Duration::from_secs(60))?
    else {
        panic!("fresh id must be acquired")
    };

    let raw = rusqlite::Connection::open(&file.0)?;
    let mode: String = raw.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    assert_eq!(mode, "wal");
    let now = babelqueue::envelope::now_millis();
    let row = |id: &str| -> rusqlite::Result<RawRow> {
        raw.query_row(
            "SELECT created_at, expires_at, lease_token, lease_expires_at \
             FROM babelqueue_idempotency WHERE message_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
    };
    let (created, expires, lease, lease_expires) = row("with-ttl")?;
    assert!(
        (now - created).abs() < 10_000,
        "created_at is Unix ms: {created}"
    );
    let expires = expires.expect("a TTL row has expires_at");
    assert!(
        (expires - created - 3_600_000).abs() < 1_000,
        "expires_at = created_at + TTL"
    );
    assert_eq!((lease, lease_expires), (None, None));
    // `remember_for(None)` uses the store default TTL.
    assert!(row("default-ttl")?.1.is_some());
    let (_, expires, lease, lease_expires) = row("in-flight")?;
    assert_eq!(lease.as_deref(), Some(token.as_str()));
    assert_eq!(
        expires, lease_expires,
        "an in-flight row expires with its lease"
    );
    Ok(())
}

#[test]
fn purge_expired_deletes_only_expired_rows() -> Result<(), SqliteStoreError> {
    let file = Scratch::new();
    let store = SqliteStore::open(&file.0)?;
    store.remember_for("a", Some(Duration::from_millis(50)))?;
    store.remember_for("b", Some(Duration::from_millis(50)))?;
    store.remember("kept")?;
    let _ = LeaseStore::claim(&store, "abandoned", Duration::from_millis(50))?;
    std::thread::sleep(Duration::from_millis(120));
    assert_eq!(store.purge_expired()?, 3);
    assert_eq!(store.purge_expired()?, 0);
    assert!(store.seen("kept")?);
    Ok(())
}

#[test]
fn one_connection_and_many_threads_agree() -> Result<(), SqliteStoreError> {
    // A single pooled connection makes every thread wait for the same mutex; the
    // result must not change with the pool size.
    for connections in [1, 4] {
        let file = Scratch::new();
        let store = SqliteStore::builder(&file.0)
            .connections(connections)
            .open()?;
        let winners = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for i in 0..100 {
                        if store.claim(&format!("id-{i}"), None).expect("claim") {
                            winners.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        assert_eq!(winners.into_inner(), 100, "{connections} connection(s)");
    }
    Ok(())
}

const CLAIM_CHILD: &str = "BQ_SQLITE_CLAIM_CHILD";

/// Two processes claim the same 200 ids on one file: every id has exactly one winner.
#[test]
fn seen_set_claims_across_two_processes() {
    const IDS: usize = 200;
    if let Ok(path) = std::env::var(CLAIM_CHILD) {
        let store = SqliteStore::open(&path).expect("child: open");
        let wins = (0..IDS)
            .filter(|i| store.claim(&format!("id-{i}"), None).expect("child: claim"))
            .count();
        println!("BQ_WINS={wins}");
        return;
    }
    let file = Scratch::new();
    // Create the table first so both children only read and write.
    drop(SqliteStore::open(&file.0).expect("open"));
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "store_sqlite::seen_set_claims_across_two_processes",
                    "--exact",
                    "--nocapture",
                ])
                .env(CLAIM_CHILD, &file.0)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    let mut total = 0;
    for child in children {
        let out = child.wait_with_output().expect("child output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {stdout}");
        total += stdout
            .lines()
            .find_map(|l| l.strip_prefix("BQ_WINS="))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("no result from child: {stdout}"));
    }
    assert_eq!(
        total, IDS,
        "each id claimed exactly once across both processes"
    );
    let store = SqliteStore::open(&file.0).expect("open");
    assert!((0..IDS).all(|i| store.seen(&format!("id-{i}")).expect("seen")));
}
