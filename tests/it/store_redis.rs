//! The generic store suite against the Redis store, over a real Redis, plus the
//! cross-SDK layout checks with a raw client (what the Go SDK writes and reads).
//!
//! Every test needs Redis (`BABELQUEUE_REDIS_URL`, default `redis://127.0.0.1:6379/0`)
//! and fails when it is unreachable; they are ignored by default and CI runs them with
//! `--include-ignored`.

use std::time::Duration;

use babelqueue::redis::redis::{self, AsyncCommands};
use babelqueue::redis::{RedisStore, RedisStoreError};
use babelqueue::testing::{StoreFactory, StoreSpec};
use babelqueue::{AsyncLeaseStore, AsyncStore, Guard, InFlight, Outcome, lease::Claim};

fn url() -> String {
    std::env::var("BABELQUEUE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(url())
        .expect("Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("Redis must be reachable at BABELQUEUE_REDIS_URL (default 127.0.0.1:6379)")
}

fn prefix(spec: &StoreSpec) -> String {
    format!("{}:bq:idemp:", spec.namespace)
}

/// A store whose prefix is `<namespace>:bq:idemp:`.
struct Redis;

impl StoreFactory for Redis {
    type Store = RedisStore;

    async fn create(&self, spec: &StoreSpec) -> RedisStore {
        let mut b = RedisStore::builder(url()).prefix(prefix(spec));
        if let Some(ttl) = spec.ttl {
            b = b.ttl(ttl);
        }
        b.connect()
            .await
            .expect("Redis must be reachable at BABELQUEUE_REDIS_URL (default 127.0.0.1:6379)")
    }

    fn claim_once<'a>(
        &'a self,
        store: &'a RedisStore,
        id: &'a str,
    ) -> Option<babelqueue::BoxFuture<'a, bool>> {
        Some(Box::pin(async move {
            store.claim(id, None).await.expect("SET NX")
        }))
    }

    async fn cleanup(&self, spec: &StoreSpec) {
        delete_matching(&format!("{}:*", spec.namespace)).await;
    }
}

async fn delete_matching(pattern: &str) {
    let mut conn = raw().await;
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        if !keys.is_empty() {
            let _: i64 = conn.del(keys).await.expect("DEL");
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

babelqueue::store_suite! {
    #[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
    mod redis_suite = Redis;
    kinds = [async_store, async_lease];
}

#[test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
fn lease_across_two_processes() {
    babelqueue::testing::lease_across_processes(Redis, "store_redis::lease_across_two_processes");
}

fn unique_id() -> String {
    format!("rs-layout-{}", uuid::Uuid::new_v4())
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn remember_writes_exactly_the_spec_key_and_value() -> Result<(), RedisStoreError> {
    // The default prefix, as every SDK uses it; unique ids keep parallel runs apart.
    let store = RedisStore::builder(url()).keep_forever().connect().await?; // no PX, as Go writes by default
    let mut conn = raw().await;
    let (plain, with_ttl) = (unique_id(), unique_id());

    store.remember(&plain).await?;
    let key = format!("bq:idemp:{plain}");
    assert_eq!(store.key(&plain), key);
    let value: Option<String> = conn.get(&key).await?;
    assert_eq!(value.as_deref(), Some("1"), "value is exactly 1");
    let pttl: i64 = conn.pttl(&key).await?;
    assert_eq!(pttl, -1, "no TTL: the key never expires");

    store
        .remember_for(&with_ttl, Some(Duration::from_secs(60)))
        .await?;
    let key2 = format!("bq:idemp:{with_ttl}");
    let value: Option<String> = conn.get(&key2).await?;
    assert_eq!(value.as_deref(), Some("1"));
    let pttl: i64 = conn.pttl(&key2).await?;
    assert!(
        (55_000..=60_000).contains(&pttl),
        "PX 60000 set with the value: PTTL {pttl}"
    );

    // remember is SET NX: a second remember neither rewrites the value nor the TTL.
    let _: () = conn.set(&key, "written-by-someone-else").await?;
    store.remember(&plain).await?;
    let value: Option<String> = conn.get(&key).await?;
    assert_eq!(value.as_deref(), Some("written-by-someone-else"));

    store.forget(&plain).await?;
    let exists: i64 = conn.exists(&key).await?;
    assert_eq!(exists, 0, "forget is DEL");
    let _: i64 = conn.del(&key2).await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_key_written_the_go_way_is_seen_and_never_claimed() -> Result<(), RedisStoreError> {
    let store = RedisStore::connect(&url()).await?;
    let mut conn = raw().await;
    let id = unique_id();
    let key = format!("bq:idemp:{id}");
    // What the Go SDK's Remember sends.
    let reply: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg("1")
        .arg("NX")
        .query_async(&mut conn)
        .await?;
    assert_eq!(reply.as_deref(), Some("OK"));

    assert!(store.seen(&id).await?, "a Go-remembered id is seen");
    assert!(!store.claim(&id, None).await?, "and never claimed again");
    assert_eq!(
        AsyncLeaseStore::claim(&store, &id, Duration::from_secs(30)).await?,
        Claim::Completed,
        "lease mode treats it as completed"
    );
    let mut ran = false;
    let out = Guard::new(&store)
        .lease(Duration::from_secs(30))
        .run_async(id.as_str(), async {
            ran = true;
            Ok::<(), babelqueue::BoxError>(())
        })
        .await
        .map(Outcome::from)
        .map_err(|e| e.to_string());
    assert_eq!(out, Ok(Outcome::Skipped));
    assert!(!ran, "a Go-remembered id must not run");
    store.forget(&id).await?;
    let exists: i64 = conn.exists(&key).await?;
    assert_eq!(exists, 0);
    Ok(())
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn lease_states_as_another_sdk_sees_them() -> Result<(), RedisStoreError> {
    let store = RedisStore::builder(url()).keep_forever().connect().await?; // no PX, as Go writes by default
    let mut conn = raw().await;
    let id = unique_id();
    let key = format!("bq:idemp:{id}");

    let Claim::Acquired(token) =
        AsyncLeaseStore::claim(&store, &id, Duration::from_secs(30)).await?
    else {
        panic!("a fresh id must be acquired")
    };
    // In flight: value lease:<token>, expiring with the lease.
    let value: Option<String> = conn.get(&key).await?;
    assert_eq!(value, Some(format!("lease:{token}")));
    let pttl: i64 = conn.pttl(&key).await?;
    assert!(
        (25_000..=30_000).contains(&pttl),
        "the claim expires with its lease: {pttl}"
    );
    // A Go consumer meanwhile: EXISTS says seen (it skips its copy); its SET NX is a no-op.
    let exists: i64 = conn.exists(&key).await?;
    assert_eq!(exists, 1);
    let go_remember: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg("1")
        .arg("NX")
        .query_async(&mut conn)
        .await?;
    assert_eq!(
        go_remember, None,
        "a Go SET NX cannot overwrite a held claim"
    );

    // Completed with a TTL: exactly what the Go SDK writes with PX.
    assert!(
        store
            .complete(&id, &token, Some(Duration::from_secs(60)))
            .await?
    );
    let value: Option<String> = conn.get(&key).await?;
    assert_eq!(value.as_deref(), Some("1"));
    let pttl: i64 = conn.pttl(&key).await?;
    assert!((55_000..=60_000).contains(&pttl), "PTTL {pttl}");

    // Completed without a TTL: persistent, like SET key 1 NX.
    let id2 = unique_id();
    let key2 = format!("bq:idemp:{id2}");
    let Claim::Acquired(t2) = AsyncLeaseStore::claim(&store, &id2, Duration::from_secs(30)).await?
    else {
        panic!("a fresh id must be acquired")
    };
    assert!(store.complete(&id2, &t2, None).await?);
    let pttl: i64 = conn.pttl(&key2).await?;
    assert_eq!(pttl, -1);

    // Released: the key is gone, every SDK runs the next delivery.
    let id3 = unique_id();
    let key3 = format!("bq:idemp:{id3}");
    let Claim::Acquired(t3) = AsyncLeaseStore::claim(&store, &id3, Duration::from_secs(30)).await?
    else {
        panic!("a fresh id must be acquired")
    };
    assert!(store.release(&id3, &t3).await?);
    let exists: i64 = conn.exists(&key3).await?;
    assert_eq!(exists, 0);

    let _: i64 = conn.del(&[key, key2]).await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn in_flight_is_a_typed_error_and_the_holder_is_not_disturbed() -> Result<(), RedisStoreError>
{
    let store = RedisStore::builder(url())
        .prefix(format!("{}:bq:idemp:", StoreSpec::fresh().namespace))
        .connect()
        .await?;
    let Claim::Acquired(token) =
        AsyncLeaseStore::claim(&store, "busy", Duration::from_secs(30)).await?
    else {
        panic!("a fresh id must be acquired")
    };
    #[derive(Debug)]
    enum HandlerError {
        Busy(InFlight),
        #[allow(dead_code)]
        Store(RedisStoreError),
    }
    impl From<InFlight> for HandlerError {
        fn from(e: InFlight) -> Self {
            HandlerError::Busy(e)
        }
    }
    impl From<RedisStoreError> for HandlerError {
        fn from(e: RedisStoreError) -> Self {
            HandlerError::Store(e)
        }
    }
    let mut ran = false;
    let out = Guard::new(&store)
        .lease(Duration::from_secs(30))
        .run_async("busy", async {
            ran = true;
            Ok::<(), HandlerError>(())
        })
        .await;
    assert!(!ran, "an in-flight id must not run");
    match out {
        Err(HandlerError::Busy(InFlight { id })) => assert_eq!(id, "busy"),
        other => panic!("expected InFlight, got {other:?}"),
    }
    assert!(
        store.complete("busy", &token, None).await?,
        "the holder still completes"
    );
    store.forget("busy").await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn password_urls_authenticate() -> Result<(), RedisStoreError> {
    // A throwaway ACL user, so the shared server's default user is left alone.
    let mut admin = raw().await;
    let user = format!("bq_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let password = "s3cret-pässword";
    let ns = StoreSpec::fresh().namespace;
    let _: String = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(format!(">{password}"))
        .arg(format!("~{ns}:*"))
        .arg("+@all")
        .query_async(&mut admin)
        .await?;

    let base = url();
    let host = base
        .strip_prefix("redis://")
        .and_then(|rest| rest.rsplit_once('@').map(|(_, h)| h).or(Some(rest)))
        .unwrap_or("127.0.0.1:6379/0")
        .to_owned();
    let good = format!("redis://{user}:s3cret-p%C3%A4ssword@{host}");
    let good_result = async {
        let store = RedisStore::builder(&good)
            .prefix(format!("{ns}:bq:idemp:"))
            .connect()
            .await?;
        store.remember("authed").await?;
        let seen = store.seen("authed").await?;
        store.forget("authed").await?;
        Ok::<bool, RedisStoreError>(seen)
    }
    .await;
    let bad = RedisStore::builder(format!("redis://{user}:wrong@{host}"))
        .prefix(format!("{ns}:bq:idemp:"))
        .retries(0)
        .connect()
        .await;
    let _: i64 = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async(&mut admin)
        .await?;

    // (Deleting the user closed its connections; everything was checked before.)
    assert!(
        good_result?,
        "remembered through the authenticated connection"
    );
    let err = bad.expect_err("a wrong password must not connect");
    // The store's message names its level; Redis's reason is in the source chain.
    let mut chain = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(c) = cause {
        chain = format!("{chain}: {c}");
        cause = c.source();
    }
    let chain = chain.to_lowercase();
    assert!(
        chain.contains("auth") || chain.contains("password"),
        "{chain}"
    );
    Ok(())
}

#[tokio::test]
async fn an_unreachable_server_is_an_error() {
    let err = RedisStore::builder("redis://127.0.0.1:1/0")
        .retries(1)
        .connect()
        .await
        .expect_err("nothing listens on port 1");
    assert!(err.is_unavailable(), "{err:?}");
}

#[test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
fn renewed_lease_across_two_processes() {
    babelqueue::testing::renewed_lease_across_processes(
        Redis,
        "store_redis::renewed_lease_across_two_processes",
    );
}

/// A plain `redis-server` of this test on its own port (range 17400-17449), killed on
/// drop (also when the test panics).
struct OwnRedis {
    child: std::process::Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl OwnRedis {
    fn start(port: u16) -> Self {
        let dir = std::env::temp_dir().join(format!("bq-own-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be on PATH");
        let server = OwnRedis { child, dir, port };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not start on port {port}");
    }

    fn signal(&self, sig: &str) {
        let st = std::process::Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "kill {sig}");
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
#[ignore = "needs redis-server on PATH (starts its own on port 17401); CI runs it with --include-ignored"]
async fn a_frozen_server_answers_within_the_response_timeout() -> Result<(), RedisStoreError> {
    let server = OwnRedis::start(17401);
    let store = RedisStore::builder(format!("redis://127.0.0.1:{}/0", server.port))
        .response_timeout(Duration::from_millis(300))
        .connection_timeout(Duration::from_millis(300))
        .retries(0)
        .connect()
        .await?;
    store.remember("before").await?;
    // The server stops answering (SIGSTOP): the connection stays open, no reply comes.
    server.signal("-STOP");
    let started = std::time::Instant::now();
    let err = store.seen("before").await.expect_err("a frozen server");
    let took = started.elapsed();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(err.is_timeout(), "{err:?}");
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    let boxed: babelqueue::BoxError = Box::new(err);
    assert!(babelqueue::store_error::is_unavailable(&*boxed));
    server.signal("-CONT");
    // The connection manager reconnects on its own.
    let mut seen = Err(RedisStoreError::UnexpectedReply {
        script: "none",
        reply: 0,
    });
    for _ in 0..50 {
        seen = store.seen("before").await;
        if seen.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen?, "remembered before the freeze");
    Ok(())
}

/// Redis Cluster's slot of a key: CRC16 (XMODEM) of its hash tag (the bytes between the
/// first `{` and the next `}`, if not empty) or of the whole key, modulo 16384.
fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = key
        .find('{')
        .and_then(|open| key[open + 1..].find('}').map(|len| (open + 1, len)))
        .filter(|&(_, len)| len > 0)
        .map_or(bytes, |(start, len)| &bytes[start..start + len]);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[test]
fn key_slot_matches_the_cluster_spec() {
    // The examples of the Redis Cluster specification.
    assert_eq!(key_slot("123456789"), 0x31C3 & 0x3FFF); // CRC16 0x31C3, slot 12739
    assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
    assert_ne!(key_slot("foo{}{bar}"), key_slot("bar"));
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn the_fencing_counter_shares_the_key_slot_and_expires() -> Result<(), RedisStoreError> {
    let store = RedisStore::builder(url())
        .prefix(format!("bqt:{}:", uuid::Uuid::new_v4().simple()))
        .connect()
        .await?;
    let id = unique_id();
    let Claim::Acquired(t) = AsyncLeaseStore::claim(&store, &id, Duration::from_secs(30)).await?
    else {
        panic!("fresh id")
    };
    let mut c = raw().await;
    let fence_key = store.fence_key(&id);
    let (value, pttl): (u64, i64) = redis::pipe()
        .get(&fence_key)
        .cmd("PTTL")
        .arg(&fence_key)
        .query_async(&mut c)
        .await?;
    assert_eq!(Some(value), t.fence());
    assert!(
        pttl > 6 * 24 * 3600 * 1000,
        "kept about 7 days, not forever: {pttl}"
    );
    let (a, b) = (key_slot(&store.key(&id)), key_slot(&fence_key));
    assert_eq!(a, b, "the counter lives in the key's cluster slot");
    assert!(AsyncLeaseStore::complete(&store, &id, &t, None).await?);
    let _: i64 = redis::cmd("DEL")
        .arg(store.key(&id))
        .arg(&fence_key)
        .query_async(&mut c)
        .await?;
    Ok(())
}

/// A TLS-only `redis-server` on a free port with a throwaway CA; killed and cleaned up
/// on drop.
struct TlsRedis {
    child: std::process::Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl TlsRedis {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("bq-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let openssl = |args: &[&str]| {
            let st = std::process::Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .expect("openssl must be on PATH");
            assert!(st.success(), "openssl {args:?}");
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=babelqueue-test-ca",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write san.ext");
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "san.ext",
        ]);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args([
                "--tls-cert-file",
                "server.crt",
                "--tls-key-file",
                "server.key",
            ])
            .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be on PATH");
        let server = TlsRedis { child, dir, port };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the TLS redis-server did not start (built without TLS?)");
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
#[ignore = "needs redis-server (built with TLS) and openssl on PATH; CI runs it with --include-ignored"]
async fn rediss_urls_connect_over_tls() -> Result<(), RedisStoreError> {
    let server = TlsRedis::start();
    let url = format!("rediss://127.0.0.1:{}/0", server.port);
    let ca = std::fs::read(server.dir.join("ca.crt")).expect("ca.crt");
    // A TLS client built by hand: the provider first (the build also enables rustls'
    // aws-lc-rs feature, through the AWS SDK, so rustls cannot pick one by itself).
    babelqueue::redis::install_crypto_provider();

    // Trusting the test CA: a working store over TLS.
    let client = redis::Client::build_with_tls(
        url.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        },
    )?;
    let store = RedisStore::from_client(client).await?;
    store.remember("over-tls").await?;
    assert!(store.seen("over-tls").await?);
    let Claim::Acquired(t) =
        AsyncLeaseStore::claim(&store, "lease-over-tls", Duration::from_secs(5)).await?
    else {
        panic!("a fresh id must be acquired")
    };
    assert!(store.complete("lease-over-tls", &t, None).await?);

    // A plain rediss:// URL verifies against the system roots, which do not know the
    // test CA: an error (not a panic, not a silent plaintext fallback).
    let err = RedisStore::builder(&url)
        .retries(0)
        .connect()
        .await
        .expect_err("an unknown CA must be rejected");
    assert!(matches!(err, RedisStoreError::Redis(_)), "{err:?}");
    Ok(())
}
