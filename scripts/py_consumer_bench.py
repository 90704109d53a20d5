"""Times the upstream Python SDK's consumer (babelqueue 1.24.0) over a pre-loaded queue.

Run by scripts/perf-vs-python.sh after `babelqueue-bench --preload-only` loaded the
workload onto `bench:payments`. The SDK's own consume loop (`BabelQueue.consume`) with its
Redis transport, the handler wrapped by the SDK's `idempotency.wrap` over a Redis store of
the cross-SDK (Go) layout: key `bq:idemp:<meta.id>`, value `1`, seen = EXISTS,
remember = SET NX, forget = DEL.

With `--broker amqp --amqp-url URL --queue NAME` (scripts/perf-vs-python-amqp.sh, after
`babelqueue-bench --broker amqp --preload-only --queue NAME`): the same consume loop over
the SDK's pika transport (`babelqueue[amqp]`: basic_get + manual ack) on RabbitMQ, the
same guard over the same Redis store (`--url` is then the store's Redis only); the queue
is checked empty and deleted at the end.

Prints one line: deliveries=.. msgs_per_s=.. effects=.. skips=.. redis_cmds_per_delivery=..
and exits non-zero when effects != N or anything is left in the queue's lists.
"""

from __future__ import annotations

import argparse
import sys
import time

import redis
from babelqueue import BabelQueue
from babelqueue.idempotency import wrap
from babelqueue.redis_transport import RedisTransport

URN = "urn:babel:payments:charge"
QUEUE = "bench:payments"


class GoLayoutRedisStore:
    """The cross-SDK Redis store layout, written for this benchmark (the SDK ships only an
    in-memory store)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._r = client
        self._prefix = prefix

    def seen(self, message_id: str) -> bool:
        return bool(self._r.exists(self._prefix + message_id))

    def remember(self, message_id: str) -> None:
        self._r.set(self._prefix + message_id, "1", nx=True)

    def forget(self, message_id: str) -> None:
        self._r.delete(self._prefix + message_id)


def commands_processed(client: redis.Redis) -> int:
    total = 0
    for name, stats in client.info("commandstats").items():
        if name == "cmdstat_info":
            continue
        total += int(stats["calls"])
    return total


def reads_processed(client: redis.Redis) -> int:
    """`total_reads_processed` of INFO stats: about one per round trip."""
    return int(client.info("stats")["total_reads_processed"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--n", type=int, required=True, help="distinct payments")
    ap.add_argument("--deliveries", type=int, required=True, help="messages on the queue")
    ap.add_argument("--prefix", required=True, help="dedupe key prefix for this run")
    ap.add_argument("--broker", choices=("redis", "amqp"), default="redis")
    ap.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    ap.add_argument("--queue", default=QUEUE, help="the queue (amqp: the pre-loaded one)")
    args = ap.parse_args()
    if args.broker == "amqp":
        return run_amqp(args)

    client = redis.Redis.from_url(args.url)
    effects = 0

    def charge(data, meta, *rest):
        nonlocal effects
        effects += 1

    app = BabelQueue(transport=RedisTransport(args.url), queue=QUEUE)
    app.register(URN, wrap(GoLayoutRedisStore(client, args.prefix), charge))

    before = commands_processed(client)
    reads_before = reads_processed(client)
    start = time.perf_counter()
    handled = app.consume(max_messages=args.deliveries, timeout=1.0, handle_signals=False)
    secs = time.perf_counter() - start
    reads_after = reads_processed(client)
    after = commands_processed(client)

    left = {}
    for key in (QUEUE, f"{QUEUE}:processing", f"{QUEUE}:processing:deadlines"):
        kind = client.type(key).decode()
        n = client.llen(key) if kind == "list" else client.zcard(key) if kind == "zset" else 0
        if n:
            left[key] = n
    skips = handled - effects
    print(
        f"deliveries={handled} msgs_per_s={handled / secs:.0f} effects={effects} "
        f"skips={skips} redis_cmds_per_delivery={(after - before) / max(handled, 1):.2f} "
        f"redis_reads_per_delivery={max(reads_after - reads_before - 1, 0) / max(handled, 1):.2f}"
    )
    if effects != args.n or handled != args.deliveries or left:
        print(
            f"check failed: effects={effects} (want {args.n}), handled={handled} "
            f"(want {args.deliveries}), left={left}",
            file=sys.stderr,
        )
        return 1
    return 0


def run_amqp(args: argparse.Namespace) -> int:
    import pika
    from babelqueue.pika_transport import PikaTransport

    client = redis.Redis.from_url(args.url)
    effects = 0

    def charge(data, meta, *rest):
        nonlocal effects
        effects += 1

    transport = PikaTransport(args.amqp_url)
    app = BabelQueue(transport=transport, queue=args.queue)
    app.register(URN, wrap(GoLayoutRedisStore(client, args.prefix), charge))

    before = commands_processed(client)
    reads_before = reads_processed(client)
    start = time.perf_counter()
    handled = app.consume(max_messages=args.deliveries, timeout=1.0, handle_signals=False)
    secs = time.perf_counter() - start
    reads_after = reads_processed(client)
    after = commands_processed(client)
    transport.close()

    conn = pika.BlockingConnection(pika.URLParameters(args.amqp_url))
    try:
        ch = conn.channel()
        left = ch.queue_declare(queue=args.queue, passive=True).method.message_count
        ch.queue_delete(queue=args.queue)
    finally:
        conn.close()
    skips = handled - effects
    print(
        f"deliveries={handled} msgs_per_s={handled / secs:.0f} effects={effects} "
        f"skips={skips} redis_cmds_per_delivery={(after - before) / max(handled, 1):.2f} "
        f"redis_reads_per_delivery={max(reads_after - reads_before - 1, 0) / max(handled, 1):.2f}"
    )
    if effects != args.n or handled != args.deliveries or left:
        print(
            f"check failed: effects={effects} (want {args.n}), handled={handled} "
            f"(want {args.deliveries}), left on {args.queue}: {left}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
