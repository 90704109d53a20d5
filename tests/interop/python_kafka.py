#!/usr/bin/env python3
"""The upstream Python SDK (babelqueue[kafka] 1.24.0, its confluent-kafka transport) on a
Kafka broker, for tests/kafka/kafka_payments.rs.

    python_kafka.py produce   # N payments, each published TWICE (the same bytes), by the SDK
    python_kafka.py consume   # the SDK's own consumer until the topic stays empty

Environment: BROKER_URL (kafka://host:port), QUEUE, N (default 200), TIMEOUT (seconds
``consume`` waits on an empty topic before it stops, default 10.0), GROUP (consumer group,
default babelqueue), KAFKA_CONFIG (JSON object of extra librdkafka settings).

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
from babelqueue.kafka_transport import KafkaTransport

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


def produce(transport, queue, n):
    for i in range(n):
        envelope = EnvelopeCodec.make(
            URN, {"payment_id": "pay_%d" % i, "amount": 100 + i, "customer": "Zoë Ångström"},
            queue=queue,
        )
        body = EnvelopeCodec.encode(envelope)
        # The same bytes twice: what a redelivery looks like on the wire.
        transport.publish(queue, body)
        transport.publish(queue, body)
        print(json.dumps({"payment_id": "pay_%d" % i, "id": envelope["meta"]["id"]}))
    left = transport._producer_().flush(30)
    if left:
        raise SystemExit("%d records not delivered" % left)


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
    # KAFKA_CONFIG: extra librdkafka settings (JSON), handed to the SDK's transport as its
    # client_config (tests/kafka/kafka_payments.rs sets batch.num.messages=1 for the producer: tansu
    # 0.6 reports a partition's high watermark as its last batch's base offset + 1, so a
    # multi-record batch would hide its records from a watermark).
    extra = json.loads(os.environ.get("KAFKA_CONFIG", "{}"))
    transport = KafkaTransport(url, group_id=os.environ.get("GROUP", "babelqueue"), **extra)
    if mode == "produce":
        produce(transport, queue, int(os.environ.get("N", "200")))
        return
    app = BabelQueue(transport=transport, queue=queue)
    if mode == "consume":
        consume(app, float(os.environ.get("TIMEOUT", "10.0")))
        for c in transport._consumers.values():
            c.close()
    else:
        raise SystemExit("unknown mode %r" % mode)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
