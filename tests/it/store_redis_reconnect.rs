//! The Redis store after an outage: the first call once the server is back
//! succeeds — no stale connection error, so no extra store backoff in the consumer. Its own
//! `redis-server` on port 17450, killed and restarted by pid.

use crate::fleet_support;

use std::time::Duration;

use babelqueue::AsyncStore;
use babelqueue::redis::RedisStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server on the PATH (starts its own on port 17450); CI runs it with --ignored"]
async fn the_first_call_after_the_server_is_back_succeeds() {
    let mut server = tokio::task::spawn_blocking(|| fleet_support::RedisServer::start(17450, &[]))
        .await
        .unwrap();
    let store = RedisStore::builder(server.url())
        .prefix("bq-test:reconnect:")
        .connection_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    store.remember("before").await.unwrap();
    for round in 0..3 {
        server = tokio::task::spawn_blocking(move || {
            server.kill();
            server
        })
        .await
        .unwrap();
        let down = store.seen("during").await;
        assert!(
            down.as_ref().is_err_and(|e| e.is_unavailable()),
            "round {round}: a call during the outage is `unavailable`: {down:?}"
        );
        server = tokio::task::spawn_blocking(move || {
            server.restart();
            server
        })
        .await
        .unwrap();
        // The server answers PING again (restart waited for it): the very next call works.
        assert_eq!(
            store.seen("before").await.map_err(|e| e.to_string()),
            Ok(false),
            "round {round}: the first call after the outage (nothing on disk: a fresh server)"
        );
        store.remember("before").await.unwrap();
    }
    server.kill();
}
