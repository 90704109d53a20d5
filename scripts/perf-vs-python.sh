#!/usr/bin/env bash
# The Rust consumer side by side with the upstream Python SDK, on one workload, in one run.
#
#   bash scripts/perf-vs-python.sh            # N=20000, DUP_FRAC=0.5, RUNS=3
#   N=50000 RUNS=5 bash scripts/perf-vs-python.sh
#   BROKER=amqp bash scripts/perf-vs-python.sh   # on RabbitMQ: scripts/perf-vs-python-amqp.sh
#
# What it does, from a fresh machine:
#   1. makes a venv (target/py-bench-venv) with the upstream SDK from PyPI:
#      babelqueue==1.24.0 and redis;
#   2. builds the bench binary (cargo build --release -p babelqueue-bench);
#   3. starts its OWN redis-server on 127.0.0.1:$PORT (default 17600) pinned to CPU 0
#      (taskset), and runs every consumer pinned to CPU 1;
#   4. alternating, RUNS times: the Python SDK's consume loop with idempotency.wrap over a
#      Redis store of the Go layout (scripts/py_consumer_bench.py), the Rust consumer at
#      concurrency 1, 8 and 32 (seen-set mode) and 8 and 32 (lease mode), at 8 and 32 also
#      with --batch 1 (one message per worker: the consumer before batches), and with
#      --no-pipelining (every operation a round trip of its own: the baseline), the bare
#      loop of the same commands at 8 and 32 (--bare: the server's ceiling), each over
#      the same pre-loaded bytes (babelqueue-bench --preload-only), and
#      `redis-benchmark -c 1` for the round-trip time;
#   5. prints a table of medians with ratios, server reads (round trips) and commands per
#      delivery, and the one-at-a-time ceiling for 3 round trips per first delivery and 2
#      per duplicate.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${BROKER:-redis}" in
  redis) ;;
  amqp) exec bash scripts/perf-vs-python-amqp.sh ;;
  *) echo "BROKER must be redis or amqp, got ${BROKER}" >&2; exit 2 ;;
esac

N=${N:-20000}
DUP_FRAC=${DUP_FRAC:-0.5}
RUNS=${RUNS:-3}
PORT=${PORT:-17600}
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
  echo "warning: one CPU only; the server and the consumers share it" >&2
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import babelqueue, redis" 2>/dev/null; then
  echo "==> venv $VENV: babelqueue==1.24.0 redis"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "babelqueue==1.24.0" redis
fi

echo "==> cargo build --release -p babelqueue-bench"
cargo build --quiet --release -p babelqueue-bench
BENCH=${CARGO_TARGET_DIR:-target}/release/babelqueue-bench

dir=$(mktemp -d)
cleanup() {
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
  local rate cmds reads cpu share
  rate=$(field "$2" msgs_per_s)
  cmds=$(field "$2" redis_cmds_per_delivery)
  reads=$(field "$2" redis_reads_per_delivery)
  cpu=$(field "$2" client_cpu_us_per_delivery)
  share=$(field "$2" server_cpu_share)
  [ -n "$rate" ] || { echo "no figures from $1: $2" >&2; exit 1; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$rate" "$cmds" "${reads:-nan}" "${cpu:-nan}" "${share:-nan}" >>"$results"
  printf '  %-26s %s\n' "$1" "$2"
}
rust() { # concurrency mode [extra flag]
  taskset -c "$CLIENT_CPU" "$BENCH" --url "$URL" --n "$N" --dup-frac "$DUP_FRAC" \
    --concurrency "$1" --mode "$2" --runs 1 ${3:-} 2>"$dir/bench.err" | tail -1 || true
  # On a failed check the bench prints why on stderr: show it.
  grep -v '^run ' "$dir/bench.err" >&2 || true
}

echo "==> workload: N=$N distinct payments + D=$D duplicates, $RUNS alternating runs"
for run in $(seq 1 "$RUNS"); do
  echo "run $run/$RUNS"
  "$BENCH" --url "$URL" --n "$N" --dup-frac "$DUP_FRAC" --preload-only >/dev/null
  line=$(taskset -c "$CLIENT_CPU" "$VENV/bin/python" scripts/py_consumer_bench.py \
    --url "$URL" --n "$N" --deliveries "$DELIVERIES" --prefix "bq:idemp:py$run:")
  record "python c1 seen" "$line"
  record "rust c1 seen" "$(rust 1 seen)"
  record "rust c8 seen" "$(rust 8 seen)"
  record "rust c8 lease" "$(rust 8 lease)"
  record "rust c32 seen" "$(rust 32 seen)"
  record "rust c32 lease" "$(rust 32 lease)"
  # One message per worker (App::batch(1)): the consumer before batches, as the baseline.
  record "rust c8 seen batch 1" "$(rust 8 seen '--batch 1')"
  record "rust c32 seen batch 1" "$(rust 32 seen '--batch 1')"
  record "rust c32 lease batch 1" "$(rust 32 lease '--batch 1')"
  # The runtime's own commands per delivery from a bare loop (no runtime, decoding or
  # guard), pipelined as the batch workers send them: the server's ceiling for this mix.
  record "bare c32 seen" "$(rust 32 seen --bare)"
  record "bare c8 seen" "$(rust 8 seen --bare)"
  record "rust c1 seen unpipelined" "$(rust 1 seen --no-pipelining)"
  record "rust c8 seen unpipelined" "$(rust 8 seen --no-pipelining)"
  record "rust c8 lease unpipelined" "$(rust 8 lease --no-pipelining)"
  ping=$(taskset -c "$CLIENT_CPU" redis-benchmark -p "$PORT" -c 1 -n 20000 -t ping -q \
    | sed -n 's/.*PING_MBULK: \([0-9.]*\) requests.*/\1/p' | head -1)
  [ -n "$ping" ] || { echo "redis-benchmark printed no PING_MBULK figure" >&2; exit 1; }
  printf 'redis-benchmark -c 1\t%s\t1\t1\tnan\tnan\n' "$ping" >>"$results"
  printf '  %-26s %s requests/s\n' "redis-benchmark -c 1" "$ping"
  # The server's ceiling for simple commands like the consumer's (a key read, a key write,
  # a list push and pop), pipelined 32 deep over 8 connections: requests/s, averaged.
  piped=$(taskset -c "$CLIENT_CPU" redis-benchmark -p "$PORT" -c 8 -P 32 -n 400000 -r 1000000 \
    -t get,set,lpush,lpop -q | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' \
    | awk '{ s += $1; n += 1 } END { if (n) printf "%.0f", s / n }')
  [ -n "$piped" ] || { echo "redis-benchmark -P 32 printed no figure" >&2; exit 1; }
  printf 'redis-benchmark -P 32\t%s\t1\t1\tnan\tnan\n' "$piped" >>"$results"
  printf '  %-26s %s requests/s (get, set, lpush, lpop)\n' "redis-benchmark -P 32" "$piped"
done

python3 - "$results" "$N" "$D" <<'PY'
import statistics, sys
from collections import defaultdict
path, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rates, cmds, reads = defaultdict(list), defaultdict(list), defaultdict(list)
cpus, shares = defaultdict(list), defaultdict(list)
for line in open(path):
    label, rate, c, r, cpu, share = line.rstrip("\n").split("\t")
    rates[label].append(float(rate)); cmds[label].append(float(c)); reads[label].append(float(r))
    cpus[label].append(float(cpu)); shares[label].append(float(share))
med = {k: statistics.median(v) for k, v in rates.items()}
rps = med["redis-benchmark -c 1"]
rtt_us = 1e6 / rps
# One at a time: 3 round trips per first delivery, 2 per duplicate.
ceiling = rps * (n + d) / (3 * n + 2 * d)
py = med["python c1 seen"]
print()
print(f"medians of {len(rates['python c1 seen'])} runs; N={n}, D={d}; "
      f"round trip {rtt_us:.0f} us (redis-benchmark -c 1: {rps:.0f}/s); "
      f"one-at-a-time ceiling for 3+2 round trips: {ceiling:.0f} deliveries/s")
piped = med["redis-benchmark -P 32"]
print(f"server ceiling: redis-benchmark -P 32 -c 8 (get, set, lpush, lpop) {piped:.0f} requests/s; "
      f"at 3.67 commands per delivery about {piped / 3.67:.0f} deliveries/s")
print(f"{'consumer':<26} {'deliveries/s':>13} {'vs python':>10} {'vs ceiling':>11} "
      f"{'round trips/delivery':>21} {'commands/delivery':>18} {'client CPU us/delivery':>23} "
      f"{'server CPU share':>17}")
def cell(values, fmt):
    m = statistics.median(values)
    return "" if m != m else format(m, fmt)  # nan: not measured (the Python SDK)
for label in ("python c1 seen", "rust c1 seen", "rust c8 seen", "rust c8 lease",
              "rust c32 seen", "rust c32 lease",
              "rust c8 seen batch 1", "rust c32 seen batch 1", "rust c32 lease batch 1",
              "rust c1 seen unpipelined", "rust c8 seen unpipelined",
              "rust c8 lease unpipelined", "bare c8 seen", "bare c32 seen"):
    m = med[label]
    print(f"{label:<26} {m:>13.0f} {m / py:>9.2f}x {m / ceiling:>10.2f}x "
          f"{statistics.median(reads[label]):>21.2f} {statistics.median(cmds[label]):>18.2f} "
          f"{cell(cpus[label], '.1f'):>23} {cell(shares[label], '.2f'):>17}")
for c in (8, 32):
    bare, rust = med[f"bare c{c} seen"], med[f"rust c{c} seen"]
    print(f"c{c} seen: the runtime at {rust / bare:.2f}x of the bare loop of its own commands "
          f"(client CPU {statistics.median(cpus[f'rust c{c} seen']):.1f} against "
          f"{statistics.median(cpus[f'bare c{c} seen']):.1f} us/delivery)")
print("round trips/delivery: the server's read events (INFO stats total_reads_processed) per "
      "delivery; with 8 workers on one multiplexed connection several requests share a read.")
print("client CPU us/delivery: the Rust bench process's user + system CPU time over the timed drain "
      "(getrusage) per delivery; server CPU share: the Redis server's CPU seconds (INFO cpu) per "
      "second of the drain (1.00 = one core).")
PY
