#!/usr/bin/env python3
"""A consumer of the upstream Python SDK (babelqueue 1.24.0), for the mixed-fleet test.

It consumes QUEUE on BROKER_URL with the SDK's own loop (``BabelQueue.consume``), its
handler wrapped by the SDK's ``idempotency.wrap`` over a Redis store of the Go layout:
``<PREFIX><meta.id>`` = ``1``, ``seen`` = ``EXISTS``, ``remember`` = ``SET NX`` (what the Rust
``RedisStore`` reads and writes). Each charge is counted in Redis (``INCR
<FX>:charges:<payment_id>``, ``SADD <FX>:charged <payment_id>``) and each delivery in
``INCR <FX>:deliveries:python``.

Environment: BROKER_URL, QUEUE, STORE_PREFIX (default ``bq:idemp:``), FX (effects key prefix),
MAX_MESSAGES (stop after that many, or when the queue stays empty for TIMEOUT seconds),
TIMEOUT (default 1.0). Prints ``[python] processed=N`` on exit.
"""

import os
import sys

import redis
from babelqueue import BabelQueue
from babelqueue.idempotency import wrap

URN = "urn:babel:payments:charge"


class GoLayoutRedisStore:
    """The Go/Rust seen-set layout on Redis: key ``<prefix><id>`` = ``1``."""

    def __init__(self, client, prefix):
        self._r = client
        self._prefix = prefix

    def seen(self, message_id):
        return self._r.exists(self._prefix + message_id) == 1

    def remember(self, message_id):
        self._r.set(self._prefix + message_id, "1", nx=True)

    def forget(self, message_id):
        self._r.delete(self._prefix + message_id)


def main():
    broker = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")
    queue = os.environ["QUEUE"]
    fx = os.environ["FX"]
    client = redis.Redis.from_url(broker, decode_responses=True)
    store = GoLayoutRedisStore(client, os.environ.get("STORE_PREFIX", "bq:idemp:"))

    def charge(data, meta):
        client.incr(fx + ":deliveries:python-handler")
        pipe = client.pipeline()
        pipe.incr("%s:charges:%s" % (fx, data["payment_id"]))
        pipe.sadd(fx + ":charged", data["payment_id"])
        pipe.execute()

    guarded = wrap(store, charge)

    def counted(data, meta):
        client.incr(fx + ":deliveries:python")
        guarded(data, meta)

    app = BabelQueue(broker, queue=queue)
    app.register(URN, counted)
    max_messages = os.environ.get("MAX_MESSAGES")
    processed = app.consume(
        max_messages=int(max_messages) if max_messages else None,
        timeout=float(os.environ.get("TIMEOUT", "1.0")),
    )
    print("[python] processed=%d" % processed)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
