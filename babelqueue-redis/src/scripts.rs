//! The transport's Lua scripts. Each touches the keys of one queue only (all declared in
//! `KEYS`, all in the `{<queue>}` hash slot), so it runs unchanged on a Redis Cluster, and
//! each is atomic: several consumers running the same script at once never move a message
//! twice. Due times are the server's clock (`TIME`), so consumers with skewed clocks agree.

use std::sync::LazyLock;

use redis::Script;

/// Server time in Unix ms, as a Lua snippet defining `now`.
const NOW: &str =
    "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)\n";

fn with_now(body: &str) -> Script {
    Script::new(&format!("{NOW}{body}"))
}

/// Ack: `LREM` own list; when the queue has recovery counters, drops the element's counter.
/// KEYS: own list, recoveries. ARGV: element. Returns how many were removed (0: already
/// acked — a retried ack is harmless).
pub(crate) static ACK: LazyLock<Script> = LazyLock::new(|| Script::new(ACK_SOURCE));

/// The source of [`ACK`], for `EVAL` inside a pipeline (where `EVALSHA` could meet a
/// server whose script cache is empty, e.g. after a restart).
pub(crate) const ACK_SOURCE: &str = r"
local n = redis.call('LREM', KEYS[1], 1, ARGV[1])
if n > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HDEL', KEYS[2], redis.sha1hex(ARGV[1]))
end
return n
";

/// Ack of a batch (sent by `EVALSHA` in the settling pipeline): `LREM` of each element from
/// the own list, and, when the queue has recovery counters, the removed elements'
/// counters dropped. KEYS: own list, recoveries. ARGV: the elements. Returns how many
/// were removed in all (fewer than `#ARGV`: some were already acked or recovered).
pub const ACK_MANY_SOURCE: &str = r"
local counters = redis.call('EXISTS', KEYS[2]) == 1
local removed = 0
for i = 1, #ARGV do
  local n = redis.call('LREM', KEYS[1], 1, ARGV[i])
  if n > 0 and counters then
    redis.call('HDEL', KEYS[2], redis.sha1hex(ARGV[i]))
  end
  removed = removed + n
end
return removed
";

/// [`ACK_MANY_SOURCE`] as a script: its hash for `EVALSHA` in the settling pipeline.
pub(crate) static ACK_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(ACK_MANY_SOURCE));

/// Reserve of a batch (sent by `EVALSHA`): up to `ARGV[1]` messages from the head of the
/// queue to the tail of the own list, in queue order, atomically (one `LRANGE`, `LTRIM`
/// and `RPUSH`). KEYS: queue, own list. Returns the moved elements (empty: none ready).
pub const RESERVE_MANY_SOURCE: &str = r"
local moved = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #moved > 0 then
  redis.call('LTRIM', KEYS[1], #moved, -1)
  redis.call('RPUSH', KEYS[2], unpack(moved))
end
return moved
";

/// [`RESERVE_MANY_SOURCE`] as a script: its hash for `EVALSHA`.
pub(crate) static RESERVE_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(RESERVE_MANY_SOURCE));

/// Requeue: `LREM` own list, then `RPUSH` the new element on the queue (delay 0) or `ZADD`
/// it to the delayed set scored by now + delay. Only when the `LREM` removed the delivery:
/// a retried call whose first run reached the server does nothing the second time.
/// KEYS: own list, queue, delayed, recoveries. ARGV: delivered element, new element,
/// delay ms, unique member token (32 hex). Returns {removed, ms until the earliest delayed
/// message is due (-1: none)}.
pub(crate) static REQUEUE: LazyLock<Script> = LazyLock::new(|| {
    with_now(
        r"
local n = redis.call('LREM', KEYS[1], 1, ARGV[1])
if n == 0 then return {0, -1} end
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('HDEL', KEYS[4], redis.sha1hex(ARGV[1]))
end
local delay = tonumber(ARGV[3])
if delay <= 0 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return {1, -1}
end
redis.call('ZADD', KEYS[3], now + delay, ARGV[4] .. ARGV[2])
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
return {1, math.max(0, tonumber(first[2]) - now)}
",
    )
});

/// Promotion: moves up to ARGV[1] due members of the delayed set to the tail of the queue,
/// stripping their 32-character token. KEYS: delayed, queue. Returns {moved, ms until the
/// next one is due (-1: none left)}.
pub(crate) static PROMOTE: LazyLock<Script> = LazyLock::new(|| {
    with_now(
        r"
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, m in ipairs(due) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('RPUSH', KEYS[2], string.sub(m, 33))
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #first == 0 then return {#due, -1} end
return {#due, math.max(0, tonumber(first[2]) - now)}
",
    )
});

/// The earliest due time. KEYS: delayed. Returns ms until it is due (0 if overdue), or -1.
pub(crate) static NEXT_DUE: LazyLock<Script> = LazyLock::new(|| {
    with_now(
        r"
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #first == 0 then return -1 end
return math.max(0, tonumber(first[2]) - now)
",
    )
});

/// Heartbeat: `SET <hb> 1 PX ttl` and the registry entry scored by its expiry.
/// KEYS: heartbeat, registry. ARGV: consumer id, ttl ms.
pub(crate) static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| {
    with_now(
        r"
redis.call('SET', KEYS[1], '1', 'PX', tonumber(ARGV[2]))
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
return 1
",
    )
});

/// The consumers whose registered heartbeat expiry has passed, and whether the queue has
/// recovery counters. KEYS: registry, recoveries. Returns {hlen, id, id, …}.
pub(crate) static EXPIRED: LazyLock<Script> = LazyLock::new(|| {
    with_now(
        r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
local out = {redis.call('HLEN', KEYS[2])}
for _, id in ipairs(ids) do out[#out + 1] = id end
return out
",
    )
});

/// The registry with the server's time: `{now, id, expiry, id, expiry, …}` (expiry = the
/// score, Unix ms). KEYS: registry.
pub(crate) static REGISTRY: LazyLock<Script> = LazyLock::new(|| {
    with_now(
        r"
local out = {now}
local r = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #r, 2 do
  out[#out + 1] = r[i]
  out[#out + 1] = math.floor(tonumber(r[i + 1]))
end
return out
",
    )
});

/// Recovery of ONE consumer. When its heartbeat key exists it is alive: returns {-1} and
/// touches nothing. Otherwise each element of its list (oldest first ends first) goes back
/// to the head of the queue and its counter is bumped, except an element already recovered
/// ARGV[2] times: that one is moved to the caller's own list and returned. Then the dead
/// consumer leaves the registry.
/// KEYS: queue, dead list, dead heartbeat, registry, recoveries, own list.
/// ARGV: dead consumer id, max recoveries. Returns {requeued, exhausted element, …}.
pub(crate) static RECOVER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[3]) == 1 then return {-1} end
local max = tonumber(ARGV[2])
local requeued = 0
local out = {0}
while true do
  local e = redis.call('RPOP', KEYS[2])
  if not e then break end
  local d = redis.sha1hex(e)
  local n = tonumber(redis.call('HGET', KEYS[5], d) or '0')
  if n >= max then
    redis.call('RPUSH', KEYS[6], e)
    out[#out + 1] = e
  else
    redis.call('HSET', KEYS[5], d, n + 1)
    redis.call('LPUSH', KEYS[1], e)
    requeued = requeued + 1
  end
end
if requeued > 0 then redis.call('PEXPIRE', KEYS[5], 86400000) end
redis.call('ZREM', KEYS[4], ARGV[1])
out[1] = requeued
return out
",
    )
});

/// Leave: drops the heartbeat; leaves the registry when the own list is empty, else marks
/// the entry expired so the others recover what is left at once. KEYS: heartbeat, registry,
/// own list.
/// ARGV: consumer id. Returns the own list's length.
pub(crate) static LEAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('DEL', KEYS[1])
local n = redis.call('LLEN', KEYS[3])
if n == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[2], 0, ARGV[1])
end
return n
",
    )
});

/// Returns an orphan (an element in the own list no local task holds) to the head of the
/// queue. KEYS: own list, queue. ARGV: element. Returns 1 if moved.
pub(crate) static RETURN_ORPHAN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
",
    )
});
