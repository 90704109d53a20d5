#!/usr/bin/env python3
"""The Python side of babelqueue-core's GDPR interop test (tests/gdpr.rs).

It uses the upstream Python SDK's own ``protect``/``unprotect`` and Redis transport, with the
family's reference cipher built on ``cryptography``'s AESGCM (the SDK ships none):

    gdpr_peer.py produce URL QUEUE KEY_HEX SCHEMA COUNT
        protects COUNT payments and publishes them to QUEUE; prints, one JSON line each, the
        cleartext data and the trace id it sent.
    gdpr_peer.py consume URL QUEUE KEY_HEX SCHEMA COUNT
        pops COUNT envelopes from QUEUE, unprotects their data, acks them; prints, one JSON
        line each, the trace id and the restored data.
    gdpr_peer.py visible
        reads JSON lines {"schema": ..., "data": ...} on stdin; prints for each, one JSON line,
        the schema's sensitive paths and the data protected with a cipher whose token is
        "v:" + the plaintext (so the exact bytes the SDK seals are seen), and whether its
        unprotect gives the data back.

Needs: pip install "babelqueue[redis]==1.24.0" cryptography
"""

import base64
import copy
import json
import os
import sys

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from babelqueue import EnvelopeCodec
from babelqueue.exceptions import DecryptError
from babelqueue.gdpr import protect, unprotect
from babelqueue.schema import sensitive_paths
from babelqueue.redis_transport import RedisTransport

URN = "urn:babel:payments:gdpr-interop"


class AesGcmCipher:
    """AES-256-GCM, a random 12-byte nonce before the sealed bytes, standard padded base64."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def encrypt(self, plaintext: bytes) -> str:
        nonce = os.urandom(12)
        return base64.b64encode(nonce + self._aead.encrypt(nonce, plaintext, None)).decode("ascii")

    def decrypt(self, ciphertext: str) -> bytes:
        raw = base64.b64decode(ciphertext, validate=True)
        return self._aead.decrypt(raw[:12], raw[12:], None)


class VisibleCipher:
    """Not a cipher: the token shows the plaintext it was given."""

    def encrypt(self, plaintext: bytes) -> str:
        return "v:" + plaintext.decode("utf-8")

    def decrypt(self, ciphertext: str) -> bytes:
        if not ciphertext.startswith("v:"):
            raise ValueError("not a visible token")
        return ciphertext[2:].encode("utf-8")


def visible() -> int:
    cipher = VisibleCipher()
    for line in sys.stdin:
        case = json.loads(line)
        schema, data = case["schema"], case["data"]
        original = copy.deepcopy(data)
        paths = [[p.path, p.category] for p in sensitive_paths(schema)]
        protect(data, schema, cipher)
        protected = copy.deepcopy(data)
        try:
            unprotect(data, schema, cipher)
            restored = data == original
        except DecryptError:
            restored = None
        print(json.dumps({"paths": paths, "protected": protected, "restored": restored}, ensure_ascii=False))
    return 0


def payment(i: int) -> dict:
    data = {
        "payment_id": f"pay_py_{i:04d}",
        "email": f"client{i}.ø@example.com",
        "name": f"Zoë Ørsted {i}",
        "amount": 1000 + i if i % 2 == 0 else 10.5 + i,
        "currency": "EUR",
        "card": {"number": f"4111 1111 1111 {i:04d}", "exp": "12/30"},
    }
    if i % 3 != 0:
        data["addresses"] = [
            {"line": f"Storgata {i}, Tromsø", "city": "Tromsø"},
            {"line": f"{i} Main St \"B\"", "city": "Oslo"},
        ]
    if i % 5 == 0:
        data["card"]["number"] = 4111111111110000 + i  # a number, sealed as its JSON
    if i % 7 == 0:
        data["tags"] = ["vip", "ünïcode"]
    return data


def main() -> int:
    if sys.argv[1:2] == ["visible"]:
        return visible()
    mode, url, queue, key_hex, schema_path, count = sys.argv[1:7]
    count = int(count)
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    cipher = AesGcmCipher(bytes.fromhex(key_hex))
    transport = RedisTransport(url, retry_after=None)
    if mode == "produce":
        for i in range(count):
            data = payment(i)
            clear = copy.deepcopy(data)
            protect(data, schema, cipher)
            envelope = EnvelopeCodec.make(URN, data, queue=queue)
            transport.publish(queue, EnvelopeCodec.encode(envelope))
            print(json.dumps({"trace_id": envelope["trace_id"], "data": clear}, ensure_ascii=False))
    elif mode == "consume":
        for _ in range(count):
            message = transport.pop(queue, timeout=5.0)
            if message is None:
                print("no message within 5 s", file=sys.stderr)
                return 1
            envelope = EnvelopeCodec.decode(message.body)
            unprotect(envelope["data"], schema, cipher)
            transport.ack(message)
            print(json.dumps({"trace_id": envelope["trace_id"], "data": envelope["data"]}, ensure_ascii=False))
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
