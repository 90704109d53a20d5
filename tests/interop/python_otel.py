#!/usr/bin/env python3
"""The upstream Python SDK's tracing helper (``babelqueue.otel``, 1.24.0) on Redis, for
tests/otel_python.rs: a trace that crosses the Rust and the Python SDK, both ways.

MODE=publish: ``otel.publish(tracer, app, URN, {"order_id": 1042})`` to QUEUE; prints one JSON
line ``{"message_id", "trace_id", "span_id", "envelope_trace_id"}`` (the PRODUCER span's ids).

MODE=publish_plain: ``app.publish`` with ``trace_id=TRACE_ID`` and no header; prints
``{"message_id"}``.

MODE=consume: consumes one message of QUEUE with the SDK's own loop, the handler wrapped by
``otel.wrap_handler(tracer, handler)``; prints ``{"message_id", "trace_id", "span_id",
"parent_span_id", "parent_is_remote", "envelope_trace_id"}`` of the CONSUMER span.

The tracer is a small recording tracer on the OpenTelemetry API alone (the venv has the API,
not the SDK): it gives each span fresh random ids in its parent's trace, or a new trace without
a parent, as the SDK's tracer does, and remembers what it started.

Environment: BROKER_URL, QUEUE, MODE, TIMEOUT (seconds to wait for a message, default 5).
"""

import contextlib
import json
import os
import random
import sys

from babelqueue import BabelQueue, otel
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

URN = "urn:babel:orders:created"


class RecordingTracer(trace.Tracer):
    def __init__(self):
        self.spans = []

    def start_span(self, name, context=None, kind=SpanKind.INTERNAL, attributes=None,
                   links=None, start_time=None, record_exception=True,
                   set_status_on_exception=True):
        parent = trace.get_current_span(context).get_span_context()
        trace_id = parent.trace_id if parent.is_valid else (random.getrandbits(128) or 1)
        sc = SpanContext(
            trace_id=trace_id,
            span_id=random.getrandbits(64) or 1,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        self.spans.append({
            "name": name,
            "kind": kind.name,
            "trace_id": format(sc.trace_id, "032x"),
            "span_id": format(sc.span_id, "016x"),
            "parent_span_id": format(parent.span_id, "016x") if parent.is_valid else None,
            "parent_is_remote": bool(parent.is_valid and parent.is_remote),
        })
        return NonRecordingSpan(sc)

    @contextlib.contextmanager
    def start_as_current_span(self, name, context=None, kind=SpanKind.INTERNAL,
                              attributes=None, links=None, start_time=None,
                              record_exception=True, set_status_on_exception=True,
                              end_on_exit=True):
        span = self.start_span(name, context, kind, attributes, links, start_time)
        with trace.use_span(span, end_on_exit=end_on_exit) as current:
            yield current


def main():
    broker = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")
    queue = os.environ["QUEUE"]
    mode = os.environ["MODE"]
    tracer = RecordingTracer()
    app = BabelQueue(broker, queue=queue)

    if mode == "publish":
        message_id = otel.publish(tracer, app, URN, {"order_id": 1042})
        [span] = [s for s in tracer.spans if s["kind"] == "PRODUCER"]
        sent = {"message_id": message_id, "trace_id": span["trace_id"],
                "span_id": span["span_id"],
                "envelope_trace_id": otel.uuid_of(int(span["trace_id"], 16))}
        print(json.dumps(sent))
        return 0

    if mode == "publish_plain":
        # No helper, no header: only the envelope's trace_id carries the trace.
        message_id = app.publish(URN, {"order_id": 1043}, trace_id=os.environ["TRACE_ID"])
        print(json.dumps({"message_id": message_id}))
        return 0

    if mode == "consume":
        seen = {}

        def handler(data, meta, envelope):
            seen["message_id"] = meta.get("id")
            seen["envelope_trace_id"] = envelope.get("trace_id")

        app.register(URN, otel.wrap_handler(tracer, handler))
        app.consume(max_messages=1, timeout=float(os.environ.get("TIMEOUT", "5")),
                    handle_signals=False)
        consumers = [s for s in tracer.spans if s["kind"] == "CONSUMER"]
        if len(consumers) != 1 or not seen:
            print(json.dumps({"error": "no message consumed", "spans": tracer.spans}))
            return 1
        out = dict(consumers[0])
        out.update(seen)
        print(json.dumps(out))
        return 0

    print(f"unknown MODE {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
