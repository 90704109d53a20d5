"""The upstream Python SDK's side of tests/it/redrive_python.rs (redrive and replay-bypass).

    python_redrive.py redrive <redis-url> <dlq>      redrive(..., bypass=True), items as JSON
    python_redrive.py consume <redis-url> <queue> <urn> <n>
                                                     consume n messages; per message what the
                                                     handler saw (is_replay, effect skipped)
"""

import dataclasses
import json
import sys

from babelqueue import BabelQueue, bypass_external_effects, is_replay
from babelqueue.redrive import redrive


def main() -> None:
    mode, url = sys.argv[1], sys.argv[2]
    if mode == "redrive":
        app = BabelQueue(url)
        result = redrive(app.transport, sys.argv[3], bypass=True)
        print(json.dumps({
            "redriven": result.redriven,
            "items": [dataclasses.asdict(i) for i in result.items],
        }))
    elif mode == "consume":
        queue, urn, n = sys.argv[3], sys.argv[4], int(sys.argv[5])
        app = BabelQueue(url, queue=queue)
        seen = []

        @app.handler(urn)
        def handle(data, meta):
            effects = []
            bypass_external_effects(lambda: effects.append("charged"))
            seen.append({"id": meta.get("id"), "is_replay": is_replay(),
                         "effect_ran": bool(effects)})

        app.consume(max_messages=n, timeout=2.0, handle_signals=False)
        print(json.dumps(seen))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
