#!/usr/bin/env bash
# The Rust consumer side by side with the upstream Python SDK on RabbitMQ, one workload,
# one run. Also reached as `BROKER=amqp bash scripts/perf-vs-python.sh`.
#
#   bash scripts/perf-vs-python-amqp.sh                 # N=5000, DUP_FRAC=0.5, RUNS=3
#   N=20000 RUNS=5 AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f bash scripts/perf-vs-python-amqp.sh
#
# What it does:
#   1. makes a venv (target/py-bench-venv) with the upstream SDK from PyPI:
#      babelqueue[amqp]==1.24.0 (pika) and redis;
#   2. builds the bench binary (cargo build --release -p babelqueue-bench);
#   3. uses the RabbitMQ at $AMQP_URL (never started or stopped here; every queue is a
#      fresh `bench.payments.<uuid>`, deleted at the end) and starts its OWN redis-server
#      on 127.0.0.1:$PORT (default 17601) pinned to CPU 0 for the dedupe store (Go layout);
#      every consumer runs pinned to CPU 1;
#   4. alternating, RUNS times, each over the same bytes loaded onto a fresh queue: the
#      Python SDK's consume loop (its pika transport, idempotency.wrap over the Redis store;
#      scripts/py_consumer_bench.py --broker amqp), the Rust consumer (App over
#      AmqpTransport, guard over the Redis store) at concurrency 1 and 8 (seen) and 8
#      (lease), and the bare lapin consume + ack loop at the same prefetch (2 x concurrency:
#      the ceiling); then both at concurrency 8 with prefetch 8 (`--prefetch 8`, the
#      transport's prefetch before 2 x concurrency) as the same-run baseline;
#   5. prints a table of medians with ratios vs Python and vs the bare client at the same
#      prefetch, and the store's Redis commands per delivery.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-5000}
DUP_FRAC=${DUP_FRAC:-0.5}
RUNS=${RUNS:-3}
PORT=${PORT:-17601}
AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}
VENV=${VENV:-target/py-bench-venv}
URL="redis://127.0.0.1:${PORT}/0"
D=$(python3 -c "print(round($DUP_FRAC * $N))")
DELIVERIES=$((N + D))

ncpu=$(nproc)
if [ "$ncpu" -ge 2 ]; then
  SERVER_CPU=0
  CLIENT_CPU=1
else
  SERVER_CPU=0
  CLIENT_CPU=0
  echo "warning: one CPU only; the servers and the consumers share it" >&2
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import babelqueue, pika, redis" 2>/dev/null; then
  echo "==> venv $VENV: babelqueue[amqp]==1.24.0 redis"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "babelqueue[amqp]==1.24.0" redis
fi

echo "==> cargo build --release -p babelqueue-bench"
cargo build --quiet --release -p babelqueue-bench
BENCH=${CARGO_TARGET_DIR:-target}/release/babelqueue-bench

dir=$(mktemp -d)
pyqueue=""
cleanup() {
  if [ -n "$pyqueue" ]; then
    # A Python run that failed before deleting its queue.
    "$VENV/bin/python" - "$AMQP_URL" "$pyqueue" <<'PY' 2>/dev/null || true
import sys, pika
c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
c.channel().queue_delete(queue=sys.argv[2])
c.close()
PY
  fi
  own_redis_stop
  rm -rf "$dir"
}
trap cleanup EXIT
# shellcheck source=scripts/own-redis.sh
source scripts/own-redis.sh
own_redis_start "$PORT" "$SERVER_CPU" "$dir"

results="$dir/results.tsv"
: >"$results"
field() { # line name
  sed -n "s/.*[[:space:]]\?$2=\([0-9.]*\).*/\1/p" <<<"$1" | head -1
}
record() { # label line
  local rate cmds
  rate=$(field "$2" msgs_per_s)
  cmds=$(field "$2" redis_cmds_per_delivery)
  [ -n "$rate" ] || { echo "no figures from $1: $2" >&2; exit 1; }
  printf '%s\t%s\t%s\n' "$1" "$rate" "${cmds:-nan}" >>"$results"
  printf '  %-18s %s\n' "$1" "$2"
}
rust() { # concurrency mode|bare [bench flags, e.g. --prefetch 8]
  local extra=(--mode "$2")
  [ "$2" = bare ] && extra=(--bare)
  taskset -c "$CLIENT_CPU" "$BENCH" --broker amqp --amqp-url "$AMQP_URL" --url "$URL" \
    --n "$N" --dup-frac "$DUP_FRAC" --concurrency "$1" "${extra[@]}" "${@:3}" --runs 1 \
    2>"$dir/bench.err" | tail -1 || true
  # On a failed check the bench prints why on stderr: show it.
  grep -v '^run ' "$dir/bench.err" >&2 || true
}

echo "==> workload: N=$N distinct payments + D=$D duplicates on RabbitMQ ($AMQP_URL), $RUNS alternating runs"
for run in $(seq 1 "$RUNS"); do
  echo "run $run/$RUNS"
  pyqueue="bench.payments.py.$$.$run"
  "$BENCH" --broker amqp --amqp-url "$AMQP_URL" --n "$N" --dup-frac "$DUP_FRAC" \
    --preload-only --queue "$pyqueue" >/dev/null
  line=$(taskset -c "$CLIENT_CPU" "$VENV/bin/python" scripts/py_consumer_bench.py \
    --broker amqp --amqp-url "$AMQP_URL" --queue "$pyqueue" \
    --url "$URL" --n "$N" --deliveries "$DELIVERIES" --prefix "bq:idemp:py$run:")
  pyqueue=""
  record "python c1 seen" "$line"
  record "rust c1 seen" "$(rust 1 seen)"
  record "rust c8 seen" "$(rust 8 seen)"
  record "rust c8 lease" "$(rust 8 lease)"
  record "bare c1" "$(rust 1 bare)"
  record "bare c8" "$(rust 8 bare)"
  # The prefetch before 2 x concurrency (= concurrency): the same-run baseline.
  record "rust c8 seen p8" "$(rust 8 seen --prefetch 8)"
  record "bare c8 p8" "$(rust 8 bare --prefetch 8)"
done

python3 - "$results" "$N" "$D" <<'PY'
import math, statistics, sys
from collections import defaultdict
path, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rates, cmds = defaultdict(list), defaultdict(list)
for line in open(path):
    label, rate, c = line.rstrip("\n").split("\t")
    rates[label].append(float(rate)); cmds[label].append(float(c))
med = {k: statistics.median(v) for k, v in rates.items()}
py = med["python c1 seen"]
bare = {"1": med["bare c1"], "8": med["bare c8"], "p8": med["bare c8 p8"]}
print()
print(f"RabbitMQ; medians of {len(rates['python c1 seen'])} runs; N={n}, D={d}; "
      f"vs bare = against the bare lapin consume+ack loop at the same prefetch")
print(f"{'consumer':<18} {'deliveries/s':>13} {'vs python':>10} {'vs bare':>9} {'store cmds/delivery':>20}")
for label in ("python c1 seen", "rust c1 seen", "rust c8 seen", "rust c8 lease", "bare c1", "bare c8",
              "rust c8 seen p8", "bare c8 p8"):
    m = med[label]
    c = statistics.median(cmds[label])
    prefetch = "p8" if label.endswith(" p8") else "1" if " c1" in label else "8"
    vs_bare = "" if label.startswith("python") else f"{m / bare[prefetch]:.0%}"
    cs = "" if math.isnan(c) or label.startswith("bare") else f"{c:.2f}"
    print(f"{label:<18} {m:>13.0f} {m / py:>9.2f}x {vs_bare:>9} {cs:>20}")
PY
