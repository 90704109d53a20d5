#!/usr/bin/env bash
# Two builds of babelqueue-bench, before and after a change, alternated in one run on one
# Redis server of their own: medians per configuration and the median of the per-round
# after/before ratios (the same round's two runs are seconds apart, so slow phases of a
# shared host hit both).
#
#   BEFORE=/tmp/bench-before AFTER=target/release/babelqueue-bench bash scripts/bench-ab.sh
#   ROUNDS=9 CONFIGS="c32:--concurrency 32;c32-lease:--concurrency 32 --mode lease" bash scripts/bench-ab.sh
#
# A build of an older commit: `git worktree add /tmp/before <commit>`, then
# `cargo build --release -p babelqueue-bench --manifest-path /tmp/before/Cargo.toml` and
# BEFORE=/tmp/before/target/release/babelqueue-bench.
#
# The server (port $PORT, default 17610) is pinned to CPU 0 and the bench to CPU 1, as in
# scripts/perf-vs-python.sh; the server is flushed before every run (it is this script's own).
set -euo pipefail
cd "$(dirname "$0")/.."

BEFORE=${BEFORE:?set BEFORE to the bench binary before the change}
AFTER=${AFTER:-target/release/babelqueue-bench}
ROUNDS=${ROUNDS:-7}
N=${N:-20000}
PORT=${PORT:-17610}
CONFIGS=${CONFIGS:-"c1:--concurrency 1;c8:--concurrency 8;c8-lease:--concurrency 8 --mode lease;c32:--concurrency 32;c32-lease:--concurrency 32 --mode lease"}
for b in "$BEFORE" "$AFTER"; do
  [ -x "$b" ] || { echo "not an executable: $b" >&2; exit 2; }
done
if [ "$(nproc)" -ge 2 ]; then SERVER_CPU=0; CLIENT_CPU=1; else SERVER_CPU=0; CLIENT_CPU=0; fi

dir=$(mktemp -d)
cleanup() {
  own_redis_stop
  rm -rf "$dir"
}
trap cleanup EXIT
# shellcheck source=scripts/own-redis.sh
source scripts/own-redis.sh
own_redis_start "$PORT" "$SERVER_CPU" "$dir"

results="$dir/results.txt"
IFS=';' read -r -a configs <<<"$CONFIGS"
for round in $(seq 1 "$ROUNDS"); do
  for cfg in "${configs[@]}"; do
    label=${cfg%%:*}
    read -r -a extra <<<"${cfg#*:}"
    for side in before after; do
      bin=$BEFORE
      [ "$side" = after ] && bin=$AFTER
      redis-cli -p "$PORT" flushall >/dev/null
      line=$(taskset -c "$CLIENT_CPU" "$bin" --url "redis://127.0.0.1:$PORT/0" --n "$N" --runs 1 \
        "${extra[@]}" 2>"$dir/err" | tail -1) || true
      case "$line" in
        *msgs_per_s=*) ;;
        *) echo "no figures from $side $label:" >&2; cat "$dir/err" >&2; exit 1 ;;
      esac
      echo "$round $label $side $line" | tee -a "$results"
    done
  done
done

python3 - "$results" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(lambda: defaultdict(list))
rounds = defaultdict(dict)
order = []
for line in open(sys.argv[1]):
    rnd, label, side, *fields = line.split()
    kv = dict(f.split("=", 1) for f in fields if "=" in f)
    if label not in order:
        order.append(label)
    for k, v in kv.items():
        try:
            runs[(label, side)][k].append(float(v))
        except ValueError:
            pass
    rounds[(label, rnd)][side] = float(kv["msgs_per_s"])
def med(label, side, key, fmt):
    v = runs[(label, side)].get(key)
    return format(statistics.median(v), fmt) if v else "-"
print()
print(f"{'config':<10} {'before/s':>9} {'after/s':>9} {'after/before':>13} {'paired':>7} "
      f"{'client CPU us':>14} {'allocs':>12} {'server share':>13}")
for label in order:
    b = statistics.median(runs[(label, "before")]["msgs_per_s"])
    a = statistics.median(runs[(label, "after")]["msgs_per_s"])
    paired = statistics.median(
        r["after"] / r["before"] for (l, _), r in rounds.items() if l == label and len(r) == 2
    )
    print(f"{label:<10} {b:>9.0f} {a:>9.0f} {a / b:>12.2f}x {paired:>6.2f}x "
          f"{med(label, 'before', 'client_cpu_us_per_delivery', '.1f'):>6} -> "
          f"{med(label, 'after', 'client_cpu_us_per_delivery', '.1f'):<5} "
          f"{med(label, 'before', 'allocs_per_delivery', '.1f'):>5} -> "
          f"{med(label, 'after', 'allocs_per_delivery', '.1f'):<5} "
          f"{med(label, 'before', 'server_cpu_share', '.2f'):>5} -> "
          f"{med(label, 'after', 'server_cpu_share', '.2f')}")
print("paired: the median of each round's after/before ratio; medians of the runs otherwise.")
PY
