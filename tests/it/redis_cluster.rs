//! The Redis transport and store on a real local Redis Cluster: three masters started by
//! the test (`redis-server --cluster-enabled yes` on ports 17200-17202, cluster bus
//! 27200-27202), joined with `redis-cli --cluster create`, killed by pid at the end.
//! Produce, consume, retry (the delayed set), recover (a dead consumer's list) and dedupe
//! (the store on the cluster connection). Every key of a queue is in the queue's slot.

use crate::fleet_support;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use babelqueue::redis::redis;
use babelqueue::redis::{
    RedisConnection, RedisStore, RedisStoreError, RedisTransport, consumer_processing_list,
    consumers_registry, delayed_set, hash_slot, heartbeat_key, recoveries_hash,
};
use babelqueue::runtime::{ListMaintenance, RetryPolicy, Transport};
use babelqueue::{App, AsyncStore, Envelope, Guard};
use fleet_support::RedisServer;
use serde_json::json;

const CHARGE: &str = "urn:babel:payments:charge";
const PORTS: [u16; 3] = [17200, 17201, 17202];

struct Cluster {
    nodes: Vec<RedisServer>,
}

impl Cluster {
    fn start() -> Self {
        let nodes: Vec<RedisServer> = PORTS
            .iter()
            .map(|&p| {
                let conf = format!("nodes-{p}.conf");
                RedisServer::start(
                    p,
                    &["--cluster-enabled", "yes", "--cluster-config-file", &conf],
                )
            })
            .collect();
        let addrs: Vec<String> = PORTS.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli on PATH");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        for p in PORTS {
            loop {
                let info: String = redis::Client::open(format!("redis://127.0.0.1:{p}"))
                    .unwrap()
                    .get_connection()
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c))
                    .unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster not ok on {p}: {info}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Cluster { nodes }
    }

    fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("the dedupe store failed")]
    Store(#[from] RedisStoreError),
    #[error("gateway hiccup")]
    Hiccup,
}

async fn keyslot(conn: &mut RedisConnection, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "starts a 3-master Redis Cluster on ports 17200-17202 (cluster bus 27200-27202); CI runs it with --ignored"]
async fn produce_consume_retry_recover_and_dedupe_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let urls = cluster.urls();
    let mut conn = RedisConnection::cluster(urls.clone()).await.unwrap();
    assert!(conn.is_cluster());

    // Queues spread over the three masters; every key of a queue in the queue's slot.
    let queues: Vec<String> = ["payments-0", "payments-1", "orders"]
        .map(String::from)
        .to_vec();
    // `redis-cli --cluster create` gives the three masters 0-5460, 5461-10922, 10923-16383.
    let mut masters: Vec<u16> = queues.iter().map(|q| hash_slot(q) / 5461).collect();
    masters.sort();
    assert_eq!(masters, [0, 1, 2], "one queue per master");
    for q in &queues {
        let slot = keyslot(&mut conn, q).await;
        assert_eq!(slot, hash_slot(q));
        for k in [
            consumer_processing_list(q, "c1"),
            delayed_set(q),
            consumers_registry(q),
            heartbeat_key(q, "c1"),
            recoveries_hash(q),
        ] {
            assert_eq!(keyslot(&mut conn, &k).await, slot, "{k}");
        }
    }

    // Dedupe: the store on the cluster connection.
    let store = RedisStore::from_connection(conn.clone()).with_prefix("bq:idemp:");
    assert!(!store.seen("cluster-id-1").await.unwrap());
    store.remember("cluster-id-1").await.unwrap();
    assert!(store.seen("cluster-id-1").await.unwrap());

    // Produce and consume with duplicates, through the store; one failure retried through
    // the delayed set.
    let charges = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    for q in &queues {
        let transport = RedisTransport::open_cluster(urls.clone()).unwrap();
        let (c, f, s) = (charges.clone(), failures.clone(), store.clone());
        let app = App::new(transport.clone())
            .queue(q)
            .retry(
                RetryPolicy::default()
                    .initial(Duration::from_millis(100))
                    .jitter(0.0),
            )
            .route_async(CHARGE, move |env: Envelope| {
                let (c, f, s) = (c.clone(), f.clone(), s.clone());
                async move {
                    Guard::new(&s)
                        .run_async(&env, async {
                            if env.data["fail_once"] == true
                                && f.fetch_add(1, Ordering::SeqCst) == 0
                            {
                                return Err(ChargeError::Hiccup);
                            }
                            c.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        })
                        .await?;
                    Ok::<(), ChargeError>(())
                }
            });
        for i in 0..20 {
            let env = Envelope::new(
                CHARGE,
                json!({"i": i, "fail_once": i == 7 && q == &queues[0]}),
            )
            .unwrap()
            .with_queue(q);
            app.publish_envelope(&env).await.unwrap();
            if i % 2 == 0 {
                app.publish_envelope(&env).await.unwrap();
            }
        }
        let stats = app.drain().await.unwrap();
        assert_eq!(stats.dead_lettered, 0, "{stats:?}");
        assert_eq!(transport.len(q).await.unwrap(), 0);
        assert_eq!(transport.processing_len(q).await.unwrap(), 0);
        assert_eq!(transport.delayed_len(q).await.unwrap(), 0);
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        60,
        "each payment charged once"
    );
    assert_eq!(
        failures.load(Ordering::SeqCst),
        2,
        "the failure was retried once"
    );

    // Recover: a consumer dies holding messages; another takes them back.
    let q = &queues[1];
    let dead = RedisTransport::open_cluster(urls.clone())
        .unwrap()
        .consumer_id("dead");
    let rescuer = RedisTransport::open_cluster(urls.clone())
        .unwrap()
        .consumer_id("rescuer");
    for i in 0..3 {
        dead.publish_raw(q, format!("m{i}").into_bytes())
            .await
            .unwrap();
    }
    dead.heartbeat(q, Duration::from_millis(200)).await.unwrap();
    for _ in 0..3 {
        dead.reserve(q, Duration::ZERO).await.unwrap().unwrap();
    }
    assert_eq!(
        rescuer.recover(q, 3).await.unwrap().requeued,
        0,
        "still alive"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = rescuer.recover(q, 3).await.unwrap();
    assert_eq!(r.requeued, 3);
    assert_eq!(dead.processing_len(q).await.unwrap(), 0);
    assert_eq!(rescuer.len(q).await.unwrap(), 3);
    // A blocking reserve on the cluster.
    let d = rescuer
        .reserve(q, Duration::from_millis(500))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.element(), b"m0");
    rescuer.ack(&d).await.unwrap();

    // The other SDKs' shared list `<queue>:processing` is in another slot: the explicit
    // requeue copies then removes.
    let legacy = format!("{q}:processing");
    assert_ne!(hash_slot(&legacy), hash_slot(q));
    redis::cmd("RPUSH")
        .arg(&legacy)
        .arg("x1")
        .arg("x2")
        .query_async::<i64>(&mut conn)
        .await
        .unwrap();
    assert_eq!(rescuer.requeue_processing(q).await.unwrap(), 2);
    let queued: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(q)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        queued,
        [
            b"x1".to_vec(),
            b"x2".to_vec(),
            b"m1".to_vec(),
            b"m2".to_vec()
        ]
    );
    drop(cluster);
}
