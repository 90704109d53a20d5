//! The Redis commands: queue stats, dead letters, legacy processing recovery.

use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

use crate::dead_letters::{Select, Tally, print_list};
use crate::envelope::Element;
use crate::{CliError, redis_err};

/// Connects (5 s connect timeout, 30 s per command) and checks the server answers.
pub(crate) async fn connect(url: &str) -> Result<MultiplexedConnection, CliError> {
    let client =
        redis::Client::open(url).map_err(redis_err(format!("invalid Redis URL {url:?}")))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(30)));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(redis_err(format!(
            "cannot connect to Redis at {}",
            redacted(url)
        )))?;
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .map_err(redis_err(format!(
            "Redis at {} does not answer PING",
            redacted(url)
        )))?;
    Ok(conn)
}

/// The URL without its password.
pub(crate) fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// `text` with the glob characters of `SCAN MATCH` escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Every key matching `pattern` (SCAN, so the server is never blocked).
async fn scan(conn: &mut MultiplexedConnection, pattern: &str) -> Result<Vec<String>, CliError> {
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(redis_err(format!("SCAN MATCH {pattern}")))?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// The counts of one queue.
pub(crate) struct Stats {
    queue: String,
    ready: u64,
    legacy_processing: u64,
    /// (consumer id, messages in its processing list).
    consumers_in_flight: Vec<(String, u64)>,
    delayed: u64,
    dlq: String,
    dead_letters: u64,
    /// Consumer ids with a live heartbeat key.
    alive: Vec<String>,
    /// The consumer registry `{<queue>}:consumers`: (id, heartbeat expiry Unix ms).
    registered: Vec<(String, i64)>,
    /// The server's clock (Unix ms), to tell expired registrations.
    now_ms: i64,
}

impl Stats {
    fn in_flight(&self) -> u64 {
        self.legacy_processing + self.consumers_in_flight.iter().map(|(_, n)| n).sum::<u64>()
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "queue": self.queue,
            "ready": self.ready,
            "in_flight": self.in_flight(),
            "in_flight_legacy": self.legacy_processing,
            "in_flight_by_consumer": self
                .consumers_in_flight
                .iter()
                .map(|(c, n)| (c.clone(), Value::from(*n)))
                .collect::<serde_json::Map<_, _>>(),
            "delayed": self.delayed,
            "dead_letters": self.dead_letters,
            "dlq": self.dlq,
            "consumers_alive": self.alive,
            "consumers_registered": self
                .registered
                .iter()
                .map(|(c, exp)| (c.clone(), Value::from(*exp)))
                .collect::<serde_json::Map<_, _>>(),
            "consumers_expired": self.expired(),
        })
    }

    /// Registered consumers whose heartbeat expiry has passed (dead, awaiting recovery).
    fn expired(&self) -> Vec<String> {
        self.registered
            .iter()
            .filter(|(_, exp)| *exp <= self.now_ms)
            .map(|(c, _)| c.clone())
            .collect()
    }

    pub(crate) fn to_text(&self) -> String {
        let q = &self.queue;
        let mut s = format!("queue         {q}\n");
        s += &format!("ready         {:<8}  (LLEN {q})\n", self.ready);
        s += &format!("in flight     {}\n", self.in_flight());
        s += &format!(
            "  legacy      {:<8}  ({q}:processing, shared with the other SDKs)\n",
            self.legacy_processing
        );
        for (consumer, n) in &self.consumers_in_flight {
            let alive = if self.alive.contains(consumer) {
                "alive"
            } else {
                "no heartbeat"
            };
            s += &format!("  consumer    {n:<8}  ({{{q}}}:processing:{consumer}, {alive})\n");
        }
        s += &format!("delayed       {:<8}  ({{{q}}}:delayed)\n", self.delayed);
        s += &format!("dead letters  {:<8}  ({})\n", self.dead_letters, self.dlq);
        s += &format!(
            "consumers     {:<8}  alive ({{{q}}}:heartbeat:*)\n",
            self.alive.len()
        );
        let expired = self.expired();
        s += &format!(
            "registered    {:<8}  ({{{q}}}:consumers){}\n",
            self.registered.len(),
            if expired.is_empty() {
                String::new()
            } else {
                format!(
                    ", heartbeat expired (to be recovered): {}",
                    expired.join(", ")
                )
            }
        );
        s
    }
}

pub(crate) async fn stats(
    conn: &mut MultiplexedConnection,
    queue: &str,
    dlq: &str,
) -> Result<Stats, CliError> {
    let ready: u64 = conn
        .llen(queue)
        .await
        .map_err(redis_err(format!("LLEN {queue}")))?;
    let legacy_key = format!("{queue}:processing");
    let legacy_processing: u64 = conn
        .llen(&legacy_key)
        .await
        .map_err(redis_err(format!("LLEN {legacy_key}")))?;
    let tagged = format!("{{{}}}", glob_escape(queue));
    let prefix = format!("{{{queue}}}:processing:");
    let mut consumers_in_flight = Vec::new();
    for key in scan(conn, &format!("{tagged}:processing:*")).await? {
        let n: u64 = conn
            .llen(&key)
            .await
            .map_err(redis_err(format!("LLEN {key}")))?;
        let id = key.strip_prefix(&prefix).unwrap_or(&key).to_owned();
        consumers_in_flight.push((id, n));
    }
    let delayed_key = format!("{{{queue}}}:delayed");
    let delayed: u64 = conn
        .zcard(&delayed_key)
        .await
        .map_err(redis_err(format!("ZCARD {delayed_key}")))?;
    let dead_letters: u64 = conn
        .llen(dlq)
        .await
        .map_err(redis_err(format!("LLEN {dlq}")))?;
    let heartbeat = format!("{{{queue}}}:heartbeat:");
    let alive = scan(conn, &format!("{tagged}:heartbeat:*"))
        .await?
        .into_iter()
        .map(|k| k.strip_prefix(&heartbeat).unwrap_or(&k).to_owned())
        .collect();
    let registry = format!("{{{queue}}}:consumers");
    let registered: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(&registry)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .map_err(redis_err(format!("ZRANGE {registry}")))?;
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(conn)
        .await
        .map_err(redis_err("TIME"))?;
    Ok(Stats {
        now_ms: secs * 1000 + micros / 1000,
        registered,
        queue: queue.to_owned(),
        ready,
        legacy_processing,
        consumers_in_flight,
        delayed,
        dlq: dlq.to_owned(),
        dead_letters,
        alive,
    })
}

pub(crate) async fn dlq_list(
    conn: &mut MultiplexedConnection,
    dlq: &str,
    limit: usize,
    json: bool,
) -> Result<(), CliError> {
    let total: u64 = conn
        .llen(dlq)
        .await
        .map_err(redis_err(format!("LLEN {dlq}")))?;
    let stop = isize::try_from(limit).unwrap_or(isize::MAX) - 1;
    let items: Vec<Vec<u8>> = if limit == 0 {
        Vec::new()
    } else {
        conn.lrange(dlq, 0, stop)
            .await
            .map_err(redis_err(format!("LRANGE {dlq}")))?
    };
    print_list(dlq, total, &items, json);
    Ok(())
}

/// Removes `ARGV[1]` from `KEYS[1]` and, only if it was there, pushes `ARGV[2]` onto
/// `KEYS[2]`: a dead letter is never lost nor duplicated, even with two operators.
const MOVE_ONE: &str = r"
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
";

async fn move_one(
    conn: &mut MultiplexedConnection,
    from: &str,
    to: &str,
    old: &[u8],
    new: &[u8],
) -> Result<bool, CliError> {
    let moved: i64 = redis::Script::new(MOVE_ONE)
        .key(from)
        .key(to)
        .arg(old)
        .arg(new)
        .invoke_async(conn)
        .await
        .map_err(redis_err(format!("moving a message from {from} to {to}")))?;
    Ok(moved == 1)
}

pub(crate) async fn dlq_requeue(
    conn: &mut MultiplexedConnection,
    queue: &str,
    dlq: &str,
    select: &Select,
    keep_attempts: bool,
) -> Result<(), CliError> {
    let items: Vec<Vec<u8>> = conn
        .lrange(dlq, 0, -1)
        .await
        .map_err(redis_err(format!("LRANGE {dlq}")))?;
    let mut tally = Tally::default();
    for item in items {
        let el = Element::parse(&item);
        if !select.matches(&el) {
            continue;
        }
        tally.matched += 1;
        if el.job() == Some(babelqueue_runtime::POISON_URN) {
            tally.poison += 1;
            continue;
        }
        let id = el.meta_id().unwrap_or("-").to_owned();
        let Some(body) = el.requeued(keep_attempts) else {
            tally.unreadable += 1;
            continue;
        };
        if move_one(conn, dlq, queue, &item, &body).await? {
            tally.moved += 1;
            println!("requeued meta.id={id} to {queue}");
        }
    }
    tally.finish(dlq, queue, select)
}

pub(crate) async fn recover_poison(
    conn: &mut MultiplexedConnection,
    dlq: &str,
    target: &str,
) -> Result<(), CliError> {
    let items: Vec<Vec<u8>> = conn
        .lrange(dlq, 0, -1)
        .await
        .map_err(redis_err(format!("LRANGE {dlq}")))?;
    let mut moved = 0;
    for item in items {
        let Some(original) = babelqueue_runtime::recover_poison(&Element::body(&item)) else {
            continue;
        };
        if move_one(conn, dlq, target, &item, &original).await? {
            moved += 1;
        }
    }
    println!("recovered {moved} poison message(s) from {dlq} to {target} (original bytes)");
    Ok(())
}

pub(crate) async fn recover_legacy(
    conn: &mut MultiplexedConnection,
    queue: &str,
) -> Result<u64, CliError> {
    let list = format!("{queue}:processing");
    let mut moved = 0;
    loop {
        let item: Option<Vec<u8>> = redis::cmd("LMOVE")
            .arg(&list)
            .arg(queue)
            .arg("RIGHT")
            .arg("LEFT")
            .query_async(conn)
            .await
            .map_err(redis_err(format!("LMOVE {list} {queue} RIGHT LEFT")))?;
        if item.is_none() {
            return Ok(moved);
        }
        moved += 1;
    }
}

/// Inspects the Redis seen-set keys under `prefix`.
pub(crate) async fn doctor(
    url: &str,
    prefix: &str,
    sample: usize,
    report: &mut crate::report::Report,
) -> Result<(), CliError> {
    let mut conn = connect(url).await?;
    report.ok(format!("Redis at {} answers", redacted(url)));
    let keys = scan(&mut conn, &format!("{}*", glob_escape(prefix))).await?;
    report.ok(format!("{} key(s) under {prefix}", keys.len()));
    let (mut remembered, mut forever, mut leases, mut odd) = (0u64, 0u64, 0u64, 0u64);
    for key in keys.iter().take(sample) {
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(redis_err(format!("TYPE {key}")))?;
        if kind == "none" {
            continue; // expired meanwhile
        }
        if kind != "string" {
            odd += 1;
            report.problem(format!(
                "{key} is a {kind}, not a string (value `1` or `lease:<token>`)"
            ));
            continue;
        }
        let value: Option<String> = conn
            .get(key)
            .await
            .map_err(redis_err(format!("GET {key}")))?;
        let pttl: i64 = conn
            .pttl(key)
            .await
            .map_err(redis_err(format!("PTTL {key}")))?;
        match value.as_deref() {
            None => {}
            Some("1") => {
                remembered += 1;
                if pttl == -1 {
                    forever += 1;
                }
            }
            Some(v) if v.starts_with("lease:") => {
                leases += 1;
                if pttl < 0 {
                    report.problem(format!(
                        "{key} holds an in-flight lease without a TTL: it would block that id forever"
                    ));
                } else {
                    report.note(format!("{key}: in-flight lease, {pttl} ms left"));
                }
            }
            Some(v) => {
                odd += 1;
                report.problem(format!(
                    "{key} = {:?}: not a value of the shared layout (`1`, or `lease:<token>` of the Rust SDK)",
                    v.chars().take(40).collect::<String>()
                ));
            }
        }
    }
    let inspected = keys.len().min(sample);
    report.ok(format!(
        "inspected {inspected}: {remembered} remembered (`1`; {forever} without TTL), {leases} in-flight lease(s), {odd} unexpected"
    ));
    if keys.len() > sample {
        report.note(format!(
            "{} key(s) not inspected (--sample {sample})",
            keys.len() - sample
        ));
    }
    report.note("Redis expires keys itself: there are no expired entries to purge");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\d"), "a\\*b\\?\\[c\\]\\\\d");
        assert_eq!(glob_escape("payments"), "payments");
    }

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redacted("redis://user:secret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redacted("redis://host:6379"), "redis://host:6379");
        assert_eq!(redacted("redis://:pw@h"), "redis://:***@h");
    }
}
