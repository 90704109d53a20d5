#!/usr/bin/env bash
# Seeds the fuzz corpora from the canonical conformance fixtures, at run time (the fixtures
# are never committed here). Usage: fuzz/seed.sh [conformance dir]
# (default: $BABELQUEUE_CONFORMANCE_DIR, else ../shared/conformance next to the repository).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-${BABELQUEUE_CONFORMANCE_DIR:-$here/../../shared/conformance}}"
if [[ ! -d "$dir/fixtures" ]]; then
  echo "seed.sh: no fixtures in $dir (set BABELQUEUE_CONFORMANCE_DIR)" >&2
  exit 1
fi
targets=(envelope frame poison bindings broker_url consume)
for t in "${targets[@]}"; do mkdir -p "$here/corpus/$t"; done
for f in "$dir"/fixtures/*.json; do
  name="$(basename "$f" .json)"
  for t in envelope frame poison bindings consume; do cp "$f" "$here/corpus/$t/fixture-$name"; done
  # A header frame around each fixture (the body as a JSON string), for the frame target.
  if command -v python3 >/dev/null; then
    python3 - "$f" "$here/corpus/frame/frame-$name" <<'PY'
import json, sys
body = open(sys.argv[1], encoding="utf-8").read()
frame = {"__bq_frame": 1, "headers": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, "body": body}
open(sys.argv[2], "w", encoding="utf-8").write(json.dumps(frame, ensure_ascii=False, separators=(",", ":")))
PY
  fi
done
# Attempts-rule seeds: 4 bytes body attempts, 4 bytes native count, then a count text.
printf '\x02\x00\x00\x00\x05\x00\x00\x003' > "$here/corpus/bindings/counts-3"
printf '\x05\x00\x00\x00\x01\x00\x00\x00not-a-number' > "$here/corpus/bindings/counts-garbage"
for u in 'redis://127.0.0.1:6379/0' 'rediss://:pw@cache:6380' \
         'amqp://guest:guest@127.0.0.1:5672/%2f' 'amqps://u:p@[::1]:5671/vh?heartbeat=30' \
         'sqs://us-east-1?endpoint=http://localhost:4566&fifo=1' 'kafka://k1:9092,k2:9093?group=g'; do
  printf '%s' "$u" > "$here/corpus/broker_url/$(printf '%s' "$u" | md5sum | cut -c1-12)"
done
echo "seed.sh: seeded $(find "$here/corpus" -type f | wc -l) files from $dir"
