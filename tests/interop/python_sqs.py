#!/usr/bin/env python3
"""The upstream Python SDK (babelqueue[sqs] 1.24.0, its boto3 transport) on SQS (moto in the
tests), for tests/it/sqs_payments.rs.

    python_sqs.py produce   # N payments, each published TWICE (the same bytes), by the SDK
    python_sqs.py consume   # the SDK's own consumer until the queue stays empty

Environment: BROKER_URL (sqs://<region>?endpoint=...), QUEUE (it must exist: the Python SDK
creates no queue), N (default 200), TIMEOUT (seconds ``consume`` waits on an empty queue
before it stops, default 2.0), and the AWS credentials of the default chain.

``produce`` prints one JSON line per payment: {"payment_id", "id"}. ``consume`` prints
``{"charged": {payment_id: count}, "skipped": n, "processed": n}``: the handler is wrapped
by the SDK's ``idempotency.wrap`` over an in-process seen-set, so a duplicate is skipped.
"""

import json
import os
import sys

from babelqueue import BabelQueue
from babelqueue.codec import EnvelopeCodec
from babelqueue.idempotency import wrap

URN = "urn:babel:payments:charge"


class MemoryStore:
    def __init__(self):
        self.ids = set()

    def seen(self, message_id):
        return message_id in self.ids

    def remember(self, message_id):
        self.ids.add(message_id)

    def forget(self, message_id):
        self.ids.discard(message_id)


def produce(app, queue, n):
    for i in range(n):
        envelope = EnvelopeCodec.make(
            URN, {"payment_id": "pay_%d" % i, "amount": 100 + i, "customer": "Zoë Ångström"},
            queue=queue,
        )
        body = EnvelopeCodec.encode(envelope)
        # The same bytes twice: what a redelivery looks like on the wire.
        app.transport.publish(queue, body)
        app.transport.publish(queue, body)
        print(json.dumps({"payment_id": "pay_%d" % i, "id": envelope["meta"]["id"]}))


def consume(app, timeout):
    charged = {}
    calls = {"n": 0}

    def charge(data, meta):
        charged[data["payment_id"]] = charged.get(data["payment_id"], 0) + 1

    guarded = wrap(MemoryStore(), charge)

    def counted(data, meta):
        calls["n"] += 1
        guarded(data, meta)

    app.register(URN, counted)
    # With max_messages set the SDK's loop ends at the first empty pop (after `timeout`).
    processed = app.consume(max_messages=10**9, timeout=timeout)
    skipped = calls["n"] - sum(charged.values())
    print(json.dumps({"charged": charged, "skipped": skipped, "processed": processed}))


def main():
    mode = sys.argv[1]
    url = os.environ["BROKER_URL"]
    queue = os.environ["QUEUE"]
    app = BabelQueue(url, queue=queue)
    if mode == "produce":
        produce(app, queue, int(os.environ.get("N", "200")))
    elif mode == "consume":
        consume(app, float(os.environ.get("TIMEOUT", "2.0")))
    else:
        raise SystemExit("unknown mode %r" % mode)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
