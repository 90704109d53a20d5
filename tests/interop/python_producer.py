#!/usr/bin/env python3
"""A BabelQueue producer written the way the Python SDK writes envelopes.

It builds one payment envelope exactly as the Python SDK does -- field order
job, trace_id, data, meta{id, queue, lang, schema_version, created_at}, attempts;
uuid4 ids; created_at in Unix epoch milliseconds; meta.lang "python";
json.dumps(envelope, ensure_ascii=False, separators=(",", ":")) -- and RPUSHes the
SAME bytes N times (a redelivery on the wire), over a raw RESP socket (stdlib only).

Environment: BROKER_URL (default redis://localhost:6379/0), QUEUE (default payments),
COPIES (default 2), PAYMENT_ID (default pay_7f3a), AMOUNT (default 4200).
Prints the envelope JSON on stdout.
"""

import json
import os
import socket
import time
import uuid
from urllib.parse import unquote, urlparse


def resp_command(*args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def read_reply(stream):
    line = stream.readline()
    if not line:
        raise ConnectionError("connection closed by the server")
    kind, rest = line[:1], line[1:-2]
    if kind == b"-":
        raise RuntimeError("redis error: " + rest.decode("utf-8", "replace"))
    if kind in (b"+", b":"):
        return rest
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else stream.read(n + 2)[:-2]
    raise RuntimeError("unexpected reply %r" % line)


def connect(url):
    u = urlparse(url)
    if u.scheme != "redis":
        raise SystemExit("this producer speaks plain redis:// only, got %r" % url)
    sock = socket.create_connection((u.hostname or "localhost", u.port or 6379), timeout=10)
    stream = sock.makefile("rb")

    def call(*args):
        sock.sendall(resp_command(*args))
        return read_reply(stream)

    if u.password is not None:
        if u.username:
            call("AUTH", unquote(u.username), unquote(u.password))
        else:
            call("AUTH", unquote(u.password))
    db = (u.path or "/0").lstrip("/") or "0"
    call("SELECT", db)
    return sock, call


def build_envelope(urn, data, queue):
    return {
        "job": urn,
        "trace_id": str(uuid.uuid4()),
        "data": data,
        "meta": {
            "id": str(uuid.uuid4()),
            "queue": queue,
            "lang": "python",
            "schema_version": 1,
            "created_at": int(time.time() * 1000),
        },
        "attempts": 0,
    }


def main():
    url = os.environ.get("BROKER_URL", "redis://localhost:6379/0")
    queue = os.environ.get("QUEUE", "payments")
    copies = int(os.environ.get("COPIES", "2"))
    data = {
        "payment_id": os.environ.get("PAYMENT_ID", "pay_7f3a"),
        "amount": int(os.environ.get("AMOUNT", "4200")),
        "currency": "EUR",
        "customer": "Zoë Ångström",
    }
    envelope = build_envelope("urn:babel:payments:charge", data, queue)
    body = json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    sock, call = connect(url)
    try:
        for _ in range(copies):
            call("RPUSH", queue, body)
    finally:
        sock.close()
    print(body.decode("utf-8"))


if __name__ == "__main__":
    main()
