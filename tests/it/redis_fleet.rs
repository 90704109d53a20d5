//! The fleet side of the Redis transport, against a real Redis: per-consumer processing
//! lists, the delayed set, heartbeats, crash recovery (one script per dead consumer),
//! orphans, and retried operations. Ignored without a server; CI runs them with
//! `--include-ignored`. Every test uses its own queue names.

use crate::fleet_support;

use std::collections::HashSet;
use std::time::Duration;

use babelqueue::redis::redis::AsyncCommands;
use babelqueue::redis::{
    RedisTransport, consumer_processing_list, consumers_registry, delayed_set, recoveries_hash,
};
use babelqueue::runtime::{ListMaintenance, Republish, Transport};
use fleet_support::{QueueGuard, RedisServer, raw, shared_url};

async fn consumer(id: &str) -> RedisTransport {
    RedisTransport::connect(&shared_url())
        .await
        .expect("Redis must be reachable for this test")
        .consumer_id(id)
}

async fn lrange(key: &str) -> Vec<Vec<u8>> {
    raw(&shared_url()).await.lrange(key, 0, -1).await.unwrap()
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn each_consumer_reserves_into_its_own_list() {
    let q = QueueGuard::new("own-lists", &shared_url());
    let a = consumer("a").await;
    let b = consumer("b").await;
    a.publish_raw(&q.name, b"m1".to_vec()).await.unwrap();
    a.publish_raw(&q.name, b"m2".to_vec()).await.unwrap();
    let da = a.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    let db = b.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(
        lrange(&consumer_processing_list(&q.name, "a")).await,
        vec![b"m1".to_vec()]
    );
    assert_eq!(
        lrange(&consumer_processing_list(&q.name, "b")).await,
        vec![b"m2".to_vec()]
    );
    assert!(lrange(&format!("{}:processing", q.name)).await.is_empty());
    let mut ids = a.consumers(&q.name).await.unwrap();
    ids.sort();
    assert_eq!(ids, ["a", "b"], "a first reserve registers the consumer");
    a.ack(&da).await.unwrap();
    b.ack(&db).await.unwrap();
    assert_eq!(a.processing_len(&q.name).await.unwrap(), 0);
    assert_eq!(b.processing_len(&q.name).await.unwrap(), 0);
    // A retried ack (the first one's reply lost) removes nothing else.
    a.publish_raw(&q.name, b"m3".to_vec()).await.unwrap();
    let d3 = a.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    a.ack(&da).await.unwrap();
    assert_eq!(a.processing_len(&q.name).await.unwrap(), 1);
    a.ack(&d3).await.unwrap();
    a.leave(&q.name).await.unwrap();
    b.leave(&q.name).await.unwrap();
    assert!(
        a.consumers(&q.name).await.unwrap().is_empty(),
        "left with empty lists"
    );
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_delayed_requeue_waits_in_the_delayed_set_then_comes_back() {
    let q = QueueGuard::new("delayed", &shared_url());
    let t = consumer("c").await;
    t.publish_raw(&q.name, b"orig".to_vec()).await.unwrap();
    let d = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    let start = std::time::Instant::now();
    t.requeue(
        &d,
        Republish::with_body(b"retry-1".to_vec()),
        Duration::from_millis(300),
    )
    .await
    .unwrap();
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
    assert_eq!(t.delayed_len(&q.name).await.unwrap(), 1);
    assert_eq!(t.len(&q.name).await.unwrap(), 0);
    let due = t.next_due(&q.name).await.unwrap().expect("one delayed");
    assert!(due <= Duration::from_millis(300), "{due:?}");
    assert!(
        t.reserve(&q.name, Duration::ZERO).await.unwrap().is_none(),
        "not due yet"
    );
    // A blocking reserve wakes up when it is due and promotes it.
    let back = t
        .reserve(&q.name, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("promoted when due");
    let waited = start.elapsed();
    assert_eq!(back.element(), b"retry-1");
    assert!(
        waited >= Duration::from_millis(290),
        "redelivered after {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(3),
        "redelivered after {waited:?}"
    );
    assert_eq!(t.delayed_len(&q.name).await.unwrap(), 0);
    assert_eq!(t.next_due(&q.name).await.unwrap(), None);
    // Delay zero: straight to the tail of the queue.
    t.publish_raw(&q.name, b"other".to_vec()).await.unwrap();
    t.requeue(
        &back,
        Republish::with_body(b"retry-2".to_vec()),
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(
        lrange(&q.name).await,
        vec![b"other".to_vec(), b"retry-2".to_vec()]
    );
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_retried_requeue_adds_no_second_copy_and_identical_messages_stay_apart() {
    let q = QueueGuard::new("requeue-retry", &shared_url());
    let t = consumer("c").await;
    for _ in 0..2 {
        t.publish_raw(&q.name, b"same".to_vec()).await.unwrap();
    }
    let d1 = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    let d2 = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    t.requeue(
        &d1,
        Republish::with_body(b"same".to_vec()),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    t.requeue(
        &d2,
        Republish::with_body(b"same".to_vec()),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    // Two byte-identical delayed messages are two members (each has its own token).
    assert_eq!(t.delayed_len(&q.name).await.unwrap(), 2);
    // Retrying a requeue that already happened adds nothing.
    t.requeue(
        &d1,
        Republish::with_body(b"same".to_vec()),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    t.requeue(&d1, Republish::with_body(b"same".to_vec()), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(t.delayed_len(&q.name).await.unwrap(), 2);
    assert_eq!(t.len(&q.name).await.unwrap(), 0);
    // Make them due now and promote: both come back, intact.
    let mut c = raw(&shared_url()).await;
    let members: Vec<Vec<u8>> = c.zrange(delayed_set(&q.name), 0, -1).await.unwrap();
    for m in &members {
        let _: i64 = c.zadd(delayed_set(&q.name), m, 0).await.unwrap();
    }
    // The transport caches the due time; a fresh consumer reads it.
    let other = consumer("d").await;
    assert_eq!(other.next_due(&q.name).await.unwrap(), Some(Duration::ZERO));
    assert_eq!(other.promote_due(&q.name, 10).await.unwrap(), 2);
    assert_eq!(
        lrange(&q.name).await,
        vec![b"same".to_vec(), b"same".to_vec()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn promotion_by_many_consumers_at_once_moves_each_message_once() {
    let q = QueueGuard::new("promote-race", &shared_url());
    let mut c = raw(&shared_url()).await;
    let n = 500;
    for i in 0..n {
        // Due in the past; the 32-character token prefix is the transport's member layout.
        let member = format!("{:032x}msg-{i}", i);
        let _: i64 = c.zadd(delayed_set(&q.name), member, i).await.unwrap();
    }
    let mut tasks = Vec::new();
    for k in 0..8 {
        let t = consumer(&format!("p{k}")).await;
        let name = q.name.clone();
        tasks.push(tokio::spawn(async move {
            let mut moved = 0;
            loop {
                let m = t.promote_due(&name, 7).await.unwrap();
                if m == 0 && t.next_due(&name).await.unwrap().is_none() {
                    return moved;
                }
                moved += m;
            }
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, n, "each message promoted exactly once");
    let queued = lrange(&q.name).await;
    let distinct: HashSet<_> = queued.iter().collect();
    assert_eq!((queued.len(), distinct.len()), (n, n));
    assert!(
        queued.iter().all(|m| m.starts_with(b"msg-")),
        "token stripped"
    );
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn recovery_takes_only_the_lists_of_consumers_whose_heartbeat_expired() {
    let q = QueueGuard::new("recover", &shared_url());
    let dead = consumer("dead").await;
    let alive = consumer("alive").await;
    let rescuer = consumer("rescuer").await;
    for i in 0..5 {
        dead.publish_raw(&q.name, format!("m{i}").into_bytes())
            .await
            .unwrap();
    }
    dead.heartbeat(&q.name, Duration::from_millis(300))
        .await
        .unwrap();
    alive
        .heartbeat(&q.name, Duration::from_secs(60))
        .await
        .unwrap();
    for _ in 0..3 {
        dead.reserve(&q.name, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
    }
    let held = alive
        .reserve(&q.name, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    // Before the heartbeat expires nothing moves.
    let r = rescuer.recover(&q.name, 3).await.unwrap();
    assert_eq!((r.requeued, r.exhausted.len()), (0, 0));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = rescuer.recover(&q.name, 3).await.unwrap();
    assert_eq!((r.requeued, r.exhausted.len()), (3, 0));
    assert_eq!(
        lrange(&q.name).await,
        vec![
            b"m0".to_vec(),
            b"m1".to_vec(),
            b"m2".to_vec(),
            b"m4".to_vec()
        ],
        "back at the head, oldest first"
    );
    assert!(
        lrange(&consumer_processing_list(&q.name, "dead"))
            .await
            .is_empty()
    );
    assert_eq!(
        alive.processing_len(&q.name).await.unwrap(),
        1,
        "a live list is never touched"
    );
    let ids: HashSet<String> = rescuer
        .consumers(&q.name)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert!(!ids.contains("dead") && ids.contains("alive"));
    // A second pass finds nothing more.
    let r = rescuer.recover(&q.name, 3).await.unwrap();
    assert_eq!(r.requeued, 0);
    alive.ack(&held).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn several_consumers_recovering_at_once_move_each_message_once() {
    let q = QueueGuard::new("recover-race", &shared_url());
    let n = 200;
    for round in 0..3 {
        let dead = consumer(&format!("dead{round}")).await;
        dead.heartbeat(&q.name, Duration::from_millis(50))
            .await
            .unwrap();
        for i in 0..n {
            dead.publish_raw(&q.name, format!("r{round}-{i}").into_bytes())
                .await
                .unwrap();
        }
        for _ in 0..n {
            dead.reserve(&q.name, Duration::ZERO)
                .await
                .unwrap()
                .unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(120)).await;
    let mut tasks = Vec::new();
    for k in 0..6 {
        let t = consumer(&format!("rescuer{k}")).await;
        let name = q.name.clone();
        tasks.push(tokio::spawn(async move {
            t.recover(&name, 3).await.unwrap().requeued
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 3 * n);
    let queued = lrange(&q.name).await;
    let distinct: HashSet<_> = queued.iter().collect();
    assert_eq!((queued.len(), distinct.len()), (3 * n, 3 * n));
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_message_that_keeps_killing_consumers_is_handed_over_as_exhausted() {
    let q = QueueGuard::new("exhausted", &shared_url());
    let rescuer = consumer("rescuer").await;
    rescuer
        .publish_raw(&q.name, b"poison-pill".to_vec())
        .await
        .unwrap();
    let max = 2;
    for life in 0..=max {
        let victim = consumer(&format!("victim{life}")).await;
        victim
            .heartbeat(&q.name, Duration::from_millis(30))
            .await
            .unwrap();
        victim
            .reserve(&q.name, Duration::ZERO)
            .await
            .unwrap()
            .expect("the pill");
        tokio::time::sleep(Duration::from_millis(60)).await;
        let r = rescuer.recover(&q.name, max).await.unwrap();
        if life < max {
            assert_eq!((r.requeued, r.exhausted.len()), (1, 0), "life {life}");
        } else {
            assert_eq!(r.requeued, 0);
            assert_eq!(r.exhausted.len(), 1);
            let d = &r.exhausted[0];
            assert_eq!(d.element(), b"poison-pill");
            // It is now in the rescuer's own list, for the runtime to dead-letter and ack.
            assert_eq!(rescuer.processing_len(&q.name).await.unwrap(), 1);
            assert_eq!(rescuer.len(&q.name).await.unwrap(), 0);
            let mut c = raw(&shared_url()).await;
            let counters: i64 = c.hlen(recoveries_hash(&q.name)).await.unwrap();
            assert_eq!(counters, 1);
            rescuer.ack(d).await.unwrap();
            let counters: i64 = c.hlen(recoveries_hash(&q.name)).await.unwrap();
            assert_eq!(counters, 0, "the ack drops the counter");
            assert_eq!(rescuer.processing_len(&q.name).await.unwrap(), 0);
        }
    }
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_restarted_consumer_with_a_stable_id_returns_its_orphans_first() {
    let q = QueueGuard::new("orphans", &shared_url());
    {
        let first_life = consumer("worker-1").await;
        for i in 0..3 {
            first_life
                .publish_raw(&q.name, format!("m{i}").into_bytes())
                .await
                .unwrap();
        }
        first_life
            .reserve(&q.name, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        first_life
            .reserve(&q.name, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        // Dies without acking.
    }
    let second_life = consumer("worker-1").await;
    let d = second_life
        .reserve(&q.name, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        d.element(),
        b"m0",
        "the orphans went back to the head first"
    );
    assert_eq!(lrange(&q.name).await, vec![b"m1".to_vec(), b"m2".to_vec()]);
    assert_eq!(second_life.processing_len(&q.name).await.unwrap(), 1);
    second_life.ack(&d).await.unwrap();
}

#[tokio::test]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn leaving_with_messages_in_flight_lets_the_others_recover_them_at_once() {
    let q = QueueGuard::new("leave", &shared_url());
    let leaver = consumer("leaver").await;
    let other = consumer("other").await;
    leaver
        .heartbeat(&q.name, Duration::from_secs(60))
        .await
        .unwrap();
    leaver.publish_raw(&q.name, b"m".to_vec()).await.unwrap();
    leaver
        .reserve(&q.name, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    leaver.leave(&q.name).await.unwrap();
    let r = other.recover(&q.name, 3).await.unwrap();
    assert_eq!(r.requeued, 1, "no need to wait for the 60 s heartbeat");
    let mut c = raw(&shared_url()).await;
    let registered: Vec<String> = c.zrange(consumers_registry(&q.name), 0, -1).await.unwrap();
    assert!(registered.is_empty());
}

/// With nothing delayed, the fleet work adds no round trip per message. On a
/// private server (so other tests' commands do not count): 300 reserve + ack cycles cost
/// 300 LMOVE + 300 LREM, plus a handful of script calls (registration, the orphan check,
/// one promotion check per second).
#[tokio::test]
#[ignore = "starts its own redis-server on port 17100; CI runs it with --include-ignored"]
async fn the_hot_path_costs_one_command_per_reserve_and_per_ack() {
    let server = tokio::task::spawn_blocking(|| RedisServer::start(17100, &[]))
        .await
        .unwrap();
    let t = RedisTransport::connect(&server.url()).await.unwrap();
    let n = 300;
    for i in 0..n {
        t.publish_raw("hot", format!("m{i}").into_bytes())
            .await
            .unwrap();
    }
    let before = server.command_calls();
    let start = std::time::Instant::now();
    for _ in 0..n {
        let d = t.reserve("hot", Duration::ZERO).await.unwrap().unwrap();
        t.ack(&d).await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64().ceil() as u64;
    let after = server.command_calls();
    let delta = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    assert_eq!(delta("lmove"), n as u64);
    assert_eq!(delta("lrem"), n as u64);
    let scripts = delta("evalsha") + delta("eval");
    // Registration + orphan check + at most ~1 promotion check per elapsed second.
    assert!(scripts <= 4 + secs, "{scripts} script calls in {secs} s");
    drop(server);
}

/// The runtime's side of an exhausted message on Redis: an `App` whose recovery finds a
/// message already recovered `max_recoveries` times dead-letters it (reason `failed`) and
/// acks it; its recovery counter goes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn the_app_dead_letters_a_message_that_killed_too_many_consumers() {
    use babelqueue::{App, Envelope};
    let q = QueueGuard::new("exhausted-app", &shared_url());
    let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"n": 1}))
        .unwrap()
        .with_queue(&q.name);
    let survivor = consumer("survivor").await;
    survivor.publish_raw(&q.name, env.encode()).await.unwrap();
    // It kills two consumers; the first death is recovered (counter 1), the second is one
    // too many for `max_recoveries(1)`.
    for life in 0..2 {
        let victim = consumer(&format!("victim{life}")).await;
        victim
            .heartbeat(&q.name, Duration::from_millis(30))
            .await
            .unwrap();
        victim
            .reserve(&q.name, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        if life == 0 {
            assert_eq!(survivor.recover(&q.name, 1).await.unwrap().requeued, 1);
            let mut c = raw(&shared_url()).await;
            let counters: i64 = c.hlen(recoveries_hash(&q.name)).await.unwrap();
            assert_eq!(counters, 1);
        }
    }
    let handled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = handled.clone();
    let app = App::new(survivor.clone())
        .queue(&q.name)
        .max_recoveries(1)
        .route_sync("urn:babel:payments:charge", move |_e: &Envelope| {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
    let stats = app.drain().await.unwrap();
    assert_eq!(stats.dead_lettered, 1, "{stats:?}");
    assert_eq!(
        handled.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "not run again"
    );
    let dlq = lrange(&format!("{}.dlq", q.name)).await;
    assert_eq!(dlq.len(), 1);
    let dead: serde_json::Value = serde_json::from_slice(&dlq[0]).unwrap();
    assert_eq!(dead["dead_letter"]["reason"], "failed");
    assert_eq!(dead["meta"]["id"], env.meta.id.as_str());
    assert_eq!(survivor.processing_len(&q.name).await.unwrap(), 0);
    assert!(
        lrange(&consumer_processing_list(&q.name, "victim1"))
            .await
            .is_empty()
    );
    let mut c = raw(&shared_url()).await;
    let counters: i64 = c.hlen(recoveries_hash(&q.name)).await.unwrap();
    assert_eq!(
        counters, 0,
        "the ack of the dead-lettered message dropped its counter"
    );
}

/// A TCP proxy in front of the shared Redis that can drop the next reply and cut the
/// connection (a reply lost in an outage).
struct ReplyCutter {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

async fn reply_cutter() -> ReplyCutter {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cut = std::sync::Arc::new(AtomicBool::new(false));
    let target = {
        let u = shared_url();
        let rest = u.trim_start_matches("redis://");
        let hostport = rest
            .split(['/', '@'])
            .find(|s| s.contains(':'))
            .unwrap_or("127.0.0.1:6379");
        hostport.to_owned()
    };
    let flag = cut.clone();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let server = tokio::net::TcpStream::connect(&target).await.unwrap();
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            let flag = flag.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if flag.swap(false, Ordering::SeqCst) {
                        // Drop this reply and the connection.
                        let _ = cw.shutdown().await;
                        break;
                    }
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    ReplyCutter { port, cut }
}

/// A reserve whose reply is lost (the move happened on the server, the consumer never heard
/// of it) leaves an orphan in the consumer's own list; the next reserve returns it to the
/// queue and delivers it. Nothing is stranded while the consumer lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn a_reserve_whose_reply_was_lost_is_delivered_by_the_next_reserve() {
    use std::sync::atomic::Ordering;
    if shared_url().contains('@') {
        return; // the proxy forwards plain connections only
    }
    let proxy = reply_cutter().await;
    let q = QueueGuard::new("lost-reply", &shared_url());
    let t = RedisTransport::open(&format!("redis://127.0.0.1:{}/0", proxy.port))
        .unwrap()
        .consumer_id("cut");
    t.publish_raw(&q.name, b"m0".to_vec()).await.unwrap();
    // The first reserve registers and checks for orphans; after it, a reserve is one LMOVE.
    let d = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    t.ack(&d).await.unwrap();
    t.publish_raw(&q.name, b"m1".to_vec()).await.unwrap();
    proxy.cut.store(true, Ordering::SeqCst);
    let lost = t.reserve(&q.name, Duration::ZERO).await;
    assert!(lost.is_err(), "the reply was cut: {lost:?}");
    assert_eq!(
        lrange(&consumer_processing_list(&q.name, "cut")).await,
        vec![b"m1".to_vec()],
        "the move happened on the server"
    );
    let d = t
        .reserve(&q.name, Duration::ZERO)
        .await
        .unwrap()
        .expect("the orphan is delivered");
    assert_eq!(d.element(), b"m1");
    assert_eq!(
        t.processing_len(&q.name).await.unwrap(),
        1,
        "held once, not twice"
    );
    t.ack(&d).await.unwrap();
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
    assert_eq!(t.len(&q.name).await.unwrap(), 0);
    t.leave(&q.name).await.unwrap();
}

/// An ack or a requeue whose reply is lost is retried by the runtime: the retry finds the
/// work done and does nothing more (no second copy in the delayed set, nothing else removed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis at 127.0.0.1:6379 (BABELQUEUE_REDIS_URL); CI runs it with --include-ignored"]
async fn an_ack_or_requeue_retried_after_a_lost_reply_is_applied_once() {
    use std::sync::atomic::Ordering;
    if shared_url().contains('@') {
        return; // the proxy forwards plain connections only
    }
    let proxy = reply_cutter().await;
    let q = QueueGuard::new("lost-settle", &shared_url());
    let t = RedisTransport::open(&format!("redis://127.0.0.1:{}/0", proxy.port))
        .unwrap()
        .consumer_id("settler");
    for m in ["a", "b", "c"] {
        t.publish_raw(&q.name, m.as_bytes().to_vec()).await.unwrap();
    }
    let a = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    let b = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();
    let c = t.reserve(&q.name, Duration::ZERO).await.unwrap().unwrap();

    proxy.cut.store(true, Ordering::SeqCst);
    assert!(
        t.requeue(
            &a,
            Republish::with_body(b"a-retry".to_vec()),
            Duration::from_secs(60)
        )
        .await
        .is_err()
    );
    t.requeue(
        &a,
        Republish::with_body(b"a-retry".to_vec()),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!(
        t.delayed_len(&q.name).await.unwrap(),
        1,
        "one copy, not two"
    );

    proxy.cut.store(true, Ordering::SeqCst);
    assert!(t.ack(&b).await.is_err());
    t.ack(&b).await.unwrap();
    assert_eq!(
        lrange(&consumer_processing_list(&q.name, "settler")).await,
        vec![b"c".to_vec()],
        "only b was removed"
    );
    t.ack(&c).await.unwrap();
    assert_eq!(t.processing_len(&q.name).await.unwrap(), 0);
    assert_eq!(t.len(&q.name).await.unwrap(), 0);
}
